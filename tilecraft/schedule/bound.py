"""Bound inference: the range each stage must compute, given where it is attached.

A stage at the root computes its whole tensor. A stage computed at a loop that encloses
its consumers computes only the union of the regions their iterations inside that loop
read (a softmax's row of exponentials, read by the sum and by the division);
a stage reverse-computed at a loop of its producer consumes only what was produced
inside it, which must be a whole box (``writes_box_inside``). Regions have a symbolic
start (in the enclosing loop variables) and a constant extent, so the buffer of an
attached stage is a small fixed-size array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import LoweringError
from ..te.expr import Expr, TensorRead, Var, binary, const, free_vars, substitute, walk
from ..te.arith import bounds, interval, simplify, to_linear
from .state import Split, Stage, State, ceil_div


@dataclass(frozen=True)
class StageBounds:
    """Ranges of one stage: per root loop a (start, extent); per leaf loop its extent and variable."""

    root_min: tuple[Expr, ...]
    root_extent: tuple[int, ...]
    loop_extent: dict[int, int]
    loop_var: dict[int, Var]
    root_value: dict[int, Expr]  # root loop id -> offset inside the region, in leaf variables
    # split loops that are neither roots nor leaves -> (value in leaf variables, extent); a
    # non-dividing split of such a loop needs a guard, or iterations would repeat
    inner_split: dict[int, tuple[Expr, int]] = field(default_factory=dict)
    # output axes computed past the tensor's end rather than shifted back (``_may_pad``): no guard
    padded: frozenset[int] = frozenset()


class BoundInference:
    """Memoised inference over a whole state."""

    def __init__(self, state: State, loop_paths):
        self.state = state
        self.loop_paths = loop_paths
        self.result: dict[str, StageBounds] = {}
        self.loop_vars: dict[int, Var] = {}
        self._active: set[str] = set()

    def var(self, stage: Stage, loop_id: int) -> Var:
        if loop_id not in self.loop_vars:
            self.loop_vars[loop_id] = Var(stage.loop(loop_id).name)
        return self.loop_vars[loop_id]

    def ranges(self) -> dict[Var, int]:
        extents: dict[Var, int] = {}
        for b in self.result.values():
            for loop_id, extent in b.loop_extent.items():
                extents[b.loop_var[loop_id]] = extent
        return extents

    def of(self, name: str) -> StageBounds:
        if name in self.result:
            return self.result[name]
        if name in self._active:
            raise LoweringError(f"block {name} is attached in a cycle (computed inside a block computed inside it)")
        self._active.add(name)
        stage = self.state.stage(name)
        padded: frozenset[int] = frozenset()
        if stage.attach is None:
            mins = tuple(const(0) for _ in stage.roots)
            extents = tuple(stage.loop(r).extent for r in stage.roots)
        elif stage.attach.reverse:
            mins, extents = self._consumer_region(stage)
        else:
            mins, extents, padded = self._producer_region(stage)
        self.result[name] = replace(self._structure(stage, mins, extents), padded=padded)
        self._active.discard(name)
        return self.result[name]

    def _structure(self, stage: Stage, mins, extents) -> StageBounds:
        loop_extent = loop_extents(stage, extents)
        value: dict[int, Expr] = {leaf: self.var(stage, leaf) for leaf in stage.leaves}
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                expr = value[rel.children[0]]
                for child, factor in zip(rel.children[1:], rel.factors):
                    expr = binary("add", binary("mul", expr, const(factor)), value[child])
                value[rel.parent] = expr
            else:
                fused = value[rel.child]
                for n, parent in enumerate(rel.parents):
                    inner = math.prod(loop_extent[p] for p in rel.parents[n + 1:])
                    part = binary("floordiv", fused, const(inner)) if inner > 1 else fused
                    value[parent] = binary("floormod", part, const(loop_extent[parent])) if n > 0 else part
        loop_var = {leaf: self.var(stage, leaf) for leaf in stage.leaves}
        leaf_ranges = {loop_var[l]: loop_extent[l] for l in stage.leaves}
        root_value = {r: simplify(value[r], leaf_ranges) for r in stage.roots}
        inner_split = {rel.parent: (simplify(value[rel.parent], leaf_ranges), loop_extent[rel.parent])
                       for rel in stage.relations if isinstance(rel, Split) and rel.parent not in stage.roots}
        return StageBounds(tuple(mins), tuple(extents), {l: loop_extent[l] for l in stage.leaves}, loop_var,
                           root_value, inner_split)

    def _path_vars(self, name: str) -> list[tuple[int, Var, int]]:
        """(loop id, variable, extent) of every loop around block ``name``, outermost first."""
        path = []
        for loop_id in self.loop_paths(name):
            owner = self.state.stage_of_loop(loop_id)
            b = self.of(owner.name)
            path.append((loop_id, b.loop_var[loop_id], b.loop_extent[loop_id]))
        return path

    def root_index(self, stage: Stage, b: StageBounds) -> dict[Var, Expr]:
        """Each axis variable of the stage's op as an expression of loop variables."""
        axes = stage.op.axis + stage.op.reduce_axis
        return {iv.var: binary("add", m, b.root_value[r]) for iv, m, r in zip(axes, b.root_min, stage.roots)}

    def _varying(self, name: str, loop_id: int, relax_threads: bool = False) -> dict[Var, int]:
        """The loops around block ``name`` inside ``loop_id``; with ``relax_threads``, also
        the GPU thread loops outside it, whose iterations run at once (what one thread
        stores in shared memory, all the block's threads read)."""
        path = self._path_vars(name)
        ids = [p[0] for p in path]
        inside = ids.index(loop_id) + 1
        return {var: extent for n, (loop, var, extent) in enumerate(path)
                if n >= inside or (relax_threads and self._is_thread_loop(loop))}

    def _is_thread_loop(self, loop_id: int) -> bool:
        annotation = self.state.stage_of_loop(loop_id).loop(loop_id).annotation
        return annotation.startswith(("threadIdx", "vthread"))

    def _producer_region(self, stage: Stage):
        """The union of what the consumers read inside the attach loop, each over its own inner loops."""
        self.of(stage.attach.stage)
        uses = []  # (indices of a read, its consumer's axes as loop expressions, the consumer's inner loops)
        for consumer in self.state.consumers_of(stage.name):
            index = self.root_index(consumer, self.of(consumer.name))
            varying = self._varying(consumer.name, stage.attach.loop, relax_threads=stage.scope == "shared")
            walk(consumer.op.body, lambda n: uses.append((n.indices, index, varying)) if isinstance(n, TensorRead)
                 and n.tensor is stage.tensor else None)
        ranges = self.ranges()
        mins, extents, padded = [], [], set()
        for dim, size in enumerate(stage.tensor.shape):
            found = [interval(substitute(r[dim], index), varying, ranges) for r, index, varying in uses]
            region = _union(found, ranges)
            mins_dim, extent = (const(0), size) if region is None else region
            covered = _covered(stage, dim, extent)
            if region is not None and self._may_pad(stage, dim, mins_dim, covered, ranges):
                padded.add(dim)
                extent = covered
            else:
                mins_dim, extent = _clamp(mins_dim, extent, size, ranges)
            mins.append(mins_dim)
            extents.append(extent)
        for iv in stage.op.reduce_axis:
            mins.append(const(0))
            extents.append(iv.extent)
        return mins, extents, frozenset(padded)

    def _may_pad(self, stage: Stage, dim: int, low: Expr, extent: int, ranges) -> bool:
        """Whether a block may compute its last tile along output axis ``dim`` past the
        tensor's end, unguarded, rather than shift the tile back to end at the border.

        It may when it writes a buffer of its own (a local cache, or an intermediate computed
        inside its consumer: the consumer stores only what lies inside the tensor) and
        whatever it reads along that axis stays inside its input even past the end: an input
        not indexed by the axis, or a weight packed in whole tiles (``transform_layout`` pads
        it). A shifted tile of a packed weight starts inside a packed tile, so its vector
        reads become gathers: a 997x1021x1009 matmul ran at 72 GFLOPS shifted and 281 padded
        (docs/experiments/padded-tiles.md); a guarded one runs its vector loop scalar
        (docs/experiments/fused-tile-padding.md)."""
        span = bounds(low, ranges)
        own_buffer = stage.scope == "local" or (stage.scope == "global" and not stage.is_output)
        if not own_buffer or dim >= len(stage.op.axis) or span is None or span[0] < 0:
            return False
        axis = stage.op.axis[dim].var
        reach = {iv.var: iv.extent for iv in stage.op.axis + stage.op.reduce_axis}
        reach[axis] = span[1] + extent  # the indices the padded tile computes
        packed = {p.source: p for p in self.state.packed}
        produced = {s.tensor for s in self.state.stages}
        inside = True

        def check(node: Expr) -> None:
            nonlocal inside
            if not isinstance(node, TensorRead) or not any(axis in free_vars(i) for i in node.indices):
                return
            if node.tensor in produced:  # an intermediate's buffer holds only its own region
                inside = False
                return
            source = packed.get(node.tensor)
            indices, shape = node.indices, node.tensor.shape
            if source is not None:
                indices = tuple(substitute(t, dict(zip(source.source_vars, node.indices))) for t in source.index_map)
                shape = source.packed.shape
            for index, size in zip(indices, shape):
                reached = bounds(simplify(index, reach), reach)
                inside = inside and reached is not None and reached[0] >= 0 and reached[1] < size

        walk(stage.op.body, check)
        return inside

    def _consumer_region(self, stage: Stage):
        producer = self.state.producers_of(stage)[-1]
        if not self.writes_box_inside(producer.name, stage.attach.loop):
            loop = self.state.stage_of_loop(stage.attach.loop).loop(stage.attach.loop)
            raise LoweringError(
                f"the elements of {producer.tensor.name} that block {producer.name} writes inside loop "
                f"{loop.name} do not form a box (its loops there stride over, wrap around or skip elements), "
                f"so block {stage.name} would read values not computed yet; reverse-compute it at a loop whose "
                f"inner loops of {producer.name} sweep contiguous ranges"
            )
        return self.region_written_inside(producer.name, stage.attach.loop)

    def writes_box_inside(self, name: str, loop_id: int) -> bool:
        """Whether the iterations of block ``name`` inside ``loop_id`` write every element of
        the box that ``region_written_inside`` gives that lies in the tensor (provably; False
        when unsure). Each output axis must be a sum of distinct inner loop variables whose
        strides leave no gaps, and no guard may skip an element, except the tensor's bounds,
        which the consumer checks as well."""
        stage = self.state.stage(name)
        b = self.of(name)
        sweeping = {v: e for v, e in self._varying(name, loop_id).items() if e > 1}  # extent 1 is a constant
        ranges = self.ranges()
        seen: set[Var] = set()
        for dim, root in enumerate(stage.roots[: len(stage.op.axis)]):
            index = to_linear(simplify(binary("add", b.root_min[dim], b.root_value[root]), ranges), ranges)
            reach = 0  # the sweep so far covers [0, reach] with no gaps
            for atom, coeff in sorted(index.terms.items(), key=lambda item: abs(item[1])):
                if not free_vars(atom) & set(sweeping):
                    continue
                if not isinstance(atom, Var) or atom in seen or abs(coeff) > reach + 1:
                    return False
                seen.add(atom)
                reach += abs(coeff) * (sweeping[atom] - 1)
            span = bounds(b.root_value[root], ranges)
            if b.root_extent[dim] < stage.tensor.shape[dim] and (span is None or span[1] >= b.root_extent[dim]):
                return False
        extents = loop_extents(stage, b.root_extent)
        for split_loop, (value, extent) in b.inner_split.items():
            # the outermost piece of a root runs past its extent only where the root runs past the tensor
            if stage.loop(split_loop).kind != "spatial" or _is_outermost_piece(stage, split_loop, extents):
                continue
            span = bounds(value, ranges)
            if span is None or span[1] >= extent:
                return False
        return True

    def region_written_inside(self, name: str, loop_id: int) -> tuple[list[Expr], list[int]]:
        """Start and extent of each output axis of block ``name`` over the iterations inside ``loop_id``.

        The start is not clamped into the tensor (shifting it back would take values not
        computed in this iteration); only the extent is capped, and the rest is guarded.
        """
        stage = self.state.stage(name)
        b = self.of(name)
        varying = self._varying(name, loop_id)
        ranges = self.ranges()
        mins, extents = [], []
        for dim, root in enumerate(stage.roots[: len(stage.op.axis)]):
            found = interval(binary("add", b.root_min[dim], b.root_value[root]), varying, ranges)
            size = stage.tensor.shape[dim]
            start, extent = (const(0), size) if found is None else found
            mins.append(start)
            extents.append(min(extent, size))
        return mins, extents


