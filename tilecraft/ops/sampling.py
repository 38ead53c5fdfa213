"""Sampling at positions computed from data: ``grid_sample``, ``roi_align`` and ``max_roi_pool`` (ONNX's
GridSample, RoiAlign and MaxRoiPool).

Unlike Resize, whose weights depend on shapes alone and fold into constant matrices at import,
these operators read their input at positions computed at run time from another input (a grid of
coordinates, or boxes). So each body computes the positions, floors them to int32 indices, clamps
every index into the input (a read is never out of bounds, even where a mask discards it, so
vectorised code may load it), and masks with ``te.if_then_else`` what the operator defines as zero.
Positions that every tap or corner needs are their own stages, read once per use rather than
recomputed inside each of the taps' expressions.

- ``grid_sample``: one stage per spatial dim holds the source coordinate of each output point: the
  normalized grid value mapped to pixels, rounded half to even for nearest, and brought back inside
  by the padding mode where it falls outside (border clamps it, reflection mirrors it). The output
  sums, over the taps around it (1 for nearest, 2 per dim for linear, 4 per dim for Keys' cubic),
  the product of the per-dim weights and the input at the tap, whose index the padding mode maps
  again (zeros masks it to 0, border clamps it, reflection mirrors it), as ONNX's reference does.
  (onnxruntime, as PyTorch, leaves a cubic coordinate unclamped under border padding and clamps only
  its taps, which differs near the border; ONNX's reference, which the node tests check, is followed.)
- ``roi_align``: one stage per axis holds the sample coordinates of each box's bins; a reduction over
  the sample grid takes each sample's bilinear value (avg: the weighted sum of the four corners;
  max: the largest weighted corner, as ONNX's reference and onnxruntime do) and 0 for a sample off
  the map; the last stage divides by the grid's count (avg) or gives an empty grid 0 (max). A box's
  grid is ``sampling_ratio`` samples per axis, or, adaptively, ceil(bin size): that count depends on
  the box, so the reduction spans ``max_grid`` (the most any box needs) and is masked to the box's.
- ``max_roi_pool``: one stage per axis holds each bin's [start, end) in pixels (Fast R-CNN's RoIPool,
  as onnxruntime: box corners rounded half away from zero, bins floored and ceiled). A bin's size
  varies with its box, so the max reduces over the whole feature map, masked to the bin; an empty
  bin is 0. (onnxruntime starts each max at FLT_MIN, the smallest positive float, so a bin of negative
  values gives ~0 there; here it gives the bin's max, as Fast R-CNN does.)
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Sequence

from .. import te
from ..errors import TeError
from ..te.expr import Expr, ExprLike, call
from ..te.tensor import Tensor
from .common import check_tensor, compute_nd, require_float

GRID_SAMPLE_MODES = ("linear", "nearest", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
_CUBIC_A = -0.75  # Keys' coefficient, as PyTorch's and ONNX's GridSample


def _clamp(value: ExprLike, low: ExprLike, high: ExprLike) -> Expr:
    return te.min(te.max(value, low), high)


def _floor(value: Expr) -> Expr:
    return value // 1.0


def _reflect(coord: Expr, low: float, high: float) -> Expr:
    """``coord`` mirrored at ``low`` and ``high`` until it lies between them (a period of twice the span)."""
    span = high - low
    if span == 0:
        return te.const(low, coord.dtype)
    folded = (coord - low) % (2 * span)
    return te.if_then_else(folded <= span, folded, 2 * span - folded) + low


def _borders(extent: int, align_corners: bool) -> tuple[float, float]:
    """The coordinates of the input's first and last edge: pixel centers when aligned at the corners."""
    return (0.0, extent - 1.0) if align_corners else (-0.5, extent - 0.5)


def _grid_coordinate(grid: Tensor, dim: int, extent: int, mode: str, padding_mode: str, align_corners: bool,
                     name: str) -> Tensor:
    """The pixel coordinate along spatial ``dim`` (of ``extent`` pixels) that each grid point samples; the grid's
    last axis lists the dims in reverse (x, y, z)."""
    low, high = _borders(extent, align_corners)

    def body(idx: tuple[Expr, ...]) -> Expr:
        g = grid[(*idx, grid.shape[-1] - 1 - dim)]
        coord = (g + 1.0) / 2.0 * (extent - 1.0) if align_corners else ((g + 1.0) * extent - 1.0) / 2.0
        coord = call("rint", coord) if mode == "nearest" else coord
        outside = (coord < low) | (coord > high)
        if padding_mode == "border":
            return te.if_then_else(outside, _clamp(coord, 0.0, extent - 1.0), coord)
        if padding_mode == "reflection":
            return te.if_then_else(outside, _reflect(coord, low, high), coord)
        return _clamp(coord, -4.0, extent + 3.0)  # keeps the int cast in range; taps out there are masked anyway

    return compute_nd(grid.shape[:-1], body, name)


