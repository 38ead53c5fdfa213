"""Focused lowering tests: bound inference, guards, loop annotations, generated C."""

import re

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te


def _conv():
    data = te.placeholder((1, 2, 10, 10), name="data")
    weight = te.placeholder((3, 2, 3, 3), name="weight")
    pad = te.compute((1, 2, 12, 12),
                     lambda n, c, h, w: te.if_then_else(te.all(h >= 1, h < 11, w >= 1, w < 11),
                                                        data[n, c, h - 1, w - 1], 0.0), name="pad")
    rc, ry, rx = (te.reduce_axis((0, 2), name="rc"), te.reduce_axis((0, 3), name="ry"),
                  te.reduce_axis((0, 3), name="rx"))
    conv = te.compute((1, 3, 10, 10), lambda n, f, y, x: te.sum(
        pad[n, rc, y + ry.var, x + rx.var] * weight[f, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
    return tc.ComputeDAG([data, weight, conv])


def _check(sch, dag, cache):
    inputs = dag.random_inputs(np.random.default_rng(0))
    ref = dag.evaluate_numpy(inputs)[0]
    np.testing.assert_allclose(tc.build(sch, cache_dir=cache)(*inputs), ref, rtol=1e-4, atol=1e-4)


def test_compute_at_row_loop_gives_kh_rows(kernel_cache):
    dag = _conv()
    sch = tc.Schedule(dag)
    n, f, y, x, rc, ry, rx = sch.get_loops(sch.get_block("conv"))
    sch.reorder(n, y, f, x, rc, ry, rx)
    sch.compute_at(sch.get_block("pad"), y)
    text = str(tc.lower(sch))
    # one output row needs kh = 3 padded rows of every channel, all 12 columns
    assert "allocate pad: float32[1, 2, 3, 12] (local)" in text
    _check(sch, dag, kernel_cache)


def test_non_dividing_split_is_guarded(kernel_cache):
    A = te.placeholder((10, 7), name="A")
    B = te.compute((10, 7), lambda i, j: A[i, j] * 3.0, name="B")
    dag = tc.ComputeDAG([A, B])
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [None, 4])
    text = str(tc.lower(sch))
    assert "range(3)" in text and "range(4)" in text
    assert "((i_0*4)+i_1) < 10" in text, text
    _check(sch, dag, kernel_cache)


def test_nested_non_dividing_split_of_reduction_is_guarded(kernel_cache):
    # splitting the middle loop of a split again must not repeat iterations of a reduction
    A = te.placeholder((24, 6), name="A")
    k = te.reduce_axis((0, 6), name="k")
    S = te.compute((24,), lambda i: te.sum(A[i, k], axis=k), name="S")
    dag = tc.ComputeDAG([A, S])
    sch = tc.Schedule(dag)
    i, k = sch.get_loops(sch.get_block("S"))
    i0, i1, i2 = sch.split(i, [None, 2, 4])
    sch.split(i1, [None, 4])
    sch.reorder(*[l for l in sch.get_loops(sch.get_block("S")) if l.id != k.id][::-1], k)
    _check(sch, dag, kernel_cache)


def test_lower_marks_annotated_loops():
    A = te.placeholder((16, 32), name="A")
    B = te.compute((16, 32), lambda i, j: A[i, j] + 1.0, name="B")
    sch = tc.Schedule(tc.ComputeDAG([A, B]))
    i, j = sch.get_loops(sch.get_block("B"))
    j0, j1, j2 = sch.split(j, [None, 2, 8])
    sch.parallel(i)
    sch.unroll(j1)
    sch.vectorize(j2)
    text = str(tc.lower(sch))
    assert "for i in range(16) parallel:" in text
    assert "for j_1 in range(2) unroll:" in text
    assert "for j_2 in range(8) vectorize:" in text


def test_c_of_vectorized_loop_has_vector_store(kernel_cache):
    A = te.placeholder((16, 32), name="A")
    B = te.compute((16, 32), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    dag = tc.ComputeDAG([A, B])
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("B"))
    j0, j1 = sch.split(j, [None, 16])
    sch.vectorize(j1)
    f = tc.build(sch, cache_dir=kernel_cache)
    if tc.Target().vector_bytes:
        assert re.search(r"\*\(f32x\d+\*\)&B\[", f.source), f.source
    _check(sch, dag, kernel_cache)


def test_two_stage_parallel_schedule_has_one_omp_pragma_per_root_loop(kernel_cache):
    A = te.placeholder((32, 16), name="A")
    B = te.compute((32, 16), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((32, 16), lambda i, j: te.exp(B[i, j]), name="C")
    dag = tc.ComputeDAG([A, C])
    sch = tc.Schedule(dag)
    ci, cj = sch.get_loops(sch.get_block("C"))
    ci0, ci1 = sch.split(ci, [None, 4])
    sch.parallel(ci0)
    sch.compute_at(sch.get_block("B"), ci0)
    f = tc.build(sch, cache_dir=kernel_cache)
    assert f.source.count("#pragma omp parallel for") == 1
    assert "allocate B: float32[4, 16] (local)" in str(tc.lower(sch))
    _check(sch, dag, kernel_cache)


def test_block_reverse_computed_in_its_producer_but_read_outside_it_gets_a_whole_buffer(kernel_cache):
    # S lives inside P's row loop, but O reads it at the root: S's buffer must be outside
    # that loop (it was a one-row array declared inside it, and the C did not compile)
    A = te.placeholder((8, 6), name="A")
    P = te.compute((8, 6), lambda i, j: A[i, j] + 1.0, name="P")
    S = te.compute((8, 6), lambda i, j: P[i, j] * 2.0, name="S")
    O = te.compute((8, 6), lambda i, j: S[i, j] + A[i, j], name="O")
    dag = tc.ComputeDAG([A, O])
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("P"))
    sch.reverse_compute_at(sch.get_block("S"), i)
    text = str(tc.lower(sch))
    assert "allocate S: float32[8, 6] (global)" in text, text
    assert "allocate P: float32[1, 6] (local)" in text, text
    _check(sch, dag, kernel_cache)


@pytest.mark.slow
def test_a_float16_sums_register_tile_holds_float32_and_rounds_once(kernel_cache):
    """A float16 matmul's accumulator (a thread's or a core's register tile) is float32 on a
    CPU and a GPU alike, as NumPy's is: summed in float16 over 4,096 products, it was 1.8e-2
    off; now as close as NumPy's."""
    from tilecraft.search.default import default_schedule

    for target in (tc.Target.host(), tc.Target("cuda -arch=sm_90")):
        task = tc.SearchTask(func="matmul", args=(32, 4096, 32, "float16"), target=target)
        sch = default_schedule(task.compute_dag, target)
        func = tc.lower(sch)
        accumulators = [b for b in _allocated(func.body) if b.scope == "local"]
        assert accumulators and all(b.dtype == "float32" for b in accumulators), accumulators
        a, b = task.compute_dag.random_inputs()
        run = tc.build(sch, target, cache_dir=kernel_cache) if target.kind != "cuda" else tc.emulate_gpu(sch, target)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        error = np.abs(run(a, b).astype(np.float64) - exact).max() / np.abs(exact).max()
        assert error < 1e-3, error


def _allocated(stmt):
    from tilecraft.ir.nodes import Allocate, walk_stmts

    return [node.buffer for node in walk_stmts(stmt) if isinstance(node, Allocate)]


@pytest.mark.slow
def test_every_sketch_of_a_float16_row_sum_sums_in_float32(kernel_cache):
    """Summed straight into its float16 output (a CPU's default, a GPU's auto-binding) or
    through rfactor's partial sums, a 4,096-long float16 row sum was up to 1.8e-2 off; held
    in a float32 register, or float32 partials, it is rounded once, as NumPy's."""
    from tilecraft.search.space import generate_sketches

    X = te.placeholder((16, 4096), name="X", dtype="float16")
    k = te.reduce_axis((0, 4096), name="k")
    dag = tc.ComputeDAG([X, te.compute((16,), lambda i: te.sum(X[i, k], axis=k), name="S")])
    x = np.random.default_rng(0).uniform(0, 1, (16, 4096)).astype(np.float16)
    exact = x.astype(np.float64).sum(axis=1)
    names = []
    for target in (tc.Target.host(), tc.Target("cuda -arch=sm_90")):
        for sketch in generate_sketches(dag, target=target):
            names.append(sketch.name)
            for row in sketch.sample(np.random.default_rng(1), 3, 1):
                sch = sketch.trace_of(row).replay(dag)
                gpu = target.kind == "cuda"
                run = tc.emulate_gpu(sch, target) if gpu else tc.build(sch, target, cache_dir=kernel_cache)
                error = np.abs(run(x).astype(np.float64) - exact).max() / exact.max()
                assert error < 1e-3, (sketch.name, error, str(sch))
    assert {"default", "rfactor_outer(S)", "rfactor_inner(S)", "auto_bind(S)", "cross_thread(S)"} <= set(names)
