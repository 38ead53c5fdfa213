"""The ONNX operators tilecraft imports: ``CONVERTERS`` maps an op type to its converter.

A converter reads one ``OnnxNode`` and emits tilecraft nodes through the ``Importer``
(``emit`` infers shapes and folds constant nodes), naming the node's ONNX outputs with
its last emit or an alias. This module holds the element-wise, shape and data-movement
operators; ``onnx_nn`` the neural-network ones. Opset differences are handled where they
arise: inputs that were attributes in older opsets (Split, Squeeze, Unsqueeze, Reduce*,
Slice, Pad, Clip). Inputs that act as attributes (shapes, axes, pads, bounds) must be
constants, else the import stops with a ``RuntimeInputError`` naming the input.

Comparisons, logic, Mod and PRelu are ``ops.binary`` nodes of a named function, rounding and
the activations ``ops.unary`` ones with the node's attributes as parameters; the variadic
Sum, Mean, Max and Min fold their inputs pairwise; the sum-based reductions (ReduceL1, L2,
SumSquare, LogSum, LogSumExp) are a ``sum`` between element-wise steps. The graph operators
these converters emit beyond the built-in ones are registered into ``OPERATORS`` here.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .. import ops
from ..graph.operators import BROADCAST, ELEMENTWISE, INJECTIVE, OPERATORS, REDUCTION, Operator
from ..ops.common import broadcast_shape
from ..te.dtype import DTYPES, is_float
from .onnx_importer import Importer, OnnxNode, checked_array
from .onnx_conv import CONV_CONVERTERS
from .onnx_nn import NN_CONVERTERS
from .onnx_quant import QUANT_CONVERTERS
from .onnx_recurrent import RECURRENT_CONVERTERS
from .onnx_resize import convert_resize
from .onnx_sampling import SAMPLING_CONVERTERS
from .onnx_scatter import SCATTER_CONVERTERS
from .onnx_signal import SIGNAL_CONVERTERS
from .onnx_tensor import TENSOR_CONVERTERS

Converter = Callable[[Importer, OnnxNode], None]

OPERATORS.update({op: Operator(lambda inputs, attrs, name, fn=getattr(ops, op): fn(*inputs, **attrs, name=name), kind)
                  for op, kind in {"binary": BROADCAST, "where": BROADCAST, "unary": ELEMENTWISE, "trilu": INJECTIVE,
                                   "gather_elements": INJECTIVE, "argmax": REDUCTION, "argmin": REDUCTION,
                                   "cumsum": REDUCTION}.items()})


def _axes(node: OnnxNode, ctx: Importer, since: int, what: str = "axes") -> tuple[int, ...] | None:
    """Axes given as an attribute before opset ``since``, as a constant input from it on; None when absent."""
    axes = ctx.constant(node, 1, what) if node.opset >= since else node.attrs.get("axes")
    return None if axes is None or np.size(axes) == 0 else tuple(int(a) for a in np.ravel(axes))


def _unary(op: str) -> Converter:
    return lambda ctx, node: ctx.emit_for(node, op, node.inputs[:1])


def _function(op: str, function: str) -> Converter:
    """An ``ops.unary`` (the node's attributes its parameters) or ``ops.binary`` node of ``function``."""
    return lambda ctx, node: ctx.emit_for(node, op, node.inputs[:2], {  # Mod's fmod=1 is C's fmod
        "function": "fmod" if node.attrs.get("fmod") else function, **(node.attrs if op == "unary" else {})})


def _variadic(op: str, function: str | None = None) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        out = node.inputs[0]
        for k, x in enumerate(node.inputs[1:]):
            out = ctx.emit(op, [out, x], {"function": function} if function else {}, f"{node.name}_{k}")
        if node.op_type == "Mean":
            out = ctx.emit("divide", [out, ctx.scalar(len(node.inputs), out)], {}, f"{node.name}_mean")
        ctx.alias(node.outputs[0], out)

    return convert


def _binary(op: str) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        dtype = ctx.values[node.inputs[0]].dtype
        integer_division = op == "divide" and not is_float(dtype)  # ONNX's truncates, te's floors
        out = ctx.emit("truncate_divide" if integer_division else op, node.inputs[:2], {}, node.name)
        if ctx.values[out].dtype != dtype:  # Pow of an int by a float keeps the int type
            out = ctx.emit("cast", [out], {"dtype": dtype}, f"{node.name}_cast")
        ctx.alias(node.outputs[0], out)

    return convert


def _cast(ctx: Importer, node: OnnxNode) -> None:
    if node.op_type == "CastLike":  # to the dtype of its second input
        return ctx.emit_for(node, "cast", node.inputs[:1], {"dtype": ctx.values[node.inputs[1]].dtype})
    import onnx

    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"])).name
    if dtype not in DTYPES:
        raise node.unsupported(f"casting to {dtype}")
    ctx.emit_for(node, "cast", node.inputs[:1], {"dtype": dtype})


def _clip(ctx: Importer, node: OnnxNode) -> None:
    if node.opset < 11:
        bounds = [node.attrs.get("min"), node.attrs.get("max")]
    else:
        bounds = [ctx.constant(node, i, "clip bound") for i in (1, 2)]
    kind = float if is_float(ctx.values[node.inputs[0]].dtype) else int
    a_min, a_max = (None if b is None or not np.isfinite(b) else kind(np.asarray(b).item()) for b in bounds)
    if a_min is not None and a_max is not None and a_min > a_max:
        a_min = a_max  # min(max(x, a_min), a_max) is a_max everywhere
    ctx.emit_for(node, "clip", node.inputs[:1], {"a_min": a_min, "a_max": a_max})


def _range(ctx: Importer, node: OnnxNode) -> None:
    start, limit, delta = (ctx.constant(node, i, "range bound").reshape(()) for i in range(3))
    if (count := math.ceil((limit - start) / delta)) <= 0:
        raise node.unsupported("an empty range")
    ctx.add_constant(node.outputs[0], (start + delta * np.arange(count)).astype(start.dtype))


def _gelu(ctx: Importer, node: OnnxNode) -> None:
    ctx.emit_for(node, "gelu", node.inputs[:1], {"approximate": node.attrs.get("approximate", "none")})


def _constant(ctx: Importer, node: OnnxNode) -> None:
    (key, value), = node.attrs.items()
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}
    if key not in kinds:
        raise node.unsupported(f"a constant given as {key}")
    ctx.add_constant(node.outputs[0], checked_array(np.asarray(value, kinds[key]), node.outputs[0]))


