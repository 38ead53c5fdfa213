"""Neural-network operators other than convolution: pooling, softmax and normalisation.

Multi-stage operators are separate computes with readable names (``softmax_max``,
``layer_norm_sum``...), since a reduction must be the whole body of a compute; softmax
subtracts the row maximum and layer_norm takes two passes, for accuracy.
"""

from __future__ import annotations

import math
from typing import Sequence

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import (
    check_tensor, compute_nd, lowest, merge_index, normalize_axes, normalize_axis, padding4, pair, require_float,
    same_dtype, window,
)
from .transform import pad

Pair = int | tuple[int, int]


LAYOUTS = ("NCHW", "NHWC")


def _check_layout(layout: str, op: str) -> None:
    if layout not in LAYOUTS:
        raise TeError(f"{op}: layout {layout!r} is not supported; use one of {', '.join(LAYOUTS)}")


def _in_layout(layout: str, n, c, y, x) -> tuple:
    """An (n, c, y, x) position as an index into a tensor of ``layout``."""
    return (n, c, y, x) if layout == "NCHW" else (n, y, x, c)


def _nchw(layout: str, index: tuple) -> tuple:
    """An index into a tensor of ``layout`` as (n, c, y, x)."""
    return index if layout == "NCHW" else (index[0], index[3], index[1], index[2])


def _pool_setup(data: Tensor, kernel: Pair, stride: Pair, padding, op: str, layout: str, dilation: Pair):
    check_tensor(data, op, 4, "data")
    _check_layout(layout, op)
    (kh, kw), (sh, sw) = pair(kernel, op, "kernel"), pair(stride, op, "stride")
    dh, dw = pair(dilation, op, "dilation")
    pads = padding4(padding, op)
    top, left, bottom, right = pads
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # what a dilated window covers
    if max(top, bottom) >= span_h or max(left, right) >= span_w:
        raise TeError(f"{op}: padding {padding!r} must be smaller than the kernel {kernel!r} on every side")
    N, C, H, W = _nchw(layout, data.shape)
    oh, ow = (H + top + bottom - span_h) // sh + 1, (W + left + right - span_w) // sw + 1
    if oh <= 0 or ow <= 0:
        raise TeError(f"{op}: the kernel {kernel!r} is larger than the padded input {data.name} {data.shape}")
    return (kh, kw), (sh, sw), pads, _in_layout(layout, N, C, oh, ow), (dh, dw)


def _padded(data: Tensor, pads: tuple[int, int, int, int], value: int | float, name: str, layout: str) -> Tensor:
    top, left, bottom, right = pads
    return pad(data, _in_layout(layout, 0, 0, top, left), _in_layout(layout, 0, 0, bottom, right), value,
               name=f"{name}_pad") if any(pads) else data


def _window_reduce(reduce, data: Tensor, shape: tuple, kernel, stride, layout: str, name: str, dilation) -> Tensor:
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def body(*index):
        n, c, y, x = _nchw(layout, index)
        return reduce(data[_in_layout(layout, n, c, window(y, sh, ry.var, dh), window(x, sw, rx.var, dw))],
                      axis=[ry, rx])

    return te.compute(shape, body, name=name)


def max_pool2d(data: Tensor, kernel: Pair, stride: Pair, padding: int | tuple = 0, layout: str = "NCHW",
               name: str = "max_pool2d", dilation: Pair = 1) -> Tensor:
    """data [N, C, H, W] (or NHWC) -> [N, C, OH, OW] (the same layout), the maximum of each
    window (of taps ``dilation`` apart); padding never wins."""
    kernel, stride, pads, shape, dilation = _pool_setup(data, kernel, stride, padding, "max_pool2d", layout, dilation)
    padded = _padded(data, pads, lowest(data.dtype), name, layout)
    return _window_reduce(te.max, padded, shape, kernel, stride, layout, name, dilation)


