"""The re-measurement that ends a tuning: interleaved rounds in a fresh worker, one final record per
finalist with every repeat, and the summary, the log and the task scheduler reporting its median."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.measure import BuildResult, MeasureErrorKind, MeasureResult
from tilecraft.tune.remeasure import remeasure


class FakeBuilder:
    def build(self, inputs):
        return [BuildResult(f"lib{n}.so", "", "f", (), (), MeasureErrorKind.NONE, "", 0.1) for n in range(len(inputs))]


class FakeRunner:
    """Costs by the trace's first decision; a trace named in ``crash_in_round`` crashes in that round."""

    def __init__(self, crash_in_round=None):
        self.calls, self.fresh_runners, self.crash_in_round, self.closed = [], [], crash_in_round, False
        self.round = 0

    def on_one_device(self, **changes):
        runner = FakeRunner(self.crash_in_round)
        runner.changes = changes
        self.fresh_runners.append(runner)
        return runner

    def run(self, inputs, builds, on_result=None):
        self.calls.append([i.trace.dumps() for i in inputs])
        self.round += 1
        results = []
        for measure_input in inputs:
            key = measure_input.trace.dumps()
            if self.crash_in_round == (key, self.round):
                results.append(MeasureResult((), MeasureErrorKind.WORKER_CRASH, "signal 11", 0.2, 0.0, device="fake"))
            else:
                results.append(MeasureResult((1e-3 * len(key) / 1000 + 1e-6 * self.round,), MeasureErrorKind.NONE, "",
                                             0.2, 0.0, device="fake"))
        return results

    def close(self):
        self.closed = True


def finalists(count):
    dag = tc.SearchTask(func="matmul", args=(16, 16, 16, "float32")).compute_dag
    traces = []
    for inner in (1, 2, 4, 8, 16)[:count]:
        sch = tc.Schedule(dag)
        i, j, k = sch.get_loops(sch.get_block("matmul"))
        sch.split(j, [None, inner])
        traces.append((sch.trace, f"sketch{inner}"))
    return traces


def test_finalists_are_measured_in_interleaved_rotated_rounds_in_a_fresh_runner_and_recorded_once_each():
    """On one device (``on_one_device``): two of a kind may differ by more than two finalists do."""
    task = tc.SearchTask(func="matmul", args=(16, 16, 16, "float32"))
    runner, heard = FakeRunner(), []
    results = remeasure(task, finalists(3), FakeBuilder(), runner, repeats=4,
                        callbacks=[lambda task, inputs, results, sketches: heard.append((results, sketches))])
    (fresh,) = runner.fresh_runners
    assert runner.calls == [] and fresh.closed  # a runner of its own, closed at the end
    assert fresh.changes == {"repeat": 1, "stop_slow_candidates": False}  # one call a round, each in full
    keys = [trace.dumps() for trace, _ in finalists(3)]
    assert fresh.calls == [keys, keys[1:] + keys[:1], keys[2:] + keys[:2], keys]  # every round, each once, rotated
    assert all(r.phase == "final" and r.device == "fake" and len(r.costs) == 4 for r in results)
    assert results[0].all_cost == pytest.approx(0.1 + 4 * 0.2)
    assert heard == [(results, ["sketch1", "sketch2", "sketch4"])]


def test_a_finalist_that_fails_in_a_round_is_an_error_and_is_not_measured_again():
    task = tc.SearchTask(func="matmul", args=(16, 16, 16, "float32"))
    crashing = finalists(2)[1][0].dumps()
    runner = FakeRunner(crash_in_round=(crashing, 2))
    good, crashed = remeasure(task, finalists(2), FakeBuilder(), runner, repeats=3)
    assert good.is_valid and len(good.costs) == 3
    assert crashed.error_kind is MeasureErrorKind.WORKER_CRASH and crashed.phase == "final" and not crashed.costs
    assert [len(call) for call in runner.fresh_runners[0].calls] == [2, 2, 1]


@pytest.fixture(scope="module")
def runner():
    with tc.LocalRunner(number=2, repeat=1, min_repeat_ms=0) as r:
        yield r


@pytest.mark.slow
def test_a_tuning_ends_by_re_measuring_its_finalists_and_reports_their_median(tmp_path, runner):
    log = tmp_path / "matmul.json"
    task = tc.SearchTask(func="matmul", args=(32, 24, 40, "float32"), target=tc.Target.host())
    policy = tc.SketchPolicy(task)
    summary = task.tune(tc.TuningOptions(num_measure_trials=8, num_measures_per_round=8, runner=runner, verbose=0,
                                         measure_callbacks=[tc.RecordToFile(log)], num_remeasured=2,
                                         remeasure_repeats=3), search_policy=policy)
    records = load_records(log)
    finals = [r for r in records if r.phase == "final"]
    searched = sorted((r for r in records if r.phase == "search" and r.is_valid), key=lambda r: r.mean_cost)
    expected = {r.trace_json for r in searched[:2]} | {min((r for r in searched if r.sketch == s.name),
                                                          key=lambda r: r.mean_cost).trace_json
                                                      for s in policy.sketches
                                                      if any(r.sketch == s.name for r in searched)}
    assert summary.trials == 8 and {r.trace_json for r in finals} == expected
    assert all(len(r.costs) == 3 and r.device == runner.device for r in finals)
    best = min(finals, key=lambda r: statistics.median(r.costs))
    assert summary.final_costs == best.costs and summary.final_cost == statistics.median(best.costs)
    assert tc.load_best_record(log, task.workload_key) == best
    inputs = task.compute_dag.random_inputs()
    np.testing.assert_allclose(tc.build(task.apply_best(log))(*inputs), inputs[0] @ inputs[1], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_task_scheduler_re_measures_every_task_and_its_objective_is_their_medians(tmp_path, runner):
    tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16), target=tc.Target.host()),
             tc.SearchTask(func="matmul", args=(32, 8, 24), target=tc.Target.host())]
    log = tmp_path / "model.json"
    scheduler = tc.TaskScheduler(tasks, [1, 3])
    objective = scheduler.tune(tc.TuningOptions(num_measure_trials=8, num_measures_per_round=4, runner=runner,
                                                verbose=0, measure_callbacks=[tc.RecordToFile(log)],
                                                num_remeasured=1, remeasure_repeats=2))
    medians = []
    for task in tasks:
        best = tc.load_best_record(log, task.workload_key, task.target)
        assert best.phase == "final" and len(best.costs) == 2
        medians.append(statistics.median(best.costs))
    assert objective == pytest.approx(1 * medians[0] + 3 * medians[1])


def test_options_refuse_a_negative_number_of_finalists_or_no_repeats():
    with pytest.raises(ValueError, match="num_remeasured=-1 must be >= 0"):
        tc.TuningOptions(num_remeasured=-1)
    with pytest.raises(ValueError, match="remeasure_repeats=0 >= 1"):
        tc.TuningOptions(remeasure_repeats=0)
