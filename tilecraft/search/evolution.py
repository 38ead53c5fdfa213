"""Evolutionary search over decision vectors, scored in batch by the cost model.

Ansor's algorithm with its defaults: a population of 2048, of which up to 20% are the
best measured candidates and the rest random; four generations in which parents are
drawn in proportion to their predicted score and mutated with probability 0.85; the
best distinct unmeasured candidates seen in any generation are kept; of the batch to
measure, 5% are random picks (epsilon-greedy) so that the model sees what it does not
predict. Nothing here lowers or compiles a candidate.

Two choices are left to policies: ``sketch_shares`` (from a sketch bandit) split both the
random population and the measurement slots between the sketches, where Ansor splits the
population evenly and fills the slots by score alone; and a ``mutator`` chooses each
mutation, learning from the score each child gets next to its parent's.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .mutation_predictor import FixedMutations
from .space import Sketch


@dataclass(frozen=True)
class SearchParams:
    population: int = 2048
    num_iters: int = 4
    mutation_prob: float = 0.85
    use_measured_ratio: float = 0.2
    eps_greedy: float = 0.05
    # Sketch shares (a bandit's) set each sketch's quota of the measurement slots, as well as its
    # share of the random population; False leaves the slots to the cost model's ranking, as Ansor does;
    # None (SketchPolicy's default): quotas only for a cost model still untrained when the search
    # begins (not taught by transfer, a shared model's other tasks or the task's own resumed log).
    sketch_quotas: bool | None = None
    # A bandit counts a sketch whose best is within this fraction of the task's best as level with it.
    sketch_tie: float = 0.0
    # The bandit's softmax temperature: how much share a lead of a given size buys (search/bandit.py).
    sketch_temperature: float = 0.05
    # The first round starts with every sketch's rule-made default schedule (search/default.py), so
    # tuning never ends below it; False searches from random samples only, as Ansor does.
    defaults_first: bool = True


@dataclass(frozen=True)
class Candidate:
    sketch: int  # index into the task's sketches
    row: tuple[int, ...]  # one decision index per slot

    @property
    def key(self) -> tuple[int, tuple[int, ...]]:
        return (self.sketch, self.row)


Scorer = Callable[[int, np.ndarray], np.ndarray]  # (sketch index, rows) -> predicted scores


def sample_candidates(sketches: Sequence[Sketch], count: int, rng: np.random.Generator, min_parallel: int,
                      sketch_shares: np.ndarray | None = None) -> list[Candidate]:
    """``count`` random candidates, spread over the sketches by ``sketch_shares`` (evenly if None)."""
    weights = np.full(len(sketches), 1 / len(sketches)) if sketch_shares is None else sketch_shares
    per_sketch = rng.multinomial(count, weights / weights.sum())
    found = []
    for index, (sketch, n) in enumerate(zip(sketches, per_sketch)):
        if n:
            found += [Candidate(index, tuple(int(v) for v in row)) for row in sketch.sample(rng, n, min_parallel)]
    return found


def evolutionary_search(sketches: Sequence[Sketch], score: Scorer, count: int, measured: set,
                        best_measured: Sequence[Candidate], rng: np.random.Generator, min_parallel: int,
                        params: SearchParams = SearchParams(), sketch_shares: np.ndarray | None = None,
                        mutator: FixedMutations | None = None) -> list[Candidate]:
    """Up to ``count`` distinct unmeasured candidates to measure next."""
    if count <= 0:
        return []
    mutator = mutator or FixedMutations(sketches)
    n_measured = min(int(params.population * params.use_measured_ratio), len(best_measured))
    population = list(best_measured[:n_measured])
    population += sample_candidates(sketches, params.population - n_measured, rng, min_parallel, sketch_shares)
    n_random = int(round(count * params.eps_greedy))
    best = _BestUnmeasured(len(sketches), 2 * count, measured)
    scores = _score(sketches, score, population)
    for generation in range(params.num_iters + 1):
        best.offer(population, scores)
        if generation == params.num_iters:
            break
        population, lineage = _next_generation(sketches, population, scores, rng, params.mutation_prob, mutator)
        parent_scores = scores
        scores = _score(sketches, score, population)
        _teach(mutator, population, lineage, parent_scores, scores)
    chosen = best.take(count - n_random, sketch_shares if params.sketch_quotas else None)
    taken = measured | {c.key for c in chosen}
    for candidate in sample_candidates(sketches, 3 * max(n_random, 1) + count, rng, min_parallel, sketch_shares):
        if len(chosen) >= count:
            break
        if candidate.key not in taken:
            chosen.append(candidate)
            taken.add(candidate.key)
    return chosen


class _BestUnmeasured:
    """The best-scored distinct unmeasured candidates seen, a min-heap per sketch."""

    def __init__(self, n_sketches: int, limit: int, measured: set):
        self.heaps: list[list[tuple[float, int, Candidate]]] = [[] for _ in range(n_sketches)]
        self.limit, self.measured = limit, measured
        self.seen: set = set()
        self.order = itertools.count()

    def offer(self, population: Sequence[Candidate], scores: np.ndarray) -> None:
        for value, candidate in zip(scores, population):
            if candidate.key in self.measured or candidate.key in self.seen or value == -np.inf:  # -inf: refused
                continue
            heap = self.heaps[candidate.sketch]
            entry = (float(value), next(self.order), candidate)
            if len(heap) < self.limit:
                heapq.heappush(heap, entry)
                self.seen.add(candidate.key)
            elif value > heap[0][0]:
                self.seen.discard(heapq.heapreplace(heap, entry)[2].key)
                self.seen.add(candidate.key)

    def take(self, count: int, shares: np.ndarray | None) -> list[Candidate]:
        """The ``count`` best by score; with ``shares``, first each sketch's quota of its own best."""
        ranked = [sorted(heap, key=lambda e: -e[0]) for heap in self.heaps]
        chosen: list[tuple[float, int, Candidate]] = []
        if shares is not None:
            quotas = np.floor(count * shares / shares.sum()).astype(int)
            for sketch, quota in enumerate(quotas):
                chosen += ranked[sketch][:quota]
                ranked[sketch] = ranked[sketch][quota:]
        rest = sorted((e for entries in ranked for e in entries), key=lambda e: -e[0])
        chosen += rest[: count - len(chosen)]
        return [c for _, _, c in sorted(chosen, key=lambda e: -e[0])]


