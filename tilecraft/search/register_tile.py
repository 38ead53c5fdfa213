"""Register tiles: the innermost spatial tile of a block that accumulates a reduction.

In the SSRSRS structure the innermost spatial tile (``i3 x j3`` of a matmul) is updated
at every step of the reduction loop just outside it, so its accumulators stay in vector
registers when the tile fits the register file: rows x vectors accumulators, plus one
weight vector per column and one broadcast (the rule BLIS sizes its micro-kernels by).
Such a tile is what makes a matmul reach vendor speed (6 x 16 on AVX2: 180 GFLOPS against
120-160 for the tiles the uniform sampler found in 1,000 trials), and it is rare among
uniform tilings (a 6-row tile of 1,024 rows is about 1 in 100). So a share of every
random population, and the ``register_tile`` mutation, draw register tiles among the
shapes that fill between half and all of the register file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..te.dtype import computes_in
from .access import broadcasts, row_kinds, vector_read_step, weights_outweigh_rows

REGISTER_TILE_SHARE = 0.5
"""Of random candidates, the share whose register tiles are drawn to fit the registers."""

MAX_VECTORS = 4
"""The widest register tile, in vectors along the vectorized axis."""

FMA_PIPES = 2
"""Vector FMAs a core starts per cycle (x86 since Haswell and Zen)."""
LOADS_PER_CYCLE = 1.9
L2_VECTORS_PER_CYCLE = 0.5
MIN_STEP_CYCLES = 6.0
"""Fitted to tiles timed on the AVX2 development machine, the rest of the default schedule
fixed. ResNet-50's 7x7 3x3 convolution (ms): 7x2 vectors 1.33, 2x3x2 padded to 8x9 1.78,
4x2 padded to 8 2.12, 2x2x2 padded to 8x8 2.45; a 14x14 one: 7x2 vectors 1.48, 2x3x2 1.37.
So per FMA done, a tile of 8 accumulators runs at 0.65 of one of 12, and one whose weights
are memory operands (7x2, 15 loads a step) at 0.86-0.91. BERT's dense layers (128 rows):
3x4 vectors ran 1.27-1.31x slower than 6x2, both 12 accumulators."""


@dataclass(frozen=True)
class RegisterTile:
    """The tile slots of one block whose innermost factors form its register tile."""

    block: str
    lanes: int
    registers: int  # the target's vector registers
    slots: tuple[int, ...]  # the block's spatial tile slots, the vectorized one first
    shapes: np.ndarray  # every register-filling tile: innermost factor per slot, one row each
    by_inner: tuple[dict[int, np.ndarray], ...]  # per slot: innermost factor -> its decisions
    broadcast: bool = True  # an operand misses the vectorized axis (see ``broadcasts``)
    weights_outweigh: bool = False  # the operands along the vectorized axis are the larger (``weights_outweigh_rows``)
    # per slot after the vectorized one: its axis indexes a broadcast operand (one load feeds
    # a row) / a vector operand (each row of it loads its own vectors: an NCHW convolution's
    # output rows read other input rows, where its output channels reuse them)
    indexes_broadcast: tuple[bool, ...] = ()
    indexes_vectors: tuple[bool, ...] = ()
    shuffled: bool = False  # the vector operand is read every other element: two loads and a shuffle a vector

    def fma_rate(self, shape) -> float:
        """The share of the FMA units' peak that a reduction step of this tile can keep busy
        (``step_cycles``)."""
        vectors, rows = shape[0] // self.lanes, int(np.prod(shape[1:]))
        return rows * vectors / FMA_PIPES / step_cycles(rows, vectors, self.registers, *self._row_kinds(shape),
                                                        self.shuffled)

    def step_loads(self, shape) -> int:
        """Loads of one reduction step of tile ``shape`` (``step_loads``)."""
        return step_loads(int(np.prod(shape[1:])), shape[0] // self.lanes, self.registers, *self._row_kinds(shape),
                          self.shuffled)

    def _row_kinds(self, shape) -> tuple[int | None, int]:
        """The rows that load a broadcast each (None: all of them), and those that load
        vectors of their own."""
        if not self.indexes_broadcast:
            return None, 1
        broadcasts = int(np.prod([f for f, b in zip(shape[1:], self.indexes_broadcast) if b]))
        return broadcasts, int(np.prod([f for f, v in zip(shape[1:], self.indexes_vectors) if v]))

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` random register-filling tiles: a decision index per slot, one row each."""
        shapes = self.shapes[rng.integers(len(self.shapes), size=count)]
        out = np.empty_like(shapes)
        for column, table in enumerate(self.by_inner):
            for value in np.unique(shapes[:, column]):
                where = shapes[:, column] == value
                out[where, column] = rng.choice(table[int(value)], size=int(where.sum()))
        return out


def step_cycles(rows: int, vectors: int, registers: int, broadcasts: int | None = None,
                vector_rows: int = 1, shuffled: bool = False) -> float:
    """Cycles of one reduction step of a ``rows`` x ``vectors`` tile: its FMAs over the FMA
    units (with a shuffle for each distinct vector when ``shuffled``, on a port that also
    takes FMAs), its loads over the load ports (``step_loads``), its weight vectors over what
    L2 streams (a tile's packed weights over the whole reduction outgrow L1), or
    ``MIN_STEP_CYCLES``, whichever is longest."""
    shuffles = vectors * vector_rows if shuffled else 0
    return max((rows * vectors + shuffles) / FMA_PIPES,
               step_loads(rows, vectors, registers, broadcasts, vector_rows, shuffled) / LOADS_PER_CYCLE,
               vectors / L2_VECTORS_PER_CYCLE, MIN_STEP_CYCLES)


