"""Generated C: vectorized loops take the explicit SIMD path for more than + - * / and equal NumPy."""

import re

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import ops, te

HOST = tc.Target()
needs_simd = pytest.mark.skipif(HOST.vector_lanes("float32") <= 1, reason="the host has no SIMD")
LANES = HOST.vector_lanes("float32")


def _vectorized(dag, split=True):
    """Every stage without a reduction vectorized over its innermost axis, split by the lanes."""
    sch = tc.Schedule(dag)
    for tensor in dag.compute_ops:
        if tensor.op.reduce_axis:
            continue
        inner = sch.get_loops(sch.get_block(tensor.op.name))[-1]
        if split:
            inner = sch.split(inner, [None, LANES])[1]
        sch.vectorize(inner)
    return sch


def _build_and_check(dag, cache, inputs=None, split=True, rtol=1e-5, atol=1e-6):
    inputs = dag.random_inputs(np.random.default_rng(0)) if inputs is None else inputs
    func = tc.build(_vectorized(dag, split), cache_dir=cache)
    np.testing.assert_allclose(func(*inputs), dag.evaluate_numpy(inputs)[0], rtol=rtol, atol=atol)
    return func.source


X = te.placeholder((4, 64), name="X")


@needs_simd
@pytest.mark.parametrize("make, helpers", [
    (lambda: ops.relu(X), ["tc_max_f32"]),
    (lambda: ops.clip(X, -0.25, 0.5), ["tc_max_f32", "tc_min_f32"]),
    (lambda: ops.sigmoid(X), ["tc_sigmoid_f32"]),
    (lambda: ops.tanh(X), ["tc_tanh_f32"]),
    (lambda: ops.gelu(X), ["tc_erf_f32"]),
    (lambda: ops.gelu(X, approximate="tanh"), ["tc_tanh_f32"]),
    (lambda: ops.softmax(X), ["tc_exp_f32"]),
    (lambda: te.compute(X.shape, lambda i, j: te.log(te.abs(X[i, j])) + te.sqrt(te.abs(X[i, j])), name="f"),
     ["tc_log_f32", "tc_sqrt_f32", "tc_abs_f32"]),
], ids=["relu", "clip", "sigmoid", "tanh", "gelu", "gelu_tanh", "softmax", "log_sqrt_abs"])
def test_elementwise_math_takes_the_vector_path_and_equals_numpy(kernel_cache, make, helpers):
    source = _build_and_check(tc.ComputeDAG([X, make()]), kernel_cache)
    assert "#pragma GCC ivdep" not in source, source
    for helper in helpers:
        assert f"{helper}x{LANES}(" in source.split("void default_function")[1], (helper, source)


@needs_simd
def test_reads_of_every_other_element_are_two_loads_and_a_shuffle(kernel_cache):
    """A stride-2 window (a strided convolution's input, a 2x pool) reads every other
    element: two vector loads and one shuffle of their even lanes, where a gather lane by
    lane ran a strided ResNet-50 3x3 convolution over NCHW at 33 GFLOPS instead of 114."""
    wide = te.placeholder((4, 4 * LANES + 1), name="wide")
    pairs = te.compute((4, 2 * LANES), lambda i, j: wide[i, 2 * j] + wide[i, 2 * j + 1] * 0.5, name="pairs")
    source = _build_and_check(tc.ComputeDAG([wide, pairs]), kernel_cache)
    body = source.split("void default_function")[1]
    assert body.count("__builtin_shuffle(") == 2 and "wide[" in body, source


@pytest.mark.skipif(LANES < 8, reason="the host's vectors hold fewer than 8 floats")
def test_a_loop_narrower_than_the_vectors_takes_narrower_vectors(kernel_cache):
    """A row two short of the vectors (an NCHW convolution's 14x14 layers on 16-lane vectors):
    vectors of half the width and a scalar tail, where the loop stayed scalar (7 GFLOPS)."""
    narrow = te.placeholder((3, LANES - 2), name="narrow")
    scaled = te.compute(narrow.shape, lambda i, j: te.max(narrow[i, j] * 2.0, 0.5), name="scaled")
    source = _build_and_check(tc.ComputeDAG([narrow, scaled]), kernel_cache, split=False)
    assert f"f32x{LANES // 2}" in source.split("void default_function")[1] and f"f32x{LANES}" not in source, source


