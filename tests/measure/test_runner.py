"""LocalRunner: every way a kernel can fail is recorded with its kind, and the next
candidate in the same run still measures (the worker is restarted when it dies)."""

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.measure import BuildResult, LocalBuilder, LocalRunner, MeasureErrorKind, MeasureInput, MeasureResult
from tilecraft.measure import runner as runner_module
from tilecraft.runtime import ArgSpec, compile_c

KERNELS = r"""
#include <stdlib.h>
#include <string.h>

#define KERNEL(name, body) \
  void name(const float* restrict a, const float* restrict b, float* restrict c) { body }

void* volatile hog_sink;  /* the allocation escapes, so gcc cannot elide it */

KERNEL(add, for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i];)
KERNEL(subtract, for (int i = 0; i < 64; ++i) c[i] = a[i] - b[i];)
KERNEL(add_first_half, for (int i = 0; i < 32; ++i) c[i] = a[i] + b[i];)
KERNEL(write_null, *(volatile float*)0 = a[0];)
KERNEL(call_abort, abort();)
KERNEL(spin, volatile int forever = 1; while (forever) {})
KERNEL(slow_add, for (volatile long n = 0; n < 1000000000; ++n) {} for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i];)
KERNEL(hog,
  size_t n = (size_t)1 << 30;
  char* p = malloc(n);
  hog_sink = p;
  memset(p, 1, n);
  for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i] + (float)(p[n - 1] - 1);)
"""
ARGS = (ArgSpec("A", (64,), "float32", False), ArgSpec("B", (64,), "float32", False),
        ArgSpec("C", (64,), "float32", True))


@pytest.fixture(scope="module")
def dag():
    A = te.placeholder((64,), name="A")
    B = te.placeholder((64,), name="B")
    C = te.compute((64,), lambda i: A[i] + B[i], name="C")
    return tc.ComputeDAG([A, B, C])


@pytest.fixture(scope="module")
def kernel(dag, kernel_cache):
    """``kernel(name)``: a candidate for ``dag`` whose library entry is the C function ``name``."""
    lib_path = str(compile_c(KERNELS, tc.Target.host(), kernel_cache))
    candidate = MeasureInput(dag, tc.Target.host(), tc.Schedule(dag).trace)
    return lambda name: (candidate, BuildResult(lib_path, KERNELS, name, ARGS, (), MeasureErrorKind.NONE, "", 0.0))


@pytest.fixture(scope="module")
def runner():
    """Every candidate timed in full and stopped only by the run timeout (these tests are of failures;
    test_a_candidate_far_slower_than_the_fastest_is_timed_once_and_stopped_early is of stopping early)."""
    with LocalRunner(timeout_secs=1.0, number=2, min_repeat_ms=0, stop_slow_candidates=False) as shared:
        yield shared


def _run(runner, *candidates, on_result=None):
    inputs, builds = zip(*candidates)
    return runner.run(inputs, builds, on_result)


def _kinds(results):
    return [r.error_kind for r in results]


def test_correct_kernel_is_timed(runner, kernel):
    (result,) = _run(runner, kernel("add"))
    assert result.is_valid and result.error_msg == ""
    assert len(result.costs) == 1 and 0 < result.mean_cost < 1e-3 and result.all_cost > 0