def avg_pool2d(data: Tensor, kernel: Pair, stride: Pair, padding: int | tuple = 0, count_include_pad: bool = False,
               layout: str = "NCHW", name: str = "avg_pool2d", dilation: Pair = 1) -> Tensor:
    """data [N, C, H, W] (or NHWC) -> [N, C, OH, OW], each window's sum ``{name}_sum`` over its size.

    The size counts the padding when ``count_include_pad``, else only the window's real elements.
    """
    kernel, stride, pads, shape, dilation = _pool_setup(data, kernel, stride, padding, "avg_pool2d", layout, dilation)
    require_float(data, "avg_pool2d")
    padded = _padded(data, pads, 0.0, name, layout)
    total = _window_reduce(te.sum, padded, shape, kernel, stride, layout, f"{name}_sum", dilation)
    (kh, kw), (sh, sw), (dh, dw), (top, left) = kernel, stride, dilation, pads[:2]
    _, _, H, W = _nchw(layout, data.shape)

    def count(y: Expr, x: Expr) -> Expr | int:
        if count_include_pad:
            return kh * kw
        return (_taps(y * sh - top, kh, dh, H) * _taps(x * sw - left, kw, dw, W)).astype(data.dtype)

    return te.compute(total.shape, lambda *i: total[i] / count(*_nchw(layout, i)[2:]), name=name)