def _keys(distance: Expr, near: bool) -> Expr:
    """Keys' cubic convolution weight of a tap at ``distance`` (< 1 when ``near``, else < 2)."""
    a = _CUBIC_A
    if near:
        return ((a + 2) * distance - (a + 3)) * distance * distance + 1.0
    return ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a


def _taps(coord: Expr, mode: str) -> list[tuple[Expr, Expr | None]]:
    """(pixel index, weight) of the taps that interpolate at ``coord``; None weighs 1."""
    if mode == "nearest":
        return [(coord.astype("int32"), None)]
    base = _floor(coord)
    index, frac = base.astype("int32"), coord - base
    if mode == "linear":
        return [(index, 1.0 - frac), (index + 1, frac)]
    distances = (frac + 1.0, frac, 1.0 - frac, 2.0 - frac)
    return [(index + (k - 1), _keys(d, near=k in (1, 2))) for k, d in enumerate(distances)]


def _pixel(index: Expr, extent: int, padding_mode: str, borders: tuple[float, float],
           dtype: str) -> tuple[Expr, Expr | None]:
    """The in-bounds index a tap reads, and the condition for it to count (None: always)."""
    if padding_mode == "reflection":  # mirrored at the same borders as the coordinate: an integer again
        return _reflect(index.astype(dtype), *borders).astype("int32"), None
    inside = (index >= 0) & (index < extent) if padding_mode == "zeros" else None
    return _clamp(index, 0, extent - 1), inside


def grid_sample(x: Tensor, grid: Tensor, mode: str = "linear", padding_mode: str = "zeros",
                align_corners: bool = False, name: str = "grid_sample") -> Tensor:
    """ONNX GridSample: ``out[n, c, *p]`` is ``x[n, c]`` interpolated (``mode``: linear, nearest or cubic) at
    ``grid[n, *p]``, coordinates in [-1, 1] (the corner pixels' centers when ``align_corners``, else their
    outer edges), listed x first; any number of spatial dims. ``padding_mode`` (zeros, border, reflection)
    says what lies outside ``x``.

    Stages: ``{name}_coord{d}`` per spatial dim ``d``, then ``{name}``.
    """
    check_tensor(x, "grid_sample")
    check_tensor(grid, "grid_sample", ndim=x.ndim, what="grid")
    require_float(grid, "grid_sample")
    if mode != "nearest":
        require_float(x, "grid_sample")
    if x.ndim < 3 or grid.shape[0] != x.shape[0] or grid.shape[-1] != x.ndim - 2:
        raise TeError(f"grid_sample: grid {grid.name} {grid.shape} must be (N, *output, {x.ndim - 2}) for "
                      f"{x.name} {x.shape}: the batch of x, then one coordinate per spatial dim of x")
    if mode not in GRID_SAMPLE_MODES or padding_mode not in PADDING_MODES:
        raise TeError(f"grid_sample: mode {mode!r} / padding_mode {padding_mode!r}: use one of "
                      f"{', '.join(GRID_SAMPLE_MODES)} / {', '.join(PADDING_MODES)}")
    extents = x.shape[2:]
    coords = [_grid_coordinate(grid, d, n, mode, padding_mode, align_corners, f"{name}_coord{d}")
              for d, n in enumerate(extents)]

    def body(idx: tuple[Expr, ...]) -> Expr:
        n, c, point = idx[0], idx[1], idx[2:]
        per_dim = [[(*_pixel(i, extent, padding_mode, _borders(extent, align_corners), grid.dtype), w)
                    for i, w in _taps(coord[(n, *point)], mode)] for coord, extent in zip(coords, extents)]
        terms = []
        for taps in itertools.product(*per_dim):
            value = x[(n, c, *(index for index, _, _ in taps))]
            for weight in (w for _, _, w in taps if w is not None):
                value = value * weight.astype(x.dtype)
            inside = [condition for _, condition, _ in taps if condition is not None]
            terms.append(te.if_then_else(te.all(*inside), value, 0) if inside else value)
        return functools.reduce(operator.add, terms)

    return compute_nd((*x.shape[:2], *grid.shape[1:-1]), body, name)


