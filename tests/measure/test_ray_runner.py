"""RayRunner and RayBuilder on a local Ray cluster that the tests start, with token
authentication on: two measuring actors, one killed mid-run (its candidate an error
record, every other measured exactly once, a new actor in its place); an actor that does
not answer in time, replaced; and a small tuning of two tasks by the task scheduler
through them, whose records name the devices. Without Ray, tilecraft imports and a Ray
runner names the extra to install."""

import collections
import math
import secrets
import socket
import subprocess
import sys

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.database import load_records
from tilecraft.measure import BuildResult, MeasureErrorKind, MeasureInput, RayBuilder, RayRunner, ray_runner
from tilecraft.runtime import ArgSpec, compile_c

SLEEP_SECS = 0.03  # each call of a test kernel, so that a measurement is still running when the actor is killed
ARGS = (ArgSpec("A", (64,), "float32", False), ArgSpec("B", (64,), "float32", False),
        ArgSpec("C", (64,), "float32", True))


@pytest.fixture(scope="module")
def ray():
    """A local Ray cluster of 2 CPUs and 2 "device" resources, one per measuring actor,
    authenticated by a token of its own (given in the environment, so ~/.ray is untouched)."""
    ray = pytest.importorskip("ray")
    environment = pytest.MonkeyPatch()
    environment.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray.init(address="local", num_cpus=2, resources={"device": 2}, include_dashboard=False,
             object_store_memory=100 << 20, log_to_driver=False)
    yield ray
    ray.shutdown()
    environment.undo()


def device(slot: int) -> str:
    return f"cpu@{socket.gethostname()}/ray:{slot}"


def noting_kernels(count: int, notes) -> str:
    """C kernels ``add_<n>`` that add two 64-vectors, each call appending ``n`` to the file ``notes`` first."""
    kernels = [f'void add_{n}(const float* restrict a, const float* restrict b, float* restrict c) {{\n'
               f'  FILE* notes = fopen("{notes}", "a"); fprintf(notes, "{n}\\n"); fclose(notes);\n'
               f'  usleep({int(SLEEP_SECS * 1e6)}); for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i];\n}}'
               for n in range(count)]
    hang = "void hang(const float* restrict a, const float* restrict b, float* restrict c) { sleep(30); }"
    return "#include <stdio.h>\n#include <unistd.h>\n" + "\n".join(kernels) + "\n" + hang


@pytest.fixture
def candidates(tmp_path, kernel_cache):
    """``candidates(names)``: candidates calling those kernels of ``noting_kernels``, and the file of their calls."""
    A = te.placeholder((64,), name="A")
    B = te.placeholder((64,), name="B")
    dag = tc.ComputeDAG([A, B, te.compute((64,), lambda i: A[i] + B[i], name="C")])
    notes = tmp_path / "calls.txt"
    source = noting_kernels(18, notes)
    lib_path = str(compile_c(source, tc.Target.host(), kernel_cache))
    candidate = MeasureInput(dag, tc.Target.host(), tc.Schedule(dag).trace)

    def make(names):
        builds = [BuildResult(lib_path, source, name, ARGS, (), MeasureErrorKind.NONE, "", 0.0) for name in names]
        return [candidate] * len(names), builds

    return make, notes


def adds(first: int, count: int) -> list[str]:
    return [f"add_{n}" for n in range(first, first + count)]


def calls(notes) -> collections.Counter:
    return collections.Counter(int(line) for line in notes.read_text().split())


