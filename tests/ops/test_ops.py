import math

import numpy as np
import pytest

from tilecraft import ops, te
from tilecraft.errors import TeError
from tilecraft.te.reference import evaluate


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def placeholder(rng, shape, name, dtype="float32"):
    tensor = te.placeholder(shape, name=name, dtype=dtype)
    if dtype.startswith("int"):
        return tensor, rng.integers(-20, 20, shape).astype(dtype)
    return tensor, rng.standard_normal(shape).astype(dtype)


def as_pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def as_pads(padding):
    padding = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    return padding * 2 if len(padding) == 2 else padding


def run(out, feeds):
    return evaluate(out, dict(feeds))[out]


def stage_names(out):
    names, stack = [], [out]
    while stack:
        tensor = stack.pop()
        if isinstance(tensor.op, te.ComputeOp):
            names.append(tensor.name)
            stack.extend(tensor.op.input_tensors)
    return sorted(set(names))


# ---- independent NumPy formulas -------------------------------------------------------------


def np_conv2d_nchw(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    (sh, sw), (dh, dw) = stride, dilation
    F, CG, KH, KW = w.shape
    OH = (xp.shape[2] - dh * (KH - 1) - 1) // sh + 1
    OW = (xp.shape[3] - dw * (KW - 1) - 1) // sw + 1
    FG = F // groups
    out = np.zeros((x.shape[0], F, OH, OW))
    for g in range(groups):
        for i in range(KH):
            for j in range(KW):
                patch = xp[:, g * CG:(g + 1) * CG, i * dh:i * dh + sh * (OH - 1) + 1:sh,
                           j * dw:j * dw + sw * (OW - 1) + 1:sw]
                out[:, g * FG:(g + 1) * FG] += np.einsum("nchw,fc->nfhw", patch, w[g * FG:(g + 1) * FG, :, i, j])
    return out


def np_conv2d_transpose(x, w, stride, pads, output_padding):
    N, CI, H, W = x.shape
    _, CO, KH, KW = w.shape
    (sh, sw), (oph, opw) = stride, output_padding
    full = np.zeros((N, CO, (H - 1) * sh + KH + oph, (W - 1) * sw + KW + opw))
    for i in range(H):
        for j in range(W):
            full[:, :, i * sh:i * sh + KH, j * sw:j * sw + KW] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    top, left, bottom, right = pads
    return full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right]


def np_pool(x, kernel, stride, pads, reducer, pad_value):
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    OH = (xp.shape[2] - kernel[0]) // stride[0] + 1
    OW = (xp.shape[3] - kernel[1]) // stride[1] + 1
    out = np.zeros(x.shape[:2] + (OH, OW))
    for y in range(OH):
        for x_ in range(OW):
            window = xp[:, :, y * stride[0]:y * stride[0] + kernel[0], x_ * stride[1]:x_ * stride[1] + kernel[1]]
            out[:, :, y, x_] = reducer(window, y, x_)
    return out


# ---- linear algebra -------------------------------------------------------------------------


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul(rng, transpose_a, transpose_b):
    A, a = placeholder(rng, (5, 3) if transpose_a else (3, 5), "A")
    B, b = placeholder(rng, (4, 5) if transpose_b else (5, 4), "B")
    out = run(ops.matmul(A, B, transpose_a, transpose_b), {A: a, B: b})
    np.testing.assert_allclose(out, (a.T if transpose_a else a) @ (b.T if transpose_b else b), rtol=1e-5)


def test_dense_with_bias_marks_weight_layout_free(rng):
    X, x = placeholder(rng, (3, 6), "X")
    W, w = placeholder(rng, (4, 6), "W")
    bias, b = placeholder(rng, (4,), "bias")
    out = ops.dense(X, W, bias)
    assert out.name == "dense_bias_add"
    dense = out.op.input_tensors[0]
    assert dense.op.attrs["layout_free_placeholders"] == [W]
    np.testing.assert_allclose(run(out, {X: x, W: w, bias: b}), x @ w.T + b, rtol=1e-5)
    np.testing.assert_allclose(run(ops.dense(X, W), {X: x, W: w}), x @ w.T, rtol=1e-5)


