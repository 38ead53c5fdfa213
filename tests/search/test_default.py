"""The default schedule: correct for every built-in workload, and register-tiled where it can be."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.schedule.schedule import INLINE
from tilecraft.search.default import default_schedule
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS

SMALL = {
    "matmul": (30, 40, 48), "matmul_add": (32, 16, 32), "dense": (1, 64, 40), "batch_matmul": (3, 16, 8, 24),
    "conv2d": (1, 8, 10, 10, 16, 3, 3, 1, 1), "conv2d_nhwc": (1, 9, 9, 8, 24, 3, 3, 2, 1), "softmax": (16, 40),
    "layer_norm": (16, 40),
}


@pytest.mark.parametrize("workload", sorted(SMALL))
def test_default_schedule_matches_numpy(workload, kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS[workload](*SMALL[workload]))
    inputs = dag.random_inputs()
    func = tc.build(default_schedule(dag, tc.Target.host()), tc.Target.host())
    np.testing.assert_allclose(func(*inputs), dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target, tile, rows_inside", [("llvm -mcpu=core-avx2 -num-cores=2", (6, 16), False),
                                                       ("llvm -mcpu=skylake-avx512 -num-cores=2", (8, 32), True)])
def test_matmul_gets_the_register_tile_with_most_fmas_per_load_inside_a_local_buffer(target, tile, rows_inside):
    """AVX2: 6 rows x 2 vectors, padded (1,026 rows), every middle level 1, the outer loops
    carrying the rest. AVX-512: 6x4, 4x4 and 8x2 vectors do alike per cycle, and B (4 MB)
    outgrows L2, so a tile that needs no padding, with the rows inside each of B's column
    panels: each panel read once, not once per row tile (358 against 185 GFLOPS measured);
    of those, the most rows, each of B's vectors serving 8 FMAs (1.25x faster than 4x4)."""
    dag = tc.ComputeDAG(WORKLOADS["matmul"](1024, 1024, 1024))
    sch = default_schedule(dag, tc.Target(target))
    steps = {s.kind for s in sch.trace.steps}
    assert "cache_write" in steps
    i, j = [d for d in sch.trace.decisions.values() if isinstance(d, tuple) and len(d) == 4]
    assert (i[-1], j[-1]) == tile
    assert j[1] == j[2] == i[2] == 1 and j[0] == 1024 // j[-1]  # B's panels split by the outer loop
    assert (i[0] == 1 and i[1] > 1) == rows_inside


@pytest.mark.parametrize("size, pixels", [(7, (1, 7)), (14, (2, 3))])
def test_a_convolution_gets_the_register_tile_that_wastes_least_at_full_fma_rate(size, pixels):
    """7x7: 7 pixels x 2 vectors (weights read from memory), not 4 pixels padded to 8 (1.6x
    slower measured); 14x14: 2x3 pixels padded to 2x15 still beats 7 pixels (1.08x)."""
    dag = tc.ComputeDAG(WORKLOADS["conv2d_nhwc"](1, size, size, 256, 256, 3, 3, 1, 1))
    sch = default_schedule(dag, tc.Target("llvm -mcpu=core-avx2 -num-cores=2"))
    decisions = [d for d in sch.trace.decisions.values() if isinstance(d, tuple) and len(d) == 4]
    n, y, x, f = (d[-1] for d in decisions)
    assert (n, f) == (1, 16) and sorted((y, x)) == sorted(pixels)


