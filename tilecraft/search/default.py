"""A sound schedule without tuning, for a subgraph that no tuning log covers.

It is a candidate of the DAG's own sketches whose decisions come from rules instead of
search: the register tile that a cycle model of its reduction step rates fastest for
the least padding (a small one where no operand is broadcast across it), the
innermost reduction loop as long as the tile limit allows, every middle tile level 1 so
the outer loops carry the rest (and the parallelism), but where the weights outweigh the
rows, the rows one level in, so a tile of the weights stays in cache while they pass and
each core reads its share of the weights once; auto-unroll 512, and every free
block computed at the root, but a padding that its consumer reads only within a reduction
window (a depthwise convolution's), which is inlined. Among sketches alike in their tiles,
the one that reduces the most rows in vector lanes (``rfactor_inner`` along a contiguous
axis) is chosen: a layer norm's two row sums 3x faster, a softmax's 18%. On a GPU, the one
that reduces the most rows of at least a warp's length across threads (of products, only a
matrix-vector product's).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..errors import ScheduleError
from ..schedule.sampling import divisors
from ..schedule.schedule import INLINE, ROOT, Schedule
from ..target import Target
from ..te.dag import ComputeDAG
from .access import needs_multi_level_tiling, reduces_contiguously
from .gpu_rules import gpu_default_row
from .space import Sketch, generate_sketches

JOBS_PER_CORE = 16  # Ansor: fuse outer loops until there are this many iterations per core
UNROLL_STEP = 512  # unrolls a whole register tile (its vector loop counts every lane)
WARP = 32  # a GPU reduction across threads pays from rows this long


def default_schedule(dag: ComputeDAG, target: Target) -> Schedule:
    """``default_choice``'s schedule."""
    return default_choice(dag, target)[0]


def default_choice(dag: ComputeDAG, target: Target) -> tuple[Schedule, str]:
    """The default schedule and its sketch's name: the rule-made candidate of the best sketch
    that replays: the most register tiles, then tiles that accumulate in a local buffer
    inside their consumer's tile, then the most rows reduced in vector lanes, then the
    deepest fusion into the consumer (the smaller tile, consumed while in cache: inception's
    3x3 convolution 128→192 at 28x28 ran 1.64 ms fused at the first level, 1.21 at the
    second; over GoogLeNet's and ResNet-50's layers the second level was 8% and 1% faster in
    all). On a GPU, the most rows of a warp's length or more reduced across threads: in the
    kept H100 logs the best such candidate of a softmax, a layer norm and a matrix-vector
    product ran 9.8x, 4.4x and 4.9x faster than the best that reduces each row in one thread
    (docs/experiments/gpu-default-sketch.md)."""
    ranked, errors = [], []
    ops = {tensor.op.name: tensor.op for tensor in dag.compute_ops}
    for n, sketch in enumerate(generate_sketches(dag, target=target)):
        try:
            sch = sketch.trace_of(default_row(sketch, JOBS_PER_CORE * getattr(target, "num_cores", 1))).replay(dag)
        except ScheduleError as error:
            errors.append(f"{sketch.name}: {error}")
            continue
        local = all(sch.state.stage(tile.block).attach is not None for tile in sketch.register_tiles)
        fused = max((int(level) for level in re.findall(r"fuse(\d)", sketch.name)), default=0)
        ranked.append(((-len(sketch.register_tiles), not local, -_vector_reductions(ops, sketch),
                        -_reductions_across_threads(ops, sketch), -fused, n), (sch, sketch.name)))
    if not ranked:
        raise ScheduleError("no sketch gave a default schedule: " + "; ".join(errors))
    return min(ranked, key=lambda entry: entry[0])[1]


def _vector_reductions(ops: dict, sketch: Sketch) -> int:
    """How many blocks the sketch reduces in vector lanes (``rfactor_inner``) along the axis
    their reads are contiguous in (``ops``: the DAG's compute ops by name)."""
    return sum(reduces_contiguously(ops[name]) for name in re.findall(r"rfactor_inner\(([^)]+)\)", sketch.name))


def _reductions_across_threads(ops: dict, sketch: Sketch) -> int:
    """How many blocks a GPU sketch reduces across a row of threads (``cross_thread``) whose
    rows are a warp long or longer (shorter, lanes would idle and the shuffles cost more than
    the loads they share out); of products, which tiling would otherwise take, only those
    whose outputs are one row (a matrix-vector product), the only kind the logs measured."""
    names = re.findall(r"cross_thread(?:_at_block)?\(([^)]+)\)", sketch.name)
    return sum(math.prod(iv.extent for iv in ops[name].reduce_axis) >= WARP
               and (not needs_multi_level_tiling(ops[name]) or sum(iv.extent > 1 for iv in ops[name].axis) <= 1)
               for name in names)


