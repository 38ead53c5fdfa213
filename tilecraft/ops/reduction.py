"""Reductions over chosen axes: sum, mean, max and min, with NumPy's ``axis`` and ``keepdims``; the positions
of the largest and smallest values (argmax, argmin); running sums (cumsum)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .. import te
from ..te.tensor import Tensor
from .common import check_tensor, compute_nd, merge_index, normalize_axes, normalize_axis, require_float

Axis = int | Sequence[int] | None


def _reduce(x: Tensor, axis: Axis, keepdims: bool, combiner: Callable, name: str, op: str) -> Tensor:
    check_tensor(x, op)
    axes = normalize_axes(axis, x.ndim, op)
    kept = [d for d in range(x.ndim) if d not in axes]
    shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)] if keepdims else [x.shape[d] for d in kept]

    def body(idx):
        reduce_axes = [te.reduce_axis((0, x.shape[d]), name=f"k{d}") for d in axes]
        kept_idx = [idx[d] for d in kept] if keepdims else idx
        return combiner(x[merge_index(x.ndim, axes, kept_idx, reduce_axes)], axis=reduce_axes)

    return compute_nd(shape, body, name)


def sum(x: Tensor, axis: Axis = None, keepdims: bool = False, name: str = "sum") -> Tensor:  # noqa: A001
    """Sum over ``axis`` (all when None), as ``numpy.sum``; any layout."""
    return _reduce(x, axis, keepdims, te.sum, name, "sum")


def max(x: Tensor, axis: Axis = None, keepdims: bool = False, name: str = "max") -> Tensor:  # noqa: A001
    """Maximum over ``axis`` (all when None), as ``numpy.max``; any layout."""
    return _reduce(x, axis, keepdims, te.max, name, "max")


def min(x: Tensor, axis: Axis = None, keepdims: bool = False, name: str = "min") -> Tensor:  # noqa: A001
    """Minimum over ``axis`` (all when None), as ``numpy.min``; any layout."""
    return _reduce(x, axis, keepdims, te.min, name, "min")


def mean(x: Tensor, axis: Axis = None, keepdims: bool = False, name: str = "mean") -> Tensor:
    """Mean over ``axis`` (all when None) of a float tensor: a sum ``{name}_sum``, then a division."""
    check_tensor(x, "mean")
    require_float(x, "mean")
    total = sum(x, axis, keepdims, name=f"{name}_sum")
    count = math.prod(x.shape[d] for d in normalize_axes(axis, x.ndim, "mean"))
    return compute_nd(total.shape, lambda idx: total[idx] / count, name)


def _arg(x: Tensor, axis: int, keepdims: bool, last: bool, combiner: Callable, name: str, op: str) -> Tensor:
    check_tensor(x, op)
    axis = normalize_axis(axis, x.ndim, op)
    best = _reduce(x, axis, True, combiner, f"{name}_value", op)
    extent = x.shape[axis]

    def body(idx):
        idx = idx if keepdims else (*idx[:axis], 0, *idx[axis:])
        k = te.reduce_axis((0, extent), name="k")
        hit = te.equal(x[(*idx[:axis], k, *idx[axis + 1:])], best[(*idx[:axis], 0, *idx[axis + 1:])])
        position = k.var.astype("int64")
        if last:
            return te.max(te.if_then_else(hit, position, -1), axis=k)
        return te.min(te.if_then_else(hit, position, extent), axis=k)

    return compute_nd([1 if d == axis else n for d, n in enumerate(x.shape) if keepdims or d != axis], body, name)


def argmax(x: Tensor, axis: int = 0, keepdims: bool = True, select_last_index: bool = False,
           name: str = "argmax") -> Tensor:
    """The int64 position of the largest value along ``axis`` (ONNX ArgMax): the first one, or the last
    with ``select_last_index``; a max ``{name}_value``, then the positions that hold it."""
    return _arg(x, axis, keepdims, select_last_index, te.max, name, "argmax")


def argmin(x: Tensor, axis: int = 0, keepdims: bool = True, select_last_index: bool = False,
           name: str = "argmin") -> Tensor:
    """The int64 position of the smallest value along ``axis`` (ONNX ArgMin), as ``argmax``."""
    return _arg(x, axis, keepdims, select_last_index, te.min, name, "argmin")


def cumsum(x: Tensor, axis: int = 0, exclusive: bool = False, reverse: bool = False, name: str = "cumsum") -> Tensor:
    """Running sums along ``axis`` (ONNX CumSum): ``exclusive`` leaves out the element itself, ``reverse``
    sums from the end. Each output is its own sum over the axis, quadratic in its extent."""
    check_tensor(x, "cumsum")
    axis = normalize_axis(axis, x.ndim, "cumsum")

    def body(idx):
        k = te.reduce_axis((0, x.shape[axis]), name="k")
        i = idx[axis]
        taken = (k.var > i if exclusive else k.var >= i) if reverse else (k.var < i if exclusive else k.var <= i)
        return te.sum(te.if_then_else(taken, x[(*idx[:axis], k, *idx[axis + 1:])], 0), axis=k)

    return compute_nd(x.shape, body, name)
