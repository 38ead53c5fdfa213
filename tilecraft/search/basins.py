"""Basins: candidates grouped by sketch and register-tile shape, for exploration.

A search that finds a fast register tile early tends to stay with it: its cost model is
trained mostly on programs of that shape and rates the others by what little it saw of
them. On batch_matmul (AMD EPYC) one "both" seed measured 148 of its first 640 programs
with 2 vectors x 14 rows and ended at 212 GFLOPS, where tiles of 8 to 16 accumulators
reach 229; its model scored the record's fastest programs 0.6-0.7 against 0.97 for its
own best. Measuring as below kept every seed out of that basin (227.1 GFLOPS, 226.6-227.8).
Ansor's epsilon-greedy picks are uniform random programs, which almost never have good
decisions around an unfamiliar tile. Exploring basins instead measures, in those slots,
the model's best-scored program of the tile shapes measured least: the rest of its
decisions are the model's best guess, so one measurement says whether the shape is
competitive.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from .space import Sketch

Basin = tuple  # (sketch index, innermost factor of each register-tile slot)


class Basins:
    """Which basin a candidate lies in, and the best-scored unmeasured candidate of each."""

    def __init__(self, sketches: Sequence[Sketch]):
        self.inner = [[(n, np.array([decision[-1] for decision in sketch.slots[n].domain]))
                       for tile in sketch.register_tiles for n in tile.slots] for sketch in sketches]
        self.best: dict[Basin, tuple[float, object]] = {}

    def of(self, sketch: int, row: Sequence[int]) -> Basin:
        return (sketch, *(int(inner[row[n]]) for n, inner in self.inner[sketch]))

    def offer(self, candidates: Iterable, scores: Iterable[float], measured: set) -> None:
        for candidate, score in zip(candidates, scores):
            if candidate.key in measured or not np.isfinite(score):
                continue
            basin = self.of(candidate.sketch, candidate.row)
            if basin not in self.best or score > self.best[basin][0]:
                self.best[basin] = (float(score), candidate)

    def least_measured(self, count: int, taken: set) -> list:
        """Up to ``count`` candidates not in ``taken`` (keys measured or chosen already), one
        per basin: the best-scored of the basins with the fewest candidates in ``taken``,
        the best-scored basin first among those alike."""
        counts = Counter(self.of(sketch, row) for sketch, row in taken)
        ranked = sorted(((counts[basin], -score, candidate) for basin, (score, candidate) in self.best.items()
                         if candidate.key not in taken), key=lambda entry: entry[:2])
        return [candidate for _, _, candidate in ranked[:count]]
