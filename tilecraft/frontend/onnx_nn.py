"""Converters of the ONNX neural-network operators: convolutions, pooling, normalisation, Gemm, MatMul, softmax.

Convolution biases become an ``add`` of a [F, 1, 1] constant after the convolution, the
form ``passes.fold_batch_norm`` folds into; a constant right-hand side of Gemm and MatMul
becomes a ``dense`` weight (layout-free, packable ahead of time); a batched MatMul is a
``batch_matmul`` between reshapes. Convolutions and pools are 2-D (NCHW); a 1-D one is the
2-D one over a view of height 1.
InstanceNormalization and GroupNormalization are a ``layer_norm`` of unit scale over each
instance or group, then a per-channel scale and shift; RMSNormalization is element-wise
nodes around a ``mean``; LRN's sum over neighbouring channels is an ``avg_pool2d`` that
counts its padding, over the channels of a one-channel view.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from ..ops.common import broadcast_shape
from .onnx_importer import Importer, OnnxNode

Converter = Callable[[Importer, OnnxNode], None]


def _softmax(op: str) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        shape = ctx.shape(node.inputs[0])
        axis = node.attrs.get("axis", -1 if node.opset >= 13 else 1) % len(shape)
        if node.opset >= 13 or axis == len(shape) - 1:
            return ctx.emit_for(node, op, node.inputs[:1], {"axis": axis})
        flat = ctx.reshape(node.inputs[0], (math.prod(shape[:axis]), math.prod(shape[axis:])), f"{node.name}_2d")
        out = ctx.emit(op, [flat], {"axis": 1}, node.name)
        ctx.alias(node.outputs[0], ctx.reshape(out, shape, f"{node.name}_nd"))

    return convert


def _broadcast_param(ctx: Importer, name: str, shape: tuple[int, ...], hint: str) -> str:
    return name if ctx.shape(name) == shape else ctx.emit("broadcast_to", [name], {"shape": shape}, hint)


def _layer_norm(ctx: Importer, node: OnnxNode) -> None:
    x, shape = node.inputs[0], ctx.shape(node.inputs[0])
    axis, epsilon = node.attrs.get("axis", -1) % len(shape), node.attrs.get("epsilon", 1e-5)
    axes, norm_shape = tuple(range(axis, len(shape))), shape[axis:]
    scale = _broadcast_param(ctx, node.inputs[1], norm_shape, f"{node.name}_scale")
    bias = _broadcast_param(ctx, node.input(2), norm_shape, f"{node.name}_bias") if node.input(2) else \
        ctx.add_constant(ctx.fresh_value(f"{node.name}_zero_bias"), np.zeros(norm_shape, ctx.values[x].dtype))
    ctx.emit_for(node, "layer_norm", [x, scale, bias], {"axis": axes, "epsilon": epsilon})
    if any(node.outputs[1:]):  # the statistics, as the training graph reads them
        mean = ctx.emit("mean", [x], {"axis": axes, "keepdims": True}, f"{node.name}_mean",
                        output=node.outputs[1] or None)
        deviation = ctx.emit("subtract", [x, mean], {}, f"{node.name}_deviation")
        square = ctx.emit("multiply", [deviation, deviation], {}, f"{node.name}_square")
        variance = ctx.emit("mean", [square], {"axis": axes, "keepdims": True}, f"{node.name}_variance")
        shifted = ctx.emit("add", [variance, ctx.scalar(epsilon, variance)], {}, f"{node.name}_shifted")
        std = ctx.emit("sqrt", [shifted], {}, f"{node.name}_std")
        if len(node.outputs) > 2 and node.outputs[2]:
            ctx.emit("reciprocal", [std], {}, f"{node.name}_inv_std", output=node.outputs[2])


def _batch_norm(ctx: Importer, node: OnnxNode) -> None:
    training = node.attrs.get("training_mode", 0) if node.opset >= 14 else any(node.outputs[1:])  # 7-13: by outputs
    if training or any(o in ctx.read for o in node.outputs[1:]):
        raise node.unsupported("training mode (the running statistics outputs)")
    if node.attrs.get("spatial", 1) != 1:
        raise node.unsupported("spatial=0")
    ctx.emit_for(node, "batch_norm", node.inputs[:5], {"epsilon": node.attrs.get("epsilon", 1e-5), "axis": 1})


def _constant_like(ctx: Importer, x: str, value: float, shape: tuple[int, ...], hint: str) -> str:
    return ctx.add_constant(ctx.fresh_value(hint), np.full(shape, value, ctx.values[x].dtype))


def _normalized(ctx: Importer, node: OnnxNode, x: str, axis: int, epsilon: float) -> str:
    """``x`` normalized to mean 0 and variance 1 over its dims from ``axis`` on (a layer_norm of unit scale)."""
    inner = ctx.shape(x)[axis:]
    params = [_constant_like(ctx, x, value, inner, f"{node.name}_{value}") for value in (1.0, 0.0)]
    return ctx.emit("layer_norm", [x, *params], {"axis": tuple(range(axis, len(ctx.shape(x)))), "epsilon": epsilon},
                    f"{node.name}_normalized")


def _per_channel(ctx: Importer, node: OnnxNode, x: str, scale: str, bias: str) -> None:
    """The node's output: ``x`` [N, C, ...] scaled and shifted by the [C] vectors ``scale`` and ``bias``."""
    channels = (ctx.shape(x)[1],) + (1,) * (len(ctx.shape(x)) - 2)
    scaled = ctx.emit("multiply", [x, ctx.reshape(scale, channels, f"{node.name}_scale")], {}, f"{node.name}_scaled")
    ctx.emit("add", [scaled, ctx.reshape(bias, channels, f"{node.name}_bias")], {}, node.name, output=node.outputs[0])


