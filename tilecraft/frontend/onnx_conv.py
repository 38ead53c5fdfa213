"""Converters of ONNX operators: the convolution family beyond Conv (Col2Im, DeformConv).

Both are one te op of ``tilecraft.ops.deform``, registered into ``OPERATORS`` here, since neither
composes from existing nodes at a reasonable cost:

- Col2Im (N-D) sums overlapping windows back into an image, a scatter-add; as the ``col2im``
  gather (each image element sums the entries whose window covers it) it reads only what it
  adds, where a product with a 0/1 matrix would cost the image's size times the columns'. Its
  ``image_shape`` and ``block_shape`` inputs give the output's shape, so they are needed at import.
- DeformConv (2-D, opset 19) reads its input at positions computed at run time (the offsets),
  bilinearly, which only a te read at a data-dependent index can do: ``deform_conv2d`` samples
  every tap as topi does, then sums against the kernel. The bias is an ``add`` of a [F, 1, 1]
  view after it, as for Conv.
"""

from __future__ import annotations

from typing import Callable

from .. import ops
from ..graph.operators import HEAVY, OPERATORS, REDUCTION, Operator
from .onnx_importer import Importer, OnnxNode

Converter = Callable[[Importer, OnnxNode], None]

OPERATORS.update({op: Operator(lambda inputs, attrs, name, fn=getattr(ops, op): fn(*inputs, **attrs, name=name), kind)
                  for op, kind in {"col2im": REDUCTION, "deform_conv2d": HEAVY}.items()})


def _ints(node: OnnxNode, key: str, default: int, count: int) -> tuple[int, ...]:
    return tuple(int(v) for v in node.attrs.get(key, (default,) * count))


def _col2im(ctx: Importer, node: OnnxNode) -> None:
    image_shape, block_shape = (tuple(int(v) for v in ctx.constant(node, index, what)) for index, what in (
        (1, "image shape"), (2, "block shape")))
    rank = len(image_shape)
    ctx.emit_for(node, "col2im", node.inputs[:1], {
        "image_shape": image_shape, "block_shape": block_shape, "strides": _ints(node, "strides", 1, rank),
        "pads": _ints(node, "pads", 0, 2 * rank), "dilations": _ints(node, "dilations", 1, rank)})


def _deform_conv(ctx: Importer, node: OnnxNode) -> None:
    x, weight, offset, bias, mask = (node.input(k) for k in range(5))
    if len(ctx.shape(x)) != 4:
        raise node.unsupported(f"a {len(ctx.shape(x)) - 2}-D deformable convolution (only 2-D, NCHW)")
    attrs = {"stride": _ints(node, "strides", 1, 2), "padding": _ints(node, "pads", 0, 4),
             "dilation": _ints(node, "dilations", 1, 2), "groups": int(node.attrs.get("group", 1)),
             "offset_groups": int(node.attrs.get("offset_group", 1))}
    inputs = [x, weight, offset, *([mask] if mask else [])]
    if not bias:
        return ctx.emit_for(node, "deform_conv2d", inputs, attrs)
    out = ctx.emit("deform_conv2d", inputs, attrs, node.name)
    bias = ctx.reshape(bias, (ctx.shape(bias)[0], 1, 1), f"{node.name}_bias_3d")
    ctx.emit("add", [out, bias], {}, f"{node.name}_bias", output=node.outputs[0])


CONV_CONVERTERS: dict[str, Converter] = {"Col2Im": _col2im, "DeformConv": _deform_conv}