def _box_axis(rois: Tensor, r: Expr, axis: int, pooled: int, spatial_scale: float,
              half_pixel: bool) -> tuple[Expr, Expr]:
    """(start, bin size) of box ``r`` along ``axis`` (0: y, 1: x) in pixels; rows of ``rois`` are (x1, y1, x2, y2).
    Without ``half_pixel`` a box is at least 1 pixel wide."""
    offset = 0.5 if half_pixel else 0.0
    start = rois[r, 1 - axis] * spatial_scale - offset
    size = rois[r, 3 - axis] * spatial_scale - offset - start
    return start, (size if half_pixel else te.max(size, 1.0)) / float(pooled)


def _bilinear(coord: Expr, extent: int) -> tuple[list[tuple[Expr, Expr]], Expr]:
    """(index, weight) of the two pixels RoiAlign blends at ``coord``, and whether ``coord`` is on the map
    ([-1, extent]); below 0 it samples pixel 0, from ``extent - 1`` on the last pixel alone."""
    clamped = _clamp(coord, 0.0, float(extent))
    low = clamped.astype("int32")
    frac = te.if_then_else(low >= extent - 1, 0.0, clamped - low.astype(coord.dtype))
    low = te.min(low, extent - 1)
    return [(low, 1.0 - frac), (te.min(low + 1, extent - 1), frac)], (coord >= -1.0) & (coord <= float(extent))


def roi_align(x: Tensor, rois: Tensor, batch_indices: Tensor, output_size: Sequence[int], spatial_scale: float = 1.0,
              sampling_ratio: int = 0, max_grid: Sequence[int] = (1, 1), mode: str = "avg", half_pixel: bool = True,
              name: str = "roi_align") -> Tensor:
    """ONNX RoiAlign: ``out[r, c]`` pools ``x[batch_indices[r], c]`` over box ``rois[r]`` (x1, y1, x2, y2, scaled by
    ``spatial_scale``; shifted by half a pixel when ``half_pixel``) into ``output_size`` bins, each the ``mode``
    (avg or max) of a grid of bilinear samples: ``sampling_ratio`` per axis, or when it is 0 ceil(bin size),
    at most ``max_grid`` (per axis, y then x).

    Stages: ``{name}_y``, ``{name}_x`` (the sample coordinates), ``{name}_pooled``, then ``{name}``.
    """
    check_tensor(x, "roi_align", ndim=4)
    check_tensor(rois, "roi_align", ndim=2, what="rois")
    check_tensor(batch_indices, "roi_align", ndim=1, what="batch_indices")
    require_float(x, "roi_align")
    require_float(rois, "roi_align")
    if rois.shape[1] != 4 or batch_indices.shape[0] != rois.shape[0] or mode not in ("avg", "max"):
        raise TeError(f"roi_align: rois {rois.shape} must be (R, 4) with batch_indices {batch_indices.shape} (R,), "
                      f"and mode avg or max (got {mode!r})")
    grid = (sampling_ratio,) * 2 if sampling_ratio > 0 else tuple(max_grid)

    def count(r: Expr, axis: int) -> Expr:
        if sampling_ratio > 0:
            return te.const(sampling_ratio)
        bin_size = _box_axis(rois, r, axis, output_size[axis], spatial_scale, half_pixel)[1]
        return _clamp(-_floor(-bin_size), 0.0, float(grid[axis])).astype("int32")

    def samples(axis: int) -> Tensor:
        def body(idx: tuple[Expr, ...]) -> Expr:
            r, p, k = idx
            start, bin_size = _box_axis(rois, r, axis, output_size[axis], spatial_scale, half_pixel)
            return start + p.astype(rois.dtype) * bin_size + (k.astype(rois.dtype) + 0.5) * bin_size / count(
                r, axis).astype(rois.dtype)

        return compute_nd((rois.shape[0], output_size[axis], grid[axis]), body, f"{name}_{'yx'[axis]}")

    ys, xs = samples(0), samples(1)

    def pooled_body(idx: tuple[Expr, ...]) -> Expr:
        r, c, ph, pw = idx
        iy, ix = te.reduce_axis((0, grid[0]), "iy"), te.reduce_axis((0, grid[1]), "ix")
        (rows, on_y), (cols, on_x) = _bilinear(ys[r, ph, iy], x.shape[2]), _bilinear(xs[r, pw, ix], x.shape[3])
        batch = _clamp(batch_indices[r].astype("int32"), 0, x.shape[0] - 1)
        corners = [x[batch, c, i, j] * (wy * wx).astype(x.dtype) for (i, wy), (j, wx) in itertools.product(rows, cols)]
        value = te.if_then_else(on_y & on_x, functools.reduce(operator.add if mode == "avg" else te.max, corners), 0)
        in_grid = None if sampling_ratio > 0 else (iy < count(r, 0)) & (ix < count(r, 1))
        return (te.sum if mode == "avg" else te.max)(value, axis=[iy, ix], where=in_grid)

    pooled = compute_nd((rois.shape[0], x.shape[1], *output_size), pooled_body, f"{name}_pooled")

    def body(idx: tuple[Expr, ...]) -> Expr:
        rows, cols = count(idx[0], 0), count(idx[0], 1)
        if mode == "avg":
            return pooled[idx] / te.max(rows * cols, 1).astype(x.dtype)
        return te.if_then_else((rows > 0) & (cols > 0), pooled[idx], 0)

    return compute_nd(pooled.shape, body, name)


