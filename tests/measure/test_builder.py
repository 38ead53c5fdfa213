"""LocalBuilder: each candidate becomes a library or an error of the right kind, in input order."""

import shutil
from pathlib import Path

import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.errors import LoweringError
from tilecraft.measure import LocalBuilder, MeasureErrorKind, MeasureInput
from tilecraft.measure import builder as builder_module
from tilecraft.runtime.nvrtc import nvrtc_version
from tilecraft.schedule.trace import Step, Trace
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches


def _add_dag():
    A = te.placeholder((64,), name="A")
    B = te.placeholder((64,), name="B")
    C = te.compute((64,), lambda i: A[i] + B[i], name="C")
    return tc.ComputeDAG([A, B, C])


def _vectorized_add(dag):
    sch = tc.Schedule(dag)
    (i,) = sch.get_loops(sch.get_block("C"))
    _, inner = sch.split(i, [None, 8])
    sch.vectorize(inner)
    return MeasureInput(dag, tc.Target.host(), sch.trace)


def _unknown_block(dag):
    return MeasureInput(dag, tc.Target.host(), Trace((Step("get_block", (("name", "nope"),), ("b0",)),)))


def test_good_candidate_gives_a_library_and_its_signature(kernel_cache):
    (result,) = LocalBuilder(cache_dir=kernel_cache).build([_vectorized_add(_add_dag())])
    assert result.error_kind is MeasureErrorKind.NONE and result.error_msg == ""
    assert result.lib_path.endswith(".so") and "default_function" in result.source
    assert [(a.name, a.shape, a.is_output) for a in result.args] == [("A", (64,), False), ("B", (64,), False),
                                                                      ("C", (64,), True)]
    assert result.time_cost > 0


def test_trace_naming_a_missing_block_is_an_instantiation_error(kernel_cache):
    (result,) = LocalBuilder(cache_dir=kernel_cache).build([_unknown_block(_add_dag())])
    assert result.error_kind is MeasureErrorKind.INSTANTIATION and result.lib_path is None
    assert "ScheduleError" in result.error_msg and "no block named 'nope'" in result.error_msg


def test_source_rejected_by_gcc_is_a_compile_error(kernel_cache, monkeypatch):
    monkeypatch.setattr(builder_module, "generate_c", lambda func, target: "this is not C;\n")
    (result,) = LocalBuilder(cache_dir=kernel_cache).build([_vectorized_add(_add_dag())])
    assert result.error_kind is MeasureErrorKind.COMPILE
    assert "could not compile" in result.error_msg and result.source == "this is not C;\n"


def test_lowering_failure_is_a_compile_error_naming_the_stage(kernel_cache, monkeypatch):
    def fail(sch, name):
        raise LoweringError("unsupported pattern")

    monkeypatch.setattr(builder_module, "lower", fail)
    (result,) = LocalBuilder(cache_dir=kernel_cache).build([_vectorized_add(_add_dag())])
    assert result.error_kind is MeasureErrorKind.COMPILE
    assert result.error_msg == "lowering: tilecraft.errors.LoweringError: unsupported pattern"


def test_compiler_past_the_timeout_is_a_build_timeout(tmp_path):
    # A fresh cache, so the library must really be compiled; no gcc finishes in a millisecond.
    (result,) = LocalBuilder(timeout_secs=0.001, cache_dir=tmp_path).build([_vectorized_add(_add_dag())])
    assert result.error_kind is MeasureErrorKind.BUILD_TIMEOUT
    assert "took longer than 0.001 s" in result.error_msg


def test_results_keep_input_order_with_failures_in_between(kernel_cache):
    dag = _add_dag()
    inputs = [_vectorized_add(dag), _unknown_block(dag), _vectorized_add(dag), _unknown_block(dag)]
    results = LocalBuilder(n_parallel=2, cache_dir=kernel_cache).build(inputs)
    assert [r.error_kind for r in results] == [MeasureErrorKind.NONE, MeasureErrorKind.INSTANTIATION] * 2
    assert results[0].lib_path == results[2].lib_path


@pytest.mark.parametrize("compiler", [
    pytest.param("nvrtc", marks=pytest.mark.skipif(nvrtc_version() is None, reason="needs the cuda extra")),
    pytest.param("nvcc", marks=[pytest.mark.slow,
                                pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")])])
@pytest.mark.slow
def test_gpu_candidates_become_cubins_with_their_launch_by_either_cuda_compiler(tmp_path, compiler):
    task = tc.SearchTask(func="matmul", args=(64, 64, 64, "float32"), target=tc.Target("cuda -arch=sm_90"))
    policy = tc.SketchPolicy(task)
    inputs = [MeasureInput(task.compute_dag, task.target, policy.trace_of(c)) for c in policy.next_batch(4)]
    results = LocalBuilder(n_parallel=2, cache_dir=tmp_path, cuda_compiler=compiler).build(inputs)
    assert [r.error_kind for r in results] == [MeasureErrorKind.NONE] * 4, [r.error_msg for r in results]
    for result in results:
        assert Path(result.lib_path).read_bytes().startswith(b"\x7fELF") and result.launch is not None


@pytest.mark.skipif(shutil.which("nvcc") is None and nvrtc_version() is None, reason="needs nvcc or the cuda extra")
def test_a_split_k_candidates_launch_names_the_output_its_blocks_add_into(tmp_path):
    """Its launch names what the worker, or a device server, zeroes first; its parts (16, each 64
    of the sum) are blocks along y."""
    task = tc.SearchTask(func="matmul", args=(64, 1024, 64, "float32"), target=tc.Target("cuda -arch=sm_90"))
    sketch = next(s for s in generate_sketches(task.compute_dag, target=task.target) if s.name == "gpu_split_k")
    candidate = MeasureInput(task.compute_dag, task.target, sketch.trace_of(default_row(sketch, 1)))
    result, = LocalBuilder(cache_dir=tmp_path).build([candidate])
    assert result.error_kind is MeasureErrorKind.NONE, result.error_msg
    launch = result.launch["launch"]
    assert launch["grid"][1] == 16 and launch["zeroed"] == [2] and result.launch["workspace"] == []
    assert [a.name for a in result.args][2] == "matmul"


@pytest.mark.parametrize("options", [{"timeout_secs": 0}, {"n_parallel": 0}, {"cuda_compiler": "clang"}])
def test_invalid_options_are_rejected(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        LocalBuilder(**options)