@pytest.mark.skipif(LANES < 8, reason="the host's vectors hold fewer than 8 floats")
def test_a_short_loop_of_gathers_stays_scalar(kernel_cache):
    """A loop of 7 whose reads stride across channels (a global pool's partial sums over
    NHWC): narrower vectors would gather lane by lane into an array in memory, 6x slower
    than scalar code that keeps the sums in registers; a contiguous row still takes them."""
    channels = te.placeholder((7 * 32, 3), name="channels")
    picked = te.compute((3, 7), lambda c, k: channels[k * 32, c] * 2.0, name="picked")
    source = _build_and_check(tc.ComputeDAG([channels, picked]), kernel_cache, split=False)
    assert "f32x" not in source.split("void default_function")[1], source


@needs_simd
def test_select_on_lane_conditions_is_a_blend(kernel_cache):
    # a data condition and a loop-index condition, joined by &&; the other branch is math
    Y = te.compute(X.shape, lambda i, j: te.if_then_else((X[i, j] > 0.1) & (j < 40), X[i, j] * 2.0,
                                                         te.exp(X[i, j])), name="Y")
    source = _build_and_check(tc.ComputeDAG([X, Y]), kernel_cache)
    assert f"tc_select_f32x{LANES}(" in source.split("void default_function")[1]


@needs_simd
def test_select_on_a_loop_invariant_condition_picks_one_branch(kernel_cache):
    Y = te.compute(X.shape, lambda i, j: te.if_then_else(i % 2 < 1, X[i, j] * 2.0, te.max(X[i, j], 0.0)), name="Y")
    source = _build_and_check(tc.ComputeDAG([X, Y]), kernel_cache)
    assert "(((i % 2) < 1) ? (" in source and "ivdep" not in source, source


@needs_simd
def test_a_loop_is_cut_where_a_select_on_its_variable_changes_side(kernel_cache):
    """A concatenation's select on its loop variable: each piece of the loop reads one source
    with whole vectors, and no select is left (4x faster on GoogLeNet's 28x28 concatenation)."""
    Y = te.compute(X.shape, lambda i, j: te.if_then_else(j < 32, X[i, j] * 2.0, te.max(X[i, j], 0.0)), name="Y")
    source = _build_and_check(tc.ComputeDAG([X, Y]), kernel_cache, split=False)
    body = source[source.index("void default_function"):]
    assert "?" not in body and "ivdep" not in body and body.count(f"*(f32x{LANES}*)&Y[") == 2, body


@needs_simd
def test_select_whose_other_branch_may_read_out_of_bounds_stays_scalar(kernel_cache):
    # the scalar code never reads A[-1] or A[10]; both sides of a vector blend would
    A = te.placeholder((10,), name="A")
    pad = te.compute((12,), lambda i: te.if_then_else((i >= 1) & (i < 11), A[i - 1], 0.0), name="pad")
    source = _build_and_check(tc.ComputeDAG([A, pad]), kernel_cache, split=False)
    assert "#pragma GCC ivdep" in source and "tc_select" not in source


@needs_simd
def test_layer_norm_is_vectorized_with_rsqrt_per_lane_when_the_kept_axis_is_inner(kernel_cache):
    g, b = te.placeholder((64,), name="g"), te.placeholder((64,), name="b")
    source = _build_and_check(tc.ComputeDAG([X, g, b, ops.layer_norm(X, g, b)]), kernel_cache, rtol=1e-4, atol=1e-5)
    assert f"*(f32x{LANES}*)&layer_norm[" in source  # rsqrt of the row's statistics is loop-invariant
    gamma, beta = te.placeholder((4,), name="gamma"), te.placeholder((4,), name="beta")
    first = tc.ComputeDAG([X, gamma, beta, ops.layer_norm(X, gamma, beta, axis=0)])
    source = _build_and_check(first, kernel_cache, rtol=1e-4, atol=1e-5)
    assert f"tc_rsqrt_f32x{LANES}(" in source


