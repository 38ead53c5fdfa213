"""Which schedule of a workload is the best: the one rule every reader of records follows.

The best of hundreds of single noisy measurements is chosen for being high: the winner's
curse. A shared machine also drifts while it tunes, and a tuner's worker is not the
process a user times a kernel in. So when tuning ends, its best candidates are measured
again, interleaved, several repeats each, in a fresh worker, and written as ``"final"``
records (``tune/remeasure.py``). A kernel of a model is also not timed alone by its user:
between the model's other kernels its weights come from memory. So the best few schedules
of each task of a model can be timed in place, inside the compiled model, interleaved, and
written as ``"model"`` records (``model/in_place.py``). The rule:

1. A schedule kept by the workload's latest choice in place (its model records share one
   timestamp, the newest of the workload's model records) ranks by the median of the
   repeats of that record, before every other schedule. A schedule whose latest model
   record is an error is out; one timed only by earlier choices ranks as if never timed in
   a model (those times were taken beside other kernels, on another day), and so does one
   the choice timed and did not keep (a ``"model_rival"`` record: the choice keeps the
   schedule in use unless another beats it in a paired test, ``model/in_place.py``). A
   choice of record version 3 kept no schedule alone: all it timed have model records, and
   rank by their medians.
2. Then a schedule with a final record, by the median of its latest final record; an
   error there puts it out too.
3. Every such re-measured schedule ranks before every schedule measured only while
   searching. Those rank by the mean cost of their fastest search record, as in Ansor;
   that is all a log of record version 1 holds. (Should every re-measured schedule be
   out, the schedules rank by this alone.)

So once any schedule of a workload has been re-measured, a lucky single measurement
cannot win, and once its finalists have been timed inside a model, the model's time
decides, as the latest choice found it: the model compiled from the log is the one that
choice made. ``load_best_record``, ``best_records``, ``Database.query_best``,
``tilecraft best``, compiled models and transfer all rank by this rule, through
``rank`` or ``BestSoFar``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .record import TuningRecord


REMEASURED = ("model", "final")  # the phases of re-measurements, the one that ranks first first


def rank(records: Iterable[TuningRecord]) -> list[TuningRecord]:
    """The distinct valid schedules of ``records`` (one workload on one target), best first
    by the rule, each as one record: its latest model or final record, or its fastest
    search record."""
    latest, searched = _split(records)
    latest = _latest_choice(latest)
    remeasured = _remeasured(latest)
    seen = set().union(*latest.values())
    rest = searched.values() if not remeasured else (r for key, r in searched.items() if key not in seen)
    return remeasured + sorted(rest, key=lambda r: r.cost)


def _remeasured(latest: dict[str, dict[str, TuningRecord]]) -> list[TuningRecord]:
    """The valid latest records of each phase of re-measurement (``_split``), phase by phase
    and by cost within one; a schedule with a record of an earlier phase is left out of the
    later ones (even where that record is an error: the schedule is out)."""
    remeasured, seen = [], set()
    for phase in REMEASURED:
        remeasured += sorted((r for key, r in latest[phase].items() if r.is_valid and key not in seen),
                             key=lambda r: r.cost)
        seen.update(latest[phase])
    return remeasured


def for_learning(records: Sequence[TuningRecord]) -> list[TuningRecord]:
    """``records`` as a cost model learns from them: every search record, and a final record
    only of a schedule no search record measured (a log distilled to its best). A final
    record re-measures a schedule the search measured already; learning it again would
    count that schedule twice. A model record is never learned: it times the kernel as a
    model leaves its caches, not as the runner times candidates."""
    searched = {r.trace_json for r in records if r.phase == "search"}
    return [r for r in records if r.phase == "search" or (r.phase == "final" and r.trace_json not in searched)]


class BestSoFar:
    """The best record by the rule, found in one pass over records of one workload and
    target without keeping them all: the latest model and final record of each schedule (a
    tuning run writes a few) and the fastest search record seen. ``usable`` tells whether a
    record may be chosen (say, whether its trace decodes); it is asked only of records
    that would be chosen."""

    def __init__(self, usable: Callable[[TuningRecord], bool] = lambda record: True) -> None:
        self.usable = usable
        self._latest: dict[str, dict[str, TuningRecord]] = {phase: {} for phase in REMEASURED}
        self._searched: TuningRecord | None = None

    def add(self, record: TuningRecord) -> None:
        if record.phase in self._latest:
            _keep_latest(self._latest[record.phase], record)
        elif record.phase == "search" and record.is_valid and (
                self._searched is None or record.cost < self._searched.cost) and self.usable(record):
            self._searched = record

    @property
    def best(self) -> TuningRecord | None:
        """The best record so far, or None when there is no valid one."""
        return next((r for r in _remeasured(_latest_choice(self._latest)) if self.usable(r)), self._searched)


def _latest_choice(latest: dict[str, dict[str, TuningRecord]]) -> dict[str, dict[str, TuningRecord]]:
    """``latest`` with the model records of earlier choices in place left out, but errors:
    a choice writes its records with one timestamp, and the newest decides."""
    models = latest["model"]
    newest = max((r.timestamp for r in models.values()), default=None)
    return {**latest, "model": {key: r for key, r in models.items() if r.timestamp == newest or not r.is_valid}}


def _split(records: Iterable[TuningRecord]) -> tuple[dict[str, dict[str, TuningRecord]], dict[str, TuningRecord]]:
    """Per phase of re-measurement and schedule (trace text): its latest record; per schedule,
    its fastest valid search record (a model rival's time is neither)."""
    latest: dict[str, dict[str, TuningRecord]] = {phase: {} for phase in REMEASURED}
    searched: dict[str, TuningRecord] = {}
    for record in records:
        key = record.trace_json
        if record.phase in latest:
            _keep_latest(latest[record.phase], record)
        elif record.phase == "search" and record.is_valid and (key not in searched or record.cost < searched[key].cost):
            searched[key] = record
    return latest, searched


def _keep_latest(latest: dict[str, TuningRecord], record: TuningRecord) -> None:
    """Keep ``record`` as its schedule's latest record of its phase unless one measured later is kept."""
    kept = latest.get(record.trace_json)
    if kept is None or record.timestamp >= kept.timestamp:
        latest[record.trace_json] = record
