"""bfloat16 products summed two steps at a time with AVX-512 BF16 (``codegen/dot_pairs.py``):
the register tile's reduction loop taken in pairs where the compiler targets it, the usual
loop elsewhere, both equal to NumPy's float32 sum rounded once."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen import vector_math
from tilecraft.ops.common import product_of
from tilecraft.schedule.trace import Trace
from tilecraft.search.default import default_row, default_schedule
from tilecraft.search.evolution import Candidate
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.space import generate_sketches

HOST = tc.Target.host()  # the pairs where this machine has AVX-512 BF16, else the usual loop


def bfloat16_matmul(n, l, m, a_transposed=False, out_dtype=None):
    A = te.placeholder((l, n) if a_transposed else (n, l), name="A", dtype="bfloat16")
    B = te.placeholder((l, m), name="B", dtype="bfloat16")
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(product_of(A[k, i] if a_transposed else A[i, k], B[k, j], out_dtype),
                                               axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


@pytest.mark.parametrize("a_transposed, out_dtype", [(False, None), pytest.param(True, None, marks=pytest.mark.slow),
                                                     pytest.param(False, "float32", marks=pytest.mark.slow)])
def test_a_bfloat16_register_tile_sums_pairs_where_the_cpu_has_avx512_bf16(a_transposed, out_dtype, kernel_cache,
                                                                          monkeypatch):
    """A's pair one 4-byte load where its elements are neighbours (two where A is transposed);
    summed into bfloat16 or, each operand cast, into float32. Then the usual loop alone (the
    pairs' guard made false), as a CPU without AVX-512 BF16 compiles it."""
    dag = bfloat16_matmul(48, 96, 64, a_transposed, out_dtype)
    inputs = dag.random_inputs(np.random.default_rng(0))
    want = dag.evaluate_numpy(inputs)[0].astype(np.float32)
    tolerance = dict(rtol=1e-5, atol=1e-4) if out_dtype else dict(rtol=8e-3, atol=8e-2)
    kernel = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache)
    assert "#if defined(__AVX512BF16__)" in kernel.source and "tc_dot_bf16x" in kernel.source
    assert ("*(tc_bf16_pair*)&A[" in kernel.source) != a_transposed
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, **tolerance)
    monkeypatch.setattr(vector_math, "bfloat16_dot_guard", lambda lanes: "#if 0\n")
    kernel = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache)
    assert "#if 0" in kernel.source
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, **tolerance)


@pytest.mark.slow  # its siblings above stay quick
def test_only_a_bfloat16_sum_of_an_even_reduction_is_paired(kernel_cache):
    """float16 and float32 products have no such instruction; a reduction loop of odd length
    none to pair."""
    for dag in (bfloat16_matmul(48, 95, 64), tc.SearchTask(func="matmul", args=(48, 96, 64, "float16")).compute_dag,
                tc.SearchTask(func="matmul", args=(48, 96, 64)).compute_dag):
        source = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache).source
        assert "tc_dot_bf16" not in source and "__AVX512BF16__" not in source


def _with_pairs(sch, pairs: bool):
    """``sch`` replayed with its weights packed in pairs, or not, whatever its target chose."""
    steps = sch.trace.to_json()
    for step in steps:
        if step["kind"] == "rewrite_layout":
            step["args"]["pairs"] = pairs
    return Trace.from_json(steps).replay(sch.dag)


def test_a_weight_packed_in_pairs_is_read_as_one_vector_of_pairs(kernel_cache, monkeypatch):
    """A layout-free bfloat16 weight packed with its reduction's neighbours side by side after
    the lanes (``k // 2``, the columns, ``k % 2``): the dot product loads its pairs as they lie,
    where the rows of B took two loads and an interleave. Equal to NumPy, and so is the usual
    loop (the pairs' guard made false) reading the same packed weight two elements apart."""
    task = tc.SearchTask(func="matmul", args=(48, 96, 64, "bfloat16"), target=HOST)
    dag = task.compute_dag
    inputs = dag.random_inputs(np.random.default_rng(0))
    want = dag.evaluate_numpy(inputs)[0].astype(np.float32)
    sch = _with_pairs(default_schedule(dag, HOST), True)
    (packed,) = sch.state.packed
    assert packed.packed.shape[-1] == 2
    kernel = tc.build(sch, HOST, cache_dir=kernel_cache)
    assert "tc_dot_pairs_bf16x" in kernel.source and "*(tc_bf16_pairs" in kernel.source
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, rtol=8e-3, atol=8e-2)
    monkeypatch.setattr(vector_math, "bfloat16_dot_guard", lambda lanes: "#if 0\n")
    kernel = tc.build(sch, HOST, cache_dir=kernel_cache)
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, rtol=8e-3, atol=8e-2)


