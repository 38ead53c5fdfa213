"""The task scheduler: warm-up, the gradient's choice, round-robin, one log, resuming."""

import dataclasses
import math

import pytest

import tilecraft as tc
from tilecraft.database import load_records, trace_key
from tilecraft.search.default import default_schedule
from tilecraft.tune.scheduler import TaskScheduler


@pytest.fixture(scope="module")
def runner():
    with tc.LocalRunner(number=2, repeat=1, min_repeat_ms=0) as r:
        yield r


def tasks():
    return [tc.SearchTask(func="matmul", args=(16, 16, 16), target=tc.Target.host()),
            tc.SearchTask(func="matmul", args=(32, 8, 24), target=tc.Target.host()),
            tc.SearchTask(func="softmax", args=(8, 24), target=tc.Target.host())]


def options(log, trials, runner, num_remeasured=0):
    """A short tuning; without the re-measurement at the end unless asked (its tests are in test_remeasure.py)."""
    return tc.TuningOptions(num_measure_trials=trials, num_measures_per_round=4, runner=runner,
                            measure_callbacks=[tc.RecordToFile(log)], verbose=0, num_remeasured=num_remeasured)


@pytest.mark.slow
def test_warm_up_covers_every_task_then_one_log_holds_all(tmp_path, runner):
    log = tmp_path / "model.json"
    scheduler = TaskScheduler(tasks(), [1, 2, 3])
    objective = scheduler.tune(options(log, 20, runner))
    records = load_records(log)
    assert len(records) == 20
    keys = {r.workload_key for r in records}
    assert keys == {s.task.workload_key for s in scheduler.states}
    assert objective == pytest.approx(sum(w * s.best for w, s in zip([1, 2, 3], scheduler.states)))
    assert all(math.isfinite(s.best) for s in scheduler.states)
    assert sum(s.summary.trials for s in scheduler.states) == 20


@pytest.mark.slow
def test_a_short_warm_up_gives_each_task_its_trials_then_whole_rounds(tmp_path, runner):
    log = tmp_path / "model.json"
    scheduler = TaskScheduler(tasks(), warm_up_trials=2)
    scheduler.tune(options(log, 14, runner))  # 3 x 2 warm-up trials, then rounds of (up to) 4
    keys = [r.workload_key for r in load_records(log)]
    most_work_first = sorted(scheduler.states, key=lambda s: -s.flop)  # the weights are equal
    assert keys[:6] == [s.task.workload_key for s in most_work_first for _ in range(2)]
    assert len(keys) == 14 and max(s.summary.trials for s in scheduler.states) > 2
    with pytest.raises(ValueError, match="warm_up_trials=0: give at least 1 trial per task"):
        TaskScheduler(tasks(), warm_up_trials=0)


@pytest.mark.slow
def test_a_budget_short_of_a_round_each_warms_every_task_with_a_share(tmp_path, runner):
    """30 trials for three tasks in rounds of 16 would leave the third none: each gets 10."""
    log = tmp_path / "model.json"
    scheduler = TaskScheduler(tasks())
    scheduler.tune(tc.TuningOptions(num_measure_trials=30, num_measures_per_round=16, runner=runner,
                                    measure_callbacks=[tc.RecordToFile(log)], verbose=0, num_remeasured=0))
    assert [s.summary.trials for s in scheduler.states] == [10, 10, 10]
    assert len(load_records(log)) == 30


@pytest.mark.slow
def test_resuming_skips_warm_up_and_never_remeasures(tmp_path, runner):
    log = tmp_path / "model.json"
    TaskScheduler(tasks()[:2]).tune(options(log, 8, runner))
    first = {trace_key(r.trace) for r in load_records(log)}
    resumed = TaskScheduler(tasks()[:2], load_log_file=str(log))
    assert all(len(s.best_after_round) == 1 for s in resumed.states)  # the log's best, no warm-up needed
    resumed.tune(options(log, 8, runner))
    keys = [trace_key(r.trace) for r in load_records(log)]
    assert len(keys) == 16 and len(set(keys)) == 16 and first < set(keys)


