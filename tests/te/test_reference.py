import math
import subprocess
import sys
import time

import numpy as np
import pytest

from tilecraft import te
from tilecraft.errors import TeError
from tilecraft.te import reference
from tilecraft.te.reference import evaluate
from tilecraft.te.dtype import NUMPY_DTYPES, accumulates_in, computes_in, from_npy, is_float, result_dtype


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def matmul(n, m, l, dtype="float32"):
    A = te.placeholder((n, l), name="A", dtype=dtype)
    B = te.placeholder((l, m), name="B", dtype=dtype)
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def test_matmul(rng):
    A, B, C = matmul(5, 7, 3)
    a = rng.standard_normal((5, 3), dtype=np.float32)
    b = rng.standard_normal((3, 7), dtype=np.float32)
    result = evaluate([C], {A: a, B: b})
    assert list(result) == [C]
    assert result[C].dtype == np.float32
    np.testing.assert_allclose(result[C], a.astype(np.float64) @ b, rtol=1e-6)


def test_single_tensor_output_and_int_matmul(rng):
    A, B, C = matmul(4, 6, 5, dtype="int32")
    a = rng.integers(-9, 9, (4, 5)).astype(np.int32)
    b = rng.integers(-9, 9, (5, 6)).astype(np.int32)
    out = evaluate(C, {A: a, B: b})[C]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a @ b)


def test_where_masked_sums(rng):
    n = 6
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    tri = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k, where=k.var <= i), name="tri")
    k2 = te.reduce_axis((0, n), name="k2")
    rows = te.compute((n,), lambda i: te.sum(A[i, k2], axis=k2, where=k2.var < i), name="rows")
    k3 = te.reduce_axis((0, n), name="k3")
    anti = te.compute((n, n), lambda i, j: te.sum(A[i, k3] * B[k3, j], axis=k3, where=k3.var <= i + j), name="anti")
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = evaluate([tri, rows, anti], {A: a, B: b})
    np.testing.assert_allclose(out[tri], np.tril(a) @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[rows], [a[i, :i].sum() for i in range(n)], rtol=1e-5, atol=1e-6)
    kk = np.arange(n)
    mask = kk[None, None, :] <= kk[:, None, None] + kk[None, :, None]
    expected = np.where(mask, a[:, None, :] * b.T[None, :, :], 0).sum(-1)
    np.testing.assert_allclose(out[anti], expected, rtol=1e-5, atol=1e-6)


def test_max_min_reductions_and_empty_identity(rng):
    A = te.placeholder((4, 5), name="A")
    I = te.placeholder((4, 5), name="I", dtype="int32")
    k = te.reduce_axis((0, 5), name="k")
    mx = te.compute((4,), lambda i: te.max(A[i, k], axis=k), name="mx")
    k2 = te.reduce_axis((0, 5), name="k2")
    mn = te.compute((4,), lambda i: te.min(I[i, k2], axis=k2, where=k2.var < i), name="mn")
    k3 = te.reduce_axis((0, 5), name="k3")
    masked = te.compute((4,), lambda i: te.max(A[i, k3], axis=k3, where=k3.var < i), name="masked")
    a = rng.standard_normal((4, 5), dtype=np.float32)
    ints = rng.integers(-50, 50, (4, 5)).astype(np.int32)
    out = evaluate([mx, mn, masked], {A: a, I: ints})
    np.testing.assert_array_equal(out[mx], a.max(axis=1))
    assert out[mn][0] == np.iinfo(np.int32).max
    np.testing.assert_array_equal(out[mn][1:], [ints[i, :i].min() for i in range(1, 4)])
    assert out[masked][0] == -np.inf
    np.testing.assert_array_equal(out[masked][1:], [a[i, :i].max() for i in range(1, 4)])


def test_reduction_over_an_axis_the_source_ignores(rng):
    A = te.placeholder((3,), name="A")
    k = te.reduce_axis((0, 4), name="k")
    plain = te.compute((3,), lambda i: te.sum(A[i], axis=k), name="plain")
    k2 = te.reduce_axis((0, 4), name="k2")
    product = te.compute((3,), lambda i: te.sum(A[i] * A[i], axis=k2), name="product")
    a = rng.standard_normal(3, dtype=np.float32)
    out = evaluate([plain, product], {A: a})
    np.testing.assert_allclose(out[plain], 4 * a, rtol=1e-6)
    np.testing.assert_allclose(out[product], 4 * a * a, rtol=1e-6)


