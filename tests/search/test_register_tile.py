"""Register tiles: drawn shapes fit the target's registers, and such candidates are correct."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.errors import ScheduleError
from tilecraft.search.mutation import MutateRegisterTile
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS

AVX2 = tc.Target("llvm -mcpu=core-avx2 -num-cores=2")
AVX512 = tc.Target("llvm -mcpu=skylake-avx512 -num-cores=2")


def fits(shape, lanes, registers):
    vectors = shape[0] // lanes
    accumulators = vectors * int(np.prod(shape[1:]))
    free = registers - 2 - vectors  # beside a weight vector per column, a broadcast and a spare
    return shape[0] % lanes == 0 and vectors in (1, 2, 4) and free / 2 <= accumulators <= registers - 2


def test_vector_registers_follow_the_isa():
    assert AVX2.vector_registers == 16 and AVX512.vector_registers == 32


@pytest.mark.parametrize("target, lanes", [(AVX2, 8), (AVX512, 16)])
def test_matmul_register_tiles_fill_the_registers(target, lanes):
    dag = tc.ComputeDAG(WORKLOADS["matmul"](1024, 1024, 1024))
    sketch = next(s for s in generate_sketches(dag, target=target) if s.name.startswith("cache_write"))
    (tile,) = sketch.register_tiles
    assert [sketch.slots[s].name for s in tile.slots] == ["matmul.j", "matmul.i"]
    assert tile.broadcast  # A[i, k] misses j: one broadcast feeds a row of the tile
    assert all(fits(shape, lanes, target.vector_registers) for shape in tile.shapes.tolist())
    if target is AVX2:
        assert [16, 6] in tile.shapes.tolist()  # the BLIS-style 6 x 16 micro-kernel (padded rows)
    rows = tile.draw(np.random.default_rng(0), 200)
    for row in rows:
        shape = [sketch.slots[s].domain[i][-1] for s, i in zip(tile.slots, row)]
        assert fits(shape, lanes, target.vector_registers)


def test_a_seven_wide_convolution_gets_seven_row_tiles_with_weights_read_from_memory():
    """7 x 2 vectors is 14 accumulators on AVX2: more than the BLIS rule's 12, and the
    tile that ran ResNet-50's 7x7 layers 1.3x faster than the padded 2 x 3 rows."""
    dag = tc.ComputeDAG(WORKLOADS["conv2d_nhwc"](1, 7, 7, 512, 512, 3, 3, 1, 1))
    sketch = next(s for s in generate_sketches(dag, target=AVX2) if s.register_tiles)
    (tile,) = sketch.register_tiles
    shapes = tile.shapes.tolist()
    assert any(shape[0] == 16 and np.prod(shape[1:]) == 7 for shape in shapes)
    assert all(shape[0] // 8 * np.prod(shape[1:]) <= 14 for shape in shapes)


def test_a_step_is_bound_by_the_fmas_the_loads_the_weights_from_l2_or_the_fma_latency():
    from tilecraft.search.register_tile import MIN_STEP_CYCLES, step_cycles, step_loads

    assert step_loads(6, 2, 16) == 8  # 6 broadcasts, 2 weight vectors held in registers
    assert step_loads(7, 2, 16) == 7 + 1 + 7  # 14 accumulators leave room for one weight vector
    assert step_cycles(6, 2, 16) == 6.0  # 12 FMAs on 2 units
    assert step_cycles(4, 2, 16) == MIN_STEP_CYCLES  # 8 accumulators cannot hide the FMA latency
    assert step_cycles(7, 2, 16) > 7.0  # 15 loads outlast 14 FMAs
    assert step_cycles(3, 4, 16) > step_cycles(6, 2, 16)  # 4 weight vectors a step: L2 cannot keep up


def test_rows_that_read_other_input_vectors_load_their_own():
    """Over NCHW the columns are the vectors: the output channels index only the weights (a
    broadcast a row), the output rows index the input (vectors of their own a row). A tile
    of 14 rows by 2 vectors loads 28 input vectors a step for 28 FMAs; 4 channels by 4 rows
    load 4 broadcasts and 4 vectors for 16 (they ran 108 and 183 GFLOPS). Of the tiles rated
    alike, the default takes the most channels, the rows that share each input vector: 8 x 2
    (1.75x faster than 4 x 4 on Zen 4)."""
    from tilecraft.search.default import default_schedule
    from tilecraft.search.register_tile import step_loads

    assert step_loads(14, 2, 32, broadcasts=1, vector_rows=14) == 1 + 3 + 25
    assert step_loads(16, 1, 32, broadcasts=4, vector_rows=4) == 4 + 4
    assert step_loads(6, 2, 16) == step_loads(6, 2, 16, broadcasts=6, vector_rows=1)  # a matmul's tile, as before
    dag = tc.ComputeDAG(WORKLOADS["conv2d"](1, 64, 56, 56, 64, 3, 3, 1, 1))
    sketch = next(s for s in generate_sketches(dag, target=AVX512) if s.register_tiles)
    (tile,) = sketch.register_tiles
    assert [sketch.slots[s].name for s in tile.slots] == ["conv2d.x", "conv2d.n", "conv2d.f", "conv2d.y"]
    assert tile.indexes_broadcast == (False, True, False) and tile.indexes_vectors == (True, False, True)
    assert tile.fma_rate((32, 1, 1, 14)) < tile.fma_rate((16, 1, 4, 4)) == 1.0
    lowered = str(tc.lower(default_schedule(dag, AVX512)))
    assert "conv2d: float32[1, 8, 2, 16] (local)" in lowered  # channels and rows, one vector of columns


def test_a_vector_operand_read_every_other_element_costs_its_shuffles():
    """A stride-2 convolution over NCHW reads its input columns every other element: two loads
    and a shuffle a vector, on a port that also takes FMAs, so channel rows that share each
    shuffled vector beat pixel rows (13 x 2 ran 131-146 GFLOPS where 4 x 4 ran 107)."""
    from tilecraft.search.register_tile import step_cycles

    assert step_cycles(16, 1, 32, broadcasts=4, vector_rows=4, shuffled=True) == (16 + 4) / 2
    strided, plain = (tc.ComputeDAG(WORKLOADS["conv2d"](1, 128, 56, 56, 128, 3, 3, stride, 1)) for stride in (2, 1))
    (tile,) = next(s for s in generate_sketches(strided, target=AVX512) if s.register_tiles).register_tiles
    assert tile.shuffled and not next(s for s in generate_sketches(plain, target=AVX512)
                                      if s.register_tiles).register_tiles[0].shuffled
    assert tile.fma_rate((16, 1, 4, 4)) < tile.fma_rate((16, 1, 12, 2))


def test_columns_narrower_than_the_vectors_get_register_tiles_of_narrower_vectors():
    """ResNet-50's 14x14 and 7x7 layers over NCHW have rows of 14 and 7 columns: tiles of 8
    and 4 lanes, as the code takes them (the defaults ran 179 and 88 GFLOPS, 7 untiled)."""
    from tilecraft.search.default import default_schedule

    for width, lanes in ((14, 8), (7, 4)):
        dag = tc.ComputeDAG(WORKLOADS["conv2d"](1, 64, width, width, 64, 3, 3, 1, 1))
        (tile,) = next(s for s in generate_sketches(dag, target=AVX512) if s.register_tiles).register_tiles
        assert tile.lanes == lanes and all(shape[0] % lanes == 0 for shape in tile.shapes.tolist())
        assert f"f32x{lanes}" in tc.build(default_schedule(dag, AVX512), AVX512).source


def test_half_the_random_population_gets_register_tiles_and_mutation_draws_one():
    dag = tc.ComputeDAG(WORKLOADS["matmul"](512, 512, 512))
    sketch = next(s for s in generate_sketches(dag, target=AVX2) if s.name.startswith("cache_write"))
    (tile,) = sketch.register_tiles
    rows = sketch.sample(np.random.default_rng(1), 2000, 32)
    share = np.mean([fits([sketch.slots[s].domain[row[s]][-1] for s in tile.slots], 8, 16) for row in rows])
    assert 0.45 < share < 0.75  # half drawn to fit, plus the uniform draws that fit by chance
    rng = np.random.default_rng(2)
    for row in rows[:20]:
        child = MutateRegisterTile().mutate(sketch, row, rng)
        assert fits([sketch.slots[s].domain[child[s]][-1] for s in tile.slots], 8, 16)
        assert (np.delete(child, tile.slots) == np.delete(row, tile.slots)).all()


def test_no_register_tiles_without_a_target_or_a_reduction():
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))
    assert all(not s.register_tiles for s in generate_sketches(dag))
    softmax = tc.ComputeDAG(WORKLOADS["softmax"](16, 40))
    assert all(not s.register_tiles for s in generate_sketches(softmax, target=AVX2))


@pytest.mark.parametrize("workload, args", [("matmul", (30, 24, 40)), ("conv2d_nhwc", (1, 9, 9, 8, 24, 3, 3, 1, 1))])
@pytest.mark.slow
def test_register_tiled_candidates_match_numpy(workload, args, kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS[workload](*args))
    inputs = dag.random_inputs()
    expected = dag.evaluate_numpy(inputs)
    rng = np.random.default_rng(3)
    checked = 0
    for sketch in generate_sketches(dag, target=tc.Target.host()):
        for tile in sketch.register_tiles:
            rows = sketch.sample(rng, 4, 32)
            rows[:, list(tile.slots)] = tile.draw(rng, 4)
            for row in rows:
                try:
                    sch = sketch.trace_of(row).replay(dag)
                except ScheduleError:  # a sampled compute location the tiles made invalid
                    continue
                np.testing.assert_allclose(tc.build(sch, tc.Target.host())(*inputs), expected[0], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked >= 8
