"""Graph rewrites for inference: each takes a Graph and returns a new one computing the same outputs.

``simplify`` runs them in order: BatchNorm folded into the convolution before it (one
heavy node instead of a heavy node and a per-channel affine pass), the erf form of GELU
that exporters emit recognised as one ``gelu`` node, reshapes sunk below the element-wise
nodes that read them (so that those fuse with the node before the reshape), then dead
nodes and constants removed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np

from ..te.dtype import finfo, is_float
from .builder import unique_name
from .ir import Graph, Node, Value
from .operators import BROADCAST, ELEMENTWISE, OPERATORS

_CONV_CHANNEL_AXIS = {"conv2d": 0, "depthwise_conv2d": None, "conv2d_transpose": 1}
"""The kernel axis of each convolution's output channels (depthwise: its first two axes together)."""


_SINKABLE = {name for name, op in OPERATORS.items() if op.pattern in (ELEMENTWISE, BROADCAST)} - {"batch_norm"}
"""Element-wise operators that a reshape may sink below (batch_norm's parameters follow an axis)."""


def simplify(graph: Graph) -> Graph:
    # the pieces of a GELU die first: a reshape sinks only below the one node that reads it
    return eliminate_dead_code(sink_reshapes(eliminate_dead_code(fuse_gelu(fold_batch_norm(graph)))))


def eliminate_dead_code(graph: Graph) -> Graph:
    """Only the nodes, constants and values that the outputs depend on."""
    live = set(graph.outputs)
    nodes = []
    for node in reversed(graph.nodes):
        if node.output in live:
            nodes.append(node)
            live.update(node.inputs)
    live.update(v.name for v in graph.inputs)
    return Graph(graph.inputs, graph.outputs, nodes[::-1], {k: v for k, v in graph.constants.items() if k in live},
                 {k: v for k, v in graph.values.items() if k in live})


def _single_consumer(graph: Graph, name: str) -> Node | None:
    consumers = graph.consumers(name)
    return consumers[0] if len(consumers) == 1 and name not in graph.outputs else None


def fold_batch_norm(graph: Graph) -> Graph:
    """``batch_norm(conv(x, W) [+ b])`` -> ``conv(x, W * s) + (b - mean) * s + beta``, s = gamma / sqrt(var + eps).

    Applies when the convolution's weight and the norm's parameters are constants and nothing
    else reads the convolution's output; the bias becomes an ``add`` of an [F, 1, 1] constant.
    A norm with constant parameters after anything else (a pre-activation network's) becomes
    ``x * s + (beta - mean * s)``: its kernel has no square root of a variance, which the
    tuner's random inputs would make negative (every candidate a NaN, none checked right).
    """
    graph = Graph(graph.inputs, graph.outputs, list(graph.nodes), dict(graph.constants), dict(graph.values))
    for norm in [n for n in graph.nodes if n.op == "batch_norm" and n.attrs.get("axis", 1) == 1]:
        if not all(graph.is_constant(p) for p in norm.inputs[1:]):
            continue
        found = _conv_before(graph, norm)
        if found is None:
            _fold_into_affine(graph, norm)
            continue
        conv, bias_add = found
        gamma, beta, mean, var = (graph.constants[p].astype(np.float64) for p in norm.inputs[1:])
        scale = gamma / np.sqrt(var + norm.attrs.get("epsilon", 1e-5))
        weight = graph.constants[conv.inputs[1]]
        axis = _CONV_CHANNEL_AXIS[conv.op]
        shape = [1] * weight.ndim
        if axis is None:
            shape[:2] = weight.shape[:2]
        else:
            shape[axis] = weight.shape[axis]
        bias = graph.constants[bias_add.inputs[1]].reshape(-1) if bias_add else np.zeros_like(scale)
        new_weight = add_constant(graph, f"{conv.name}_folded_weight",
                                   (weight * scale.reshape(shape)).astype(weight.dtype))
        new_bias = add_constant(graph, f"{conv.name}_folded_bias",
                                 ((bias - mean) * scale + beta).reshape(-1, 1, 1).astype(weight.dtype))
        index = graph.nodes.index(conv)
        graph.nodes[index] = replace(conv, inputs=(conv.inputs[0], new_weight, *conv.inputs[2:]))
        if bias_add:
            graph.nodes.remove(bias_add)
        graph.nodes[graph.nodes.index(norm)] = Node("add", (conv.output, new_bias), norm.output, {}, norm.name)
    return graph