def default_row(sketch: Sketch, min_parallel: int) -> np.ndarray:
    if sketch.gpu_limits:
        return gpu_default_row(sketch)
    inner, rows_inside = {}, set()
    for tile in sketch.register_tiles:
        shape = _best_shape(sketch, tile) if tile.broadcast else _small_shape(sketch, tile)
        inner.update(zip(tile.slots, shape))
        extents = _tile_extents(sketch, tile)
        unpadded = all(extent % last == 0 for extent, last in zip(extents[1:], shape[1:]))
        if tile.weights_outweigh and unpadded:
            rows_inside.update(tile.slots[1:])  # the weights' tile stays in cache while the rows pass
    row = np.zeros(len(sketch.slots), dtype=np.int64)
    for n, slot in enumerate(sketch.slots):
        if slot.role == "tile":
            extent, parts = math.prod(slot.domain[0]), len(slot.domain[0])
            wanted = [inner.get(n, 1)] if slot.spatial else sorted(divisors(extent), reverse=True)
            level = 1 if n in rows_inside else 0
            row[n] = next(index for index in (sketch.index_of(n, _outer_at(level, -(-extent // last), parts) + (last,))
                                              for last in wanted + [1]) if index is not None)
        elif slot.role == "unroll":
            row[n] = slot.values.index(UNROLL_STEP) if UNROLL_STEP in slot.values else len(slot.values) - 1
        elif slot.role == "location":
            row[n] = slot.domain.index(INLINE if slot.inline_first else ROOT)
    return sketch.fix_parallel(row[None], min_parallel)[0]


def _tile_extents(sketch: Sketch, tile) -> list[int]:
    """The extents of the loops a register tile splits, the vectorized one first."""
    return [math.prod(sketch.slots[n].domain[0]) for n in tile.slots]


def _outer_at(level: int, outer: int, parts: int) -> tuple[int, ...]:
    """The tile factors but the innermost: ``outer`` at ``level`` (or the last there is), 1 at the others."""
    return tuple(outer if n == min(level, parts - 2) else 1 for n in range(parts - 1))


def _small_shape(sketch: Sketch, tile) -> tuple[int, ...]:
    """A tile of no operand broadcast (a depthwise convolution): accumulators save no loads,
    and a padded tile costs bounds checks, so two vectors by two pixels of the innermost
    spatial loop, where each divides its loop (else one). Measured on MobileNetV2's
    depthwise layers in the model: 1.13 ms for the ten against 2.02 with the 2x3-pixel
    tile of the FMA-rate rule (which pads 56, 28, 14 and 7 to a multiple of 3)."""
    extents = _tile_extents(sketch, tile)
    width = 2 * tile.lanes if extents[0] % (2 * tile.lanes) == 0 else tile.lanes
    inner = [1] * (len(extents) - 2) + [2 if extents[-1] % 2 == 0 else 1]
    return (width, *inner) if len(extents) > 1 else (width,)


def _best_shape(sketch: Sketch, tile) -> tuple[int, ...]:
    """The register tile that does the most useful FMAs per cycle (``RegisterTile.fma_rate``
    discounted by the padding it needs; rates within 1% are alike, the model is no finer),
    then, where the weights outweigh the rows, one that needs no padding (only such a tile
    keeps the rows inside a weight tile: a 1024³ matmul on AVX-512 ran 185 GFLOPS with 6x4
    vectors padded, 358 with 4x4 and the rows inside), then the most rows that read the same
    vectors (a matmul's rows, an NCHW convolution's output channels; not the rows that load
    vectors of their own): each vector loaded then serves more FMAs (on Zen 4, 2 vectors x 8
    rows ran 1.23-1.29x faster than 4 x 4 on matmuls and dense layers, 8 channels x 2 rows
    1.6-1.9x faster than 4 x 4 on NCHW convolutions; docs/experiments/register-tile-rows.md),
    then the one with the fewest loads per FMA; a width that divides its loop first, since a
    padded last tile reads packed weights by gathering."""
    extents = _tile_extents(sketch, tile)
    sharing = [not own for own in tile.indexes_vectors] or [True] * (len(extents) - 1)  # rows reading the same vectors

    def value(shape):
        vectors, rows = shape[0] // tile.lanes, math.prod(shape[1:])
        padding = math.prod(-(-e // f) * f / e for e, f in zip(extents, shape))
        return (extents[0] % shape[0] == 0, round(tile.fma_rate(shape) / padding, 2),
                tile.weights_outweigh and padding == 1, math.prod(f for f, s in zip(shape[1:], sharing) if s),
                -tile.step_loads(shape) / (rows * vectors))

    return max((tuple(int(v) for v in shape) for shape in tile.shapes), key=value)
