"""Resize and Upsample: the interpolation along each resized axis as a constant weight matrix.

Interpolation (nearest, linear, cubic, with or without antialiasing) is separable: the
output along one axis is a weighted sum of input positions along it, with weights fixed
by the sizes and the attributes alone. So each resized axis is one ``axis_matmul`` by an
[out, in] matrix computed here with NumPy, with the coefficients of ONNX's reference (its
coordinate transformations, kernels, clamping at the edges, ``exclude_outside``); nearest
sampling is a ``take`` of the chosen positions instead, exact for every dtype; outputs of
``tf_crop_and_resize`` that fall outside the input take ``extrapolation_value``.
"""

from __future__ import annotations

import numpy as np

from ..te.dtype import is_float
from .onnx_importer import Importer, OnnxNode


def _source(mode: str, out: np.ndarray, scale: float, size_in: int, size_out: int, roi) -> np.ndarray:
    """The input coordinate of each output position ``out`` along one axis."""
    length = scale * size_in
    if mode == "align_corners":
        return np.zeros(size_out) if length == 1 else out * (size_in - 1) / (length - 1)
    if mode == "asymmetric":
        return out / scale
    if mode == "tf_crop_and_resize":
        span = (roi[1] - roi[0]) * (size_in - 1)
        return roi[0] * (size_in - 1) + (np.full(size_out, span / 2) if length == 1 else out * span / (length - 1))
    if mode == "pytorch_half_pixel" and length == 1:
        return np.full(size_out, -0.5)
    offset = size_in / 2 * (1 - size_out / length) if mode == "half_pixel_symmetric" else 0.0
    return offset + (out + 0.5) / scale - 0.5  # half_pixel and its variants


def _kernel(ratio: np.ndarray, scale: float, node: OnnxNode) -> np.ndarray:
    """[out, taps] coefficients, for ``ratio`` in (0, 1] the distance from the tap left of each coordinate."""
    mode, a, r = node.attrs.get("mode", "nearest"), node.attrs.get("cubic_coeff_a", -0.75), ratio[:, None]
    if mode == "nearest":
        rule = node.attrs.get("nearest_mode", "round_prefer_floor" if node.opset >= 11 else "floor")
        up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": r > 1, "ceil": r > 0}[rule]
        up = up | (r == 1)
        return np.concatenate([~up, up], axis=1).astype(float)
    if node.attrs.get("antialias", 0):
        shrink = min(scale, 1.0)  # downsampling stretches the kernel over 1 / scale inputs
        start = int(np.floor((-1 if mode == "linear" else -2) / shrink) + 1)
        x = np.abs((np.arange(start, 2 - start) - r) * shrink)
        far = np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0)
        coeffs = (np.clip(1 - x, 0, 1) if mode == "linear"
                  else np.where(x <= 1, (a + 2) * x**3 - (a + 3) * x**2 + 1, far))
        return coeffs / coeffs.sum(axis=1, keepdims=True)
    if mode == "linear":
        return np.concatenate([1 - r, r], axis=1)
    x = np.concatenate([1 + r, r, 1 - r, 2 - r], axis=1)  # distances to the four taps
    return np.where(x <= 1, (a + 2) * x**3 - (a + 3) * x**2 + 1, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a)


