"""Sketch rules for NVIDIA GPUs: the structures of Ansor's and MetaSchedule's GPU spaces.

A block that needs tiling (a matmul, a convolution) accumulates in registers
(``cache_write(..., "local")``) and is tiled with the structure ``SSSRRSRS``: the three
outer spatial levels, fused across the axes, are bound to ``blockIdx.x``, ``vthread.x`` and
``threadIdx.x``; the accumulator is computed at the thread level of its copy-out block; each
input is cached in shared memory at the first reduction level and fetched by the block's
threads together (``meta_schedule.cooperative_fetch``, realized at lowering once the thread
extents are known). Any other block at the root has its loops fused and split over blocks
and threads (auto-binding, with the thread count a sampled decision); a reduction short of
spatial parallelism gets a second sketch whose reduction runs across a row of threads.
Injective blocks that are not outputs are inlined; a reduction feeding another block (a
softmax's maximum) is computed at its consumer's block loop, by each thread or across the
block's threads. ``GPU_SKETCH_RULES`` is the list users extend, as on CPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..schedule.schedule import Schedule
from .sketch_rules import Condition, Draft, SketchRule, _needs_tiling, multi_level_tile

THREAD_COUNTS = (32, 64, 128, 256, 512, 1024)  # auto-binding's choices, as MetaSchedule's AutoBind
UNROLL_STEPS = (0, 16, 64, 512, 1024)  # MetaSchedule's DefaultCUDA
LEVEL_AXES = ("blockIdx.x", "vthread.x", "threadIdx.x")


@dataclass
class GpuMultiLevelTiling(SketchRule):
    """Tile for blocks, virtual threads and threads; registers for the accumulator; shared
    memory for the tiles of the inputs, fetched together by the block's threads."""

    name: str = "gpu_tile"
    structure: str = "SSSRRSRS"
    max_innermost_factor: int = 64
    fetch_lanes: int = 4  # a float4 a thread a copy step

    def condition(self, draft: Draft, block: str) -> Condition:
        return Condition.APPLY_AND_SKIP_REST if _needs_tiling(draft, block) else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        inputs = len(draft.stage(block).op.input_tensors)
        copy = sch.cache_write(sch.get_block(block), 0, "local")
        spatial_tiles, _ = multi_level_tile(sch, block, self.structure, self.max_innermost_factor, padded=False)
        levels = len(LEVEL_AXES)
        pieces = [sch.split(loop, list(tiles[:levels]) + [None])
                  for loop, tiles in zip(sch.get_loops(copy), spatial_tiles)]
        sch.reorder(*[p[n] for n in range(levels + 1) for p in pieces])
        bound = []
        for level, axis in enumerate(LEVEL_AXES):
            loops = [p[level] for p in pieces]
            bound.append(sch.fuse(*loops) if len(loops) > 1 else loops[0])
            sch.bind(bound[-1], axis)
        sch.compute_at(sch.get_block(block), bound[-1])
        # the block's own loops: S0 S1 S2 (each one a spatial axis), then the R0 loops
        own = sch.get_loops(sch.get_block(block))[-len(sch.state.stage(block).leaves):]
        first_reduction_level = own[levels * len(spatial_tiles) + len(sch.state.stage(block).op.reduce_axis) - 1]
        first = None
        for index in range(inputs):
            cached = sch.cache_read(sch.get_block(block), index, "shared")
            first = first or cached.name
            sch.compute_at(cached, first_reduction_level)
            sch.annotate(cached, "meta_schedule.cooperative_fetch", self.fetch_lanes)
        derived = draft.derive(sch, "gpu_tile", tiled=block)
        return [(derived, derived.index(first or block) - 1)]