@pytest.mark.slow
def test_a_killed_actor_costs_one_error_record_and_nothing_is_lost_or_measured_twice(ray, candidates):
    make, notes = candidates
    inputs, builds = make(adds(0, 12))
    heard, killed = [], []

    def on_result(index, result):
        heard.append((index, result))
        if not killed:  # kill the other actor, busy with a candidate of its own
            killed.append(1 - int(result.device.rsplit(":", 1)[1]))
            ray.kill(runner._actors[killed[0]])

    with RayRunner(actor_resources={"device": 1}, timeout=10, number=1, repeat=1, min_repeat_ms=0,
                   stop_slow_candidates=False) as runner:
        started = runner.run(*make(adds(12, 2)))  # one candidate to each actor: both have started
        results = runner.run(inputs, builds, on_result)
        again = runner.run(*make(adds(14, 4)))  # every candidate goes to a free actor: the new one takes its share
    assert sorted(index for index, _ in heard) == list(range(12))  # each heard of once
    assert [result for _, result in sorted(heard, key=lambda pair: pair[0])] == results
    crashed = [n for n, r in enumerate(results) if not r.is_valid]
    assert len(crashed) == 1 and results[crashed[0]].error_kind is MeasureErrorKind.WORKER_CRASH
    message = results[crashed[0]].error_msg
    assert f"the measuring actor {device(killed[0])} died" in message and "a new actor takes its place" in message
    assert results[crashed[0]].device == device(killed[0])
    assert {r.device for r in started} == {device(0), device(1)}
    for result in started + results + again:
        if result is not results[crashed[0]]:
            assert result.is_valid and result.device in (device(0), device(1))
            assert len(result.costs) == 1 and SLEEP_SECS <= result.costs[0] < 1.0  # the call sleeps, then adds
    assert {r.device for r in again} == {device(0), device(1)}
    counted = calls(notes)  # a measurement calls its kernel twice: the check, then the one timed call
    assert {n: counted[n] for n in range(18) if n != crashed[0]} == {n: 2 for n in range(18) if n != crashed[0]}
    assert counted[crashed[0]] <= 2  # killed before, during or after its calls, never measured again


@pytest.mark.slow
def test_an_actor_that_gives_no_answer_in_time_is_replaced_and_its_candidate_a_run_timeout(ray, candidates,
                                                                                          monkeypatch):
    make, _ = candidates
    # The runner waits for an answer 12 s (not 36 s + 2 min), time enough for the new actor to start and measure
    # on a loaded 2-core machine (6 s once was not); the actor's worker would stop the kernel at 36 s.
    monkeypatch.setattr(ray_runner, "_REPLY_GRACE_SECS", -24.0)
    with RayRunner(actor_resources={"device": 1}, n_actors=1, timeout=36, number=1, min_repeat_ms=0) as runner:
        hung, good = runner.run(*make(["hang", "add_0"]))
    assert hung.error_kind is MeasureErrorKind.RUN_TIMEOUT and hung.device == device(0)
    assert hung.error_msg.startswith(f"the measuring actor {device(0)} gave no answer in 12 s; a new actor")
    assert good.is_valid and good.device == device(0) and SLEEP_SECS <= good.costs[0] < 1.0


@pytest.mark.slow
def test_the_task_scheduler_tunes_through_ray_and_records_name_the_devices(ray, tmp_path):
    log = tmp_path / "model.json"
    tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16), target=tc.Target.host()),
             tc.SearchTask(func="matmul", args=(32, 8, 24), target=tc.Target.host())]
    scheduler = tc.TaskScheduler(tasks, policy_factory=lambda task, n: tc.SketchPolicy(task, tc.RandomModel(), seed=n))
    with RayRunner(actor_resources={"device": 1}, number=1, min_repeat_ms=0) as runner:
        options = tc.TuningOptions(num_measure_trials=8, num_measures_per_round=4, builder=RayBuilder(),
                                   runner=runner, measure_callbacks=[tc.RecordToFile(log)], verbose=0,
                                   num_remeasured=1, remeasure_repeats=2)
        objective = scheduler.tune(options)
    records = load_records(log)
    search = [r for r in records if r.phase == "search"]
    assert len(search) == 8 and {r.workload_key for r in search} == {t.workload_key for t in tasks}
    assert {r.workload_key for r in records if r.phase == "final"} == {t.workload_key for t in tasks}
    for record in records:
        assert record.target == str(tc.Target.host())
        if record.error_kind == "none":
            assert record.device in (device(0), device(1)) and all(0 < c < 1.0 for c in record.costs)
            assert record.phase != "final" or record.device == device(0)  # finalists on one device
            assert len(record.costs) == (2 if record.phase == "final" else 1)  # 2 interleaved repeats at the end
    assert math.isfinite(objective)
    for task in tasks:  # the best of each, built here, computes what NumPy does
        a, b = task.compute_dag.random_inputs(np.random.default_rng(0))
        np.testing.assert_allclose(tc.build(task.apply_best(log), task.target)(a, b), a @ b, rtol=1e-4, atol=1e-5)


def test_tilecraft_imports_without_ray_and_a_ray_runner_names_the_extra(monkeypatch):
    code = "import sys, tilecraft as tc, tilecraft.measure; tc.RayRunner; assert 'ray' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: importing it raises ImportError
    for make in (RayRunner, RayBuilder):
        with pytest.raises(ImportError, match=r"needs Ray: pip install 'tilecraft\[ray\]'"):
            make()