def test_batch_matmul_with_broadcast_batch(rng):
    A, a = placeholder(rng, (3, 2, 5), "A")
    B, b = placeholder(rng, (1, 4, 5), "B")
    out = run(ops.batch_matmul(A, B, transpose_b=True), {A: a, B: b})
    np.testing.assert_allclose(out, a @ np.swapaxes(b, 1, 2), rtol=1e-5)
    C, c = placeholder(rng, (3, 5, 2), "C")
    out = run(ops.batch_matmul(C, B, transpose_a=True, transpose_b=True), {C: c, B: b})
    np.testing.assert_allclose(out, np.swapaxes(c, 1, 2) @ np.swapaxes(b, 1, 2), rtol=1e-5)


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, True)])
def test_products_padded_to_whole_tiles_compute_the_same(rng, transpose_a, transpose_b):
    """3 x 5 x 4 padded to 4 x 8 x 4: the operands grown with zeros, the product cropped."""
    A, a = placeholder(rng, (5, 3) if transpose_a else (3, 5), "A")
    B, b = placeholder(rng, (4, 5) if transpose_b else (5, 4), "B")
    out = ops.matmul(A, B, transpose_a, transpose_b, multiple=4)
    assert stage_names(out) == ["matmul", "matmul_a", "matmul_b", "matmul_padded"]
    np.testing.assert_allclose(run(out, {A: a, B: b}), (a.T if transpose_a else a) @ (b.T if transpose_b else b),
                               rtol=1e-5)
    C, c = placeholder(rng, (1, 5, 2) if transpose_a else (1, 2, 5), "C")
    D, d = placeholder(rng, (3, 4, 5), "D")
    out = ops.batch_matmul(C, D, transpose_a, transpose_b=True, multiple=4)  # a batch of 1 broadcast, 4 columns whole
    np.testing.assert_allclose(run(out, {C: c, D: d}), (np.swapaxes(c, 1, 2) if transpose_a else c)
                               @ np.swapaxes(d, 1, 2), rtol=1e-5)
    X, x = placeholder(rng, (3, 6), "X")
    W, w = placeholder(rng, (5, 6), "W")
    bias, v = placeholder(rng, (5,), "bias")
    out = ops.dense(X, W, bias, multiple=4)
    assert stage_names(out) == ["dense", "dense_a", "dense_b", "dense_bias_add", "dense_padded"]
    np.testing.assert_allclose(run(out, {X: x, W: w, bias: v}), x @ w.T + v, rtol=1e-5)
    with pytest.raises(TeError, match="multiple must be a positive int"):
        ops.matmul(A, B, transpose_a, transpose_b, multiple=-2)


def test_linalg_errors():
    A = te.placeholder((3, 4), name="A")
    B = te.placeholder((5, 6), name="B")
    with pytest.raises(TeError, match=r"A \(3, 4\) gives 4 but B \(5, 6\) gives 5"):
        ops.matmul(A, B)
    with pytest.raises(TeError, match="A is float32 but I is int32"):
        ops.matmul(A, te.placeholder((4, 2), name="I", dtype="int32"))
    with pytest.raises(TeError, match="bias b"):
        ops.dense(A, te.placeholder((2, 4), name="W"), te.placeholder((3,), name="b"))
    with pytest.raises(TeError, match="cannot be broadcast"):
        ops.batch_matmul(te.placeholder((2, 3, 4), name="X"), te.placeholder((3, 4, 5), name="Y"))


