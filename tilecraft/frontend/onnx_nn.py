"""Converters of the ONNX neural-network operators: convolutions, pooling, normalisation, Gemm, MatMul, softmax.

Convolution biases become an ``add`` of a [F, 1, 1] constant after the convolution, the
form ``passes.fold_batch_norm`` folds into; a constant right-hand side of Gemm and MatMul
becomes a ``dense`` weight (layout-free, packable ahead of time); a batched MatMul is a
``batch_matmul`` between reshapes. Convolutions and pools are 2-D (NCHW); a 1-D one is the
2-D one over a view of height 1, and a 3-D one is made of 2-D ones: a pool one axis after
the other, a Conv with its depth taps unfolded into the channels.
A ConvTranspose is the te op ``conv2d_transpose`` when plain (2-D, ungrouped, undilated);
otherwise the stride-1 Conv it is the adjoint of, over the input spread ``stride`` apart, with
the kernel transposed per group and flipped: conv2d already takes groups and dilations, so
nothing new is needed. MaxPool's Indices are composed apart from its values (strided slices
of each tap, an argmax over them, constant tables of positions). AveragePool's ceil_mode with
count_include_pad counts the pads but not the ceil overhang: the pads become real zeros.
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
from ..te.dtype import is_float
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
    """``convert`` that also takes a 1-D convolution or pool, as the 2-D one over a [N, C, 1, L] view, and a 3-D
    pool or Conv, made of 2-D ones (a 3-D ConvTranspose is ``convert``'s own)."""
    def lift(ctx: Importer, node: OnnxNode) -> None:
        if len(ctx.shape(node.inputs[0])) == 5 and node.op_type != "ConvTranspose":
            return _conv_3d(ctx, node) if node.op_type == "Conv" else _separable_3d(convert, ctx, node)
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


def _conv_3d(ctx: Importer, node: OnnxNode) -> None:
    """A 3-D convolution as a 2-D one with the depth taps among the channels: output depth z reads the KD planes
    z * sd + kd * dd of the depth-padded input (a strided slice per tap), laid side by side as [N*OD, C*KD, H, W],
    and the kernel viewed as [F, C/group*KD, KH, KW] sums them with the channels (a group's channels stay
    together); the bias is added to the 2-D result, and [N*OD, F, OH, OW] transposed back to [N, F, OD, OH, OW]."""
    x, weight = node.inputs[:2]
    (n, c, d, h, w), (f, per_group, kd, kh, kw) = ctx.shape(x), ctx.shape(weight)
    (sd, sh, sw), (dd, dh, dw) = (tuple(node.attrs.get(key, (1, 1, 1))) for key in ("strides", "dilations"))
    front, top, left, back, bottom, right = _window_pads(node, (d, h, w), (kd, kh, kw), (sd, sh, sw), (dd, dh, dw))
    if front or back:
        x = ctx.emit("pad", [x], {"pad_before": (0, 0, front, 0, 0), "pad_after": (0, 0, back, 0, 0)},
                     f"{node.name}_depth_pad")
    depth = (d + front + back - (kd - 1) * dd - 1) // sd + 1
    taps = [ctx.reshape(ctx.emit("strided_slice", [x], {"begin": (k * dd,), "end": (k * dd + (depth - 1) * sd + 1,),
                                                        "strides": (sd,), "axes": (2,)}, f"{node.name}_depth_tap"),
                        (n, c, 1, depth, h, w), f"{node.name}_depth_tap_6d") for k in range(kd)]
    stacked = ctx.emit("concat", taps, {"axis": 2}, f"{node.name}_depth_taps") if kd > 1 else taps[0]
    unfolded = ctx.emit("transpose", [stacked], {"axes": (0, 3, 1, 2, 4, 5)}, f"{node.name}_unfolded")
    planes = ctx.fresh_value(f"{node.name}_2d")
    _conv(ctx, replace(node, inputs=(ctx.reshape(unfolded, (n * depth, c * kd, h, w), f"{node.name}_planes"),
                                     ctx.reshape(weight, (f, per_group * kd, kh, kw), f"{node.name}_kernel_2d"),
                                     *node.inputs[2:3]), outputs=(planes,),
                       attrs={**node.attrs, "strides": (sh, sw), "dilations": (dh, dw),
                              "pads": (top, left, bottom, right), "auto_pad": "NOTSET"}))
    out_h, out_w = ctx.shape(ctx.resolve(planes))[2:]
    volume = ctx.reshape(ctx.resolve(planes), (n, depth, f, out_h, out_w), f"{node.name}_volume")
    ctx.emit_for(node, "transpose", [volume], {"axes": (0, 2, 1, 3, 4)})


def _conv_transpose(ctx: Importer, node: OnnxNode) -> None:
    """Pads from ``pads``, ``auto_pad`` or ``output_shape`` (a larger output is more output_padding); then the te
    op ``conv2d_transpose`` where it applies (2-D, ungrouped, undilated), else the convolution it is the adjoint
    of (``_transposed_as_conv``)."""
    shape, kernel = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])[2:]
    rank = len(kernel)
    if rank not in (2, 3):
        raise node.unsupported(f"a {rank}-D transposed convolution (only 1-D, 2-D and 3-D)")
    strides, dilations = (tuple(node.attrs.get(key, (1,) * rank)) for key in ("strides", "dilations"))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    extra = tuple(node.attrs.get("output_padding", (0,) * rank))
    auto_pad, target = node.attrs.get("auto_pad", "NOTSET"), node.attrs.get("output_shape")
    if target is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = target[-rank:] if target is not None else [n * s for n, s in zip(shape[2:], strides)]
        totals = [s * (n - 1) + e + k - t for s, n, e, k, t in zip(strides, shape[2:], extra, spans, target)]
        if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):  # output_shape alone: a larger output, more output_padding
            extra = tuple(e + max(-t, 0) for e, t in zip(extra, totals))
            totals = [max(t, 0) for t in totals]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]  # floored, as ONNX's reference
        pads = (*begin, *(t - b for t, b in zip(totals, begin)))
    else:
        pads = tuple(node.attrs.get("pads", (0,) * 2 * rank)) if auto_pad == "NOTSET" else (0,) * 2 * rank
    groups = node.attrs.get("group", 1)
    plain = groups == 1 and dilations == (1, 1) and min(pads) >= 0 and all(e < s for e, s in zip(extra, strides))
    if rank == 2 and plain:
        return _with_bias(ctx, node, "conv2d_transpose", node.inputs[:2],
                          {"stride": strides, "padding": pads, "output_padding": extra})
    _transposed_as_conv(ctx, node, strides, dilations, pads, extra, groups)


