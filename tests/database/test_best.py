"""The one rule that ranks schedules: re-measured ones by their median, before the rest by their mean;
every reader of records follows it, and logs of record version 1 still read."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tilecraft.cli import main
from tilecraft.database import (Database, RecordFormatError, RecordStore, TuningRecord, best_records,
                                load_best_record, load_records)
from tilecraft.database.best import BestSoFar, for_learning, rank
from tilecraft.database.log import summarize


@pytest.fixture
def final(make_record):
    """``final(costs, inner=..., timestamp=...)``: a re-measurement record of the schedule ``inner``."""

    def make(costs, **kw):
        record = make_record(1.0, **kw)
        return dataclasses.replace(record, phase="final", costs=tuple(costs),
                                   error_kind="none" if costs else "worker_crash")

    return make


def test_a_final_records_cost_is_the_median_of_its_repeats(final, make_record):
    assert final([3e-3, 1e-3, 2e-3, 9e-3, 2.5e-3]).cost == 2.5e-3
    assert final([1e-3, 2e-3, 4e-3, 9e-3]).cost == 3e-3
    search = make_record(2e-3)
    assert search.cost == search.mean_cost == 2e-3


def test_a_lucky_search_measurement_cannot_beat_a_re_measured_schedule(final, make_record):
    lucky = make_record(0.5e-3, inner=8)  # measured once, while searching, on a good spell
    remeasured = [make_record(1e-3, inner=4), final([1.2e-3, 1.1e-3, 1.3e-3], inner=4),
                  make_record(1.1e-3, inner=2), final([1.0e-3, 1.05e-3, 0.95e-3], inner=2)]
    ranked = rank([lucky, *remeasured])
    assert [r.trace_json for r in ranked] == [remeasured[3].trace_json, remeasured[1].trace_json, lucky.trace_json]
    assert ranked[0].phase == ranked[1].phase == "final" and ranked[2] is lucky


def test_the_latest_re_measurement_of_a_schedule_counts_and_one_that_failed_puts_it_out(final, make_record):
    first, later = final([1e-3] * 3, inner=4, timestamp=10.0), final([3e-3] * 3, inner=4, timestamp=20.0)
    other = final([2e-3] * 3, inner=2, timestamp=15.0)
    assert [r.cost for r in rank([later, other, first])] == [2e-3, 3e-3]
    crashed = final([], inner=2, timestamp=30.0)
    assert [r.trace_json for r in rank([first, other, crashed])] == [first.trace_json]


def test_if_every_re_measured_schedule_failed_the_search_measurements_rank(final, make_record):
    records = [make_record(2e-3, inner=4), make_record(1e-3, inner=2), final([], inner=2)]
    assert [r.cost for r in rank(records)] == [1e-3, 2e-3]


def test_a_schedule_timed_in_a_model_ranks_first_by_that_time_and_a_failure_there_puts_it_out(final, make_record):
    warm_best = final([1e-3] * 3, inner=4)
    in_model = [dataclasses.replace(final([1.4e-3] * 3, inner=4), phase="model"),
                dataclasses.replace(final([1.3e-3, 1.2e-3, 1.25e-3], inner=2), phase="model")]
    records = [make_record(0.5e-3, inner=8), warm_best, final([1.1e-3] * 3, inner=2), *in_model,
               final([1.5e-3] * 3, inner=16)]
    ranked = rank(records)
    assert [(r.phase, r.cost) for r in ranked] == [("model", 1.25e-3), ("model", 1.4e-3), ("final", 1.5e-3),
                                                   ("search", 0.5e-3)]
    crashed = dataclasses.replace(final([], inner=2, timestamp=2000.0), phase="model")
    assert [r.trace_json for r in rank(records + [crashed])] == [in_model[0].trace_json, records[-1].trace_json,
                                                                 records[0].trace_json]


def test_the_latest_choice_in_place_decides_and_an_earlier_one_counts_as_never_made(final, make_record, tmp_path):
    """A schedule timed only by an earlier choice (beside other kernels, on another day) does
    not outrank the latest choice with its old time: the model compiled from the log is the
    one the latest choice made. An earlier failure in a model still puts a schedule out."""
    def in_model(cost, inner, at):
        return dataclasses.replace(final([cost] * 3, inner=inner, timestamp=at), phase="model")

    finals = [final([0.9e-3] * 3, inner=2), final([1.0e-3] * 3, inner=4), final([1.05e-3] * 3, inner=8)]
    earlier = [in_model(1.0e-3, 2, 100.0), in_model(1.2e-3, 4, 100.0)]
    latest = [in_model(1.1e-3, 4, 200.0), in_model(1.3e-3, 8, 200.0)]
    records = [*finals, *earlier, *latest]
    ranked = rank(records)
    assert [(r.phase, r.cost, r.trace_json) for r in ranked] == [
        ("model", 1.1e-3, finals[1].trace_json), ("model", 1.3e-3, finals[2].trace_json),
        ("final", 0.9e-3, finals[0].trace_json)]
    found = BestSoFar()
    for record in records:
        found.add(record)
    assert found.best is ranked[0]
    with RecordStore(tmp_path / "records.db") as store:
        store.add(records)
        assert store.best(finals[0].workload_key) == ranked[0]
    failed_between = dataclasses.replace(final([], inner=2, timestamp=150.0), phase="model")  # its latest
    assert finals[0].trace_json not in {r.trace_json for r in rank(records + [failed_between])}


@pytest.mark.slow
def test_one_pass_finds_the_best_that_ranking_all_records_finds(final, make_record):
    rng = np.random.default_rng(0)
    for _ in range(300):
        records = []
        for _ in range(int(rng.integers(1, 12))):
            inner = int(rng.choice([1, 2, 4, 8, 16]))
            if rng.random() < 0.4:
                costs = [] if rng.random() < 0.2 else list(rng.uniform(1e-3, 2e-3, size=3))
                phase = str(rng.choice(["model", "model_rival", "final"], p=[0.2, 0.1, 0.7]))
                records.append(dataclasses.replace(final(costs, inner=inner, timestamp=float(rng.integers(100))),
                                                   phase=phase))
            else:
                records.append(make_record(None if rng.random() < 0.1 else float(rng.uniform(1e-3, 2e-3)),
                                           inner=inner, timestamp=float(rng.integers(100))))
        found = BestSoFar()
        for record in records:
            found.add(record)
        ranked = rank(records)
        assert found.best is (ranked[0] if ranked else None)


def test_a_rival_that_the_latest_choice_did_not_keep_ranks_as_never_timed_in_a_model(final, make_record):
    """A choice keeps the schedule in use unless another wins a paired test, so the one it kept
    may have the slower median: its model record ranks first, the rival by its final record,
    and the rival's time in the model is neither a search measurement nor learned."""
    finals = [final([1.2e-3] * 3, inner=2), final([1.0e-3] * 3, inner=4)]
    kept = dataclasses.replace(final([1.31e-3, 1.30e-3, 1.29e-3], inner=2, timestamp=500.0), phase="model")
    rival = dataclasses.replace(final([1.30e-3, 1.28e-3, 1.32e-3], inner=4, timestamp=500.0), phase="model_rival")
    lucky = dataclasses.replace(final([0.1e-3], inner=8, timestamp=500.0), phase="model_rival")
    records = [*finals, kept, rival, lucky]
    assert [(r.phase, r.trace_json) for r in rank(records)] == [("model", kept.trace_json),
                                                                 ("final", finals[1].trace_json)]
    found = BestSoFar()
    for record in records:
        found.add(record)
    assert found.best is kept
    assert for_learning(records) == finals