def _is_outermost_piece(stage: Stage, loop_id: int, extents: dict[int, int]) -> bool:
    """Whether ``loop_id`` comes from a root through splits where only pieces of extent 1
    (constant zero) lie outside it."""
    while loop_id not in stage.roots:
        rel = next((r for r in stage.relations if isinstance(r, Split) and loop_id in r.children), None)
        if rel is None or any(extents[c] > 1 for c in rel.children[: rel.children.index(loop_id)]):
            return False
        loop_id = rel.parent
    return True


def _union(found, ranges) -> tuple[Expr, int] | None:
    if not found or any(f is None for f in found):
        return None
    low, extent = found[0]
    for other_low, other_extent in found[1:]:
        shift = bounds(simplify(binary("sub", other_low, low), ranges), ranges)
        if shift is None or shift[0] != shift[1]:
            return None
        end = shift[0] + other_extent
        if shift[0] < 0:
            low, extent = other_low, extent - shift[0]
            end -= shift[0]
        extent = max(extent, end)
    return low, extent


def _clamp(low: Expr, extent: int, size: int, ranges) -> tuple[Expr, int]:
    """Keep a region inside ``[0, size)`` (reads beyond it only happen under a guard)."""
    extent = min(extent, size)
    span = bounds(low, ranges)
    if span is not None and span[0] >= 0 and span[1] + extent <= size:
        return low, extent
    return binary("max", const(0), binary("min", low, const(size - extent))), extent


