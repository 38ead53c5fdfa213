"""The ONNX quantization operators, for 8- and 16-bit integers: QuantizeLinear, DequantizeLinear, QLinearMatMul,
QLinearConv, MatMulInteger and ConvInteger.

Dequantizing is ``(x - zero_point) * scale`` in float32; quantizing rounds ``x / scale``
half to even, adds the zero point and saturates to the output type's range. A scale or zero point
is per tensor, per axis (1-D, along ``axis``) or per block (``block_size`` elements of
``axis`` share one, read through a ``take``). The integer products subtract the zero
points in int32 and multiply there, exactly, as the standard defines them; the QLinear
ones then requantize the int32 result with the combined scale. Other quantized types
(4-bit, 2-bit, float8) are element types tilecraft does not compute in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from .onnx_importer import Importer, OnnxNode
from .onnx_nn import NN_CONVERTERS

Converter = Callable[[Importer, OnnxNode], None]
_RANGES = {dtype: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
           for dtype in ("uint8", "int8", "uint16", "int16")}


def _aligned(ctx: Importer, node: OnnxNode, param: str, shape: tuple[int, ...], hint: str) -> str:
    """A scale or zero point as a value that broadcasts against a tensor of ``shape``."""
    size, rank = int(np.prod(ctx.shape(param))), len(ctx.shape(param))
    axis = node.attrs.get("axis", 1) % max(len(shape), 1)
    if size == 1:
        return ctx.reshape(param, (), f"{hint}_scalar")
    if rank == 1:
        return ctx.reshape(param, [size if d == axis else 1 for d in range(len(shape))], f"{hint}_axis")
    if not node.attrs.get("block_size"):
        return param  # already shaped to broadcast (a zero point per row of MatMulInteger)
    blocks = ctx.add_constant(ctx.fresh_value(f"{hint}_blocks"), np.arange(shape[axis]) // node.attrs["block_size"])
    return ctx.emit("take", [param, blocks], {"axis": axis}, f"{hint}_blocked")


def _cast(ctx: Importer, x: str, dtype: str, hint: str) -> str:
    return x if ctx.values[x].dtype == dtype else ctx.emit("cast", [x], {"dtype": dtype}, hint)


def _centered(ctx: Importer, node: OnnxNode, x: str, zero_point: str, dtype: str, hint: str) -> str:
    """``x - zero_point`` in ``dtype``; ``x`` cast when there is no zero point."""
    x = _cast(ctx, x, dtype, f"{hint}_{dtype}")
    if not zero_point:
        return x
    zero = _cast(ctx, _aligned(ctx, node, zero_point, ctx.shape(x), f"{hint}_zero"), dtype, f"{hint}_zero_{dtype}")
    return ctx.emit("subtract", [x, zero], {}, f"{hint}_centered")


def _quantized(ctx: Importer, node: OnnxNode, scaled: str, zero_point: str, dtype: str) -> None:
    """The node's output: ``scaled`` (float, already divided by the scale) rounded, shifted and saturated."""
    if dtype not in _RANGES:
        raise node.unsupported(f"quantizing to {dtype} (only 8- and 16-bit integers)")
    rounded = _cast(ctx, ctx.emit("unary", [scaled], {"function": "rint"}, f"{node.name}_round"), "int32",
                    f"{node.name}_int32")
    if zero_point:
        zero = _cast(ctx, _aligned(ctx, node, zero_point, ctx.shape(rounded), f"{node.name}_y_zero"), "int32",
                     f"{node.name}_y_zero_int32")
        rounded = ctx.emit("add", [rounded, zero], {}, f"{node.name}_shifted")
    low, high = _RANGES[dtype]
    clipped = ctx.emit("clip", [rounded], {"a_min": low, "a_max": high}, f"{node.name}_saturated")
    ctx.emit_for(node, "cast", [clipped], {"dtype": dtype})


def _output_dtype(node: OnnxNode, default: str) -> str:
    import onnx

    code = node.attrs.get("output_dtype", 0)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)).name if code else default