def _fold_into_affine(graph: Graph, norm: Node) -> None:
    """``norm`` (constant parameters, channels on axis 1) as a ``multiply`` and an ``add`` of per-channel constants."""
    gamma, beta, mean, var = (graph.constants[p].astype(np.float64) for p in norm.inputs[1:])
    scale = gamma / np.sqrt(var + norm.attrs.get("epsilon", 1e-5))
    value = graph.values[norm.inputs[0]]
    shape = [1] * len(value.shape)
    shape[1] = -1
    factors = add_constant(graph, f"{norm.name}_scale", scale.reshape(shape).astype(value.dtype))
    shift = add_constant(graph, f"{norm.name}_shift", (beta - mean * scale).reshape(shape).astype(value.dtype))
    scaled = add_value(graph, f"{norm.output}_scaled", value.shape, value.dtype)
    index = graph.nodes.index(norm)
    graph.nodes[index:index + 1] = [Node("multiply", (norm.inputs[0], factors), scaled, {}, f"{norm.name}_scale"),
                                    Node("add", (scaled, shift), norm.output, {}, norm.name)]


def _conv_before(graph: Graph, norm: Node) -> tuple[Node, Node | None] | None:
    """The convolution feeding ``norm`` (through a constant bias ``add``), read by nothing else."""
    producer = graph.producer(norm.inputs[0])
    bias_add = None
    if producer is not None and producer.op == "add" and graph.is_constant(producer.inputs[1]):
        bias_add, producer = producer, graph.producer(producer.inputs[0])
        channels = tuple(graph.values[bias_add.inputs[1]].shape)
        if producer is None or channels[-3:] != (graph.values[producer.output].shape[1], 1, 1) or \
                math.prod(channels[:-3]) != 1 or _single_consumer(graph, bias_add.output) is not norm:
            return None
    if producer is None or producer.op not in _CONV_CHANNEL_AXIS or not graph.is_constant(producer.inputs[1]):
        return None
    if _single_consumer(graph, producer.output) is not (bias_add or norm):
        return None
    return producer, bias_add