def refresh_extents(state: State, name: str) -> State:
    """Set the nominal loop extents of block ``name`` to those inferred for its new location."""
    inference = BoundInference(state, lambda n: loop_path(state, n))
    b = inference.of(name)
    stage = state.stage(name)
    extents = loop_extents(stage, b.root_extent)
    loops = tuple(replace(l, extent=extents.get(l.id, l.extent)) for l in stage.loops)
    return state.with_stage(replace(stage, loops=loops))


def _covered(stage: Stage, dim: int, extent: int) -> int:
    """``extent`` rounded up to whole innermost tiles of the split of root ``dim``: what its
    loops cover when a region narrower than its tiling (24 channels in tiles of 16) is
    computed past its end."""
    split = next((r for r in stage.relations if isinstance(r, Split) and r.parent == stage.roots[dim]), None)
    return extent if split is None else ceil_div(extent, split.factors[-1]) * split.factors[-1]


def loop_extents(stage: Stage, root_extents) -> dict[int, int]:
    """Extent of every loop of a stage, derived from its roots' extents through splits and fuses.

    A split keeps its factors as strides, but a piece iterates only as far as the parent's
    extent reaches: a tile of 32 rows split by (8, 8, 4) runs 1 x 8 x 4, not 8 x 8 x 4
    with most iterations guarded away. This is what makes a tiled block computed inside
    its consumer's tile loops as tight as the tile."""
    extents = dict(zip(stage.roots, root_extents))
    for rel in stage.relations:
        if isinstance(rel, Split):
            parent = extents[rel.parent]
            extents[rel.children[0]] = ceil_div(parent, math.prod(rel.factors))
            for position, child in enumerate(rel.children[1:], start=1):
                stride = math.prod(rel.factors[position:])
                extents[child] = min(rel.factors[position - 1], ceil_div(parent, stride))
        else:
            extents[rel.child] = math.prod(extents[p] for p in rel.parents)
    return extents


def loop_path(state: State, name: str) -> list[int]:
    stage = state.stage(name)
    if stage.attach is None:
        return list(stage.leaves)
    outer = loop_path(state, stage.attach.stage)
    return outer[: outer.index(stage.attach.loop) + 1] + list(stage.leaves)
