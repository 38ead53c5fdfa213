"""Scatters whose indices are known only at run time (ONNX ScatterElements): each output element searches
the updates that may land on it.

te has no stores at computed positions, so a scatter is turned around into a gather: output
element ``idx`` looks along ``axis`` of ``indices`` for the entries that name its own position
there, and takes the updates found. With ``reduction="none"`` a first stage ``{name}_last`` finds
the last entry that names it (later writes win, as in ONNX's reference when indices repeat), and
the output reads that update or keeps ``data``; a reduction (add, max, min) is a first stage
``{name}_{reduction}`` over every matching entry, combined with ``data``. The search costs the
extent of ``axis`` in ``indices`` per output element. There is no product reduction in te, so a
multiplying scatter needs its indices at import (the ONNX frontend precomputes those).
"""

from __future__ import annotations

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import Index, check_tensor, compute_nd, normalize_axis

_REDUCERS = {"add": te.sum, "max": te.max, "min": te.min}
_COMBINERS = {"add": lambda a, b: a + b, "max": te.max, "min": te.min}


def scatter_elements(data: Tensor, indices: Tensor, updates: Tensor, axis: int = 0, reduction: str = "none",
                     name: str = "scatter_elements") -> Tensor:
    """ONNX ScatterElements: ``data`` where ``out[..., indices[i, j, ...], ...] = updates[i, j, ...]`` along
    ``axis`` (a negative index counts from the end); ``reduction`` (none, add, max, min) says how a written
    value combines with what is there. ``indices`` and ``updates`` have one shape, no larger than ``data``'s
    outside ``axis``; the positions they do not cover keep ``data``."""
    check_tensor(data, "scatter_elements", what="data")
    check_tensor(indices, "scatter_elements", ndim=data.ndim, what="indices")
    check_tensor(updates, "scatter_elements", ndim=data.ndim, what="updates")
    axis = normalize_axis(axis, data.ndim, "scatter_elements")
    if indices.shape != updates.shape or any(u > n for d, (u, n) in enumerate(zip(updates.shape, data.shape))
                                             if d != axis) or indices.dtype not in ("int32", "int64"):
        raise TeError(f"scatter_elements: indices {indices.name} {indices.shape} {indices.dtype} and updates "
                      f"{updates.name} {updates.shape} need one shape, no larger than data {data.shape} outside "
                      f"axis {axis}, and int32 or int64 indices")
    if reduction not in ("none", *_REDUCERS) or updates.dtype != data.dtype:
        raise TeError(f"scatter_elements: reduction {reduction!r} of {updates.dtype} updates into {data.dtype} data; "
                      f"use one of none, {', '.join(_REDUCERS)} (a product needs constant indices), and one dtype")
    extent = data.shape[axis]

    def entry(idx: Index, k: Expr) -> Index:
        return (*idx[:axis], k, *idx[axis + 1:])

    def matches(idx: Index, k: te.IterVar) -> Expr:
        covered = [i < n for d, (i, n) in enumerate(zip(idx, updates.shape)) if d != axis and n < data.shape[d]]
        position = indices[entry(idx, k)]
        named = te.equal(te.if_then_else(position < 0, position + extent, position), idx[axis])
        return te.all(*covered, named)  # the read of indices is guarded by the coverage before it

    def search(combine, source, stage: str) -> Tensor:
        def body(idx: Index) -> Expr:
            k = te.reduce_axis((0, updates.shape[axis]), name="k")
            return combine(source(idx, k), axis=k, where=matches(idx, k))

        return compute_nd(data.shape, body, f"{name}_{stage}")

    if reduction == "none":
        last = search(te.max, lambda idx, k: k.var, "last")
        return compute_nd(data.shape, lambda idx: te.if_then_else(
            last[idx] >= 0, updates[entry(idx, last[idx])], data[idx]), name)
    found = search(_REDUCERS[reduction], lambda idx, k: updates[entry(idx, k)], reduction)
    return compute_nd(data.shape, lambda idx: _COMBINERS[reduction](data[idx], found[idx]), name)