def _taps(start: Expr, kernel: int, dilation: int, size: int) -> Expr:
    """How many taps ``start + j * dilation`` (``j < kernel``) of a window fall in ``[0, size)``."""
    if dilation == 1:
        return te.min(start + kernel, size) - te.max(start, 0)
    first = te.max((dilation - 1 - start) // dilation, 0)
    last = te.min((size - 1 - start) // dilation, kernel - 1)
    return te.max(last - first + 1, 0)


def global_avg_pool2d(data: Tensor, layout: str = "NCHW", name: str = "global_avg_pool2d") -> Tensor:
    """data [N, C, H, W] (or NHWC) -> [N, C, 1, 1], the mean of each channel (a sum ``{name}_sum``, then a division)."""
    check_tensor(data, "global_avg_pool2d", 4, "data")
    require_float(data, "global_avg_pool2d")
    _check_layout(layout, "global_avg_pool2d")
    N, C, H, W = _nchw(layout, data.shape)
    ry, rx = te.reduce_axis((0, H), "ry"), te.reduce_axis((0, W), "rx")
    total = te.compute(_in_layout(layout, N, C, 1, 1),
                       lambda *i: te.sum(data[_in_layout(layout, i[0], _nchw(layout, i)[1], ry, rx)], axis=[ry, rx]),
                       name=f"{name}_sum")
    return te.compute(total.shape, lambda *i: total[i] / (H * W), name=name)


def _without(idx: tuple, axis: int) -> tuple:
    return idx[:axis] + idx[axis + 1:]


def _with(idx: tuple, axis: int, value) -> tuple:
    return idx[:axis] + (value,) + idx[axis:]


def softmax(x: Tensor, axis: int = -1, name: str = "softmax") -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; any layout.

    Stages: ``{name}_max``, ``{name}_exp``, ``{name}_sum`` and the division ``{name}``.
    """
    check_tensor(x, "softmax")
    require_float(x, "softmax")
    axis = normalize_axis(axis, x.ndim, "softmax")
    reduced = _without(x.shape, axis)
    k = te.reduce_axis((0, x.shape[axis]), "k")
    maximum = compute_nd(reduced, lambda idx: te.max(x[_with(idx, axis, k)], axis=k), f"{name}_max")
    exp = compute_nd(x.shape, lambda idx: te.exp(x[idx] - maximum[_without(idx, axis)]), f"{name}_exp")
    k2 = te.reduce_axis((0, x.shape[axis]), "k")
    total = compute_nd(reduced, lambda idx: te.sum(exp[_with(idx, axis, k2)], axis=k2), f"{name}_sum")
    return compute_nd(x.shape, lambda idx: exp[idx] / total[_without(idx, axis)], name)


def log_softmax(x: Tensor, axis: int = -1, name: str = "log_softmax") -> Tensor:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``; any layout.

    Stages: ``{name}_max``, ``{name}_sum`` and ``{name}``.
    """
    check_tensor(x, "log_softmax")
    require_float(x, "log_softmax")
    axis = normalize_axis(axis, x.ndim, "log_softmax")
    reduced = _without(x.shape, axis)
    k = te.reduce_axis((0, x.shape[axis]), "k")
    maximum = compute_nd(reduced, lambda idx: te.max(x[_with(idx, axis, k)], axis=k), f"{name}_max")
    k2 = te.reduce_axis((0, x.shape[axis]), "k")
    total = compute_nd(
        reduced, lambda idx: te.sum(te.exp(x[_with(idx, axis, k2)] - maximum[idx]), axis=k2), f"{name}_sum"
    )
    return compute_nd(
        x.shape, lambda idx: x[idx] - maximum[_without(idx, axis)] - te.log(total[_without(idx, axis)]), name
    )


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, axis: int | Sequence[int] = -1, epsilon: float = 1e-5,
               name: str = "layer_norm") -> Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over ``axis``; gamma and beta have the shape of those dims.

    Two passes for accuracy: ``{name}_sum``, then ``{name}_sqsum`` of the deviations, then ``{name}``.
    """
    check_tensor(x, "layer_norm")
    require_float(x, "layer_norm")
    axes = normalize_axes(axis, x.ndim, "layer_norm")
    norm_shape = tuple(x.shape[d] for d in axes)
    for param in (gamma, beta):
        check_tensor(param, "layer_norm", what="scale/shift")
        same_dtype(x, param, "layer_norm")
        if param.shape != norm_shape:
            raise TeError(f"layer_norm: {param.name} {param.shape} must have the shape {norm_shape} of the "
                          f"normalized axes {axes} of {x.name} {x.shape}")
    kept_shape = [x.shape[d] for d in range(x.ndim) if d not in axes]
    inv_count = 1.0 / math.prod(norm_shape)

    def reduce_axes():
        return [te.reduce_axis((0, x.shape[d]), f"k{d}") for d in axes]

    def split(idx):
        return [idx[d] for d in range(x.ndim) if d not in axes], [idx[d] for d in axes]

    def total_body(idx):
        ks = reduce_axes()
        return te.sum(x[merge_index(x.ndim, axes, idx, ks)], axis=ks)

    total = compute_nd(kept_shape, total_body, f"{name}_sum")

    def sqsum_body(idx):
        ks = reduce_axes()
        deviation = x[merge_index(x.ndim, axes, idx, ks)] - total[idx] * inv_count
        return te.sum(deviation * deviation, axis=ks)

    sqsum = compute_nd(kept_shape, sqsum_body, f"{name}_sqsum")

    def body(idx):
        kept, normed = split(idx)
        mean = total[tuple(kept)] * inv_count
        scale = te.rsqrt(sqsum[tuple(kept)] * inv_count + epsilon)
        return (x[idx] - mean) * scale * gamma[tuple(normed)] + beta[tuple(normed)]

    return compute_nd(x.shape, body, name)


def batch_norm_inference(x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, var: Tensor, epsilon: float = 1e-5,
                         axis: int = 1, name: str = "batch_norm") -> Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta``, the parameters indexed by ``axis`` (C of NCHW)."""
    check_tensor(x, "batch_norm_inference")
    require_float(x, "batch_norm_inference")
    axis = normalize_axis(axis, x.ndim, "batch_norm_inference")
    for param in (gamma, beta, mean, var):
        check_tensor(param, "batch_norm_inference", what="parameter")
        same_dtype(x, param, "batch_norm_inference")
        if param.shape != (x.shape[axis],):
            raise TeError(f"batch_norm_inference: {param.name} {param.shape} must have shape ({x.shape[axis]},), "
                          f"the size of axis {axis} of {x.name} {x.shape}")

    def body(idx):
        c = idx[axis]
        return (x[idx] - mean[c]) * te.rsqrt(var[c] + epsilon) * gamma[c] + beta[c]

    return compute_nd(x.shape, body, name)