# ---- convolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stride, padding, dilation, groups",
    [(1, 0, 1, 1), (1, 1, 1, 1), (2, (1, 2), 1, 1), ((2, 1), (0, 1, 2, 1), (2, 1), 1), (1, 1, 1, 2)],
)
def test_conv2d_nchw(rng, stride, padding, dilation, groups):
    data, x = placeholder(rng, (2, 4, 9, 8), "data")
    kernel, w = placeholder(rng, (6, 4 // groups, 3, 3), "kernel")
    out = ops.conv2d_nchw(data, kernel, stride, padding, dilation, groups)
    assert out.op.attrs["layout_free_placeholders"] == [kernel]
    pads = as_pads(padding)
    expected = np_conv2d_nchw(x, w, as_pair(stride), pads, as_pair(dilation), groups)
    assert stage_names(out) == (["conv2d", "conv2d_pad"] if any(pads) else ["conv2d"])
    np.testing.assert_allclose(run(out, {data: x, kernel: w}), expected, rtol=1e-5, atol=1e-5)


def test_conv2d_nhwc(rng):
    data, x = placeholder(rng, (2, 7, 8, 4), "data")
    kernel, w = placeholder(rng, (3, 2, 2, 6), "kernel")
    out = ops.conv2d_nhwc(data, kernel, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    expected = np_conv2d_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), (2, 1), (1, 0, 1, 0), (1, 2), 2)
    np.testing.assert_allclose(run(out, {data: x, kernel: w}), expected.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("multiple, stages", [
    (1, ["conv2d", "conv2d_im2col", "conv2d_pad", "conv2d_weights"]),
    (5, ["conv2d", "conv2d_im2col", "conv2d_pad", "conv2d_padded", "conv2d_weights"])])  # 48x24x6 to 50x25x10
def test_conv2d_nhwc_as_one_matrix_product(rng, multiple, stages):
    """Implicit GEMM: rows of output pixels by channels, each row the pixel's window times the
    kernel; its sizes padded to a multiple with zeros, the padding cropped."""
    data, x = placeholder(rng, (2, 7, 8, 4), "data")
    kernel, w = placeholder(rng, (3, 2, 4, 6), "kernel")
    out = ops.conv2d_nhwc_gemm(data, kernel, stride=(2, 1), padding=(1, 0), dilation=(1, 2), multiple=multiple)
    expected = np_conv2d_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), (2, 1), (1, 0, 1, 0), (1, 2), 1)
    assert stage_names(out) == stages
    np.testing.assert_allclose(run(out, {data: x, kernel: w}), expected.transpose(0, 2, 3, 1).reshape(-1, 6),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(TeError, match="multiple must be a positive int"):
        ops.conv2d_nhwc_gemm(data, kernel, multiple=0)


@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_conv2d_nchw(rng, multiplier):
    data, x = placeholder(rng, (2, 3, 7, 7), "data")
    kernel, w = placeholder(rng, (3, multiplier, 3, 3), "kernel")
    out = ops.depthwise_conv2d_nchw(data, kernel, stride=2, padding=1)
    expected = np_conv2d_nchw(x, w.reshape(3 * multiplier, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), groups=3)
    np.testing.assert_allclose(run(out, {data: x, kernel: w}), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "stride, padding, output_padding, kernel_size",
    [(1, 0, 0, 3), (2, 1, 1, 3), (2, (0, 1, 2, 0), (0, 1), 4), (3, 0, 2, 2), (1, 2, 0, 3)],
)
def test_conv2d_transpose_nchw(rng, stride, padding, output_padding, kernel_size):
    data, x = placeholder(rng, (2, 3, 5, 4), "data")
    kernel, w = placeholder(rng, (3, 2, kernel_size, kernel_size), "kernel")
    out = ops.conv2d_transpose_nchw(data, kernel, stride, padding, output_padding)
    expected = np_conv2d_transpose(x, w, as_pair(stride), as_pads(padding), as_pair(output_padding))
    assert out.shape == expected.shape
    np.testing.assert_allclose(run(out, {data: x, kernel: w}), expected, rtol=1e-5, atol=1e-5)


def test_conv_errors():
    data = te.placeholder((1, 4, 8, 8), name="data")
    with pytest.raises(TeError, match=r"data \(1, 4, 8, 8\) and kernel kernel \(6, 3, 3, 3\)"):
        ops.conv2d_nchw(data, te.placeholder((6, 3, 3, 3), name="kernel"))
    with pytest.raises(TeError, match="smaller than the dilated kernel"):
        ops.conv2d_nchw(data, te.placeholder((6, 4, 3, 3), name="k"), dilation=4)
    with pytest.raises(TeError, match="stride must be"):
        ops.conv2d_nchw(data, te.placeholder((6, 4, 3, 3), name="k"), stride=0)
    with pytest.raises(TeError, match="output_padding"):
        ops.conv2d_transpose_nchw(data, te.placeholder((4, 2, 3, 3), name="k"), stride=2, output_padding=2)
    with pytest.raises(TeError, match="must have the 4 channels"):
        ops.depthwise_conv2d_nchw(data, te.placeholder((3, 1, 3, 3), name="k"))


# ---- pooling, softmax, normalisation ----------------------------------------------------------


def test_max_pool2d(rng):
    data, x = placeholder(rng, (2, 3, 7, 8), "data")
    out = ops.max_pool2d(data, kernel=3, stride=2, padding=1)
    expected = np_pool(x, (3, 3), (2, 2), (1, 1, 1, 1), lambda w, y, x_: w.max(axis=(2, 3)), -np.inf)
    np.testing.assert_array_equal(run(out, {data: x}), expected)
    ints, i = placeholder(rng, (1, 2, 5, 5), "ints", "int32")
    expected = np_pool(i, (2, 2), (2, 2), (1, 1, 1, 1), lambda w, y, x_: w.max(axis=(2, 3)), -(2**31))
    np.testing.assert_array_equal(run(ops.max_pool2d(ints, 2, 2, 1), {ints: i}), expected)


@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d(rng, count_include_pad):
    data, x = placeholder(rng, (2, 3, 7, 6), "data")
    out = ops.avg_pool2d(data, kernel=(3, 2), stride=(2, 1), padding=(1, 1), count_include_pad=count_include_pad)
    valid = np_pool(np.ones_like(x), (3, 2), (2, 1), (1, 1, 1, 1), lambda w, y, x_: w.sum(axis=(2, 3)), 0)
    sums = np_pool(x, (3, 2), (2, 1), (1, 1, 1, 1), lambda w, y, x_: w.sum(axis=(2, 3)), 0)
    expected = sums / 6 if count_include_pad else sums / valid
    np.testing.assert_allclose(run(out, {data: x}), expected, rtol=1e-5, atol=1e-6)


def test_global_avg_pool2d(rng):
    data, x = placeholder(rng, (2, 3, 5, 4), "data")
    out = run(ops.global_avg_pool2d(data), {data: x})
    np.testing.assert_allclose(out, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_pool_errors():
    data = te.placeholder((1, 1, 4, 4), name="data")
    with pytest.raises(TeError, match="smaller than the kernel"):
        ops.max_pool2d(data, 2, 1, padding=2)
    with pytest.raises(TeError, match="must be a float"):
        ops.avg_pool2d(te.placeholder((1, 1, 4, 4), name="i", dtype="int32"), 2, 2)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(rng, axis):
    X, x = placeholder(rng, (4, 5, 3), "X")
    x = x * 20
    shifted = x - x.max(axis=axis, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=axis, keepdims=True)
    out = ops.softmax(X, axis)
    assert stage_names(out) == ["softmax", "softmax_exp", "softmax_max", "softmax_sum"]
    np.testing.assert_allclose(run(out, {X: x}), expected, rtol=1e-5, atol=1e-7)
    expected_log = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    np.testing.assert_allclose(run(ops.log_softmax(X, axis), {X: x}), expected_log, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, (1, 2)])
def test_layer_norm(rng, axis):
    X, x = placeholder(rng, (3, 4, 5), "X")
    axes = (2,) if axis == -1 else axis
    gamma, g = placeholder(rng, tuple(x.shape[d] for d in axes), "gamma")
    beta, b = placeholder(rng, g.shape, "beta")
    x64 = x.astype(np.float64) + 3
    expected = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(x64.var(axis=axes, keepdims=True) + 1e-5) * g + b
    out = run(ops.layer_norm(X, gamma, beta, axis=axis), {X: x + 3, gamma: g, beta: b})
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_shape_error():
    X = te.placeholder((3, 4), name="X")
    with pytest.raises(TeError, match=r"gamma \(3,\) must have the shape \(4,\)"):
        ops.layer_norm(X, te.placeholder((3,), name="gamma"), te.placeholder((4,), name="beta"))


def test_batch_norm_inference(rng):
    X, x = placeholder(rng, (2, 3, 4, 4), "X")
    gamma, g = placeholder(rng, (3,), "gamma")
    beta, b = placeholder(rng, (3,), "beta")
    mean, m = placeholder(rng, (3,), "mean")
    var, v = placeholder(rng, (3,), "var")
    v = np.abs(v)
    out = run(ops.batch_norm_inference(X, gamma, beta, mean, var, 1e-3), {X: x, gamma: g, beta: b, mean: m, var: v})
    c = (slice(None), None, None)
    expected = (x - m[c]) / np.sqrt(v[c] + 1e-3) * g[c] + b[c]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TeError, match=r"must have shape \(3,\)"):
        ops.batch_norm_inference(X, gamma, beta, mean, te.placeholder((4,), name="v4"))


