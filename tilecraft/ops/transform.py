"""Data movement: transpose, reshape, concatenation, padding, slicing, gathering and broadcasting.

Each is one compute whose body only reads its input at computed indices, so the scheduler
can inline it; padding guards its read with ``te.if_then_else`` and never reads out of bounds.
"""

from __future__ import annotations

import math
from typing import Sequence

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import broadcast_read, broadcast_shape, check_tensor, compute_nd, normalize_axis

_INT32_LIMIT = 2**31 - 1


def transpose(x: Tensor, axes: Sequence[int] | None = None, name: str = "transpose") -> Tensor:
    """``numpy.transpose``: output dim ``d`` is input dim ``axes[d]`` (reversed when None)."""
    check_tensor(x, "transpose")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(
        normalize_axis(a, x.ndim, "transpose") for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise TeError(f"transpose: axes {axes!r} is not a permutation of the {x.ndim} axes of {x.name} {x.shape}")
    return compute_nd(
        [x.shape[a] for a in perm], lambda idx: x[tuple(idx[perm.index(d)] for d in range(x.ndim))], name
    )


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a C-contiguous array of ``shape``, in elements."""
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def reshape(x: Tensor, newshape: Sequence[int], name: str = "reshape") -> Tensor:
    """``numpy.reshape`` of the row-major data (one entry may be -1); any layout."""
    check_tensor(x, "reshape")
    shape = [int(n) for n in ((newshape,) if isinstance(newshape, int) else newshape)]
    size = math.prod(x.shape)
    if shape.count(-1) == 1:
        known = math.prod(n for n in shape if n != -1)
        if known > 0 and size % known == 0:
            shape[shape.index(-1)] = size // known
    if math.prod(shape) != size or any(n <= 0 for n in shape):
        raise TeError(
            f"reshape: cannot reshape {x.name} {x.shape} ({size} elements) to {tuple(newshape)}; "
            "give positive sizes with the same product, at most one of them -1"
        )
    if size > _INT32_LIMIT:
        raise TeError(f"reshape: {x.name} has {size} elements, beyond the int32 indices of te; split it first")
    out_strides, in_strides = row_major(shape), row_major(x.shape)

    def body(idx: tuple[Expr, ...]) -> Expr:
        terms = [i * s if s != 1 else i for i, s, n in zip(idx, out_strides, shape) if n != 1]
        flat = terms[0] if terms else te.const(0)
        for term in terms[1:]:
            flat = flat + term
        index: list[Expr | int] = []
        for stride, extent in zip(in_strides, x.shape):
            value = flat // stride if stride != 1 else flat
            outermost = stride * extent >= size
            index.append(0 if extent == 1 else value if outermost else value % extent)
        return x[tuple(index)]

    return compute_nd(shape, body, name)


def concat(tensors: Sequence[Tensor], axis: int = 0, name: str = "concat") -> Tensor:
    """``numpy.concatenate`` along ``axis``; the other dims and the dtypes must agree."""
    tensors = list(tensors)
    if not tensors:
        raise TeError("concat: got no tensors; pass a list of at least one tensor")
    first = check_tensor(tensors[0], "concat")
    axis = normalize_axis(axis, first.ndim, "concat")
    for t in tensors[1:]:
        check_tensor(t, "concat")
        others = [s for d, s in enumerate(t.shape) if d != axis]
        if t.ndim != first.ndim or others != [s for d, s in enumerate(first.shape) if d != axis]:
            raise TeError(
                f"concat: {t.name} {t.shape} does not match {first.name} {first.shape} outside axis {axis}; "
                "every dimension but the concatenated one must be equal"
            )
        if t.dtype != first.dtype:
            raise TeError(f"concat: {t.name} is {t.dtype} but {first.name} is {first.dtype}; cast them to one dtype")
    offsets = [0]
    for t in tensors:
        offsets.append(offsets[-1] + t.shape[axis])

    def read(t: Tensor, offset: int, idx: tuple[Expr, ...]) -> Expr:
        position = idx[axis] - offset if offset else idx[axis]
        return t[idx[:axis] + (position,) + idx[axis + 1:]]

    def body(idx: tuple[Expr, ...]) -> Expr:
        value = read(tensors[-1], offsets[-2], idx)
        for t, start, end in reversed(list(zip(tensors[:-1], offsets, offsets[1:]))):
            value = te.if_then_else(idx[axis] < end, read(t, start, idx), value)
        return value

    shape = list(first.shape)
    shape[axis] = offsets[-1]
    return compute_nd(shape, body, name)


def pad(
    x: Tensor,
    pad_before: Sequence[int],
    pad_after: Sequence[int] | None = None,
    pad_value: int | float = 0.0,
    name: str = "pad",
) -> Tensor:
    """Constant padding (``topi.nn.pad``): ``pad_before[d]`` and ``pad_after[d]`` elements on dim ``d``."""
    check_tensor(x, "pad")
    before = list(pad_before)
    after = list(pad_after) if pad_after is not None else before
    if len(before) != x.ndim or len(after) != x.ndim or any(
        not isinstance(p, int) or p < 0 for p in before + after
    ):
        raise TeError(
            f"pad: {x.name} has {x.ndim} dimensions {x.shape}; pad_before and pad_after must each give "
            f"{x.ndim} ints >= 0, got {pad_before!r} and {pad_after!r}"
        )

    def body(idx: tuple[Expr, ...]) -> Expr:
        inside = []
        for d, i in enumerate(idx):
            if before[d]:
                inside.append(i >= before[d])
            if after[d]:
                inside.append(i < before[d] + x.shape[d])
        value = x[tuple(i - b if b else i for i, b in zip(idx, before))]
        return te.if_then_else(te.all(*inside), value, pad_value) if inside else value

    shape = [b + s + a for b, s, a in zip(before, x.shape, after)]
    return compute_nd(shape, body, name)


def strided_slice(x: Tensor, begin: Sequence[int], end: Sequence[int], strides: Sequence[int] | None = None,
                  axes: Sequence[int] | None = None, name: str = "strided_slice") -> Tensor:
    """``x[begin:end:stride]`` on each of ``axes`` (the first ``len(begin)`` when None), bounds clamped as in
    Python slicing; a negative stride walks backwards."""
    check_tensor(x, "strided_slice")
    starts, steps, shape = slice_bounds(x.shape, begin, end, strides, axes, x.name)
    return compute_nd(shape, lambda idx: x[tuple(
        i * step + start if (start, step) != (0, 1) else i for i, start, step in zip(idx, starts, steps))], name)


def slice_bounds(shape: Sequence[int], begin: Sequence[int], end: Sequence[int], strides: Sequence[int] | None = None,
                 axes: Sequence[int] | None = None, name: str = "x") -> tuple[list[int], list[int], list[int]]:
    """The first index, the step and the output's extent on each dimension of ``strided_slice``
    of an array of ``shape`` (named ``name`` in errors)."""
    axes = list(range(len(begin))) if axes is None else [normalize_axis(a, len(shape), "strided_slice") for a in axes]
    strides = [1] * len(axes) if strides is None else list(strides)
    if not len(begin) == len(end) == len(strides) == len(axes) or len(set(axes)) != len(axes) or 0 in strides:
        raise TeError(f"strided_slice: begin {begin!r}, end {end!r}, strides {strides!r} and axes {axes!r} must "
                      "have one entry per distinct axis, and no stride may be 0")
    starts, steps, extents = [0] * len(shape), [1] * len(shape), list(shape)
    for axis, b, e, s in zip(axes, begin, end, strides):
        starts[axis], stop, steps[axis] = slice(int(b), int(e), int(s)).indices(shape[axis])
        extents[axis] = len(range(starts[axis], stop, steps[axis]))
        if extents[axis] == 0:
            raise TeError(f"strided_slice: {b}:{e}:{s} selects nothing from axis {axis} of {name} {tuple(shape)}; "
                          "te tensors cannot be empty")
    return starts, steps, extents


def take(data: Tensor, indices: Tensor, axis: int = 0, name: str = "take") -> Tensor:
    """``numpy.take(data, indices, axis)`` (ONNX Gather): the output has ``indices``' dims in place of ``axis``;
    a negative index counts from the end. The read's index is the run-time value of ``indices``."""
    check_tensor(data, "take", what="data")
    check_tensor(indices, "take", what="indices")
    if indices.dtype not in ("int32", "int64"):
        raise TeError(f"take: indices {indices.name} has dtype {indices.dtype}; cast it to int32 or int64")
    axis = normalize_axis(axis, data.ndim, "take")
    extent, k = data.shape[axis], indices.ndim

    def body(idx: tuple[Expr, ...]) -> Expr:
        position = indices[idx[axis:axis + k]]
        position = te.if_then_else(position < 0, position + extent, position)
        return data[idx[:axis] + (position,) + idx[axis + k:]]

    return compute_nd(data.shape[:axis] + indices.shape + data.shape[axis + 1:], body, name)


def broadcast_to(x: Tensor, shape: Sequence[int], name: str = "broadcast_to") -> Tensor:
    """``numpy.broadcast_to``: ``x`` repeated along its size-1 and missing leading dims."""
    check_tensor(x, "broadcast_to")
    shape = tuple(int(n) for n in shape)
    if broadcast_shape(x.shape, shape, "broadcast_to") != shape:
        raise TeError(f"broadcast_to: {x.name} {x.shape} cannot be broadcast to {shape}; the target must be "
                      "at least as large in every dimension")
    return compute_nd(shape, lambda idx: broadcast_read(x, idx, shape), name)


def gather_elements(data: Tensor, indices: Tensor, axis: int = 0, name: str = "gather_elements") -> Tensor:
    """``numpy.take_along_axis`` (ONNX GatherElements): the output has ``indices``' shape and reads ``data`` at
    its own index with ``axis`` replaced by the index there; a negative index counts from the end."""
    check_tensor(data, "gather_elements", what="data")
    check_tensor(indices, "gather_elements", ndim=data.ndim, what="indices")
    axis = normalize_axis(axis, data.ndim, "gather_elements")

    def body(idx: tuple[Expr, ...]) -> Expr:
        position = indices[idx]
        position = te.if_then_else(position < 0, position + data.shape[axis], position)
        return data[(*idx[:axis], position, *idx[axis + 1:])]

    return compute_nd(indices.shape, body, name)


def trilu(x: Tensor, upper: bool = True, k: int = 0, name: str = "trilu") -> Tensor:
    """The upper (``numpy.triu``) or lower (``numpy.tril``) triangle of the last two dims, above or below the
    ``k``-th diagonal; the rest is zero."""
    check_tensor(x, "trilu")
    if x.ndim < 2:
        raise TeError(f"trilu: {x.name} {x.shape} has fewer than two dimensions; pass a matrix or a stack of them")

    def body(idx: tuple[Expr, ...]) -> Expr:
        offset = idx[-1] - idx[-2]
        return te.if_then_else(offset >= k if upper else offset <= k, x[idx], 0)

    return compute_nd(x.shape, body, name)
