"""The SQLite record store: one file that several tuners and runners write at once.

A tuning log is a file that one process appends to. When several tuners (or a tuner and
remote runners) share their measurements, a log serves them badly: every reader decodes
the whole file again to find one workload's best, and an append is kept whole only on a
local disk (``O_APPEND`` is not atomic over NFS). A ``RecordStore`` holds exactly the
records of a log, one row each, in a SQLite database:

- **Writers do not wait on readers, nor readers on writers.** The journal is WAL: a
  reader sees the rows committed when its query began, and never blocks a commit.
  Writers take turns: each batch of records is one transaction that takes the write lock
  when it begins (``BEGIN IMMEDIATE``), and a writer that finds it taken waits up to
  ``timeout_secs`` (the busy timeout) rather than failing with "database is locked".
  A transaction that read before it wrote could not wait: SQLite fails it at once, since
  another writer may have changed what it read.
- **A commit survives the process, not the machine.** ``synchronous=NORMAL`` syncs the
  WAL at checkpoints, not at every commit: a killed tuner loses nothing, a power cut may
  lose the last commits, as it may lose a log's last lines.
- **The best is at most three indexed queries** (``best``), not a pass over every row:
  the model rows of the workload's latest choice in place, the latest of each schedule;
  failing a valid one, its final rows likewise; failing those, the search row of lowest
  cost. They apply the rule of ``best.py`` exactly as ``load_best_record`` does, ties
  included (the earliest row wins).
- **The log stays the exchange format.** ``import_log`` and ``export_log`` convert line
  for line: a log written by ``to_json_line`` comes back byte for byte. A version 1
  record imports as what it reads as (a search measurement by an unknown device) and
  exports in the current version, as rewriting a log upgrades it.
- **Rows are checked like log lines.** A row another program wrote is decoded through
  ``TuningRecord.from_json_parts``; one that fails is skipped with a
  ``MalformedRecordWarning`` naming the store and the row.

``PRAGMA user_version`` is the record version of the rows: a store of a newer version
is refused with ``RecordVersionError``, as a log's newer records are. A version 2 or 3
store is upgraded when it is opened: its table is copied into the current schema, whose
phases include ``"model"`` and ``"model_rival"``, in one transaction. The schema is
docs/formats.md's, word for word ("The SQLite store"); its comments are kept in the file.
``benchmarks/database_store.py`` times the store against the log and ``Database``.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import sqlite3
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

from .database import workload_key_of
from .log import (MalformedRecordWarning, NoValidRecordError, _gc_paused, _has_readable_trace, canonical_target,
                  iter_records, measured_records)
from .record import RECORD_VERSION, RecordFormatError, RecordVersionError, TuningRecord, _finite_or_none, trace_key

SCHEMA = """\
CREATE TABLE records (
  id INTEGER PRIMARY KEY,          -- insertion order, as a log's line order
  workload_key TEXT NOT NULL,
  target TEXT NOT NULL,            -- the canonical target string
  workload TEXT,                   -- JSON object, or NULL
  sketch TEXT,
  costs TEXT NOT NULL,             -- JSON list of seconds (null for a non-finite one)
  cost REAL,                       -- a final or model row's median, a search row's mean; NULL unless valid
  error TEXT NOT NULL,
  error_msg TEXT NOT NULL,
  all_cost REAL,
  time REAL NOT NULL,
  flop REAL NOT NULL,
  phase TEXT NOT NULL CHECK (phase IN ('search', 'final', 'model', 'model_rival')),
  device TEXT,
  trace_hash TEXT NOT NULL,        -- SHA-256 of the trace text: a schedule's identity, indexed
  trace TEXT NOT NULL              -- the trace's compact JSON
);
CREATE INDEX records_by_cost ON records (workload_key, target, phase, cost);
CREATE INDEX records_by_schedule ON records (workload_key, target, trace_hash, time);
"""
_FIELDS = ("workload_key, target, workload, sketch, costs, cost, error, error_msg, all_cost, time, flop, phase, "
           "device, trace_hash, trace")
_INSERT = f"INSERT INTO records ({_FIELDS}) VALUES ({', '.join('?' * 15)})"
_COLUMNS = ("id, workload_key, target, workload, sketch, costs, error, error_msg, all_cost, time, flop, phase, "
            "device, trace")
# The rule's first queries: the latest model (then final) row of each schedule (a later
# row, or the later of two at one time, replaces it), the valid ones by cost (model rows of
# the latest choice only, _NEWEST); equal costs in the order their schedules were first
# re-measured, as best.py keeps them. The final query leaves out the schedules that model
# rows decide (_MODELED). Such rows are a few per tuning run: found by records_by_cost, they
# are sorted in memory (without INDEXED BY the planner walks records_by_schedule through
# every row of the workload to skip the sort).
_LATEST = f"""SELECT {_COLUMNS} FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY trace_hash ORDER BY time DESC, id DESC) AS age,
         MIN(id) OVER (PARTITION BY trace_hash) AS first
  FROM records INDEXED BY records_by_cost WHERE {{where}} AND phase = '{{phase}}'{{unless}})
