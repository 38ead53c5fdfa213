"""Database: a work dir's records, read at open by the one reader of logs, queried by workload and target."""

import json
import warnings

import pytest

import tilecraft as tc
from tilecraft.database import (Database, MalformedRecordWarning, NoValidRecordError, RecordVersionError,
                                load_best_record, load_records)
from tilecraft.database.database import RECORDS_FILE

KEY = '["dag", "k0"]'
OTHER = '["dag", "k1"]'


def test_query_best_and_records_agree_with_the_log_readers(tmp_path, make_record, write_log, target, other_target):
    records = [make_record(3e-3, inner=1), make_record(None, error="compile", msg="boom", inner=2),
               make_record(1e-3, inner=4), make_record(5e-4, key=OTHER), make_record(2e-4, target=other_target),
               make_record(2e-3, inner=8)]
    write_log(tmp_path / RECORDS_FILE, records)
    db = Database(tmp_path)
    log = tmp_path / RECORDS_FILE
    assert len(db) == 6
    assert db.records(KEY, target) == load_records(log, KEY, target)
    assert db.query_best(KEY, target) == load_best_record(log, KEY, target) == records[2]
    assert db.query_best(KEY) == records[4]  # any target
    assert db.query_best(OTHER, target).mean_cost == 5e-4
    assert len(db.records(KEY)) == 5


def test_lines_out_of_the_usual_layout_are_read_and_bad_ones_skipped_with_a_warning(tmp_path, make_record,
                                                                                    write_log, target):
    spaced = json.dumps(make_record(1e-4, inner=16).to_json())  # a hand-edited line: other spacing, key order
    write_log(tmp_path / RECORDS_FILE, [make_record(1e-3)],
              extra=f"# a comment\n\n{spaced}\nnot json\n" + make_record(2e-3).to_json_line()[:50])
    with pytest.warns(MalformedRecordWarning) as caught:
        db = Database(tmp_path)
    assert len(caught) == 2 and "line 5" in str(caught[0].message) and "incomplete" in str(caught[1].message)
    assert len(db) == 2 and db.query_best(KEY, target).mean_cost == pytest.approx(1e-4)


def test_a_record_of_a_newer_version_stops_the_open(tmp_path, make_record, write_log):
    newer = make_record().to_json_line().replace('{"v":4,', '{"v":99,', 1)
    write_log(tmp_path / RECORDS_FILE, [make_record()], extra=newer + "\n")
    with pytest.raises(RecordVersionError, match="line 2.*upgrade tilecraft"):
        Database(tmp_path)


def test_a_best_whose_line_is_broken_gives_way_to_the_next(tmp_path, make_record, write_log, target):
    broken = make_record(1e-5).to_json_line().replace('"flop":', '"flop":"x",', 1)  # looks right, does not decode
    write_log(tmp_path / RECORDS_FILE, [make_record(1e-3)], extra=broken + "\n")
    with pytest.warns(MalformedRecordWarning, match="line 2"):  # read at open, as load_records reads it
        db = Database(tmp_path)
    assert db.query_best(KEY, target).mean_cost == pytest.approx(1e-3)


def test_query_errors_say_why_and_what_to_do(tmp_path, make_record, write_log, target, other_target, matmul_dag):
    with pytest.raises(NoValidRecordError, match="holds no tuning records.*tune_tir"):
        Database(tmp_path / "empty").query_best(KEY)
    write_log(tmp_path / RECORDS_FILE, [make_record(None, error="run_timeout", msg="too slow")])
    db = Database(tmp_path)
    with pytest.raises(NoValidRecordError, match="are errors.*too slow"):
        db.query_best(KEY, target)
    with pytest.raises(NoValidRecordError, match=f"none on target '{other_target}'"):
        db.query_best(KEY, other_target)
    with pytest.raises(NoValidRecordError, match="has no records of workload"):
        db.query_schedule(matmul_dag(), target)
    with pytest.raises(TypeError, match="pass a tc.ComputeDAG"):
        db.query_schedule(KEY, target)


def test_a_workload_is_named_by_its_dag_its_tensors_or_its_task(tmp_path, make_record, write_log, target,
                                                                 matmul_dag):
    dag = matmul_dag()
    write_log(tmp_path / RECORDS_FILE, [make_record(1e-3, key=dag.workload_key)])
    db = Database(tmp_path)
    task = tc.SearchTask(compute_dag=dag, target=target)
    assert db.query_best(dag, target) == db.query_best(list(dag.tensors), target) == db.query_best(task, target)
    sch = db.query_schedule(dag, target)
    assert "decision" not in str(sch.trace) and "vectorize" in str(sch.trace)


def test_open_sees_the_file_as_it_was(tmp_path, make_record, write_log):
    write_log(tmp_path / RECORDS_FILE, [make_record()])
    db = Database(tmp_path)
    with open(tmp_path / RECORDS_FILE, "a") as file:
        file.write(make_record(1e-6).to_json_line() + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(db) == 1 and len(Database(tmp_path)) == 2
