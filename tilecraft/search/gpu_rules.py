"""Sketch rules for NVIDIA GPUs: the structures of Ansor's and MetaSchedule's GPU spaces.

A block that needs tiling (a matmul, a convolution) accumulates in registers
(``cache_write(..., "local")``) and is tiled with the structure ``SSSRRSRS``: the three
outer spatial levels, fused across the axes, are bound to ``blockIdx.x``, ``vthread.x`` and
``threadIdx.x``; the accumulator is computed at the thread level of its copy-out block; each
input is cached in shared memory at the first reduction level and fetched by the block's
threads together (``meta_schedule.cooperative_fetch``, realized at lowering once the thread
extents are known); a second sketch double-buffers those tiles across the reduction's steps
(``software_pipeline``, with ``cp.async`` copies on sm_80 and newer), a third lays a tile
out along the rows a thread reads of it (A's of a matmul: i contiguous, read as vectors,
where its rows of k were read one float at a time; ``transform_layout`` on the write), and
a fourth double-buffers that.
Its element-wise epilogue (a bias and a ReLU after a convolution) is folded into the
copy-out, so the result leaves the registers once, finished. Where the outputs are too few
to fill the SMs and nothing reads them in the kernel, another sketch splits the reduction's
first axis into parts (split-K): the partial sums, factored out (``rfactor``) and tiled as
the accumulator is, are each a block's along ``blockIdx.y``, and the blocks add them into
the output atomically, the output zeroed before the kernel; an epilogue that only adds to
the sum (a bias, a residual) is added by the first part. Where atomics cannot finish the sum
(a ReLU after it), the parts' sums go to a workspace instead, and a second kernel adds them
up in order and applies the epilogue (``ir/kernels.py``). Any other block at the root has
its loops fused and split over blocks and threads (auto-binding, with the thread count a
sampled decision; a block that reads a row reduction binds the rows to blocks); a reduction
short of spatial parallelism, tiled or not (a matrix-vector product, its epilogue applied
in the block), gets a sketch whose reduction runs across a row of threads. A float16 matmul
(or a bfloat16 one, from sm_80 on) also gets sketches on tensor cores (``GpuTensorCoreTiling``).
Injective blocks that are not outputs are inlined; a reduction feeding another block (a
softmax's maximum) is computed at its consumer's block loop, by each thread or across the
block's threads. ``GPU_SKETCH_RULES`` is the list users extend, as on CPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.lower import ATOMIC_DTYPES
from ..ir.tensor_core import TILE, WARP
from ..schedule.index_expr import index_expr_to_json
from ..schedule.sampling import divisors
from ..schedule.schedule import Schedule, adds_to_sum
from ..schedule.trace import IndexMap
from ..te.dtype import HALVES, bytes_of
from ..te.expr import Binary, Cast, Const, TensorRead, Var, free_vars
from .access import is_elementwise_reader, needs_multi_level_tiling, reads_of
from .sketch_rules import Condition, Draft, SketchRule, SkipStage, _needs_tiling, multi_level_tile

if TYPE_CHECKING:  # space.py imports these rules
    from .space import Sketch

THREAD_COUNTS = (32, 64, 128, 256, 512, 1024)  # auto-binding's choices, as MetaSchedule's AutoBind
SPLIT_K_OUTPUTS_PER_SM = 128 * 128  # fewer outputs than a 128 x 128 tile an SM leave SMs idle: split-K pays
MIN_PART = 64  # split-K is offered where the reduction has two parts of at least this many products
SUM_THREADS = 256  # a block's threads in the kernel adding split-K's parts from a workspace: as many as the
# tiled kernel's at most (in the decisions, a launch's threads are its widest thread loop's, over both kernels)
UNROLL_STEPS = (0, 16, 64, 512, 1024)  # MetaSchedule's DefaultCUDA
LEVEL_AXES = ("blockIdx.x", "vthread.x", "threadIdx.x")


@dataclass
class GpuMultiLevelTiling(SketchRule):
    """Tile for blocks, virtual threads and threads; registers for the accumulator; shared
    memory for the tiles of the inputs, fetched together by the block's threads."""

    name: str = "gpu_tile"
    structure: str = "SSSRRSRS"
    max_innermost_factor: int = 64
    fetch_lanes: int = 4  # 4-byte words a thread a copy step: a float4, or 8 float16 (postproc)
    software_pipeline: bool = True  # also a sketch whose shared tiles are double-buffered
    transposed_tiles: bool = True  # also a sketch whose shared tiles lie along the register tile's rows
    split_k: bool = True  # also split-K where it pays
    atomic_split_k: bool = True  # its parts added atomically where they can be; False: by a second kernel, in
    # order, so that the sums' bits repeat from run to run

    def condition(self, draft: Draft, block: str) -> Condition:
        return Condition.APPLY_AND_SKIP_REST if _needs_tiling(draft, block) else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        copy = sch.cache_write(sch.get_block(block), 0, "local")
        epilogue = _epilogue(draft, block)
        cropped = epilogue is not None and _crops(draft, block, epilogue)
        if cropped:  # the epilogue copies out the registers it keeps, a padded product's tiles cropped
            sch.compute_inline(copy)
            copy = sch.get_block(epilogue)
        elif epilogue is not None:  # its other element-wise stages are inlined into it by now
            sch.reverse_compute_inline(sch.get_block(epilogue))
        spatial_tiles, _ = multi_level_tile(sch, block, self.structure, self.max_innermost_factor, padded=False)
        first, first_reduction_level = self._bind_and_cache(sch, sch.get_loops(copy), block, spatial_tiles,
                                                            cropped=cropped)
        derived = draft.derive(sch, "gpu_tile", tiled=block)
        results = [(derived, derived.index(first or block) - 1)]
        if first is not None and self.software_pipeline:  # the same tiles, double-buffered (ir/pipeline.py)
            piped = sch.copy()
            piped.annotate(first_reduction_level, "software_pipeline", 2)
            results.append((draft.derive(piped, "gpu_tile_pipelined", tiled=block), derived.index(first) - 1))
        if first is not None and self.transposed_tiles:  # a thread's rows of A read as vectors
            results += self._transposed(draft, sch.copy(), block, first_reduction_level, derived.index(first) - 1)
        if _short_of_rows(draft, block):  # a matrix-vector product: threads along the reduction
            results.append((threads_over_reduction(draft, block, epilogue), draft.index(block) - 1))
        if self.split_k and _pays_to_split(draft, block):
            atomic = self.atomic_split_k and _adds_atomically(draft, block, epilogue)
            results.append(self._split_k(draft, block, epilogue) if atomic
                           else self._split_k_in_workspace(draft, block, epilogue))
        return results

    def _transposed(self, draft: Draft, sch: Schedule, block: str, first_reduction_level, at: int) -> list:
        """The tiled ``sch`` with A's shared tile along i (``_along_register_rows``), and that
        double-buffered: its copy a float a thread a step, so that each is a ``cp.async`` (a
        float4 would store its lanes rows apart, through registers, and stall the step on the
        load), a warp's 32 floats whole sectors of A's rows."""
        along = _along_register_rows(sch, draft.stage(block).op)
        if not along:
            return []
        results = [(draft.derive(sch, "gpu_tile_transposed", tiled=block), at)]
        if self.software_pipeline:
            piped = sch.copy()
            for name in along:
                piped.annotate(piped.get_block(name), "meta_schedule.cooperative_fetch", 1)
            piped.annotate(first_reduction_level, "software_pipeline", 2)
            results.append((draft.derive(piped, "gpu_tile_transposed_pipelined", tiled=block), at))
        return results

    def _split_k(self, draft: Draft, block: str, epilogue: str | None) -> tuple[Draft, int]:
        """Split-K: the reduction's first axis tiled with one more level outermost, its parts;
        each part's sum a block's (``rfactor``; the parts bound to ``blockIdx.y``), tiled as
        the accumulator is, and added into the output atomically (``ir/lower.py``), with
        what the epilogue adds (a bias, a residual) added by the first part."""
        sch = draft.sch.copy()
        spatial = len(draft.stage(block).op.axis)
        partials, parts, rest, factors = self._partial_sums(sch, block, spatial)
        if epilogue is not None:
            sch.reverse_compute_inline(sch.get_block(epilogue))  # into the sum of the parts
        spatial_tiles, _ = multi_level_tile(sch, partials.name, self.structure, self.max_innermost_factor,
                                            padded=False, whole=(parts,), given={rest.id: factors[1:]})
        loops = sch.get_loops(sch.get_block(block))
        sch.bind(loops[spatial], "blockIdx.y")
        cached, _ = self._bind_and_cache(sch, loops[:spatial], partials.name, spatial_tiles, outer=loops[spatial:])
        derived = draft.derive(sch, "gpu_split_k", tiled=partials.name)
        return derived, derived.index(cached or partials.name) - 1

    def _split_k_in_workspace(self, draft: Draft, block: str, epilogue: str | None) -> tuple[Draft, int]:
        """Split-K whose parts' sums, each a block's along ``blockIdx.y`` and tiled as the
        accumulator is, are stored to a workspace (their own buffer, at the root) by one
        kernel; a second kernel adds them up in order, a thread an output, and applies the
        epilogue, whatever it is (a ReLU, which atomic adds could not; ``ir/kernels.py``)."""
        sch = draft.sch.copy()
        spatial = len(draft.stage(block).op.axis)
        partials, parts, rest, factors = self._partial_sums(sch, block, spatial)
        stored = sch.cache_write(partials, 0, "local")  # partials compute in registers, ``stored`` writes them
        spatial_tiles, _ = multi_level_tile(sch, partials.name, self.structure, self.max_innermost_factor,
                                            padded=False, whole=(parts,), given={rest.id: factors[1:]})
        loops = sch.get_loops(stored)  # the part, then the spatial axes
        sch.bind(loops[0], "blockIdx.y")
        cached, _ = self._bind_and_cache(sch, loops[1:], partials.name, spatial_tiles, outer=loops[:1])
        last = sch.get_block(epilogue or block)
        outputs = sch.get_loops(last)[:spatial]
        threads = min(SUM_THREADS, math.prod(iv.extent for iv in draft.stage(block).op.axis))
        blocks, threads = sch.split(sch.fuse(*outputs) if spatial > 1 else outputs[0], [None, threads])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
        if epilogue is not None:
            sch.compute_at(sch.get_block(block), threads)
        derived = draft.derive(sch, "gpu_split_k_workspace", tiled=partials.name)
        return derived, derived.index(cached or partials.name) - 1

    def _partial_sums(self, sch: Schedule, block: str, spatial: int) -> tuple:
        """Split-K's parts: the reduction's first axis (after ``spatial`` loops) tiled with one
        more level outermost, the parts; each part's sum factored out (``rfactor``: ``block``
        then adds up the partial sums over its last loop). Returns the partials' block, the
        parts' loop, the rest's loop and the tile's factors, the rest's still to apply."""
        first = sch.get_loops(sch.get_block(block))[spatial]
        factors = sch.sample_perfect_tile(first, 1 + self.structure.count("R"), self.max_innermost_factor)
        parts, rest = sch.split(first, [factors[0], None])
        return sch.rfactor(parts, 0), parts, rest, factors

    def _bind_and_cache(self, sch: Schedule, copy_loops: list, tiled: str, spatial_tiles: list,
                        outer: list = (), cropped: bool = False) -> tuple[str | None, object]:
        """The register tile's copy-out (``copy_loops``, its spatial loops, after its loops
        ``outer``) split as ``tiled`` is, its outer levels bound to blocks, virtual threads and
        threads, and ``tiled`` computed at its thread loop; each input of ``tiled`` cached in
        shared memory at its first reduction level (after as many loops left whole as
        ``outer`` has). A ``cropped`` copy-out, shorter than ``tiled``, takes as many blocks
        as its thread tiles fill. Returns the first cache's name and that loop."""
        inputs = len(sch.state.stage(tiled).op.input_tensors)
        levels = len(LEVEL_AXES)
        if cropped:
            pieces = [sch.split(loop, [None, *tiles[1:]]) for loop, tiles in zip(copy_loops, spatial_tiles)]
            pieces = [[*p[:levels], sch.fuse(*p[levels:])] for p in pieces]
        else:
            pieces = [sch.split(loop, list(tiles[:levels]) + [None]) for loop, tiles in zip(copy_loops, spatial_tiles)]
        sch.reorder(*outer, *[p[n] for n in range(levels + 1) for p in pieces])
        bound = []
        for level, axis in enumerate(LEVEL_AXES):
            loops = [p[level] for p in pieces]
            bound.append(sch.fuse(*loops) if len(loops) > 1 else loops[0])
            sch.bind(bound[-1], axis)
        sch.compute_at(sch.get_block(tiled), bound[-1])
        # the block's own loops: its whole ones, S0 S1 S2 (each one a spatial axis), then the R0 loops
        own = sch.get_loops(sch.get_block(tiled))[-len(sch.state.stage(tiled).leaves):]
        first_reduction_level = own[len(outer) + levels * len(spatial_tiles)
                                    + len(sch.state.stage(tiled).op.reduce_axis) - 1]
        first = None
        for index in range(inputs):
            cached = sch.cache_read(sch.get_block(tiled), index, "shared")
            first = first or cached.name
            sch.compute_at(cached, first_reduction_level)
            sch.annotate(cached, "meta_schedule.cooperative_fetch", self.fetch_lanes)
        return first, first_reduction_level