@pytest.mark.parametrize("size, channels, rows_inside", [(7, 512, True), (7, 256, True), (14, 512, False)])
@pytest.mark.slow
def test_a_convolution_whose_weights_outweigh_its_rows_keeps_its_rows_inside_a_weight_tile(
        size, channels, rows_inside, kernel_cache):
    """7x7: the rows pass inside each 16-channel tile of the weights, which the outer part of
    the parallel loop splits, so each core reads its share of the weights once (ResNet-50's
    7x7 layers 10% faster in place on AVX2; with fewer channel tiles than jobs, as on AVX-512,
    the whole model 45 -> 31 ms); not where the pixel tile pads (14 = 2x3 + 1)."""
    target = tc.Target("llvm -mcpu=core-avx2 -num-cores=2")
    dag = tc.ComputeDAG(WORKLOADS["conv2d_nhwc"](1, size, size, 64, channels, 3, 3, 1, 1))
    sch = default_schedule(dag, target)
    n, y, x, f = [d for d in sch.trace.decisions.values() if isinstance(d, tuple) and len(d) == 4]
    assert f[0] == channels // 16 and f[1] == 1  # the parallel loop splits the weights' channel tiles
    assert (y[0] * x[0] == 1 and y[1] * x[1] > 1) == rows_inside  # the rows one level in, or all outside
    if rows_inside:
        inputs = dag.random_inputs()
        np.testing.assert_allclose(tc.build(sch, target, cache_dir=kernel_cache)(*inputs),
                                   dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("l2_bytes, rows_inside", [(16 * 1024, True), (1024 * 1024, False)])
def test_a_matmul_whose_weights_outgrow_l2_keeps_its_rows_inside_their_panels(l2_bytes, rows_inside, kernel_cache):
    """A (48x256) outweighs B (256x32): the rows pass inside B's panels only where B (32 KB) outgrows L2."""
    target = tc.Target(tc.Target.host(), l2_bytes=l2_bytes)
    dag = tc.ComputeDAG(WORKLOADS["matmul"](48, 256, 32))
    sch = default_schedule(dag, target)
    i, _ = [d for d in sch.trace.decisions.values() if isinstance(d, tuple) and len(d) == 4]
    assert (i[0] == 1 and i[1] > 1) == rows_inside
    inputs = dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, target, cache_dir=kernel_cache)(*inputs),
                               dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