def test_learning_counts_a_schedule_searched_and_re_measured_once_and_never_a_time_in_a_model(final, make_record):
    searched, remeasured, distilled = make_record(1e-3, inner=4), final([1e-3] * 3, inner=4), final([2e-3], inner=2)
    in_model = dataclasses.replace(final([3e-3] * 3, inner=8), phase="model")
    assert for_learning([searched, remeasured, distilled, in_model]) == [searched, distilled]


def test_every_reader_ranks_a_log_by_the_rule(tmp_path, final, make_record, write_log):
    """load_best_record, best_records, Database.query_best and tilecraft best, on a log that also holds
    lines of record version 1."""
    lucky = make_record(0.5e-3, inner=8)
    version_1 = json.loads(make_record(0.9e-3, inner=1).to_json_line())
    version_1 = {"v": 1, **{k: v for k, v in version_1.items() if k not in ("v", "phase", "device")}}
    records = [lucky, make_record(1e-3, inner=4), final([1.2e-3, 1.1e-3, 1.3e-3], inner=4),
               make_record(1.1e-3, inner=2), final([1.0e-3, 1.05e-3, 0.95e-3], inner=2)]
    log = tmp_path / "records.json"
    write_log(log, records, extra=json.dumps(version_1, separators=(",", ":")) + "\n")
    read = load_records(log)
    assert [r.phase for r in read] == ["search", "search", "final", "search", "final", "search"]
    assert read[-1].version == 1 and read[-1].device is None and read[-1].mean_cost == pytest.approx(0.9e-3)
    best = records[4]
    assert load_best_record(log, best.workload_key) == best
    assert Database(tmp_path).query_best(best.workload_key) == best
    assert best_records(log, top_k=3) == [best, records[2], lucky]
    assert summarize(log)[0].best == best
    assert main(["best", str(log)]) == 0


def test_without_re_measurement_the_readers_rank_by_mean_as_before(tmp_path, make_record, write_log):
    records = [make_record(2e-3, inner=4), make_record(1e-3, inner=2), make_record(None, inner=8)]
    write_log(tmp_path / "records.json", records)
    assert Database(tmp_path).query_best(records[0].workload_key) == records[1]
    assert load_best_record(tmp_path / "records.json", records[0].workload_key) == records[1]


def test_a_record_round_trips_its_phase_and_device_and_refuses_an_unknown_phase(make_record):
    record = dataclasses.replace(make_record(1e-3), phase="final", device="local@box")
    line = record.to_json_line()
    assert '"phase":"final","costs":[' in line and '"device":"local@box","trace":' in line
    assert TuningRecord.from_json_line(line + "\n") == record
    with pytest.raises(RecordFormatError,
                       match="'phase' should be one of search, final, model, model_rival, not \"best\""):
        TuningRecord.from_json_line(line.replace('"phase":"final"', '"phase":"best"') + "\n")


def test_a_log_of_final_records_alone_is_ranked_by_their_medians(tmp_path, final, write_log):
    records = [final([3e-3, 1e-3, 2e-3], inner=4), final([1.5e-3] * 3, inner=2), final([], inner=8)]
    write_log(tmp_path / "records.json", records)
    assert Database(tmp_path).query_best(records[0].workload_key) == records[1]
    assert load_best_record(tmp_path / "records.json", records[0].workload_key) == records[1]