@dataclass
class GpuAutoBind(SketchRule):
    """A block at the root: its spatial loops fused and split over blocks and threads; a
    reduction short of spatial parallelism also as a cross-thread reduction (its reduction
    loops fused and split over a row of threads, combined by warp shuffles)."""

    name: str = "auto_bind"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        at_root = not stage.attach and block not in draft.tiled and (
            stage.is_output or _host_kernel(draft, block) is None)
        return Condition.APPLY_AND_SKIP_REST if at_root and not _ends_epilogue(draft, block) else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        stage = draft.stage(block)
        results = [(self._threads_over_space(draft, block), draft.index(block) - 1)]
        if stage.op.reduce_axis and _short_of_rows(draft, block):
            results.append((threads_over_reduction(draft, block), draft.index(block) - 1))
        return results

    def _threads_over_space(self, draft: Draft, block: str) -> Draft:
        """Blocks over the rows that a reduction it reads is computed for (a softmax's), the
        threads of a block over the rest, so that the reduction, computed at the block, covers
        one row; without such a reduction, blocks and threads over all the loops fused. A
        scalar (a quantization's scale) is one thread's."""
        sch = draft.sch.copy()
        b = sch.get_block(block)
        spatial = len(draft.stage(block).op.axis)
        if not spatial:
            return draft.derive(sch, f"auto_bind({block})")
        loops = sch.get_loops(b)[:spatial]
        rows = _reduced_rows(draft, block)
        threads = _uniform(sch, THREAD_COUNTS)
        if 0 < rows < spatial:
            sch.bind(sch.fuse(*loops[:rows]) if rows > 1 else loops[0], "blockIdx.x")
            rest = sch.fuse(*loops[rows:]) if spatial - rows > 1 else loops[rows]
            sch.bind(sch.split(rest, [None, threads])[1], "threadIdx.x")
        else:
            outer, inner = sch.split(sch.fuse(*loops) if len(loops) > 1 else loops[0], [None, threads])
            sch.bind(outer, "blockIdx.x")
            sch.bind(inner, "threadIdx.x")
        return draft.derive(sch, f"auto_bind({block})")


