"""reverse_compute_at: the consumer runs over the box its producer wrote inside the loop,
so a loop inside which the producer's writes leave holes is refused."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te


def _add_then_double(rows: int):
    A = te.placeholder((rows, 6), name="A")
    P = te.compute((rows, 6), lambda i, j: A[i, j] + 1.0, name="P")
    O = te.compute((rows, 6), lambda i, j: P[i, j] * 2.0, name="O")
    return tc.ComputeDAG([A, O])


def _refused(sch, loop):
    before, steps = sch.state, len(sch.trace.steps)
    with pytest.raises(tc.ScheduleError, match=r"reverse_compute_at of block O.*do not form a box.*"
                                               r"sweep contiguous ranges"):
        sch.reverse_compute_at(sch.get_block("O"), loop)
    assert sch.state is before and len(sch.trace.steps) == steps + 1  # only the get_block


def test_loop_whose_inner_loops_stride_over_rows_is_refused():
    # inside i_1, P writes rows i_1, i_1 + 2, ...: O would also read the rows in between
    sch = tc.Schedule(_add_then_double(8))
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 2])
    sch.reorder(i1, i0, j)
    _refused(sch, i1)


def test_loop_whose_inner_split_guard_skips_a_row_is_refused():
    # i_1 (extent 5) split by 2 runs 6 rows and guards the last away: 5 of 6 rows are written
    sch = tc.Schedule(_add_then_double(10))
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 5])
    sch.split(i1, [None, 2])
    _refused(sch, i0)


def test_loop_in_an_iteration_that_a_guard_skips_is_refused():
    # with i_1 = 5 skipped, the iteration (i_1_0, i_1_1, i_0) = (2, 1, 0) writes no row, but
    # O would still run there and overwrite row 5, computed earlier, with garbage
    sch = tc.Schedule(_add_then_double(10))
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 5])
    i10, i11 = sch.split(i1, [None, 2])
    sch.reorder(i10, i11, i0, j)
    _refused(sch, i0)


def test_partial_last_tile_of_a_non_dividing_split_is_a_box(kernel_cache):
    dag = _add_then_double(8)
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 3])
    sch.reverse_compute_at(sch.get_block("O"), i0)
    inputs = dag.random_inputs(np.random.default_rng(0))
    got = tc.build(sch, cache_dir=kernel_cache)(*inputs)
    np.testing.assert_allclose(got, dag.evaluate_numpy(inputs)[0], rtol=1e-6)


def test_split_piece_of_extent_one_does_not_break_the_box(kernel_cache):
    # inside column loop j, rows are i_1 + 8 * i_0 with i_0 always 0: a column of 8 rows
    dag = _add_then_double(8)
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 8])
    sch.reorder(j, i1, i0)
    sch.reverse_compute_at(sch.get_block("O"), j)
    inputs = dag.random_inputs(np.random.default_rng(0))
    got = tc.build(sch, cache_dir=kernel_cache)(*inputs)
    np.testing.assert_allclose(got, dag.evaluate_numpy(inputs)[0], rtol=1e-6)
