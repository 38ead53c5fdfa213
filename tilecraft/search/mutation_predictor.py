"""Mutation policies: which rule changes which slot of a parent.

Ansor draws a rule by fixed weights (tile size 0.90, auto-unroll 0.04, compute location
0.05, parallel 0.01) and then a slot uniformly (``FixedMutations``). Which changes pay off
depends on the task, though: for a large matmul, moving factors of the reduction split
rarely helps, while re-drawing the register tile often does. ``LearnedMutations`` learns
it online, for free: every generation of the evolutionary search scores each child with
the cost model next to its parent, so each mutation comes with an observed, predicted
gain (thousands per round). Per sketch and action (rule, slot) it keeps a decayed mean of
the positive gain and draws actions in proportion to it, shrunk towards the mean of all
actions while an action is rarely tried and mixed with the fixed weights (exploration).
It uses the fixed weights alone until it has seen ``min_observations`` mutations.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .mutation import MUTATION_RULES, MutationRule, mutate
from .space import Sketch

Action = int  # index into a sketch's actions; -1 for a mutation the fixed policy drew


class FixedMutations:
    """Ansor's policy: a rule drawn by its fixed weight among those that apply, then a slot."""

    name = "fixed"
    learns = False  # the search need not work out what its mutations gained

    def __init__(self, sketches: Sequence[Sketch], rules: Sequence[MutationRule] | None = None):
        self.sketches = sketches
        self.rules = list(MUTATION_RULES if rules is None else rules)

    def mutate_many(self, sketch_index: int, rows: Sequence[np.ndarray],
                    rng: np.random.Generator) -> list[tuple[np.ndarray | None, Action]]:
        """One child per row (None where nothing could change) and the action that made it."""
        sketch = self.sketches[sketch_index]
        out = []
        for row in rows:
            child = mutate(sketch, row, rng, self.rules)
            out.append((None if child is None else child[0], -1))
        return out

    def learn(self, sketch_index: int, actions: np.ndarray, gains: np.ndarray) -> None:
        """The fixed policy learns nothing."""


class LearnedMutations(FixedMutations):
    """(rule, slot) actions drawn in proportion to the gains they made (module docstring).

    decay: how much of the statistics survives each generation, so the policy follows a
        cost model that changes from round to round.
    explore: the share of draws that still follow the fixed weights.
    prior_count: mutations' worth of the all-actions mean that an action's own mean is
        shrunk towards.
    """

    name = "learned"
    learns = True

    def __init__(self, sketches: Sequence[Sketch], rules: Sequence[MutationRule] | None = None,
                 decay: float = 0.7, explore: float = 0.2, prior_count: float = 20.0,
                 min_observations: int = 512):
        super().__init__(sketches, rules)
        self.decay, self.explore, self.prior_count = decay, explore, prior_count
        self.min_observations = min_observations
        self.actions: list[list[tuple[MutationRule, int]]] = []
        self.prior: list[np.ndarray] = []
        for sketch in sketches:
            actions = [(rule, slot) for rule in self.rules for slot in rule.slots(sketch)]
            weights = np.array([rule.weight / len(rule.slots(sketch)) for rule, _ in actions])
            self.actions.append(actions)
            self.prior.append(weights / weights.sum() if len(actions) else weights)
        self.count = [np.zeros(len(a)) for a in self.actions]
        self.gain = [np.zeros(len(a)) for a in self.actions]
        self.seen = 0

    def probabilities(self, sketch_index: int) -> np.ndarray:
        """The chance of each action of the sketch at the next draw."""
        prior = self.prior[sketch_index]
        count, gain = self.count[sketch_index], self.gain[sketch_index]
        if self.seen < self.min_observations or count.sum() == 0:
            return prior
        overall = gain.sum() / count.sum()
        value = (gain + self.prior_count * overall) / (count + self.prior_count)
        if value.sum() <= 0:
            return prior
        return (1 - self.explore) * value / value.sum() + self.explore * prior

    def mutate_many(self, sketch_index: int, rows: Sequence[np.ndarray],
                    rng: np.random.Generator) -> list[tuple[np.ndarray | None, Action]]:
        actions = self.actions[sketch_index]
        if not actions:
            return [(None, -1)] * len(rows)
        drawn = rng.choice(len(actions), size=len(rows), p=self.probabilities(sketch_index))
        sketch = self.sketches[sketch_index]
        return [(actions[a][0].mutate(sketch, row, rng, actions[a][1]), int(a)) for row, a in zip(rows, drawn)]

    def learn(self, sketch_index: int, actions: np.ndarray, gains: np.ndarray) -> None:
        """Fold in the normalised gains (child score minus parent score) of the actions."""
        self.count[sketch_index] *= self.decay
        self.gain[sketch_index] *= self.decay
        known = actions >= 0
        np.add.at(self.count[sketch_index], actions[known], 1.0)
        np.add.at(self.gain[sketch_index], actions[known], np.clip(gains[known], 0, None))
        self.seen += int(known.sum())


MUTATION_POLICIES = {"fixed": FixedMutations, "learned": LearnedMutations}
