"""Sketch rules: the high-level structures of a program, derived from its compute DAG.

As in Ansor, the rules visit the stages from the last to the first. A rule looks at a
draft and a stage and says whether it applies; applying returns new drafts and the stage
to visit next. ``APPLY`` keeps trying later rules on the same draft (so a draft with and
one without, say, a cache stage both survive); ``APPLY_AND_SKIP_REST`` stops there.
Tile sizes are left to sampling steps (``sample_perfect_tile``): a sketch is a schedule
whose trace has free decisions. ``SKETCH_RULES`` is the list users extend.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass, replace
from typing import Any

from ..schedule.schedule import Schedule
from ..te.dtype import accumulates_in
from .access import (is_elementwise_reader, is_strictly_inlineable, needs_multi_level_tiling, reduces_outside_lanes,
                     transposed_axis)


class Condition(enum.Enum):
    SKIP = 0
    APPLY = 1
    APPLY_AND_SKIP_REST = 2


@dataclass(frozen=True)
class Draft:
    """A schedule under construction, with what the rules have done to it so far."""

    sch: Schedule
    num_cores: int  # of the target: how much parallelism a stage must expose
    tiled: frozenset[str] = frozenset()  # blocks with multi-level tiling
    steps: tuple[str, ...] = ()  # rule applications, for the sketch's name
    target: Any = None  # what a rule needs beyond the cores: a GPU's architecture (None: the host)

    def stage(self, name: str):
        return self.sch.state.stage(name)

    def index(self, name: str) -> int:
        return [s.name for s in self.sch.state.stages].index(name)

    def derive(self, sch: Schedule, label: str, tiled: str | None = None) -> Draft:
        return replace(self, sch=sch, steps=self.steps + (label,),
                       tiled=self.tiled | {tiled} if tiled else self.tiled)


@dataclass
class SketchRule(abc.ABC):
    """Base of the rules; ``condition`` and ``apply`` are what a custom rule defines."""

    name: str = "rule"

    @abc.abstractmethod
    def condition(self, draft: Draft, block: str) -> Condition:
        """Whether the rule applies to ``block`` of ``draft``, and whether later rules may too."""

    @abc.abstractmethod
    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        """The derived drafts, each with the index of the stage to visit next."""


def _single_elementwise_consumer(draft: Draft, block: str):
    stage = draft.stage(block)
    consumers = draft.sch.state.consumers_of(block)
    if len(consumers) == 1 and is_elementwise_reader(consumers[0].op, stage.tensor) and not consumers[0].attach:
        return consumers[0]
    return None


def _needs_tiling(draft: Draft, block: str) -> bool:
    stage = draft.stage(block)
    return block not in draft.tiled and not stage.attach and needs_multi_level_tiling(stage.op)


@dataclass
class AlwaysInline(SketchRule):
    name: str = "inline"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        simple = not stage.is_output and draft.sch.state.consumers_of(block) and is_strictly_inlineable(stage.op)
        return Condition.APPLY_AND_SKIP_REST if simple else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        sch.compute_inline(sch.get_block(block))
        return [(draft.derive(sch, f"inline({block})"), draft.index(block) - 1)]


@dataclass
class AddRfactor(SketchRule):
    """A tiled reduction with too little spatial parallelism for the cores (Ansor's
    NeedsRfactor), or an untiled one of at least ``min_reduction`` elements (Ansor takes
    any longer than the cores, pooling windows too): fuse its reduction loops, split them
    by a sampled factor and factor out either piece, the outer to run the partial
    reductions in parallel, the inner as vector lanes (it is the rf block's innermost
    loop). Both blocks are then left as they are, as in Ansor."""

    name: str = "rfactor"
    max_innermost_factor: int = 64
    jobs_per_core: int = 16  # a tiled op with fewer spatial iterations per core than this needs rfactor
    min_reduction: int = 64  # a shorter one (a pooling window) gains nothing from partial sums or lanes

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        if not stage.is_reduction or stage.attach or stage.relations or stage.scope != "global":
            return Condition.SKIP  # only an untransformed reduction without a cache-write stage
        space = math.prod(iv.extent for iv in stage.op.axis)
        reduce = math.prod(iv.extent for iv in stage.op.reduce_axis)
        if needs_multi_level_tiling(stage.op):
            wanted = space <= reduce and space <= self.jobs_per_core * draft.num_cores
        else:  # Ansor asks only for more elements than cores
            wanted = reduce > draft.num_cores and reduce >= self.min_reduction
        return Condition.APPLY if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        results = []
        for piece, label in enumerate(("rfactor_outer", "rfactor_inner")):
            sch = draft.sch.copy()
            loops = sch.get_loops(sch.get_block(block))
            spatial = len(draft.stage(block).op.axis)
            reduction = sch.fuse(*loops[spatial:]) if len(loops) - spatial > 1 else loops[spatial]
            pieces = sch.split(reduction, sch.sample_perfect_tile(reduction, 2, self.max_innermost_factor))
            sch.rfactor(pieces[piece], spatial)
            # the stage before the rf block: neither block is scheduled further
            results.append((draft.derive(sch, f"{label}({block})"), draft.index(block) - 1))
        return results


@dataclass
class AddCacheWrite(SketchRule):
    """Accumulate in a local buffer that the next rule tiles and places in a copy-out loop;
    a 16-bit float's sum always (its local buffer holds float32, ``accumulates_in``: summed in
    its output, tiled loops inside its reduction, it would round at every step)."""

    name: str = "cache_write"

    def condition(self, draft: Draft, block: str) -> Condition:
        if not _needs_tiling(draft, block) or _single_elementwise_consumer(draft, block) is not None:
            return Condition.SKIP
        return Condition.APPLY_AND_SKIP_REST if _summed_wider(draft, block) else Condition.APPLY

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        sch.cache_write(sch.get_block(block), 0, "local")
        return [(draft.derive(sch, "cache_write"), draft.index(block))]


def _summed_wider(draft: Draft, block: str) -> bool:
    """Whether ``block`` sums in a wider type than it stores (a 16-bit float's sum: float32)."""
    return accumulates_in(draft.stage(block).op.dtype) != draft.stage(block).op.dtype


@dataclass
class MultiLevelTiling(SketchRule):
    name: str = "tile"
    structure: str = "SSRSRS"
    max_innermost_factor: int = 64

    def condition(self, draft: Draft, block: str) -> Condition:
        return Condition.APPLY_AND_SKIP_REST if _needs_tiling(draft, block) else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        multi_level_tile(sch, block, self.structure, self.max_innermost_factor, padded=False)
        return [(draft.derive(sch, "tile", tiled=block), draft.index(block) - 1)]


@dataclass
class MultiLevelTilingWithFusion(SketchRule):
    """Tile, and compute the tile inside the matching tile loop of its element-wise
    consumer at each of ``levels``, so the result is consumed while still in cache; for a
    16-bit float's sum only these (inside its consumer its tile is local and holds float32,
    where tiled alone in its output it would round at every step).

    The consumer's loops follow the tile's inner lengths, as Ansor's FollowSplit does, its
    outer loops counted from them: split by the outer counts instead, a padded tile of 16
    over 56 columns gave the consumer tiles of 14, and the tile inside, bound to them, a
    vector loop of 14 (a ResNet-50 3x3 convolution over NCHW ran 15 GFLOPS, 204 following).
    """

    name: str = "tile_fuse"
    structure: str = "SSRSRS"
    levels: tuple[int, ...] = (1, 2)
    max_innermost_factor: int = 64

    def condition(self, draft: Draft, block: str) -> Condition:
        if not _needs_tiling(draft, block) or _single_elementwise_consumer(draft, block) is None:
            return Condition.SKIP
        cached = draft.sch.state.consumers_of(block)[0].name == f"{block}_local"
        return Condition.APPLY_AND_SKIP_REST if cached or _summed_wider(draft, block) else Condition.APPLY

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        results = []
        for level in self.levels:
            sch = draft.sch.copy()
            consumer = _single_elementwise_consumer(draft, block).name
            spatial_tiles, _ = multi_level_tile(sch, block, self.structure, self.max_innermost_factor, padded=True)
            c_block = sch.get_block(consumer)
            c_loops = sch.get_loops(c_block)
            pieces = []
            for loop, tiles in zip(c_loops, spatial_tiles):  # Ansor's FollowSplit: the tile's inner lengths
                parts = sch.split(loop, [None, *tiles[1:]])
                pieces.append([*parts[:level], sch.fuse(*parts[level:]) if len(parts) > level + 1 else parts[level]])
            sch.reorder(*[p[n] for n in range(level + 1) for p in pieces])
            sch.compute_at(sch.get_block(block), pieces[-1][level - 1])
            results.append((draft.derive(sch, f"fuse{level}", tiled=block), draft.index(block) - 1))
        return results


@dataclass
class TileTranspose(SketchRule):
    """A transpose written along one axis and read along another (NHWC back to NCHW) gathers
    every vector from as many cache lines; walking the read's contiguous axis one line at a
    time just outside the vector loop uses each line it loads whole."""

    name: str = "tile_transpose"
    line_elements: int = 16  # fp32 elements in a 64-byte cache line

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        axis = None if stage.attach or stage.relations else transposed_axis(stage.op)
        wanted = axis is not None and stage.op.axis[axis].extent % self.line_elements == 0
        return Condition.APPLY_AND_SKIP_REST if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        loops = sch.get_loops(sch.get_block(block))
        axis = transposed_axis(draft.stage(block).op)
        outer, inner = sch.split(loops[axis], [None, self.line_elements])
        rest = [loop for n, loop in enumerate(loops) if n != axis]
        sch.reorder(*loops[:axis], outer, *rest[axis:-1], inner, rest[-1])
        return [(draft.derive(sch, f"tile_transpose({block})"), draft.index(block) - 1)]


@dataclass
class WindowOutsideLanes(SketchRule):
    """A reduction that needs no tiling (a pool over NHWC) whose every read moves along its
    innermost output axis as that axis does (the channels) reduces with that axis innermost:
    each step of the window is one vector operation over the channels, where the window
    reduced channel by channel leaves the vector loop scalar (GoogLeNet's 3x3 max pool of
    56x56x192 down to 28x28: 0.103 ms; 0.056 with the window outside the lanes and the
    padding inlined, ``access.reused_only_in_a_window``)."""

    name: str = "window_outside_lanes"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        wanted = not stage.attach and not stage.relations and reduces_outside_lanes(stage.op)
        return Condition.APPLY_AND_SKIP_REST if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        loops = sch.get_loops(sch.get_block(block))
        spatial = len(draft.stage(block).op.axis)
        sch.reorder(*loops[:spatial - 1], *loops[spatial:], loops[spatial - 1])
        return [(draft.derive(sch, f"window_outside_lanes({block})"), draft.index(block) - 1)]


@dataclass
class SkipStage(SketchRule):
    name: str = "skip"

    def condition(self, draft: Draft, block: str) -> Condition:
        return Condition.APPLY

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        return [(draft, draft.index(block) - 1)]


def multi_level_tile(sch: Schedule, block: str, structure: str, max_innermost_factor: int, padded: bool,
                     whole: tuple = (), given: dict | None = None):
    """Split every spatial loop into the S levels and every reduction loop into the R
    levels of ``structure`` with sampled tiles, and order the pieces as it says; the loops
    ``whole`` stay as they are, outermost, and a loop in ``given`` (by id) is split by the
    factors given there (split-K's parts of the reduction, sampled with them).
    Returns the factors per spatial and per reduction loop.

    ``padded``: spatial tiles may also pad their loop (a 6-row register tile of 1024
    rows). Only for a block computed inside its consumer's tiles: there a partial tile
    is shifted to end at the border and stays guard-free, while a block at the root
    would test the border in its innermost loop. Reduction tiles are always perfect."""
    b = sch.get_block(block)
    kept = {loop.id for loop in whole}
    loops = [loop for loop in sch.get_loops(b) if loop.id not in kept]
    stage = sch.state.stage(block)
    kinds = [stage.loop(loop.id).kind for loop in loops]
    tiles, pieces = {"S": [], "R": []}, {"S": [], "R": []}
    for loop, kind in zip(loops, kinds):
        key = "S" if kind == "spatial" else "R"
        sample = sch.sample_tile if key == "S" and padded else sch.sample_perfect_tile
        factors = (given or {}).get(loop.id) or sample(loop, structure.count(key), max_innermost_factor)
        tiles[key].append(factors)
        pieces[key].append(sch.split(loop, factors))
    order, used = list(whole), {"S": 0, "R": 0}
    for key in structure:
        order += [p[used[key]] for p in pieces[key]]
        used[key] += 1
    sch.reorder(*order)
    return tiles["S"], tiles["R"]


SKETCH_RULES: list[SketchRule] = [
    AlwaysInline(), AddRfactor(), AddCacheWrite(), MultiLevelTilingWithFusion(), MultiLevelTiling(), TileTranspose(),
    WindowOutsideLanes(), SkipStage(),
]


def derive_drafts(sch: Schedule, num_cores: int, rules: list[SketchRule] | None = None,
                  target: Any = None) -> list[Draft]:
    """Every draft the rules derive for a ``target`` of ``num_cores``, visiting stages from the last to the first."""
    rules = SKETCH_RULES if rules is None else rules
    pending = [(Draft(sch, num_cores, target=target), len(sch.state.stages) - 1)]
    done: list[Draft] = []
    while pending:
        draft, index = pending.pop()
        if index < 0:
            done.append(draft)
            continue
        block = draft.sch.state.stages[index].name
        for rule in rules:
            condition = rule.condition(draft, block)
            if condition is Condition.SKIP:
                continue
            pending.extend(reversed(rule.apply(draft, block)))
            if condition is Condition.APPLY_AND_SKIP_REST:
                break
    return done