def _shape_of(ctx: Importer, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
    ctx.add_constant(node.outputs[0], np.array(shape[start:end], np.int64))


def _size(ctx: Importer, node: OnnxNode) -> None:
    ctx.add_constant(node.outputs[0], np.array(math.prod(ctx.shape(node.inputs[0])), np.int64))


def _constant_of_shape(ctx: Importer, node: OnnxNode) -> None:
    value = node.attrs.get("value", np.zeros(1, np.float32))
    shape = tuple(int(n) for n in ctx.constant(node, 0, "shape"))
    ctx.add_constant(node.outputs[0], checked_array(np.full(shape, value.reshape(()), value.dtype), node.outputs[0]))


def _expand(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = broadcast_shape(ctx.shape(x), [int(n) for n in ctx.constant(node, 1, "shape")], "Expand")
    if shape == ctx.shape(x):
        return ctx.alias(node.outputs[0], x)
    ctx.emit_for(node, "broadcast_to", [x], {"shape": shape})


def _identity(ctx: Importer, node: OnnxNode) -> None:
    training = ctx.constant(node, 2, "training mode") if node.op_type == "Dropout" and node.opset >= 12 else None
    if training is not None and training.item():
        raise node.unsupported("training mode")
    ctx.alias(node.outputs[0], node.inputs[0])
    if len(node.outputs) > 1 and node.outputs[1] in ctx.read:  # inference keeps every element
        ctx.add_constant(node.outputs[1], np.ones(ctx.shape(node.inputs[0]), bool))


def _reshape_to(ctx: Importer, node: OnnxNode, shape: Sequence[int]) -> None:
    ctx.alias(node.outputs[0], ctx.reshape(node.inputs[0], shape, node.name))


def _reshape_op(ctx: Importer, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    target = [int(n) for n in ctx.constant(node, 1, "shape")]
    if not node.attrs.get("allowzero", 0):
        target = [shape[d] if n == 0 else n for d, n in enumerate(target)]
    if -1 in target:
        known = math.prod(n for n in target if n != -1)
        target[target.index(-1)] = math.prod(shape) // known if known else 0
    if 0 in target:
        if 0 not in shape:
            raise node.unsupported(f"reshaping {list(shape)} to the empty shape {target}")
        return ctx.add_constant(node.outputs[0], np.zeros(target, ctx.values[node.inputs[0]].dtype))
    _reshape_to(ctx, node, target)


def _flatten(ctx: Importer, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    axis = node.attrs.get("axis", 1)
    axis += len(shape) if axis < 0 else 0
    _reshape_to(ctx, node, (math.prod(shape[:axis]), math.prod(shape[axis:])))


def _squeeze(ctx: Importer, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    axes = _axes(node, ctx, 13)
    axes = {a % len(shape) for a in axes} if axes is not None else {d for d, n in enumerate(shape) if n == 1}
    if any(shape[a] != 1 for a in axes):
        raise node.unsupported(f"squeezing axes {sorted(axes)} of a value of shape {shape} that are not 1")
    _reshape_to(ctx, node, [n for d, n in enumerate(shape) if d not in axes])


def _unsqueeze(ctx: Importer, node: OnnxNode) -> None:
    shape = list(ctx.shape(node.inputs[0]))
    axes = _axes(node, ctx, 13) or ()
    rank = len(shape) + len(axes)
    for axis in sorted(a % rank for a in axes):
        shape.insert(axis, 1)
    _reshape_to(ctx, node, shape)


def _transpose(ctx: Importer, node: OnnxNode) -> None:
    rank = len(ctx.shape(node.inputs[0]))
    ctx.emit_for(node, "transpose", node.inputs[:1], {"axes": tuple(node.attrs.get("perm", range(rank)[::-1]))})


def _concat(ctx: Importer, node: OnnxNode) -> None:
    ctx.emit_for(node, "concat", node.inputs, {"axis": node.attrs["axis"]})


def _split(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = node.attrs.get("axis", 0) % len(shape)
    sizes = ctx.constant(node, 1, "split") if node.opset >= 13 else node.attrs.get("split")
    count = len(node.outputs)
    if sizes is None or len(sizes) == 0:
        chunk = -(-shape[axis] // count) if "num_outputs" in node.attrs else shape[axis] // count
        sizes = [chunk] * (count - 1) + [shape[axis] - chunk * (count - 1)]
    begin = 0
    for output, size in zip(node.outputs, (int(s) for s in sizes)):
        if output and size == 0:
            ctx.add_constant(output, np.zeros([0 if d == axis else n for d, n in enumerate(shape)],
                                              ctx.values[x].dtype))
        elif output:
            ctx.emit("strided_slice", [x], {"begin": (begin,), "end": (begin + size,), "axes": (axis,)},
                     f"{node.name}_{output}", output=output)
        begin += size


def _slice(ctx: Importer, node: OnnxNode) -> None:
    if node.opset < 10:
        starts, ends, axes, steps = (node.attrs.get(k) for k in ("starts", "ends", "axes", "steps"))
    else:
        starts, ends, axes, steps = (ctx.constant(node, i, "slice bound") for i in (1, 2, 3, 4))
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    shape = list(ctx.shape(node.inputs[0]))
    for b, e, s, a in zip(starts, ends, steps, axes):
        shape[int(a)] = len(range(*slice(int(b), int(e), int(s)).indices(shape[int(a)])))
    if 0 in shape:
        return ctx.add_constant(node.outputs[0], np.zeros(shape, ctx.values[node.inputs[0]].dtype))
    ctx.emit_for(node, "strided_slice", node.inputs[:1], {
        "begin": tuple(int(v) for v in starts), "end": tuple(int(v) for v in ends),
        "strides": tuple(int(v) for v in steps), "axes": tuple(int(v) for v in axes)})


def _gather(op: str) -> Converter:
    return lambda ctx, node: ctx.emit_for(node, op, node.inputs[:2], {"axis": node.attrs.get("axis", 0)})


def _take(ctx: Importer, node: OnnxNode) -> None:
    """Gather: ``take``; but of constant indices that are one run of positions (a scalar: one of
    the queries, keys and values split from a projection), a strided slice reshaped, which reads
    no indices and which the kernels after it read where it lies (``graph/fuse.py``)."""
    data, indices = node.inputs[:2]
    shape = ctx.shape(data)
    axis = node.attrs.get("axis", 0) % max(len(shape), 1)
    positions = ctx.constants.get(indices)
    if positions is not None and positions.ndim <= 1 and positions.size and np.issubdtype(positions.dtype, np.integer):
        places = np.where(positions < 0, positions + shape[axis], positions).ravel()
        first = int(places[0])
        if 0 <= first and first + places.size <= shape[axis] and np.array_equal(places, first + np.arange(places.size)):
            run = ctx.emit("strided_slice", [data], {"begin": (first,), "end": (first + places.size,), "axes": (axis,)},
                           f"{node.name}_run")
            return ctx.alias(node.outputs[0], ctx.reshape(run, (*shape[:axis], *positions.shape, *shape[axis + 1:]),
                                                          f"{node.name}_taken"))
    ctx.emit_for(node, "take", node.inputs[:2], {"axis": node.attrs.get("axis", 0)})


def _pad(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    if node.opset < 11:
        pads, value, axes = node.attrs["pads"], node.attrs.get("value", 0.0), None
    else:
        pads, value, axes = (ctx.constant(node, i, "pad argument") for i in (1, 2, 3))
    axes = [int(a) % rank for a in (range(rank) if axes is None else axes)]
    before, after = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        before[axis], after[axis] = int(pads[k]), int(pads[k + len(axes)])
    if min(before + after) < 0:
        raise node.unsupported("negative pads (cropping)")
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":  # edge, reflect, wrap: a take of the positions NumPy's pad of the same mode reads
        for axis in (d for d in range(rank) if before[d] or after[d]):
            positions = np.pad(np.arange(ctx.shape(x)[axis]), (before[axis], after[axis]), mode)
            x = ctx.emit("take", [x, ctx.add_constant(ctx.fresh_value(f"{node.name}_{axis}"), positions)],
                         {"axis": axis}, f"{node.name}_{mode}{axis}")
        return ctx.alias(node.outputs[0], x)
    kind = float if is_float(ctx.values[x].dtype) else int
    fill = kind(0 if value is None else np.asarray(value).item())
    ctx.emit_for(node, "pad", [x], {"pad_before": tuple(before), "pad_after": tuple(after), "pad_value": fill})


def _reduce(op: str, axes_input_since: int, before: str | None = None, after: str | None = None) -> Converter:
    """ONNX Reduce*: ``after(op(before(x)))``; ``before`` and ``after`` also apply when ``noop_with_empty_axes``."""
    def convert(ctx: Importer, node: OnnxNode) -> None:
        x, rank, keepdims = node.inputs[0], len(ctx.shape(node.inputs[0])), bool(node.attrs.get("keepdims", 1))
        axes = _axes(node, ctx, axes_input_since)
        noop = axes is None and node.attrs.get("noop_with_empty_axes", 0)
        if op == "mean" and not is_float(ctx.values[x].dtype):
            raise node.unsupported(f"the mean of {ctx.values[x].dtype} values")
        if before:
            x = ctx.emit(*(("multiply", [x, x]) if before == "square" else (before, [x])), {}, f"{node.name}_{before}")
        scalar = not (keepdims or noop) and len({a % max(rank, 1) for a in axes or range(rank)}) == rank
        out = x if noop else ctx.emit(op, [x], {"axis": axes, "keepdims": keepdims or scalar}, node.name)
        out = ctx.emit(after, [out], {}, f"{node.name}_{after}") if after else out
        ctx.alias(node.outputs[0], ctx.reshape(out, (), f"{node.name}_scalar") if scalar else out)

    return convert


def _arg(op: str) -> Converter:
    return lambda ctx, node: ctx.emit_for(node, op, node.inputs[:1], {"axis": node.attrs.get("axis", 0), **{
        k: bool(node.attrs.get(k, k == "keepdims")) for k in ("keepdims", "select_last_index")}})


def _cumsum(ctx: Importer, node: OnnxNode) -> None:
    ctx.emit_for(node, "cumsum", node.inputs[:1], {"axis": int(ctx.constant(node, 1, "axis").item()), **{
        k: bool(node.attrs.get(k, 0)) for k in ("exclusive", "reverse")}})


def _trilu(ctx: Importer, node: OnnxNode) -> None:
    k = ctx.constant(node, 1, "diagonal offset k")
    ctx.emit_for(node, "trilu", node.inputs[:1], {"upper": bool(node.attrs.get("upper", 1)),
                                                    "k": 0 if k is None else int(k.item())})


CONVERTERS: dict[str, Converter] = {
    **{onnx_op: _unary(op) for onnx_op, op in {
        "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
        "Exp": "exp", "Log": "log", "Abs": "abs", "Neg": "negative"}.items()},
    **{onnx_op: _binary(op) for onnx_op, op in {
        "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power"}.items()},
    "Cast": _cast, "CastLike": _cast, "Clip": _clip, "Gelu": _gelu,
    "Constant": _constant, "Shape": _shape_of, "Size": _size, "ConstantOfShape": _constant_of_shape, "Expand": _expand,
    "Identity": _identity, "Dropout": _identity,
    "Reshape": _reshape_op, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Transpose": _transpose, "Concat": _concat, "Split": _split, "Slice": _slice, "Pad": _pad,
    "ReduceSum": _reduce("sum", 13), "ReduceMean": _reduce("mean", 18), "ReduceMax": _reduce("max", 18),
    "ReduceMin": _reduce("min", 18), "ReduceL1": _reduce("sum", 18, "abs"),
    "ReduceL2": _reduce("sum", 18, "square", "sqrt"), "ReduceSumSquare": _reduce("sum", 18, "square"),
    "ReduceLogSum": _reduce("sum", 18, None, "log"), "ReduceLogSumExp": _reduce("sum", 18, "exp", "log"),
    **{onnx_op: _function("binary", fn) for onnx_op, fn in {
        "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
        "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
        "Mod": "floor_mod", "PRelu": "prelu", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
        "BitwiseXor": "bitwise_xor"}.items()},
    **{onnx_op: _function("unary", fn) for onnx_op, fn in {
        "Not": "logical_not", "Floor": "floor", "Ceil": "ceil", "Sign": "sign", "Elu": "elu", "Selu": "selu",
        "Celu": "celu", "LeakyRelu": "leaky_relu", "ThresholdedRelu": "thresholded_relu",
        "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish", "Softplus": "softplus", "Softsign": "softsign",
        "Mish": "mish", "Shrink": "shrink", "Round": "rint", "IsNaN": "isnan", "IsInf": "isinf",
        "BitwiseNot": "bitwise_not",
        **{op: op.lower() for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
                                     "Atanh")}}.items()},
    "Sum": _variadic("add"), "Mean": _variadic("add"), "Max": _variadic("binary", "maximum"),
    "Min": _variadic("binary", "minimum"), "Where": lambda ctx, node: ctx.emit_for(node, "where", node.inputs[:3]),
    "BitShift": lambda ctx, node: ctx.emit_for(node, "binary", node.inputs[:2], {
        "function": "left_shift" if node.attrs["direction"] == "LEFT" else "right_shift"}),
    "Range": _range, "ArgMax": _arg("argmax"), "ArgMin": _arg("argmin"), "CumSum": _cumsum, "Trilu": _trilu,
    "Gather": _take, "GatherElements": _gather("gather_elements"),
    "Resize": convert_resize, "Upsample": convert_resize,
    **NN_CONVERTERS, **QUANT_CONVERTERS, **TENSOR_CONVERTERS, **RECURRENT_CONVERTERS, **SCATTER_CONVERTERS,
    **SIGNAL_CONVERTERS, **SAMPLING_CONVERTERS, **CONV_CONVERTERS,
}
