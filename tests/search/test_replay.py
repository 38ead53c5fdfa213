"""ReplayTrace: uniform random candidates of a space, never one that was measured."""

from collections import Counter

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.search import ReplayTrace


def tiny_task():
    A = te.placeholder((16, 16), name="A")
    B = te.placeholder((16, 16), name="B")
    k = te.reduce_axis((0, 16), name="k")
    C = te.compute((16, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tc.SearchTask(compute_dag=tc.ComputeDAG([A, B, C]), target="llvm -num-cores=2")


def two_tiles(sch):  # 3 tilings of i (innermost <= 4) x 5 of j (innermost <= 16): 15 candidates
    block = sch.get_block("C")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, sch.sample_perfect_tile(i, n=2, max_innermost_factor=4))
    j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
    sch.reorder(i0, j0, k, i1, j1)


def test_batches_never_repeat_and_cover_the_space_until_it_is_exhausted():
    policy = ReplayTrace(tiny_task(), space=tc.ScheduleFn(two_tiles))
    seen = []
    while batch := policy.next_batch(4):
        assert len(batch) <= 4
        seen += [c.key for c in batch]
        policy.update(batch, [1e-3] * len(batch))
    assert len(seen) == len(set(seen)) == 15


def test_draws_are_uniform_over_the_space():
    policy = ReplayTrace(tiny_task(), space=tc.ScheduleFn(two_tiles), seed=1)
    counts = Counter(policy.next_batch(1)[0].key for _ in range(1500))  # nothing measured: every draw is free
    assert len(counts) == 15 and 60 <= min(counts.values()) and max(counts.values()) <= 140


def test_the_generated_space_is_sampled_without_the_initial_population_heuristics():
    task = tiny_task()
    policy = ReplayTrace(task, seed=0)
    batch = policy.next_batch(64)
    assert len({c.key for c in batch}) == 64
    assert {c.sketch for c in batch} == set(range(len(policy.sketches)))  # every sketch is drawn
    for candidate in batch[:8]:
        sch = policy.trace_of(candidate).replay(task.compute_dag)
        a, b = task.compute_dag.random_inputs()
        np.testing.assert_allclose(tc.build(sch)(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_preloaded_records_are_never_drawn(tmp_path):
    task = tiny_task()
    first = ReplayTrace(task, space=tc.ScheduleFn(two_tiles))
    measured = first.next_batch(10)
    traces = [first.trace_of(c) for c in measured]

    class Record:  # what preload reads of a TuningRecord
        def __init__(self, trace):
            self.trace, self.sketch, self.mean_cost = trace.to_json(), "two_tiles", 1e-3
            self.trace_json, self.phase = trace.dumps(), "search"

    again = ReplayTrace(task, space=tc.ScheduleFn(two_tiles), seed=5)
    assert again.preload([Record(t) for t in traces]) == 10
    rest = again.next_batch(15)
    assert len(rest) == 5 and not {c.key for c in rest} & {c.key for c in measured}