def _round_half_away(value: Expr) -> Expr:
    """C's ``round``: halves away from zero."""
    return te.if_then_else(value >= 0.0, _floor(value + 0.5), -_floor(0.5 - value))


def _bin_bounds(rois: Tensor, axis: int, pooled: int, extent: int, spatial_scale: float, name: str) -> Tensor:
    """[r, p, 0] and [r, p, 1]: the first and past-the-last pixel of bin ``p`` of box ``r`` along ``axis``
    (0: y, 1: x), within [0, extent]; rows of ``rois`` are (batch, x1, y1, x2, y2)."""
    def body(idx: tuple[Expr, ...]) -> Expr:
        r, p, end = idx
        start = _round_half_away(rois[r, 2 - axis] * spatial_scale).astype("int32")
        size = te.max(_round_half_away(rois[r, 4 - axis] * spatial_scale).astype("int32") - start + 1, 1)
        bin_size = size.astype(rois.dtype) / float(pooled)
        lower = _floor(p.astype(rois.dtype) * bin_size).astype("int32")
        upper = (-_floor(-(p + 1).astype(rois.dtype) * bin_size)).astype("int32")
        return _clamp(te.if_then_else(te.equal(end, 0), lower, upper) + start, 0, extent)

    return compute_nd((rois.shape[0], pooled, 2), body, name)


def max_roi_pool(x: Tensor, rois: Tensor, pooled_shape: Sequence[int], spatial_scale: float = 1.0,
                 name: str = "max_roi_pool") -> Tensor:
    """ONNX MaxRoiPool: ``out[r, c]`` max-pools ``x[rois[r, 0], c]`` over box ``rois[r, 1:]`` (x1, y1, x2, y2 scaled
    by ``spatial_scale`` and rounded, corners included) cut into ``pooled_shape`` bins; an empty bin is 0.

    Stages: ``{name}_y``, ``{name}_x`` (the bins' bounds), ``{name}_max``, then ``{name}``.
    """
    check_tensor(x, "max_roi_pool", ndim=4)
    check_tensor(rois, "max_roi_pool", ndim=2, what="rois")
    require_float(rois, "max_roi_pool")
    if rois.shape[1] != 5 or len(pooled_shape) != 2:
        raise TeError(f"max_roi_pool: rois {rois.name} {rois.shape} must be (R, 5) and pooled_shape "
                      f"{pooled_shape!r} two ints")
    rows, cols = (_bin_bounds(rois, axis, pooled_shape[axis], x.shape[2 + axis], spatial_scale,
                              f"{name}_{'yx'[axis]}") for axis in (0, 1))

    def pooled_body(idx: tuple[Expr, ...]) -> Expr:
        r, c, ph, pw = idx
        h, w = te.reduce_axis((0, x.shape[2]), "h"), te.reduce_axis((0, x.shape[3]), "w")
        batch = _clamp(rois[r, 0].astype("int32"), 0, x.shape[0] - 1)
        in_bin = (h >= rows[r, ph, 0]) & (h < rows[r, ph, 1]) & (w >= cols[r, pw, 0]) & (w < cols[r, pw, 1])
        return te.max(x[batch, c, h, w], axis=[h, w], where=in_bin)

    pooled = compute_nd((rois.shape[0], x.shape[1], *pooled_shape), pooled_body, f"{name}_max")

    def body(idx: tuple[Expr, ...]) -> Expr:
        r, _, ph, pw = idx
        empty = (rows[r, ph, 1] <= rows[r, ph, 0]) | (cols[r, pw, 1] <= cols[r, pw, 0])
        return te.if_then_else(empty, 0, pooled[idx])

    return compute_nd(pooled.shape, body, name)