def _transposed_as_conv(ctx: Importer, node: OnnxNode, strides, dilations, pads, extra, groups: int) -> None:
    """A transposed convolution as the stride-1 convolution it is the adjoint of: over the input spread
    ``stride`` apart (s - 1 zeros after each element), bordered by the dilated kernel's reach less the pads
    (cropped where a pad reaches further), with the kernel [C, F/group, *K] made [F, C/group, *K] group by
    group and flipped along every spatial axis. Any group, dilation, pads and output_padding; 2-D or 3-D."""
    x, weight = node.inputs[:2]
    (n, c, *sizes), (_, per_group, *kernel) = ctx.shape(x), ctx.shape(weight)
    rank, axes = len(sizes), tuple(range(2, 2 + len(sizes)))
    if max(strides) > 1:  # [N, C, S1, 1, S2, 1] padded to [N, C, S1, s1, S2, s2], then viewed as [N, C, S1*s1, ...]
        pairs = ctx.reshape(x, (n, c, *(v for size in sizes for v in (size, 1))), f"{node.name}_pairs")
        spread = ctx.emit("pad", [pairs], {"pad_before": (0,) * (2 + 2 * rank), "pad_after": (
            0, 0, *(v for s in strides for v in (0, s - 1)))}, f"{node.name}_spread")
        x = ctx.reshape(spread, (n, c, *(size * s for size, s in zip(sizes, strides))), f"{node.name}_stuffed")
    reach = [d * (k - 1) for d, k in zip(dilations, kernel)]
    begins = [r - p for r, p in zip(reach, pads[:rank])]
    ends = [r - p + e - (s - 1) for r, p, e, s in zip(reach, pads[rank:], extra, strides)]  # less the trailing zeros
    if min(begins + ends) < 0:
        x = ctx.emit("strided_slice", [x], {"begin": tuple(max(-b, 0) for b in begins), "end": tuple(
            size - max(-e, 0) for size, e in zip(ctx.shape(x)[2:], ends)), "axes": axes}, f"{node.name}_crop")
    grouped = ctx.reshape(weight, (groups, c // groups, per_group, *kernel), f"{node.name}_kernel_groups")
    swapped = ctx.emit("transpose", [grouped], {"axes": (0, 2, 1, *range(3, 3 + rank))}, f"{node.name}_kernel_oi")
    flipped = ctx.emit("strided_slice", [ctx.reshape(swapped, (groups * per_group, c // groups, *kernel),
                                                     f"{node.name}_kernel_oihw")],
                       {"begin": (-1,) * rank, "end": tuple(-k - 1 for k in kernel), "strides": (-1,) * rank,
                        "axes": axes}, f"{node.name}_kernel_flipped")
    conv = replace(node, inputs=(x, flipped, *node.inputs[2:3]), attrs={
        "group": groups, "dilations": dilations, "pads": (*(max(b, 0) for b in begins), *(max(e, 0) for e in ends))})
    (_conv_3d if rank == 3 else _conv)(ctx, conv)


def _ceil_end(size: int, span: int, stride: int, begin: int, end: int) -> int:
    """The end pad of ceil_mode: more padding at the end for a last, partial window, unless it would start there."""
    count = -(-(size + begin + end - span) // stride) + 1
    count -= (count - 1) * stride >= size + begin
    return end + max((count - 1) * stride + span - (size + begin + end), 0)


def _pool_window(node: OnnxNode, sizes) -> tuple[tuple[int, ...], ...]:
    """A pool's kernel, strides, dilations, pads (begins, then ends) and its end pads as ceil_mode widens them."""
    rank, kernel = len(sizes), tuple(node.attrs["kernel_shape"])
    strides, dilations = (tuple(node.attrs.get(key, (1,) * rank)) for key in ("strides", "dilations"))
    pads = _window_pads(node, sizes, kernel, strides, dilations)
    ends = pads[rank:]
    if node.attrs.get("ceil_mode", 0):
        ends = tuple(_ceil_end(size, (k - 1) * d + 1, s, lo, hi)
                     for size, k, d, s, lo, hi in zip(sizes, kernel, dilations, strides, pads[:rank], ends))
    return kernel, strides, dilations, pads, ends


def _pool(op: str) -> Converter:
    def convert(ctx: Importer, node: OnnxNode) -> None:
        x, shape = node.inputs[0], _spatial_2d(ctx, node, "pooling")
        kernel, strides, dilations, (top, left, bottom, right), ends = _pool_window(node, shape[2:])
        include_pad = op == "avg_pool2d" and bool(node.attrs.get("count_include_pad", 0))
        if include_pad and ends != (bottom, right):  # the windows past the pads count the pads only: real zeros
            if any((top, left, bottom, right)):
                x = ctx.emit("pad", [x], {"pad_before": (0, 0, top, left), "pad_after": (0, 0, bottom, right)},
                             f"{node.name}_pad")
            top, left, ends, include_pad = 0, 0, (ends[0] - bottom, ends[1] - right), False
        (bottom, right), spans = ends, [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if max(top, bottom) >= spans[0] or max(left, right) >= spans[1]:
            raise node.unsupported(f"padding {(top, left, bottom, right)} as large as the kernel {kernel}")
        attrs = {"kernel": kernel, "stride": strides, "padding": (top, left, bottom, right),
                 **({"dilation": dilations} if dilations != (1, 1) else {})}
        if op == "avg_pool2d":
            attrs["count_include_pad"] = include_pad
        ctx.emit_for(node, op, [x], attrs)

    return convert


def _pool_indices(ctx: Importer, node: OnnxNode) -> None:
    """MaxPool's Indices (any rank): the flat position in the input of each window's first largest element. The
    windows' taps are strided slices of the input padded with its lowest value, stacked on a last axis; the
    first tap that holds the window's maximum and lies in the input (a constant mask: padding never wins a tie)
    is an argmax, and constant tables give the position of the tap in its window and of the window's origin,
    row-major, or column-major over the spatial axes for storage_order 1 (image after image, as ONNX counts)."""
    x = node.inputs[0]
    (n, c, *sizes), dtype = ctx.shape(x), np.dtype(ctx.values[x].dtype)
    rank = len(sizes)
    kernel, strides, dilations, pads, ends = _pool_window(node, sizes)
    counts = [(size + lo + hi - (k - 1) * d - 1) // s + 1
              for size, lo, hi, k, d, s in zip(sizes, pads[:rank], ends, kernel, dilations, strides)]
    if any(pads[:rank]) or any(ends):
        x = ctx.emit("pad", [x], {"pad_before": (0, 0, *pads[:rank]), "pad_after": (0, 0, *ends), "pad_value": (
            -np.inf if is_float(dtype.name) else int(np.iinfo(dtype).min))}, f"{node.name}_indices_pad")
    taps = np.array(list(np.ndindex(*kernel))) * dilations  # [K, rank], row-major as ONNX scans a window
    windows = ctx.emit("concat", [ctx.reshape(ctx.emit("strided_slice", [x], {
        "begin": tuple(tap), "end": tuple(t + (m - 1) * s + 1 for t, m, s in zip(tap, counts, strides)),
        "strides": strides, "axes": tuple(range(2, 2 + rank))}, f"{node.name}_tap"), (n, c, *counts, 1),
        f"{node.name}_tap_column") for tap in taps], {"axis": rank + 2}, f"{node.name}_windows")
    origins = np.stack(np.meshgrid(*(np.arange(m) * s - lo for m, s, lo in zip(counts, strides, pads[:rank])),
                                   indexing="ij"), -1)  # [*counts, rank]
    inside = np.all((origins[..., None, :] + taps >= 0) & (origins[..., None, :] + taps < sizes), -1)
    largest = ctx.emit("max", [windows], {"axis": rank + 2, "keepdims": True}, f"{node.name}_largest")
    hits = ctx.emit("binary", [ctx.emit("binary", [windows, largest], {"function": "equal"}, f"{node.name}_hits"),
                               ctx.add_constant(ctx.fresh_value(f"{node.name}_inside"), inside)],
                    {"function": "logical_and"}, f"{node.name}_real_hits")
    first = ctx.emit("argmax", [ctx.emit("cast", [hits], {"dtype": "int32"}, f"{node.name}_hits_int")],
                     {"axis": rank + 2, "keepdims": False}, f"{node.name}_first")
    place = np.array([math.prod(sizes[d + 1:]) if not node.attrs.get("storage_order", 0) else math.prod(sizes[:d])
                      for d in range(rank)])
    in_window = ctx.emit("take", [ctx.add_constant(ctx.fresh_value(f"{node.name}_tap_places"), taps @ place), first],
                         {"axis": 0}, f"{node.name}_in_window")
    in_image = ctx.emit("add", [in_window, ctx.add_constant(ctx.fresh_value(f"{node.name}_origins"), origins @ place)],
                        {}, f"{node.name}_in_image")
    images = np.arange(n * c, dtype="int64").reshape(n, c, *(1,) * rank) * math.prod(sizes)
    ctx.emit("add", [in_image, ctx.add_constant(ctx.fresh_value(f"{node.name}_images"), images)], {}, node.name,
             output=node.outputs[1])


_max_pool_values = _lifted(_pool("max_pool2d"))


def _max_pool(ctx: Importer, node: OnnxNode) -> None:
    """MaxPool: ``max_pool2d`` (lifted) for the values, and the Indices, when read, composed apart."""
    _max_pool_values(ctx, replace(node, outputs=node.outputs[:1]))
    if len(node.outputs) > 1 and node.outputs[1] in ctx.read:
        _pool_indices(ctx, node)


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
    "MaxPool": _max_pool, "AveragePool": _lifted(_pool("avg_pool2d")),
    "GlobalAveragePool": _global_pool("mean"), "GlobalMaxPool": _global_pool("max"),
}
