"""The search loop for a CUDA target, on a machine without a GPU: GPU sketches, the verifier
in the builder, nvcc builds and the cost model, with a simulated GPU runner whose costs come
from a formula over the launch. The best schedule it finds matches NumPy in the emulation."""

from __future__ import annotations

import math
import shutil
import time

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.codegen.gpu_verify import verify_gpu
from tilecraft.database import load_records
from tilecraft.ir.lower import lower
from tilecraft.search import policy as policy_module
from tilecraft.search.evolution import Candidate
from tilecraft.search.space import Sketch
from tilecraft.measure import MeasureErrorKind
from tilecraft.measure.result import MeasureResult

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

TARGET = tc.Target("cuda -arch=sm_90")


class SimulatedGpuRunner:
    """Costs from a formula, as issue 45 asks for CI: time falls with the blocks that fill the
    SMs and the threads that fill a block, and with the work a thread does between
    barriers (rows and columns of its tile), so that the search has a gradient to follow."""

    def __init__(self, flop: float):
        self.flop, self.calls = flop, 0

    def run(self, inputs, builds, on_result=None):
        results = []
        for index, build in enumerate(builds):
            self.calls += 1
            if build.error_kind is not MeasureErrorKind.NONE:
                result = MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time.time())
            else:
                launches = build.launch["launch"]
                launch = launches[0] if isinstance(launches, list) else launches  # the tiled kernel
                blocks, threads = math.prod(launch["grid"]), math.prod(launch["block"])
                filled = min(1.0, blocks / (2 * TARGET.sm_count)) * min(1.0, threads / 256)
                cost = self.flop / (40e12 * max(filled, 1e-3))
                result = MeasureResult((cost,), MeasureErrorKind.NONE, "", build.time_cost, time.time(),
                                       device="simulated@ci/cuda:0")
            results.append(result)
            if on_result is not None:
                on_result(index, result)
        return results

    def on_one_device(self, **changes):
        return self

    def close(self):
        pass


@pytest.mark.slow
def test_a_cuda_task_tunes_with_gpu_sketches_and_its_best_matches_numpy(tmp_path):
    task = tc.SearchTask(func="matmul", args=(128, 64, 128, "float32"), target=TARGET)
    log = tmp_path / "gpu.json"
    runner = SimulatedGpuRunner(task.compute_dag.flop_count())
    summary = task.tune(tc.TuningOptions(num_measure_trials=24, num_measures_per_round=8, runner=runner,
                                         measure_callbacks=[tc.RecordToFile(log)], num_remeasured=0))
    records = load_records(log)
    assert len(records) >= 16 and all(r.target == str(TARGET) for r in records)
    assert summary.valid > 0 and any(r.sketch == "gpu_tile" for r in records)
    assert not any(r.error_kind == MeasureErrorKind.INSTANTIATION.value for r in records)  # refused before building
    sch = task.apply_best(log)
    a, b = task.compute_dag.random_inputs()
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert "__global__" in tc.build(sch, TARGET).source


@pytest.mark.slow
def test_what_the_decisions_do_not_show_is_verified_before_building_and_counted(monkeypatch):
    """The policy lowers and verifies what it proposes, learns the refusals as failures,
    proposes others instead and counts them for the summary: here with the decision
    matrix's own check switched off, so that everything it would catch reaches the verifier."""
    monkeypatch.setattr(Sketch, "within_gpu_limits", lambda self, rows: np.ones(len(rows), dtype=bool))
    task = tc.SearchTask(func="matmul", args=(512, 512, 512, "float32"), target=TARGET)
    policy = tc.SketchPolicy(task, seed=3)
    for sketch in policy.sketches:  # as a user's rule whose shared tiles no form says
        sketch.limits_in_decisions = False
    batch = policy.next_batch(48)
    assert len(batch) >= 16 and policy.rejected > 48 - len(batch)  # later rounds replaced refused ones
    for candidate in batch:
        verify_gpu(lower(policy.trace_of(candidate).replay(task.compute_dag)), TARGET)  # raises if over a limit


@pytest.mark.slow
def test_a_proposal_over_the_gpus_limits_never_reaches_the_builder(monkeypatch):
    """The random share of a round (eps-greedy) is drawn again only a few times where it
    breaks a limit: on the H100, 4 of 638 such candidates reached the builder's verifier
    (virtual threads over 8). Whatever a round proposes over a limit is refused and counted."""
    task = tc.SearchTask(func="matmul", args=(1024, 1024, 1024, "float32"), target=TARGET)
    policy = tc.SketchPolicy(task, seed=3)
    tiled = next(n for n, s in enumerate(policy.sketches) if s.name == "gpu_tile")
    rows = policy.sketches[tiled].sample_uniform(np.random.default_rng(0), 4096)
    broken = [Candidate(tiled, tuple(int(v) for v in row))
              for row in rows[~policy.sketches[tiled].within_gpu_limits(rows)][:8]]
    propose = policy_module.evolutionary_search
    monkeypatch.setattr(policy_module, "evolutionary_search", lambda *args: broken + propose(*args))
    batch = policy.next_batch(16)
    assert len(broken) == 8 and policy.rejected >= 8 and not set(broken) & set(batch)
    for candidate in batch:
        assert policy.sketches[candidate.sketch].within_gpu_limits(np.array([candidate.row]))[0]


