"""Evolutionary search over decision vectors, scored in batch by the cost model.

Ansor's algorithm with its defaults: a population of 2048, of which up to 20% are the
best measured candidates and the rest random; four generations in which parents are
drawn in proportion to their predicted score and mutated with probability 0.85; the
best distinct unmeasured candidates seen in any generation are kept; of the batch to
measure, 5% are random picks (epsilon-greedy) so that the model sees what it does not
predict. Nothing here lowers or compiles a candidate.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .mutation import mutate
from .space import Sketch


@dataclass(frozen=True)
class SearchParams:
    population: int = 2048
    num_iters: int = 4
    mutation_prob: float = 0.85
    use_measured_ratio: float = 0.2
    eps_greedy: float = 0.05


@dataclass(frozen=True)
class Candidate:
    sketch: int  # index into the task's sketches
    row: tuple[int, ...]  # one decision index per slot

    @property
    def key(self) -> tuple[int, tuple[int, ...]]:
        return (self.sketch, self.row)


Scorer = Callable[[int, np.ndarray], np.ndarray]  # (sketch index, rows) -> predicted scores


def sample_candidates(sketches: Sequence[Sketch], count: int, rng: np.random.Generator, min_parallel: int,
                      sketch_weights: np.ndarray | None = None) -> list[Candidate]:
    """``count`` random candidates, spread over the sketches by ``sketch_weights``."""
    weights = np.full(len(sketches), 1 / len(sketches)) if sketch_weights is None else sketch_weights
    per_sketch = rng.multinomial(count, weights / weights.sum())
    found = []
    for index, (sketch, n) in enumerate(zip(sketches, per_sketch)):
        if n:
            found += [Candidate(index, tuple(int(v) for v in row)) for row in sketch.sample(rng, n, min_parallel)]
    return found


def evolutionary_search(sketches: Sequence[Sketch], score: Scorer, count: int, measured: set,
                        best_measured: Sequence[Candidate], rng: np.random.Generator, min_parallel: int,
                        params: SearchParams = SearchParams(),
                        sketch_weights: np.ndarray | None = None) -> list[Candidate]:
    """Up to ``count`` distinct unmeasured candidates to measure next."""
    n_measured = min(int(params.population * params.use_measured_ratio), len(best_measured))
    population = list(best_measured[:n_measured])
    population += sample_candidates(sketches, params.population - n_measured, rng, min_parallel, sketch_weights)
    n_random = int(round(count * params.eps_greedy))
    best: list[tuple[float, int, Candidate]] = []  # min-heap of the best unmeasured by score
    in_best: set = set()
    order = itertools.count()
    limit = 2 * count
    for generation in range(params.num_iters + 1):
        scores = _score(sketches, score, population)
        for value, candidate in zip(scores, population):
            if candidate.key in measured or candidate.key in in_best:
                continue
            entry = (float(value), next(order), candidate)
            if len(best) < limit:
                heapq.heappush(best, entry)
                in_best.add(candidate.key)
            elif value > best[0][0]:
                in_best.discard(heapq.heapreplace(best, entry)[2].key)
                in_best.add(candidate.key)
        if generation == params.num_iters:
            break
        population = _next_generation(sketches, population, scores, rng, params.mutation_prob)
    chosen = [c for _, _, c in sorted(best, key=lambda e: -e[0])][: count - n_random]
    taken = measured | {c.key for c in chosen}
    for candidate in sample_candidates(sketches, 3 * max(n_random, 1) + count, rng, min_parallel, sketch_weights):
        if len(chosen) >= count:
            break
        if candidate.key not in taken:
            chosen.append(candidate)
            taken.add(candidate.key)
    return chosen


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


def _next_generation(sketches: Sequence[Sketch], population: list[Candidate], scores: np.ndarray,
                     rng: np.random.Generator, mutation_prob: float) -> list[Candidate]:
    weights = np.clip(np.nan_to_num(scores, nan=0.0, neginf=0.0), 0, None)
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(population), 1 / len(population))
    parents = rng.choice(len(population), size=len(population), p=weights)
    mutating = rng.random(len(population)) < mutation_prob
    children = []
    for parent, wants_mutation in zip(parents, mutating):
        candidate = population[parent]
        if wants_mutation:
            mutated = mutate(sketches[candidate.sketch], np.array(candidate.row), rng)
            if mutated is not None:
                candidate = Candidate(candidate.sketch, tuple(int(v) for v in mutated[0]))
        children.append(candidate)
    return children
