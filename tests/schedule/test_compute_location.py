"""sample_compute_location offers only locations the block can take: every candidate
applies, so the search never measures a schedule that cannot be built."""

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.schedule.schedule import INLINE, ROOT


def _matmul_relu():
    A = te.placeholder((16, 8), name="A")
    B = te.placeholder((8, 12), name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((16, 12), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((16, 12), lambda i, j: te.max(C[i, j], 0.0), name="D")
    return tc.ComputeDAG([A, B, D])


def test_a_block_holding_others_is_never_offered_inline(kernel_cache):
    dag = _matmul_relu()
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