@dataclass
class GpuComputeAtBlock(SketchRule):
    """A block that cannot be inlined (a softmax's row maximum): computed at the block
    loop of its consumer, by each of the block's threads or across them; where the
    consumer's threads need rows of their own (a global pool's sums), at its thread loop."""

    name: str = "compute_at_block"

    def condition(self, draft: Draft, block: str) -> Condition:
        stage = draft.stage(block)
        wanted = (not stage.attach and not stage.is_output and _host_kernel(draft, block) is not None
                  and block not in draft.tiled)
        return Condition.APPLY_AND_SKIP_REST if wanted else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        results = []
        consumer = _host_kernel(draft, block)
        # rows bound to threads as well as blocks (a global pool's channels): each thread
        # computes its own row, where at the block loop each would compute the block's rows
        per_thread = _reduced_rows(draft, consumer) >= len(draft.stage(consumer).op.axis)
        axis = "threadIdx.x" if per_thread else "blockIdx.x"
        for across_threads in (False, True) if draft.stage(block).op.reduce_axis and not per_thread else (False,):
            sch = draft.sch.copy()
            loops = [l for l in sch.get_loops(sch.get_block(consumer))
                     if sch.state.stage(consumer).loop(l.id).annotation == axis]
            sch.compute_at(sch.get_block(block), loops[0])
            label = "compute_at_thread" if per_thread else "compute_at_block"
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