# ---- element-wise -------------------------------------------------------------------------------


def test_activations(rng):
    X, x = placeholder(rng, (3, 7), "X")
    x = x * 3
    erf = np.vectorize(math.erf)
    cases = {
        ops.relu: np.maximum(x, 0),
        ops.sigmoid: 1 / (1 + np.exp(-x)),
        ops.tanh: np.tanh(x),
        ops.silu: x / (1 + np.exp(-x)),
        ops.gelu: 0.5 * x * (1 + erf(x / np.sqrt(2))),
    }
    for op, expected in cases.items():
        out = op(X)
        assert out.name == op.__name__ and out.dtype == "float32"
        np.testing.assert_allclose(run(out, {X: x}), expected, rtol=1e-5, atol=1e-6, err_msg=op.__name__)
    np.testing.assert_array_equal(run(ops.clip(X, -0.5, 1.0), {X: x}), np.clip(x, -0.5, 1.0))
    with pytest.raises(TeError, match="a_min 2 is above a_max 1"):
        ops.clip(X, 2, 1)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_relu_and_max_pool_of_16_bit_floats_and_relu_of_ints(rng, half):
    H, h = placeholder(rng, (8,), "H", half)
    out = run(ops.relu(H), {H: h})
    assert out.dtype == h.dtype
    np.testing.assert_array_equal(out, np.maximum(h.astype(np.float32), 0).astype(h.dtype))
    P, p = placeholder(rng, (1, 1, 4, 4), "P", half)  # padded with the type's lowest value
    pooled = run(ops.max_pool2d(P, 3, stride=2, padding=1), {P: p})
    np.testing.assert_array_equal(pooled[0, 0, 0, 0], p[0, 0, :2, :2].astype(np.float32).max().astype(p.dtype))
    I, i = placeholder(rng, (8,), "I", "int32")
    np.testing.assert_array_equal(run(ops.relu(I), {I: i}), np.maximum(i, 0))


