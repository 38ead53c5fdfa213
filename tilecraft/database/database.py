"""``Database``: a tuning work dir opened once and queried by workload, MetaSchedule style.

A work dir holds ``records.json``, a tuning log in the one JSON-lines format (``log.py``),
so the auto-scheduler's readers, ``tilecraft best`` and "best over the whole history" all
work on it unchanged.

Opening must be fast on 100,000 records (MetaSchedule's JSON database takes minutes),
and a query needs one workload's records, mostly only the best. So opening reads the
file's bytes and decodes nothing: a line in ``to_json_line``'s layout is indexed by its
key and target as written, found with one search; a query reads the mean costs of that
workload's lines the same way and decodes only the lines it returns (for ``query_best``,
one). A line in any other layout (a comment, a torn or hand-edited line, another version)
is decoded at open, through the same checks and warnings as ``load_records``.
``benchmarks/database_open.py`` times it.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from ..te.dag import ComputeDAG
from ..te.tensor import Tensor
from .log import (MalformedRecordWarning, NoValidRecordError, _explain_no_best, _gc_paused, _has_readable_trace,
                  _skip_reason, canonical_target)
from .best import rank
from .record import LINE_STARTS, RecordFormatError, RecordVersionError, TuningRecord

RECORDS_FILE, STORE_FILE = "records.json", "records.db"
_HEADS = tuple(start.encode() for start in LINE_STARTS)
_FINAL = b'"phase":"final"'  # written just before ',"costs":['

Line = tuple[int, int]  # start and end offsets of a line in the file


class Database:
    """The records of ``work_dir`` as they were when it was opened (open it again to see
    later ones). A workload is named by a ``ComputeDAG``, its tensors, a ``SearchTask`` or
    a workload key; a target by a ``Target`` or its string, None meaning any target.

    The work dir's ``records.json`` is a tuning log (as ``RecordToFile`` writes it);
    opening indexes it without decoding, so it is fast on large logs. A work dir without
    one opens empty. A work dir that holds a SQLite store, ``records.db`` (made by
    ``RecordStore``), is that store instead, read through its index and written by
    several tuners at once (``tune_tir`` writes there when it exists). ``tune_tir``
    returns the Database of its work dir.

    Args:
        work_dir: The directory that holds ``records.json``.

    Raises:
        RecordVersionError: If a record was written by a newer tilecraft.

    Example:
        ::

            db = tc.Database("./tune_tmp")
            best = db.query_best(dag, "llvm --num-cores=2")   # a TuningRecord
            sch = db.query_schedule(dag, "llvm --num-cores=2")
    """

    def __init__(self, work_dir: str | Path) -> None:
        self.work_dir = Path(work_dir)
        self.path = self.work_dir / RECORDS_FILE
        self._store = None
        if (self.work_dir / STORE_FILE).exists():
            from .sqlite import RecordStore  # sqlite.py names workloads with this module

            self._store = RecordStore(self.work_dir / STORE_FILE)
        self._data = self.path.read_bytes() if self.path.exists() and self._store is None else b""
        self._index: dict[bytes, list[Line]] = {}  # b'"<key>","target":"<target>"' -> its lines
        start = lineno = 0
        with _gc_paused():
            while start < len(self._data):
                end = self._data.find(b"\n", start) + 1 or len(self._data)
                lineno += 1
                pair = self._pair(start, end, lineno)
                if pair is not None:
                    self._index.setdefault(pair, []).append((start, end))
                start = end

    def __len__(self) -> int:
        return self._store.count() if self._store is not None else sum(map(len, self._index.values()))

    def __repr__(self) -> str:
        pairs = len(self._store.workloads()) if self._store is not None else len(self._index)
        return f"Database({str(self.work_dir)!r}: {len(self)} records of {pairs} workload/target pairs)"

    def records(self, workload: Any, target: Any = None) -> list[TuningRecord]:
        """Every record of the workload on the target, errors included, oldest first."""
        if self._store is not None:
            return self._store.records(workload_key_of(workload), target)
        return [r for r in map(self._record, self._lines(workload, target)) if r is not None]

    def query_best(self, workload: Any, target: Any = None) -> TuningRecord:
        """The best record of the workload on the target by the rule of ``best.py``: the
        schedules re-measured when tuning ended by their median, before the others by
        their mean cost.

        Raises:
            NoValidRecordError: If there is none; the message says why (no records file, no
                records of the workload, records for other targets only, only errors).
            TypeError: If ``workload`` names no computation.
        """
        if self._store is not None:
            return self._store.best(workload_key_of(workload), target)
        finals: list[Line] = []
        costed = sorted((self._mean_cost(line, finals), line) for line in self._lines(workload, target))
        if finals:  # a few lines a tuning run: decode them, and the fastest search line, and rank by the rule
            final_lines = set(finals)
            searched = next((line for _, line in costed if line not in final_lines), None)
            chosen = finals if searched is None else finals + [searched]
            for record in rank([r for r in map(self._record, chosen) if r is not None]):
                if _has_readable_trace(record, self.path):
                    return record
        for cost, line in costed:
            record = self._record(line) if cost < math.inf else None
            if record is not None and _has_readable_trace(record, self.path):
                return record
        if not self.path.exists():
            raise NoValidRecordError(f"{self.work_dir} holds no tuning records ({RECORDS_FILE}); "
                                     f"tc.tune_tir(..., work_dir={str(self.work_dir)!r}) writes them")
        raise NoValidRecordError(_explain_no_best(self.path, workload_key_of(workload), canonical_target(target)))

    def query_schedule(self, workload: Any, target: Any = None):
        """The best record's schedule, replayed on the workload's DAG.

        Raises:
            NoValidRecordError: As ``query_best``.
            TypeError: If ``workload`` is a workload key, which names a computation but
                cannot rebuild it: pass a ``ComputeDAG``, its tensors or a ``SearchTask``.
        """
        from ..schedule.trace import Trace

        dag = dag_of(workload)
        return Trace.from_json(self.query_best(workload, target).trace).replay(dag)

    def _lines(self, workload: Any, target: Any) -> list[Line]:
        prefix = (json.dumps(workload_key_of(workload)) + ',"target":').encode()
        target = canonical_target(target)
        if target is not None:
            return self._index.get(prefix + json.dumps(target).encode(), [])
        return [line for pair, lines in self._index.items() if pair.startswith(prefix) for line in lines]

    def _pair(self, start: int, end: int, lineno: int) -> bytes | None:
        """The key and target of a line as written; None for a line that holds no record.
        Quotes inside JSON strings are escaped, so the field name searched for cannot occur
        inside a value."""
        data = self._data
        if data.startswith(_HEADS, start) and data.startswith(b"]}\n", end - 3):
            cut = data.find(b',"workload":', start, end)
            if cut > 0:
                return data[data.find(b'"key":', start) + 6:cut]
        line = data[start:end].decode("utf-8", "replace")
        if line[:1] == "#" or line.isspace():
            return None
        try:
            record = TuningRecord.from_json_line(line)
        except RecordVersionError as error:
            raise RecordVersionError(f"{self.path} line {lineno}: {error}") from None
        except RecordFormatError as error:
            warnings.warn(f"{self.path} line {lineno}: {_skip_reason(line, error)}", MalformedRecordWarning,
                          stacklevel=3)
            return None
        return f'{json.dumps(record.workload_key)},"target":{json.dumps(record.target)}'.encode()

    def _mean_cost(self, line: Line, finals: list[Line]) -> float:
        """A line's mean cost (inf for an error), read without decoding it when it can be;
        a final record's line (a re-measurement when tuning ended) is appended to ``finals``."""
        data, (start, end) = self._data, line
        costs = data.find(b',"costs":[', start, end)
        error = data.find(b'],"error":"', costs, end)
        if costs < 0 or error < 0 or not data.startswith(_HEADS, start):
            record = self._record(line)
            if record is not None and record.phase == "final":
                finals.append(line)
            return math.inf if record is None else record.mean_cost
        if data.startswith(_FINAL, costs - len(_FINAL)):
            finals.append(line)
        if not data.startswith(b'none"', error + 11) or error == costs + 10:
            return math.inf
        try:
            values = [float(v) for v in data[costs + 10:error].split(b",")]
        except ValueError:  # null: a cost that was not finite
            return math.inf
        mean = sum(values) / len(values)
        return mean if math.isfinite(mean) else math.inf

    def _record(self, line: Line) -> TuningRecord | None:
        text = self._data[line[0]:line[1]].decode("utf-8", "replace")
        try:
            return TuningRecord.from_json_line(text)
        except RecordFormatError as error:
            warnings.warn(f"{self.path}: {_skip_reason(text, error)}", MalformedRecordWarning, stacklevel=3)
            return None


def workload_key_of(workload: Any) -> str:
    if isinstance(workload, str):
        return workload
    if hasattr(workload, "workload_key"):  # a ComputeDAG or a SearchTask
        return workload.workload_key
    return dag_of(workload).workload_key


def dag_of(workload: Any) -> ComputeDAG:
    if isinstance(workload, ComputeDAG):
        return workload
    if hasattr(workload, "compute_dag"):
        return workload.compute_dag
    if isinstance(workload, (list, tuple)) and workload and all(isinstance(t, Tensor) for t in workload):
        return ComputeDAG(list(workload))
    raise TypeError(f"cannot tell which computation {type(workload).__name__} {str(workload)[:60]!r} is; "
                    f"pass a tc.ComputeDAG, its te tensors or a tc.SearchTask (a registered workload: "
                    f"tc.SearchTask(func=name, args=...); a workload key names one but cannot rebuild it)")
