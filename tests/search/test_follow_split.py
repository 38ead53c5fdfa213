"""Fused tiles: the consumer follows the tile's inner lengths (Ansor's FollowSplit), and
records of the earlier form, whose consumer was split by the tile's outer counts, still
locate their candidate where both forms make the same program."""

import math
import time
from dataclasses import dataclass

import numpy as np

import tilecraft as tc
from tilecraft.database import TuningRecord, trace_key
from tilecraft.search.cost_model import RandomModel
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.sketch_rules import SKETCH_RULES, MultiLevelTilingWithFusion, multi_level_tile
from tilecraft.search.space import generate_sketches

TARGET = tc.Target("llvm -mcpu=skylake-avx512 -num-cores=2")
CONV = ("conv2d", (1, 8, 28, 28, 16, 3, 3, 1, 1))  # 28 columns: two tiles of 16 lanes pad them


@dataclass
class OuterCountFusion(MultiLevelTilingWithFusion):
    """The rule as it was: the consumer split by the tile's outer counts."""

    def apply(self, draft, block):
        results = []
        for level in self.levels:
            sch = draft.sch.copy()
            consumer = sch.state.consumers_of(block)[0].name
            spatial_tiles, _ = multi_level_tile(sch, block, self.structure, self.max_innermost_factor, padded=True)
            c_loops = sch.get_loops(sch.get_block(consumer))
            pieces = [sch.split(loop, list(tiles[:level]) + [None]) for loop, tiles in zip(c_loops, spatial_tiles)]
            sch.reorder(*[p[n] for n in range(level + 1) for p in pieces])
            sch.compute_at(sch.get_block(block), pieces[-1][level - 1])
            results.append((draft.derive(sch, f"fuse{level}", tiled=block), draft.index(block) - 1))
        return results


def _outer_counts_differ(tiles, extent):
    """Whether some level's outer counts split the loop into pieces other than the inner lengths."""
    return any(math.ceil(extent / math.prod(tiles[:level])) != math.prod(tiles[level:]) for level in range(1, 4))


def _conv_task():
    return tc.SearchTask(func=CONV[0], args=CONV[1], target=TARGET)


def _padded_row(sketch):
    """The sketch's default-like row with the columns in two tiles of 16 (over 28)."""
    from tilecraft.search.default import default_row

    row = default_row(sketch, 1)
    x = next(n for n, slot in enumerate(sketch.slots) if slot.name.endswith(".x"))
    row[x] = sketch.index_of(x, (2, 1, 1, 16))
    return row


def test_a_padded_fused_tile_keeps_its_width_and_computes_what_numpy_does(kernel_cache):
    task = _conv_task()
    sketch = next(s for s in generate_sketches(task.compute_dag, target=TARGET) if s.name.endswith("fuse1"))
    sch = sketch.trace_of(_padded_row(sketch)).replay(task.compute_dag)
    lowered = str(tc.lower(sch))
    assert "in range(16) vectorize" in lowered and "in range(14) vectorize" not in lowered
    inputs = task.compute_dag.random_inputs()
    (expected,) = task.compute_dag.evaluate_numpy(inputs)
    kernel = tc.build(sch, tc.Target.host(), cache_dir=kernel_cache)  # the AVX-512 schedule, runnable on any host
    np.testing.assert_allclose(kernel(*inputs), expected, rtol=1e-4, atol=1e-4)


def test_a_record_of_the_outer_count_form_locates_its_candidate():
    task = _conv_task()
    rules = [OuterCountFusion() if isinstance(r, MultiLevelTilingWithFusion) else r for r in SKETCH_RULES]
    old = {s.name: s for s in generate_sketches(task.compute_dag, rules=rules, target=TARGET)}
    policy = SketchPolicy(task, RandomModel(), seed=0)
    records, expected = [], []
    for index, sketch in enumerate(policy.sketches):
        rows = sketch.sample(np.random.default_rng(index), 3, 1)
        for row in rows:
            trace = old[sketch.name].trace_of(row)
            assert (sketch.row_of(trace) is None) == ("fuse" in sketch.name)  # the forms differ only when fused
            records.append(TuningRecord(task.workload_key, task.workload, str(TARGET), trace_key(trace), (1e-3,),
                                        "none", "", 0.0, time.time(), 1.0, sketch.name))
            differs = any(slot.role == "tile" and _outer_counts_differ(slot.domain[i], math.prod(slot.domain[0]))
                          for slot, i in zip(sketch.slots, row))
            expected.append(None if differs and "fuse" in sketch.name else (index, tuple(int(v) for v in row)))
    assert any(e is None for e in expected) and sum(e is not None for e in expected) > len(policy.sketches)
    located = policy.locate(records)
    assert [None if c is None else (c.sketch, c.row) for c in located] == expected