WHERE age = 1 AND cost IS NOT NULL{{newest}} ORDER BY cost, first"""
# the latest choice in place: its model rows share the newest time of the workload's model rows
_NEWEST = " AND time = (SELECT MAX(time) FROM records WHERE {where} AND phase = 'model')"
# schedules the model rows decide: those of the latest choice, and those whose latest model row is an error
_MODELED = """ AND trace_hash NOT IN (SELECT trace_hash FROM (
  SELECT trace_hash, cost, time, ROW_NUMBER() OVER (PARTITION BY trace_hash ORDER BY time DESC, id DESC) AS age
  FROM records WHERE {where} AND phase = 'model')
  WHERE age = 1 AND (cost IS NULL OR time = (SELECT MAX(time) FROM records WHERE {where} AND phase = 'model')))"""
_SEARCHED = (f"SELECT {_COLUMNS} FROM records WHERE {{where}} AND phase = 'search' AND cost IS NOT NULL "
             "ORDER BY cost, id")
_IMPORT_BATCH = 10_000  # rows a transaction while importing: other writers get a turn between batches


class RecordStore:
    """Tuning records in a SQLite file that many processes read and write at once.

    It holds exactly what a log holds, one row a record, and reads back equal
    ``TuningRecord``s. Open one store per process and thread (a SQLite connection does not
    cross ``fork``, and Python's serves the thread that opened it); ``RecordToStore`` is the
    measure callback that writes to one.

    Args:
        path: The store; created, with its directory and schema, if it does not exist.
        timeout_secs: How long a writer waits for another's transaction to end before
            failing with "database is locked".

    Raises:
        RecordVersionError: If the store was written by a newer tilecraft.
        RecordFormatError: If ``path`` is not a SQLite file, or is one that is not a
            record store; the message names the file.

    Example:
        ::

            with tc.RecordStore("records.db") as store:
                store.import_log("matmul.json")
                best = store.best(task.workload_key, task.target)
    """

    def __init__(self, path: str | Path, timeout_secs: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout_secs, isolation_level="IMMEDIATE")
            self._open()
        except BaseException as error:
            if hasattr(self, "_db"):
                self._db.close()
            if isinstance(error, sqlite3.OperationalError):  # locked, unreadable, a directory: not about the format
                raise sqlite3.OperationalError(f"{self.path}: {error}") from None
            if isinstance(error, sqlite3.DatabaseError):
                hint = "; a tuning log is read into a store with import_log" if _looks_like_log(self.path) else ""
                raise RecordFormatError(f"{self.path} is not a record store: {error}{hint}") from None
            raise

    def _open(self) -> None:
        version = self._check_version()
        self._db.execute("PRAGMA journal_mode = WAL")  # kept in the file: a no-op once set
        self._db.execute("PRAGMA synchronous = NORMAL")
        if version == RECORD_VERSION and self._tables() == ["records"]:
            return
        with self._db:  # create the schema once, whoever opens a new file first
            self._db.execute("BEGIN IMMEDIATE")
            version, tables = self._check_version(), self._tables()
            older = version in (2, 3) and tables == ["records"]
            if (version == 0 and not tables) or older:
                if older:  # its CHECK refuses the newer phases: the rows move to a table that takes them
                    self._db.execute("DROP INDEX records_by_cost")
                    self._db.execute("DROP INDEX records_by_schedule")
                    self._db.execute("ALTER TABLE records RENAME TO records_older")
                for statement in SCHEMA.split(";\n")[:-1]:
                    self._db.execute(statement)
                if older:
                    self._db.execute("INSERT INTO records SELECT * FROM records_older")
                    self._db.execute("DROP TABLE records_older")
                self._db.execute(f"PRAGMA user_version = {RECORD_VERSION}")
            elif version != RECORD_VERSION or tables != ["records"]:
                raise RecordFormatError(f"{self.path} is a SQLite database but not a record store (tables: "
                                        f"{', '.join(tables) or 'none'}; user_version {version})")

    def _check_version(self) -> int:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > RECORD_VERSION:
            raise RecordVersionError(f"{self.path} holds records of version {version}, newer than this tilecraft "
                                     f"reads (up to version {RECORD_VERSION}); upgrade tilecraft to read it")
        return version

    def _tables(self) -> list[str]:
        return [name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RecordStore({str(self.path)!r})"

    def add(self, records: Iterable[TuningRecord]) -> int:
        """Append ``records`` in one transaction (all or none of them); returns how many."""
        rows = [_row(record) for record in records]
        if not rows:
            return 0
        with self._db:  # BEGIN IMMEDIATE before the first insert, COMMIT (or ROLLBACK) at the end
            self._db.executemany(_INSERT, rows)
        return len(rows)

    def records(self, workload: Any = None, target: Any = None) -> list[TuningRecord]:
        """Every record, errors included, in the order they were added (as ``load_records``
        returns a log's), optionally only those of one workload (a key, ``ComputeDAG`` or
        ``SearchTask``) and target (a ``Target`` or its string)."""
        where, args = _where(workload, target)
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM records WHERE {where} ORDER BY id", args)
        return [record for record in map(self._record, rows) if record is not None]

    def best(self, workload: Any, target: Any = None) -> TuningRecord:
        """The best record of the workload on the target (any target when None) by the rule of
        ``best.py``, the record ``load_best_record`` would return from the same records.

        Raises:
            NoValidRecordError: If there is none; the message says why (no records of the
                workload, records for other targets only, or only errors).
        """
        key, target = workload_key_of(workload), canonical_target(target)
        where, args = _where(key, target)
        queries = ((_LATEST.format(where=where, phase="model", unless="", newest=_NEWEST.format(where=where)),
                    args + args),  # each runs only when
                   (_LATEST.format(where=where, phase="final", unless=_MODELED.format(where=where), newest=""),
                    args * 3),
                   (_SEARCHED.format(where=where), args))  # those before it found no usable row
        for query, query_args in queries:
            for row in self._db.execute(query, query_args):
                record = self._record(row)
                if record is not None and _has_readable_trace(record, self.path):
                    return record
        raise NoValidRecordError(self._explain_no_best(key, target))

    def count(self, workload: Any = None, target: Any = None) -> int:
        where, args = _where(workload, target)
        return self._db.execute(f"SELECT COUNT(*) FROM records WHERE {where}", args).fetchone()[0]

    def workloads(self) -> list[tuple[str, str]]:
        """The (workload key, target) pairs the store holds, in order of their first record."""
        return [(key, target) for key, target, _ in self._db.execute(
            "SELECT workload_key, target, MIN(id) AS first FROM records GROUP BY workload_key, target ORDER BY first")]

    def import_log(self, path: str | Path) -> int:
        """Add every record of a tuning log (``*.xz`` read through xz), in its order; returns
        how many. Lines that are not records are skipped with a warning, as ``load_records``
        skips them. Importing a log twice holds its records twice, as appending it twice
        would (the best does not change)."""
        added, batch = 0, []
        with _gc_paused():  # as load_records: 100,000 new objects would trigger collections that find nothing
            for record in iter_records(path):
                batch.append(record)
                if len(batch) == _IMPORT_BATCH:
                    added, batch = added + self.add(batch), []
            return added + self.add(batch)

    def export_log(self, path: str | Path) -> int:
        """Write every record as a tuning log (xz-compressed when ``path`` ends in ``.xz``), in
        the order they were added; returns how many lines. Each line is ``to_json_line``'s,
        so a log imported into an empty store exports as the same bytes.

        Raises:
            FileExistsError: If ``path`` exists: merge logs by importing them into one store.
        """
        opened = lzma.open if Path(path).suffix == ".xz" else open
        written = 0
        with opened(path, "xt", encoding="utf-8") as file:
            for row in self._db.execute(f"SELECT {_COLUMNS} FROM records ORDER BY id"):
                record = self._record(row)
                if record is not None:
                    file.write(record.to_json_line() + "\n")
                    written += 1
        return written

    def _record(self, row: Sequence[Any]) -> TuningRecord | None:
        """A row as a record, or None (with a warning) when it is not one."""
        rowid, key, target, workload, sketch, costs, error, error_msg, all_cost, time, flop, phase, device, trace = row
        try:
            data = {"v": RECORD_VERSION, "key": key, "target": target, "sketch": sketch, "phase": phase,
                    "workload": None if workload is None else json.loads(workload), "costs": json.loads(costs),
                    "error": error, "error_msg": error_msg, "all_cost": all_cost, "time": time, "flop": flop,
                    "device": device}
            if type(trace) is not str or not trace.startswith("["):
                raise RecordFormatError("record field 'trace' should be a JSON list")
            return TuningRecord.from_json_parts(data, trace)
        except (ValueError, TypeError) as reason:  # JSON errors and RecordFormatError are ValueErrors
            warnings.warn(f"{self.path} row {rowid}: {reason}; the row is skipped", MalformedRecordWarning,
                          stacklevel=3)
            return None

    def _explain_no_best(self, key: str, target: str | None) -> str:
        by_target: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        for on, error, n in self._db.execute(
                "SELECT target, error, COUNT(*) FROM records WHERE workload_key = ? GROUP BY target, error", (key,)):
            by_target[on] += n
            if target is None or on == target:
                errors[error] += n
        if not by_target:
            others = self._db.execute("SELECT COUNT(DISTINCT workload_key), COUNT(*) FROM records").fetchone()
            return (f"{self.path} has no records of workload {key}; it holds {others[1]} records of {others[0]} "
                    f"other workload(s). Was the workload defined differently when it was tuned?")
        if target is not None and target not in by_target:
            found = "; ".join(f"'{t}' ({n} records)" for t, n in by_target.most_common())
            return (f"{self.path} has {sum(by_target.values())} records of workload {key} but none on target "
                    f"'{target}'; it has records on: {found}")
        if set(errors) == {"none"}:
            return f"the valid records of workload {key} in {self.path} have traces that cannot be read"
        kinds = ", ".join(f"{kind} {n}" for kind, n in errors.most_common())
        return f"none of the {sum(errors.values())} records of workload {key} in {self.path} is valid ({kinds})"


class RecordToStore:
    """Measure callback: add each call's measurements to the store at ``path`` in one
    transaction, as ``RecordToFile`` appends them to a log. Several tuners (processes) may
    write to one store at once.

    ``callback(task, measure_inputs, measure_results, sketches=None)``. The store is opened
    (and created) when the callback is made, so a wrong path fails before tuning starts; a
    callback pickled or forked to another process, or called from another thread, opens its
    own connection there.

    Args:
        path: The store (``RecordStore``).
        timeout_secs: How long a write waits for other writers.

    Raises:
        ValueError: When called with inputs, results and sketches that differ in number.

    Example:
        ::

            options = tc.TuningOptions(num_measure_trials=200, measure_callbacks=[tc.RecordToStore("records.db")])
    """

    def __init__(self, path: str | Path, timeout_secs: float = 60.0) -> None:
        self.path, self.timeout_secs = Path(path), timeout_secs
        self._store = RecordStore(self.path, timeout_secs)
        self._owner = (os.getpid(), threading.get_ident())

    def __call__(self, task: Any, measure_inputs: Sequence[Any], measure_results: Sequence[Any],
                 sketches: Sequence[Any] | None = None) -> None:
        records = measured_records(task, measure_inputs, measure_results, sketches)
        owner = (os.getpid(), threading.get_ident())
        if owner != self._owner:  # forked, or another thread: a connection serves the one that opened it
            self._store, self._owner = RecordStore(self.path, self.timeout_secs), owner
        self._store.add(records)

    def __reduce__(self) -> tuple:
        return RecordToStore, (self.path, self.timeout_secs)

    def __repr__(self) -> str:
        return f"RecordToStore({str(self.path)!r})"


def _row(record: TuningRecord) -> tuple:
    # The trace as to_json_line writes it (compact, one line), so a store and a log agree.
    trace = record.trace_json if "\n" not in record.trace_json else trace_key(record.trace)
    workload = None if record.workload is None else json.dumps(record.workload, separators=(",", ":"))
    return (record.workload_key, record.target, workload, record.sketch,
            json.dumps([_finite_or_none(c) for c in record.costs], separators=(",", ":")),
            record.cost if record.is_valid else None, record.error_kind, record.error_msg,
            _finite_or_none(record.all_cost), record.timestamp, record.flop, record.phase, record.device,
            hashlib.sha256(trace.encode()).hexdigest(), trace)


def _where(workload: Any, target: Any) -> tuple[str, tuple[str, ...]]:
    """The SQL condition for a workload and a target, either None for any."""
    key, target = None if workload is None else workload_key_of(workload), canonical_target(target)
    conditions = [(name, value) for name, value in (("workload_key", key), ("target", target)) if value is not None]
    return " AND ".join(f"{name} = ?" for name, _ in conditions) or "1", tuple(value for _, value in conditions)


def _looks_like_log(path: Path) -> bool:
    """Whether a file starts as a tuning log does (given where a store was meant)."""
    with open(path, "rb") as file:
        head = file.read(64)
    return head.startswith((b"{", b"#", b"\xfd7zXZ"))  # a record, a comment, xz