@needs_simd
def test_casts_and_integer_min_max_abs_are_vectorized(kernel_cache):
    I = te.placeholder((4, 64), name="I", dtype="int32")
    Y = te.compute(X.shape, lambda i, j: te.max(te.abs(I[i, j]), (X[i, j] * 8.0).astype("int32"))
                   + (X[i, j] > 0.5).astype("int32"), name="Y")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((4, 64)).astype(np.float32), rng.integers(-9, 9, (4, 64)).astype(np.int32)]
    source = _build_and_check(tc.ComputeDAG([X, I, Y]), kernel_cache, inputs=inputs)
    assert f"tc_max_i32x{LANES}(" in source and "__builtin_convertvector" in source, source


@needs_simd
def test_vector_max_keeps_the_scalar_nan_rule_in_the_main_loop_and_the_tail(kernel_cache):
    # max(a, b) is a > b ? a : b: NaN in the first operand gives the second, in the second gives NaN
    A, B = te.placeholder((3, 20), name="A"), te.placeholder((3, 20), name="B")
    dag = tc.ComputeDAG([A, B, te.compute((3, 20), lambda i, j: te.max(A[i, j], B[i, j]), name="M")])
    a = np.where(np.arange(60).reshape(3, 20) % 3 == 0, np.nan, 1.0).astype(np.float32)
    b = np.where(np.arange(60).reshape(3, 20) % 5 == 0, np.nan, 2.0).astype(np.float32)
    vector = tc.build(_vectorized(dag, split=False), cache_dir=kernel_cache)
    scalar = tc.build(tc.Schedule(dag), cache_dir=kernel_cache)
    assert f"tc_max_f32x{LANES}(" in vector.source
    np.testing.assert_array_equal(vector(a, b), scalar(a, b))
    np.testing.assert_array_equal(vector(a, b), np.where(a > b, a, b))


@needs_simd
def test_float64_keeps_transcendental_math_scalar_and_vectorizes_the_rest(kernel_cache):
    D = te.placeholder((4, 64), name="D", dtype="float64")
    exp = te.compute(D.shape, lambda i, j: te.exp(D[i, j]), name="E")
    assert "#pragma GCC ivdep" in _build_and_check(tc.ComputeDAG([D, exp]), kernel_cache, rtol=1e-12)
    root = te.compute(D.shape, lambda i, j: te.sqrt(te.abs(D[i, j])) + te.min(D[i, j], 0.5), name="R")
    source = _build_and_check(tc.ComputeDAG([D, root]), kernel_cache, rtol=1e-12)
    assert f"tc_sqrt_f64x{HOST.vector_lanes('float64')}(" in source


@needs_simd
def test_a_bool_tensor_read_in_a_vector_loop_falls_back_to_the_scalar_loop(kernel_cache):
    keep = te.placeholder((4, 64), name="keep", dtype="bool")
    Y = te.compute(X.shape, lambda i, j: te.if_then_else(keep[i, j], X[i, j], 0.0), name="Y")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((4, 64)).astype(np.float32), rng.random((4, 64)) < 0.5]
    assert "#pragma GCC ivdep" in _build_and_check(tc.ComputeDAG([X, keep, Y]), kernel_cache, inputs=inputs)