def threads_over_reduction(draft: Draft, block: str, epilogue: str | None = None) -> Draft:
    """A reduction short of spatial parallelism: its rows over blocks, its reduction loops
    fused and split over a row of threads, combined by warp shuffles. With an element-wise
    ``epilogue`` (a matrix-vector product's bias), the epilogue's rows go to blocks and the
    reduction is computed at that loop, its result in every thread, as a softmax's sums are."""
    sch = draft.sch.copy()
    spatial = len(draft.stage(block).op.axis)
    if epilogue is not None:
        outputs = sch.get_loops(sch.get_block(epilogue))
        rows = sch.fuse(*outputs) if len(outputs) > 1 else outputs[0]
        sch.compute_at(sch.get_block(block), rows)
        loops = sch.get_loops(sch.get_block(block))[1:]  # the reduction's own, inside the row
    else:
        loops = sch.get_loops(sch.get_block(block))
        rows = (sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]) if spatial else None  # a scalar: one block
    reduction = sch.fuse(*loops[spatial:]) if len(loops) - spatial > 1 else loops[spatial]
    threads = _uniform(sch, THREAD_COUNTS)
    _, lanes = sch.split(reduction, [None, threads])
    if rows is not None:
        sch.bind(rows, "blockIdx.x")
    sch.bind(lanes, "threadIdx.x")
    return draft.derive(sch, f"cross_thread({block})")


def _pays_to_split(draft: Draft, block: str) -> bool:
    """Whether ``block`` gets a split-K sketch: a sum whose outputs are too few to fill the SMs
    with large tiles, and whose reduction is long enough for two parts of ``MIN_PART`` products."""
    op = draft.stage(block).op
    return (getattr(op.body, "combiner", None) == "sum"
            and math.prod(iv.extent for iv in op.axis) < draft.num_cores * SPLIT_K_OUTPUTS_PER_SM
            and math.prod(iv.extent for iv in op.reduce_axis) >= 2 * MIN_PART)


def _adds_atomically(draft: Draft, block: str, epilogue: str | None) -> bool:
    """Whether split-K's parts of ``block`` can be added into the kernel's output atomically:
    a sum of a type GPU atomics add, into the output, or into an epilogue that only adds to it
    (a bias, a residual, which the first part adds) over the whole sum, read by nothing else
    in the kernel."""
    stage = draft.stage(block)
    end = draft.stage(epilogue) if epilogue is not None else stage
    whole = epilogue is None or not _crops(draft, block, epilogue) and adds_to_sum(end.op.body, stage) is not None
    return stage.op.dtype in ATOMIC_DTYPES and end.is_output and not draft.sch.state.consumers_of(end.name) and whole


def _short_of_rows(draft: Draft, block: str) -> bool:
    """Whether a reduction has too few outputs to give every SM 128 threads."""
    return math.prod(iv.extent for iv in draft.stage(block).op.axis) < draft.num_cores * 32 * 4


def _reduced_rows(draft: Draft, block: str) -> int:
    """The most leading axes that a reduction read by ``block`` (through element-wise stages)
    has: the rows of a softmax or a layer norm, each reduced once per row."""
    rows, pending = 0, list(draft.sch.state.producers_of(draft.stage(block)))
    while pending:
        stage = pending.pop()
        if stage.op.reduce_axis and not needs_multi_level_tiling(stage.op):
            rows = max(rows, len(stage.op.axis))
        elif not stage.op.reduce_axis:
            pending += draft.sch.state.producers_of(stage)
    return rows


