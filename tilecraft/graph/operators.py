"""The operators a graph node may name: how each builds its te compute, and its fusion pattern.

A builder takes the te tensors of the node's inputs (placeholders, or the outputs of earlier
builders when a fused group is built as one ``ComputeDAG``), the node's attributes and a
unique name for its stages, and returns the output tensor. The attributes are the keyword
arguments of the ``tilecraft.ops`` function, so a node reads like the call it stands for.

The pattern says how the node fuses, as Relay's ``OpPattern``: a ``heavy`` node (a
reduction over products: conv, dense, matmul) anchors a fused group; ``elementwise`` and
``broadcast`` nodes fuse into it; ``injective`` nodes (data movement) inline anywhere;
``reduction`` nodes (softmax, norms, pools) end a group; ``opaque`` ones stand alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import ops, te
from ..errors import TeError
from ..ops import winograd
from ..ops.common import compute_nd
from ..te.tensor import Tensor
from .ir import Node, Value

HEAVY, ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, OPAQUE = (
    "heavy", "elementwise", "broadcast", "injective", "reduction", "opaque")


@dataclass(frozen=True, slots=True)
class Operator:
    build: Callable[[list[Tensor], dict[str, Any], str], Tensor]
    pattern: str


def _call(fn: Callable[..., Tensor]) -> Callable[[list[Tensor], dict[str, Any], str], Tensor]:
    """The builder ``fn(*inputs, **attrs, name=name)``."""
    return lambda inputs, attrs, name: fn(*inputs, **attrs, name=name)


def _identity(x: Tensor, name: str) -> Tensor:
    return compute_nd(x.shape, lambda idx: x[idx], name)


OPERATORS: dict[str, Operator] = {
    "conv2d": Operator(_call(ops.conv2d_nchw), HEAVY),
    "depthwise_conv2d": Operator(_call(ops.depthwise_conv2d_nchw), HEAVY),
    "conv2d_nhwc": Operator(_call(ops.conv2d_nhwc), HEAVY),
    "conv2d_nhwc_gemm": Operator(_call(ops.conv2d_nhwc_gemm), HEAVY),
    "depthwise_conv2d_nhwc": Operator(_call(ops.depthwise_conv2d_nhwc), HEAVY),
    "conv2d_transpose": Operator(_call(ops.conv2d_transpose_nchw), HEAVY),
    "dense": Operator(_call(ops.dense), HEAVY),
    "matmul": Operator(_call(ops.matmul), HEAVY),
    "batch_matmul": Operator(_call(ops.batch_matmul), HEAVY),
    "axis_matmul": Operator(_call(ops.axis_matmul), HEAVY),
    **{name: Operator(_call(getattr(winograd, name)), HEAVY) for name in (
        "winograd_input", "winograd_matmul", "winograd_output")},
    **{name: Operator(_call(getattr(ops, name)), ELEMENTWISE) for name in (
        "relu", "sigmoid", "tanh", "gelu", "erf", "sqrt", "exp", "log", "abs", "negative", "clip", "cast")},
    "reciprocal": Operator(lambda inputs, attrs, name: ops.divide(1.0, inputs[0], name=name), ELEMENTWISE),
    **{name: Operator(_call(getattr(ops, name)), BROADCAST) for name in (
        "add", "subtract", "multiply", "divide", "truncate_divide", "power")},
    "batch_norm": Operator(_call(ops.batch_norm_inference), BROADCAST),
    **{name: Operator(_call(getattr(ops, name)), INJECTIVE) for name in (
        "reshape", "transpose", "pad", "strided_slice", "take", "broadcast_to")},
    "concat": Operator(lambda inputs, attrs, name: ops.concat(inputs, **attrs, name=name), INJECTIVE),
    "identity": Operator(_call(_identity), INJECTIVE),
    **{name: Operator(_call(getattr(ops, name)), REDUCTION) for name in (
        "softmax", "log_softmax", "layer_norm", "max_pool2d", "avg_pool2d", "global_avg_pool2d",
        "sum", "mean", "max", "min")},
}


def build_node(node: Node, inputs: list[Tensor]) -> Tensor:
    """The te output of ``node`` computed from ``inputs``, one tensor per entry of ``node.inputs``."""
    if node.op not in OPERATORS:
        raise TeError(f"node {node.name} names operator {node.op!r}, which is not in graph.operators.OPERATORS; "
                      f"use one of {', '.join(sorted(OPERATORS))}")
    return OPERATORS[node.op].build(inputs, node.attrs, node.name)


def build_alone(node: Node, values: dict[str, Value]) -> tuple[dict[str, Tensor], Tensor]:
    """``node`` built from fresh placeholders, one per distinct input value: (placeholders by value, output)."""
    placeholders: dict[str, Tensor] = {}
    for name in node.inputs:
        if name not in placeholders:
            value = values[name]
            placeholders[name] = te.placeholder(value.shape, f"{node.name}_in{len(placeholders)}", value.dtype)
    return placeholders, build_node(node, [placeholders[name] for name in node.inputs])
