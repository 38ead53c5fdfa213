"""The tuning log: append-and-flush writing, tolerant reading, best over the whole history."""

import json
import lzma
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import tilecraft as tc
from tilecraft.database import (MalformedRecordWarning, NoValidRecordError, RecordFormatError, RecordToFile,
                                RecordVersionError, best_records, iter_records, load_best_record, load_records,
                                measured_trace_keys, summarize, trace_key)

KEY = '["dag", "k0"]'


class _Task:
    def __init__(self, dag, target, key=KEY):
        self.workload_key, self.workload, self.target, self.compute_dag = key, {"func": "mm", "args": [16]}, target, dag


class _Input:
    def __init__(self, trace):
        self.trace = trace


class _Result:
    def __init__(self, cost=1e-3, kind="none", msg="", timestamp=1000.0):
        self.costs, self.error_kind, self.error_msg = ((cost,) if cost else ()), kind, msg
        self.all_cost, self.timestamp = 0.4, timestamp


def _read_lines(path):
    return Path(path).read_text().splitlines()


def test_each_measurement_is_on_disk_before_the_callback_returns(tmp_path, matmul_dag, matmul_trace, target):
    path = tmp_path / "new" / "dir" / "log.json"
    callback = RecordToFile(path)
    task = _Task(matmul_dag(), tc.Target(target))
    callback(task, [_Input(matmul_trace(4))], [_Result(1e-3)])
    assert len(_read_lines(path)) == 1
    callback(task, [_Input(matmul_trace(2)), _Input(matmul_trace(8))], [_Result(2e-3), _Result(None, "compile", "x")],
             sketches=["tiling", "simple"])
    records = load_records(path)
    assert [r.sketch for r in records] == [None, "tiling", "simple"]
    assert [r.error_kind for r in records] == ["none", "none", "compile"]
    assert records[0].target == target and records[1].trace_json == trace_key(matmul_trace(2))


def test_callback_refuses_inputs_and_results_of_different_lengths(log_path, matmul_dag, matmul_trace, target):
    with pytest.raises(ValueError, match="2 measure inputs but 1 results"):
        RecordToFile(log_path)(_Task(matmul_dag(), target), [_Input(matmul_trace(4))] * 2, [_Result()])


@pytest.fixture
def log_path(tmp_path):
    return tmp_path / "log.json"


