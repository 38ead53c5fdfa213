"""Tuning end to end: the Ansor-style API, the log, apply_best, resuming, a killed tuner."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database import NoValidRecordError, load_records, trace_key
from tilecraft.tune import task as task_module


def quick_options(log, trials, **kw):
    """A short tuning; without the re-measurement at the end unless asked (its tests are in test_remeasure.py)."""
    return tc.TuningOptions(num_measure_trials=trials, num_measures_per_round=kw.pop("per_round", 6),
                            runner=kw.pop("runner"), measure_callbacks=[tc.RecordToFile(log)], verbose=0,
                            num_remeasured=kw.pop("num_remeasured", 0), **kw)


@pytest.fixture(scope="module")
def runner():
    with tc.LocalRunner(number=2, repeat=1, min_repeat_ms=0) as r:
        yield r


def matmul_task():
    return tc.SearchTask(func="matmul", args=(32, 24, 40, "float32"), target=tc.Target.host())


@pytest.mark.slow
def test_tune_log_apply_best_and_print_best(tmp_path, runner):
    log = tmp_path / "matmul.json"
    task = matmul_task()
    summary = task.tune(quick_options(log, 12, runner=runner))
    records = load_records(log)
    assert summary.trials == len(records) == 12 and summary.valid >= 10
    assert all(r.workload_key == task.workload_key and r.target == str(task.target) for r in records)
    assert len({trace_key(r.trace) for r in records}) == 12  # never the same candidate twice
    best = min(r.mean_cost for r in records)
    assert summary.best_cost == pytest.approx(best)

    sch = task.apply_best(log)
    inputs = task.compute_dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, task.target)(*inputs), inputs[0] @ inputs[1], rtol=1e-4, atol=1e-5)
    namespace = {}
    exec(task.print_best(log), namespace)  # the best schedule as runnable Python
    again = tc.Schedule(task.compute_dag)
    namespace["apply_trace"](again)
    assert str(tc.lower(again)) == str(tc.lower(sch))


@pytest.mark.slow
def test_resume_never_measures_what_the_log_holds(tmp_path, runner):
    log = tmp_path / "matmul.json"
    task = matmul_task()
    task.tune(quick_options(log, 6, runner=runner))
    first = {trace_key(r.trace) for r in load_records(log)}
    task.tune(quick_options(log, 6, runner=runner), resume_from=str(log))
    records = load_records(log)
    assert len(records) == 12 and len({trace_key(r.trace) for r in records}) == 12
    assert first < {trace_key(r.trace) for r in records}


@pytest.mark.slow
def test_ansor_spelling_of_resume(tmp_path, runner):
    log = tmp_path / "matmul.json"
    task = matmul_task()
    task.tune(quick_options(log, 6, runner=runner))
    policy = tc.SketchPolicy(task, tc.XGBModel(), init_search_callbacks=[tc.PreloadMeasuredStates(str(log))])
    assert len(policy.measured) == 6 and policy.model.num_samples == 6
    batch = policy.next_batch(8)
    assert not {c.key for c in batch} & policy.measured
    model = tc.XGBModel()
    model.update_from_file(str(log))  # trains the model only, as in Ansor
    policy = tc.SketchPolicy(task, model)
    assert model.num_samples == 6 and not policy.measured


@pytest.mark.slow
def test_apply_best_says_why_nothing_matches(tmp_path, runner):
    log = tmp_path / "matmul.json"
    matmul_task().tune(quick_options(log, 2, runner=runner, per_round=2))
    other = tc.SearchTask(func="matmul", args=(16, 16, 16, "float32"))
    with pytest.raises(NoValidRecordError, match="has no records of workload"):
        other.apply_best(log)


def test_search_task_needs_a_workload():
    with pytest.raises(tc.TilecraftError, match="func="):
        tc.SearchTask()
    with pytest.raises(tc.TilecraftError, match="no workload named 'nope'"):
        tc.SearchTask(func="nope", args=())


@pytest.mark.slow
def test_early_stopping_stops(tmp_path, runner):
    summary = matmul_task().tune(quick_options(tmp_path / "log.json", 60, runner=runner, early_stopping=1,
                                               per_round=3))
    assert summary.trials < 60


TUNER = textwrap.dedent("""
    import sys
    import tilecraft as tc
    task = tc.SearchTask(func="matmul", args=(32, 24, 40, "float32"), target=tc.Target.host())
    runner = tc.LocalRunner(number=2, min_repeat_ms=0)
    task.tune(tc.TuningOptions(num_measure_trials=200, num_measures_per_round=4, runner=runner,
                               measure_callbacks=[tc.RecordToFile(sys.argv[1])], verbose=0))