def _matmul_candidates(kernel_cache):
    """A 32x32 matmul built twice: plainly, and with B repacked by a pack function (bound once in the worker)."""
    N = 32
    A = te.placeholder((N, N), name="A")
    B = te.placeholder((N, N), name="B")
    k = te.reduce_axis((0, N), name="k")
    C = te.compute((N, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                   attrs={"layout_free_placeholders": [B]})
    dag = tc.ComputeDAG([A, B, C])
    plain = tc.Schedule(dag)
    packed = tc.Schedule(dag)
    block = packed.get_block("matmul")
    packed.transform_layout(block, ("read", 1), lambda k, j: (j // 16, k, j % 16))
    _, j, _ = packed.get_loops(block)
    packed.vectorize(packed.split(j, [None, 8])[1])
    inputs = [MeasureInput(dag, tc.Target.host(), sch.trace) for sch in (plain, packed)]
    builds = LocalBuilder(cache_dir=kernel_cache).build(inputs)
    assert len(builds[1].packs) == 1
    return inputs, builds


def test_scheduled_candidates_from_the_builder_are_checked_and_timed(runner, kernel_cache):
    inputs, builds = _matmul_candidates(kernel_cache)
    results = runner.run(inputs, builds)
    assert _kinds(results) == [MeasureErrorKind.NONE] * 2, [r.error_msg for r in results]
    assert all(r.all_cost > b.time_cost for r, b in zip(results, builds))


def test_wrong_values_are_a_wrong_answer_naming_output_error_and_index(runner, kernel):
    wrong, good = _run(runner, kernel("subtract"), kernel("add"))
    assert wrong.error_kind is MeasureErrorKind.WRONG_ANSWER and wrong.costs == ()
    assert wrong.error_msg.startswith("output 'C' differs from the NumPy reference: max abs error ")
    assert "at index (" in wrong.error_msg and "expected " in wrong.error_msg
    assert good.is_valid


@pytest.mark.slow
def test_a_gpu_kernel_that_fails_leaves_its_worker_to_a_fresh_one(runner, kernel):
    """An illegal address or a trap poisons the worker's CUDA context for every later launch:
    the candidate's failure is its own, and the next candidate meets a new worker."""
    candidate, build = kernel("add")
    gpu = BuildResult("/nonexistent/kernel.cubin", "", "add", ARGS, (), MeasureErrorKind.NONE, "", 0.0,
                      ((1, 1, 1), (64, 1, 1), 0))
    _run(runner, (candidate, build))
    first_worker = runner._workers[0]
    failed, good = _run(runner, (candidate, gpu), (candidate, build))
    assert failed.error_kind is MeasureErrorKind.RUNTIME and failed.error_msg.startswith("loading the kernel: ")
    assert good.is_valid and runner._workers[0] is not first_worker and first_worker.process.poll() is not None


def _gpu_candidate(dag, lib_path="kernel.cubin"):
    return (MeasureInput(dag, tc.Target("cuda -arch=sm_90"), tc.Schedule(dag).trace),
            BuildResult(lib_path, "", "add", ARGS, (), MeasureErrorKind.NONE, "", 0.0, ((1, 1, 1), (64, 1, 1), 0)))


def _visible_gpu(worker) -> str:
    """The CUDA_VISIBLE_DEVICES a worker process was started with."""
    environ = Path(f"/proc/{worker.process.pid}/environ").read_bytes().split(b"\0")
    return next(item for item in environ if item.startswith(b"CUDA_VISIBLE_DEVICES=")).split(b"=", 1)[1].decode()


def two_gpus_in_flight(monkeypatch) -> list:
    """CUDA_VISIBLE_DEVICES=3,5, and workers whose replies are made up: the first two asked wait
    for each other (measuring one at a time would break the barrier), each cost the number of
    the GPU its worker sees. Returns the list of the asking workers' pids, as they ask."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    together, asked = threading.Barrier(2, timeout=30), []

    def ask(worker, request, timeout_secs, run_limit_secs=None):
        asked.append(worker.process.pid)
        if len(asked) <= 2:
            together.wait()
        return {"error_kind": "none", "costs": [int(_visible_gpu(worker)) * 1e-3]}  # the cost says the GPU

    monkeypatch.setattr(runner_module._Worker, "ask", ask)
    return asked


@pytest.mark.slow  # a worker a GPU; a kernel failing on one of two GPUs stays in the quick subset
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a worker's environment from /proc")
def test_gpu_kernels_are_measured_on_every_gpu_at_once_each_by_a_worker_that_sees_its_gpu_alone(dag, monkeypatch):
    """Two GPUs: the first two candidates are in flight together (each waits for the other,
    so measuring one at a time would break the barrier), each worker started seeing one GPU,
    counted within CUDA_VISIBLE_DEVICES, and each result names the GPU that measured it.
    The workers are real; their replies, which would need a GPU, are made up."""
    asked = two_gpus_in_flight(monkeypatch)
    heard = []
    with LocalRunner(gpus=[0, 1]) as runner:
        assert runner.measures_at_once == 2
        results = _run(runner, *[_gpu_candidate(dag)] * 6, on_result=lambda index, result: heard.append(index))
        assert {_visible_gpu(worker) for worker in runner._workers.values()} == {"3", "5"}
    assert sorted(heard) == list(range(6)) and len(set(asked)) == 2 and all(r.is_valid for r in results)
    assert all(r.device == f"{runner.device}/cuda:{round(r.costs[0] * 1e3)}" for r in results)
    assert {r.device for r in results} == {f"{runner.device}/cuda:3", f"{runner.device}/cuda:5"}
    with runner.on_one_device(repeat=2) as final:  # the re-measurement's: the first GPU alone
        assert final.gpus == (0,) and final.measures_at_once == 1 and final.repeat == 2
        assert {r.device for r in _run(final, *[_gpu_candidate(dag)] * 3)} == {f"{runner.device}/cuda:3"}


@pytest.mark.slow
def test_a_kernel_that_fails_on_one_gpu_replaces_that_gpus_worker_alone(dag, monkeypatch):
    def ask(worker, request, timeout_secs, run_limit_secs=None):
        if request["lib_path"].endswith("illegal.cubin"):
            return {"error_kind": "runtime", "error_msg": "running the kernel: CUDA_ERROR_ILLEGAL_ADDRESS"}
        return {"error_kind": "none", "costs": [1e-3]}

    monkeypatch.setattr(runner_module._Worker, "ask", ask)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with LocalRunner(gpus=[0, 1]) as runner:
        _run(runner, *[_gpu_candidate(dag)] * 4)
        before = dict(runner._workers)
        (failed,) = _run(runner, _gpu_candidate(dag, "illegal.cubin"))
        gpu = int(failed.device.rsplit(":", 1)[1])
        assert failed.error_kind is MeasureErrorKind.RUNTIME and gpu not in runner._workers
        assert runner._workers == {1 - gpu: before[1 - gpu]} and before[1 - gpu].process.poll() is None
        assert before[gpu].process.poll() is not None


def test_cpu_kernels_are_measured_one_at_a_time_whatever_the_gpus(kernel):
    with LocalRunner(gpus=[0, 1], number=2, min_repeat_ms=0) as runner:
        results = _run(runner, kernel("add"), kernel("add"))
        assert all(r.is_valid and r.device == runner.device for r in results) and list(runner._workers) == [0]


@pytest.mark.parametrize("gpus, visible, message", [
    ([], None, "give the ordinals of distinct GPUs, at least one"), ([0, 0], None, "distinct GPUs"),
    ([-1], None, "distinct GPUs"), ([0, 2], "4,5", "this process sees 2 GPU(s) (CUDA_VISIBLE_DEVICES=4,5), so there "
                                                   "is no cuda:2; count the GPUs within that list, from 0")])
def test_gpus_that_are_not_there_or_repeat_are_refused_with_the_fix(monkeypatch, gpus, visible, message):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(ValueError, match=re.escape(message)):
        LocalRunner(gpus=gpus)


def test_gpu_kernels_under_an_address_space_limit_are_refused_with_the_fix(kernel):
    candidate, _ = kernel("add")
    gpu = BuildResult("kernel.cubin", "", "add", ARGS, (), MeasureErrorKind.NONE, "", 0.0, ((1, 1, 1), (64, 1, 1), 0))
    with LocalRunner(max_memory_bytes=1 << 30) as limited:
        with pytest.raises(ValueError, match="max_memory_bytes limits the worker's address space.*leave it None"):
            limited.run([candidate], [gpu])


def test_unwritten_outputs_are_a_wrong_answer(runner, kernel):
    (result,) = _run(runner, kernel("add_first_half"))
    assert result.error_kind is MeasureErrorKind.WRONG_ANSWER
    assert "32 of 64 elements" in result.error_msg and "got nan" in result.error_msg


def test_missing_entry_symbol_is_a_runtime_error(runner, kernel):
    missing, good = _run(runner, kernel("no_such_function"), kernel("add"))
    assert missing.error_kind is MeasureErrorKind.RUNTIME
    assert missing.error_msg.startswith("loading the kernel: ") and "'no_such_function'" in missing.error_msg
    assert good.is_valid


@pytest.mark.parametrize("name, signal_name", [("write_null", "SIGSEGV"),
                                               pytest.param("call_abort", "SIGABRT", marks=pytest.mark.slow)])
def test_kernel_killing_its_worker_is_a_worker_crash_and_the_next_one_runs(runner, kernel, name, signal_name):
    crashed, good = _run(runner, kernel(name), kernel("add"))
    assert crashed.error_kind is MeasureErrorKind.WORKER_CRASH
    assert crashed.error_msg.startswith(f"worker died with signal {signal_name} while running the kernel")
    assert good.is_valid


@pytest.mark.slow
def test_endless_kernel_times_out_and_results_arrive_one_by_one(runner, kernel):
    heard = []
    results = _run(runner, kernel("add"), kernel("spin"), kernel("add"),
                   on_result=lambda index, result: heard.append((index, result)))
    assert heard == list(enumerate(results))
    assert _kinds(results) == [MeasureErrorKind.NONE, MeasureErrorKind.RUN_TIMEOUT, MeasureErrorKind.NONE]
    timed_out = results[1]
    assert 1.0 <= timed_out.all_cost < 2.0
    assert timed_out.error_msg == ("kernel ran longer than 1 s (run timeout); "
                                   "the worker was killed and will be restarted")
    # The first result was handed over before the second candidate started, a timeout earlier.
    assert timed_out.timestamp - results[0].timestamp >= 1.0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_kernel_allocating_past_the_memory_limit_fails_without_harm(kernel):
    with LocalRunner(timeout_secs=5.0, number=1, min_repeat_ms=0, max_memory_bytes=512 << 20) as limited:
        hog, good = _run(limited, kernel("hog"), kernel("add"))
    assert hog.error_kind in (MeasureErrorKind.WORKER_CRASH, MeasureErrorKind.RUNTIME), hog
    assert good.is_valid


def test_failed_builds_pass_through_without_running(runner, kernel):
    candidate, _ = kernel("add")
    failed = BuildResult.failed(MeasureErrorKind.COMPILE, "gcc said no", 0.25)
    (result,) = runner.run([candidate], [failed])
    assert result == MeasureResult((), MeasureErrorKind.COMPILE, "gcc said no", 0.25, result.timestamp,
                                   device=runner.device)
    assert result.mean_cost == float("inf")


def test_a_failed_build_for_a_gpu_names_the_gpu_it_was_for(runner, dag):
    """Its record is the GPU's, as its measured neighbours' are (nvcc ran past its timeout, say)."""
    candidate = MeasureInput(dag, tc.Target("cuda -arch=sm_90"), tc.Schedule(dag).trace)
    failed = BuildResult.failed(MeasureErrorKind.BUILD_TIMEOUT, "nvcc took longer than 15.0 s", 15.0)
    (result,) = runner.run([candidate], [failed])
    assert result.device == f"{runner.device}/cuda:0" and result.error_kind is MeasureErrorKind.BUILD_TIMEOUT


def test_close_stops_the_worker_and_deletes_the_reference_data(kernel):
    runner = LocalRunner(min_repeat_ms=0)
    assert _run(runner, kernel("add"))[0].is_valid
    process, directory = runner._workers[0].process, Path(runner._directory.name)
    assert any(directory.glob("*.npz"))
    runner.close()
    assert process.poll() is not None and not directory.exists()
    with pytest.raises(RuntimeError, match="closed"):
        _run(runner, kernel("add"))


@pytest.mark.slow
def test_no_worker_outlives_the_interpreter(kernel):
    done = subprocess.run([sys.executable, "-c", _tuner_script(kernel("add")[1].lib_path, then_spin=False)],
                          capture_output=True, text=True, timeout=60)  # exits without close()
    assert done.returncode == 0, done.stderr
    assert not _is_running(int(done.stdout))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process state from /proc")
def test_worker_of_a_killed_tuner_exits_even_inside_an_endless_kernel(kernel):
    script = _tuner_script(kernel("add")[1].lib_path, then_spin=True)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as tuner:
        worker_pid = int(tuner.stdout.readline())
        busy_since = _cpu_secs(worker_pid)
        _wait_until(lambda: _cpu_secs(worker_pid) > busy_since + 0.2)  # now spinning in the kernel
        tuner.kill()
    _wait_until(lambda: not _is_running(worker_pid))
    assert not _is_running(worker_pid)


@pytest.mark.slow
def test_a_flushing_runner_times_one_call_ten_times_unless_told_otherwise(kernel):
    with LocalRunner(enable_cpu_cache_flush=True) as flushing:
        (result,) = _run(flushing, kernel("add"))
        assert result.is_valid and len(result.costs) == 10
        assert (flushing.number, flushing.min_repeat_ms) == (1, 0)
    chosen = LocalRunner(enable_cpu_cache_flush=True, number=4, repeat=2, min_repeat_ms=5)
    plain = LocalRunner()
    assert (chosen.number, chosen.repeat, chosen.min_repeat_ms) == (4, 2, 5)
    assert (plain.number, plain.repeat, plain.min_repeat_ms) == (3, 1, 100)
    chosen.close(), plain.close()


@pytest.mark.slow
def test_a_runner_evicting_the_weights_times_packed_candidates_with_the_warm_protocol(kernel_cache):
    inputs, builds = _matmul_candidates(kernel_cache)  # the packed one's B is evicted before every call
    with LocalRunner(evict_weights=True, min_repeat_ms=5) as evicting:
        results = evicting.run(inputs, builds)
        assert _kinds(results) == [MeasureErrorKind.NONE] * 2, [r.error_msg for r in results]
    default = LocalRunner(evict_weights=True)
    assert (default.number, default.repeat, default.min_repeat_ms) == (3, 1, 100)
    default.close()


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="timeout_secs"):
        LocalRunner(timeout_secs=0)
    with pytest.raises(ValueError, match="one of enable_cpu_cache_flush and evict_weights"):
        LocalRunner(enable_cpu_cache_flush=True, evict_weights=True)
    with pytest.raises(ValueError, match="max_memory_bytes"):
        LocalRunner(max_memory_bytes=1 << 20)


def _tuner_script(lib_path: str, then_spin: bool) -> str:
    """A tuner that measures the ``add`` kernel, prints its worker's pid, then runs
    ``spin`` (and is killed) or exits without closing its runner."""
    return textwrap.dedent(f"""
        import tilecraft as tc
        from tilecraft import te
        from tilecraft.measure import BuildResult, LocalRunner, MeasureErrorKind, MeasureInput
        from tilecraft.runtime import ArgSpec
        A = te.placeholder((64,), name="A")
        B = te.placeholder((64,), name="B")
        candidate = MeasureInput(tc.ComputeDAG([A, B, te.compute((64,), lambda i: A[i] + B[i], name="C")]),
                                 tc.Target.host(), tc.Trace())
        args = {ARGS!r}
        runner = LocalRunner(min_repeat_ms=0, timeout_secs=60, stop_slow_candidates=False)
        build = BuildResult({lib_path!r}, "", "add", args, (), MeasureErrorKind.NONE, "", 0.0)
        assert runner.run([candidate], [build])[0].is_valid
        print(runner._workers[0].process.pid, flush=True)
        if {then_spin}:
            runner.run([candidate], [BuildResult({lib_path!r}, "", "spin", args, (), MeasureErrorKind.NONE, "", 0.0)])
    """)


def _wait_until(condition, timeout_secs: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_secs
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def _cpu_secs(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _is_running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped (an orphan's new parent may never reap it)."""
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_numpy_reference_is_computed_on_one_blas_thread(kernel, monkeypatch):
    """OpenBLAS's threads spin for ~0.1 s after a call: beside the worker, they slowed the
    timing of the first candidate of every new workload by up to 2x."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> int:
        return max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)

    if blas_threads() < 2:
        pytest.skip("BLAS runs on one thread here anyway")
    seen = []
    evaluate = tc.ComputeDAG.evaluate_numpy

    def spy(self, inputs):
        seen.append(blas_threads())
        return evaluate(self, inputs)

    monkeypatch.setattr(tc.ComputeDAG, "evaluate_numpy", spy)
    with LocalRunner(number=1, min_repeat_ms=0) as runner:
        (result,) = _run(runner, kernel("add"))
    assert result.is_valid and seen == [1]
    assert blas_threads() >= 2  # and only there


@pytest.mark.slow
def test_a_candidate_far_slower_than_the_fastest_is_timed_once_and_stopped_early(kernel, monkeypatch):
    # slow_add's billion steps take 0.28 s on a quiet machine and went past the 0.5 s
    # allowance on a loaded one: a longer allowance keeps it between the floor and the stop
    monkeypatch.setattr(runner_module, "STOP_ALLOWANCE_SECS", 4.0)
    with LocalRunner(timeout_secs=20.0, number=2, repeat=3, min_repeat_ms=0) as searching:
        fast, slow = _run(searching, kernel("add"), kernel("slow_add"))
        assert len(fast.costs) == 3 and len(slow.costs) == 1  # one call told enough: it will not be kept
        assert slow.mean_cost > max(runner_module.SLOW_FLOOR_SECS, runner_module.SLOW_FACTOR * min(fast.costs))
        started = time.perf_counter()
        (stopped,) = _run(searching, kernel("spin"))
        assert stopped.error_kind is MeasureErrorKind.RUN_TIMEOUT and time.perf_counter() - started < 10
        assert "100 times the fastest call of this workload so far" in stopped.error_msg
    with LocalRunner(timeout_secs=20.0, number=2, repeat=3, min_repeat_ms=0, stop_slow_candidates=False) as full:
        fast, slow = _run(full, kernel("add"), kernel("slow_add"))
        assert len(fast.costs) == len(slow.costs) == 3


def test_a_gpu_kernel_twice_the_fastest_is_timed_by_one_call_whatever_its_length(kernel):
    """CUDA events read a kernel's first timed call as its later ones, so the GPU's rule has
    no floor: a 40 us kernel against a 10 us best is timed once. A CPU kernel keeps the floor."""
    candidate, cpu = kernel("add")
    gpu = BuildResult("kernel.cubin", "", "add", ARGS, (), MeasureErrorKind.NONE, "", 0.0, ((1, 1, 1), (64, 1, 1), 0))
    with LocalRunner() as runner:
        reference = runner._reference(candidate.dag)
        assert runner._request(gpu, reference, 10e-6)["slow_call_secs"] == pytest.approx(
            runner_module.GPU_SLOW_FACTOR * 10e-6)
        assert runner._request(cpu, reference, 10e-6)["slow_call_secs"] == runner_module.SLOW_FLOOR_SECS
        assert runner._request(gpu, reference, None)["slow_call_secs"] is None
