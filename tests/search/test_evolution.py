"""Mutation and evolutionary search on decision vectors, with a known score."""

import numpy as np

import tilecraft as tc
from tilecraft.search.evolution import Candidate, SearchParams, evolutionary_search, sample_candidates
from tilecraft.search.mutation import MutateTileSize, mutate
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS


def matmul_sketches():
    return generate_sketches(tc.ComputeDAG(WORKLOADS["matmul"](256, 256, 256)))


def test_mutations_stay_in_the_domain_and_change_one_decision():
    sketch = matmul_sketches()[1]
    rng = np.random.default_rng(0)
    rows = sketch.sample(rng, 300, 32)
    rules = set()
    for row in rows:
        child, rule = mutate(sketch, row, rng)
        rules.add(rule)
        changed = np.flatnonzero(child != row)
        assert len(changed) == 1 and 0 <= child[changed[0]] < len(sketch.slots[changed[0]].domain)
        if rule == "tile_size":
            slot = sketch.slots[changed[0]]
            assert np.prod(slot.domain[child[changed[0]]]) == np.prod(slot.domain[row[changed[0]]])
    assert "tile_size" in rules and len(rules) >= 2


def test_tile_mutation_respects_the_innermost_limit():
    sketch = matmul_sketches()[0]
    rng = np.random.default_rng(1)
    row = sketch.sample(rng, 1, 32)[0]
    for _ in range(200):
        row = MutateTileSize().mutate(sketch, row, rng)
        assert all(sketch.slots[n].domain[row[n]][-1] <= 64 for n in range(3))


def test_search_climbs_a_known_score_and_skips_measured():
    sketches = matmul_sketches()
    target = np.log2([4, 8, 1, 8])

    def score(sketch_index, rows):  # best: the tile (4, 8, 1, 8) of i, in the last sketch
        tiles = np.log2(np.array([sketches[sketch_index].slots[0].domain[r] for r in rows[:, 0]], dtype=float))
        return -np.abs(tiles - target).sum(axis=1) + (sketch_index == 2)

    rng = np.random.default_rng(0)
    params = SearchParams(population=512, num_iters=4)
    measured: set = set()
    first = evolutionary_search(sketches, score, 16, measured, [], rng, 32, params)
    assert len(first) == 16 and len({c.key for c in first}) == 16
    found = np.array([score(c.sketch, np.array([c.row]))[0] for c in first])
    randomly = np.array([score(c.sketch, np.array([c.row]))[0]
                         for c in sample_candidates(sketches, 512, rng, 32)])
    assert found.max() >= 1 and np.median(found) > np.percentile(randomly, 99)
    measured = {c.key for c in first}
    second = evolutionary_search(sketches, score, 16, measured, first[:4], rng, 32, params)
    assert not measured & {c.key for c in second}


def test_epsilon_greedy_keeps_random_picks():
    sketches = matmul_sketches()
    chosen = evolutionary_search(sketches, lambda s, rows: np.zeros(len(rows)), 64, set(), [],
                                 np.random.default_rng(0), 32, SearchParams(population=64, num_iters=1))
    assert len(chosen) == 64 and all(isinstance(c, Candidate) for c in chosen)
