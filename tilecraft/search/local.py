"""Local search: measure the unmeasured neighbours of the best candidates (Droplet-style).

Evolution measures what the cost model ranks highest over a whole population, and the
model is coarsest exactly where it matters at the end of a search: between the best
program and its near variants. On a ResNet-50 7x7 convolution, changing three tile
decisions of the best record of 384 trials ran it 30% faster. So a share of each round
(``SearchParams.local_share``) goes to neighbours of the best measured candidates: rows
that differ in one decision by one step, ranked by the model, the best candidate's first
and the next best's once all of them are measured. A better neighbour becomes the best,
so the rounds walk downhill as coordinate descent does, one measured step at a time.

A step of a tile decision moves one prime factor from one level to another (8x2 -> 4x4),
or takes a tiling within a log2 distance of 2 (a padded 4x2 for a loop of 7 -> 7x1); a
step of any other decision (unroll step, parallel depth, compute location) takes the
adjacent choice of its ordered domain.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..schedule.sampling import divisors
from .evolution import Candidate, Scorer
from .space import Sketch

NEAR_TILING = 2.0
"""Tilings whose log2 factors differ by at most this much in all (L1) are neighbours."""


def neighbours(sketch: Sketch, row: Sequence[int]) -> np.ndarray:
    """Every distinct row one step from ``row`` (module docstring), one per line."""
    row = np.asarray(row, dtype=np.int64)
    found: set[tuple[int, int]] = set()  # (slot, decision index)
    for n, slot in enumerate(sketch.slots):
        if len(slot.domain) < 2:
            continue
        if slot.role != "tile":
            found.update((n, int(i)) for i in (row[n] - 1, row[n] + 1) if 0 <= i < len(slot.domain))
            continue
        logs = sketch.domain_logs(n)
        distance = np.abs(logs - logs[row[n]]).sum(axis=1)
        found.update((n, int(i)) for i in np.flatnonzero((distance > 0) & (distance <= NEAR_TILING)))
        found.update((n, i) for i in _prime_moves(sketch, n, slot.domain[row[n]]))
    rows = np.repeat(row[None, :], len(found), axis=0)
    for line, (n, index) in enumerate(sorted(found)):
        rows[line, n] = index
    return rows


def _prime_moves(sketch: Sketch, slot: int, factors: tuple[int, ...]) -> list[int]:
    """Decision indices of the tilings made by moving one prime factor between two levels."""
    moves = []
    for source, factor in enumerate(factors):
        for prime in (d for d in divisors(factor) if d > 1 and all(d % p for p in range(2, d))):
            for target in range(len(factors)):
                if target != source:
                    moved = list(factors)
                    moved[source] //= prime
                    moved[target] *= prime
                    index = sketch.index_of(slot, tuple(moved))
                    if index is not None:
                        moves.append(index)
    return moves


def local_candidates(sketches: Sequence[Sketch], score: Scorer, best: Sequence[Candidate], measured: set,
                     count: int) -> list[Candidate]:
    """Up to ``count`` unmeasured neighbours of ``best`` (best first), ranked by ``score``
    among the neighbours of each: the best candidate's, then the next one's."""
    if count <= 0:
        return []
    chosen: list[Candidate] = []
    taken = set(measured)
    for start in best:
        if len(chosen) >= count:
            break
        rows = neighbours(sketches[start.sketch], start.row)
        fresh = [r for r in rows if (start.sketch, tuple(int(v) for v in r)) not in taken]
        if not fresh:
            continue
        scores = score(start.sketch, np.array(fresh))
        for position in np.argsort(-scores, kind="stable")[: count - len(chosen)]:
            candidate = Candidate(start.sketch, tuple(int(v) for v in fresh[position]))
            chosen.append(candidate)
            taken.add(candidate.key)
    return chosen
