"""Operators that move data between images and sliding windows at run-time or many-to-one positions: Col2Im
and the deformable convolution.

``col2im`` is the adjoint of im2col, a scatter-add of each window column into the image. te has no
scatter, so it is written as the gather that computes the same sums: each image element sums, over
the kernel taps, the column entry of the one block (if any) whose tap lands on it, a block index
being whole and in range only for some taps (a masked reduction, N-D).

``deform_conv2d`` follows topi's ``deformable_conv2d_nchw``: a stage ``{name}_sample`` samples the
input bilinearly at every tap moved by its learned offset (scaled by the optional mask), the
im2col of a deformable convolution, read at run-time positions with every out-of-image corner
reading zero; then a convolution sums the samples against the kernel, as ``conv2d_nchw`` sums
its padded input.
"""

from __future__ import annotations

import math
from typing import Sequence

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import check_tensor, compute_nd, layout_free, padding4, pair, same_dtype


def _flat(indices: Sequence[Expr], shape: Sequence[int]) -> Expr:
    """The row-major position of ``indices`` in ``shape``."""
    flat = indices[0]
    for index, extent in zip(indices[1:], shape[1:]):
        flat = flat * extent + index
    return flat


def col2im(data: Tensor, image_shape: Sequence[int], block_shape: Sequence[int], strides: Sequence[int],
           pads: Sequence[int], dilations: Sequence[int], name: str = "col2im") -> Tensor:
    """data [N, C * prod(block_shape), L] (L blocks, row-major) -> [N, C, *image_shape], the sum of the
    blocks' entries at each position; ``pads`` are the begins then the ends (ONNX Col2Im)."""
    check_tensor(data, "col2im", 3, "data")
    rank, taps = len(image_shape), math.prod(block_shape)
    (batch, rows, length), begins = data.shape, pads[:rank]
    counts = [(size + lo + hi - d * (k - 1) - 1) // s + 1 for size, k, s, d, lo, hi in zip(
        image_shape, block_shape, strides, dilations, begins, pads[rank:])]
    if rows % taps or math.prod(counts) != length or min(counts) < 1:
        raise TeError(f"col2im: {data.name} {data.shape} does not hold windows of {list(block_shape)} over "
                      f"{list(image_shape)}: the rows must divide by {taps} and the {length} columns must be the "
                      f"{counts} blocks that the strides, pads and dilations give")

    def body(index: tuple[Expr, ...]) -> Expr:
        n, c, position = index[0], index[1], index[2:]
        reduce_axes = [te.reduce_axis((0, k), f"r{d}") for d, k in enumerate(block_shape)]
        starts = [p + lo - r.var * d for p, lo, r, d in zip(position, begins, reduce_axes, dilations)]
        inside = [v for start, s, count in zip(starts, strides, counts)
                  for v in (start >= 0, start <= (count - 1) * s, *([te.equal(start % s, 0)] if s > 1 else []))]
        blocks = [start // s if s > 1 else start for start, s in zip(starts, strides)]
        row = c * taps + _flat([r.var for r in reduce_axes], block_shape)
        value = data[n, row, _flat(blocks, counts)]
        return te.sum(te.if_then_else(te.all(*inside), value, 0), axis=reduce_axes)

    return compute_nd((batch, rows // taps, *image_shape), body, name)


def _bilinear(data: Tensor, n: Expr, c: Expr, y: Expr, x: Expr) -> Expr:
    """``data[n, c]`` at the real position (y, x): its four neighbours weighted by nearness, zero outside."""
    height, width = data.shape[2:]
    y0, x0 = y // 1.0, x // 1.0  # floors
    fy, fx = y - y0, x - x0
    row, col = y0.astype("int32"), x0.astype("int32")
    terms = [te.if_then_else(te.all(r >= 0, r < height, q >= 0, q < width), data[n, c, r, q], 0.0) * (wy * wx)
             for r, wy in ((row, 1.0 - fy), (row + 1, fy)) for q, wx in ((col, 1.0 - fx), (col + 1, fx))]
    return terms[0] + terms[1] + terms[2] + terms[3]


def deform_conv2d(data: Tensor, kernel: Tensor, offset: Tensor, mask: Tensor | None = None,
                  stride: int | tuple[int, int] = 1, padding: int | tuple = 0, dilation: int | tuple[int, int] = 1,
                  groups: int = 1, offset_groups: int = 1, name: str = "deform_conv2d") -> Tensor:
    """data [N, C, H, W], kernel [F, C/groups, KH, KW], offset [N, offset_groups*KH*KW*2, OH, OW] ((dy, dx) of
    each tap), mask [N, offset_groups*KH*KW, OH, OW] -> [N, F, OH, OW] (ONNX DeformConv without its bias).

    The channels of offset group ``g`` (``C/offset_groups`` of them) share its offsets and mask."""
    op = "deform_conv2d"
    for tensor, what in ((data, "data"), (kernel, "kernel"), (offset, "offset"), (mask, "mask")):
        if tensor is not None:
            check_tensor(tensor, op, 4, what)
            same_dtype(data, tensor, op)
    (batch, channels, height, width), (filters, per_group, kh, kw) = data.shape, kernel.shape
    (sh, sw), (dh, dw) = pair(stride, op, "stride"), pair(dilation, op, "dilation")
    top, left, bottom, right = padding4(padding, op)
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    taps = offset_groups * kh * kw
    if channels != per_group * groups or filters % groups or channels % offset_groups or min(out_h, out_w) < 1 or \
            offset.shape != (batch, taps * 2, out_h, out_w) or mask is not None and mask.shape != (
                batch, taps, out_h, out_w):
        raise TeError(f"{op}: data {data.shape}, kernel {kernel.shape}, offset {offset.shape} and mask "
                      f"{mask.shape if mask is not None else None} do not match with groups={groups}, "
                      f"offset_groups={offset_groups} and an output of {out_h}x{out_w}")
    per_offset_group = channels // offset_groups

    def sample(n, c, ky, kx, y, x):
        tap = c // per_offset_group * (kh * kw) + ky * kw + kx
        at_y = (y * sh - top + ky * dh).astype(data.dtype) + offset[n, tap * 2, y, x]
        at_x = (x * sw - left + kx * dw).astype(data.dtype) + offset[n, tap * 2 + 1, y, x]
        value = _bilinear(data, n, c, at_y, at_x)
        return value * mask[n, tap, y, x] if mask is not None else value

    sampled = te.compute((batch, channels, kh, kw, out_h, out_w), sample, name=f"{name}_sample")
    rc, ry, rx = te.reduce_axis((0, per_group), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    per_filter_group = filters // groups

    def body(n, f, y, x):
        channel = rc.var if groups == 1 else f // per_filter_group * per_group + rc.var
        return te.sum(sampled[n, channel, ry, rx, y, x] * kernel[f, rc, ry, rx], axis=[rc, ry, rx])

    return te.compute((batch, filters, out_h, out_w), body, name=name, attrs=layout_free(kernel))
