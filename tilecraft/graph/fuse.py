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
  needs no kernel: those kernels write their slices of it (``concat_slices``);
- a strided slice that is one contiguous run of its input needs no kernel either where only
  kernels (and reshapes) read it: they read the input where the run lies (``contiguous_slices``).

``subgraph_dag`` builds a group into one ``ComputeDAG`` with names that depend only on
positions inside the group (``in0``, ``conv2d_0``...), so structurally identical groups
(ResNet's repeated blocks) have equal workload keys and share one task and its records.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

from .. import te
from ..ops.transform import slice_bounds
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


def contiguous_slices(graph: Graph, parts: Sequence[Subgraph]) -> dict[str, tuple[str, tuple[int, ...], tuple]]:
    """The values that kernels can read where they lie in a larger array instead of from a copy,
    each to (that array, the shape to view it in, the value's offset in that view): the output
    of a strided slice that is one contiguous run of its input (queries, keys and values split
    from one projection; ONNX Split along the outermost axis), and the reshapes of it, where
    only kernels and such reshapes read them and the model returns none. Viewed as (rows,
    *the value's shape but its first), the run starts a row, so a reader indexes the larger
    array as it indexed the copy, its first index moved (``ir.slices.from_slice``)."""
    readers: dict[str, list[Subgraph]] = {}
    for part in parts:
        for name in dict.fromkeys(part.inputs):
            readers.setdefault(name, []).append(part)
    written_in_place = concat_slices(graph, parts)
    found: dict[str, tuple[str, tuple[int, ...], tuple]] = {}
    for part in parts:
        node = part.nodes[0]
        if len(part.nodes) != 1 or node.op != "strided_slice" or node.output in written_in_place:
            continue
        source = node.inputs[0]
        start = _run_start(graph.values[source].shape, node.attrs)
        if start is not None and source in found:  # a run of a run (a split of a split): of the first's array
            source, view, at = found[source]
            start += at[0] * math.prod(view[1:])
        if start is None or source in graph.constants or source in written_in_place:
            continue
        family, pending = [], [node.output]  # the slice and its reshapes, read where the run lies
        while pending:
            family.append(pending.pop())
            pending += [reader.outputs[0] for reader in readers.get(family[-1], ()) if reader.is_view]
        size, placed = math.prod(graph.values[source].shape), {}
        for name in family:
            shape = graph.values[name].shape
            row = math.prod(shape[1:])
            if name in graph.outputs or not shape or start % row or size % row:
                break
            placed[name] = (source, (size // row, *shape[1:]), (start // row,) + (0,) * (len(shape) - 1))
        else:
            found.update(placed)
    return found


def _run_start(shape: tuple[int, ...], attrs: dict) -> int | None:
    """The element where a strided slice of an array of ``shape`` starts, if what it selects is
    one contiguous run of the array: dimensions of one index, then one of a run of indices,
    then whole dimensions; None if it is not."""
    starts, steps, extents = slice_bounds(shape, attrs["begin"], attrs["end"], attrs.get("strides"),
                                          attrs.get("axes"))
    outer = next((d for d, extent in enumerate(extents) if extent > 1), len(shape))
    if any(extents[d] != shape[d] or (steps[d] != 1 and shape[d] > 1) for d in range(outer + 1, len(shape))):
        return None
    if outer < len(shape) and steps[outer] != 1:
        return None
    return sum(start * math.prod(shape[d + 1:]) for d, start in enumerate(starts))
