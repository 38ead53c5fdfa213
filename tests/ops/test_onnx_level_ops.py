"""The operators added for model import: math functions, power, truncating division, slicing, take, broadcast."""

import math

import numpy as np
import pytest

from tilecraft import ops, te
from tilecraft.errors import TeError
from tilecraft.te.reference import evaluate


def run(out, feeds):
    return evaluate(out, dict(feeds))[out]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_math_functions(rng):
    X = te.placeholder((3, 5), name="X")
    x = rng.uniform(0.1, 3, (3, 5)).astype("float32")
    erf = np.vectorize(math.erf)
    cases = {ops.sqrt: np.sqrt(x), ops.exp: np.exp(x), ops.log: np.log(x), ops.erf: erf(x),
             ops.abs: np.abs(x - 1), ops.negative: -x}
    for op, expected in cases.items():
        source = x - 1 if op is ops.abs else x
        np.testing.assert_allclose(run(op(X), {X: source}), expected, rtol=1e-5, atol=1e-6)


def test_gelu_tanh_approximation(rng):
    X = te.placeholder((4, 6), name="X")
    x = rng.standard_normal((4, 6)).astype("float32") * 3
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(run(ops.gelu(X, approximate="tanh"), {X: x}), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(TeError, match="approximate='fast' is unknown"):
        ops.gelu(X, approximate="fast")


def test_clip_with_one_open_bound(rng):
    X = te.placeholder((10,), name="X")
    x = rng.standard_normal(10).astype("float32")
    np.testing.assert_array_equal(run(ops.clip(X, None, 0.5), {X: x}), np.minimum(x, 0.5))
    np.testing.assert_array_equal(run(ops.clip(X, -0.5, None), {X: x}), np.maximum(x, -0.5))


def test_power_broadcasts(rng):
    X, Y = te.placeholder((2, 3), name="X"), te.placeholder((3,), name="Y")
    x, y = rng.uniform(0.5, 2, (2, 3)).astype("float32"), np.array([0.5, 2, 3], "float32")
    np.testing.assert_allclose(run(ops.power(X, Y), {X: x, Y: y}), x**y, rtol=1e-6)
    np.testing.assert_allclose(run(ops.power(X, 2.0), {X: x}), x**2, rtol=1e-6)


def test_truncate_divide_rounds_toward_zero():
    A, B = te.placeholder((4,), name="A", dtype="int32"), te.placeholder((4,), name="B", dtype="int32")
    a, b = np.array([-7, 7, -7, 6], "int32"), np.array([2, 2, -2, -3], "int32")
    np.testing.assert_array_equal(run(ops.truncate_divide(A, B), {A: a, B: b}), np.trunc(a / b).astype("int32"))


@pytest.mark.parametrize("begin, end, strides, axes", [
    ((1,), (3,), None, None),
    ((0, -1), (4, -100), (2, -2), (2, 1)),
    ((-2,), (1000,), (1,), (-1,)),
    ((3,), (-1000,), (-1,), (0,)),
])
def test_strided_slice_matches_python_slicing(rng, begin, end, strides, axes):
    X = te.placeholder((4, 5, 6), name="X")
    x = rng.standard_normal((4, 5, 6)).astype("float32")
    index = [slice(None)] * 3
    for k, axis in enumerate(axes or range(len(begin))):
        index[axis] = slice(begin[k], end[k], strides[k] if strides else 1)
    out = run(ops.strided_slice(X, begin, end, strides, axes), {X: x})
    np.testing.assert_array_equal(out, x[tuple(index)])


def test_strided_slice_errors():
    X = te.placeholder((4, 5), name="X")
    with pytest.raises(TeError, match="selects nothing"):
        ops.strided_slice(X, (3,), (1,))
    with pytest.raises(TeError, match="no stride may be 0"):
        ops.strided_slice(X, (0,), (1,), (0,))


@pytest.mark.parametrize("axis, index_shape", [(0, (2, 3)), (1, (4,)), (-1, ())])
def test_take_reads_at_run_time_indices(rng, axis, index_shape):
    data = te.placeholder((5, 4, 3), name="data")
    x = rng.standard_normal((5, 4, 3)).astype("float32")
    extent = x.shape[axis]
    idx = rng.integers(-extent, extent, index_shape).astype("int64")
    indices = te.placeholder(index_shape, name="indices", dtype="int64")
    np.testing.assert_array_equal(run(ops.take(data, indices, axis), {data: x, indices: idx}),
                                  np.take(x, idx, axis=axis))
    with pytest.raises(TeError, match="cast it to int32 or int64"):
        ops.take(data, te.placeholder((2,), name="f"))


def test_broadcast_to(rng):
    X = te.placeholder((3, 1), name="X")
    x = rng.standard_normal((3, 1)).astype("float32")
    np.testing.assert_array_equal(run(ops.broadcast_to(X, (2, 3, 4)), {X: x}), np.broadcast_to(x, (2, 3, 4)))
    with pytest.raises(TeError, match="cannot be broadcast to"):
        ops.broadcast_to(X, (1, 1))


def test_floor_mod_and_fmod_take_the_sign_of_divisor_and_dividend():
    X, Y = te.placeholder((6,), name="X"), te.placeholder((6,), name="Y")
    x = np.array([-4.5, 7.0, 5.0, 4.5, -3.0, 3.0], "float32")
    y = np.array([2.0, -3.0, 8.0, -2.0, np.inf, -np.inf], "float32")
    np.testing.assert_allclose(run(ops.binary(X, Y, "floor_mod"), {X: x, Y: y}), np.mod(x, y))
    finite = np.where(np.isinf(y), 1.5, y).astype("float32")
    np.testing.assert_allclose(run(ops.binary(X, Y, "fmod"), {X: x, Y: finite}), np.fmod(x, finite), rtol=1e-6)


def test_where_broadcasts_its_three_operands(rng):
    C, X = te.placeholder((3, 1), name="C", dtype="bool"), te.placeholder((4,), name="X")
    Y = te.placeholder((), name="Y")
    c, x, y = rng.random((3, 1)) > 0.5, rng.standard_normal(4).astype("float32"), np.array(2.0, "float32")
    np.testing.assert_array_equal(run(ops.where(C, X, Y), {C: c, X: x, Y: y}), np.where(c, x, y))


def test_unknown_element_wise_functions_are_named_with_the_known_ones():
    X = te.placeholder((3,), name="X")
    with pytest.raises(TeError, match=r"binary: unknown function 'hypot'; use one of maximum, minimum"):
        ops.binary(X, X, "hypot")
    with pytest.raises(TeError, match=r"unary: unknown function 'round'; use one of floor, ceil"):
        ops.unary(X, "round")


def test_argmax_takes_the_first_or_the_last_of_equal_values():
    X = te.placeholder((2, 4), name="X")
    x = np.array([[1, 3, 3, 0], [2, 2, -1, 2]], "float32")
    np.testing.assert_array_equal(run(ops.argmax(X, axis=1, keepdims=False), {X: x}), [1, 0])
    np.testing.assert_array_equal(run(ops.argmax(X, axis=1, select_last_index=True), {X: x}), [[2], [3]])
    np.testing.assert_array_equal(run(ops.argmin(X, axis=0), {X: x}), [[0, 1, 1, 0]])


def test_cumsum_exclusive_and_reverse(rng):
    X = te.placeholder((3, 5), name="X")
    x = rng.standard_normal((3, 5)).astype("float32")
    np.testing.assert_allclose(run(ops.cumsum(X, axis=1), {X: x}), np.cumsum(x, 1), rtol=1e-5, atol=1e-6)
    reverse_exclusive = np.flip(np.cumsum(np.flip(x, 0), 0), 0) - x
    np.testing.assert_allclose(run(ops.cumsum(X, axis=0, exclusive=True, reverse=True), {X: x}), reverse_exclusive,
                               rtol=1e-5, atol=1e-6)
