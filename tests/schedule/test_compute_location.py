"""sample_compute_location offers only locations the block can take: every candidate
applies, so the search never measures a schedule that cannot be built."""

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.schedule.schedule import INLINE, ROOT

from small_dags import matmul_relu  # tests/schedule/small_dags.py


def test_a_block_holding_others_is_never_offered_inline(kernel_cache):
    dag = matmul_relu()[0]
    inputs = dag.random_inputs()
    (expected,) = dag.evaluate_numpy(inputs)
    sch = tc.Schedule(dag)
    sch.cache_write(sch.get_block("C"), 0, "local")
    write_back = sch.get_block("C_local")
    assert INLINE in sch.compute_location_candidates(write_back)  # nothing is attached to it yet
    i, _ = sch.get_loops(write_back)
    sch.compute_at(sch.get_block("C"), i)
    candidates = sch.compute_location_candidates(sch.get_block("C_local"))
    assert INLINE not in candidates and ROOT in candidates and len(candidates) > 2
    for decision in candidates:  # each one applies and computes what NumPy computes
        trial = sch.copy()
        block = trial.get_block("C_local")
        trial.compute_at(block, trial.sample_compute_location(block, decision))
        np.testing.assert_allclose(tc.build(trial, cache_dir=kernel_cache)(*inputs), expected, rtol=1e-5)


def _softmax_rows_schedule():
    """Softmax with every stage computed inside the output's row loop: ``softmax_exp`` and
    ``softmax_max`` each have two consumers there (the sum's partial block and the division)."""
    from tilecraft.ops.nn import softmax

    x = te.placeholder((3, 5, 24), name="x")
    dag = tc.ComputeDAG([x, softmax(x)])
    sch = tc.Schedule(dag)
    for name in ("softmax_max", "softmax_sum"):
        k0, k1 = sch.split(sch.get_loops(sch.get_block(name))[-1], [None, 8])
        sch.rfactor(k1, 2)
    rows, columns = sch.get_loops(sch.get_block("softmax"))[:2], sch.get_loops(sch.get_block("softmax"))[-1]
    row = sch.fuse(*rows)
    sch.parallel(row)
    sch.vectorize(columns)
    for name in ("softmax_sum", "softmax_sum_rf"):
        sch.compute_at(sch.get_block(name), row)
    return dag, sch, row


def test_a_block_read_by_two_consumers_is_computed_at_a_loop_enclosing_both(kernel_cache):
    dag, sch, row = _softmax_rows_schedule()
    exp = sch.get_block("softmax_exp")
    assert row.id in sch.compute_location_candidates(exp)  # it encloses the division and the sum's partials
    sch.compute_at(exp, row)
    for name in ("softmax_max", "softmax_max_rf"):
        sch.compute_at(sch.get_block(name), row)
    kernel = tc.build(sch, cache_dir=kernel_cache)
    assert "softmax_exp: float32[1, 1, 24] (local)" in str(tc.lower(sch))  # one row at a time, not the tensor
    inputs = dag.random_inputs()
    np.testing.assert_allclose(kernel(*inputs), dag.evaluate_numpy(inputs)[0], rtol=1e-5, atol=1e-7)


def test_a_block_read_by_two_consumers_is_offered_only_loops_enclosing_both(kernel_cache):
    dag, sch, row = _softmax_rows_schedule()
    inputs = dag.random_inputs()
    (expected,) = dag.evaluate_numpy(inputs)
    candidates = sch.compute_location_candidates(sch.get_block("softmax_exp"))
    assert candidates == [ROOT, INLINE, row.id]  # the division's vector loop does not hold the sum's partials
    for decision in candidates:
        trial = sch.copy()
        block = trial.get_block("softmax_exp")
        trial.compute_at(block, trial.sample_compute_location(block, decision))
        np.testing.assert_allclose(tc.build(trial, cache_dir=kernel_cache)(*inputs), expected, rtol=1e-5, atol=1e-7)


def _softmax_sum_in_rows():
    """Softmax (rows of 40) with its output's loops split: row = (r0, r1), column = (c0, c1)."""
    from tilecraft.ops.nn import softmax

    x = te.placeholder((6, 40), name="x")
    dag = tc.ComputeDAG([x, softmax(x)])
    sch = tc.Schedule(dag)
    sch.compute_inline(sch.get_block("softmax_exp"))
    row, column = sch.get_loops(sch.get_block("softmax"))
    r0, r1 = sch.split(row, [None, 2])
    c0, c1 = sch.split(column, [None, 8])
    sch.reorder(r0, c0, r1, c1)
    return dag, sch, (r0, c0, r1, c1)


def test_a_reduction_is_never_offered_a_loop_that_would_repeat_it(kernel_cache):
    """The row sum is read at [row]: at a column loop, or at a row loop below one, every
    column tile would sum the same row again (a 2048x2000 softmax ran 1,000x slower)."""
    dag, sch, (r0, c0, r1, c1) = _softmax_sum_in_rows()
    total = sch.get_block("softmax_sum")
    assert sch.compute_location_candidates(total) == [ROOT, r0.id]
    assert sch.compute_location_candidates(total, recomputing=True) == [ROOT, r0.id, c0.id, r1.id, c1.id]
    inputs = dag.random_inputs()
    (expected,) = dag.evaluate_numpy(inputs)
    for decision in (r0.id, c1.id):  # a recorded trace may still hold a repeating location, and replays
        trial = sch.copy()
        block = trial.get_block("softmax_sum")
        trial.compute_at(block, trial.sample_compute_location(block, decision))
        np.testing.assert_allclose(tc.build(trial, cache_dir=kernel_cache)(*inputs), expected, rtol=1e-5, atol=1e-7)


def test_an_element_wise_block_may_be_recomputed_below_a_loop_that_does_not_index_it():
    """Padding read at [row, column + k] by a 1-D convolution: the loop over output
    channels does not index it (computing it there only repeats it), but the loops nested
    inside stay on offer, trading recomputation for locality as Ansor's locations do."""
    x = te.placeholder((8, 16), name="x")
    w = te.placeholder((4, 3), name="w")
    padded = te.compute((8, 18), lambda i, j: te.if_then_else(te.all(j >= 1, j < 17), x[i, j - 1], 0.0),
                        name="padded")
    k = te.reduce_axis((0, 3), name="k")
    out = te.compute((4, 8, 16), lambda c, i, j: te.sum(padded[i, j + k] * w[c, k], axis=k), name="out")
    sch = tc.Schedule(tc.ComputeDAG([x, w, out]))
    c, i, j, k_loop = sch.get_loops(sch.get_block("out"))
    candidates = sch.compute_location_candidates(sch.get_block("padded"))
    assert candidates == [ROOT, INLINE, i.id, j.id, k_loop.id]
    assert c.id in sch.compute_location_candidates(sch.get_block("padded"), recomputing=True)
