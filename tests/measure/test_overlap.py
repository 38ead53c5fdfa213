"""Building while measuring: ``LocalBuilder.start`` and ``build_and_run``. Built candidates
are measured in order while later ones still build, the results keep the input order, and a
runner that measures several at once is handed runs at least that long."""

import threading
import time
from concurrent.futures import Future

import pytest

import tilecraft as tc
from tilecraft.measure import LocalBuilder, MeasureErrorKind, MeasureInput
from tilecraft.measure import builder as builder_module
from tilecraft.measure.overlap import build_and_run
from tilecraft.measure.result import BuildResult, MeasureResult
from tilecraft.tune import task as task_module

from test_builder import _add_dag, _unknown_block, _vectorized_add


def test_start_returns_at_once_and_its_futures_give_what_build_gives(kernel_cache, monkeypatch):
    dag = _add_dag()
    inputs = [_vectorized_add(dag), _unknown_block(dag), _vectorized_add(dag)]
    expected = LocalBuilder(n_parallel=2, cache_dir=kernel_cache).build(inputs)
    generate, released = builder_module._generate, threading.Event()

    def held_generate(candidate):  # the sources wait until the test has seen start return
        released.wait(10)
        return generate(candidate)

    monkeypatch.setattr(builder_module, "_generate", held_generate)
    futures = LocalBuilder(n_parallel=2, cache_dir=kernel_cache).start(inputs)
    assert len(futures) == 3 and not any(f.done() for f in futures)
    released.set()
    results = [f.result(timeout=60) for f in futures]
    assert [r.error_kind for r in results] == [r.error_kind for r in expected]
    assert results[0].lib_path == expected[0].lib_path and results[1].error_msg == expected[1].error_msg


def test_a_failure_of_the_builder_itself_reaches_every_waiting_future(kernel_cache, monkeypatch):
    def broken(candidate):
        raise RuntimeError("a bug in the builder")

    monkeypatch.setattr(builder_module, "_generate", broken)
    futures = LocalBuilder(cache_dir=kernel_cache).start([_vectorized_add(_add_dag())] * 2)
    for future in futures:
        with pytest.raises(RuntimeError, match="a bug in the builder"):
            future.result(timeout=10)


def _built(index: int) -> BuildResult:
    return BuildResult(f"lib{index}.so", "", "f", (), (), MeasureErrorKind.NONE, "", 0.01)


class ReleasedBuilder:
    """Builds whose futures the test completes one by one; ``build`` is what a builder
    without ``start`` offers."""

    def __init__(self, count: int):
        self.futures = [Future() for _ in range(count)]

    def start(self, inputs):
        return self.futures

    def build(self, inputs):
        return [_built(n) for n in range(len(inputs))]

    def release(self, index: int) -> None:
        self.futures[index].set_result(_built(index))


class RecordingRunner:
    """Costs from the library's number; remembers each run's libraries, and which builds were
    done while each run began."""

    def __init__(self, builder=None, measures_at_once=None):
        self.runs, self.builder = [], builder
        self.pending_at_start: list[int] = []
        if measures_at_once is not None:
            self.measures_at_once = measures_at_once

    def run(self, inputs, builds, on_result=None):
        self.runs.append([b.lib_path for b in builds])
        if self.builder is not None:
            self.pending_at_start.append(sum(not f.done() for f in self.builder.futures))
        results = []
        for index, build in enumerate(builds):
            result = MeasureResult((int(build.lib_path[3:-3]) + 1.0,), MeasureErrorKind.NONE, "", 0.0, time.time())
            results.append(result)
            if on_result is not None:
                on_result(index, result)
        return results


def _inputs(count: int) -> list[MeasureInput]:
    return [_vectorized_add(_add_dag())] * count


def test_the_first_built_candidates_are_measured_while_the_rest_still_build():
    builder = ReleasedBuilder(4)
    runner = RecordingRunner(builder)
    builder.release(0)

    def build_the_rest():  # each later build ends only once the run before it has started
        for index in range(1, 4):
            while len(runner.runs) < index:
                time.sleep(0.001)
            builder.release(index)

    feeder = threading.Thread(target=build_the_rest)
    feeder.start()
    heard = []
    results, build_secs, run_secs = build_and_run(_inputs(4), builder, runner, lambda n, r: heard.append((n, r.costs)),
                                                  overlap=True)
    feeder.join()
    assert runner.pending_at_start[0] == 3  # measuring began with three builds still running
    assert [r.costs for r in results] == [(1.0,), (2.0,), (3.0,), (4.0,)]
    assert heard == [(0, (1.0,)), (1, (2.0,)), (2, (3.0,)), (3, (4.0,))]  # indices of the whole round
    assert build_secs >= 0 and run_secs >= 0


def test_builds_already_done_go_to_the_runner_together():
    builder = ReleasedBuilder(5)
    for index in range(5):
        builder.release(index)
    runner = RecordingRunner()
    results, _, _ = build_and_run(_inputs(5), builder, runner, overlap=True)
    assert runner.runs == [[f"lib{n}.so" for n in range(5)]] and len(results) == 5


def test_a_runner_measuring_several_at_once_is_handed_that_many_at_least():
    builder = ReleasedBuilder(5)
    runner = RecordingRunner(measures_at_once=2)
    waited = []

    def release_in_pairs():  # one of a pair, a pause in which nothing may be measured, the other
        for first in (0, 2):
            builder.release(first)
            time.sleep(0.05)
            waited.append(len(runner.runs) == first // 2)
            builder.release(first + 1)
            while len(runner.runs) < first // 2 + 1:
                time.sleep(0.001)
        builder.release(4)

    feeder = threading.Thread(target=release_in_pairs)
    feeder.start()
    results, _, _ = build_and_run(_inputs(5), builder, runner, overlap=True)
    feeder.join()
    assert waited == [True, True]
    assert runner.runs == [["lib0.so", "lib1.so"], ["lib2.so", "lib3.so"], ["lib4.so"]]
    assert [r.costs[0] for r in results] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_without_overlap_the_round_is_built_whole_then_measured():
    builder = ReleasedBuilder(3)  # its futures never complete: start must not be used
    runner = RecordingRunner()
    results, _, _ = build_and_run(_inputs(3), builder, runner, overlap=False)
    assert runner.runs == [["lib0.so", "lib1.so", "lib2.so"]] and len(results) == 3


@pytest.mark.parametrize("target, overlaps", [("llvm", False), ("cuda -arch=sm_90", True)])
@pytest.mark.slow
def test_tuning_overlaps_only_where_kernels_are_timed_on_a_gpu(target, overlaps, monkeypatch):
    seen = []

    def spy(inputs, builder, runner, on_result=None, overlap=False):
        seen.append(overlap)
        results = [MeasureResult((1e-3,), MeasureErrorKind.NONE, "", 0.0, time.time()) for _ in inputs]
        for index, result in enumerate(results):
            on_result(index, result)
        return results, 0.0, 0.0

    monkeypatch.setattr(task_module, "build_and_run", spy)
    task = tc.SearchTask(func="matmul", args=(64, 64, 64, "float32"), target=tc.Target(target))
    task.tune(tc.TuningOptions(num_measure_trials=4, num_measures_per_round=4, runner=RecordingRunner(),
                               num_remeasured=0, verbose=0))
    assert seen == [overlaps]