def _quantize(ctx: Importer, node: OnnxNode) -> None:
    x, zero_point = node.inputs[0], node.input(2)
    scale = _aligned(ctx, node, node.inputs[1], ctx.shape(x), f"{node.name}_scale")
    if "precision" in node.attrs:  # the division in another float type
        dtype = _output_dtype(replace(node, attrs={"output_dtype": node.attrs["precision"]}), "float32")
        x, scale = (_cast(ctx, v, dtype, f"{node.name}_{k}_{dtype}") for k, v in enumerate((x, scale)))
    scaled = ctx.emit("divide", [x, scale], {}, f"{node.name}_scaled")
    dtype = ctx.values[zero_point].dtype if zero_point else _output_dtype(node, "uint8")
    _quantized(ctx, node, scaled, zero_point, dtype)


def _dequantize(ctx: Importer, node: OnnxNode) -> None:
    x, scale = node.inputs[:2]
    centered = _centered(ctx, node, x, node.input(2), "float32", f"{node.name}_x")
    scale = _cast(ctx, _aligned(ctx, node, scale, ctx.shape(x), f"{node.name}_scale"), "float32",
                  f"{node.name}_scale_float32")
    dtype = _output_dtype(node, ctx.values[node.inputs[1]].dtype)
    if dtype == "float32":
        return ctx.emit_for(node, "multiply", [centered, scale])
    ctx.emit_for(node, "cast", [ctx.emit("multiply", [centered, scale], {}, f"{node.name}_float32")], {"dtype": dtype})


def _integer(op_type: str, quantized: bool) -> Converter:
    """MatMulInteger or ConvInteger (``quantized``: QLinearMatMul or QLinearConv) as the float converter of
    ``op_type`` over int32 operands with their zero points subtracted."""
    def convert(ctx: Importer, node: OnnxNode) -> None:
        a, a_zero, b, b_zero = (node.input(k) for k in ((0, 2, 3, 5) if quantized else (0, 2, 1, 3)))
        if not quantized and a_zero and len(ctx.shape(a_zero)) == 1 and op_type == "MatMul":
            a_zero = ctx.reshape(a_zero, (ctx.shape(a_zero)[0], 1), f"{node.name}_a_zero_rows")  # one per row
        operands = [_centered(ctx, replace(node, attrs={"axis": axis}), x, zero, "int32", f"{node.name}_{hint}")
                    for x, zero, hint, axis in ((a, a_zero, "a", 0), (b, b_zero, "b", 0 if op_type == "Conv" else -1))]
        bias = [node.input(8)] if quantized and node.input(8) else []
        product = ctx.fresh_value(f"{node.name}_int32")
        NN_CONVERTERS[op_type](ctx, replace(node, op_type=op_type, inputs=(*operands, *bias), outputs=(product,)))
        if not quantized:
            return ctx.alias(node.outputs[0], product)
        scales = [_cast(ctx, node.inputs[k], "float32", f"{node.name}_scale{k}") for k in (1, 4, 6)]
        if op_type == "Conv" and ctx.shape(scales[1]) != ():  # one weight scale per output channel
            scales[1] = ctx.reshape(scales[1], (ctx.shape(scales[1])[0], 1, 1), f"{node.name}_w_scale")
        scale = ctx.emit("divide", [ctx.emit("multiply", scales[:2], {}, f"{node.name}_ab"), scales[2]], {},
                         f"{node.name}_scale")
        scaled = ctx.emit("multiply", [_cast(ctx, ctx.resolve(product), "float32", f"{node.name}_float32"), scale],
                          {}, f"{node.name}_scaled")
        _quantized(ctx, replace(node, attrs={}), scaled, node.input(7),
                   ctx.values[node.input(7)].dtype if node.input(7) else "uint8")

    return convert


QUANT_CONVERTERS: dict[str, Converter] = {
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
    "MatMulInteger": _integer("MatMul", False), "ConvInteger": _integer("Conv", False),
    "QLinearMatMul": _integer("MatMul", True), "QLinearConv": _integer("Conv", True),
}