@pytest.mark.slow
def test_resuming_measures_each_tasks_logged_best_and_todays_default_again_before_the_rounds(tmp_path, runner):
    """A log recorded in a faster hour (here an impossible picosecond) would keep its tasks
    from rounds: a resumed tuning first measures each task's logged best again, as a final
    record, and today's default beside it (which a log kept from older code may not hold);
    the task starts from the faster of the two."""
    log, fast = tmp_path / "model.json", tmp_path / "fast.json"
    TaskScheduler(tasks()[:2]).tune(options(log, 8, runner))
    defaults = {trace_key(default_schedule(task.compute_dag, task.target).trace) for task in tasks()[:2]}
    fast.write_text("".join(dataclasses.replace(r, costs=(1e-12,)).to_json_line() + "\n" for r in load_records(log)
                            if trace_key(r.trace) not in defaults))  # a log of older code, without them
    resumed = TaskScheduler(tasks()[:2], load_log_file=str(fast))
    logged = {s.task.workload_key: (s.best, trace_key(s.loaded.trace),
                                    trace_key(default_schedule(s.task.compute_dag, s.task.target).trace))
              for s in resumed.states}
    resumed.tune(options(fast, 0, runner, num_remeasured=1))
    finals = [r for r in load_records(fast) if r.phase == "final"]
    assert sorted({r.workload_key for r in finals}) == sorted(logged)
    for key, (cost, trace, default) in logged.items():
        mine = [f for f in finals if f.workload_key == key]
        assert sorted(trace_key(f.trace) for f in mine) == sorted([trace, default])
        assert all(f.cost > 1000 * cost for f in mine)  # no kernel runs in a nanosecond
    assert [s.best for s in resumed.states] == pytest.approx([min(
        f.cost for f in finals if f.workload_key == s.task.workload_key) for s in resumed.states])


@pytest.mark.slow
def test_a_resumed_task_has_the_rounds_its_logged_trials_fill(tmp_path, runner):
    """The forecast divides by the rounds a task has had: those of earlier runs count."""
    log = tmp_path / "model.json"
    TaskScheduler(tasks()[:1]).tune(options(log, 12, runner))
    resumed = TaskScheduler(tasks()[:1], load_log_file=str(log))
    resumed.tune(options(log, 0, runner))
    assert resumed.states[0].best_after_round == [resumed.states[0].best] * 3  # 12 trials in rounds of 4


class NoPolicy:
    """Stands in for a search policy where only the choice of task is tested."""


def scheduler_with_history(histories, weights, **kw):
    scheduler = TaskScheduler(tasks()[:len(histories)], weights, policy_factory=lambda task, n: NoPolicy(), **kw)
    for state, history in zip(scheduler.states, histories):
        state.best_after_round = list(history)
    return scheduler


def test_gradient_prefers_the_task_that_still_improves_weighs_most_or_costs_most():
    stalled, still_improving = [4e-3, 4e-3, 4e-3, 4e-3], [8e-3, 6e-3, 5e-3, 4e-3]
    assert scheduler_with_history([stalled, still_improving], [1, 1])._pick() == 1  # backward term
    assert scheduler_with_history([still_improving, still_improving], [1, 5])._pick() == 1  # weight
    assert scheduler_with_history([[1e-3] * 4, [9e-3] * 4], [1, 1])._pick() == 1  # forward: the slow one


def test_round_robin_cycles_and_done_tasks_are_skipped():
    scheduler = scheduler_with_history([[1e-3], [1e-3], [1e-3]], [1, 1, 1], strategy="round-robin")
    scheduler.states[1].done = "space exhausted"
    assert [scheduler._pick() for _ in range(4)] == [0, 2, 0, 2]


def test_custom_objective_and_bad_arguments():
    scheduler = scheduler_with_history([[2e-3], [1e-3]], [1, 1], objective_func=max)
    assert scheduler.objective() == 2e-3
    assert scheduler._partial(0) == pytest.approx(1.0) and scheduler._partial(1) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="round-robin"):
        TaskScheduler(tasks(), strategy="greedy")
    with pytest.raises(ValueError, match="one per task"):
        TaskScheduler(tasks(), [1, 2])
