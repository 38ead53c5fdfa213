"""The SQLite record store: the schema of docs/formats.md, a log's records read back equal, the best
by the one rule, the log as exchange format both ways, and several processes writing at once."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pickle
import re
import signal
import sqlite3
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database import (RECORD_VERSION, MalformedRecordWarning, NoValidRecordError, RecordFormatError,
                                RecordStore, RecordToFile, RecordVersionError, TuningRecord, load_best_record,
                                load_records, summarize)
from tilecraft.database.best import rank
from tilecraft.database.sqlite import _INSERT, SCHEMA, _row

FORMATS = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


@pytest.fixture
def store(tmp_path):
    with RecordStore(tmp_path / "records.db") as opened:
        yield opened


@pytest.fixture
def varied(make_record, target, other_target):
    """Records of every kind: errors, finals, devices, a registered workload, a non-finite cost, other
    workloads and targets, a message that is not ASCII."""
    return [
        make_record(2e-3, inner=4, workload={"func": "matmul", "args": [16, 16, 16, "float32"]}),
        make_record(None, inner=8, error="compile", msg="error: ‘x’ undeclared\nline 2"),
        dataclasses.replace(make_record(1e-3, inner=2), phase="final", costs=(1e-3, 1.2e-3, 0.9e-3),
                            device="local@box/cuda:0", timestamp=1001.5),
        dataclasses.replace(make_record(1e-3, inner=1), costs=(1e-3, float("inf")), all_cost=float("inf")),
        make_record(3e-3, inner=16, key='["dag", "k1"]', sketch=None),
        make_record(4e-3, inner=4, target=other_target, timestamp=999.0),
    ]


def test_the_schema_is_the_one_docs_formats_md_gives_with_wal_and_the_record_version(store):
    section = FORMATS.read_text().split("## The SQLite store", 1)[1]
    block = re.search(r"```sql\n(.*?)```", section, re.DOTALL).group(1)
    assert block == SCHEMA
    stored = [sql for (sql,) in store._db.execute("SELECT sql FROM sqlite_master ORDER BY rowid")]
    assert stored == [statement for statement in block.split(";\n") if statement.strip()]
    pragma = lambda name: store._db.execute(f"PRAGMA {name}").fetchone()[0]
    assert (pragma("journal_mode"), pragma("synchronous"), pragma("user_version")) == ("wal", 1, RECORD_VERSION)
    assert pragma("busy_timeout") == 60_000


def test_records_read_back_equal_in_the_order_they_were_added_as_from_a_log(store, varied, write_log, tmp_path,
                                                                            target, other_target):
    assert store.add(varied[:2]) == 2 and store.add(varied[2:]) == 4 and store.add([]) == 0
    write_log(tmp_path / "log.json", varied)
    assert store.records() == load_records(tmp_path / "log.json")
    assert store.records()[3].costs == (1e-3, float("inf")) and store.records()[3].all_cost == float("inf")
    assert store.records('["dag", "k0"]', tc.Target(target)) == [r for r in store.records()
                                                                 if r.workload_key == '["dag", "k0"]'
                                                                 and r.target == target]
    assert store.count() == 6 and store.count('["dag", "k0"]') == 5 and store.count(target=other_target) == 1
    assert store.workloads() == [('["dag", "k0"]', target), ('["dag", "k1"]', target),
                                 ('["dag", "k0"]', other_target)]
    row = store._db.execute("SELECT cost, costs, trace_hash FROM records WHERE id = 4").fetchone()
    assert row[:2] == (None, "[0.001,null]") and len(row[2]) == 64
    final = store._db.execute("SELECT cost FROM records WHERE phase = 'final'").fetchone()[0]
    assert final == varied[2].cost == 1e-3  # the median of the repeats


def test_a_store_of_a_newer_version_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "records.db"
    RecordStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {RECORD_VERSION + 1}")
    with pytest.raises(RecordVersionError, match=rf"{path} holds records of version {RECORD_VERSION + 1}, newer "
                                                 rf".*upgrade tilecraft"):
        RecordStore(path)


@pytest.mark.parametrize("version, phases", [(2, "'search', 'final'"), (3, "'search', 'final', 'model'")])
def test_an_older_store_is_upgraded_when_opened_keeping_its_rows_in_order(tmp_path, varied, version, phases):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # a store as that version made it: its CHECK knew fewer phases
        db.executescript(SCHEMA.replace("'search', 'final', 'model', 'model_rival'", phases)
                         + f"PRAGMA user_version = {version};")
        db.executemany(_INSERT, [_row(record) for record in varied])
    with RecordStore(path) as store:
        assert store.records() == varied
        model = dataclasses.replace(varied[0], phase="model", costs=(5e-3, 4e-3, 6e-3), timestamp=2000.0)
        rival = dataclasses.replace(varied[1], phase="model_rival", costs=(1e-3,) * 3, timestamp=2000.0)
        store.add([model, rival])
        assert store.best(model.workload_key, model.target) == model
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == RECORD_VERSION
        assert [name for (name,) in db.execute("SELECT name FROM sqlite_master ORDER BY name")] == [
            "records", "records_by_cost", "records_by_schedule"]


def test_a_file_that_is_not_a_store_is_named_and_a_log_is_pointed_to_import_log(tmp_path, make_record, write_log):
    write_log(tmp_path / "log.json", [make_record()] * 40)
    with pytest.raises(RecordFormatError, match=r"log.json is not a record store: file is not a database; a "
                                                r"tuning log is read into a store with import_log"):
        RecordStore(tmp_path / "log.json")
    (tmp_path / "noise.bin").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(RecordFormatError, match="noise.bin is not a record store: file is not a database$"):
        RecordStore(tmp_path / "noise.bin")
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE people (name TEXT)")
    with pytest.raises(RecordFormatError, match=r"other.db is a SQLite database but not a record store \(tables: "
                                                r"people; user_version 0\)"):
        RecordStore(tmp_path / "other.db")
    with pytest.raises(sqlite3.OperationalError, match=f"{tmp_path}: unable to open"):
        RecordStore(tmp_path)


def _random_records(rng: np.random.Generator, key: str, targets: list[str]) -> list[TuningRecord]:
    """Search, final, model and model rival records of a few schedules, with errors, repeated schedules, equal costs
    and equal times: every tie the rule breaks."""
    records = []
    for _ in range(int(rng.integers(1, 30))):
        failed = rng.random() < 0.15
        phase = str(rng.choice(["search", "final", "model", "model_rival"], p=[0.55, 0.3, 0.1, 0.05]))
        costs = () if failed else tuple(float(c) for c in rng.choice([1e-3, 2e-3, 3e-3, 4e-3],
                                                                      size=2 if phase == "search" else 3))
        records.append(TuningRecord(
            workload_key=key, workload=None, target=str(rng.choice(targets)),
            trace_json=f'[{{"kind":"split","decision":[{int(rng.integers(6))}]}}]', costs=costs,
            error_kind="run_timeout" if failed else "none", error_msg="", all_cost=0.5,
            timestamp=float(rng.integers(5)), flop=1e6, sketch=None, phase=phase))
    return records


@pytest.mark.slow
def test_the_best_is_the_record_load_best_record_finds_and_ranks_first(store, tmp_path, write_log, target,
                                                                       other_target):
    rng = np.random.default_rng(0)
    trials = {f'["dag", "random{n}"]': _random_records(rng, f'["dag", "random{n}"]', [target, other_target])
              for n in range(150)}
    everything = [record for records in trials.values() for record in records]
    store.add(everything)
    write_log(tmp_path / "log.json", everything)
    compared = 0
    for key, records in trials.items():
        for on in (target, None):
            ranked = rank([r for r in records if on is None or r.target == on])
            if not ranked:
                with pytest.raises(NoValidRecordError):
                    store.best(key, on)
                continue
            best = store.best(key, on)
            assert best == load_best_record(tmp_path / "log.json", key, on)
            assert (best.cost, best.phase) == (ranked[0].cost, ranked[0].phase)  # rank breaks equal costs otherwise
            compared += 1
    assert compared > 250


def test_no_best_says_why(store, make_record, target, other_target):
    store.add([make_record(None, error="compile", msg="boom"), make_record(None, error="compile"),
               make_record(None, error="run_timeout"), make_record(1e-3, target=other_target),
               make_record(1e-3, key='["dag", "k9"]')])
    with pytest.raises(NoValidRecordError, match=r'no records of workload \["dag", "nothing"\]; it holds 5 records '
                                                 r'of 2 other workload'):
        store.best('["dag", "nothing"]', target)
    with pytest.raises(NoValidRecordError, match=r"none of the 3 records of workload .* is valid \(compile 2, "
                                                 r"run_timeout 1\)"):
        store.best('["dag", "k0"]', target)
    with pytest.raises(NoValidRecordError, match=r"1 records of workload .* but none on target 'llvm -isa=avx2 .* "
                                                 r"-num-cores=2"):
        store.best('["dag", "k9"]', target.replace("-num-cores=4", "-num-cores=2"))
    assert store.best('["dag", "k0"]').target == other_target


def test_a_best_whose_trace_is_corrupt_is_passed_over_with_a_warning(store, make_record):
    broken = dataclasses.replace(make_record(0.5e-3), trace_json="[{broken")
    good = make_record(1e-3, inner=2)
    store.add([broken, good, dataclasses.replace(broken, phase="final")])
    with pytest.warns(MalformedRecordWarning, match="records.db: a record of .* is skipped: the trace of this record "
                                                    "is not valid JSON"):
        assert store.best(good.workload_key) == good


def test_a_log_goes_into_the_store_and_comes_out_byte_for_byte(store, varied, write_log, tmp_path):
    write_log(tmp_path / "log.json", varied * 3)
    assert store.import_log(tmp_path / "log.json") == 18
    assert store.export_log(tmp_path / "again.json") == 18
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "log.json").read_bytes()
    assert store.export_log(tmp_path / "again.json.xz") == 18
    with RecordStore(tmp_path / "second.db") as second:
        assert second.import_log(tmp_path / "again.json.xz") == 18
        assert second.records() == store.records()
    with pytest.raises(FileExistsError):
        store.export_log(tmp_path / "log.json")


def test_version_1_lines_and_garbage_import_as_the_log_reads_them_and_export_in_the_current_version(store, make_record,
                                                                                          write_log, tmp_path):
    line = json.loads(make_record(0.9e-3, inner=1).to_json_line())
    version_1 = {"v": 1, **{k: v for k, v in line.items() if k not in ("v", "phase", "device")}}
    write_log(tmp_path / "old.json", [make_record(1e-3)],
              extra="# a comment\n{not json\n" + json.dumps(version_1, separators=(",", ":")) + "\n")
    with pytest.warns(MalformedRecordWarning, match="old.json line 3"):
        assert store.import_log(tmp_path / "old.json") == 2
    store.export_log(tmp_path / "new.json")
    with pytest.warns(MalformedRecordWarning):
        expected = [record.to_json_line() + "\n" for record in load_records(tmp_path / "old.json")]
    exported = (tmp_path / "new.json").read_text().splitlines(keepends=True)
    assert exported == expected
    assert (exported[1].startswith(f'{{"v":{RECORD_VERSION},') and '"phase":"search"' in exported[1]
            and '"device":null' in exported[1])


def test_a_row_that_is_not_a_record_is_skipped_with_a_warning_naming_it(store, make_record):
    good = make_record(1e-3)
    store.add([good] * 4)
    store._db.execute("UPDATE records SET costs = '{\"a\": 1}' WHERE id = 2")
    store._db.execute("UPDATE records SET workload = '[1, 2]' WHERE id = 3")
    store._db.execute("UPDATE records SET trace = 'not a trace', time = 'noon' WHERE id = 4")
    store._db.commit()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.records() == [good]
    messages = [str(w.message) for w in caught if issubclass(w.category, MalformedRecordWarning)]
    assert len(messages) == 3 and all("records.db row" in m and "the row is skipped" in m for m in messages)
    assert "row 2: record field 'costs' should be list" in messages[0]


class _Task:
    def __init__(self, dag, target):
        self.workload_key, self.workload, self.target, self.compute_dag = '["dag", "k0"]', None, target, dag


class _Input:
    def __init__(self, trace):
        self.trace = trace


class _Result:
    def __init__(self, cost, kind="none"):
        self.costs, self.error_kind, self.error_msg = ((cost,) if cost else ()), kind, "" if cost else "failed"
        self.all_cost, self.timestamp, self.phase, self.device = 0.4, 1000.0, "search", "local@box"


def test_the_callback_stores_what_record_to_file_logs_from_another_process_or_thread(tmp_path, matmul_dag,
                                                                                    matmul_trace, target):
    task = _Task(matmul_dag(), tc.Target(target))
    inputs, results = [_Input(matmul_trace(4)), _Input(matmul_trace(2))], [_Result(1e-3), _Result(None, "compile")]
    to_store, to_file = tc.RecordToStore(tmp_path / "new" / "records.db"), RecordToFile(tmp_path / "log.json")
    for callback in (to_store, to_file):
        callback(task, inputs, results, sketches=["tiling", "simple"])
        callback(task, inputs[:1], results[:1])
    copied = pickle.loads(pickle.dumps(to_store))
    copied(task, inputs[1:], results[1:])
    to_file(task, inputs[1:], results[1:])
    in_thread = threading.Thread(target=to_store, args=(task, inputs[:1], results[:1]))
    in_thread.start()
    in_thread.join()
    to_file(task, inputs[:1], results[:1])
    with RecordStore(tmp_path / "new" / "records.db") as store:
        assert store.records() == load_records(tmp_path / "log.json")
        assert [r.sketch for r in store.records()] == ["tiling", "simple", None, None, None]
    assert repr(copied) == f"RecordToStore('{tmp_path / 'new' / 'records.db'}')"
    with pytest.raises(ValueError, match="2 measure inputs but 1 results"):
        to_store(task, inputs, results[:1])


def _write(path: str, worker: int, start: multiprocessing.synchronize.Barrier, count: int = 200,
           largest_batch: int = 20) -> None:
    rng = np.random.default_rng(worker)
    records = [TuningRecord(workload_key=f'["dag", "writer{worker}"]', workload=None, target="llvm",
                            trace_json=f'[{{"kind":"split","decision":[{n}]}}]', costs=(1e-3 * (1 + n % 7),),
                            error_kind="none", error_msg="", all_cost=0.1, timestamp=float(n), flop=1.0,
                            sketch=None) for n in range(count)]
    with RecordStore(path) as store:
        start.wait()
        while records:
            size = int(rng.integers(1, largest_batch + 1))
            store.add(records[:size])
            records = records[size:]


def _read(path: str, start: multiprocessing.synchronize.Barrier, seen: multiprocessing.Queue) -> None:
    counts = []
    with RecordStore(path) as store:
        start.wait()
        deadline = time.monotonic() + 30  # should a writer fail, fail rather than wait for ever
        while (not counts or counts[-1] < 400) and time.monotonic() < deadline:
            counts.append(len(store.records()))
            if counts[-1]:
                store.best('["dag", "writer0"]' if store.count('["dag", "writer0"]') else '["dag", "writer1"]')
    seen.put(counts)


@pytest.mark.slow
def test_two_writing_processes_and_a_reading_one_lose_nothing(tmp_path):
    path = str(tmp_path / "records.db")
    RecordStore(path).close()
    spawn = multiprocessing.get_context("spawn")
    start, seen = spawn.Barrier(3), spawn.Queue()
    processes = [spawn.Process(target=_write, args=(path, worker, start)) for worker in range(2)]
    processes.append(spawn.Process(target=_read, args=(path, start, seen)))
    for process in processes:
        process.start()
    counts = seen.get(timeout=40)
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0, 0, 0]  # no "database is locked" in any
    assert counts == sorted(counts) and counts[-1] == 400
    with RecordStore(path) as store:
        for worker in range(2):
            records = store.records(f'["dag", "writer{worker}"]')
            assert [r.timestamp for r in records] == [float(n) for n in range(200)]
        assert store.best('["dag", "writer1"]').cost == 1e-3


@pytest.mark.slow
def test_four_writers_of_2000_records_lose_and_repeat_none_and_a_killed_one_loses_only_its_record_in_flight(
        tmp_path):
    """Issue 46's figures: four processes writing 2,000 records each at once, and a fifth,
    writing one record a transaction, killed with SIGKILL while it writes."""
    path = str(tmp_path / "records.db")
    RecordStore(path).close()
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(5)
    writers = [spawn.Process(target=_write, args=(path, worker, start, 2000)) for worker in range(4)]
    doomed = spawn.Process(target=_write, args=(path, 4, start, 100_000, 1))
    for process in (*writers, doomed):
        process.start()
    with RecordStore(path) as store:
        deadline = time.monotonic() + 60
        while store.count('["dag", "writer4"]') < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
    os.kill(doomed.pid, signal.SIGKILL)
    for process in (*writers, doomed):
        process.join(timeout=120)
    assert [process.exitcode for process in writers] == [0, 0, 0, 0] and doomed.exitcode == -signal.SIGKILL
    with RecordStore(path) as store:
        for worker in range(4):
            records = store.records(f'["dag", "writer{worker}"]')
            assert [r.timestamp for r in records] == [float(n) for n in range(2000)]
        kept = [r.timestamp for r in store.records('["dag", "writer4"]')]
        assert len(kept) >= 200 and kept == [float(n) for n in range(len(kept))]  # a whole prefix: no gap, no torn row


def test_every_reader_of_logs_reads_a_store_as_its_log(store, varied, write_log, tmp_path):
    """load_records, load_best_record, summarize (tilecraft best) and apply_best take a store
    where they take a log, and find what they find in the log it was imported from."""
    log = tmp_path / "log.json"
    write_log(log, varied)
    store.import_log(log)
    path = store.path
    assert load_records(path) == load_records(log)
    for key in {r.workload_key for r in varied}:
        assert load_records(path, key) == load_records(log, key)
        try:
            expected = load_best_record(log, key)
        except NoValidRecordError:
            with pytest.raises(NoValidRecordError):
                load_best_record(path, key)
            continue
        assert load_best_record(path, key) == expected
    assert [(s.workload_key, s.count, s.valid) for s in summarize(path)] == \
        [(s.workload_key, s.count, s.valid) for s in summarize(log)]