def _weights(node: OnnxNode, size_in: int, size_out: int, scale: float, roi) -> tuple[np.ndarray, np.ndarray]:
    """The [out, in] interpolation matrix of one axis, and which outputs lie outside the input (extrapolated)."""
    mode = node.attrs.get("coordinate_transformation_mode", "half_pixel" if node.opset >= 11 else "asymmetric")
    source = _source(mode, np.arange(size_out, dtype=float), scale, size_in, size_out, roi)
    ratio = np.where(source == np.floor(source), 1.0, source - np.floor(source))
    coeffs = _kernel(ratio, scale, node)
    taps = coeffs.shape[1]
    padded = source + (taps + 1) // 2  # the reference's window search, in edge-padded coordinates
    base, frac = np.floor(padded), padded - np.floor(padded)
    start = (base + np.where(frac == 0, -(taps // 2), 1 - taps // 2) if taps % 2 == 0
             else base - (taps - 1) // 2 + (frac > 0.5))
    index = (start[:, None] + np.arange(taps) - (taps + 1) // 2).astype(np.int64)
    if node.attrs.get("exclude_outside", 0):
        coeffs = np.where((index < 0) | (index >= size_in), 0.0, coeffs)
        coeffs = coeffs / np.where(coeffs.sum(axis=1, keepdims=True) == 0, 1.0, coeffs.sum(axis=1, keepdims=True))
    weights = np.zeros((size_out, size_in))
    np.add.at(weights, (np.arange(size_out)[:, None], np.clip(index, 0, size_in - 1)), coeffs)
    outside = (source < 0) | (source > size_in - 1) if mode == "tf_crop_and_resize" else np.zeros(size_out, bool)
    return weights, outside


def _sizes(ctx: Importer, node: OnnxNode, shape: tuple[int, ...], axes: list[int]) -> tuple[list[float], list[int]]:
    """Each axis's scale and output size, from the scales or the sizes input (or, in Upsample-7, attribute)."""
    if node.op_type == "Upsample" and node.opset < 9:
        scales, sizes = node.attrs["scales"], None
    elif node.opset < 11:
        scales, sizes = ctx.constant(node, 1, "scales"), None
    else:
        scales, sizes = ctx.constant(node, 2, "scales"), ctx.constant(node, 3, "sizes")
    if sizes is None or sizes.size == 0:
        full = dict(zip(axes, (float(s) for s in scales)))
        return [full.get(d, 1.0) for d in range(len(shape))], [int(full.get(d, 1.0) * n) for d, n in enumerate(shape)]
    wanted = dict(zip(axes, (int(s) for s in sizes)))
    scale = [wanted.get(d, n) / n for d, n in enumerate(shape)]
    policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        chosen = (min if policy == "not_larger" else max)(scale[d] for d in axes)
        scale = [chosen if d in axes else 1.0 for d in range(len(shape))]
        return scale, [int(chosen * n + 0.5) if d in axes else n for d, n in enumerate(shape)]
    return scale, [wanted.get(d, n) for d, n in enumerate(shape)]


def convert_resize(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    rank, dtype = len(shape), ctx.values[node.inputs[0]].dtype
    axes = [int(a) % rank for a in node.attrs.get("axes", range(rank))]
    scales, sizes = _sizes(ctx, node, shape, axes)
    roi = ctx.constant(node, 1, "roi") if node.op_type == "Resize" and node.opset >= 11 else None
    bounds = {d: (0.0, 1.0) for d in range(rank)}
    if roi is not None and roi.size:
        bounds.update({d: (float(roi[k]), float(roi[k + len(axes)])) for k, d in enumerate(axes)})
    nearest = node.attrs.get("mode", "nearest") == "nearest"
    if not nearest and not is_float(dtype):
        raise node.unsupported(f"{node.attrs['mode']} interpolation of {dtype} values")
    out, outside = x, np.zeros([1] * rank, bool)
    for d in axes:
        if sizes[d] == shape[d] and np.isclose(scales[d], 1.0) and bounds[d] == (0.0, 1.0):
            continue
        weights, extrapolated = _weights(node, shape[d], sizes[d], scales[d], bounds[d])
        outside = outside | extrapolated.reshape([-1 if k == d else 1 for k in range(rank)])
        matrix = ctx.add_constant(ctx.fresh_value(f"{node.name}_axis{d}"),
                                  weights.argmax(axis=1) if nearest else weights.astype(dtype))
        out = ctx.emit("take" if nearest else "axis_matmul", [out, matrix], {"axis": d}, f"{node.name}_axis{d}")
    if outside.any():
        mask = ctx.add_constant(ctx.fresh_value(f"{node.name}_outside"), outside)
        value = ctx.scalar(node.attrs.get("extrapolation_value", 0.0), out)
        out = ctx.emit("where", [mask, value, out], {}, f"{node.name}_extrapolate")
    ctx.alias(node.outputs[0], out)
