"""The tuning log: a JSON-lines file of ``TuningRecord``s that only ever grows.

Writing: ``RecordToFile`` is the measure callback. It appends one line per measurement
and flushes it at once; the tuner calls it after every measurement, so a run that is
killed loses at most the candidate it was measuring, and a half-written last line.

Reading tolerates what a killed run or a hand edit leaves behind, and says so:

- blank lines and lines that start with ``#`` are skipped silently (comments);
- a line that is not a record is skipped with a warning naming the file, the line and why;
- an incomplete last line (no newline, not JSON) is skipped with a warning that the tuner
  was probably killed while writing it;
- a record written by a newer tilecraft stops the read with ``RecordVersionError``:
  skipping it would silently drop measurements, guessing its meaning could be wrong.

Reading is built for logs of 100,000 records and more (MetaSchedule's JSON database took
minutes on such logs): traces stay undecoded text until used (see ``record.py``), the
other fields of 512 lines are decoded in one call, and the garbage collector is paused
while a log is read.

"Best" is over the **whole** file, every run that ever appended to it, as in Ansor's
``load_best_record``: a later, worse run does not replace an earlier best. When there is
no best, ``NoValidRecordError`` says why (no file, no records of the workload, records for
other targets only, or only errors) instead of falling back to anything.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import lzma
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..errors import TilecraftError
from .best import BestSoFar, rank
from .record import LINE_STARTS, RecordFormatError, RecordVersionError, TuningRecord, split_line, workload_label

_MAX_WARNINGS_PER_FILE = 10  # then one summary warning, so a corrupt log does not flood the output
_BATCH_LINES = 512
_DECODER = json.JSONDecoder()


class NoValidRecordError(TilecraftError, LookupError):
    """A log has no valid record for the requested workload and target; the message says why."""


class MalformedRecordWarning(UserWarning):
    """A line of a tuning log was skipped."""


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    """What a log holds for one (workload, target) pair."""

    workload_key: str
    workload: dict | None
    target: str
    count: int
    valid: int
    errors: dict[str, int]  # error kind -> number of records, most frequent first
    best: TuningRecord | None
    common_error_msg: str  # the most frequent error message, "" without errors

    @property
    def label(self) -> str:
        return workload_label(self.workload_key, self.workload)


class RecordToFile:
    """Measure callback: append each measurement to the log at ``path`` as one JSON line.

    ``callback(task, measure_inputs, measure_results, sketches=None)``; ``sketches``, when
    given, names the sketch of each input. Every line is flushed as it is written. A torn
    last line left by a killed run is ended with a newline first, so new records never
    merge into it.

    Args:
        path: The log; created, with its directory, on the first measurement.

    Raises:
        ValueError: If ``path`` ends in ``.xz`` (a log that grows cannot be compressed);
            a call raises it if the inputs, results and sketches differ in number.

    Example:
        ::

            options = tc.TuningOptions(num_measure_trials=200, measure_callbacks=[tc.RecordToFile("matmul.json")])
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.suffix == ".xz":
            raise ValueError(f"{self.path}: a log is appended a line at a time and so cannot be xz-compressed; "
                             f"name it without .xz and compress it when tuning is done (xz {self.path.stem})")

    def __call__(self, task: Any, measure_inputs: Sequence[Any], measure_results: Sequence[Any],
                 sketches: Sequence[Any] | None = None) -> None:
        append_records(self.path, measured_records(task, measure_inputs, measure_results, sketches))

    def __repr__(self) -> str:
        return f"RecordToFile({str(self.path)!r})"


def append_records(path: str | Path, records: Sequence[TuningRecord]) -> None:
    """Append ``records`` to the log at ``path`` (made, with its directory, if missing), each
    line flushed as it is written; or add them to it in one transaction if it is a SQLite
    store (``RecordStore``)."""
    path = Path(path)
    if is_store(path):
        from .sqlite import RecordStore  # it reads logs with this module: imported when used

        with RecordStore(path) as store:
            store.add(records)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as file:
        _end_torn_line(file)
        for record in records:
            file.write((record.to_json_line() + "\n").encode())  # one write per line: O_APPEND keeps it whole
            file.flush()