def fuse_gelu(graph: Graph) -> Graph:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in the orders exporters emit (``/ sqrt(2)`` or ``* (1 / sqrt(2))``,
    the 0.5 on ``x`` or on the product) -> ``gelu(x)``; the pieces die unless something else reads them."""
    nodes = list(graph.nodes)
    for erf in (n for n in graph.nodes if n.op == "erf"):
        x = _gelu_input(graph, erf)
        one_plus = next((n for n in graph.consumers(erf.output)
                         if n.op == "add" and _is_scalar(graph, _other(n, erf.output), 1.0)), None)
        final = _gelu_product(graph, x, one_plus.output) if x and one_plus else None
        if final is not None:
            nodes[nodes.index(final)] = Node("gelu", (x,), final.output, {"approximate": "none"}, final.name)
    return Graph(graph.inputs, graph.outputs, nodes, graph.constants, graph.values)


def sink_reshapes(graph: Graph, only: frozenset[str] | None = None) -> Graph:
    """``op(reshape(x), y)`` -> ``reshape(op(x, y'))`` for an element-wise ``op`` that alone reads the
    reshape, when the other operands vary only along trailing axes that the reshape keeps (``y'``:
    ``y`` without its leading unit axes, a view). Fusion stops at a reshape, and exporters put one
    between every 3-D MatMul and its bias add (``dense`` on the rows, reshaped back to 3-D): sunk,
    the bias, a GELU and a residual add fuse into the dense kernel as its epilogue. Nodes are visited
    in order, so a reshape sinks through a whole element-wise chain. With ``only`` (node names),
    only those reshapes sink, and an operand of the reshape's own shape is viewed in its source's
    shape too (the residual of a convolution computed as a matrix product: ``half.gemm_convolutions``)."""
    nodes = graph.nodes
    graph = Graph(graph.inputs, graph.outputs, [], dict(graph.constants), dict(graph.values))
    producers: dict[str, Node] = {}
    readers = Counter(name for node in nodes for name in set(node.inputs))
    names = {node.name for node in nodes}
    for node in nodes:
        sunk = _sunk(graph, node, producers, readers, names, only) if node.op in _SINKABLE else None
        if sunk is None:
            graph.nodes.append(node)
            producers[node.output] = node
            continue
        reshape, replacements = sunk
        graph.nodes.remove(reshape)
        graph.nodes += replacements
        producers.update((n.output, n) for n in replacements)
    return graph


def _sunk(graph: Graph, node: Node, producers: dict[str, Node], readers: Counter,
          names: set[str], only: frozenset[str] | None) -> tuple[Node, list[Node]] | None:
    """The reshape that ``node`` reads and the nodes that replace both, or None when none may sink."""
    for name in dict.fromkeys(node.inputs):
        reshape = producers.get(name)
        if reshape is None or reshape.op != "reshape" or readers[name] != 1 or name in graph.outputs \
                or only is not None and reshape.name not in only:
            continue
        alike = only is not None
        source, shape = reshape.inputs[0], graph.values[name].shape
        if graph.values[node.output].shape != shape:
            continue  # the other operands broadcast the result beyond the reshape's shape
        before = graph.values[source].shape
        kept = 0  # trailing axes the reshape keeps
        while kept < min(len(before), len(shape)) and before[len(before) - 1 - kept] == shape[len(shape) - 1 - kept]:
            kept += 1
        others = [other for other in dict.fromkeys(node.inputs) if other != name]
        if all(len(graph.values[o].shape) <= kept or _trimmable(graph, o, kept)
               or alike and graph.values[o].shape == shape for o in others):
            return reshape, _sink(graph, node, reshape, others, kept, names, alike)
    return None


def _trimmable(graph: Graph, name: str, kept: int) -> bool:
    """Whether operand ``name`` is 1 along every axis before the last ``kept`` (a scalar for a
    constant when none are kept)."""
    shape = graph.values[name].shape
    return all(d == 1 for d in shape[:len(shape) - kept]) and (kept > 0 or graph.is_constant(name))


def _sink(graph: Graph, node: Node, reshape: Node, others: list[str], kept: int, names: set[str],
          alike: bool) -> list[Node]:
    nodes, operands = [], {reshape.output: reshape.inputs[0]}
    for other in others:
        shape = graph.values[other].shape
        trimmed = shape[len(shape) - kept:] if len(shape) > kept else shape
        if alike and shape == graph.values[reshape.output].shape:  # viewed as the reshape's source is
            trimmed = graph.values[reshape.inputs[0]].shape
        if trimmed == shape:
            operands[other] = other
        elif graph.is_constant(other):
            operands[other] = add_constant(graph, f"{other}_trimmed", graph.constants[other].reshape(trimmed))
        else:
            operands[other] = add_value(graph, f"{other}_trimmed", trimmed, graph.values[other].dtype)
            trim = unique_name(f"{node.name}_trim", names)
            names.add(trim)
            nodes.append(Node("reshape", (other,), operands[other], {"newshape": trimmed}, trim))
    result = add_value(graph, f"{node.output}_unshaped", graph.values[reshape.inputs[0]].shape,
                        graph.values[node.output].dtype)
    nodes.append(Node(node.op, tuple(operands[i] for i in node.inputs), result, node.attrs, node.name))
    nodes.append(Node("reshape", (result,), node.output, {"newshape": graph.values[node.output].shape},
                      reshape.name))
    return nodes


def _other(node: Node, name: str) -> str | None:
    """The other operand of a binary ``node`` that reads ``name``."""
    a, b = node.inputs
    return b if a == name else a if b == name else None


def _is_scalar(graph: Graph, name: str | None, value: float) -> bool:
    """Whether constant ``name`` is the scalar ``value``, as nearly as its type holds it (a
    float16 sqrt(2) is 1.4140625, 1.1e-4 off)."""
    array = graph.constants.get(name) if name else None
    floating = array is not None and is_float(array.dtype.name)
    tolerance = max(1e-4, float(finfo(array.dtype.name).eps)) if floating else 1e-4
    return array is not None and array.size == 1 and math.isclose(float(array.reshape(())), value, rel_tol=tolerance)


def _gelu_input(graph: Graph, erf: Node) -> str | None:
    scaled = graph.producer(erf.inputs[0])
    if scaled is not None and scaled.op == "divide" and _is_scalar(graph, scaled.inputs[1], math.sqrt(2)):
        return scaled.inputs[0]
    if scaled is not None and scaled.op == "multiply":
        return next((x for x in scaled.inputs if _is_scalar(graph, _other(scaled, x), 1 / math.sqrt(2))), None)
    return None


def _gelu_product(graph: Graph, x: str, one_plus: str) -> Node | None:
    for product in (n for n in graph.consumers(one_plus) if n.op == "multiply"):
        factor = _other(product, one_plus)
        if factor == x:
            return next((n for n in graph.consumers(product.output)
                         if n.op == "multiply" and _is_scalar(graph, _other(n, product.output), 0.5)), None)
        half = graph.producer(factor)
        if half is not None and half.op == "multiply" and _is_scalar(graph, _other(half, x), 0.5):
            return product
    return None


def add_constant(graph: Graph, hint: str, array: np.ndarray) -> str:
    name = add_value(graph, hint, array.shape, array.dtype.name)
    graph.constants[name] = array
    return name


def add_value(graph: Graph, hint: str, shape: tuple[int, ...], dtype: str) -> str:
    """A new value named ``hint`` (or ``hint_1``... if taken)."""
    name = unique_name(hint, graph.values)
    graph.values[name] = Value(name, tuple(shape), dtype)
    return name