def step_loads(rows: int, vectors: int, registers: int, broadcasts: int | None = None, vector_rows: int = 1,
               shuffled: bool = False) -> int:
    """Loads of one reduction step: ``broadcasts`` (one a row unless said), and each of the
    ``vectors x vector_rows`` distinct vectors (the rows along which the vector operand
    changes; 1 for a matmul's B) once while it fits a register beside the accumulators and
    the broadcast, else once per row that reuses it (an FMA's memory operand); a shuffled
    vector (every other element) takes two loads, and stays in a register once made."""
    distinct, broadcasts = vectors * vector_rows, rows if broadcasts is None else broadcasts
    if shuffled:
        return broadcasts + 2 * distinct
    held = min(distinct, max(registers - rows * vectors - 1, 0))
    return broadcasts + held + (distinct - held) * (rows // vector_rows)


def _beside_weights(registers: int, vectors: int) -> int:
    """Accumulators that fit beside one weight vector per column, a broadcast and a
    spare (the rule BLIS sizes its micro-kernels by)."""
    return registers - 2 - vectors


def _filling_shapes(by_inner: list[dict], lanes: int, registers: int) -> np.ndarray:
    """Innermost factors (vectorized slot first) whose accumulators fill at least half of
    the registers left beside one weight vector per column, a broadcast and a spare, and
    at most all registers but the broadcast and the spare (or any that fit, when the loops
    are too short for that). Beyond the BLIS rule, FMAs read the weights from memory: a
    7 x 2-vector tile (14 accumulators on AVX2) ran a 7x7 convolution 1.3x faster than
    the 2 x 3 tile the rule allows, which pads 7 to 8 and 9. Widths are a power of two
    vectors, so packed weight rows stay whole or halved cache lines (3 vectors, 96 bytes,
    made every other load straddle two lines: 5x slower)."""
    shapes, fill = [], []
    most = registers - 2
    for width in sorted(by_inner[0]):
        vectors = width // lanes
        if width % lanes or vectors > MAX_VECTORS or vectors & (vectors - 1):
            continue
        free = _beside_weights(registers, vectors)
        partial = [((width,), 1)]
        for table in by_inner[1:]:
            partial = [(shape + (v,), rows * v) for shape, rows in partial for v in sorted(table)
                       if rows * v * vectors <= most]
        shapes += [shape for shape, _ in partial]
        fill += [2 * rows * vectors / free for _, rows in partial]
    fill = np.array(fill)
    keep = fill >= 1 if (fill >= 1).any() else fill > 0
    return np.array(shapes, dtype=np.int64)[keep].reshape(int(keep.sum()), len(by_inner))


def find_register_tiles(sketch, ops: dict, target) -> tuple[RegisterTile, ...]:
    """The register tiles of ``sketch``: one per block with tiled reduction loops whose
    innermost loop is the innermost factor of one of its spatial tiles (``ops``: the DAG's
    compute ops by name)."""
    tiles = []
    for block, form in sketch.vector_loops.items():
        slots = [n for n, s in enumerate(sketch.slots) if s.role == "tile" and s.name.split(".")[0] == block]
        if len(form.coef) != 1 or not any(not sketch.slots[n].spatial for n in slots):
            continue
        vector_slot, position = sketch.factor_columns[form.coef[0][0]]
        if position != len(sketch.slots[vector_slot].domain[0]) - 1:
            continue
        spatial = [vector_slot] + [n for n in slots if sketch.slots[n].spatial and n != vector_slot]
        by_inner = []
        for n in spatial:
            table: dict[int, list[int]] = {}
            for index, factors in enumerate(sketch.slots[n].domain):
                table.setdefault(factors[-1], []).append(index)
            by_inner.append({v: np.array(i) for v, i in table.items()})
        op = ops.get(block)
        lanes = target.vector_lanes(computes_in(op.dtype) if op is not None else "float32",  # as the code takes
                                    math.prod(sketch.slots[vector_slot].domain[0]))  # them (16-bit: float32's)
        shapes = _filling_shapes(by_inner, lanes, target.vector_registers)
        axis = sketch.slots[vector_slot].name.split(".", 1)[1]
        broadcast = op is None or broadcasts(op, axis)
        outweigh = op is not None and weights_outweigh_rows(op, axis, target.l2_bytes)
        kinds = ([], []) if op is None else row_kinds(op, axis, [sketch.slots[n].name.split(".", 1)[1]
                                                                  for n in spatial[1:]])
        shuffled = op is not None and vector_read_step(op, axis) == 2
        if len(shapes):
            tiles.append(RegisterTile(block, lanes, target.vector_registers, tuple(spatial), shapes, tuple(by_inner),
                                      broadcast, outweigh, tuple(kinds[0]), tuple(kinds[1]), shuffled))
    return tuple(tiles)


def apply_register_tiles(sketch, rows: np.ndarray, rng: np.random.Generator, share: float = REGISTER_TILE_SHARE):
    """``rows`` with a ``share`` of them given register-filling tiles, in place."""
    for tile in sketch.register_tiles:
        chosen = np.flatnonzero(rng.random(len(rows)) < share)
        rows[np.ix_(chosen, tile.slots)] = tile.draw(rng, len(chosen))
    return rows
