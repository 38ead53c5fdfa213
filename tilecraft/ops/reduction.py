"""Reductions over chosen axes: sum, mean, max and min, with NumPy's ``axis`` and ``keepdims``."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .. import te
from ..te.tensor import Tensor
from .common import check_tensor, compute_nd, merge_index, normalize_axes, require_float

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