def _ends_epilogue(draft: Draft, block: str) -> bool:
    """Whether ``block`` is the last stage of a chain of element-wise stages, each the only
    reader of the one before, that starts at a block to be tiled: then the tiling folds it in.
    A stage of the chain may crop the one before (a product padded to whole tiles)."""
    stage = draft.stage(block)
    while not stage.op.reduce_axis:
        producers = draft.sch.state.producers_of(stage)
        if len(producers) != 1 or len(draft.sch.state.consumers_of(producers[0].name)) != 1 \
                or not is_elementwise_reader(stage.op, producers[0].tensor, crops=True):
            return False
        stage = producers[0]
        if needs_multi_level_tiling(stage.op) and not stage.attach:
            return True
    return False


# A tile's rows in shared memory an odd number of 16 bytes apart (their stride 16 bytes past a multiple of 64): the
# 8 rows an ``ldmatrix`` (or a wmma store) touches at once lie in different banks, where rows a multiple of 128
# bytes long would put them all in a few.
ROW_PADDING_BYTES = (64, 16)


# The operands tensor cores multiply (wmma: bfloat16 from sm_80 on), and what their float32
# accumulator is stored into (rounded in registers where a 16-bit type)
TENSOR_CORE_OUTPUTS = {"float16": ("float32", "float16"), "bfloat16": ("float32", "bfloat16")}
BFLOAT16_CAPABILITY = (8, 0)


@dataclass
class GpuTensorCoreTiling(SketchRule):
    """A float16 matmul on tensor cores (MetaSchedule's MultiLevelTilingTensorCore, wmma), or a
    bfloat16 one from sm_80 on: C's 16x16 tiles shared out over blocks, warps
    (``threadIdx.y``) and each warp's tiles, the 16-steps of a stage too, all sampled; the
    accumulator a fragment of its warp; A's and
    B's tiles in shared memory, fetched by the block's threads together, their rows padded
    against bank conflicts (``ROW_PADDING_BYTES``), and loaded from there into fragments once
    a 16-step, which a warp's mma share (column major where stored transposed); the init,
    update and copy-out on the warp's tensor cores (``ir/tensor_core.py``). A batched
    product's leading axes go to the blocks. A second sketch double-buffers the shared tiles
    (``software_pipeline``, ``cp.async``). An epilogue that only rounds the sum to float16 or
    bfloat16 is folded into the copy-out; any other element-wise epilogue (a bias, a GELU) reads the block's
    tile, which the warps store into shared memory, after a barrier, each warp's 32 lanes the
    elements of its own tiles. Offered beside the other tilings, which the search weighs it
    against; a block of sizes that are no multiple of 16 has only those. The copy-out is
    split as the accumulator's block is, so the decisions tell the threads, shared tiles and
    fragments as the verifier finds them (``space.py``); the default candidate (one warp a
    block) fits. ``default_schedule`` does not take it until a GPU has measured it."""

    name: str = "gpu_tensor_core"
    max_innermost_factor: int = 2  # a warp's tiles along rows or columns (a 32x32 fragment: 32 registers a lane at
    # most, so that the default candidate fits), and at most twice as many 16-steps a stage
    software_pipeline: bool = True  # also a sketch whose shared tiles are double-buffered

    def condition(self, draft: Draft, block: str) -> Condition:
        epilogue = _epilogue(draft, block)  # a crop shorter than a tile would leave the warps' stores part tiles
        short = epilogue is not None and min(draft.stage(epilogue).tensor.shape[-2:]) < TILE
        operands = _on_tensor_cores(draft.stage(block).op)
        before_bfloat16 = getattr(draft.target, "compute_capability", (9, 0)) < BFLOAT16_CAPABILITY
        return Condition.APPLY if _needs_tiling(draft, block) and operands and not short \
            and not (operands == "bfloat16" and before_bfloat16) else Condition.SKIP

    def apply(self, draft: Draft, block: str) -> list[tuple[Draft, int]]:
        sch = draft.sch.copy()
        c = sch.get_block(block)
        epilogue = _epilogue(draft, block)
        through_shared = epilogue is not None and not (
            is_elementwise_reader(draft.stage(epilogue).op, draft.stage(block).tensor)
            and _casts_to_half(draft.stage(epilogue).op.body))
        if through_shared:  # the epilogue reads C's tile in shared memory, which the copy-out stores
            sch.compute_inline(sch.cache_write(c, 0, "shared"))
        out = sch.cache_write(c, 0, "local")
        if epilogue is not None and not through_shared:
            sch.reverse_compute_inline(sch.get_block(epilogue))  # the copy-out rounds to a 16-bit float
        i, j, k = sch.get_loops(c)[-3:]  # after a batched product's leading axes
        (io, ii), (jo, jj), (steps, ki) = (sch.split(loop, [None, 16]) for loop in (i, j, k))
        most = self.max_innermost_factor
        shares = [sch.sample_perfect_tile(loop, n=3, max_innermost_factor=most) for loop in (io, jo)]  # blocks,
        (bi, wi, ti), (bj, wj, tj) = (sch.split(loop, share) for loop, share in zip((io, jo), shares))  # warps, tiles
        ko, kt = sch.split(steps, sch.sample_perfect_tile(steps, n=2, max_innermost_factor=2 * most))
        sch.reorder(bi, bj, wi, wj, ko, kt, ti, tj, ii, jj, ki)
        sch.annotate(ii, "tensor_core", 1)  # the update, an mma a tile and 16-step; its init, a fill
        if through_shared:  # the epilogue over blocks and warps as C's tiles are; the copy-out in its block
            tile = _on_the_warps(sch, sch.get_block(epilogue), shares)
            sch.compute_at(out, tile)
            rows, columns = sch.get_loops(out)[-2:]
            (owi, oti, oii), (owj, otj, ojj) = (sch.split(loop, [share[1], share[2], 16])
                                                for loop, share in zip((rows, columns), shares))
            op = draft.stage(block).op
            sch.storage_align(out, 0, len(op.axis) - 2, *_row_padding(op.dtype))
            sch.reorder(owi, owj, oti, otj, oii, ojj)
        else:
            *batch, rows, columns = sch.get_loops(out)
            pieces = [sch.split(loop, [None, 16]) for loop in (rows, columns)]  # the copy-out split alike
            (obi, owi, oti), (obj, owj, otj) = (sch.split(p[0], share) for p, share in zip(pieces, shares))
            oii, ojj = pieces[0][1], pieces[1][1]
            sch.reorder(obi, obj, owi, owj, oti, otj, oii, ojj)
            sch.bind(sch.fuse(*batch, obi, obj), "blockIdx.x")
        warp = sch.fuse(owi, owj)
        sch.bind(warp, "threadIdx.y")
        sch.annotate(oii, "tensor_core", 1)  # a store a tile
        sch.compute_at(c, warp)
        first = None
        for index, operand in enumerate(draft.stage(block).op.input_tensors):
            cached = sch.cache_read(c, index, "shared")
            sch.compute_at(cached, ko)
            sch.annotate(cached, "meta_schedule.cooperative_fetch", 4)
            sch.storage_align(cached, 0, len(operand.shape) - 2, *_row_padding(operand.dtype))
            first = first or cached.name
        for index, operand in enumerate(draft.stage(block).op.input_tensors):  # each warp's tiles of A and B,
            loaded = sch.cache_read(c, index, "local")  # loaded once a 16-step into fragments its mma share
            sch.compute_at(loaded, kt)
            rows, columns = sch.get_loops(loaded)[-2:]
            if _summed_along(draft.stage(block).op, operand) == -1:  # A as (i, k), B as (j, k): tiles down the rows
                outer, inner = sch.split(rows, [None, 16])
                sch.annotate(inner, "tensor_core", 1)
            else:  # along the columns
                outer, inner = sch.split(columns, [None, 16])
                sch.reorder(outer, rows, inner)
                sch.annotate(rows, "tensor_core", 1)
        derived = draft.derive(sch, "gpu_tensor_core", tiled=block)
        results = [(derived, derived.index(first) - 1)]
        if self.software_pipeline:
            piped = sch.copy()
            piped.annotate(ko, "software_pipeline", 2)
            results.append((draft.derive(piped, "gpu_tensor_core_pipelined", tiled=block), derived.index(first) - 1))
        return results