def measured_records(task: Any, measure_inputs: Sequence[Any], measure_results: Sequence[Any],
                     sketches: Sequence[Any] | None = None) -> list[TuningRecord]:
    """The records of a measure callback's arguments (what ``RecordToFile`` and
    ``RecordToStore`` write), one per input in order.

    Raises:
        ValueError: If the inputs, results and sketch names do not pair up.
    """
    if len(measure_inputs) != len(measure_results):
        raise ValueError(f"{len(measure_inputs)} measure inputs but {len(measure_results)} results")
    if sketches is not None and len(sketches) != len(measure_inputs):
        raise ValueError(f"{len(sketches)} sketch names for {len(measure_inputs)} measure inputs")
    flop = task.compute_dag.flop_count()
    names = sketches if sketches is not None else [None] * len(measure_inputs)
    return [TuningRecord.from_measurement(task, measure_input, result, sketch, flop)
            for measure_input, result, sketch in zip(measure_inputs, measure_results, names)]


def iter_records(path: str | Path, workload_key: str | None = None, target: Any = None) -> Iterator[TuningRecord]:
    """The records of the log in file order, optionally only those of one workload key and
    target (a string or ``Target``; compared in canonical form). A log named ``*.xz`` is read
    through xz, as logs are kept compressed; a SQLite store (``RecordStore``) is read as its
    log would be, so every reader of logs reads stores too."""
    path = Path(path)
    if is_store(path):
        from .sqlite import RecordStore  # it reads logs with this module: imported when used

        with RecordStore(path) as store:
            yield from store.records(workload_key, target)
        return
    target = canonical_target(target)
    # A line in this version's layout that lacks the key or target as written cannot match:
    # skip it without decoding (a log of a whole network holds many workloads).
    needles = [f'"{name}":{json.dumps(value)},' for name, value in (("key", workload_key), ("target", target))
               if value is not None]
    skipped = 0
    opened = lzma.open if path.suffix == ".xz" else open
    with opened(path, "rt", encoding="utf-8", errors="replace") as file:
        numbered = enumerate(file, 1)
        while chunk := list(_lines(numbered, path)):
            batch = [(n, line) for n, line in chunk if line[0] != "#" and not line.isspace() and not (
                needles and line.startswith(LINE_STARTS) and not all(needle in line for needle in needles))]
            for lineno, line, record in _decode_batch(batch):
                if isinstance(record, RecordVersionError):
                    raise RecordVersionError(f"{path} line {lineno}: {record}")
                if isinstance(record, RecordFormatError):
                    skipped += 1
                    if skipped <= _MAX_WARNINGS_PER_FILE:
                        warnings.warn(f"{path} line {lineno}: {_skip_reason(line, record)}", MalformedRecordWarning,
                                      stacklevel=2)
                elif (workload_key is None or record.workload_key == workload_key) and (
                        target is None or record.target == target):
                    yield record
    if skipped > _MAX_WARNINGS_PER_FILE:
        warnings.warn(f"{path}: {skipped} lines in all are not records and were skipped", MalformedRecordWarning,
                      stacklevel=2)


def _lines(numbered: Iterator[tuple[int, str]], path: Path) -> list[tuple[int, str]]:
    """The next batch of numbered lines; a log named *.xz that is not xz is named with the fix."""
    try:
        return list(itertools.islice(numbered, _BATCH_LINES))
    except lzma.LZMAError as error:
        raise RecordFormatError(f"{path} is named *.xz but is not xz-compressed ({error}); rename it without .xz, "
                                f"or compress it with xz") from None


def _decode_batch(batch: list[tuple[int, str]]) -> list[tuple[int, str, TuningRecord | RecordFormatError]]:
    """Decode lines, a record or the error that prevents one for each.

    The fields other than the trace of a whole batch are decoded as one JSON array: one
    call, and the field names made once, is three times faster than a call per line.
    A batch with any line out of the usual layout is decoded line by line instead.
    """
    parts = [split_line(line) for _, line in batch]
    heads = None
    if all(parts):
        try:
            heads = _DECODER.decode("[" + ",".join(head for head, _ in parts) + "]")
        except ValueError:
            pass
    if heads is None or len(heads) != len(batch):
        heads = [None] * len(batch)
    decoded = []
    for (lineno, line), head, part in zip(batch, heads, parts):
        try:
            if type(head) is dict and "trace" not in head:
                decoded.append((lineno, line, TuningRecord.from_json_parts(head, part[1])))
            else:
                decoded.append((lineno, line, TuningRecord.from_json_line(line)))
        except RecordFormatError as error:
            decoded.append((lineno, line, error))
    return decoded


