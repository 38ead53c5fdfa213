"""Mutation rules: each changes one decision of a candidate (Ansor's mutation rules).

A rule works on slots of one role; its weight is the probability it is chosen among the
rules that apply to a sketch. ``MUTATION_RULES`` is the list users extend. A rule may be
told which slot to change (``slot=``): a learned mutation policy chooses (rule, slot)
actions itself instead of drawing them by the fixed weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schedule.sampling import divisors
from .space import Sketch


@dataclass
class MutationRule:
    name: str
    role: str  # the slot role it changes
    weight: float

    def slots(self, sketch: Sketch) -> list[int]:
        return [n for n, slot in enumerate(sketch.slots) if slot.role == self.role and len(slot.domain) > 1]

    def mutate(self, sketch: Sketch, row: np.ndarray, rng: np.random.Generator,
               slot: int | None = None) -> np.ndarray | None:
        """A changed copy of ``row`` (in ``slot``, else in a random slot of the rule), or
        None when this rule found nothing to change."""
        slots = self.slots(sketch) if slot is None else [slot]
        if not slots:
            return None
        slot = slots[int(rng.integers(len(slots)))]
        choice = int(rng.integers(len(sketch.slots[slot].domain) - 1))
        out = row.copy()
        out[slot] = choice + (choice >= row[slot])  # any other decision, uniformly
        return out


@dataclass
class MutateTileSize(MutationRule):
    """Move a divisor of one tile factor to another position of the same split."""

    name: str = "tile_size"
    role: str = "tile"
    weight: float = 0.90

    def mutate(self, sketch: Sketch, row: np.ndarray, rng: np.random.Generator,
               slot: int | None = None) -> np.ndarray | None:
        slots = self.slots(sketch) if slot is None else [slot]
        if not slots:
            return None
        for _ in range(8):
            slot = slots[int(rng.integers(len(slots)))]
            factors = list(sketch.slots[slot].domain[row[slot]])
            sources = [p for p, f in enumerate(factors) if f > 1]
            if not sources:
                continue
            source = sources[int(rng.integers(len(sources)))]
            moved = [d for d in divisors(factors[source]) if d > 1]
            step = moved[int(rng.integers(len(moved)))]
            target = int(rng.integers(len(factors) - 1))
            target += target >= source
            factors[source] //= step
            factors[target] *= step
            index = sketch.index_of(slot, tuple(factors))
            if index is not None:  # None: the innermost factor grew past its limit
                out = row.copy()
                out[slot] = index
                return out
        return None


@dataclass
class MutateRegisterTile(MutationRule):
    """Re-draw one block's register tile among the shapes that fill the registers."""

    name: str = "register_tile"
    role: str = "tile"
    weight: float = 0.10

    def slots(self, sketch: Sketch) -> list[int]:
        return [tile.slots[0] for tile in sketch.register_tiles]

    def mutate(self, sketch: Sketch, row: np.ndarray, rng: np.random.Generator,
               slot: int | None = None) -> np.ndarray | None:
        tiles = [t for t in sketch.register_tiles if slot is None or t.slots[0] == slot]
        if not tiles:
            return None
        tile = tiles[int(rng.integers(len(tiles)))]
        out = row.copy()
        out[list(tile.slots)] = tile.draw(rng, 1)[0]
        return out


MUTATION_RULES: list[MutationRule] = [
    MutateTileSize(),
    MutateRegisterTile(),
    MutationRule("auto_unroll", "unroll", 0.04),
    MutationRule("compute_location", "location", 0.05),
    MutationRule("parallel", "parallel", 0.01),
    MutationRule("categorical", "categorical", 0.04),
]


def mutate(sketch: Sketch, row: np.ndarray, rng: np.random.Generator,
           rules: list[MutationRule] | None = None) -> tuple[np.ndarray, str] | None:
    """One mutation by a rule drawn by weight among those that apply; None if none can."""
    rules = [r for r in (MUTATION_RULES if rules is None else rules) if r.slots(sketch)]
    while rules:
        weights = np.array([r.weight for r in rules])
        rule = rules[int(rng.choice(len(rules), p=weights / weights.sum()))]
        child = rule.mutate(sketch, row, rng)
        if child is not None:
            return child, rule.name
        rules.remove(rule)
    return None