def rows_by_sketch(candidates: Sequence[Candidate]) -> dict[int, tuple[list[int], np.ndarray]]:
    """Sketch index -> (positions in ``candidates``, their decision rows): what batched
    scoring and features work on."""
    positions: dict[int, list[int]] = {}
    for position, candidate in enumerate(candidates):
        positions.setdefault(candidate.sketch, []).append(position)
    return {sketch: (where, np.array([candidates[p].row for p in where], dtype=np.int64))
            for sketch, where in positions.items()}


def _score(sketches: Sequence[Sketch], score: Scorer, population: list[Candidate]) -> np.ndarray:
    scores = np.empty(len(population))
    for sketch, (positions, rows) in rows_by_sketch(population).items():
        scores[positions] = score(sketch, rows)
    return scores


Lineage = dict[int, list[tuple[int, int, int]]]  # per sketch: (child position, parent position, action)


def _next_generation(sketches: Sequence[Sketch], population: list[Candidate], scores: np.ndarray,
                     rng: np.random.Generator, mutation_prob: float,
                     mutator: FixedMutations) -> tuple[list[Candidate], Lineage]:
    """Children drawn by score and mutated, and the lineage of each mutation."""
    weights = np.clip(np.nan_to_num(scores, nan=0.0, neginf=0.0), 0, None)
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(population), 1 / len(population))
    parents = rng.choice(len(population), size=len(population), p=weights)
    mutating = rng.random(len(population)) < mutation_prob
    children = [population[p] for p in parents]
    by_sketch: dict[int, list[int]] = {}
    for position in np.flatnonzero(mutating):
        by_sketch.setdefault(children[position].sketch, []).append(int(position))
    lineage: Lineage = {}
    for sketch, positions in by_sketch.items():
        rows = [np.array(children[p].row) for p in positions]
        for position, (child, action) in zip(positions, mutator.mutate_many(sketch, rows, rng)):
            if child is not None:
                children[position] = Candidate(sketch, tuple(int(v) for v in child))
            lineage.setdefault(sketch, []).append((position, int(parents[position]), action))
    return children, lineage


def _teach(mutator: FixedMutations, population: list[Candidate], lineage: Lineage,
           parent_scores: np.ndarray, scores: np.ndarray) -> None:
    """Tell the mutator what its mutations gained, in units of the best parent's score."""
    if not mutator.learns:
        return
    scale = np.nanmax(np.abs(parent_scores)) if len(parent_scores) else 0.0
    if not np.isfinite(scale) or scale <= 0:
        return
    for sketch, entries in lineage.items():
        child, parent, action = (np.array(column) for column in zip(*entries))
        gains = np.nan_to_num((scores[child] - parent_scores[parent]) / scale, nan=0.0, posinf=0.0, neginf=0.0)
        mutator.learn(sketch, action, gains)
