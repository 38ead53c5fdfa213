"""Operator fusion: a graph cut into subgraphs, each compiled into one kernel, after Relay's FuseOps.

Nodes are visited in topological order; a node joins the groups of its producers through
values that it alone reads (and that are no graph output), so every group has one output,
its last node, and groups run in the order of their last nodes. What may join what follows
the operators' patterns (``operators.py``), a group having at most one anchor:

- an ``elementwise`` or ``broadcast`` node joins one anchored group, or all anchor-free ones:
  a heavy or reduction anchor absorbs the chain of element-wise consumers that follows it
  (conv + bias + relu), never a second branch;
- an ``injective`` node joins groups without an anchor (element-wise and injective chains);
- ``heavy`` and ``reduction`` nodes anchor groups of their own: an element-wise producer
  inlined into a convolution would be recomputed for every reuse (Relay would fuse one into
  a reduction, and a transpose into a convolution might pay, but the sketch rules fail on
  some of both: a broadcasting producer of a softmax, a transpose before a strided conv);
- a ``reshape`` stays alone: every buffer is contiguous, so it runs as a zero-copy view;
- a concatenation whose inputs are each the only output of a kernel that nothing else reads
  needs no kernel: those kernels write their slices of it (``concat_slices``); slices and
  transposes that kernels can read or write as strided views need none either (``views.py``).

``subgraph_dag`` builds a group into one ``ComputeDAG`` with names that depend only on
positions inside the group (``in0``, ``conv2d_0``...), so structurally identical groups
(ResNet's repeated blocks) have equal workload keys and share one task and its records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

from .. import te
from ..te.dag import ComputeDAG
from .ir import Graph, Node
from .operators import BROADCAST, ELEMENTWISE, HEAVY, OPAQUE, OPERATORS, REDUCTION, build_node

VIEW_OPS = ("reshape",)


@dataclass(frozen=True, slots=True)
class Subgraph:
    """Nodes (in graph order) computed by one kernel from ``inputs`` (the values it reads, in
    argument order: graph inputs, constants or other subgraphs' outputs) into ``outputs``."""

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def is_view(self) -> bool:
        """A reshape, run as a view of its input's buffer instead of a kernel."""
        return len(self.nodes) == 1 and self.nodes[0].op in VIEW_OPS

    @property
    def ops(self) -> str:
        return "+".join(node.op for node in self.nodes)


@dataclass(slots=True)
class _Group:
    nodes: list[int]
    anchor: str | None  # HEAVY, REDUCTION, OPAQUE or None (element-wise and injective nodes only)
    closed: bool = False  # joins nothing and is joined by nothing (a view)


def partition(graph: Graph) -> list[Subgraph]:
    """The graph's nodes cut into fused subgraphs, in an order that runs them (see the module doc)."""
    consumers: dict[str, int] = {}
    for node in graph.nodes:
        for name in set(node.inputs):
            consumers[name] = consumers.get(name, 0) + 1
    groups: dict[str, _Group] = {}  # by the value of the group's last node
    for index, node in enumerate(graph.nodes):
        pattern = OPERATORS[node.op].pattern
        group = _Group([index], pattern if pattern in (HEAVY, REDUCTION, OPAQUE) else None, node.op in VIEW_OPS)
        fusable = [name for name in dict.fromkeys(node.inputs)
                   if name in groups and consumers[name] == 1 and name not in graph.outputs]
        for name in sorted(fusable, key=lambda name: groups[name].anchor is None):  # anchored first
            if _may_join(pattern, group, groups[name]):
                producer = groups.pop(name)
                group = _Group(sorted(producer.nodes + group.nodes), producer.anchor)
        groups[node.output] = group
    ordered = sorted(groups.values(), key=lambda g: g.nodes[-1])
    return [_subgraph([graph.nodes[i] for i in g.nodes]) for g in ordered]


def _may_join(pattern: str, group: _Group, producer: _Group) -> bool:
    """Whether a node of ``pattern`` (its group so far: ``group``) may absorb ``producer``'s group."""
    if group.closed or producer.closed or group.anchor is not None or producer.anchor == OPAQUE:
        return False  # one anchor per group, and it absorbs consumers, not producers or other branches
    return pattern in (ELEMENTWISE, BROADCAST) or producer.anchor is None


def _subgraph(nodes: list[Node]) -> Subgraph:
    produced = {node.output for node in nodes}
    inputs = tuple(dict.fromkeys(name for node in nodes for name in node.inputs if name not in produced))
    return Subgraph(tuple(nodes), inputs, (nodes[-1].output,))


def subgraph_dag(graph: Graph, subgraph: Subgraph) -> ComputeDAG:
    """The subgraph as one ComputeDAG: a placeholder per input, in order, then the nodes' builders;
    stages are named by position (``in0``, ``conv2d_0``...), never by node names."""
    tensors = {name: te.placeholder(graph.values[name].shape, f"in{k}", graph.values[name].dtype)
               for k, name in enumerate(subgraph.inputs)}
    placeholders = list(tensors.values())
    for k, node in enumerate(subgraph.nodes):
        tensors[node.output] = build_node(replace(node, name=f"{node.op}_{k}"), [tensors[i] for i in node.inputs])
    return ComputeDAG([*placeholders, *(tensors[name] for name in subgraph.outputs)])


def concat_slices(graph: Graph, parts: Sequence[Subgraph]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The values that their kernels can write straight into a concatenation, each to that
    concatenation and the offset of its slice: every input of a concatenation's own kernel (a
    copy, then not needed) is the only output of another kernel, not a concatenation itself,
    that nothing else reads and the model does not return."""
    readers = Counter(name for part in parts for name in set(part.inputs))
    single = {part.outputs[0]: part for part in parts if not part.is_view and len(part.outputs) == 1}
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for part in parts:
        node = part.nodes[0]
        if len(part.nodes) != 1 or node.op != "concat" or len(set(node.inputs)) != len(node.inputs):
            continue
        if all(name in single and single[name].nodes[-1].op != "concat" and readers[name] == 1
               and name not in graph.outputs for name in node.inputs):
            shape = graph.values[node.output].shape
            axis, start = node.attrs.get("axis", 0) % len(shape), 0
            for name in node.inputs:
                found[name] = (node.output, tuple(start if d == axis else 0 for d in range(len(shape))))
                start += graph.values[name].shape[axis]
    return found