def test_weights_are_packed_in_pairs_only_where_the_target_sums_bfloat16_pairs():
    """The sketches of a bfloat16 matmul ask for pairs on a CPU with AVX-512 BF16 alone; a
    float32 weight never has them."""
    def asked(target, dtype):
        dag = tc.SearchTask(func="matmul", args=(64, 64, 64, dtype), target=target).compute_dag
        return {step["args"].get("pairs", False) for sketch in generate_sketches(dag, target=tc.Target(target))
                for step in sketch.trace.to_json() if step["kind"] == "rewrite_layout"}

    assert asked("llvm -mcpu=znver4", "bfloat16") == {True}
    assert asked("llvm -mcpu=skylake-avx512", "bfloat16") == {False}
    assert asked("llvm -mcpu=znver4", "float32") == {False}


def test_pairs_are_packed_only_where_the_loops_read_them_as_pairs():
    """An odd innermost reduction piece (no loop taken two steps at a time), or a last loop that
    does not index the weight (no lanes along it): the layout it would have without pairs."""
    dag = tc.SearchTask(func="matmul", args=(16, 96, 32, "bfloat16")).compute_dag

    def packed_shape(k_inner: int, last: str, pairs: bool):
        sch = tc.Schedule(dag)
        block = sch.get_block("matmul")
        i, j, k = sch.get_loops(block)
        ko, ki = sch.split(k, [None, k_inner])
        sch.reorder(*((i, ko, ki, j) if last == "j" else (j, ko, ki, i)))
        sch.rewrite_layout(block, ("read", 1), pairs)
        return sch.state.packed[0].packed.shape

    assert packed_shape(8, "j", True) == (48, 32, 2)  # k's pieces follow each other: one dimension
    assert packed_shape(8, "j", False) == (96, 32)
    assert packed_shape(3, "j", True) == packed_shape(3, "j", False) == (96, 32)
    assert packed_shape(8, "i", True) == packed_shape(8, "i", False)


@pytest.mark.slow
def test_a_record_of_the_weight_unpaired_is_another_program_so_a_resumed_search_measures_the_paired_default():
    """A log tuned before bfloat16 weights were packed in pairs holds the same decisions as
    today's candidates, but not the same kernels: its records neither stand for them nor keep
    the search from measuring today's defaults (a resumed BERT layer never measured its faster
    default, and its tuned model ran slower than the untuned one)."""
    task = tc.SearchTask(func="matmul", args=(64, 64, 64, "bfloat16"), target="llvm -mcpu=znver4 -num-cores=2")
    fresh = SketchPolicy(task)
    defaults = [Candidate(n, tuple(int(v) for v in default_row(s, fresh.min_parallel)))
                for n, s in enumerate(fresh.sketches)]

    class Record:  # what preload reads of a TuningRecord
        def __init__(self, trace, sketch):
            self.trace, self.sketch, self.mean_cost = trace.to_json(), sketch, 1e-3
            self.trace_json, self.phase = trace.dumps(), "search"

    def records(pairs):
        return [Record(_with_pairs(fresh.trace_of(c).replay(task.compute_dag), pairs).trace,
                       fresh.sketches[c.sketch].name) for c in defaults]

    today = SketchPolicy(task)
    assert today.preload(records(True)) == len(defaults)
    assert not {c.key for c in defaults} & {c.key for c in today.next_batch(len(defaults))}
    resumed = SketchPolicy(task)
    assert resumed.preload(records(False)) == 0
    assert {c.key for c in defaults} <= {c.key for c in resumed.next_batch(len(defaults))}
