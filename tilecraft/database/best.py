"""Which schedule of a workload is the best: the one rule every reader of records follows.

The best of hundreds of single noisy measurements is chosen for being high: the winner's
curse. A shared machine also drifts while it tunes, and a tuner's worker is not the
process a user times a kernel in. So when tuning ends, its best candidates are measured
again, interleaved, several repeats each, in a fresh worker, and written as ``"final"``
records (``tune/remeasure.py``). The rule:

1. A schedule with a final record ranks by the median of the repeats of its latest final
   record (``TuningRecord.cost``). If that record is an error, the schedule is out.
2. Every such re-measured schedule ranks before every schedule measured only while
   searching. Those rank by the mean cost of their fastest search record, as in Ansor;
   that is all a log of record version 1 holds. (Should every re-measured schedule be
   out, the schedules rank by this alone.)

So once any schedule of a workload has been re-measured, a lucky single measurement
cannot win. ``load_best_record``, ``best_records``, ``Database.query_best``,
``tilecraft best``, compiled models and transfer all rank by this rule, through
``rank`` or ``BestSoFar``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .record import TuningRecord


def rank(records: Iterable[TuningRecord]) -> list[TuningRecord]:
    """The distinct valid schedules of ``records`` (one workload on one target), best first
    by the rule, each as one record: its latest final record, or its fastest search record."""
    finals, searched = _split(records)
    remeasured = sorted((r for r in finals.values() if r.is_valid), key=lambda r: r.cost)
    rest = searched.values() if not remeasured else (r for key, r in searched.items() if key not in finals)
    return remeasured + sorted(rest, key=lambda r: r.cost)


def for_learning(records: Sequence[TuningRecord]) -> list[TuningRecord]:
    """``records`` as a cost model learns from them: every search record, and a final record
    only of a schedule no search record measured (a log distilled to its best). A final
    record re-measures a schedule the search measured already; learning it again would
    count that schedule twice."""
    searched = {r.trace_json for r in records if r.phase == "search"}
    return [r for r in records if r.phase == "search" or r.trace_json not in searched]


class BestSoFar:
    """The best record by the rule, found in one pass over records of one workload and
    target without keeping them all: the latest final record of each schedule (a tuning
    run writes a few) and the fastest search record seen. ``usable`` tells whether a
    record may be chosen (say, whether its trace decodes); it is asked only of records
    that would be chosen."""

    def __init__(self, usable: Callable[[TuningRecord], bool] = lambda record: True) -> None:
        self.usable = usable
        self._finals: dict[str, TuningRecord] = {}
        self._searched: TuningRecord | None = None

    def add(self, record: TuningRecord) -> None:
        if record.phase == "final":
            _keep_latest(self._finals, record)
        elif record.is_valid and (self._searched is None or record.cost < self._searched.cost) \
                and self.usable(record):
            self._searched = record

    @property
    def best(self) -> TuningRecord | None:
        """The best record so far, or None when there is no valid one."""
        remeasured = sorted((r for r in self._finals.values() if r.is_valid), key=lambda r: r.cost)
        return next((r for r in remeasured if self.usable(r)), self._searched)


def _split(records: Iterable[TuningRecord]) -> tuple[dict[str, TuningRecord], dict[str, TuningRecord]]:
    """Per schedule (trace text): its latest final record, and its fastest valid search record."""
    finals: dict[str, TuningRecord] = {}
    searched: dict[str, TuningRecord] = {}
    for record in records:
        key = record.trace_json
        if record.phase == "final":
            _keep_latest(finals, record)
        elif record.is_valid and (key not in searched or record.cost < searched[key].cost):
            searched[key] = record
    return finals, searched


def _keep_latest(finals: dict[str, TuningRecord], record: TuningRecord) -> None:
    """Keep ``record`` as its schedule's final record unless one measured later is kept."""
    latest = finals.get(record.trace_json)
    if latest is None or record.timestamp >= latest.timestamp:
        finals[record.trace_json] = record
