"""Converters of ONNX operators: sampling at computed positions (GridSample, RoiAlign, MaxRoiPool).

Each is one node of a te operator of ``tilecraft.ops.sampling`` (registered into ``OPERATORS``
here), because the positions they read come from another input at run time: no composition of
gathers with constant weights can express them. The converters map attributes across opsets:
GridSample-16's ``bilinear``/``bicubic`` are GridSample-20's ``linear``/``cubic``; RoiAlign-10 has
no ``coordinate_transformation_mode`` and behaves as ``output_half_pixel``, RoiAlign-16 defaults
to ``half_pixel``.

RoiAlign's adaptive sampling (``sampling_ratio`` 0) gives each box ceil(bin size) samples per
axis: the reduction's extent must be fixed when the kernel is built, so the boxes must be known
at import (an initializer), and the extent is the most any of them needs, computed here with the
float32 arithmetic of the kernel. Boxes computed at run time with adaptive sampling are refused
(``RuntimeInputError`` names the rois); a fixed ``sampling_ratio`` takes them at run time.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import ops
from ..graph.operators import OPAQUE, OPERATORS, REDUCTION, Operator
from ..te.dtype import is_float
from .onnx_importer import Importer, OnnxNode

Converter = Callable[[Importer, OnnxNode], None]

OPERATORS.update({op: Operator(lambda inputs, attrs, name, fn=getattr(ops, op): fn(*inputs, **attrs, name=name), kind)
                  for op, kind in {"grid_sample": OPAQUE, "roi_align": REDUCTION, "max_roi_pool": REDUCTION}.items()})

_GRID_SAMPLE_MODES = {"bilinear": "linear", "bicubic": "cubic"}  # GridSample-16's names


def _grid_sample(ctx: Importer, node: OnnxNode) -> None:
    mode = node.attrs.get("mode", "linear")
    mode, dtype = _GRID_SAMPLE_MODES.get(mode, mode), ctx.values[node.inputs[0]].dtype
    if mode != "nearest" and not is_float(dtype):
        raise node.unsupported(f"{mode} interpolation of {dtype} values")
    ctx.emit_for(node, "grid_sample", node.inputs[:2], {
        "mode": mode, "padding_mode": node.attrs.get("padding_mode", "zeros"),
        "align_corners": bool(node.attrs.get("align_corners", 0))})


def _adaptive_grid(rois: np.ndarray, pooled: tuple[int, int], scale: float, half_pixel: bool) -> tuple[int, int]:
    """The most samples (y, x) any box takes with sampling_ratio 0: ceil(box size / bins), at least 1."""
    offset = np.float32(0.5 if half_pixel else 0.0)
    corners = rois.astype(np.float32) * np.float32(scale) - offset
    size = corners[:, [3, 2]] - corners[:, [1, 0]]
    bins = (size if half_pixel else np.maximum(size, np.float32(1))) / np.array(pooled, np.float32)
    return tuple(int(np.ceil(bins[:, axis]).max(initial=1)) for axis in (0, 1))


def _roi_align(ctx: Importer, node: OnnxNode) -> None:
    pooled = (node.attrs.get("output_height", 1), node.attrs.get("output_width", 1))
    ratio, scale = node.attrs.get("sampling_ratio", 0), node.attrs.get("spatial_scale", 1.0)
    half_pixel = node.opset >= 16 and node.attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    attrs = {"output_size": pooled, "spatial_scale": scale, "sampling_ratio": ratio,
             "mode": node.attrs.get("mode", "avg"), "half_pixel": half_pixel}
    if ratio <= 0:
        rois = ctx.constant(node, 1, "rois (sampling_ratio 0 sizes each box's sample grid from them)")
        attrs["max_grid"] = _adaptive_grid(rois, pooled, scale, half_pixel)
    ctx.emit_for(node, "roi_align", node.inputs[:3], attrs)


def _max_roi_pool(ctx: Importer, node: OnnxNode) -> None:
    ctx.emit_for(node, "max_roi_pool", node.inputs[:2], {
        "pooled_shape": tuple(node.attrs["pooled_shape"]), "spatial_scale": node.attrs.get("spatial_scale", 1.0)})


SAMPLING_CONVERTERS: dict[str, Converter] = {
    "GridSample": _grid_sample, "RoiAlign": _roi_align, "MaxRoiPool": _max_roi_pool}