def _on_the_warps(sch: Schedule, epilogue, shares):
    """The epilogue's rows and columns shared out over blocks (``blockIdx.x``), warps
    (``threadIdx.y``) and 16x16 tiles as C's are by ``shares`` (three factors each of the
    loops of 16-tiles), each warp's elements over its 32 lanes, a row's neighbours
    neighbouring lanes. Returns its block loop."""
    *batch, rows, columns = sch.get_loops(epilogue)
    pieces = [sch.split(loop, [None, 16]) for loop in (rows, columns)]
    (bi, wi, ti), (bj, wj, tj) = (sch.split(p[0], share) for p, share in zip(pieces, shares))
    sch.reorder(bi, bj, wi, wj, ti, tj, pieces[0][1], pieces[1][1])
    tile = sch.fuse(*batch, bi, bj)
    sch.bind(tile, "blockIdx.x")
    sch.bind(sch.fuse(wi, wj), "threadIdx.y")
    _, lanes = sch.split(sch.fuse(ti, tj, pieces[0][1], pieces[1][1]), [None, WARP])
    sch.bind(lanes, "threadIdx.x")
    return tile


def _summed_along(op, operand) -> int:
    """Which of its last two dimensions ``op`` (a product ``_on_tensor_cores`` takes) sums
    ``operand`` along: -1 or -2."""
    read = next(r for r in reads_of(op) if r.tensor is operand)
    return -1 if read.indices[-1] is op.reduce_axis[0].var else -2


def _along_register_rows(sch: Schedule, op) -> list[str]:
    """Lay out each shared tile of ``op``'s inputs with the dimension its innermost register
    loop steps along last (``transform_layout`` on the cache's write), its rows padded
    (``ROW_PADDING_BYTES``): A's tile of a matmul is read by a thread down its rows (i),
    scalars a row of k apart, and as vectors once i is contiguous; B's already is. The copies
    into it load along k and store a lane at a time, the padding spreading a warp's stores
    over the banks. Returns the tiles' caches that changed."""
    changed = []
    for tensor in op.input_tensors:
        read = next(r for r in reads_of(op) if r.tensor is tensor)
        stepping = [d for iv in op.axis for d, index in enumerate(read.indices) if iv.var in free_vars(index)]
        if not stepping or stepping[-1] == tensor.ndim - 1:
            continue
        order = [d for d in range(tensor.ndim) if d != stepping[-1]] + [stepping[-1]]
        names = tuple(f"d{n}" for n in range(tensor.ndim))
        variables = [Var(name) for name in names]
        cached = sch.get_block(f"{tensor.name}_shared")
        sch.transform_layout(cached, ("write", 0), IndexMap(names, tuple(
            index_expr_to_json(variables[d], dict(zip(variables, names))) for d in order)))
        sch.storage_align(cached, 0, tensor.ndim - 2, *_row_padding(tensor.dtype))
        changed.append(cached.name)
    return changed