def test_torn_last_line_is_skipped_with_a_warning(log_path, make_record, write_log):
    line = make_record(5e-3).to_json_line()
    write_log(log_path, [make_record(1e-3), make_record(2e-3)], extra=line[: len(line) // 2])
    with pytest.warns(MalformedRecordWarning, match=r"line 3: the last line is incomplete \(the tuner was probably "
                                                     r"killed while writing it\); it is ignored"):
        records = load_records(log_path)
    assert [r.mean_cost for r in records] == [1e-3, 2e-3]


def test_a_garbage_line_is_skipped_with_a_warning_naming_it(log_path, make_record, write_log):
    write_log(log_path, [make_record(1e-3)],
              extra="# a comment\n\n{not json\n[1, 2]\n" + make_record(2e-3).to_json_line() + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_records(log_path)
    assert len(records) == 2
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert f"{log_path} line 4: not valid JSON" in messages[0] and "skipped" in messages[0]
    assert f"{log_path} line 5: a record must be a JSON object, not list" in messages[1]


def test_a_run_killed_mid_line_then_resumed_keeps_both_runs(log_path, make_record, write_log, matmul_dag,
                                                            matmul_trace, target):
    line = make_record(5e-3).to_json_line()
    write_log(log_path, [make_record(1e-3)], extra=line[:40])
    RecordToFile(log_path)(_Task(matmul_dag(), target), [_Input(matmul_trace(2))], [_Result(3e-3)])
    with pytest.warns(MalformedRecordWarning, match="line 2: not valid JSON.*ends early"):
        records = load_records(log_path)
    assert [r.mean_cost for r in records] == [1e-3, 3e-3]


def test_a_record_of_a_newer_version_stops_the_read(log_path, make_record, write_log):
    newer = make_record(1e-3).to_json_line().replace('{"v":4,', '{"v":5,')
    write_log(log_path, [make_record(1e-3)], extra=newer + "\n")
    with pytest.raises(RecordVersionError, match=rf"{log_path} line 2: record version 5 .*upgrade tilecraft"):
        load_records(log_path)


def test_best_is_the_fastest_of_the_whole_history(log_path, make_record, write_log, other_target):
    first_run = [make_record(3e-3, inner=1), make_record(1e-3, inner=4), make_record(2e-3, inner=2)]
    errors = [make_record(1e-5, error="wrong_answer"), make_record(None, error="compile")]
    other = [make_record(1e-4, target=other_target), make_record(1e-4, key='["dag", "other"]')]
    later_worse_run = [make_record(5e-3, inner=8, timestamp=9000.0), make_record(4e-3, inner=16, timestamp=9001.0)]
    write_log(log_path, first_run + errors + other + later_worse_run)
    best = load_best_record(log_path, KEY, first_run[0].target)
    assert best.mean_cost == 1e-3 and best.trace_json == first_run[1].trace_json
    assert load_best_record(log_path, KEY).mean_cost == 1e-4  # any target
    assert load_best_record(log_path, KEY, tc.Target(other_target)).target == other_target


def test_no_valid_record_when_the_file_does_not_exist(tmp_path):
    with pytest.raises(NoValidRecordError, match=r"nope\.json does not exist"):
        load_best_record(tmp_path / "nope.json", KEY)


def test_no_valid_record_names_the_workloads_the_log_has(log_path, make_record, write_log):
    write_log(log_path, [make_record(key=f'["dag", "w{n}"]', workload={"func": f"op{n}", "args": [n]})
                         for n in range(7) for _ in range(n + 1)])
    with pytest.raises(NoValidRecordError) as error:
        load_best_record(log_path, KEY)
    message = str(error.value)
    assert f'no records of workload {KEY}' in message and "its 28 records are of 7 other workload(s)" in message
    assert "op6(6) (7 records)" in message and "op2(2) (3 records)" in message and "and 2 more" in message
    assert "op1(1)" not in message


def test_no_valid_record_names_the_targets_the_log_has(log_path, make_record, write_log, target, other_target):
    write_log(log_path, [make_record(1e-3, target=other_target)] * 3)
    with pytest.raises(NoValidRecordError, match=rf"3 records of workload .* but none on target '{target}'; it has "
                                                 rf"records on: '{other_target}' \(3 records\)"):
        load_best_record(log_path, KEY, target)


def test_no_valid_record_counts_the_errors_by_kind(log_path, make_record, write_log, target):
    errors = [make_record(None, error="compile", msg="gcc: bad")] * 3 + [make_record(None, error="run_timeout")]
    write_log(log_path, errors + [make_record(1e-3, key='["dag", "x"]')])
    with pytest.raises(NoValidRecordError, match=r"all 4 records of workload .* are errors \(compile 3, "
                                                 r"run_timeout 1\); the most common message: 'gcc: bad'"):
        load_best_record(log_path, KEY, target)


def test_a_best_record_whose_trace_is_corrupt_is_passed_over(log_path, make_record, write_log):
    corrupt = make_record(1e-4).to_json_line().replace('"kind":"get_block"', '"kind":"get_bl{')
    write_log(log_path, [make_record(1e-3)], extra=corrupt + "\n")
    with pytest.warns(MalformedRecordWarning, match="trace of this record is not valid JSON"):
        assert load_best_record(log_path, KEY).mean_cost == 1e-3


def test_best_records_are_distinct_schedules_fastest_first(log_path, make_record, write_log, other_target):
    write_log(log_path, [make_record(3e-3, inner=1), make_record(1e-3, inner=4), make_record(0.5e-3, inner=4),
                         make_record(2e-3, inner=2), make_record(1e-6, error="wrong_answer", inner=8),
                         make_record(1e-3, target=other_target)])
    top = best_records(log_path, KEY, top_k=3)
    assert [r.mean_cost for r in top] == [0.5e-3, 2e-3, 3e-3, 1e-3]  # three on one target, one on the other
    assert [r.mean_cost for r in best_records(log_path)] == [0.5e-3, 1e-3]
    assert len(measured_trace_keys(iter_records(log_path))) == 4  # errors too: never measure them again


def test_summary_per_workload_and_target(log_path, make_record, write_log, other_target):
    write_log(log_path, [make_record(2e-3), make_record(1e-3), make_record(None, error="compile", msg="m"),
                         make_record(1e-3, target=other_target)])
    first, second = summarize(log_path)
    assert (first.count, first.valid, first.errors, first.common_error_msg) == (4 - 1, 2, {"compile": 1}, "m")
    assert first.best.mean_cost == 1e-3 and second.target == other_target and second.errors == {}


_CHILD = """
import sys
from tilecraft.database import RecordToFile

class Dag:
    def flop_count(self):
        return 8192.0

class Task:
    workload_key, workload, target, compute_dag = '["dag", "k0"]', None, "llvm", Dag()

class Input:
    trace = [{"kind": "get_block", "args": {"name": "matmul"}, "outputs": ["b0"], "pad": "x" * 3000}]

class Result:
    costs, error_kind, error_msg, all_cost, timestamp = (1e-3,), "none", "", 0.1, 1.0

callback = RecordToFile(sys.argv[1])
for n in range(10 ** 9):
    callback(Task(), [Input()], [Result()])
    if n == 100:
        print("written", flush=True)
"""


def test_a_log_written_by_a_killed_process_still_loads(log_path):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(log_path)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parents[2])
    try:
        assert child.stdout.readline() == "written\n"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_records(log_path)
    assert len(records) > 100 and all(r.is_valid for r in records)
    assert len(caught) <= 1 and all("killed while writing" in str(w.message) for w in caught)


def test_twenty_thousand_records_load_in_a_fraction_of_a_second(log_path, make_record):
    line = make_record(1e-3).to_json_line()
    line = line[:-2] + ("," + line[line.index('"trace":[') + 9:-2]) * 3 + "]}"  # a trace of about 2 KB
    log_path.write_text((line + "\n") * 20_000)
    start = time.perf_counter()
    records = load_records(log_path)
    elapsed = time.perf_counter() - start
    assert len(records) == 20_000 and len(line) > 1500
    assert elapsed < 2.0, f"{elapsed:.2f} s for 20,000 records"  # a loose bound: the machine may be busy


def test_a_log_named_xz_is_read_through_xz_and_one_that_is_not_xz_is_named_with_the_fix(log_path, make_record,
                                                                                          write_log):
    write_log(log_path, [make_record(1e-3), make_record(2e-3)])
    packed = log_path.with_name("log.json.xz")
    packed.write_bytes(lzma.compress(log_path.read_bytes()))
    assert [r.mean_cost for r in load_records(packed)] == [1e-3, 2e-3]
    packed.write_bytes(log_path.read_bytes())
    with pytest.raises(RecordFormatError, match=r"log.json.xz is named \*.xz but is not xz-compressed.*rename it"):
        load_records(packed)


def test_a_log_to_append_to_cannot_be_named_xz(tmp_path):
    with pytest.raises(ValueError, match=r"cannot be xz-compressed; name it without .xz.*\(xz log.json\)"):
        RecordToFile(tmp_path / "log.json.xz")


def test_comments_and_blank_lines_are_skipped_silently_however_many(log_path, make_record, write_log):
    write_log(log_path, [make_record(1e-3)], extra="# tuned on the build machine\n" * 1500 + "\n  \n"
              + make_record(2e-3).to_json_line() + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.mean_cost for r in load_records(log_path)] == [1e-3, 2e-3]


def test_a_corrupt_log_warns_about_ten_lines_then_counts_the_rest(log_path, make_record, write_log):
    write_log(log_path, [make_record(1e-3)], extra="garbage\n" * 25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(load_records(log_path)) == 1
    assert len(caught) == 11 and "line 11:" in str(caught[9].message)
    assert str(caught[10].message) == f"{log_path}: 25 lines in all are not records and were skipped"


def test_reading_one_workload_of_many_finds_each_of_its_records(log_path, make_record, write_log, target,
                                                                other_target):
    records = [make_record(1e-3 * (n + 1), key=f'["dag", "w{n % 5}"]', target=(target, other_target)[n % 2])
               for n in range(40)]
    hand_written = make_record(1e-5, key='["dag", "w3"]', target=target).to_json()
    write_log(log_path, records, extra=json.dumps(hand_written, indent=None) + "\n")  # spaces after the colons
    mine = load_records(log_path, '["dag", "w3"]', target)
    assert [r.mean_cost for r in mine] == [1e-3 * (n + 1) for n in (8, 18, 28, 38)] + [1e-5]
    assert load_best_record(log_path, '["dag", "w3"]', target).mean_cost == 1e-5