def load_records(path: str | Path, workload_key: str | None = None, target: Any = None) -> list[TuningRecord]:
    """Every record of a tuning log, errors included, in file order.

    Lines that are not records (comments, a torn last line, a hand edit) are skipped with
    a ``MalformedRecordWarning`` naming the file and line. A log named ``*.xz`` is read
    through xz.

    Args:
        path: The log.
        workload_key: Only the records of this workload (a ``SearchTask``'s or a
            ``ComputeDAG``'s ``workload_key``); None for all.
        target: Only the records for this target (a ``Target`` or its string, compared in
            canonical form); None for all.

    Raises:
        FileNotFoundError: If the log does not exist.
        RecordVersionError: If a record was written by a newer tilecraft.
        RecordFormatError: If a log named ``*.xz`` is not xz-compressed.
    """
    with _gc_paused():
        return list(iter_records(path, workload_key, target))


def load_best_record(path: str | Path, workload_key: str, target: Any = None) -> TuningRecord:
    """The best record of ``workload_key`` on ``target`` (any target when None) in the whole
    log, over every run that ever appended to it, by the rule of ``best.py``: the schedules
    re-measured when tuning ended by their median, before the others by their mean.

    Raises:
        NoValidRecordError: If the log does not exist or holds no valid record of the
            workload on the target; the message says which (no records of the workload,
            records for other targets only, or only errors).
        RecordVersionError: If a record was written by a newer tilecraft.
    """
    path = Path(path)
    if not path.exists():
        raise NoValidRecordError(f"{path} does not exist; a tuning run writes it (RecordToFile)")
    if is_store(path):  # by its index, not by reading every record of the workload
        from .sqlite import RecordStore

        with RecordStore(path) as store:
            return store.best(workload_key, target)
    found = BestSoFar(lambda record: _has_readable_trace(record, path))
    with _gc_paused():
        for record in iter_records(path, workload_key, target):
            found.add(record)
    best = found.best
    if best is None:
        raise NoValidRecordError(_explain_no_best(path, workload_key, canonical_target(target)))
    return best


def best_records(path: str | Path, workload_key: str | None = None, target: Any = None,
                 top_k: int = 1) -> list[TuningRecord]:
    """The ``top_k`` best distinct schedules of each (workload, target) pair in the log by the
    rule of ``best.py``, one record each, pairs in order of first appearance, best first
    within a pair. ``top_k=1`` distills a log to its best records."""
    return best_of(load_records(path, workload_key, target), path, top_k)


def best_of(records: Iterable[TuningRecord], path: str | Path, top_k: int = 1) -> list[TuningRecord]:
    """``best_records`` of ``records`` read from the log at ``path`` already: a caller that ranks
    a log's records more than one way (all, and only the times alone) reads it once."""
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, not {top_k}")
    groups: dict[tuple[str, str], list[TuningRecord]] = {}
    for record in records:
        groups.setdefault((record.workload_key, record.target), []).append(record)
    chosen = []
    for group in groups.values():
        chosen += [r for r in rank(group) if _has_readable_trace(r, Path(path))][:top_k]
    return chosen


def measured_trace_keys(records: Iterable[TuningRecord]) -> set[str]:
    """``trace_key`` of every record, errors included: the schedules never to measure again."""
    return {record.trace_json for record in records}


def summarize(path: str | Path) -> list[WorkloadSummary]:
    """One summary per (workload, target) pair of the log, in order of first appearance."""
    groups: dict[tuple[str, str], _Tally] = {}
    with _gc_paused():
        for record in iter_records(path):
            tally = groups.get((record.workload_key, record.target))
            if tally is None:
                tally = groups[record.workload_key, record.target] = _Tally(record.workload)
            tally.add(record)
    return [WorkloadSummary(
        workload_key=key, workload=tally.workload, target=target, count=tally.count, valid=tally.valid,
        errors=dict(tally.error_kinds.most_common()), best=tally.best,
        common_error_msg=tally.error_msgs.most_common(1)[0][0] if tally.error_msgs else "")
        for (key, target), tally in groups.items()]