def _instance_norm(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    _per_channel(ctx, node, _normalized(ctx, node, x, 2, node.attrs.get("epsilon", 1e-5)), *node.inputs[1:3])


def _group_norm(ctx: Importer, node: OnnxNode) -> None:
    x, scale, bias = node.inputs[:3]
    shape, groups = ctx.shape(x), node.attrs["num_groups"]
    grouped = ctx.reshape(x, (shape[0], groups, math.prod(shape[1:]) // groups), f"{node.name}_grouped")
    out = ctx.reshape(_normalized(ctx, node, grouped, 2, node.attrs.get("epsilon", 1e-5)), shape, f"{node.name}_nd")
    if ctx.shape(scale) != (shape[1],):  # opset 18: a scale and a bias per group, repeated for its channels
        scale, bias = (ctx.reshape(ctx.emit("broadcast_to", [ctx.reshape(v, (groups, 1), f"{node.name}_{v}_g")],
                                            {"shape": (groups, shape[1] // groups)}, f"{node.name}_{v}_repeat"),
                                   (shape[1],), f"{node.name}_{v}_c") for v in (scale, bias))
    _per_channel(ctx, node, out, scale, bias)


def _rms_norm(ctx: Importer, node: OnnxNode) -> None:
    x, rank = node.inputs[0], len(ctx.shape(node.inputs[0]))
    axes = tuple(range(node.attrs.get("axis", -1) % rank, rank))
    square = ctx.emit("multiply", [x, x], {}, f"{node.name}_square")
    mean = ctx.emit("mean", [square], {"axis": axes, "keepdims": True}, f"{node.name}_mean")
    shifted = ctx.emit("add", [mean, ctx.scalar(node.attrs.get("epsilon", 1e-5), mean)], {}, f"{node.name}_shifted")
    normed = ctx.emit("divide", [x, ctx.emit("sqrt", [shifted], {}, f"{node.name}_rms")], {}, f"{node.name}_normed")
    ctx.emit_for(node, "multiply", [normed, node.inputs[1]])


def _lrn(ctx: Importer, node: OnnxNode) -> None:
    """The sum of squares over ``size`` neighbouring channels as an average pool over [C, rest] of one channel."""
    x, shape, size = node.inputs[0], ctx.shape(node.inputs[0]), node.attrs["size"]
    alpha, beta, bias = (node.attrs.get(k, v) for k, v in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    square = ctx.emit("multiply", [x, x], {}, f"{node.name}_square")
    square = ctx.reshape(square, (shape[0], 1, shape[1], math.prod(shape[2:])), f"{node.name}_channels")
    window = ctx.emit("avg_pool2d", [square], {"kernel": (size, 1), "stride": (1, 1), "padding": (
        (size - 1) // 2, 0, size // 2, 0), "count_include_pad": True}, f"{node.name}_window")
    scaled = ctx.emit("multiply", [ctx.reshape(window, shape, f"{node.name}_nd"), ctx.scalar(alpha, x)], {},
                      f"{node.name}_alpha")
    shifted = ctx.emit("add", [scaled, ctx.scalar(bias, x)], {}, f"{node.name}_bias")
    ctx.emit_for(node, "divide", [x, ctx.emit("power", [shifted, ctx.scalar(beta, x)], {}, f"{node.name}_beta")])


def _window_pads(node: OnnxNode, sizes, kernel, strides, dilations) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)`` from ``pads`` or ``auto_pad``."""
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        pads = node.attrs.get("pads", [0] * 2 * len(sizes)) if auto_pad == "NOTSET" else [0] * 2 * len(sizes)
        return tuple(int(p) for p in pads)  # type: ignore[return-value]
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        end.append(total - begin[-1])
    return (*begin, *end)  # type: ignore[return-value]


def _spatial_2d(ctx: Importer, node: OnnxNode, what: str) -> tuple[int, ...]:
    shape = ctx.shape(node.inputs[0])
    if len(shape) != 4:
        raise node.unsupported(f"a {len(shape) - 2}-D {what} (only 2-D, NCHW)")
    return shape


def _with_bias(ctx: Importer, node: OnnxNode, op: str, inputs: list[str], attrs: dict) -> None:
    """``op`` then, for a bias input 2, an ``add`` of the bias as [F, 1, 1] (the form BatchNorm folds into)."""
    if not node.input(2):
        return ctx.emit_for(node, op, inputs, attrs)
    out = ctx.emit(op, inputs, attrs, node.name)
    bias = ctx.reshape(node.input(2), (ctx.shape(node.input(2))[0], 1, 1), f"{node.name}_bias_3d")
    ctx.emit("add", [out, bias], {}, f"{node.name}_bias", output=node.outputs[0])


def _lifted(convert: Converter) -> Converter:
    """``convert`` that also takes a 1-D convolution or pool, as the 2-D one over a [N, C, 1, L] view."""
    def lift(ctx: Importer, node: OnnxNode) -> None:
        if len(ctx.shape(node.inputs[0])) == 5 and "Pool" in node.op_type:
            return _separable_3d(convert, ctx, node)
        if len(ctx.shape(node.inputs[0])) != 3:
            return convert(ctx, node)
        inputs = list(node.inputs)
        for k in range(2 if node.op_type in ("Conv", "ConvTranspose") else 1):
            shape = ctx.shape(inputs[k])
            inputs[k] = ctx.reshape(inputs[k], (*shape[:2], 1, shape[2]), f"{node.name}_2d_{k}")
        attrs = {key: (int(key != "output_padding"), *value) if key in _WINDOW_ATTRS else value
                 for key, value in node.attrs.items()}
        if "pads" in attrs:
            attrs["pads"] = (0, node.attrs["pads"][0], 0, node.attrs["pads"][1])
        out = ctx.fresh_value(f"{node.name}_2d")
        convert(ctx, replace(node, inputs=tuple(inputs), outputs=(out, *node.outputs[1:]), attrs=attrs))
        n, c, _, length = ctx.shape(ctx.resolve(out))
        ctx.alias(node.outputs[0], ctx.reshape(ctx.resolve(out), (n, c, length), f"{node.name}_1d"))

    return lift


_WINDOW_ATTRS = ("kernel_shape", "strides", "dilations", "output_padding", "output_shape")


def _separable_3d(convert: Converter, ctx: Importer, node: OnnxNode) -> None:
    """A 3-D pool as a 2-D pool over (H, W) with D among the channels, then one over D: the maximum, and the
    mean over a box of taps counted or not, are the same taken one axis after the other."""
    (n, c, d, h, w), x = ctx.shape(node.inputs[0]), node.inputs[0]
    (kd, kh, kw), (sd, sh, sw), (dd, dh, dw) = (tuple(node.attrs.get(key, (1, 1, 1))) for key in (
        "kernel_shape", "strides", "dilations"))
    front, top, left, back, bottom, right = _window_pads(node, (d, h, w), (kd, kh, kw), (sd, sh, sw), (dd, dh, dw))
    planes = ctx.fresh_value(f"{node.name}_hw")
    convert(ctx, replace(node, inputs=(ctx.reshape(x, (n, c * d, h, w), f"{node.name}_planes"),), outputs=(planes,),
                         attrs={**node.attrs, "kernel_shape": (kh, kw), "strides": (sh, sw), "dilations": (dh, dw),
                                "pads": (top, left, bottom, right), "auto_pad": "NOTSET"}))
    oh, ow = ctx.shape(ctx.resolve(planes))[2:]
    depths = ctx.fresh_value(f"{node.name}_d")
    convert(ctx, replace(node, inputs=(ctx.reshape(ctx.resolve(planes), (n, c, d, oh * ow), f"{node.name}_depths"),),
                         outputs=(depths, *node.outputs[1:]),
                         attrs={**node.attrs, "kernel_shape": (kd, 1), "strides": (sd, 1), "dilations": (dd, 1),
                                "pads": (front, 0, back, 0), "auto_pad": "NOTSET"}))
    od = ctx.shape(ctx.resolve(depths))[2]
    ctx.alias(node.outputs[0], ctx.reshape(ctx.resolve(depths), (n, c, od, oh, ow), f"{node.name}_3d"))


def _conv(ctx: Importer, node: OnnxNode) -> None:
    shape = _spatial_2d(ctx, node, "convolution")
    weight = node.inputs[1]
    filters, _, *kernel = ctx.shape(weight)
    strides, dilations = tuple(node.attrs.get("strides", (1, 1))), tuple(node.attrs.get("dilations", (1, 1)))
    attrs = {"stride": strides, "padding": _window_pads(node, shape[2:], kernel, strides, dilations),
             "dilation": dilations}
    groups = node.attrs.get("group", 1)
    if 1 < groups == shape[1] and ctx.shape(weight)[1] == 1:  # one input channel per group: depthwise
        weight = ctx.reshape(weight, (groups, filters // groups, *kernel), f"{node.name}_depthwise_kernel")
        return _with_bias(ctx, node, "depthwise_conv2d", [node.inputs[0], weight], attrs)
    _with_bias(ctx, node, "conv2d", [node.inputs[0], weight], {**attrs, "groups": groups})


def _conv_transpose(ctx: Importer, node: OnnxNode) -> None:
    shape = _spatial_2d(ctx, node, "transposed convolution")
    kernel = ctx.shape(node.inputs[1])[2:]
    if node.attrs.get("group", 1) != 1 or any(d != 1 for d in node.attrs.get("dilations", (1, 1))):
        raise node.unsupported("a grouped or dilated transposed convolution")
    strides = tuple(node.attrs.get("strides", (1, 1)))
    extra = tuple(node.attrs.get("output_padding", (0, 0)))
    auto_pad, target = node.attrs.get("auto_pad", "NOTSET"), node.attrs.get("output_shape")
    if target is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = target[-2:] if target is not None else [n * s for n, s in zip(shape[2:], strides)]
        totals = [s * (n - 1) + e + k - t for s, n, e, k, t in zip(strides, shape[2:], extra, kernel, target)]
        extra = tuple(e + max(-t, 0) for e, t in zip(extra, totals))  # a larger output: more output_padding
        totals = [max(t, 0) for t in totals]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = (*begin, *(t - b for t, b in zip(totals, begin)))
    else:
        pads = tuple(node.attrs.get("pads", (0,) * 4)) if auto_pad == "NOTSET" else (0,) * 4
    if min(pads) < 0 or any(e >= s for e, s in zip(extra, strides)):
        raise node.unsupported(f"pads {pads} with output_padding {extra} and strides {strides}")
    _with_bias(ctx, node, "conv2d_transpose", node.inputs[:2],
               {"stride": strides, "padding": pads, "output_padding": extra})


def _pool(op: str) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        shape = _spatial_2d(ctx, node, "pooling")
        if len(node.outputs) > 1 and node.outputs[1] in ctx.read:
            raise node.unsupported("the Indices output")
        kernel, strides = tuple(node.attrs["kernel_shape"]), tuple(node.attrs.get("strides", (1, 1)))
        dilations = tuple(node.attrs.get("dilations", (1, 1)))
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]  # what a dilated window covers
        top, left, bottom, right = _window_pads(node, shape[2:], kernel, strides, dilations)
        include_pad = bool(node.attrs.get("count_include_pad", 0))
        if node.attrs.get("ceil_mode", 0):  # ceil mode = more padding at the end, unless a window would start there
            ends = []
            for size, k, s, lo, hi in zip(shape[2:], spans, strides, (top, left), (bottom, right)):
                count = -(-(size + lo + hi - k) // s) + 1
                count -= (count - 1) * s >= size + lo
                ends.append(hi + max((count - 1) * s + k - (size + lo + hi), 0))
            if include_pad and (ends[0], ends[1]) != (bottom, right):
                raise node.unsupported("ceil_mode with count_include_pad")
            bottom, right = ends
        if max(top, bottom) >= spans[0] or max(left, right) >= spans[1]:
            raise node.unsupported(f"padding {(top, left, bottom, right)} as large as the kernel {kernel}")
        attrs = {"kernel": kernel, "stride": strides, "padding": (top, left, bottom, right),
                 **({"dilation": dilations} if dilations != (1, 1) else {})}
        if op == "avg_pool2d":
            attrs["count_include_pad"] = include_pad
        ctx.emit_for(node, op, node.inputs[:1], attrs)

    return convert


def _global_pool(op: str) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        rank = len(ctx.shape(node.inputs[0]))
        if op == "mean" and rank == 4:
            return ctx.emit_for(node, "global_avg_pool2d", node.inputs[:1])
        ctx.emit_for(node, op, node.inputs[:1], {"axis": tuple(range(2, rank)), "keepdims": True})

    return convert


def _gemm(ctx: Importer, node: OnnxNode) -> None:
    a, b, c = node.inputs[0], node.inputs[1], node.input(2)
    if node.attrs.get("transA", 0):
        a = ctx.emit("transpose", [a], {"axes": (1, 0)}, f"{node.name}_transpose_a")
    if b in ctx.constants:  # a weight: dense reads it as [out, in], marked layout-free
        weight = b if node.attrs.get("transB", 0) else ctx.emit("transpose", [b], {"axes": (1, 0)}, f"{node.name}_w")
        out = ctx.emit("dense", [a, weight], {}, node.name)
    else:
        out = ctx.emit("matmul", [a, b], {"transpose_b": bool(node.attrs.get("transB", 0))}, node.name)
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    if alpha != 1.0:
        out = ctx.emit("multiply", [out, ctx.scalar(alpha, out)], {}, f"{node.name}_alpha")
    if c and beta != 0.0:
        if beta != 1.0:
            c = ctx.emit("multiply", [c, ctx.scalar(beta, c)], {}, f"{node.name}_beta")
        out = ctx.emit("add", [out, c], {}, f"{node.name}_bias")
    ctx.alias(node.outputs[0], out)


def _batched(ctx: Importer, x: str, batch: tuple[int, ...], name: str) -> str:
    """``x`` [..., M, K] as [batch, M, K] for batch_matmul; a batch of ones stays 1 and broadcasts."""
    shape = ctx.shape(x)
    if math.prod(shape[:-2]) == 1:
        return ctx.reshape(x, (1, *shape[-2:]), name)
    if shape[:-2] != batch:
        x = ctx.emit("broadcast_to", [x], {"shape": (*batch, *shape[-2:])}, f"{name}_broadcast")
    return ctx.reshape(x, (math.prod(batch), *shape[-2:]), name)


def _matmul(ctx: Importer, node: OnnxNode) -> None:
    """NumPy matmul: [.., M, K] x [K, N] is one dense (or matmul) over the flattened rows, else batch_matmul."""
    a, b = node.inputs[:2]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    a = ctx.reshape(a, (1, *a_shape), f"{node.name}_a2d") if len(a_shape) == 1 else a
    b = ctx.reshape(b, (*b_shape, 1), f"{node.name}_b2d") if len(b_shape) == 1 else b
    (*a_batch, m, k), (*b_batch, _, n) = ctx.shape(a), ctx.shape(b)
    batch = broadcast_shape(a_batch, b_batch, "MatMul")
    result = (*batch, *([m] if len(a_shape) > 1 else []), *([n] if len(b_shape) > 1 else []))
    if len(b_batch) == 0:
        rows = ctx.reshape(a, (math.prod(batch) * m, k), f"{node.name}_rows")
        if b in ctx.constants:
            weight = ctx.emit("transpose", [b], {"axes": (1, 0)}, f"{node.name}_w")
            out = ctx.emit("dense", [rows, weight], {}, node.name)
        else:
            out = ctx.emit("matmul", [rows, b], {}, node.name)
    else:
        out = ctx.emit("batch_matmul", [_batched(ctx, a, batch, f"{node.name}_a3d"),
                                        _batched(ctx, b, batch, f"{node.name}_b3d")], {}, node.name)
    ctx.alias(node.outputs[0], ctx.reshape(out, result, f"{node.name}_result"))


NN_CONVERTERS: dict[str, Converter] = {
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"),
    "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm, "InstanceNormalization": _instance_norm,
    "GroupNormalization": _group_norm, "RMSNormalization": _rms_norm, "LRN": _lrn,
    "Conv": _lifted(_conv), "ConvTranspose": _lifted(_conv_transpose), "Gemm": _gemm, "MatMul": _matmul,
    "MaxPool": _lifted(_pool("max_pool2d")), "AveragePool": _lifted(_pool("avg_pool2d")),
    "GlobalAveragePool": _global_pool("mean"), "GlobalMaxPool": _global_pool("max"),
}