def test_cast(rng):
    X, x = placeholder(rng, (6,), "X")
    x = x * 10
    out = ops.cast(X, "int32")
    assert out.dtype == "int32"
    np.testing.assert_array_equal(run(out, {X: x}), np.trunc(x).astype(np.int32))


@pytest.mark.parametrize("op, fn", [(ops.add, np.add), (ops.subtract, np.subtract), (ops.multiply, np.multiply),
                                    (ops.divide, np.divide)])
def test_broadcasting_binary(rng, op, fn):
    A, a = placeholder(rng, (4, 1, 3), "A")
    B, b = placeholder(rng, (5, 1), "B")
    b = b + np.sign(b) * 0.5
    np.testing.assert_allclose(run(op(A, B), {A: a, B: b}), fn(a, b), rtol=1e-6)
    np.testing.assert_allclose(run(op(A, 2.5), {A: a}), fn(a, np.float32(2.5)), rtol=1e-6)
    np.testing.assert_allclose(run(op(3, B), {B: b}), fn(np.float32(3), b), rtol=1e-6)


def test_integer_divide_floors(rng):
    I, i = placeholder(rng, (7,), "I", "int32")
    np.testing.assert_array_equal(run(ops.divide(I, 3), {I: i}), i // 3)


def test_broadcasting_errors():
    A = te.placeholder((4, 3), name="A")
    with pytest.raises(TeError, match=r"shapes \(4, 3\) and \(2,\) cannot be broadcast"):
        ops.add(A, te.placeholder((2,), name="B"))
    with pytest.raises(TeError, match="at least one operand"):
        ops.add(1, 2)


# ---- reductions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis, keepdims", [(None, False), (1, False), ((0, 2), True), (-1, True), ((2, 0), False)])
def test_reductions(rng, axis, keepdims):
    X, x = placeholder(rng, (3, 4, 5), "X")
    for op, fn in ((ops.sum, np.sum), (ops.mean, np.mean), (ops.max, np.max), (ops.min, np.min)):
        axes = tuple(sorted(a % 3 for a in axis)) if isinstance(axis, tuple) else axis
        expected = fn(x.astype(np.float64), axis=axes, keepdims=keepdims)
        out = run(op(X, axis, keepdims), {X: x})
        assert out.shape == np.shape(expected), op.__name__
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6, err_msg=op.__name__)


def test_reduction_errors():
    X = te.placeholder((3, 4), name="X")
    with pytest.raises(TeError, match="axis 2 is out of range"):
        ops.sum(X, 2)
    with pytest.raises(TeError, match="distinct axes"):
        ops.max(X, (1, -1))
    with pytest.raises(TeError, match="must be a float"):
        ops.mean(te.placeholder((3,), name="I", dtype="int32"))


# ---- data movement ------------------------------------------------------------------------------


