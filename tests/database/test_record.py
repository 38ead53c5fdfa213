"""TuningRecord: one JSON line per measurement, round trips, validation, versions."""

import json
import math
from enum import Enum

import pytest

import tilecraft as tc
from tilecraft.database import RECORD_VERSION, RecordFormatError, RecordVersionError, TuningRecord, trace_key


def test_record_round_trips_through_one_compact_line(make_record, matmul_trace):
    record = make_record(2e-3, workload={"func": "matmul", "args": [16, 16, 16]}, msg="")
    line = record.to_json_line()
    assert "\n" not in line and ": " not in line and line.startswith(f'{{"v":{RECORD_VERSION},')
    assert line.endswith("]}")  # the trace is the last field
    assert TuningRecord.from_json_line(line + "\n") == record
    assert TuningRecord.from_json(json.loads(line)) == record
    assert TuningRecord.from_json(record.to_json()) == record
    assert tc.Trace.from_json(record.trace) == matmul_trace(4)


def test_validity_mean_cost_and_gflops(make_record):
    record = make_record(2e-3)
    assert record.is_valid and record.mean_cost == pytest.approx(2e-3)
    assert record.gflops == pytest.approx(2.0 * 16**3 / 2e-3 / 1e9)
    for bad in (make_record(1e-3, error="compile", msg="gcc: error"), make_record(None)):
        assert not bad.is_valid and bad.mean_cost == math.inf and bad.gflops == 0.0


def test_non_finite_costs_are_written_as_null_and_read_as_infinity(make_record):
    record = make_record(math.inf, error="run_timeout")
    line = record.to_json_line()
    assert '"costs":[null,null]' in line and "Infinity" not in line
    assert TuningRecord.from_json_line(line + "\n").costs == (math.inf, math.inf)


def test_a_line_in_another_layout_is_still_read(make_record):
    record = make_record(1e-3, workload={"func": "f", "args": [{"trace": [1]}]})  # the trace mark inside a field
    assert TuningRecord.from_json_line(record.to_json_line() + "\n") == record
    pretty = json.dumps(record.to_json(), indent=1).replace("\n", " ") + "\n"
    assert TuningRecord.from_json_line(pretty) == record


def test_a_missing_field_is_named(make_record):
    data = make_record().to_json()
    del data["costs"]
    with pytest.raises(RecordFormatError, match="no field 'costs'"):
        TuningRecord.from_json(data)
    line = make_record().to_json_line().replace('"error":"none",', "")
    with pytest.raises(RecordFormatError, match="no field 'error'"):
        TuningRecord.from_json_line(line + "\n")


@pytest.mark.parametrize("field, value, expected", [
    ("costs", "fast", "'costs' should be list"),
    ("costs", [1e-3, "x"], "'costs' should hold numbers"),
    ("key", 7, "'key' should be str"),
    ("time", None, "'time' should be int or float"),
    ("v", 0, "'v' should be a version number from 1"),
    ("workload", [1], "'workload' should be dict or null"),
])
def test_a_field_of_the_wrong_type_is_named(make_record, field, value, expected):
    data = make_record().to_json()
    data[field] = value
    with pytest.raises(RecordFormatError, match=expected):
        TuningRecord.from_json(data)


def test_a_newer_version_is_refused_with_the_fix(make_record):
    data = make_record().to_json()
    data["v"] = RECORD_VERSION + 1
    data["new_field"] = {"something": "unknown"}
    with pytest.raises(RecordVersionError, match=rf"version {RECORD_VERSION + 1} is newer.*upgrade tilecraft"):
        TuningRecord.from_json_line(json.dumps(data) + "\n")
    del data["trace"]  # whatever else changed, the version is what is reported
    with pytest.raises(RecordVersionError, match="upgrade tilecraft"):
        TuningRecord.from_json(data)


class _ErrorKind(str, Enum):
    NONE = "none"
    COMPILE = "compile"


class _Task:
    workload_key = '["dag", "k1"]'
    workload = {"func": "matmul", "args": [16, 16, 16]}
    target = tc.Target("llvm -isa=avx2 -num-cores=4")

    def __init__(self, dag):
        self.compute_dag = dag


class _Input:
    def __init__(self, trace):
        self.trace = trace


class _Result:
    def __init__(self, costs, kind, msg=""):
        self.costs, self.error_kind, self.error_msg, self.all_cost, self.timestamp = costs, kind, msg, 0.2, 5.0


def test_record_from_a_measurement_takes_the_kind_name_and_canonical_target(matmul_dag, matmul_trace):
    task = _Task(matmul_dag())
    record = TuningRecord.from_measurement(task, _Input(matmul_trace(8)), _Result((1e-3,), _ErrorKind.COMPILE, "boom"),
                                           sketch="multi_level_tiling")
    assert record.error_kind == "compile" and record.error_msg == "boom" and not record.is_valid
    assert record.target == str(task.target) and record.flop == matmul_dag().flop_count()
    assert record.trace_json == trace_key(matmul_trace(8)) == trace_key(matmul_trace(8).to_json())
    assert record.sketch == "multi_level_tiling" and record.workload == task.workload


def test_a_record_made_with_an_indented_trace_is_still_written_on_one_line(make_record):
    record = make_record()
    indented = TuningRecord(**{**{f: getattr(record, f) for f in record.__dataclass_fields__},
                               "trace_json": json.dumps(record.trace, indent=2)})
    line = indented.to_json_line()
    assert "\n" not in line and TuningRecord.from_json_line(line + "\n").trace_json == record.trace_json
