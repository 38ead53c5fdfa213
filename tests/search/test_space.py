"""Decision spaces: random candidates of every sketch compute what NumPy computes, and
rows, traces and features agree with each other."""

import json
import re

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.errors import ScheduleError
from tilecraft.search.features import FeatureSpace
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS

SMALL = {
    "matmul": (24, 40, 48), "matmul_add": (32, 16, 32), "dense": (2, 64, 40), "batch_matmul": (3, 16, 8, 24),
    "conv2d": (1, 8, 10, 10, 16, 3, 3, 1, 1), "softmax": (16, 40), "layer_norm": (16, 40),
}


@pytest.mark.parametrize("workload", [  # the `not slow` subset checks the cheapest
    pytest.param(w, marks=[] if w == "layer_norm" else pytest.mark.slow) for w in sorted(SMALL)])
def test_random_candidates_match_numpy(workload, kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS[workload](*SMALL[workload]))
    inputs = dag.random_inputs()
    expected = dag.evaluate_numpy(inputs)
    rng = np.random.default_rng(len(workload))
    for sketch in generate_sketches(dag):
        rows = sketch.sample(rng, 8, 32)
        for row in rows:
            trace = sketch.trace_of(row)
            assert (sketch.row_of(trace) == row).all()
            assert (sketch.row_of(trace, trace.dumps()) == row).all()
            assert (sketch.row_of(trace, json.dumps(trace.to_json(), indent=1)) == row).all()  # a hand-made log's
        check_candidates(dag, sketch, rows, 3, inputs, expected, kernel_cache)


def check_candidates(dag, sketch, rows, wanted: int, inputs, expected, kernel_cache) -> None:
    """The first ``wanted`` of ``rows`` that replay build kernels that match NumPy; a row may
    fail to replay only for a location that a consumer's own location ruled out."""
    replayed = 0
    for row in rows:
        try:
            sch = sketch.trace_of(row).replay(dag)
        except ScheduleError as error:
            assert "compute_location" in str(error)
            continue
        outputs = tc.build(sch, cache_dir=kernel_cache)(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{sketch.name} {row}")
        replayed += 1
        if replayed == wanted:
            return
    raise AssertionError(f"too few candidates of {sketch.name} replay")


def test_rewrite_layout_packs_the_weight_in_tile_order(kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))
    sketch = generate_sketches(dag)[2]  # cache_write fuse2
    want = {"matmul.i": (2, 4, 1, 8), "matmul.j": (2, 2, 1, 16), "matmul.k": (64, 1)}
    row = [sketch.index_of(n, want[s.name]) if s.role == "tile" else 0 for n, s in enumerate(sketch.slots)]
    sch = sketch.trace_of(row).replay(dag)
    (packed,) = sch.state.packed
    assert packed.packed.shape == (4, 64, 16)  # j0*j1 panels, every k, 16 contiguous columns
    inputs = dag.random_inputs()
    expected = inputs[0] @ inputs[1]
    np.testing.assert_allclose(tc.build(sch, cache_dir=kernel_cache)(*inputs), expected, rtol=1e-4, atol=1e-5)


def test_parallel_depth_follows_ansor_init_rule():
    dag = tc.ComputeDAG(WORKLOADS["matmul"](256, 256, 256))
    sketch = generate_sketches(dag)[0]  # tile: parallel over i0 j0 i1 j1
    rows = sketch.sample(np.random.default_rng(0), 200, 32)
    logs = sketch.log_factors(rows)
    (slot, forms), = sketch.parallel_loops.items()
    extents = np.cumsum(np.stack([f.evaluate(logs) for f in forms], axis=1), axis=1)
    for row, cumulative in zip(rows, extents):
        depth = row[slot]  # index d means d + 1 fused loops
        assert cumulative[depth] > 5 or depth == len(forms) - 1
        assert depth == 0 or cumulative[depth - 1] <= 5


def test_features_align_columns_across_sketches():
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))
    sketches = generate_sketches(dag)
    space = FeatureSpace(sketches)
    rng = np.random.default_rng(0)
    for index, sketch in enumerate(sketches):
        rows = sketch.sample(rng, 50, 32)
        features = space.features(index, rows)
        assert features.shape == (50, len(space.names))
        assert (features[:, space.names.index(f"sketch={sketch.name}")] == 1).all()
        i_tiles = [space.names.index(f"matmul.i.t{p}") for p in range(4)]
        covered = 2 ** features[:, i_tiles].sum(axis=1)  # the tiles of i cover 64, or pad it a little
        inner = 2 ** features[:, i_tiles[-1]]
        assert (np.round(covered) >= 64).all() and (np.round(covered) < 64 + inner).all()
    assert np.isnan(space.features(0, sketches[0].sample(rng, 1, 32))[0, space.names.index("matmul_local.vector")])


def test_padded_tiles_compute_the_same(kernel_cache):
    """6 rows and 24 columns do not divide 64: the tiles pad the loops, the weight is
    packed with a padded panel, and the partial tiles are guarded."""
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))
    sketch = generate_sketches(dag)[1]  # cache_write fuse1
    want = {"matmul.i": (11, 1, 1, 6), "matmul.j": (3, 1, 1, 24), "matmul.k": (64, 1)}
    row = [sketch.index_of(n, want[s.name]) if s.role == "tile" else 0 for n, s in enumerate(sketch.slots)]
    sch = sketch.trace_of(row).replay(dag)
    assert sch.state.packed[0].packed.shape == (3, 64, 24)
    inputs = dag.random_inputs()
    expected = inputs[0] @ inputs[1]
    np.testing.assert_allclose(tc.build(sch, cache_dir=kernel_cache)(*inputs), expected, rtol=1e-4, atol=1e-5)


