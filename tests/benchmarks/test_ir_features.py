"""Features read from the lowered loop nest: named, finite, and telling schedules apart; and the
table of feature_sets.py, which ranks with them against the decision features."""

import re
import sys
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.search.evolution import sample_candidates
from tilecraft.search.policy import SketchPolicy
from tilecraft.tune.task import WORKLOADS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from ir_features import IR_FEATURE_NAMES, ir_feature_matrix, ir_features  # noqa: E402  (benchmarks/ir_features.py)
import feature_sets  # noqa: E402  (benchmarks/feature_sets.py)

N = 64


def value(row: np.ndarray, name: str) -> float:
    """A feature in its own units (features are float32 log2(1 + x)), to 2 decimals."""
    return round(float(2.0 ** row[IR_FEATURE_NAMES.index(name)] - 1), 2)


def matmul_features(tile=(4, 8), vectorize=False, parallel=False, unroll=False) -> np.ndarray:
    """A 64³ matmul accumulated in a local tile of ``tile``, its k loop outside the tile."""
    sch = tc.Schedule(tc.ComputeDAG(WORKLOADS["matmul"](N, N, N)))
    block = sch.get_block("matmul")
    out = sch.cache_write(block, 0, "local")
    i, j = sch.get_loops(out)
    i0, i1 = sch.split(i, [None, tile[0]])
    j0, j1 = sch.split(j, [None, tile[1]])
    sch.reorder(i0, j0, i1, j1)
    if parallel:
        sch.parallel(i0)
    sch.compute_at(block, j0)
    ii, jj, kk = sch.get_loops(block)[-3:]
    sch.reorder(kk, ii, jj)
    if vectorize:
        sch.vectorize(jj)
    if unroll:
        sch.unroll(ii)
    return ir_features(tc.lower(sch))


def test_features_are_named_finite_and_of_fixed_length():
    assert len(IR_FEATURE_NAMES) == len(set(IR_FEATURE_NAMES)) and 60 <= len(IR_FEATURE_NAMES) <= 120
    for row in (matmul_features(), matmul_features((8, 16), True, True)):
        assert row.shape == (len(IR_FEATURE_NAMES),) and row.dtype == np.float32
        assert np.isfinite(row).all() and (row >= 0).all()


def test_matmul_op_counts_are_its_flops():
    row = matmul_features()
    assert np.isclose(value(row, "sum.flops"), 2 * N**3, rtol=1e-4)
    assert np.isclose(value(row, "sum.op.addsub") + value(row, "sum.op.mul"), 2 * N**3, rtol=1e-4)
    assert np.isclose(value(row, "op.fma"), N**3, rtol=1e-4)
    assert value(row, "sum.op.div") == value(row, "sum.op.math") == 0


def test_a_vectorized_inner_loop_shows_its_length_and_unit_stride():
    plain, vectorized = matmul_features(), matmul_features(vectorize=True)
    assert value(plain, "vec.len") == 0 and value(vectorized, "vec.len") == 8
    # Inside the tile, j varies fastest: B[k, j] and the accumulator are unit-stride and
    # A[i, k] is reused across it.
    assert value(vectorized, "read0.stride") == 0
    assert value(vectorized, "read1.stride") == 1 and value(vectorized, "write.stride") == 1


def test_a_larger_register_tile_allocates_more_and_loads_less_per_operation():
    small, large = (matmul_features(tile, vectorize=True, unroll=True) for tile in ((2, 8), (8, 16)))
    assert value(small, "alloc.bytes") == 2 * 8 * 4 and value(large, "alloc.bytes") == 8 * 16 * 4
    assert value(small, "reg.tile_bytes") == 2 * 8 * 4 and value(large, "reg.tile_bytes") == 8 * 16 * 4
    # Per k, the block loads a column of A's tile and a row of B's for 2 * ti * tj flops.
    assert value(small, "unroll.prod") == 2 * 8 and value(large, "unroll.prod") == 8 * 16
    assert value(small, "reg.loads_per_op") == round((2 + 8) / (2 * 2 * 8), 2)
    assert value(large, "reg.loads_per_op") == round((8 + 16) / (2 * 8 * 16), 2)


def test_parallel_extent_appears():
    serial, parallel = matmul_features(), matmul_features(parallel=True)
    assert value(serial, "par.prod") == 1 and value(serial, "par.num") == 0
    assert value(parallel, "par.prod") == N // 4 and value(parallel, "par.num") == 1


def test_softmax_counts_its_exponentials():
    dag = tc.ComputeDAG(WORKLOADS["softmax"](16, 32))
    row = ir_features(tc.lower(tc.Schedule(dag)))
    assert np.isclose(value(row, "sum.op.math"), 16 * 32, rtol=1e-4)
    assert value(row, "sum.op.cmp") > 0  # the running max


def test_feature_matrix_has_a_row_per_sampled_candidate():
    task = tc.SearchTask(func="matmul", args=(N, N, N), target="llvm -num-cores=2")
    policy = SketchPolicy(task)
    candidates = sample_candidates(policy.sketches, 6, np.random.default_rng(0), 4)
    traces = [policy.trace_of(c) for c in candidates]
    matrix = ir_feature_matrix(task.compute_dag, traces, task.target)
    assert matrix.shape == (6, len(IR_FEATURE_NAMES)) and np.isfinite(matrix).all()
    assert (matrix.any(axis=1)).all() and len({row.tobytes() for row in matrix}) > 1
    as_json = ir_feature_matrix(task.compute_dag, [t.to_json() for t in traces[:2]], task.target)
    np.testing.assert_array_equal(as_json, matrix[:2])


def test_feature_sets_prints_a_row_per_log_and_feature_set_then_their_means_whole(capsys):
    def metrics(peak: float, recall: float, rho: float) -> dict:
        return {"peak@32": peak, "recall@16": recall, "rho": rho}

    log = "conv2d_r50_3x3_s2_a_long_tuning_log.json"  # wider than the old hand-set column
    rows = [{"log": log, "features": name, "records": 1200, "extract_ms_per_candidate": ms, "train_secs": 1.5,
             "time_split": metrics(0.9, 0.5, 0.25), "random_mean": metrics(0.8, 0.5, 0.125),
             "random_std": metrics(0.05, 0.1, 0.2)} for name, ms in (("decisions", 0.01), ("ir", 2.0))]
    feature_sets.print_results(rows, seeds=5)
    said = capsys.readouterr().out
    cells = [[cell for cell in re.split(r"\s{2,}", line.strip()) if cell] for line in said.splitlines()]
    assert [log, "decisions", "1200", "0.010", "1.50", "0.900", "0.50", "0.25", "0.800±0.050", "0.500±0.100",
            "0.125±0.200"] in cells
    assert ["mean over logs", "ir", "2.000", "1.50", "0.900", "0.500", "0.250", "0.800", "0.500", "0.125"] in cells
    assert "over 5 random splits" in said
