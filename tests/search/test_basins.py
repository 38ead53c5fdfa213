"""Basins: a candidate's basin is its sketch and register-tile shape, and exploring them
measures the best-scored program of the shapes measured least."""

import numpy as np

import tilecraft as tc
from tilecraft.search.basins import Basins
from tilecraft.search.evolution import Candidate, SearchParams, evolutionary_search
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS


def matmul_sketches():
    dag = tc.ComputeDAG(WORKLOADS["matmul"](256, 256, 256))
    return generate_sketches(dag, target=tc.Target("llvm -isa=avx2 -vector-bytes=32 -num-cores=2"))


def tiled(sketch, row, inner: dict):
    """``row`` with the innermost factor of the tile slots named in ``inner`` set, the rest outermost."""
    row = list(row)
    for suffix, factor in inner.items():
        n = next(n for n, s in enumerate(sketch.slots) if s.role == "tile" and s.name.endswith(suffix))
        levels = len(sketch.slots[n].domain[0])
        row[n] = sketch.index_of(n, (256 // factor,) + (1,) * (levels - 2) + (factor,))
    return tuple(row)


def test_a_basin_is_the_sketch_and_the_innermost_factors_of_its_register_tile():
    sketches = matmul_sketches()
    n, sketch = next((n, s) for n, s in enumerate(sketches) if s.register_tiles)
    basins = Basins(sketches)
    row = tuple(int(v) for v in sketch.sample(np.random.default_rng(0), 1, 4)[0])
    four_by_sixteen = tiled(sketch, row, {".i": 4, ".j": 16})
    j = next(k for k, s in enumerate(sketch.slots) if s.name.endswith(".j"))
    outer_moved = list(four_by_sixteen)
    outer_moved[j] = sketch.index_of(j, (8, 2) + (1,) * (len(sketch.slots[j].domain[0]) - 3) + (16,))
    assert basins.of(n, four_by_sixteen) == basins.of(n, tuple(outer_moved)) == (n, 16, 4)
    assert basins.of(n, tiled(sketch, row, {".i": 8, ".j": 16})) == (n, 16, 8)
    untiled = generate_sketches(tc.ComputeDAG(WORKLOADS["matmul"](256, 256, 256)))  # no target: no register tiles
    row = tuple(int(v) for v in untiled[1].sample(np.random.default_rng(0), 1, 4)[0])
    assert Basins(untiled).of(1, row) == (1,)


def test_the_least_measured_basins_give_their_best_scored_unmeasured_candidate_one_each():
    sketches = matmul_sketches()
    n, sketch = next((n, s) for n, s in enumerate(sketches) if s.register_tiles)
    row = tuple(int(v) for v in sketch.sample(np.random.default_rng(0), 1, 4)[0])
    j = next(k for k, s in enumerate(sketch.slots) if s.name.endswith(".j"))

    def in_basin(i, j_outer):  # rows of the basin (16, i) that differ only in j's outer split
        moved = list(tiled(sketch, row, {".i": i, ".j": 16}))
        moved[j] = sketch.index_of(j, (j_outer, 16 // j_outer) + (1,) * (len(sketch.slots[j].domain[0]) - 3) + (16,))
        return Candidate(n, tuple(moved))

    measured_twice = [in_basin(4, 1), in_basin(4, 2)]
    once, best_of_eight, other_of_eight = in_basin(2, 1), in_basin(8, 1), in_basin(8, 2)
    one_row = in_basin(1, 1)
    basins = Basins(sketches)
    offered = [in_basin(4, 4), in_basin(2, 2), best_of_eight, other_of_eight, one_row]
    basins.offer(offered, [9.0, 8.0, 7.0, 6.0, 1.0], measured={c.key for c in measured_twice})
    taken = {c.key for c in [*measured_twice, once]}
    # The unmeasured shapes of 8 rows and 1 row first, the better-scored before; then the shape
    # of 2 rows, measured once; the shape of 4 rows, measured twice, is left out.
    assert basins.least_measured(3, taken) == [best_of_eight, one_row, in_basin(2, 2)]
    # A basin whose best-scored candidate is taken (chosen by score already) gives none.
    assert basins.least_measured(3, taken | {best_of_eight.key}) == [one_row, in_basin(2, 2), in_basin(4, 4)]


def test_the_epsilon_greedy_slots_explore_basins_when_asked():
    sketches = matmul_sketches()
    basins = Basins(sketches)

    def score(_, rows):  # every candidate alike: the exploring slots follow measurement counts
        return np.ones(len(rows))

    def search(explore: bool):
        params = SearchParams(population=256, num_iters=2, explore_basins=explore)
        return evolutionary_search(sketches, score, 40, set(), [], np.random.default_rng(3), 4, params)

    explored = search(True)
    assert len(explored) == 40 and len({c.key for c in explored}) == 40
    probes = explored[-2:]  # round(40 * 0.05) slots
    others = {basins.of(c.sketch, c.row) for c in explored[:-2]}
    assert len({basins.of(c.sketch, c.row) for c in probes}) == 2
    assert not {basins.of(c.sketch, c.row) for c in probes} & others
    assert search(False)[:-2] == explored[:-2]  # the rest of the batch is the same search