def _row_padding(dtype: str) -> tuple[int, int]:
    """``storage_align``'s factor and offset, in elements of ``dtype``, for ``ROW_PADDING_BYTES``."""
    factor, offset = ROW_PADDING_BYTES
    return factor // bytes_of(dtype), offset // bytes_of(dtype)


def _on_tensor_cores(op) -> str | None:
    """The type of A and B where ``op`` is C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]
    (each operand's indices either way: its tiles row or column major) of float16 A and B
    into float32 or float16, or of bfloat16 A and B into float32 or bfloat16 (each operand
    cast or the product), the rows, columns and reduction multiples of 16; a batched product's leading
    axes index both operands alike, or an operand of one matrix by 0 (``batch_matmul``'s
    broadcast). None where it is not."""
    body = op.body
    if len(op.axis) < 2 or len(op.reduce_axis) != 1 or not hasattr(body, "combiner") or body.combiner != "sum" \
            or any(iv.extent % 16 for iv in (*op.axis[-2:], *op.reduce_axis)):
        return None
    product = body.source.value if isinstance(body.source, Cast) else body.source
    if not (isinstance(product, Binary) and product.op == "mul"):
        return None
    reads = [r.value if isinstance(r, Cast) else r for r in (product.a, product.b)]
    *batch, i, j = (iv.var for iv in op.axis)
    k = op.reduce_axis[0].var
    operands = {getattr(r, "tensor", r).dtype for r in reads}
    if len(operands) != 1 or op.dtype not in TENSOR_CORE_OUTPUTS.get(next(iter(operands)), ()) or not all(
            isinstance(r, TensorRead) and len(r.indices) == len(op.axis)
            and all(x is v or isinstance(x, Const) and x.value == 0 for x, v in zip(r.indices, batch)) for r in reads):
        return None
    tails = sorted(str(tuple(r.indices[-2:])) for r in reads)
    on = any(tails == sorted(map(str, (a, b))) for a in ((i, k), (k, i)) for b in ((k, j), (j, k)))
    return next(iter(operands)) if on else None


def _casts_to_half(body) -> bool:
    """Whether ``body`` only rounds a float32 sum (or one of its own type) to a 16-bit float,
    which the copy-out does as it stores: rounding one already rounded to the other type
    would not be its store's single rounding."""
    return isinstance(body, Cast) and body.to in HALVES and isinstance(body.value, TensorRead) \
        and body.value.tensor.dtype in ("float32", body.to)


def _epilogue(draft: Draft, block: str) -> str | None:
    """The output stage whose element-wise chain starts at ``block``, if any (``_ends_epilogue``)."""
    stage = draft.stage(block)
    while len(consumers := draft.sch.state.consumers_of(stage.name)) == 1:
        stage = consumers[0]
    return stage.name if stage.name != block and _ends_epilogue(draft, stage.name) else None


def _crops(draft: Draft, block: str, epilogue: str) -> bool:
    """Whether ``epilogue`` reads a part of ``block``'s output (a product padded to whole tiles)."""
    return draft.stage(epilogue).tensor.shape != draft.stage(block).tensor.shape


def _uniform(sch: Schedule, values: tuple[int, ...]):
    """A sampled choice among ``values``, each as likely."""
    return sch.sample_categorical(list(values), [1 / len(values)] * len(values))


def _host_kernel(draft: Draft, block: str) -> str | None:
    """The block at the root whose loops ``block`` can be computed at: the one that (through
    attached blocks) consumes it, if only one does and it has loops. Else None: ``block`` is a
    kernel of its own (``ir/kernels.py``) before the kernels that read it, several or a scalar's."""
    roots = set()
    for stage in draft.sch.state.consumers_of(block):
        while stage.attach is not None:
            stage = draft.sch.state.stage(stage.attach.stage)
        roots.add(stage.name)
    return roots.pop() if len(roots) == 1 and draft.stage(next(iter(roots))).op.axis else None


GPU_SKETCH_RULES: list[SketchRule] = [GpuInline(), GpuTensorCoreTiling(), GpuMultiLevelTiling(), GpuAutoBind(),
                                      GpuComputeAtBlock(), SkipStage()]


def annotate_gpu(draft: Draft) -> Schedule:
    """A GPU draft's sampled annotations: the unroll step of every block that reduces."""
    sch = draft.sch.copy()
    for stage in list(sch.state.stages):
        if stage.op.reduce_axis and stage.name in draft.tiled:
            step = _uniform(sch, UNROLL_STEPS)
            sch.annotate(sch.get_block(stage.name), "pragma_auto_unroll_max_step", step)
    return sch