""")


@pytest.mark.slow
def test_sigkill_loses_at_most_the_candidate_in_flight(tmp_path, runner):
    log = tmp_path / "killed.json"
    child = subprocess.Popen([sys.executable, "-c", TUNER, str(log)])
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 6):
            time.sleep(0.05)
        assert log.exists(), "the tuner wrote nothing in two minutes"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line, if any, is skipped with a warning
        before = load_records(log)
    assert len(before) >= 6
    for line in log.read_text().splitlines()[:-1]:
        json.loads(line)  # every complete line is a whole record
    task = matmul_task()
    task.tune(quick_options(log, 6, runner=runner), resume_from=str(log))
    after = load_records(log)
    assert len(after) == len(before) + 6
    assert len({trace_key(r.trace) for r in after}) == len(after)


@pytest.mark.slow
def test_a_users_schedule_function_is_searched(tmp_path, runner):
    def tiled(sch):  # MetaSchedule style: primitives with sampled decisions
        block = sch.get_block("matmul")
        i, j, k = sch.get_loops(block)
        i0, i1 = sch.split(i, sch.sample_perfect_tile(i, n=2, max_innermost_factor=8))
        j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
        sch.reorder(i0, j0, k, i1, j1)
        sch.parallel(i0)
        sch.vectorize(j1)
        sch.annotate(i0, "pragma_auto_unroll_max_step", sch.sample_categorical([0, 64], [0.5, 0.5]))

    task = matmul_task()
    log = tmp_path / "fn.json"
    policy = tc.SketchPolicy(task, space=tc.ScheduleFn(tiled))
    assert [s.role for s in policy.sketches[0].slots] == ["tile", "tile", "unroll"]
    task.tune(quick_options(log, 6, runner=runner), search_policy=policy)
    records = load_records(log)
    assert len(records) == 6 and {r.sketch for r in records} == {"tiled"} and all(r.is_valid for r in records)
    inputs = task.compute_dag.random_inputs()
    np.testing.assert_allclose(tc.build(task.apply_best(log))(*inputs), inputs[0] @ inputs[1], rtol=1e-4, atol=1e-5)


def test_a_round_is_cut_to_the_trials_and_the_time_left():
    options = tc.TuningOptions(num_measure_trials=100, time_budget_secs=10.0)
    assert options.round_size(64, 0, 0.0) == 64
    assert options.round_size(64, 80, 1.0) == 20  # 20 trials left
    assert options.round_size(64, 100, 1.0) == 0
    assert options.round_size(64, 40, 8.0) == 10  # 2 s left at 5 trials a second
    assert options.round_size(64, 40, 9.99) == 1  # never less than one while time is left
    assert options.round_size(64, 40, 10.0) == 0
    assert tc.TuningOptions(num_measure_trials=100).round_size(64, 40, 1e6) == 60  # no budget: trials alone
    with pytest.raises(ValueError, match="time_budget_secs=0 must be > 0 seconds, or None"):
        tc.TuningOptions(time_budget_secs=0)


@pytest.mark.slow
def test_a_time_budget_stops_the_search_and_the_finalists_are_still_re_measured(tmp_path, runner):
    log = tmp_path / "matmul.json"
    task = matmul_task()
    started = time.perf_counter()
    summary = task.tune(quick_options(log, 10_000, runner=runner, per_round=4, time_budget_secs=2.0,
                                      num_remeasured=1))
    elapsed = time.perf_counter() - started
    assert 0 < summary.trials < 10_000 and summary.final_costs
    assert elapsed < 2.0 + summary.remeasure_secs + 10.0  # one round past the budget at most, on a busy machine


def test_the_share_of_peak_of_a_bfloat16_product_counts_pairs_where_the_cpu_sums_them(monkeypatch):
    """AVX-512 BF16 sums two products a lane an instruction: its peak is twice float32's FMA
    rate, and a bfloat16 matmul is reported against that (143% of float32's peak read oddly)."""
    monkeypatch.setattr(task_module, "peak_gflops", lambda target: 100.0)
    with_pairs, without = tc.Target("llvm -mcpu=znver4"), tc.Target("llvm -mcpu=skylake-avx512")
    bfloat16 = dict(func="matmul", args=(64, 64, 64, "bfloat16"))
    assert task_module._peak_gflops(tc.SearchTask(**bfloat16, target=with_pairs)) == 200.0
    assert task_module._peak_gflops(tc.SearchTask(**bfloat16, target=without)) == 100.0
    assert task_module._peak_gflops(tc.SearchTask(func="matmul", args=(64, 64, 64), target=with_pairs)) == 100.0