def test_default_schedule_of_a_depthwise_convolution_packs_its_unit_multiplier(kernel_cache):
    from tilecraft import ops, te

    data = te.placeholder((1, 9, 9, 16), name="data")
    kernel = te.placeholder((3, 3, 16, 1), name="kernel")  # [KH, KW, C, M=1]: read at a constant 0
    dag = tc.ComputeDAG([data, kernel, ops.depthwise_conv2d_nhwc(data, kernel, stride=2, padding=1)])
    inputs = dag.random_inputs()
    func = tc.build(default_schedule(dag, tc.Target.host()), tc.Target.host())
    np.testing.assert_allclose(func(*inputs), dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tuning_measures_every_sketch_default_first_so_it_never_ends_below_it():
    from tilecraft.search.default import JOBS_PER_CORE, default_row
    from tilecraft.search.policy import SketchPolicy

    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    policy = SketchPolicy(task)
    batch = policy.next_batch(8)
    min_parallel = JOBS_PER_CORE * task.target.num_cores
    defaults = [(n, tuple(default_row(s, min_parallel))) for n, s in enumerate(policy.sketches)]
    assert [(c.sketch, c.row) for c in batch[:len(defaults)]] == defaults
    assert len(batch) == 8 and len({c.key for c in batch}) == 8
    policy.update(batch, [1e-3] * len(batch))
    assert not {c.key for c in policy.next_batch(8)} & {c.key for c in batch}  # later rounds search


def test_default_rows_of_rfactor_sketches_match_numpy(kernel_cache):
    from tilecraft.search.default import JOBS_PER_CORE, default_row
    from tilecraft.search.space import generate_sketches

    target = tc.Target("llvm -mcpu=core-avx2 -num-cores=4")
    dag = tc.ComputeDAG(WORKLOADS["matmul"](4, 1024, 4))
    inputs = dag.random_inputs()
    sketches = [s for s in generate_sketches(dag, target=target) if "rfactor" in s.name]
    assert len(sketches) == 2
    for sketch in sketches:
        sch = sketch.trace_of(default_row(sketch, JOBS_PER_CORE * target.num_cores)).replay(dag)
        func = tc.build(sch, cache_dir=kernel_cache)
        np.testing.assert_allclose(func(*inputs), inputs[0] @ inputs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_resumed_search_measures_todays_defaults_unless_its_log_has_them():
    from tilecraft.search.default import JOBS_PER_CORE, default_row
    from tilecraft.search.evolution import Candidate, SearchParams
    from tilecraft.search.policy import SketchPolicy

    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    searched = SketchPolicy(task, params=SearchParams(population=64, num_iters=1, defaults_first=False), seed=0)
    logged = searched.next_batch(8)  # what an older search measured, without today's defaults
    min_parallel = JOBS_PER_CORE * task.target.num_cores
    defaults = [Candidate(n, tuple(default_row(s, min_parallel))) for n, s in enumerate(searched.sketches)]
    assert not {c.key for c in defaults} & {c.key for c in logged}

    resumed = SketchPolicy(task, seed=0)
    resumed.update(logged, [1e-3] * len(logged))  # as preloading the log does
    assert resumed.next_batch(8)[:len(defaults)] == defaults

    up_to_date = SketchPolicy(task, seed=0)
    up_to_date.update(logged + defaults, [1e-3] * (len(logged) + len(defaults)))
    assert not {c.key for c in up_to_date.next_batch(8)} & {c.key for c in defaults + logged}


def test_without_defaults_first_the_first_round_is_the_searchs_own():
    from tilecraft.search.default import JOBS_PER_CORE, default_row
    from tilecraft.search.evolution import SearchParams
    from tilecraft.search.policy import SketchPolicy

    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    policy = SketchPolicy(task, params=SearchParams(population=64, num_iters=1, defaults_first=False), seed=0)
    min_parallel = JOBS_PER_CORE * task.target.num_cores
    defaults = {(n, tuple(default_row(s, min_parallel))) for n, s in enumerate(policy.sketches)}
    batch = policy.next_batch(len(defaults))
    assert len(batch) == len(defaults) and not defaults <= {(c.sketch, c.row) for c in batch}


def _pad_location_defaults(*tensors) -> set[bool]:
    """Whether each sketch's default inlines the padding block of the DAG of ``tensors``."""
    from tilecraft.search.default import default_row

    dag = tc.ComputeDAG(list(tensors))
    inlined = set()
    for sketch in generate_sketches(dag, target=tc.Target.host()):
        row = default_row(sketch, 1)
        for n, slot in enumerate(sketch.slots):
            if slot.role == "location" and slot.name.endswith("_pad.location"):
                inlined.add(slot.domain[row[n]] == INLINE)
    return inlined


def test_the_default_inlines_a_padding_read_only_within_a_depthwise_window():
    """A depthwise convolution reads each padded element only within one output's 3x3
    window, so a padding pass apart costs memory for nothing; a convolution reuses it
    across output channels. A pool over NHWC reduces its window outside vector lanes over
    the channels, so the padding's check is one a vector and it is inlined; over NCHW the
    window runs along the lanes, and the padding stays apart."""
    from tilecraft import ops, te

    data = te.placeholder((1, 12, 12, 16), name="data")
    kernel, weight = te.placeholder((3, 3, 16, 1), name="kernel"), te.placeholder((3, 3, 16, 16), name="weight")
    depthwise = ops.depthwise_conv2d_nhwc(data, kernel, stride=1, padding=1)
    assert _pad_location_defaults(data, kernel, depthwise) == {True}
    assert _pad_location_defaults(data, weight, ops.conv2d_nhwc(data, weight, stride=1, padding=1)) == {False}
    assert _pad_location_defaults(data, ops.max_pool2d(data, 3, 2, padding=1, layout="NHWC")) == {True}
    nchw = te.placeholder((1, 16, 12, 12), name="nchw")
    assert _pad_location_defaults(nchw, ops.max_pool2d(nchw, 3, 2, padding=1)) == {False}


@pytest.mark.parametrize("size, pixels", [(12, 2), (7, 1)])
def test_a_depthwise_convolution_gets_a_small_unpadded_tile(size, pixels):
    """No operand of a depthwise convolution is broadcast across its channels, so more
    accumulators reuse no loads: two vectors by two pixels (one where two would pad)."""
    from tilecraft import ops, te

    data = te.placeholder((1, size, size, 32), name="data")
    kernel = te.placeholder((3, 3, 32, 1), name="kernel")
    dag = tc.ComputeDAG([data, kernel, ops.depthwise_conv2d_nhwc(data, kernel, stride=1, padding=1)])
    target = tc.Target("llvm -mcpu=core-avx2 -num-cores=2")
    sketch = next(s for s in generate_sketches(dag, target=target) if s.register_tiles)
    (tile,) = sketch.register_tiles
    assert not tile.broadcast
    sch = default_schedule(dag, target)
    decisions = [d for d in sch.trace.decisions.values() if isinstance(d, tuple) and len(d) == 4]
    n, y, x, c = (d[-1] for d in decisions)
    assert (n, y, x, c) == (1, 1, pixels, 16)


@pytest.mark.slow
def test_a_row_reduction_defaults_to_vector_lanes_and_a_sum_across_rows_does_not(kernel_cache):
    import json

    from tilecraft import ops, te

    def rfactors(sch) -> list[str]:
        return [step["args"]["loop"] for step in json.loads(sch.trace.dumps()) if step["kind"] == "rfactor"]

    dag = tc.ComputeDAG(WORKLOADS["layer_norm"](128, 768))  # sums along each row, its contiguous axis
    sch = default_schedule(dag, tc.Target.host())
    assert len(rfactors(sch)) == 2  # both row sums in vector lanes, the sketch rfactor_inner x 2
    inputs = dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, cache_dir=kernel_cache)(*inputs), dag.evaluate_numpy(inputs)[0],
                               rtol=1e-4, atol=1e-4)
    data = te.placeholder((1, 16, 16, 64), name="data")  # NHWC: the sum runs across rows, channels are contiguous
    pool = tc.ComputeDAG([data, ops.global_avg_pool2d(data, layout="NHWC")])
    assert any("rfactor_inner" in s.name for s in generate_sketches(pool, target=tc.Target.host()))
    assert rfactors(default_schedule(pool, tc.Target.host())) == []


