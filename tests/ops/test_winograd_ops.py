"""Winograd's three kernels against the direct convolution, in the te reference and compiled."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import ops, te
from tilecraft.errors import TeError
from tilecraft.ops import winograd
from tilecraft.search.default import default_schedule


def direct(x, w, padding):
    data, kernel = te.placeholder(x.shape, name="x"), te.placeholder(w.shape, name="w")
    dag = tc.ComputeDAG([data, kernel, ops.conv2d_nhwc(data, kernel, padding=padding)])
    return dag.evaluate_numpy([x, w])[0]


def stages(x, w, m, padding):
    """The three DAGs of F(m, 3) on ``x`` and ``w`` with their inputs, the next stage's input
    computed by the reference evaluator."""
    alpha = (m + 2) ** 2
    data, into = te.placeholder(x.shape, name="x"), te.placeholder((alpha, alpha), name="into")
    first = tc.ComputeDAG([data, into, winograd.winograd_input(data, into, m, padding)])
    first_inputs = [x, winograd.input_transform(m)]
    tiles = first.evaluate_numpy(first_inputs)[0]
    v, u = te.placeholder(tiles.shape, name="v"), te.placeholder((alpha, *w.shape[2:]), name="u")
    second = tc.ComputeDAG([v, u, winograd.winograd_matmul(v, u)])
    second_inputs = [tiles, winograd.winograd_weights(w, m)]
    products = second.evaluate_numpy(second_inputs)[0]
    expected_shape = direct(x, w, padding).shape
    product, back = te.placeholder(products.shape, name="m"), te.placeholder((m * m, alpha), name="back")
    third = tc.ComputeDAG([product, back, winograd.winograd_output(product, back, m, expected_shape[:3])])
    return [(first, first_inputs), (second, second_inputs), (third, [products, winograd.output_transform(m)])]


@pytest.mark.parametrize("m", winograd.TILE_SIZES)
@pytest.mark.parametrize("shape, padding", [((1, 14, 14, 16), 1), ((2, 9, 7, 8), (1, 0, 2, 1)),
                                            ((1, 6, 11, 4), 0)])
def test_the_three_stages_compute_the_convolution(m, shape, padding):
    """Outputs that the tiles do not divide (7, 9, 11 wide), asymmetric and no padding, a batch of 2."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    w = rng.standard_normal((3, 3, shape[3], 6)).astype("float32")
    (_, _), (_, _), (third, inputs) = stages(x, w, m, padding)
    want = direct(x, w, padding)
    got = third.evaluate_numpy(inputs)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_each_stage_compiled_matches_its_reference(kernel_cache):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 10, 10, 16)).astype("float32")
    w = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    target = tc.Target.host()
    for dag, inputs in stages(x, w, 2, (1, 1, 1, 1)):
        func = tc.build(default_schedule(dag, target), target)
        np.testing.assert_allclose(func(*inputs), dag.evaluate_numpy(inputs)[0], rtol=1e-5, atol=1e-5)


def test_weights_are_transformed_by_g_g_gt():
    """F(2, 3) on a one-channel kernel, written out: U = G g G^T."""
    g = np.arange(9, dtype=np.float32).reshape(3, 3, 1, 1)
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    np.testing.assert_allclose(winograd.winograd_weights(g, 2)[:, 0, 0], (G @ g[:, :, 0, 0] @ G.T).reshape(16),
                               rtol=1e-6)


def test_mistakes_name_the_fix():
    x = te.placeholder((1, 8, 8, 4), name="x")
    with pytest.raises(TeError, match="tile size 3 is not one of"):
        winograd.input_transform(3)
    with pytest.raises(TeError, match=r"must be \[16, 16\] for tiles of 2: ops.winograd.input_transform\(2\)"):
        winograd.winograd_input(x, te.placeholder((36, 36), name="t"), 2, (1, 1, 1, 1))
    with pytest.raises(TeError, match=r"weights u \(16, 5, 8\) must be \[16, 4, F\]"):
        winograd.winograd_matmul(te.placeholder((16, 16, 4), name="v"), te.placeholder((16, 5, 8), name="u"))
    with pytest.raises(TeError, match="HWIO"):
        winograd.winograd_weights(np.zeros((5, 5, 1, 1), np.float32), 2)
    with pytest.raises(TeError, match="do not fit tiles of 2"):
        winograd.winograd_output(te.placeholder((16, 15, 4), name="p"), te.placeholder((4, 16), name="b"), 2,
                                 (1, 8, 8))
