"""One test per user mistake: the exception type, and a message naming the thing and the fix."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te


def _matmul_relu():
    A = te.placeholder((16, 12), name="A")
    B = te.placeholder((12, 8), name="B")
    k = te.reduce_axis((0, 12), name="k")
    M = te.compute((16, 8), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                   attrs={"layout_free_placeholders": [B]})
    O = te.compute((16, 8), lambda i, j: te.max(M[i, j], 0.0), name="relu")
    return tc.ComputeDAG([A, B, O])


def _two_consumers():
    A = te.placeholder((8, 8), name="A")
    E = te.compute((8, 8), lambda i, j: A[i, j] * 2.0, name="double")
    F = te.compute((8, 8), lambda i, j: E[i, j] + 1.0, name="plus")
    G = te.compute((8, 8), lambda i, j: E[i, j] - 1.0, name="minus")
    return tc.ComputeDAG([A, F, G])


def _sch(dag=None):
    return tc.Schedule(dag or _matmul_relu(), seed=0)


def test_split_of_a_loop_that_was_split():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    sch.split(i, [None, 4])
    with pytest.raises(tc.ScheduleError, match=r"loop i of block matmul no longer exists.*use the loops returned"):
        sch.split(i, [None, 2])


def test_vectorize_reduction_loop():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    with pytest.raises(tc.ScheduleError, match=r"cannot vectorize loop k of block matmul.*reduction.*spatial loop"):
        sch.vectorize(k)


def test_parallel_reduction_loop():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    with pytest.raises(tc.ScheduleError, match=r"cannot parallel loop k of block matmul.*parallel a spatial loop"):
        sch.parallel(k)


def test_compute_at_loop_not_enclosing_consumer():
    A = te.placeholder((8, 8), name="A")
    E = te.compute((8, 8), lambda i, j: A[i, j] * 2.0, name="double")
    F = te.compute((8, 8), lambda i, j: E[i, j] + 1.0, name="plus")
    H = te.compute((8, 8), lambda i, j: A[i, j] + 3.0, name="other")
    sch = _sch(tc.ComputeDAG([A, F, H]))
    (oi, oj) = sch.get_loops(sch.get_block("other"))
    with pytest.raises(tc.ScheduleError,
                       match=r"loop i does not enclose block plus, which reads double.*every consumer \(plus\)"):
        sch.compute_at(sch.get_block("double"), oi)


def test_compute_at_a_loop_missing_one_of_two_consumers():
    sch = _sch(_two_consumers())
    i, j = sch.get_loops(sch.get_block("plus"))
    with pytest.raises(tc.ScheduleError, match=r"does not enclose block minus, which reads double.*"
                                               r"every consumer \(plus, minus\)"):
        sch.compute_at(sch.get_block("double"), i)


def test_reorder_loops_of_different_blocks():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    ri, rj = sch.get_loops(sch.get_block("relu"))
    with pytest.raises(tc.ScheduleError, match=r"reorder: all loops must belong to the same block"):
        sch.reorder(i, rj)


def test_fuse_non_adjacent_loops():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("relu")) + [None]
    b = sch.get_block("matmul")
    mi, mj, mk = sch.get_loops(b)
    sch.reorder(mi, mk, mj)
    with pytest.raises(tc.ScheduleError, match=r"fuse of block matmul: loops i, j are not adjacent.*reorder first"):
        sch.fuse(mi, mj)


def test_fuse_spatial_with_reduction():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    with pytest.raises(tc.ScheduleError, match=r"fuse of block matmul: cannot fuse spatial and reduction"):
        sch.fuse(j, k)


def test_reverse_compute_at_inside_reduction_loop():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    sch.reorder(k, i, j)
    with pytest.raises(tc.ScheduleError, match=r"loop i is inside reduction loop k of block matmul.*partial sums"
                                               r".*outside all reduction loops"):
        sch.reverse_compute_at(sch.get_block("relu"), i)


def test_compute_inline_of_output():
    sch = _sch()
    with pytest.raises(tc.ScheduleError, match=r"block relu writes an output.*only intermediate blocks"):
        sch.compute_inline(sch.get_block("relu"))


def test_compute_inline_of_reduction():
    A = te.placeholder((8, 8), name="A")
    k = te.reduce_axis((0, 8), name="k")
    S = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="row_sum")
    O = te.compute((8,), lambda i: S[i] * 2.0, name="scale")
    sch = _sch(tc.ComputeDAG([A, O]))
    with pytest.raises(tc.ScheduleError, match=r"block row_sum is a reduction.*use compute_at instead"):
        sch.compute_inline(sch.get_block("row_sum"))


def test_transform_layout_of_non_layout_free_placeholder():
    sch = _sch()
    with pytest.raises(tc.ScheduleError, match=r"A is not a layout-free placeholder.*layout_free_placeholders"):
        sch.transform_layout(sch.get_block("matmul"), ("read", 0), lambda i, k: (k, i))


def test_get_block_unknown_name_lists_blocks():
    sch = _sch()
    with pytest.raises(tc.ScheduleError, match=r"no block named 'conv'.*the blocks are: matmul, relu"):
        sch.get_block("conv")


def test_split_factors_too_small():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    with pytest.raises(tc.ScheduleError, match=r"split of loop i \(extent 16\) by \[3, 4\].*12 < 16.*use None"):
        sch.split(i, [3, 4])


def test_kernel_wrong_shape_dtype_count(kernel_cache):
    dag = _matmul_relu()
    f = tc.build(_sch(dag), cache_dir=kernel_cache)
    A, B = dag.random_inputs(np.random.default_rng(0))
    with pytest.raises((TypeError, ValueError), match=r"'A'.*shape"):
        f(A[:8], B)
    with pytest.raises((TypeError, ValueError), match=r"'B'.*float32"):
        f(A, B.astype(np.float64))
    with pytest.raises(TypeError, match=r"takes its inputs \(A, B\).*got 1 array"):
        f(A)


def test_out_of_bounds_read_at_definition():
    A = te.placeholder((8, 8), name="A")
    with pytest.raises(tc.TeError, match=r"A"):
        te.compute((8, 8), lambda i, j: A[i + 1, j], name="shifted")


def test_bad_target_string():
    with pytest.raises(tc.TargetError, match=r"-mcpu=pentium1 is unknown.*known CPUs"):
        tc.Target("llvm -mcpu=pentium1")


def test_failed_primitive_leaves_schedule_unchanged():
    sch = _sch()
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    i0, i1 = sch.split(i, [None, 4])
    relu = sch.get_block("relu")
    before_text, before_state, steps = str(tc.lower(sch)), sch.state, len(sch.trace.steps)
    attempts = [
        lambda: sch.vectorize(k),
        lambda: sch.fuse(i1, k),
        lambda: sch.split(i, [None, 2]),
        lambda: sch.compute_inline(relu),
        lambda: sch.split(j, [2, 2]),
    ]
    for attempt in attempts:
        steps = len(sch.trace.steps)
        with pytest.raises(tc.ScheduleError):
            attempt()
        assert sch.state is before_state
        assert len(sch.trace.steps) == steps
    assert str(tc.lower(sch)) == before_text