@pytest.mark.parametrize("workload, args, across", [
    ("softmax", (2048, 2000), ["softmax_sum", "softmax_max"]), ("layer_norm", (128, 768), None),
    ("dense", (1, 2048, 1000), ["dense"]), ("softmax", (4096, 8), []), ("matmul", (256, 256, 256), [])])
def test_an_untuned_gpu_reduction_of_rows_a_warp_long_shares_each_row_among_threads(workload, args, across):
    """The kept H100 logs' best softmax, layer norm and matrix-vector product reduced their rows
    across threads, 9.8x, 4.4x and 4.9x faster than the best reducing a row in one thread;
    rows of 8 stay in one thread each; a matmul keeps its tiles."""
    dag = tc.ComputeDAG(WORKLOADS[workload](*args))
    target = tc.Target("cuda -arch=sm_90")
    sch = default_schedule(dag, target)
    reduced_across = sorted({stage.name for stage in sch.state.stages for leaf in stage.leaves
                             if stage.loop(leaf).kind != "spatial" and stage.loop(leaf).annotation == "threadIdx.x"})
    if across is None:  # every reduction of the row
        across = sorted(stage.name for stage in sch.state.stages if stage.op.reduce_axis)
    assert reduced_across == sorted(across)
    small = tc.ComputeDAG(WORKLOADS[workload](*[min(a, 96) for a in args]))
    inputs = small.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(default_schedule(small, target), target)(*inputs),
                               small.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)
