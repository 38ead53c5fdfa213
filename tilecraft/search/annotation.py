"""Random annotation of a draft: the sampled decisions that turn a structure into a sketch.

Ansor fills these in per candidate (its "init population rules"); here they become
sampling steps and block annotations in the sketch's trace, so that a candidate is just
the sketch plus a vector of decisions: parallel outer loops (how many to fuse), the
innermost spatial loop vectorized, ``auto_unroll_max_step`` for blocks that reduce,
weights packed in the order the tiles read them (bfloat16 ones in the pairs a CPU's dot
product of pairs reads, where it has one), and a sampled compute location for
every block that no rule placed.
"""

from __future__ import annotations

from ..schedule.schedule import Schedule
from ..target import Target
from .access import layout_free_reads
from .sketch_rules import Draft

UNROLL_STEPS = (0, 16, 64, 512)


def annotate(draft: Draft) -> Schedule:
    sch = draft.sch.copy()
    stages = list(sch.state.stages)
    for stage in stages:
        block = sch.get_block(stage.name)
        vectorized = bool(stage.leaves) and stage.loop(stage.leaves[-1]).kind == "spatial"  # a 0-d stage has none
        if vectorized:
            sch.annotate(block, "meta_schedule.vectorize", 1)
        if stage.op.reduce_axis:
            step = sch.sample_categorical(list(UNROLL_STEPS), [1 / len(UNROLL_STEPS)] * len(UNROLL_STEPS))
            sch.annotate(block, "pragma_auto_unroll_max_step", step)
        outer = _parallel_loops(sch, stage, vectorized)
        if stage.attach is None and outer:
            count = sch.sample_categorical(list(range(1, outer + 1)), [1 / outer] * outer)
            sch.annotate(block, "meta_schedule.parallel", count)
    pairs = (draft.target or Target.host()).has_bfloat16_dot  # AVX-512 BF16 reads a bfloat16 weight in pairs
    for name in sorted(draft.tiled):
        op = sch.state.stage(name).op
        for index in layout_free_reads(op):
            paired = pairs and op.input_tensors[index].dtype == "bfloat16"
            sch.rewrite_layout(sch.get_block(name), ("read", index), paired)
    for stage in reversed(stages):
        if stage.name in draft.tiled or stage.is_output or stage.attach is not None:
            continue
        block = sch.get_block(stage.name)
        if len(sch.compute_location_candidates(block)) > 1:
            sch.compute_at(block, sch.sample_compute_location(block))
    return sch


def _parallel_loops(sch: Schedule, stage, vectorized: bool) -> int:
    """How many outer loops of ``stage`` could be fused and run in parallel."""
    attach_points = {s.attach.loop for s in sch.state.stages if s.attach and s.attach.stage == stage.name}
    leaves = stage.leaves[:-1] if vectorized and len(stage.leaves) > 1 else stage.leaves
    count = 0
    for leaf in leaves:
        if stage.loop(leaf).kind != "spatial":
            break
        count += 1
        if leaf in attach_points:
            break
    return count