@pytest.mark.parametrize("cores", [1, 3])
def test_parallel_loops_run_on_the_targets_cores_whatever_the_environment(kernel_cache, monkeypatch, cores):
    """A target of N cores runs its parallel loops on N threads, not on OMP_NUM_THREADS or on
    every CPU of the host: a kernel tuned for 2 cores runs on a 16-core host as measured."""
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    A = te.placeholder((64, 32), name="A")
    B = te.compute((64, 32), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((64, 32), lambda i, j: B[i, j] + 1.0, name="C")
    dag = tc.ComputeDAG([A, C])
    sch = tc.Schedule(dag)
    for name in ("B", "C"):
        sch.parallel(sch.get_loops(sch.get_block(name))[0])
    func = tc.build(sch, tc.Target(HOST, num_cores=cores), cache_dir=kernel_cache)
    (a,) = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(func(a), a * 2.0 + 1.0, rtol=1e-6)
    pragmas = [line.strip() for line in func.source.splitlines() if line.strip().startswith("#pragma omp parallel")]
    assert pragmas and all(f"num_threads({cores})" in p for p in pragmas), pragmas


def _special_floats() -> np.ndarray:
    """float32s whose rounding to bfloat16 is easy to get wrong: ties to even up and down,
    the largest finite values (which round to inf), infinities, NaNs, signed zeros,
    subnormals; then random bit patterns (NaNs with payloads among them)."""
    special = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20, 3.4028235e38,
                        -3.3961776e38, 3.3895314e38, np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-45, 1.1754942e-38,
                        2.0 ** -130, 65504.0, 0.1, -7.3], np.float32)
    random_bits = np.random.default_rng(0).integers(0, 2 ** 32, 4078, dtype=np.uint32).view(np.float32)
    return np.concatenate([special, random_bits])


def _round_and_widen(dtype: str, x: np.ndarray, lanes: int | None = None) -> tc.Schedule:
    """``x`` rounded to ``dtype``, then widened and doubled; each loop in vectors of ``lanes``
    where given (the target's, or fewer in a shorter loop)."""
    X = te.placeholder(x.shape, name="X")
    rounded = te.compute(x.shape, lambda i: X[i].astype(dtype), name="rounded")
    widened = te.compute(x.shape, lambda i: rounded[i].astype("float32") * 2.0, name="widened")
    sch = tc.Schedule(tc.ComputeDAG([X, rounded, widened]))
    for name in ("rounded", "widened") if lanes else ():
        sch.vectorize(sch.split(sch.get_loops(sch.get_block(name))[0], [None, lanes])[1])
    return sch


@pytest.mark.parametrize("on", ["cpu", "cpu_vectors", "gpu"])
def test_bfloat16_rounds_to_nearest_even_as_ml_dtypes_does_and_widens_exactly(on, kernel_cache):
    """A float32 stored to bfloat16 (``tc_f2bf``) has the bits NumPy's bfloat16 (ml_dtypes)
    gives it, a NaN stays a NaN; read back (``tc_bf2f``, a shift) it is exact. In vectors
    alike (``tc_round_bf16x16``), and on the GPU in emulation, with the same helpers NVRTC
    compiles."""
    import ml_dtypes  # a second to import: only this test of the module needs it

    x = _special_floats()
    sch = _round_and_widen("bfloat16", x, 16 if on == "cpu_vectors" else None)
    if on == "gpu":
        for name in ("rounded", "widened"):
            blocks, threads = sch.split(sch.get_loops(sch.get_block(name))[0], [None, 128])
            sch.bind(blocks, "blockIdx.x")
            sch.bind(threads, "threadIdx.x")
    run = tc.emulate_gpu(sch, "cuda -arch=sm_90") if on == "gpu" else tc.build(sch, "llvm", cache_dir=kernel_cache)
    if on == "cpu_vectors":
        assert re.search(r"tc_round_bf16x\d+\(", run.source) and re.search(r"tc_widen_bf16x\d+\(", run.source)
    got, twice = run(x)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    assert got.dtype == want.dtype and np.isnan(got.astype(np.float32))[nan].all()
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(twice[~nan], want.astype(np.float32)[~nan] * np.float32(2))


@pytest.mark.parametrize("lanes", [16, *(pytest.param(n, marks=pytest.mark.slow) for n in (8, 4))])
def test_float16_vectors_round_to_nearest_even_and_widen_exactly(lanes, kernel_cache):
    """Vectors of float16 as NumPy rounds and widens them, bit for bit: on AVX-512 16 lanes
    convert with vcvtps2ph/vcvtph2ps, 8 with F16C's, 4 lane by lane (the generic code)."""
    x = _special_floats()
    run = tc.build(_round_and_widen("float16", x, lanes), "llvm", cache_dir=kernel_cache)
    assert re.search(r"tc_round_f16x\d+\(", run.source) and re.search(r"tc_widen_f16x\d+\(", run.source)
    got, twice = run(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(twice[~nan], want.astype(np.float32)[~nan] * np.float32(2))
