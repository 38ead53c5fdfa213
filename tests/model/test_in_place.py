"""Choosing each task's schedule by its time inside the compiled model (``tc.choose_in_place``):
every candidate timed in place is recorded, the one kept (the schedule in use unless another
wins a paired test) is what the log then compiles, a candidate that fails is recorded as
failed, and the model stays right."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database import TuningRecord, load_records, trace_key
from tilecraft.graph import run_reference
from tilecraft.model.in_place import _candidates, choose_in_place, paired_choice
from tilecraft.search.policy import Candidate, SketchPolicy

onnx = pytest.importorskip("onnx")
from onnx_models import tiny_cnn  # noqa: E402

TARGET = tc.Target.host()


def _log_of_candidates(path, model, per_task: int = 3) -> dict[str, list[TuningRecord]]:
    """A log with up to ``per_task`` distinct sampled schedules of each task that has a sketch,
    the first recorded fastest; the task of most FLOPs gets one more, recorded slowest, whose
    trace names a block the task does not have (it replays on no DAG)."""
    tasks, _ = tc.extract_tasks(model, TARGET)
    written: dict[str, list[TuningRecord]] = {}
    for n, task in enumerate(tasks):
        policy = SketchPolicy(task)
        if not policy.sketches:
            continue
        rows = policy.sketches[0].sample_uniform(np.random.default_rng(n), per_task)
        traces = dict.fromkeys(trace_key(policy.trace_of(Candidate(0, tuple(int(v) for v in row)))) for row in rows)
        written[task.workload_key] = [
            TuningRecord(task.workload_key, task.workload, str(task.target), trace, (1e-3 * (1 + k),), "none", "",
                         0.1, 1000.0 + k, task.compute_dag.flop_count(), policy.sketches[0].name)
            for k, trace in enumerate(traces)]
    largest = max(written, key=lambda key: next(t for t in tasks if t.workload_key == key).compute_dag.flop_count())
    good = written[largest][0]
    broken = good.trace_json.replace(json.dumps(json.loads(good.trace_json)[0]["args"]["name"]), '"no_such_block"', 1)
    written[largest].append(dataclasses.replace(good, trace_json=broken, costs=(9e-3,)))
    with open(path, "w") as file:
        file.writelines(r.to_json_line() + "\n" for records in written.values() for r in records)
    return written


@pytest.mark.slow
def test_the_fastest_schedule_in_the_model_is_recorded_and_compiled_and_a_broken_one_is_put_out(tmp_path,
                                                                                             kernel_cache, capsys):
    model, log = tiny_cnn(), tmp_path / "cnn.json"
    written = _log_of_candidates(log, model)
    report = choose_in_place(model, log, TARGET, candidates=4, rounds=5, min_share=0.0, cache_dir=kernel_cache)
    assert "whole model, interleaved:" in capsys.readouterr().out
    assert {c.workload_key for c in report.choices} == {key for key, records in written.items() if len(records) > 1}
    assert report.before_seconds > 0 and report.after_seconds > 0

    timed = [r for r in load_records(log) if r.phase in ("model", "model_rival")]
    for choice in report.choices:
        records = [r for r in timed if r.workload_key == choice.workload_key]
        assert [r.phase == "model" for r in records] == [n == choice.chosen or s == float("inf")
                                                         for n, s in enumerate(choice.seconds)]
        assert [r.trace_json for r in records] == [r.trace_json for r in written[choice.workload_key]][:4]
        for record, seconds in zip(records, choice.seconds):
            if seconds == float("inf"):  # the broken trace: recorded as failed, with the reason
                assert record.error_kind == "compile" and "failed to replay" in record.error_msg
                assert "no_such_block" in record.trace_json and not record.costs
            else:
                assert record.is_valid and len(record.costs) == 5 and record.cost == pytest.approx(seconds)
    assert sum(r.error_kind == "compile" for r in timed) == 1

    compiled = tc.compile_model(model, TARGET, log=str(log), cache_dir=kernel_cache)
    for choice in report.choices:  # what the log now compiles: the schedule each choice kept
        chosen = written[choice.workload_key][choice.chosen]
        kernel = next(k for k in compiled.kernels if k.workload_key == choice.workload_key)
        assert json.loads(kernel.trace) == json.loads(chosen.trace_json)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    expected = run_reference(tc.frontend.from_onnx(model), {"input": x})["output"]
    np.testing.assert_allclose(compiled(input=x), expected, rtol=1e-4, atol=1e-5)

    # tuned further: a schedule found since is timed next time beside the one in use, however
    # fast the model records of the others
    key = report.choices[0].workload_key
    task = next(t for t in tc.extract_tasks(model, TARGET)[0] if t.workload_key == key)
    policy = SketchPolicy(task)
    found = next(trace for row in policy.sketches[0].sample_uniform(np.random.default_rng(99), 50)
                 if (trace := trace_key(policy.trace_of(Candidate(0, tuple(int(v) for v in row)))))
                 not in {r.trace_json for r in written[key]})
    newer = dataclasses.replace(written[key][0], trace_json=found, costs=(1e-5,), timestamp=3000.0)
    with open(log, "a") as file:
        file.write(newer.to_json_line() + "\n")
    before = len(load_records(log))
    again = choose_in_place(model, log, TARGET, candidates=2, rounds=5, min_share=0.0, cache_dir=kernel_cache)
    in_use = written[key][report.choices[0].chosen].trace_json
    timed = [r.trace_json for r in load_records(log)[before:] if r.workload_key == key]
    assert timed == [in_use, found] and key in {c.workload_key for c in again.choices}


@pytest.mark.parametrize("costs, kept", [
    ([[1.0] * 8, [0.9] * 8], 1),  # faster in every round
    ([[1.0] * 8, [0.9] * 7 + [1.1]], 1),  # in 7 of 8: chance makes as many in 3.5% of choices
    ([[1.0] * 8, [0.9] * 6 + [1.1] * 2], 0),  # in 6 of 8: 14%, as noise does; the one in use stays
    ([[1.0] * 8, [0.95] * 8, [0.9] * 5 + [1.2] * 3], 1),  # the fastest median wins 5 of 8: the steady one
    ([[1.0] * 8, [0.95] * 8, [0.9] * 8], 2),  # of two that win, the faster
    ([[1.0] * 4, [0.5] * 4], 0),  # four rounds cannot tell: 6%
    ([[1.0] * 5, [0.5] * 5], 1),
    ([[1.0] * 8, [], [0.9] * 8], 2),  # a failed candidate has no rounds
    ([[1.0] * 8, [1.0] * 8], 0),  # ties are no wins
])
def test_the_schedule_in_use_stays_unless_another_beats_it_in_a_paired_test(costs, kept):
    assert paired_choice(costs) == kept


def test_it_refuses_a_gpu_target_too_few_candidates_or_rounds_and_a_missing_log(tmp_path):
    with pytest.raises(ValueError, match="candidates=1 must be >= 2"):
        choose_in_place(tiny_cnn(), tmp_path / "log.json", TARGET, candidates=1)
    with pytest.raises(ValueError, match="rounds=4 >= 5: another schedule replaces the one in use when"):
        choose_in_place(tiny_cnn(), tmp_path / "log.json", TARGET, rounds=4)
    with pytest.raises(ValueError, match="on this machine's CPU, not on cuda"):
        choose_in_place(tiny_cnn(), tmp_path / "log.json", "cuda -arch=sm_90")
    with pytest.raises(FileNotFoundError, match="log.json does not exist; tune the model's tasks into it first"):
        choose_in_place(tiny_cnn(), tmp_path / "log.json", TARGET)


def test_a_workload_whose_every_record_failed_has_no_candidates():
    """It keeps its default schedule (a bfloat16 BERT layer's tasks once had only wrong
    answers, and the choice stopped on them)."""
    def record(key, trace, costs, error="none"):
        return TuningRecord(key, {"func": "matmul", "args": [8, 8, 8]}, str(TARGET), trace, costs, error, "", 0.1,
                            1000.0, 1024.0, "tile")

    records = [record("ok", "[1]", (1e-3,)), record("ok", "[2]", (2e-3,)),
               record("failed", "[1]", (), "wrong_answer"), record("failed", "[2]", (), "wrong_answer")]
    assert {key: [r.trace_json for r in chosen] for key, chosen in _candidates(records, 4).items()} == \
        {"ok": ["[1]", "[2]"]}
