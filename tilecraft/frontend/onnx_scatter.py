"""Converters of ONNX operators: scatters and indexed gathers (ScatterElements, ScatterND, Scatter, TensorScatter,
GatherND, MaxUnpool, ReverseSequence).

A scatter writes ``updates`` at positions that ``indices`` name, which te, having no stores at
computed positions, cannot say directly. Every scatter is seen as ``data`` of shape ``(rows, row)``
receiving update rows ``(count, row)`` at the rows ``targets`` names: ScatterND's targets are its index
tuples flattened over the indexed dims (rows of the trailing dims); ScatterElements' are each
element's own flat position (rows of one element); MaxUnpool's are its indices as given. Two lowerings:

- indices known at import (initializers, folded shapes): the targets are NumPy values, so each update
  is given its layer, the number of earlier updates that name the same row. A layer names every row
  at most once, so it is a ``take`` of the update rows (the constant source row of each row) and a
  ``where`` of the constant mask of the rows written, combined with what is there for a reduction
  (add, mul, max, min) or replacing it (none: the last write wins, as in ONNX's reference when indices
  repeat). One layer in the common case of distinct indices: a gather, linear in the data.
- indices computed at run time: ``ops.scatter_elements``, in which each output element searches the
  updates that name it (see ``tilecraft.ops.scatter``), costing the searched extent per element:
  ScatterElements searches along its axis only; ScatterND and MaxUnpool search all their update rows.
  te has no product reduction, so a multiplying scatter needs its indices at import.

The gathers compose existing nodes. GatherND flattens its index tuples (``floor_mod`` by the dims
wraps negative indices, a weighted ``sum`` flattens them, a constant offsets each batch) and ``take``s
from the data reshaped to rows. ReverseSequence and TensorScatter read along one axis at positions
that vary with the batch: each is a ``gather_elements`` of those positions, computed element-wise from
a constant ``arange`` and the per-batch lengths or write indices; TensorScatter's linear window (or
circular, modulo the cache's length) writes the update where the position falls inside it.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .. import ops
from ..graph.operators import OPERATORS, REDUCTION, Operator
from .onnx_importer import Importer, OnnxNode

Converter = Callable[[Importer, OnnxNode], None]

OPERATORS.update({"scatter_elements": Operator(
    lambda inputs, attrs, name: ops.scatter_elements(*inputs, **attrs, name=name), REDUCTION)})

_COMBINE = {"add": ("add", {}), "mul": ("multiply", {}), "max": ("binary", {"function": "maximum"}),
            "min": ("binary", {"function": "minimum"})}


def _constant(ctx: Importer, array: np.ndarray, hint: str) -> str:
    return ctx.add_constant(ctx.fresh_value(hint), array)


def _along(axis: int, rank: int, size: int) -> tuple[int, ...]:
    """The shape of ``size`` values laid along ``axis`` of a rank-``rank`` shape of ones."""
    return tuple(size if d == axis else 1 for d in range(rank))


def _layers(targets: np.ndarray) -> np.ndarray:
    """The layer of each update: how many updates before it name the same row."""
    order = np.argsort(targets, kind="stable")
    ranked = targets[order]
    layers = np.empty_like(order)
    layers[order] = np.arange(len(targets)) - np.searchsorted(ranked, ranked)
    return layers


def _scatter_known(ctx: Importer, data: str, targets: np.ndarray, updates: str, reduction: str, hint: str) -> str:
    """``data`` (rows, row) with the ``updates`` rows written at the rows ``targets`` names, known at import."""
    layers, rows = _layers(targets), ctx.shape(data)[0]
    out = data
    for layer in range(layers.max(initial=-1) + 1):
        chosen = np.flatnonzero(layers == layer)
        sources = np.full(rows, -1, np.int64)  # the update row each row takes; -1 (never read) where none
        sources[targets[chosen]] = chosen
        value = ctx.emit("take", [updates, _constant(ctx, sources, f"{hint}_sources{layer}")], {"axis": 0},
                         f"{hint}_layer{layer}")
        if reduction != "none":
            op, attrs = _COMBINE[reduction]
            value = ctx.emit(op, [out, value], attrs, f"{hint}_{reduction}{layer}")
        written = _constant(ctx, (sources >= 0)[:, None], f"{hint}_written{layer}")
        out = ctx.emit("where", [written, value, out], {}, f"{hint}_merged{layer}")
    return out


def _product_needs_known_indices(ctx: Importer, node: OnnxNode, reduction: str) -> None:
    """te has no product reduction to search with: a multiplying scatter reads its indices at import."""
    if reduction == "mul":
        ctx.constant(node, 1, "indices (a multiplying scatter)")


def _scatter_rows(ctx: Importer, node: OnnxNode, data: str, targets: str, updates: str, reduction: str) -> str:
    """``data`` (rows, row) with the ``updates`` rows written at the rows ``targets`` (count,) names."""
    if targets in ctx.constants:
        return _scatter_known(ctx, data, ctx.constants[targets], updates, reduction, node.name)
    _product_needs_known_indices(ctx, node, reduction)
    spread = ctx.emit("broadcast_to", [ctx.reshape(targets, (*ctx.shape(targets), 1), f"{node.name}_column")],
                      {"shape": ctx.shape(updates)}, f"{node.name}_targets")
    return ctx.emit("scatter_elements", [data, spread, updates], {"axis": 0, "reduction": reduction}, node.name)


def _scatter_elements(ctx: Importer, node: OnnxNode) -> None:
    data, indices, updates = node.inputs[:3]
    shape, reduction = ctx.shape(data), node.attrs.get("reduction", "none")
    axis = node.attrs.get("axis", 0) % len(shape)
    if indices not in ctx.constants:
        _product_needs_known_indices(ctx, node, reduction)
        return ctx.emit_for(node, "scatter_elements", [data, indices, updates], {"axis": axis, "reduction": reduction})
    known = ctx.constants[indices]
    coordinates = list(np.indices(known.shape))
    coordinates[axis] = known % shape[axis]
    out = _scatter_known(ctx, ctx.reshape(data, (math.prod(shape), 1), f"{node.name}_rows"),
                         np.ravel_multi_index(coordinates, shape).ravel(),
                         ctx.reshape(updates, (known.size, 1), f"{node.name}_updates"), reduction, node.name)
    ctx.alias(node.outputs[0], ctx.reshape(out, shape, f"{node.name}_shaped"))


def _flat_positions(ctx: Importer, indices: str, dims: Sequence[int], hint: str) -> str:
    """The index tuples (the last dim of ``indices``) into ``dims`` as flat row-major positions; a negative
    index counts from the end."""
    dtype = ctx.values[indices].dtype
    wrapped = ctx.emit("binary", [indices, _constant(ctx, np.array(dims, dtype), f"{hint}_dims")],
                       {"function": "floor_mod"}, f"{hint}_wrapped")
    strides = np.array([math.prod(dims[j + 1:]) for j in range(len(dims))], dtype)
    scaled = ctx.emit("multiply", [wrapped, _constant(ctx, strides, f"{hint}_strides")], {}, f"{hint}_scaled")
    return ctx.emit("sum", [scaled], {"axis": -1}, f"{hint}_positions")


def _scatter_nd(ctx: Importer, node: OnnxNode) -> None:
    data, indices, updates = node.inputs[:3]
    shape, (*batch, depth) = ctx.shape(data), ctx.shape(indices)
    rows, row, count = math.prod(shape[:depth]), math.prod(shape[depth:]), math.prod(batch)
    targets = ctx.reshape(_flat_positions(ctx, indices, shape[:depth], node.name), (count,), f"{node.name}_targets")
    out = _scatter_rows(ctx, node, ctx.reshape(data, (rows, row), f"{node.name}_rows"), targets,
                        ctx.reshape(updates, (count, row), f"{node.name}_updates"), node.attrs.get("reduction", "none"))
    ctx.alias(node.outputs[0], ctx.reshape(out, shape, f"{node.name}_shaped"))


def _gather_nd(ctx: Importer, node: OnnxNode) -> None:
    data, indices = node.inputs[:2]
    shape, batch, depth = ctx.shape(data), node.attrs.get("batch_dims", 0), ctx.shape(indices)[-1]
    positions = _flat_positions(ctx, indices, shape[batch:batch + depth], node.name)
    if batch:  # each batch reads its own block of rows
        block = math.prod(shape[batch:batch + depth])
        offsets = np.arange(math.prod(shape[:batch])) * block
        offsets = offsets.reshape(*shape[:batch], *[1] * (len(ctx.shape(positions)) - batch))
        positions = ctx.emit("add", [positions, _constant(ctx, offsets.astype(ctx.values[positions].dtype),
                                                          f"{node.name}_offsets")], {}, f"{node.name}_batched")
    rows = ctx.reshape(data, (math.prod(shape[:batch + depth]), *shape[batch + depth:]), f"{node.name}_rows")
    ctx.emit_for(node, "take", [rows, positions], {"axis": 0})


def _max_unpool(ctx: Importer, node: OnnxNode) -> None:
    """The flat indices of MaxPool, over the whole unpooled tensor, say where each value goes. An ``output_shape``
    other than the unpooled shape is ambiguous: ONNX's reference (and its node test) scatters into the unpooled shape
    and pads it at the end of each dim, onnxruntime reads the indices in ``output_shape`` (as the ONNX maintainers
    mean it to: onnx/onnx#2398, microsoft/onnxruntime#2193), so it is refused rather than risk either."""
    x, indices = node.inputs[:2]
    shape, kernel = ctx.shape(x), node.attrs["kernel_shape"]
    strides, pads = node.attrs.get("strides", [1] * len(kernel)), node.attrs.get("pads", [0] * 2 * len(kernel))
    unpooled = (*shape[:2], *((n - 1) * s - pads[d] - pads[d + len(kernel)] + k
                              for d, (n, s, k) in enumerate(zip(shape[2:], strides, kernel))))
    wanted = ctx.constant(node, 2, "output shape")
    if wanted is not None and tuple(wanted.tolist()) != unpooled:
        raise node.unsupported(f"an output_shape {wanted.tolist()} other than the unpooled shape {list(unpooled)} "
                               "(ONNX's reference and onnxruntime place the values differently)")
    zeros = _constant(ctx, np.zeros((math.prod(unpooled), 1), ctx.values[x].dtype), f"{node.name}_zeros")
    count = math.prod(shape)
    out = _scatter_rows(ctx, node, zeros, ctx.reshape(indices, (count,), f"{node.name}_targets"),
                        ctx.reshape(x, (count, 1), f"{node.name}_updates"), "none")
    ctx.alias(node.outputs[0], ctx.reshape(out, unpooled, f"{node.name}_unpooled"))


def _gather_along(ctx: Importer, x: str, positions: str, axis: int, shape: Sequence[int], hint: str) -> str:
    """``x`` read along ``axis`` at ``positions``, broadcast to the output ``shape``."""
    spread = ctx.emit("broadcast_to", [positions], {"shape": tuple(shape)}, f"{hint}_positions")
    return ctx.emit("gather_elements", [x, spread], {"axis": axis}, f"{hint}_gathered")


def _reverse_sequence(ctx: Importer, node: OnnxNode) -> None:
    """Step ``t`` of batch ``b`` reads step ``length[b] - 1 - t`` while ``t < length[b]``, else itself."""
    x, lengths = node.inputs[:2]
    shape, time, batch = ctx.shape(x), node.attrs.get("time_axis", 0), node.attrs.get("batch_axis", 1)
    dtype = ctx.values[lengths].dtype
    steps = np.arange(shape[time], dtype=dtype).reshape(_along(time, len(shape), -1))
    lengths = ctx.reshape(lengths, _along(batch, len(shape), shape[batch]), f"{node.name}_lengths")
    kept = _constant(ctx, steps, f"{node.name}_steps")
    inside = ctx.emit("binary", [kept, lengths], {"function": "less"}, f"{node.name}_inside")
    mirrored = ctx.emit("add", [lengths, _constant(ctx, -1 - steps, f"{node.name}_back")], {}, f"{node.name}_mirrored")
    positions = ctx.emit("where", [inside, mirrored, kept], {}, f"{node.name}_positions")
    ctx.alias(node.outputs[0], _gather_along(ctx, x, positions, time, shape, node.name))


def _tensor_scatter(ctx: Importer, node: OnnxNode) -> None:
    """Cache position ``t`` of batch ``b`` takes update step ``t - write_index[b]`` (modulo the cache's length when
    circular) where that step exists, else keeps the past cache."""
    past, update = node.inputs[:2]
    shape = ctx.shape(past)
    axis = node.attrs.get("axis", -2) % len(shape)
    if axis == 0:
        raise node.unsupported("the sequence on axis 0, the batch axis")
    length, written = shape[axis], ctx.shape(update)[axis]
    starts = node.input(2) or _constant(ctx, np.zeros(shape[0], np.int64), f"{node.name}_starts")
    positions = np.arange(length, dtype=ctx.values[starts].dtype).reshape(_along(axis, len(shape), -1))
    steps = ctx.emit("subtract", [_constant(ctx, positions, f"{node.name}_positions"), ctx.reshape(
        starts, _along(0, len(shape), shape[0]), f"{node.name}_starts")], {}, f"{node.name}_steps")
    if node.attrs.get("mode", "linear") == "circular":
        steps = ctx.emit("binary", [steps, ctx.scalar(length, steps)], {"function": "floor_mod"}, f"{node.name}_mod")
    source = ctx.emit("clip", [steps], {"a_min": 0, "a_max": written - 1}, f"{node.name}_source")
    inside = ctx.emit("binary", [source, steps], {"function": "equal"}, f"{node.name}_inside")
    ctx.emit_for(node, "where", [inside, _gather_along(ctx, update, source, axis, shape, node.name), past])


SCATTER_CONVERTERS: dict[str, Converter] = {
    "ScatterElements": _scatter_elements, "Scatter": _scatter_elements, "ScatterND": _scatter_nd,
    "GatherND": _gather_nd, "MaxUnpool": _max_unpool, "ReverseSequence": _reverse_sequence,
    "TensorScatter": _tensor_scatter,
}
