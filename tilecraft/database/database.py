"""``Database``: a tuning work dir opened once and queried by workload, MetaSchedule style.

A work dir holds ``records.json``, a tuning log in the one JSON-lines format (``log.py``),
so the auto-scheduler's readers, ``tilecraft best`` and "best over the whole history" all
work on it unchanged; or ``records.db``, a SQLite store (``sqlite.py``) that several tuners
write at once. A log is read at open by ``load_records``, the one reader of logs (its checks,
warnings and speed), and its records grouped by workload and target; a store is queried
through its index. ``benchmarks/database_open.py`` times the open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..te.dag import ComputeDAG
from ..te.tensor import Tensor
from .best import BestSoFar
from .log import NoValidRecordError, _explain_no_best, _has_readable_trace, canonical_target, load_records
from .record import TuningRecord

RECORDS_FILE, STORE_FILE = "records.json", "records.db"


class Database:
    """The records of ``work_dir`` as they were when it was opened (open it again to see
    later ones). A workload is named by a ``ComputeDAG``, its tensors, a ``SearchTask`` or
    a workload key; a target by a ``Target`` or its string, None meaning any target.

    The work dir's ``records.json`` is a tuning log (as ``RecordToFile`` writes it), read
    at open as ``load_records`` reads any log. A work dir without one opens empty. A work
    dir that holds a SQLite store, ``records.db`` (made by ``RecordStore``), is that store
    instead, read through its index and written by several tuners at once (``tune_tir``
    writes there when it exists). ``tune_tir`` returns the Database of its work dir.

    Args:
        work_dir: The directory that holds ``records.json`` or ``records.db``.

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
        self._store, self._records = None, []
        if (self.work_dir / STORE_FILE).exists():
            from .sqlite import RecordStore  # sqlite.py names workloads with this module

            self._store = RecordStore(self.work_dir / STORE_FILE)
        elif self.path.exists():
            self._records = load_records(self.path)

    def __len__(self) -> int:
        return self._store.count() if self._store is not None else len(self._records)

    def __repr__(self) -> str:
        pairs = len(self._store.workloads() if self._store is not None
                    else {(r.workload_key, r.target) for r in self._records})
        return f"Database({str(self.work_dir)!r}: {len(self)} records of {pairs} workload/target pairs)"

    def records(self, workload: Any, target: Any = None) -> list[TuningRecord]:
        """Every record of the workload on the target, errors included, oldest first."""
        key, target = workload_key_of(workload), canonical_target(target)
        if self._store is not None:
            return self._store.records(key, target)
        return [r for r in self._records if r.workload_key == key and (target is None or r.target == target)]

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
        found = BestSoFar(lambda record: _has_readable_trace(record, self.path))
        for record in self.records(workload, target):
            found.add(record)
        if found.best is not None:
            return found.best
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