class _Tally:
    """The running counts behind one ``WorkloadSummary``."""

    def __init__(self, workload: dict | None) -> None:
        self.workload = workload
        self.count = self.valid = 0
        self.best_so_far = BestSoFar()
        self.error_kinds: Counter[str] = Counter()
        self.error_msgs: Counter[str] = Counter()

    @property
    def best(self) -> TuningRecord | None:
        return self.best_so_far.best

    def add(self, record: TuningRecord) -> None:
        self.count += 1
        self.best_so_far.add(record)
        if record.is_valid:
            self.valid += 1
        else:
            self.error_kinds[record.error_kind] += 1
            self.error_msgs[record.error_msg] += 1


def is_store(path: Path) -> bool:
    """Whether ``path`` is a SQLite file (a ``RecordStore``) rather than a tuning log."""
    try:
        with open(path, "rb") as file:
            return file.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def canonical_target(target: Any) -> str | None:
    """The canonical string of a target given as a ``Target`` or a string, as logs store it."""
    if target is None:
        return None
    from ..target import Target

    return str(target if isinstance(target, Target) else Target(target))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while reading a log: records hold no cycles, and
    collections triggered by 100,000 new objects would double the reading time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _skip_reason(line: str, error: RecordFormatError) -> str:
    if not line.endswith("\n"):  # only the last line of a file can lack its newline
        return "the last line is incomplete (the tuner was probably killed while writing it); it is ignored"
    return f"{error}; the line is skipped"


def _has_readable_trace(record: TuningRecord, path: Path) -> bool:
    """Reading a log leaves traces undecoded; a candidate for "best" must decode."""
    try:
        record.trace
    except RecordFormatError as error:
        warnings.warn(f"{path}: a record of {record.workload_key} at time {record.timestamp} is skipped: {error}",
                      MalformedRecordWarning, stacklevel=3)
        return False
    return True


def _end_torn_line(file) -> None:
    """Append a newline if the file's last byte is not one (a line torn by a killed run)."""
    end = file.seek(0, 2)
    if end:
        file.seek(end - 1)
        if file.read(1) != b"\n":
            file.write(b"\n")


def _explain_no_best(path: Path, workload_key: str, target: str | None) -> str:
    key_counts: Counter[str] = Counter()
    target_counts: Counter[str] = Counter()
    error_kinds: Counter[str] = Counter()
    error_msgs: Counter[str] = Counter()
    workloads: dict[str, dict | None] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MalformedRecordWarning)  # the first read has shown them
        for record in iter_records(path):
            key_counts[record.workload_key] += 1
            workloads.setdefault(record.workload_key, record.workload)
            if record.workload_key == workload_key:
                target_counts[record.target] += 1
                if (target is None or record.target == target) and not record.is_valid:
                    error_kinds[record.error_kind] += 1
                    error_msgs[record.error_msg] += 1
    label = workload_label(workload_key, workloads.get(workload_key))
    if not key_counts:
        return f"{path} holds no tuning records"
    if workload_key not in key_counts:
        others = ", ".join(f"{workload_label(k, workloads[k])} ({n} records)" for k, n in key_counts.most_common(5))
        more = f" and {len(key_counts) - 5} more" if len(key_counts) > 5 else ""
        return (f"{path} has no records of workload {workload_key}; its {sum(key_counts.values())} records are of "
                f"{len(key_counts)} other workload(s): {others}{more}. Was the workload defined differently "
                f"when it was tuned (shape, dtype, operator)?")
    on_target = f" on target '{target}'" if target is not None else ""
    if target is not None and target not in target_counts:
        found = "; ".join(f"'{t}' ({n} records)" for t, n in target_counts.most_common())
        return (f"{path} has {key_counts[workload_key]} records of workload {label} but none on target "
                f"'{target}'; it has records on: {found}. Pass one of these targets, or tune on this one")
    total = sum(error_kinds.values())
    if not total:
        return (f"the valid records of workload {label}{on_target} in {path} have traces that cannot be read "
                f"(see the warnings)")
    kinds = ", ".join(f"{kind} {n}" for kind, n in error_kinds.most_common())
    message = error_msgs.most_common(1)[0][0] if error_msgs else ""
    return (f"all {total} records of workload {label}{on_target} in {path} are errors ({kinds}); "
            f"the most common message: {message!r}")