def test_select_guards_out_of_bounds_reads(rng):
    A = te.placeholder((5,), name="A")
    padded = te.compute(
        (9,), lambda i: te.if_then_else(te.all(i >= 2, i < 7), A[i - 2], te.const(-1.0)), name="padded"
    )
    a = rng.standard_normal(5, dtype=np.float32)
    np.testing.assert_array_equal(evaluate(padded, {A: a})[padded], np.pad(a, 2, constant_values=-1))


def test_gather_and_unguarded_out_of_bounds_read(rng):
    A = te.placeholder((5,), name="A")
    idx = te.placeholder((3,), name="idx", dtype="int32")
    gathered = te.compute((3,), lambda i: A[idx[i]], name="gathered")
    a = rng.standard_normal(5, dtype=np.float32)
    good = np.array([4, 0, 2], np.int32)
    np.testing.assert_array_equal(evaluate(gathered, {A: a, idx: good})[gathered], a[good])
    with pytest.raises(TeError, match=r"gathered reads A .* \[0, 5\]"):
        evaluate(gathered, {A: a, idx: np.array([5, 0, 1], np.int32)})


def test_floordiv_floormod_floor_semantics():
    X = te.placeholder((11,), name="X", dtype="int32")
    F = te.placeholder((4,), name="F")
    ops = {
        "div3": lambda i: X[i] // 3,
        "mod3": lambda i: X[i] % 3,
        "div_neg3": lambda i: X[i] // -3,
        "mod_neg3": lambda i: X[i] % -3,
        "truediv_int": lambda i: X[i] / 4,
    }
    tensors = {name: te.compute((11,), fn, name=name) for name, fn in ops.items()}
    fdiv = te.compute((4,), lambda i: F[i] // 0.75, name="fdiv")
    fmod = te.compute((4,), lambda i: F[i] % 0.75, name="fmod")
    x = np.arange(-5, 6, dtype=np.int32)
    f = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    out = evaluate(list(tensors.values()) + [fdiv, fmod], {X: x, F: f})
    np.testing.assert_array_equal(out[tensors["div3"]], x // 3)
    np.testing.assert_array_equal(out[tensors["mod3"]], x % 3)
    np.testing.assert_array_equal(out[tensors["div_neg3"]], x // -3)
    np.testing.assert_array_equal(out[tensors["mod_neg3"]], x % -3)
    np.testing.assert_array_equal(out[tensors["truediv_int"]], x // 4)
    np.testing.assert_array_equal(out[fdiv], np.floor(f / np.float32(0.75)))
    np.testing.assert_allclose(out[fmod], f - np.floor(f / np.float32(0.75)) * np.float32(0.75))


def test_casts():
    F = te.placeholder((6,), name="F")
    f = np.array([-2.7, -0.5, 0.0, 0.4, 2.5, 70000.0], np.float32)
    to_int = te.compute((6,), lambda i: F[i].astype("int32"), name="to_int")
    to_bool = te.compute((6,), lambda i: F[i].astype("bool"), name="to_bool")
    via_half = te.compute((6,), lambda i: F[i].astype("float16").astype("float32") + 0.0, name="via_half")
    stored_half = te.compute((6,), lambda i: F[i].astype("float16"), name="stored_half")
    index_to_float = te.compute((6,), lambda i: i.astype("float32") * 0.5, name="index_to_float")
    out = evaluate([to_int, to_bool, via_half, stored_half, index_to_float], {F: f})
    np.testing.assert_array_equal(out[to_int], [-2, 0, 0, 0, 2, 70000])
    np.testing.assert_array_equal(out[to_bool], f != 0)
    np.testing.assert_array_equal(out[via_half], f)  # float16 is computed in float32: only stores round
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out[stored_half], f.astype(np.float16))
    np.testing.assert_array_equal(out[index_to_float], np.arange(6) * 0.5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_16_bit_float_is_computed_in_float32_and_rounded_when_stored(rng, dtype):
    half = NUMPY_DTYPES[dtype]
    A = te.placeholder((64,), name="A", dtype=dtype)
    B = te.placeholder((64,), name="B", dtype=dtype)
    C = te.compute((64,), lambda i: A[i] * B[i] + A[i] * 0.1, name="C")
    k = te.reduce_axis((0, 64), name="k")
    S = te.compute((1,), lambda i: te.sum(A[k] * B[k], axis=k), name="S")
    a = rng.standard_normal(64).astype(half)
    b = rng.standard_normal(64).astype(half)
    out = evaluate([C, S], {A: a, B: b})
    assert out[C].dtype == half and out[S].dtype == half
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    expected = (a32 * b32 + a32 * np.float32(0.1)).astype(half)
    np.testing.assert_array_equal(out[C], expected)
    assert out[S][0] == (a32.astype(np.float64) @ b32).astype(half)


def test_bfloat16_holds_float32s_range_and_mixed_with_float16_promotes_to_float32():
    assert is_float("bfloat16") and result_dtype("bfloat16", "float16") == result_dtype("float16", "bfloat16") == \
        "float32"
    assert result_dtype("bfloat16", "int32") == "bfloat16" and result_dtype("bfloat16", "float32") == "float32"
    assert accumulates_in("bfloat16") == computes_in("bfloat16") == "float32"
    X = te.placeholder((3,), name="X", dtype="bfloat16")
    assert te.compute((3,), lambda i: X[i] * 2.0, name="Y").dtype == "bfloat16"


def test_a_bfloat16_array_saved_as_numpy_saves_it_is_read_back_as_bfloat16(tmp_path):
    x = np.array([1.5, -3e38, np.inf], NUMPY_DTYPES["bfloat16"])
    np.save(tmp_path / "x.npy", x)
    raw = np.load(tmp_path / "x.npy")
    assert raw.dtype == np.dtype("V2") and from_npy(raw).dtype == x.dtype  # NumPy's format has no name for it
    np.testing.assert_array_equal(from_npy(raw), x)
    assert from_npy(np.ones(2, np.float16)).dtype == np.float16


def test_chained_computes_return_every_intermediate(rng):
    A = te.placeholder((3, 4), name="A")
    doubled = te.compute((3, 4), lambda i, j: A[i, j] * 2, name="doubled")
    shifted = te.compute((4, 3), lambda j, i: doubled[i, j] + 1, name="shifted")
    k = te.reduce_axis((0, 3), name="k")
    total = te.compute((4,), lambda j: te.sum(shifted[j, k], axis=k), name="total")
    a = rng.standard_normal((3, 4), dtype=np.float32)
    out = evaluate([total], {A: a})
    assert set(out) == {doubled, shifted, total}
    np.testing.assert_allclose(out[shifted], (a * 2 + 1).T)
    np.testing.assert_allclose(out[total], (a * 2 + 1).sum(axis=0), rtol=1e-6)


def test_math_functions(rng):
    X = te.placeholder((200,), name="X")
    x = np.concatenate([np.linspace(-6, 6, 190), [0.0, 1e-6, -1e-4, 0.3, 0.5, 0.49999, 0.50001, 3.9, 10, -10]])
    x = x.astype(np.float32)
    positive = np.abs(x) + np.float32(0.1)
    functions = {
        "exp": (te.exp, np.exp, x),
        "log": (te.log, np.log, positive),
        "sqrt": (te.sqrt, np.sqrt, positive),
        "rsqrt": (te.rsqrt, lambda v: 1 / np.sqrt(v), positive),
        "tanh": (te.tanh, np.tanh, x),
        "sigmoid": (te.sigmoid, lambda v: 1 / (1 + np.exp(-v)), x),
        "abs": (te.abs, np.abs, x),
        "erf": (te.erf, np.vectorize(math.erf), x),
    }
    for name, (te_fn, np_fn, data) in functions.items():
        out = te.compute((200,), lambda i: te_fn(X[i]), name=name)
        value = evaluate(out, {X: data})[out]
        assert value.dtype == np.float32, name
        np.testing.assert_allclose(value, np_fn(data.astype(np.float64)), rtol=2e-6, atol=1e-30, err_msg=name)


def test_erf_float64_accuracy():
    x = np.linspace(-5, 5, 2001)
    np.testing.assert_allclose(reference._erf(x), [math.erf(v) for v in x], rtol=2e-7, atol=1e-300)


def test_pow_logic_and_select():
    X = te.placeholder((6,), name="X", dtype="int32")
    x = np.array([-3, -1, 0, 1, 2, 5], np.int32)
    squared = te.compute((6,), lambda i: te.pow(X[i], 2), name="squared")
    logic = te.compute((6,), lambda i: te.if_then_else(~((X[i] > 0) & (X[i] < 3)) | te.equal(X[i], 1), 1, 0),
                       name="logic")
    out = evaluate([squared, logic], {X: x})
    np.testing.assert_array_equal(out[squared], x**2)
    np.testing.assert_array_equal(out[logic], np.where(~((x > 0) & (x < 3)) | (x == 1), 1, 0))


def test_zero_dimensional_tensors():
    S = te.placeholder((), name="S")
    doubled = te.compute((), lambda: S[()] * 2, name="doubled")
    assert evaluate(doubled, {S: np.array(1.5, np.float32)})[doubled] == 3.0


@pytest.mark.parametrize("budget", [1, 7, 64])
def test_chunked_evaluation_matches(monkeypatch, rng, budget):
    A, B, C = matmul(9, 10, 11)
    k = te.reduce_axis((0, 11), name="k")
    masked = te.compute((9, 10), lambda i, j: te.sum(A[i, k] + B[k, j], axis=k, where=k.var <= i + j), name="masked")
    k2 = te.reduce_axis((0, 11), name="k2")
    mx = te.compute((9, 10), lambda i, j: te.max(A[i, k2] * B[k2, j], axis=k2), name="mx")
    ew = te.compute((9, 11), lambda i, j: A[i, j] * 3 + 1, name="ew")
    a = rng.standard_normal((9, 11), dtype=np.float32)
    b = rng.standard_normal((11, 10), dtype=np.float32)
    whole = evaluate([C, masked, mx, ew], {A: a, B: b})
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", budget)
    chunked = evaluate([C, masked, mx, ew], {A: a, B: b})
    for tensor in (C, masked, mx, ew):
        np.testing.assert_allclose(chunked[tensor], whole[tensor], rtol=1e-6, atol=1e-6, err_msg=tensor.name)


def test_plan_chunks_bounds_every_array():
    sizes = reference._plan_chunks((1024, 1024, 1024), [(0, 1, 2)], 2)
    assert math.prod(sizes) <= reference.CHUNK_ELEMENTS and sizes[:2] == (1024, 1024)
    product = reference._plan_chunks((8192, 8192, 8192), [(0, 1), (0, 2), (2, 1)], 2)
    assert all(product[x] * product[y] <= reference.CHUNK_ELEMENTS for x, y in [(0, 1), (0, 2), (1, 2)])


def test_large_matmul_is_fast(rng):
    A, B, C = matmul(1024, 1024, 1024)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    start = time.perf_counter()
    out = evaluate(C, {A: a, B: b})[C]
    assert time.perf_counter() - start < 3.0
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_input_errors(rng):
    A, B, C = matmul(2, 3, 4)
    a = np.zeros((2, 4), np.float32)
    b = np.zeros((4, 3), np.float32)
    with pytest.raises(TeError, match="no array given for placeholder B"):
        evaluate(C, {A: a})
    with pytest.raises(TeError, match=r"placeholder B expects shape \(4, 3\) and dtype float32.*\(3, 4\)"):
        evaluate(C, {A: a, B: b.T.copy()})
    with pytest.raises(TeError, match="placeholder A .* given shape \\(2, 4\\) and dtype float64"):
        evaluate(C, {A: a.astype(np.float64), B: b})
    with pytest.raises(TeError, match="keyed by placeholders"):
        evaluate(C, {A: a, B: b, C: np.zeros((2, 3), np.float32)})
    with pytest.raises(TeError, match="outputs must be tensors"):
        evaluate(["C"], {A: a, B: b})


@pytest.mark.slow  # a second a process
def test_ml_dtypes_is_imported_only_once_a_bfloat16_is_named():
    """Importing it takes half a second, which every measuring worker would pay."""
    code = ("import sys, numpy as np, tilecraft, tilecraft.ops, tilecraft.graph.passes, tilecraft.measure.worker\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "from tilecraft import te\n"
            "te.placeholder((2,), dtype='bfloat16')\n"
            "assert np.dtype('bfloat16').itemsize == 2\n")
    subprocess.run([sys.executable, "-c", code], check=True)
