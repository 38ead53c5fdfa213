"""Sketch selection as a multi-armed bandit: how much of each round a sketch gets.

Ansor samples its random population uniformly over the sketches and measures whatever
the cost model ranks highest. A task's sketches differ by factors in what they can reach
(for a large matmul the sketch with a cached, fused accumulator holds the best program;
the plain tiling one peaks at half its speed), and a young cost model is a poor judge of
that, so a uniform split spends much of the budget where the best cannot be.

The arms are the sketches. An arm's value is how close its best measured program comes
to the task's best (best cost / the arm's best cost, in (0, 1]; 0 before it has a valid
one), which moves as the task's best moves, so nothing needs to decay. To it adds a UCB1
bonus, ``exploration * sqrt(ln N / n)``, for arms measured rarely (N trials in all, n of
the arm). The shares are a softmax of these scores at ``temperature``, and every arm keeps
at least ``floor / arms`` of each round, so a sketch that only pays off late is still
found. The shares split the random part of each population and, unless the cost model was
taught before the search (transfer, or a resumed log), the measurement slots too
(``SearchParams.sketch_quotas``).
With ``tie``, an arm whose best is within that fraction of the task's best counts as level
with it, since early bests a few percent apart may say only which sketch was lucky first.
Measured, it won one workload and cost two (docs/experiments/bandit-ties-and-temperature.md): off by default.
At ten seeds a workload, this bandit is level with Ansor's split (docs/experiments/sketch-bandit.md).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


class UniformSketches:
    """Ansor's split: every sketch the same share of the population; slots by score alone.
    ``tie`` and ``temperature`` matter only to a policy that compares the sketches."""

    name = "uniform"

    def __init__(self, n_arms: int, tie: float = 0.0, temperature: float = 0.05):
        self.n_arms = n_arms

    def shares(self) -> np.ndarray | None:
        return None

    def update(self, arms: Sequence[int], costs: Sequence[float]) -> None:
        """Uniform shares learn nothing."""


class SketchBandit(UniformSketches):
    """UCB over sketches with a softmax allocation (module docstring)."""

    name = "bandit"

    def __init__(self, n_arms: int, tie: float = 0.0, floor: float = 0.2, exploration: float = 0.2,
                 temperature: float = 0.05):
        super().__init__(n_arms)
        if not 0 <= tie < 1:
            raise ValueError(f"a sketch bandit's tie is a fraction of the best in [0, 1), got {tie}")
        if temperature <= 0:
            raise ValueError(f"a sketch bandit's temperature must be above 0, got {temperature}")
        self.tie, self.floor, self.exploration, self.temperature = tie, floor, exploration, temperature
        self.best = np.full(n_arms, math.inf)
        self.trials = np.zeros(n_arms)

    def values(self) -> np.ndarray:
        """Each arm's best relative to the task's best, in [0, 1]; 1 within ``tie`` of it."""
        best = self.best.min()
        if not math.isfinite(best):
            return np.zeros(self.n_arms)
        return np.minimum(1.0, np.where(np.isfinite(self.best), best / self.best, 0.0) / (1 - self.tie))

    def shares(self) -> np.ndarray:
        if self.n_arms == 1:
            return np.ones(1)
        total = max(self.trials.sum(), 1.0)
        bonus = self.exploration * np.sqrt(math.log(total + 1) / np.maximum(self.trials, 1))
        scores = np.where(self.trials > 0, self.values() + bonus, np.inf)
        if np.isinf(scores).any():  # arms never measured share the greedy part alike
            greedy = np.isinf(scores).astype(float)
        else:
            greedy = np.exp((scores - scores.max()) / self.temperature)
        greedy /= greedy.sum()
        return self.floor / self.n_arms + (1 - self.floor) * greedy

    def update(self, arms: Sequence[int], costs: Sequence[float]) -> None:
        """Fold in measured mean costs (inf for failures) of candidates of ``arms``."""
        for arm, cost in zip(arms, costs):
            self.trials[arm] += 1
            self.best[arm] = min(self.best[arm], cost)


SKETCH_POLICIES = {"uniform": UniformSketches, "bandit": SketchBandit}
