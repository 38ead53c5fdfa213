"""Block annotations made real: parallel, vectorize and unroll once every block has its place.

A sketch decides *that* a block should run in parallel over some outer loops, be
vectorized and unrolled, before it knows whether a sampled compute location will inline
the block or move it under another loop. As in MetaSchedule's RewriteParallelVectorizeUnroll,
the sketch records intents on the block and this pass applies them just before lowering:
parallel only at the root, vectorize only a spatial innermost loop, and the fusion of
outer loops stopping at reduction loops, annotated loops and compute-at points. On a GPU,
a copy into shared memory is spread over the block's threads (cooperative fetch) once the
thread extents around it are known.
"""

from __future__ import annotations

from dataclasses import replace

from ..te.dtype import bytes_of
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
        if wanted.get("meta_schedule.cooperative_fetch") and stage.attach is not None:
            _cooperative_fetch(sch, sch.state.stage(name), wanted["meta_schedule.cooperative_fetch"])
    return sch


SECTOR_BYTES = 32  # a GPU's global memory moves 32-byte sectors: a warp reading whole ones of many rows wastes none


def _cooperative_fetch(sch: Schedule, stage: Stage, lanes: int) -> None:
    """Spread a copy into shared memory over the threads of the GPU block it runs in, as
    MetaSchedule's RewriteCooperativeFetch: its loops fused, split by the thread extents
    bound around it (read only now, once the tiles are known) and a vector of ``lanes``
    4-byte words (a float4 at 4), as many elements as those hold, up to 16 bytes: 8 of
    float16, 2 of float64; the pieces bound to the same thread axes. Where the tile is laid
    out across the rows it copies (``transform_layout``: A's tile along i), a warp takes a
    32-byte sector of each of many rows, not 128 bytes of a few: its stores, a row of the
    source apart in shared memory, then fall in 32 banks, not 8 banks 4 deep; the source's
    sectors are still read whole."""
    lanes = max(min(4 * lanes, 16) // bytes_of(stage.op.dtype), 1)
    threads: dict[str, int] = {}
    for loop_id in sch.loop_path(stage.name):
        loop = sch.state.stage_of_loop(loop_id).loop(loop_id)
        if loop.annotation.startswith("threadIdx"):
            threads[loop.annotation] = max(threads.get(loop.annotation, 1), loop.extent)
    if "threadIdx.x" not in threads and any(dict(loop.pragmas).get("tensor_core") for st in sch.state.stages
                                            for loop in st.loops):
        threads["threadIdx.x"] = 32  # a warp's lanes, bound by its tensor-core operations (ir/tensor_core.py)
    axes = [axis for axis in ("threadIdx.z", "threadIdx.y", "threadIdx.x") if axis in threads]
    leaves = [_rv(leaf) for leaf in stage.leaves]
    sector, row = SECTOR_BYTES // bytes_of(stage.op.dtype), stage.loop(stage.leaves[-1]).extent
    if stage.order and stage.order[-1] != len(stage.order) - 1 and row > sector and row % sector == 0:
        rest, along = sch.split(leaves[-1], [None, sector])  # a sector of each row, the rows next
        sch.reorder(rest, *leaves[:-1], along)
        leaves = [rest, *leaves[:-1], along]
    fused = sch.fuse(*leaves) if len(leaves) > 1 else leaves[0]
    vector = [lanes] if lanes > 1 else []
    pieces = sch.split(fused, [None] + [threads[axis] for axis in axes] + vector)
    for axis, piece in zip(axes, pieces[1:]):
        sch.bind(piece, axis)
    if vector:
        sch.vectorize(pieces[-1])


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
