"""Values that need no kernel: another array's elements, at an offset and strides.

A kernel reads and writes its arguments through flat indices, so an argument need not be a
whole C-contiguous array: it can be any strided view of one (``ir.slices``). Then a copy
between two kernels is not needed where the value it makes is such a view:

- ``read_views``: a strided slice (queries, keys and values split from one projection), a
  transpose that keeps the last axis last (the heads moved before the tokens), and the
  reshapes of either, where only kernels and other such views read them: each reading kernel
  reads the array they view;
- ``written_views``: a transpose that keeps the last axis last of a kernel's only output,
  which nothing else reads (the heads moved back after attention): that kernel writes the
  transposed array, through the inverse view.

Every view keeps the last axis contiguous (stride 1), so a kernel's vector loads and stores
along it stay vectors; a transpose that moves the last axis (the keys transposed for their
product) stays a copy. A concatenation's producers write their slices of it as views too
(``fuse.concat_slices``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..ops.transform import row_major, slice_bounds
from .fuse import Subgraph, concat_slices
from .ir import Graph, Node

VIEW_OPS = ("reshape", "transpose", "strided_slice")


@dataclass(frozen=True, slots=True)
class View:
    """A value's element (i0, i1, ...) is element ``offset + i0 * strides[0] + i1 * strides[1] + ...``
    of the C-contiguous array ``source``."""

    source: str
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a partitioned graph's kernels write and read values as views instead of copying
    them: ``written``, kernels' outputs by the view of a larger array each is written as;
    ``read``, values by the view each is read as; ``skipped``, the values whose own subgraph
    does not run (a copy that its producer or its readers do instead, a reshape of a value
    that no array holds)."""

    written: dict[str, View]
    read: dict[str, View]
    skipped: frozenset[str]


def place(graph: Graph, parts: Sequence[Subgraph]) -> Placement:
    """The views of ``parts``: a concatenation's parts written into it (``fuse.concat_slices``), then
    ``written_views``, then ``read_views`` of what is left."""
    written, skipped = {}, set()
    for name, (whole, offset) in concat_slices(graph, parts).items():
        strides = row_major(graph.values[whole].shape)
        written[name] = View(whole, sum(o * s for o, s in zip(offset, strides)), strides)
        skipped.add(whole)
    elided = set(written)
    for name, (view, between) in written_views(graph, parts, elided).items():
        written[name] = view
        skipped |= {view.source, *between}
        elided |= {name, *between}
    read = read_views(graph, parts, elided)
    return Placement(written, read, frozenset(skipped | set(read)))


