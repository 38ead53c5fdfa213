"""Transposes that matrix products read their operands through instead of copying them.

Attention multiplies the queries by the keys transposed, and exporters write that transpose
as a node of its own. It moves the last axis (a head's features, contiguous) to the second
last, so no strided view can stand for it (``views``: every view keeps the last axis
contiguous) and it would be a kernel of its own, a copy. A product can read either operand
transposed (``transpose_a``, ``transpose_b``), so ``read_transposed`` has the product read the
keys as they lie and the copy goes.

It is a GPU's rewrite: a GPU's tiles pass through shared memory, which the tiling lays out
for the threads' reads whichever way the operand lies (``gpu_rules._along_register_rows``),
and a launch and a pass over the keys go. A CPU's product loads B's rows as vectors, which
the keys as they lie give it a lane at a time: BERT's scores so take 1.6x the time of the
copy and the product together (docs/experiments/keys-read-transposed.md), so there the copy stays.
"""

from __future__ import annotations

from collections import Counter

from .builder import unique_name
from .ir import Graph, Node
from .passes import add_value, eliminate_dead_code

_FLAGS = ((0, "transpose_a"), (1, "transpose_b"))
"""A product's operands by position, each with the attribute that reads it transposed."""


def read_transposed(graph: Graph) -> Graph:
    """Each operand of a ``matmul`` or ``batch_matmul`` made by a transpose that moves its input's
    last axis to the second last (``A @ transpose(K)``), maybe through a reshape of the leading
    axes, that nothing else reads: the product reads it transposed instead (its flag flipped),
    through the same transpose with its last two axes swapped back, which keeps the last axis
    last (a strided view, or nothing where it is the identity) and that reshape."""
    nodes, graph = graph.nodes, Graph(graph.inputs, graph.outputs, [], dict(graph.constants), dict(graph.values))
    producers: dict[str, Node] = {}
    readers = Counter(name for node in nodes for name in set(node.inputs))
    names = {node.name for node in nodes}
    for node in nodes:
        for position, flag in _FLAGS if node.op in ("matmul", "batch_matmul") else ():
            operand = _transposed_operand(graph, node.inputs[position], producers, readers)
            if operand is not None:
                inputs = list(node.inputs)
                inputs[position] = _read_swapped(graph, *operand, names)
                node = Node(node.op, tuple(inputs), node.output, {**node.attrs, flag: not node.attrs.get(flag)},
                            node.name)
        graph.nodes.append(node)
        producers[node.output] = node
    return eliminate_dead_code(graph)


def _transposed_operand(graph: Graph, name: str, producers: dict[str, Node],
                        readers: Counter) -> tuple[Node, Node | None] | None:
    """(the transpose, the reshape after it or None) that make operand ``name`` where a product may
    read it transposed instead (``read_transposed``); None where it may not."""
    reshape = producers.get(name)
    reshape = reshape if reshape is not None and reshape.op == "reshape" else None
    transpose = producers.get(reshape.inputs[0] if reshape else name)
    if transpose is None or transpose.op != "transpose":
        return None
    axes = _axes(graph, transpose)
    made = [transpose.output] + ([name] if reshape else [])
    if len(axes) < 2 or axes[-2] != len(axes) - 1 or any(readers[n] != 1 or n in graph.outputs for n in made):
        return None
    if reshape is not None and graph.values[name].shape[-2:] != graph.values[transpose.output].shape[-2:]:
        return None  # the reshape mixes the matrix's axes with the batch's
    return transpose, reshape


def _read_swapped(graph: Graph, transpose: Node, reshape: Node | None, names: set[str]) -> str:
    """The operand of ``transpose`` (then ``reshape``) with its last two axes swapped: the nodes that
    make it are appended to ``graph``, and its name returned."""
    source, *axes, second_last, last = transpose.inputs[0], *_axes(graph, transpose)
    axes = (*axes, last, second_last)
    if axes != tuple(range(len(axes))):
        shape = tuple(graph.values[source].shape[axis] for axis in axes)
        source = _append(graph, Node("transpose", (source,), "", {"axes": axes}, transpose.name), shape, names)
    if reshape is not None:
        *batch, rows, columns = graph.values[reshape.output].shape
        shape = (*batch, columns, rows)
        source = _append(graph, Node("reshape", (source,), "", {"newshape": shape}, reshape.name), shape, names)
    return source


def _axes(graph: Graph, transpose: Node) -> tuple[int, ...]:
    """The axes of ``transpose``'s input that its output's take, in order (as ``ops.transpose``'s)."""
    ndim = len(graph.values[transpose.inputs[0]].shape)
    axes = transpose.attrs.get("axes")
    return tuple(reversed(range(ndim))) if axes is None else tuple(axis % ndim for axis in axes)


def _append(graph: Graph, node: Node, shape: tuple[int, ...], names: set[str]) -> str:
    """Append ``node`` to ``graph`` under a new name, with a new output of ``shape``; its output."""
    name = unique_name(f"{node.name}_kept_last", names)
    names.add(name)
    output = add_value(graph, name, shape, graph.values[node.inputs[0]].dtype)
    graph.nodes.append(Node(node.op, node.inputs, output, node.attrs, name))
    return output
