"""Local search: neighbours are one decision one step away, and a round's local share goes
to the best candidate's unmeasured neighbours, ranked by the model, then the next best's."""

import numpy as np

import tilecraft as tc
from tilecraft.search.evolution import Candidate, SearchParams
from tilecraft.search.local import local_candidates, neighbours
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS


def conv_sketch():
    """A 7x7 convolution whose row and column loops (7, prime) may be padded (a fused sketch)."""
    dag = tc.ComputeDAG(WORKLOADS["conv2d_nhwc"](1, 7, 7, 32, 32, 3, 3, 1, 1))
    return next(s for s in generate_sketches(dag, target=tc.Target.host())
                if any(slot.role == "tile" and slot.perfect < len(slot.domain) for slot in s.slots))


def tile_slot(sketch, suffix):
    return next(n for n, s in enumerate(sketch.slots) if s.role == "tile" and s.name.endswith(suffix))


def test_neighbours_change_one_decision_by_one_step():
    sketch = conv_sketch()
    rng = np.random.default_rng(0)
    row = sketch.sample(rng, 1, 4)[0]
    rows = neighbours(sketch, row)
    assert len(rows) == len({tuple(r) for r in rows}) > len(sketch.slots)
    for other in rows:
        (changed,) = np.flatnonzero(other != row)
        slot = sketch.slots[changed]
        if slot.role != "tile":
            assert abs(int(other[changed]) - int(row[changed])) == 1
            continue
        before, after = (np.log2(np.asarray(slot.domain[i], dtype=float)) for i in (row[changed], other[changed]))
        moved_prime = np.isclose(before.sum(), after.sum()) and np.count_nonzero(before != after) == 2
        assert moved_prime or np.abs(before - after).sum() <= 2.0


def test_a_prime_factor_moves_between_levels_and_padding_changes_are_near():
    sketch = conv_sketch()
    y = tile_slot(sketch, ".y")
    row = sketch.sample(np.random.default_rng(1), 1, 4)[0]
    row[y] = sketch.index_of(y, (7, 1, 1, 1))
    near = {sketch.slots[y].domain[r[y]] for r in neighbours(sketch, row) if r[y] != row[y]}
    assert {(1, 7, 1, 1), (1, 1, 1, 7)} <= near  # the prime 7 moved
    assert (4, 1, 1, 2) in near  # padded: log2 distance 0.81 + 1
    assert (1, 1, 2, 4) not in near  # two steps away


def test_local_candidates_take_the_best_ranked_neighbours_of_the_best_then_the_next():
    sketch = conv_sketch()
    rng = np.random.default_rng(2)
    best, second = (Candidate(0, tuple(int(v) for v in r)) for r in sketch.sample(rng, 2, 4))

    def score(_, rows):  # prefers larger decision indices of the first slot
        return rows[:, 0].astype(float)

    around_best = neighbours(sketch, best.row)
    chosen = local_candidates([sketch], score, [best, second], set(), 3)
    assert len(chosen) == 3 and all(c.sketch == 0 for c in chosen)
    assert {c.row for c in chosen} <= {tuple(int(v) for v in r) for r in around_best}
    assert chosen[0].row[0] == around_best[:, 0].max()

    measured = {(0, tuple(int(v) for v in r)) for r in around_best}
    after = local_candidates([sketch], score, [best, second], measured, len(around_best) + 5)
    assert after and {c.row for c in after} <= {tuple(int(v) for v in r) for r in neighbours(sketch, second.row)}
    assert not measured & {c.key for c in after}


def test_a_policy_with_a_local_share_measures_neighbours_of_its_best():
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    policy = tc.SketchPolicy(task, params=SearchParams(population=128, num_iters=1, local_share=0.25), seed=0)
    first = policy.next_batch(16)
    policy.update(first, [1.0 + n for n in range(len(first))])  # the first is the best
    best = first[0]
    around = {(best.sketch, tuple(int(v) for v in r)) for r in neighbours(policy.sketches[best.sketch], best.row)}
    batch = policy.next_batch(16)
    assert len(batch) == 16 and len({c.key for c in batch}) == 16
    assert {c.key for c in batch[:4]} <= around and not {c.key for c in batch} & policy.measured
    plain = tc.SketchPolicy(task, params=SearchParams(population=128, num_iters=1), seed=0)
    plain.update(first, [1.0 + n for n in range(len(first))])
    assert len({c.key for c in plain.next_batch(16)} & around) < 4