@pytest.mark.slow
def test_where_the_decisions_tell_every_limit_a_proposal_is_not_lowered_twice(monkeypatch):
    """The builder lowers each candidate; the policy lowers only each sketch's default once,
    for its structure, and still proposes nothing the verifier would refuse."""
    task = tc.SearchTask(func="matmul", args=(1, 2048, 1000, "float32"), target=TARGET)
    policy = tc.SketchPolicy(task, seed=3)
    lowered = []
    monkeypatch.setattr("tilecraft.search.policy.lower", lambda sch: lowered.append(sch) or lower(sch))
    batch = policy.next_batch(32)
    assert all(s.limits_in_decisions for s in policy.sketches) and len(policy.sketches) == 6  # split-K too
    assert len(batch) == 32 and len(lowered) == 6 and policy.rejected == 0
    for candidate in batch:
        verify_gpu(lower(policy.trace_of(candidate).replay(task.compute_dag)), TARGET)


def test_a_cuda_task_without_a_gpu_here_says_where_to_tune_it(monkeypatch, tmp_path):
    """With the default runner or a user's own LocalRunner, alone or in a scheduler beside a
    CPU task: refused before a trial, no log written (launches logged as failed here would
    keep a resumed tuning on a GPU from measuring them). A runner measuring elsewhere is not
    refused: the simulated one above tunes here (the tests before)."""
    monkeypatch.setattr("tilecraft.tune.task.cuda_available", lambda: False)
    task = tc.SearchTask(func="matmul", args=(64, 64, 64, "float32"), target=TARGET)
    cpu_task = tc.SearchTask(func="matmul", args=(64, 64, 64, "float32"), target=tc.Target("llvm"))
    log = tmp_path / "log.json"
    with tc.LocalRunner() as runner:
        for tune, runs in ((task.tune, None), (task.tune, runner),
                           (tc.TaskScheduler([cpu_task, task]).tune, runner)):
            options = tc.TuningOptions(num_measure_trials=8, runner=runs, measure_callbacks=[tc.RecordToFile(log)])
            with pytest.raises(tc.TargetError, match="times CUDA kernels on a GPU, and none can run here.*tc.build"):
                tune(options)
            assert not log.exists()


@pytest.mark.skipif(not tc.cuda_available(), reason="needs a GPU and cuda-bindings (pip install -e '.[cuda]')")
def test_a_cuda_task_tunes_on_the_gpu_with_the_local_runner(tmp_path):
    """On a GPU machine: the worker checks every candidate against NumPy on the GPU and times
    it with CUDA events; the records name the GPU."""
    task = tc.SearchTask(func="matmul", args=(256, 256, 256, "float32"), target=tc.Target("cuda"))
    log = tmp_path / "gpu.json"
    summary = task.tune(tc.TuningOptions(num_measure_trials=16, num_measures_per_round=8,
                                         measure_callbacks=[tc.RecordToFile(log)]))
    records = load_records(log)
    assert summary.valid > 0 and all(r.device.endswith("/cuda:0") for r in records if r.device)
    a, b = task.compute_dag.random_inputs()
    np.testing.assert_allclose(tc.build(task.apply_best(log), task.target)(a, b), a @ b, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replay-trace", "evolutionary"])
def test_a_tensor_core_design_space_tunes_and_its_best_matches_numpy(tmp_path, strategy):
    """``examples/tensor_core_matmul.py``'s schedule function, its sizes sampled: the decisions
    count its fragments as spread over a warp and its blocks as a warp wide, so candidates are
    built and measured, not refused; the best is on tensor cores and matches NumPy."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "tensor_core_matmul.py"
    spec = importlib.util.spec_from_file_location("tensor_core_matmul", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    dag = example.half_matmul(256, 256, 256, "float32")
    database = tc.tune_tir(dag, TARGET, tmp_path / "work", max_trials_global=16, num_trials_per_iter=8,
                           space=tc.ScheduleFn(example.design_space), strategy=strategy,
                           runner=SimulatedGpuRunner(dag.flop_count()), verbose=0)
    records = load_records(tmp_path / "work" / "records.json")
    assert sum(r.is_valid for r in records) >= 12
    sch = tc.compile_tir(database, dag, TARGET)
    a, b = dag.random_inputs()
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(a, b), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-4, atol=1e-3)
    assert "tc_wmma_mma_row_row(" in tc.build(sch, TARGET).source


@pytest.mark.slow
def test_a_half_matmul_tunes_with_a_sketch_on_tensor_cores_beside_the_others(tmp_path):
    """Without a schedule function: the sketch rules offer the tensor-core tiling beside the
    others, its candidates are built and measured, and the best of them matches NumPy."""
    from tilecraft import te

    A = te.placeholder((256, 128), name="A", dtype="float16")
    B = te.placeholder((128, 256), name="B", dtype="float16")
    k = te.reduce_axis((0, 128), name="k")
    C = te.compute((256, 256), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
                   name="C")
    dag = tc.ComputeDAG([A, B, C])
    tc.tune_tir(dag, TARGET, tmp_path / "work", max_trials_global=32, num_trials_per_iter=16,
                runner=SimulatedGpuRunner(dag.flop_count()), verbose=0)
    records = load_records(tmp_path / "work" / "records.json")
    on_tensor_cores = [r for r in records if r.sketch == "gpu_tensor_core" and r.is_valid]
    assert on_tensor_cores and {r.sketch for r in records} > {"gpu_tensor_core"}
    best = min(on_tensor_cores, key=lambda r: r.mean_cost)
    sch = tc.Trace.from_json(best.trace).replay(dag)
    a, b = dag.random_inputs()
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(a, b), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-4, atol=1e-3)
