"""Block annotations made real: parallel, vectorize and unroll once every block has its place.

A sketch decides *that* a block should run in parallel over some outer loops, be
vectorized and unrolled, before it knows whether a sampled compute location will inline
the block or move it under another loop. As in MetaSchedule's RewriteParallelVectorizeUnroll,
the sketch records intents on the block and this pass applies them just before lowering:
parallel only at the root, vectorize only a spatial innermost loop, and the fusion of
outer loops stopping at reduction loops, annotated loops and compute-at points.
"""

from __future__ import annotations

from dataclasses import replace

from .schedule import LoopRV, Schedule
from .state import Stage


def apply_block_annotations(sch: Schedule) -> Schedule:
    """A copy of ``sch`` with its block annotations turned into loop annotations."""
    if not any(stage.annotations for stage in sch.state.stages):
        return sch
    sch = sch.copy()
    for name in [stage.name for stage in sch.state.stages]:
        stage = sch.state.stage(name)
        wanted = dict(stage.annotations)
        sch.state = sch.state.with_stage(replace(stage, annotations=()))
        if wanted.get("meta_schedule.vectorize"):
            _vectorize_innermost(sch, stage)
        if wanted.get("pragma_auto_unroll_max_step"):
            stage = sch.state.stage(name)
            sch.annotate(_rv(stage.leaves[0]), "pragma_auto_unroll_max_step", wanted["pragma_auto_unroll_max_step"])
        if wanted.get("meta_schedule.parallel") and stage.attach is None:
            _parallelize_outer(sch, sch.state.stage(name), wanted["meta_schedule.parallel"])
    return sch


def _rv(loop_id: int) -> LoopRV:
    return LoopRV(loop_id, f"l{loop_id}")


def _vectorize_innermost(sch: Schedule, stage: Stage) -> None:
    innermost = stage.loop(stage.leaves[-1])
    if innermost.kind == "spatial" and not innermost.annotation:
        sch.vectorize(_rv(innermost.id))


def _parallelize_outer(sch: Schedule, stage: Stage, max_loops: int) -> None:
    attach_points = {s.attach.loop for s in sch.state.stages if s.attach and s.attach.stage == stage.name}
    chosen = []
    for leaf in stage.leaves[:max_loops]:
        loop = stage.loop(leaf)
        if loop.kind != "spatial" or loop.annotation:
            break
        chosen.append(_rv(leaf))
        if leaf in attach_points:
            break
    if chosen:
        sch.parallel(sch.fuse(*chosen) if len(chosen) > 1 else chosen[0])