def reshaped(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of the view (``shape``, ``strides``) reshaped to ``new`` without a copy, or None
    where that needs one (NumPy's rule: dimensions merged must lie one inside the other)."""
    if math.prod(shape) != math.prod(new):
        return None
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    kept = [d for d, n in enumerate(new) if n != 1]
    out = [0] * len(new)
    i = j = 0
    while i < len(old):
        first_i, first_j, old_size, new_size = i, j, old[i][0], new[kept[j]]
        while old_size != new_size:
            if old_size < new_size:
                i += 1
                old_size *= old[i][0]
            else:
                j += 1
                new_size *= new[kept[j]]
        if any(old[k][1] != old[k + 1][1] * old[k + 1][0] for k in range(first_i, i)):
            return None  # the group's old dimensions do not lie one inside the other
        stride = old[i][1]
        for k in range(j, first_j - 1, -1):
            out[kept[k]] = stride
            stride *= new[kept[k]]
        i, j = i + 1, j + 1
    for d in reversed(range(len(new))):  # a dimension of one index: any stride; the one a copy would have
        if new[d] == 1:
            out[d] = out[d + 1] * new[d + 1] if d + 1 < len(new) else 1
    return tuple(out)


def node_view(node: Node, shape: tuple[int, ...], offset: int, strides: tuple[int, ...],
              out_shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) of ``node``'s output, where its input is the view (``offset``, ``strides``)
    of an array and has ``shape``; None where the output is no view of that array."""
    if node.op == "reshape":
        new = reshaped(shape, strides, out_shape)
        return None if new is None else (offset, new)
    if node.op == "transpose":
        return offset, tuple(strides[axis] for axis in node.attrs["axes"])
    if node.op == "strided_slice":
        starts, steps, _ = slice_bounds(shape, node.attrs["begin"], node.attrs["end"], node.attrs.get("strides"),
                                        node.attrs.get("axes"))
        if any(step < 0 for step in steps):
            return None
        return (offset + sum(start * stride for start, stride in zip(starts, strides)),
                tuple(stride * step for stride, step in zip(strides, steps)))
    return None


def written_views(graph: Graph, parts: Sequence[Subgraph],
                  elided: set[str]) -> dict[str, tuple[View, tuple[str, ...]]]:
    """The kernels' outputs written as views of a transpose of them, each to (that view, the
    reshapes between them, which need no array either; the view's source is the transpose's
    output). The transpose keeps the last axis last; the output and the reshapes on the way
    have one reader each, and the model returns none of them. ``elided``: values that no array
    holds (a concatenation's parts, which their kernels write into it)."""
    readers, producer = _readers(parts), {part.outputs[0]: part for part in parts}
    found: dict[str, tuple[View, tuple[str, ...]]] = {}
    for part in parts:
        node = part.nodes[0]
        if len(part.nodes) != 1 or node.op != "transpose" or node.output in elided:
            continue
        transposed = row_major(graph.values[node.output].shape)
        inverse = [0] * len(transposed)
        for k, axis in enumerate(node.attrs["axes"]):
            inverse[axis] = transposed[k]
        strides: tuple[int, ...] | None = tuple(inverse)
        value, between = node.inputs[0], []
        while strides is not None and producer.get(value) is not None and producer[value].is_view \
                and _only_read_by(value, readers, graph):
            between.append(value)
            source = producer[value].inputs[0]
            strides = reshaped(graph.values[value].shape, strides, graph.values[source].shape)
            value = source
        kernel = producer.get(value)
        if (strides and strides[-1] == 1 and kernel is not None and not kernel.is_view and value not in elided
                and not (len(kernel.nodes) == 1 and kernel.nodes[0].op in VIEW_OPS)
                and _only_read_by(value, readers, graph)):
            found[value] = (View(node.output, 0, strides), tuple(between))
    return found


def read_views(graph: Graph, parts: Sequence[Subgraph], elided: set[str]) -> dict[str, View]:
    """The values that kernels read where they lie in another array instead of from a copy, each
    to its view of that array: the outputs of strided slices (steps forward) and transposes,
    and the reshapes of them, chained, where the last axis stays contiguous, only kernels and
    other such values read them, and the model returns none. ``elided``: values that no array
    holds (written in place by their kernels); no view is of a constant (weights are packed)."""
    readers = _readers(parts)
    found: dict[str, View] = {}
    for part in parts:
        node = part.nodes[0]
        source = node.inputs[0] if node.inputs else None
        if (len(part.nodes) != 1 or node.op not in VIEW_OPS or node.output in elided or source in elided
                or node.op == "reshape" and source not in found):  # a reshape of an array is a view already
            continue
        base = found.get(source) or View(source, 0, row_major(graph.values[source].shape))
        placed = None if base.source in graph.constants else node_view(
            node, graph.values[source].shape, base.offset, base.strides, graph.values[node.output].shape)
        if placed is not None and placed[1] and placed[1][-1] == 1:
            found[node.output] = View(base.source, *placed)
    for part in reversed(parts):  # readers first: a value stays a view where all its readers can read one
        name = part.outputs[0]
        if name in found and (name in graph.outputs or not all(
                reader.outputs[0] in found or not reader.is_view for reader in readers.get(name, ()))):
            del found[name]
    return found


def _readers(parts: Sequence[Subgraph]) -> dict[str, list[Subgraph]]:
    readers: dict[str, list[Subgraph]] = {}
    for part in parts:
        for name in dict.fromkeys(part.inputs):
            readers.setdefault(name, []).append(part)
    return readers


def _only_read_by(value: str, readers: dict[str, list[Subgraph]], graph: Graph) -> bool:
    return len(readers.get(value, ())) == 1 and value not in graph.outputs