@dataclass
class GpuAutoBind(SketchRule):
    """A block at the root: its spatial loops fused and split over blocks and threads; a
    reduction short of spatial parallelism also as a cross-thread reduction (its reduction
    loops fused and split over a row of threads, combined by warp shuffles)."""

    name: str = "auto_bind"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        at_root = not stage.attach and block not in draft.tiled and (stage.is_output or not draft.sch.state.consumers_of(block))
        return Condition.APPLY_AND_SKIP_REST if at_root else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        stage = draft.stage(block)
        results = [(self._threads_over_space(draft, block), draft.index(block) - 1)]
        space = math.prod(iv.extent for iv in stage.op.axis)
        if stage.op.reduce_axis and space < draft.num_cores * 32 * 4:
            results.append((self._threads_over_reduction(draft, block), draft.index(block) - 1))
        return results

    def _threads_over_space(self, draft: Draft, block: str) -> Draft:
        sch = draft.sch.copy()
        b = sch.get_block(block)
        spatial = len(draft.stage(block).op.axis)
        loops = sch.get_loops(b)[:spatial]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        threads = _uniform(sch, THREAD_COUNTS)
        outer, inner = sch.split(fused, [None, threads])
        sch.bind(outer, "blockIdx.x")
        sch.bind(inner, "threadIdx.x")
        return draft.derive(sch, f"auto_bind({block})")

    def _threads_over_reduction(self, draft: Draft, block: str) -> Draft:
        sch = draft.sch.copy()
        b = sch.get_block(block)
        spatial = len(draft.stage(block).op.axis)
        loops = sch.get_loops(b)
        rows = sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]
        reduction = sch.fuse(*loops[spatial:]) if len(loops) - spatial > 1 else loops[spatial]
        threads = _uniform(sch, THREAD_COUNTS)
        _, lanes = sch.split(reduction, [None, threads])
        sch.bind(rows, "blockIdx.x")
        sch.bind(lanes, "threadIdx.x")
        return draft.derive(sch, f"cross_thread({block})")


@dataclass
class GpuComputeAtBlock(SketchRule):
    """A block that cannot be inlined (a softmax's row maximum): computed at the block
    loop of its consumer, by the threads of that block."""

    name: str = "compute_at_block"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        consumers = draft.sch.state.consumers_of(block)
        wanted = not stage.attach and not stage.is_output and len(consumers) >= 1 and block not in draft.tiled
        return Condition.APPLY_AND_SKIP_REST if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        results = []
        for across_threads in (False, True) if draft.stage(block).op.reduce_axis else (False,):
            sch = draft.sch.copy()
            consumer = _root_consumer(sch, block)
            loops = [l for l in sch.get_loops(sch.get_block(consumer))
                     if sch.state.stage(consumer).loop(l.id).annotation == "blockIdx.x"]
            sch.compute_at(sch.get_block(block), loops[0])
            label = "compute_at_block"
            if across_threads:  # the block's threads share each row's reduction
                reductions = sch.get_loops(sch.get_block(block))[-len(draft.stage(block).op.reduce_axis):]
                fused = sch.fuse(*reductions) if len(reductions) > 1 else reductions[0]
                threads = _uniform(sch, THREAD_COUNTS)
                sch.bind(sch.split(fused, [None, threads])[1], "threadIdx.x")
                label = "cross_thread_at_block"
            results.append((draft.derive(sch, f"{label}({block})"), draft.index(block) - 1))
        return results


@dataclass
class GpuInline(SketchRule):
    """Inline every injective block that is not an output (a padding, an exponential): on a
    GPU recomputing it in each reader costs less than a pass through global memory."""

    name: str = "gpu_inline"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        wanted = (not stage.is_output and not stage.op.reduce_axis and not stage.attach
                  and bool(draft.sch.state.consumers_of(block)))
        return Condition.APPLY_AND_SKIP_REST if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        sch.compute_inline(sch.get_block(block))
        return [(draft.derive(sch, f"inline({block})"), draft.index(block) - 1)]


def _uniform(sch: Schedule, values: tuple[int, ...]):
    """A sampled choice among ``values``, each as likely."""
    return sch.sample_categorical(list(values), [1 / len(values)] * len(values))


def _root_consumer(sch: Schedule, block: str) -> str:
    """The block at the root that (through attached blocks) consumes ``block``."""
    stage = sch.state.consumers_of(block)[0]
    while stage.attach is not None:
        stage = sch.state.stage(stage.attach.stage)
    return stage.name


GPU_SKETCH_RULES: list[SketchRule] = [GpuInline(), GpuMultiLevelTiling(), GpuAutoBind(), GpuComputeAtBlock()]


def annotate_gpu(draft: Draft) -> Schedule:
    """A GPU draft's sampled annotations: the unroll step of every block that reduces."""
    sch = draft.sch.copy()
    for stage in list(sch.state.stages):
        if stage.op.reduce_axis and stage.name in draft.tiled:
            step = _uniform(sch, UNROLL_STEPS)
            sch.annotate(sch.get_block(stage.name), "pragma_auto_unroll_max_step", step)
    return sch