def test_transpose(rng):
    X, x = placeholder(rng, (2, 3, 4), "X")
    np.testing.assert_array_equal(run(ops.transpose(X, (1, 2, 0)), {X: x}), x.transpose(1, 2, 0))
    np.testing.assert_array_equal(run(ops.transpose(X), {X: x}), x.T)
    with pytest.raises(TeError, match="not a permutation"):
        ops.transpose(X, (0, 0, 1))


@pytest.mark.parametrize("newshape", [(6, 4), (4, -1), (24,), (1, 2, 12, 1), (3, 2, 2, 2)])
def test_reshape(rng, newshape):
    X, x = placeholder(rng, (2, 3, 4), "X")
    np.testing.assert_array_equal(run(ops.reshape(X, newshape), {X: x}), x.reshape(newshape))


def test_reshape_error():
    with pytest.raises(TeError, match=r"cannot reshape X \(2, 3\) \(6 elements\) to \(4, -1\)"):
        ops.reshape(te.placeholder((2, 3), name="X"), (4, -1))


def test_concat(rng):
    A, a = placeholder(rng, (2, 3, 4), "A")
    B, b = placeholder(rng, (2, 1, 4), "B")
    C, c = placeholder(rng, (2, 2, 4), "C")
    out = run(ops.concat([A, B, C], axis=1), {A: a, B: b, C: c})
    np.testing.assert_array_equal(out, np.concatenate([a, b, c], axis=1))
    np.testing.assert_array_equal(run(ops.concat([A], axis=-1), {A: a}), a)
    with pytest.raises(TeError, match=r"B \(2, 1, 4\) does not match A \(2, 3, 4\) outside axis 0"):
        ops.concat([A, B], axis=0)


def test_pad(rng):
    X, x = placeholder(rng, (2, 3), "X")
    out = run(ops.pad(X, (1, 0), (2, 3), pad_value=-7.0), {X: x})
    np.testing.assert_array_equal(out, np.pad(x, ((1, 2), (0, 3)), constant_values=-7))
    np.testing.assert_array_equal(run(ops.pad(X, (1, 1)), {X: x}), np.pad(x, 1))
    I, i = placeholder(rng, (3,), "I", "int32")
    np.testing.assert_array_equal(run(ops.pad(I, (2,), (0,)), {I: i}), np.pad(i, (2, 0)))
    with pytest.raises(TeError, match="must each give 2 ints >= 0"):
        ops.pad(X, (1, -1))


def test_products_of_bfloat16_sum_into_float32_where_out_dtype_says(rng):
    """TVM's out_dtype: each operand cast, the sum kept in float32 and stored so."""
    A, a = placeholder(rng, (2, 16, 24), "A", "bfloat16")
    B, b = placeholder(rng, (2, 24, 8), "B", "bfloat16")
    M, m = placeholder(rng, (16, 24), "M", "bfloat16")
    W, w = placeholder(rng, (8, 24), "W", "bfloat16")
    exact = m.astype(np.float64) @ w.astype(np.float64).T
    for out, feeds, expected in [
            (ops.batch_matmul(A, B, out_dtype="float32"), {A: a, B: b}, a.astype(np.float64) @ b.astype(np.float64)),
            (ops.matmul(M, W, transpose_b=True, out_dtype="float32"), {M: m, W: w}, exact),
            (ops.dense(M, W, out_dtype="float32"), {M: m, W: w}, exact)]:
        assert out.dtype == "float32"
        np.testing.assert_allclose(run(out, feeds), expected, rtol=1e-5, atol=1e-5)
    X, x = placeholder(rng, (1, 6, 6, 4), "X", "bfloat16")
    K, kernel = placeholder(rng, (3, 3, 4, 8), "K", "bfloat16")
    rounded = run(ops.conv2d_nhwc(X, K, padding=1), {X: x, K: kernel})  # summed in float32, rounded to bfloat16
    for conv in (ops.conv2d_nhwc(X, K, padding=1, out_dtype="float32"),
                 ops.conv2d_nhwc_gemm(X, K, padding=1, multiple=16, out_dtype="float32")):
        assert conv.dtype == "float32"
        summed = run(conv, {X: x, K: kernel}).reshape(rounded.shape)
        np.testing.assert_array_equal(summed.astype(rounded.dtype), rounded)
    with pytest.raises(TeError, match="out_dtype 'float8' is not a dtype"):
        ops.dense(M, W, out_dtype="float8")
