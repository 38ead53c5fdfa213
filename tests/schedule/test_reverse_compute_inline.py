"""reverse_compute_inline: an element-wise consumer merged into its producer; into a sum, only a
consumer that adds a value to it (a bias, a residual), which joins the sum's first term."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te


def _matmul_then(epilogue, reduce=te.sum):
    """A 12x40 @ 40x10 product, then ``epilogue(C, bias, R, i, j)`` as the output."""
    A, B = te.placeholder((12, 40), name="A"), te.placeholder((40, 10), name="B")
    bias, R = te.placeholder((10,), name="bias"), te.placeholder((12, 10), name="R")
    k = te.reduce_axis((0, 40), name="k")
    C = te.compute((12, 10), lambda i, j: reduce(A[i, k] * B[k, j], axis=k), name="C")
    out = te.compute((12, 10), lambda i, j: epilogue(C, bias, R, i, j), name="out")
    return tc.ComputeDAG([A, B, bias, R, out])


def _check(sch):
    inputs = sch.dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.build(sch)(*inputs), sch.dag.evaluate_numpy(inputs)[0], rtol=1e-5, atol=1e-5)


def test_an_element_wise_consumer_is_merged_into_its_element_wise_producer():
    A = te.placeholder((6, 8), name="A")
    P = te.compute((6, 8), lambda i, j: A[i, j] + 1.0, name="P")
    sch = tc.Schedule(tc.ComputeDAG([A, te.compute((6, 8), lambda i, j: P[i, j] * 2.0, name="O")]))
    sch.reverse_compute_inline(sch.get_block("O"))
    assert "O" not in {stage.name for stage in sch.state.stages} and "O[" in str(tc.lower(sch))
    _check(sch)


@pytest.mark.parametrize("split", [False, True])
def test_a_bias_and_a_residual_added_to_a_sum_join_its_first_term(split):
    sch = tc.Schedule(_matmul_then(lambda C, bias, R, i, j: R[i, j] + (C[i, j] + bias[j])))
    if split:  # the first term is the first of every reduction loop, wherever they are
        i, j, k = sch.get_loops(sch.get_block("C"))
        ko, ki = sch.split(k, [None, 8])
        sch.reorder(ko, i, ki, j)
    sch.reverse_compute_inline(sch.get_block("out"))
    text = str(tc.lower(sch))
    assert "select(" in text and "== 0), (R[i, j]+bias[j]), 0.0f)" in text and "C[" not in text
    _check(sch)


@pytest.mark.parametrize("epilogue,what", [
    (lambda C, bias, R, i, j: te.max(C[i, j] + bias[j], te.const(0.0)), "a ReLU"),
    (lambda C, bias, R, i, j: C[i, j] * 2.0, "a scale"),
    (lambda C, bias, R, i, j: C[i, j] + C[i, j], "the sum read twice")])
def test_a_consumer_that_does_more_than_add_to_a_sum_is_refused(epilogue, what):
    sch = tc.Schedule(_matmul_then(epilogue))
    with pytest.raises(tc.ScheduleError, match="producer C is a reduction; only a block that adds a value to a sum"):
        sch.reverse_compute_inline(sch.get_block("out"))


def test_a_value_added_to_a_maximum_is_refused():
    sch = tc.Schedule(_matmul_then(lambda C, bias, R, i, j: C[i, j] + bias[j], reduce=te.max))
    with pytest.raises(tc.ScheduleError, match="only a block that adds a value to a sum"):
        sch.reverse_compute_inline(sch.get_block("out"))


def test_a_consumer_that_reads_part_of_its_producer_is_refused():
    """A crop (a product padded to whole tiles) covers less than its producer's loops would."""
    A = te.placeholder((8, 8), name="A")
    P = te.compute((8, 8), lambda i, j: A[i, j] + 1.0, name="P")
    sch = tc.Schedule(tc.ComputeDAG([A, te.compute((5, 8), lambda i, j: P[i, j], name="O")]))
    with pytest.raises(tc.ScheduleError, match=r"block O \[5, 8\] reads part of P \[8, 8\]"):
        sch.reverse_compute_inline(sch.get_block("O"))
