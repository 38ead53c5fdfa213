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