# The default candidate's shape: the tiles of the kept H100 matmul logs' fastest schedules at
# 1024³, 2048³ and 4096³ (docs/experiments/gpu-default-tile.md).
# Threads a block of tiles (at most 16 along the innermost spatial axis); a thread's outputs
# along the second innermost and the innermost; the reduction's step through shared memory and
# its part inside a thread's tile; threads a block bound by auto-binding; the unroll step.
DEFAULT_TILE_THREADS, DEFAULT_THREAD_SIDE, DEFAULT_REGISTERS = 128, 16, (16, 4)
DEFAULT_REDUCTION_STEP, DEFAULT_REDUCTION_INNER, DEFAULT_BOUND_THREADS, DEFAULT_UNROLL = 32, 4, 256, 512


def gpu_default_row(sketch: Sketch) -> np.ndarray:
    """The rule-made candidate of a GPU sketch, where tuning starts: the shape of the kept H100
    logs' fastest matmuls (the hand-written 16 x 16 threads of 8 x 8 outputs took 1.17x and
    1.21x their time at 2048³ and 4096³). The innermost spatial axis gets up to 16 threads
    and 4 outputs a thread (a vector of B's row), the axis outside it the rest of 128 threads
    and 16 outputs; the reductions run in steps of up to 32 through shared memory, 4 of each
    step in registers; no virtual threads; auto-unroll 512; 256 threads for a block bound by
    auto-binding. Where the blocks would not fill the SMs, split-K takes the fewest parts
    that fill them (each at least ``MIN_PART`` of the sum), and only then is a thread's larger
    side of outputs halved, until they fill them: smaller tiles read more of shared memory a
    multiply-add (docs/experiments/split-k-whole-tiles.md)."""
    row = np.zeros(len(sketch.slots), dtype=np.int64)
    spatial = [n for n, slot in enumerate(sketch.slots) if slot.role == "tile" and slot.spatial]
    extents = {n: math.prod(sketch.slots[n].domain[0]) for n in spatial}
    threads, registers = {n: 1 for n in spatial}, {n: 1 for n in spatial}
    for n, most in zip(spatial[::-1], DEFAULT_REGISTERS[::-1]):
        side = min(DEFAULT_THREAD_SIDE, DEFAULT_TILE_THREADS // math.prod(threads.values()))
        threads[n] = _largest_divisor(extents[n], side)
        registers[n] = _largest_divisor(extents[n] // threads[n], most)
    reductions = _default_reductions(sketch)
    split = [n for n, tile in reductions.items() if len(sketch.slots[n].domain[0]) == len(tile) + 1]  # parts first

    def blocks() -> int:
        return math.prod(extents[n] // (threads[n] * registers[n]) for n in spatial)

    parts = _default_parts(sketch, reductions, split, blocks())
    while blocks() * parts < sketch.gpu_limits["sm_count"] and max(registers.values(), default=1) > 1:
        n = max(registers, key=registers.get)  # too few blocks: smaller tiles a thread
        registers[n] = _largest_divisor(extents[n] // threads[n], registers[n] // 2)
    for n, slot in enumerate(sketch.slots):
        if slot.role == "tile":
            steps, *inner = reductions.get(n, (0,))  # a reduction's (a spatial tile has none)
            wanted = ((extents[n] // (threads[n] * registers[n]), 1, threads[n], 1, registers[n]) if slot.spatial
                      else (parts, steps // parts, *inner) if n in split else (steps, *inner))
            index = sketch.index_of(n, wanted[:len(slot.domain[0])])
            row[n] = 0 if index is None else index
        elif slot.role == "unroll":
            row[n] = slot.values.index(DEFAULT_UNROLL) if DEFAULT_UNROLL in slot.values else 0
        elif slot.role == "categorical" and DEFAULT_BOUND_THREADS in slot.values:
            row[n] = slot.values.index(DEFAULT_BOUND_THREADS)
    return row


def _default_reductions(sketch: Sketch) -> dict[int, tuple[int, int, int]]:
    """Each reduction tile's default (steps, step / registers' part, registers' part): the
    innermost reductions take their share of the step of ``DEFAULT_REDUCTION_STEP`` first."""
    step, in_registers, tiles = DEFAULT_REDUCTION_STEP, DEFAULT_REDUCTION_INNER, {}
    for n, slot in reversed(list(enumerate(sketch.slots))):
        if slot.role == "tile" and not slot.spatial:
            inner = _largest_divisor(extent := math.prod(slot.domain[0]), step)
            last = _largest_divisor(inner, in_registers)
            step, in_registers = max(step // inner, 1), max(in_registers // last, 1)
            tiles[n] = (extent // inner, inner // last, last)
    return tiles


def _default_parts(sketch: Sketch, reductions: dict, split: list[int], blocks: int) -> int:
    """Split-K's default parts (1 for a sketch without: no ``split`` reduction tile, its parts
    a level outside the rest): the fewest, two at least, that divide the steps of its reduction
    and fill the SMs with ``blocks`` each, else the most that leave each part ``MIN_PART`` of
    the whole sum."""
    whole = math.prod(math.prod(sketch.slots[n].domain[0]) for n in reductions)
    allowed = [d for n in split for d in divisors(reductions[n][0]) if d > 1 and whole // d >= MIN_PART]
    return next((d for d in allowed if blocks * d >= sketch.gpu_limits["sm_count"]), max(allowed, default=1))


def _largest_divisor(extent: int, at_most: int) -> int:
    return max(d for d in divisors(extent) if d <= max(at_most, 1))
