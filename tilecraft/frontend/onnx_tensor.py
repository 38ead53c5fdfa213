"""Converters of ONNX operators that tilecraft composes from its own nodes rather than a te operator each:
products (ReduceProd, CumProd), one-hot forms (Hardmax, OneHot), Tile, EyeLike, DepthToSpace, the
p-norms (LpNormalization, LpPool, GlobalLpPool), and TopK.

A product over an axis multiplies its two halves until one element is left, and a running
product is the log-step scan (each step multiplies by the values ``2^k`` positions back),
so both are ``log2(size)`` element-wise nodes, exact for integers. One-hot forms compare
the positions along an axis with a constant ``arange``. An Lp pool is the ``p``-th root of
the sum of ``|x|^p`` over each window, an average pool counting its padding times the
window's size; a global one is the root of the sum over all the spatial dims.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from ..te.dtype import is_float
from .onnx_importer import Importer, OnnxNode
from .onnx_nn import NN_CONVERTERS

Converter = Callable[[Importer, OnnxNode], None]


def _slice(ctx: Importer, x: str, axis: int, begin: int, end: int, hint: str, step: int = 1) -> str:
    return ctx.emit("strided_slice", [x], {"begin": (begin,), "end": (end,), "strides": (step,), "axes": (axis,)}, hint)


def _product(ctx: Importer, x: str, axis: int, hint: str) -> str:
    """The product of ``x`` over ``axis``, kept as a dim of size 1."""
    while (size := ctx.shape(x)[axis]) > 1:
        half = size // 2
        product = ctx.emit("multiply", [_slice(ctx, x, axis, 0, half, f"{hint}_low"),
                                        _slice(ctx, x, axis, half, 2 * half, f"{hint}_high")], {}, hint)
        odd = [_slice(ctx, x, axis, 2 * half, size, f"{hint}_odd")] if size % 2 else []
        x = ctx.emit("concat", [product, *odd], {"axis": axis}, f"{hint}_rest") if odd else product
    return x


def _reduce_prod(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    axes = ctx.constant(node, 1, "axes") if node.opset >= 18 else node.attrs.get("axes")
    keepdims = bool(node.attrs.get("keepdims", 1))
    if axes is None or np.size(axes) == 0:
        if node.attrs.get("noop_with_empty_axes", 0):
            return ctx.alias(node.outputs[0], x)
        axes = range(len(shape))
    axes = sorted({int(a) % len(shape) for a in np.ravel(axes)})
    if 0 in shape:  # the product of nothing is 1
        ones = np.prod(np.zeros(shape, ctx.values[x].dtype), axis=tuple(axes), keepdims=keepdims)
        return ctx.add_constant(node.outputs[0], ones)
    for axis in axes:
        x = _product(ctx, x, axis, f"{node.name}_axis{axis}")
    ctx.alias(node.outputs[0], x if keepdims else ctx.reshape(
        x, [n for d, n in enumerate(shape) if d not in axes], f"{node.name}_dropped"))


def _shifted(ctx: Importer, x: str, axis: int, shift: int, hint: str) -> str:
    """``x`` moved ``shift`` positions along ``axis``, ones coming in."""
    shape, dtype = ctx.shape(x), ctx.values[x].dtype
    before = tuple(shift if d == axis else 0 for d in range(len(shape)))
    return ctx.emit("pad", [_slice(ctx, x, axis, 0, shape[axis] - shift, f"{hint}_kept")], {
        "pad_before": before, "pad_after": (0,) * len(shape), "pad_value": 1.0 if is_float(dtype) else 1}, hint)


def _cumprod(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    axis = int(ctx.constant(node, 1, "axis").reshape(())) % len(shape)
    size, reverse = shape[axis], node.attrs.get("reverse", 0)
    if reverse:
        x = _slice(ctx, x, axis, size - 1, -size - 1, f"{node.name}_reversed", -1)
    if node.attrs.get("exclusive", 0):
        x = _shifted(ctx, x, axis, 1, f"{node.name}_exclusive") if size > 1 else ctx.add_constant(
            ctx.fresh_value(f"{node.name}_ones"), np.ones(shape, ctx.values[x].dtype))
    shift = 1
    while shift < size:
        x = ctx.emit("multiply", [x, _shifted(ctx, x, axis, shift, f"{node.name}_by{shift}")], {},
                     f"{node.name}_step{shift}")
        shift *= 2
    ctx.alias(node.outputs[0], _slice(ctx, x, axis, size - 1, -size - 1, f"{node.name}_back", -1) if reverse else x)


def _positions(ctx: Importer, size: int, axis: int, rank: int, hint: str) -> str:
    """The constant ``arange(size)`` along ``axis`` of a rank-``rank`` shape of ones."""
    return ctx.add_constant(ctx.fresh_value(hint), np.arange(size).reshape([-1 if d == axis else 1
                                                                             for d in range(rank)]))


def _hardmax(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    axis = node.attrs.get("axis", -1 if node.opset >= 13 else 1) % len(shape)
    if node.opset < 13:  # over the dims from axis on, as one
        x, axis = ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])), f"{node.name}_2d"), 1
    best = ctx.emit("argmax", [x], {"axis": axis, "keepdims": True, "select_last_index": False}, f"{node.name}_arg")
    positions = _positions(ctx, ctx.shape(x)[axis], axis, len(ctx.shape(x)), f"{node.name}_positions")
    hit = ctx.emit("binary", [best, positions], {"function": "equal"}, f"{node.name}_hit")
    out = ctx.emit("cast", [hit], {"dtype": ctx.values[node.inputs[0]].dtype}, f"{node.name}_cast")
    ctx.alias(node.outputs[0], ctx.reshape(out, shape, f"{node.name}_nd"))


def _one_hot(ctx: Importer, node: OnnxNode) -> None:
    indices, values = node.inputs[0], node.inputs[2]
    depth = int(ctx.constant(node, 1, "depth").reshape(()))
    shape = ctx.shape(indices)
    axis = node.attrs.get("axis", -1) % (len(shape) + 1)
    if ctx.values[indices].dtype != "int64":
        indices = ctx.emit("cast", [indices], {"dtype": "int64"}, f"{node.name}_int64")
    negative = ctx.emit("binary", [indices, ctx.scalar(0, indices)], {"function": "less"}, f"{node.name}_negative")
    wrapped = ctx.emit("add", [indices, ctx.scalar(depth, indices)], {}, f"{node.name}_wrapped")
    indices = ctx.emit("where", [negative, wrapped, indices], {}, f"{node.name}_index")
    indices = ctx.reshape(indices, (*shape[:axis], 1, *shape[axis:]), f"{node.name}_expanded")
    hit = ctx.emit("binary", [indices, _positions(ctx, depth, axis, len(shape) + 1, f"{node.name}_positions")],
                   {"function": "equal"}, f"{node.name}_hit")
    off, on = (ctx.reshape(_slice(ctx, values, 0, k, k + 1, f"{node.name}_value{k}"), (), f"{node.name}_scalar{k}")
               for k in (0, 1))
    ctx.emit_for(node, "where", [hit, on, off])


def _tile(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    repeats = [int(r) for r in ctx.constant(node, 1, "repeats")]
    interleaved = ctx.reshape(x, [v for n in shape for v in (1, n)], f"{node.name}_interleaved")
    wide = ctx.emit("broadcast_to", [interleaved], {"shape": tuple(v for r, n in zip(repeats, shape) for v in (r, n))},
                    f"{node.name}_repeated")
    ctx.alias(node.outputs[0], ctx.reshape(wide, [r * n for r, n in zip(repeats, shape)], f"{node.name}_tiled"))


def _eye_like(ctx: Importer, node: OnnxNode) -> None:
    import onnx

    rows, columns = ctx.shape(node.inputs[0])
    code = node.attrs.get("dtype")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(code) if code else ctx.values[node.inputs[0]].dtype
    ctx.add_constant(node.outputs[0], np.eye(rows, columns, node.attrs.get("k", 0), dtype))


def _depth_to_space(ctx: Importer, node: OnnxNode) -> None:
    (n, c, h, w), b = ctx.shape(node.inputs[0]), node.attrs["blocksize"]
    dcr = node.attrs.get("mode", "DCR") == "DCR"  # depth-column-row, else column-row-depth
    blocks = ctx.reshape(node.inputs[0], (n, b, b, c // b // b, h, w) if dcr else (n, c // b // b, b, b, h, w),
                         f"{node.name}_blocks")
    moved = ctx.emit("transpose", [blocks], {"axes": (0, 3, 4, 1, 5, 2) if dcr else (0, 1, 4, 2, 5, 3)},
                     f"{node.name}_moved")
    ctx.alias(node.outputs[0], ctx.reshape(moved, (n, c // b // b, h * b, w * b), f"{node.name}_space"))


def _lp_normalization(ctx: Importer, node: OnnxNode) -> None:
    x, p = node.inputs[0], node.attrs.get("p", 2)
    powered = ctx.emit("abs", [x], {}, f"{node.name}_abs") if p == 1 else ctx.emit("multiply", [x, x], {},
                                                                                      f"{node.name}_square")
    total = ctx.emit("sum", [powered], {"axis": node.attrs.get("axis", -1), "keepdims": True}, f"{node.name}_sum")
    norm = total if p == 1 else ctx.emit("sqrt", [total], {}, f"{node.name}_norm")
    zero = ctx.emit("binary", [norm, ctx.scalar(0, x)], {"function": "equal"}, f"{node.name}_zero")
    ctx.emit_for(node, "where", [zero, ctx.scalar(0, x), ctx.emit("divide", [x, norm], {}, f"{node.name}_divided")])


def _lp_pool(ctx: Importer, node: OnnxNode) -> None:
    x, p = node.inputs[0], float(node.attrs.get("p", 2))
    powered = ctx.emit("power", [ctx.emit("abs", [x], {}, f"{node.name}_abs"), ctx.scalar(p, x)], {},
                       f"{node.name}_powered")
    mean = ctx.fresh_value(f"{node.name}_mean")
    attrs = {**{k: v for k, v in node.attrs.items() if k != "p"}, "count_include_pad": 1}
    NN_CONVERTERS["AveragePool"](ctx, replace(node, op_type="AveragePool", inputs=(powered,), outputs=(mean,),
                                              attrs=attrs))
    total = ctx.emit("multiply", [ctx.resolve(mean), ctx.scalar(math.prod(node.attrs["kernel_shape"]), x)], {},
                     f"{node.name}_sum")
    ctx.emit_for(node, "power", [total, ctx.scalar(1 / p, x)])


def _global_lp_pool(ctx: Importer, node: OnnxNode) -> None:
    x, p = node.inputs[0], float(node.attrs.get("p", 2))
    powered = ctx.emit("power", [ctx.emit("abs", [x], {}, f"{node.name}_abs"), ctx.scalar(p, x)], {},
                       f"{node.name}_powered")
    total = ctx.emit("sum", [powered], {"axis": tuple(range(2, len(ctx.shape(x)))), "keepdims": True},
                     f"{node.name}_sum")
    ctx.emit_for(node, "power", [total, ctx.scalar(1 / p, x)])


def _top_k(ctx: Importer, node: OnnxNode) -> None:
    """The ``k`` largest (smallest) along an axis by rank: an element's rank is the number of elements that beat it,
    or equal it at a lower index; the output ``r`` is the element of rank ``r``. Comparing every pair costs
    ``size^2``, fine for the short axes of detection heads, not for a vocabulary."""
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    k = int(ctx.constant(node, 1, "k").reshape(())) if node.opset >= 10 else node.attrs["k"]
    axis, rank = node.attrs.get("axis", -1) % len(shape), len(shape)
    order = [d for d in range(rank) if d != axis] + [axis]
    rows = ctx.emit("transpose", [x], {"axes": tuple(order)}, f"{node.name}_last") if axis != rank - 1 else x
    *outer, size = ctx.shape(rows)
    mine, theirs = (ctx.reshape(rows, (*outer, *pair), f"{node.name}_{hint}") for hint, pair in
                    (("mine", (size, 1)), ("theirs", (1, size))))
    beats = ctx.emit("binary", [theirs, mine], {"function": "greater" if node.attrs.get("largest", 1) else "less"},
                     f"{node.name}_beats")
    earlier = ctx.add_constant(ctx.fresh_value(f"{node.name}_earlier"), np.tri(size, k=-1, dtype=bool))
    ties = ctx.emit("binary", [ctx.emit("binary", [theirs, mine], {"function": "equal"}, f"{node.name}_equal"),
                               earlier], {"function": "logical_and"}, f"{node.name}_ties")
    ahead = ctx.emit("cast", [ctx.emit("binary", [beats, ties], {"function": "logical_or"}, f"{node.name}_ahead")],
                     {"dtype": "int64"}, f"{node.name}_count")
    ranks = ctx.emit("sum", [ahead], {"axis": -1, "keepdims": True}, f"{node.name}_rank")
    hit = ctx.emit("binary", [ranks, _positions(ctx, k, 1, 2, f"{node.name}_wanted")], {"function": "equal"},
                   f"{node.name}_hit")
    back = tuple(order.index(d) for d in range(rank))
    for output, source in zip(node.outputs, (mine, _positions(ctx, size, 0, 2, f"{node.name}_index"))):
        picked = ctx.emit("where", [hit, source, ctx.scalar(0, source)], {}, f"{node.name}_{output}_picked")
        out = ctx.emit("sum", [picked], {"axis": -2}, f"{node.name}_{output}_sum")
        ctx.alias(output, out if axis == rank - 1 else ctx.emit("transpose", [out], {"axes": back},
                                                               f"{node.name}_{output}_back"))


TENSOR_CONVERTERS: dict[str, Converter] = {
    "ReduceProd": _reduce_prod, "CumProd": _cumprod, "Hardmax": _hardmax, "OneHot": _one_hot, "Tile": _tile,
    "EyeLike": _eye_like, "DepthToSpace": _depth_to_space, "LpNormalization": _lp_normalization, "LpPool": _lp_pool,
    "GlobalLpPool": _global_lp_pool, "TopK": _top_k,
}