def test_sample_tile_accepts_only_perfect_or_padded_tilings():
    sch = tc.Schedule(tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64)))
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    assert [int(v) for v in sch.copy().sample_tile(i, 4, 64, decision=[11, 1, 1, 6])] == [11, 1, 1, 6]
    with pytest.raises(ScheduleError, match="rounded up to a multiple of the innermost"):
        sch.sample_tile(i, 4, 64, decision=[10, 1, 1, 6])  # 60 rows do not cover 64


def _full_sum(length: int):
    from tilecraft import te

    A = te.placeholder((length,), name="A")
    k = te.reduce_axis((0, length), name="k")
    return tc.ComputeDAG([A, te.compute((1,), lambda i: te.sum(A[k], axis=k), name="total")])


FOUR_CORES = tc.Target("llvm -mcpu=core-avx2 -num-cores=4")
RFACTOR_CASES = {
    "softmax": lambda: tc.ComputeDAG(WORKLOADS["softmax"](8, 200)),
    "layer_norm": lambda: tc.ComputeDAG(WORKLOADS["layer_norm"](8, 96)),
    "matmul_long_k": lambda: tc.ComputeDAG(WORKLOADS["matmul"](4, 512, 4)),
    "full_sum": lambda: _full_sum(4096),
}


@pytest.mark.parametrize("case", [  # the `not slow` subset checks the cheapest
    pytest.param(c, marks=[] if c == "full_sum" else pytest.mark.slow) for c in sorted(RFACTOR_CASES)])
@pytest.mark.slow
def test_random_candidates_of_rfactor_sketches_match_numpy(case, kernel_cache):
    dag = RFACTOR_CASES[case]()
    inputs = dag.random_inputs()
    expected = dag.evaluate_numpy(inputs)
    rng = np.random.default_rng(7)
    sketches = [s for s in generate_sketches(dag, target=FOUR_CORES) if "rfactor" in s.name]
    assert {s.name.split("(")[0] for s in sketches} >= {"rfactor_outer", "rfactor_inner"}
    space = FeatureSpace(sketches)
    for index, sketch in enumerate(sketches):
        rows = sketch.sample(rng, 16, 64)  # a location its consumers ruled out does not replay
        assert np.isfinite(space.features(index, rows)[:, space.names.index(f"sketch={sketch.name}")]).all()
        check_candidates(dag, sketch, rows, 2, inputs, expected, kernel_cache)


def test_rfactor_sketches_run_the_new_axis_in_parallel_or_as_vector_lanes():
    """A sum over 4096 has one output: the outer sketch spreads its partial sums over the
    cores, the inner one keeps them as vector lanes (Ansor's two rfactor sketches)."""
    dag = _full_sum(4096)
    sketches = {s.name: s for s in generate_sketches(dag, target=FOUR_CORES)}
    assert list(sketches) == ["default", "rfactor_outer(total)", "rfactor_inner(total)"]
    outer, inner = sketches["rfactor_outer(total)"], sketches["rfactor_inner(total)"]
    rows = outer.sample(np.random.default_rng(0), 20, 64)
    location = next(n for n, slot in enumerate(outer.slots) if slot.role == "location")
    rows[:, location] = outer.slots[location].domain.index(-1)  # the rf block at the root
    wide = [row for row in rows if outer.decisions(row)[outer.slots[0].step][0] > 64]
    for row in wide:  # the rf block's loops (1, ko) fused and parallel once ko exceeds 16 per core
        assert re.search(r"for i_k_0_fused in range\(\d+\) parallel", str(tc.lower(outer.trace_of(row).replay(dag))))
    assert wide
    assert set(inner.vector_loops) == {"total_rf"}
    row = inner.sample(np.random.default_rng(0), 1, 64)[0]
    assert "vectorize" in str(tc.lower(inner.trace_of(row).replay(dag)))


def test_a_tiles_bytes_in_the_decisions_are_its_buffers_as_lowering_lays_it_out():
    """Any order of the dimensions and any padding of the layout's rows: the decision
    matrix's size of a shared tile (``Footprint``) is the elements lowering allocates."""
    import math

    from tilecraft.ir.lower import laid_out
    from tilecraft.ir.nodes import Buffer
    from tilecraft.search.space import Footprint, LogForm, _tile_bytes

    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = tuple(int(n) for n in rng.integers(1, 40, rng.integers(2, 4)))
        order = tuple(int(d) for d in rng.permutation(len(shape)))
        align = tuple((position, factor, int(rng.integers(factor)))
                      for position in range(len(shape) - 1) if rng.random() < 0.6
                      for factor in [int(rng.choice([4, 8, 16, 32]))])
        tile = Footprint(4, tuple(((1, LogForm((), math.log2(n))),) for n in shape), order=order, align=align)
        buffer = Buffer("t", shape, "float32", "shared", laid_out(shape, align, order))
        assert _tile_bytes(tile, np.zeros((1, 0)))[0] == buffer.elements * 4, (shape, order, align)
