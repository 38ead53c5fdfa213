"""The vector math functions against float64 NumPy on dense sweeps, whole float range included."""

import ctypes
import math

import numpy as np
import pytest

from tilecraft.codegen.vector_math import helpers
from tilecraft.runtime import compile_c
from tilecraft.target import Target

LANES = max(Target.host().vector_lanes("float32"), 4)  # generic vectors where the host has no SIMD
FLOAT32 = ("exp", "log", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "abs")
FLOAT64 = ("sqrt", "rsqrt", "abs")
TINY = np.finfo(np.float32).tiny
DENORMAL_ULP = 2.0 ** -149
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, TINY, -TINY,
                     3.4028235e38, -3.4028235e38, 1.0, -1.0, 88.72283, 88.72284, -87.33654, -103.972, -103.973],
                    np.float32)
DOMAIN = {"exp": (-110, 95), "log": (0, 4), "tanh": (-12, 12), "sigmoid": (-100, 100), "erf": (-5, 5),
          "sqrt": (0, 100), "rsqrt": (0, 100), "abs": (-10, 10)}
REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
             "erf": np.frompyfunc(math.erf, 1, 1), "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "abs": np.abs}


def _library(kernel_cache, portable: bool):
    used = {(name, "float32", LANES) for name in FLOAT32 + ("max", "min")}
    used |= {(name, "float64", LANES) for name in FLOAT64}
    source = ("#define TC_PORTABLE_MATH\n" if portable else "") + "#include <math.h>\n#include <stdint.h>\n"
    source += helpers(set(), used)
    for name, dtype in sorted((name, dtype) for name, dtype, _ in used if name not in ("max", "min")):
        ctype, short = ("float", "f32") if dtype == "float32" else ("double", "f64")
        vtype = f"{short}x{LANES}"
        source += (f"void run_{name}_{short}(const {ctype}* restrict x, {ctype}* restrict y, int64_t n) {{\n"
                   f"  for (int64_t i = 0; i < n; i += {LANES})\n"
                   f"    *({vtype}*)&y[i] = tc_{name}_{vtype}(*({vtype}*)&x[i]);\n"
                   "}\n")
    vtype = f"f32x{LANES}"
    for name in ("max", "min"):
        source += (f"void run_{name}_f32(const float* restrict a, const float* restrict b, float* restrict y, "
                   f"int64_t n) {{\n  for (int64_t i = 0; i < n; i += {LANES})\n"
                   f"    *({vtype}*)&y[i] = tc_{name}_{vtype}(*({vtype}*)&a[i], *({vtype}*)&b[i]);\n}}\n")
    return ctypes.CDLL(str(compile_c(source, Target.host(), cache_dir=kernel_cache)))


@pytest.fixture(scope="module", params=["native", "portable"])
def library(kernel_cache, request):
    """``run_<name>_<f32|f64>(x, y, n)``: the vector function over ``n`` elements (a multiple of the
    lanes), as the host compiles it (AVX-512's helpers where it has them) and in portable C."""
    return _library(kernel_cache, request.param == "portable")


@pytest.fixture(scope="module")
def both(kernel_cache):
    return _library(kernel_cache, False), _library(kernel_cache, True)


def _run(library, name: str, x: np.ndarray) -> np.ndarray:
    padded = np.zeros(-(-x.size // LANES) * LANES, x.dtype)
    padded[:x.size] = x
    y = np.empty_like(padded)
    function = getattr(library, f"run_{name}_{'f32' if x.dtype == np.float32 else 'f64'}")
    function(ctypes.c_void_p(padded.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(padded.size))
    return y[:x.size]


def _sweep(name: str) -> np.ndarray:
    """2^20 points over the interesting range, 2^18 random finite floats of every exponent,
    tiny inputs (with denormals) and special values."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    parts = [np.linspace(*DOMAIN[name], 1 << 20).astype(np.float32), bits[np.isfinite(bits)],
             np.linspace(-1e-3, 1e-3, 1 << 14).astype(np.float32),
             np.linspace(-1e-37, 1e-37, 1 << 12).astype(np.float32), SPECIALS]
    if name == "log":
        parts.append(np.linspace(0.5, 2.0, 1 << 18).astype(np.float32))
    return np.concatenate(parts)


def _errors(name: str, x: np.ndarray, y: np.ndarray):
    """Whether inf/nan/0 match the float64 reference rounded to float32; max relative error
    over normal results; max absolute error over finite and over denormal results."""
    with np.errstate(all="ignore"):
        exact = REFERENCE[name](x.astype(np.float64)).astype(np.float64)
        rounded = exact.astype(np.float32).astype(np.float64)
        y = y.astype(np.float64)
        same_class = ((np.isnan(y) == np.isnan(rounded)) & (np.isinf(rounded) <= (y == rounded))
                      & (np.isinf(y) <= np.isinf(rounded)))
        finite = np.isfinite(rounded) & np.isfinite(y)
        normal = finite & (np.abs(rounded) >= TINY)
        error = np.where(finite, np.abs(y - exact), 0.0)
        relative = np.where(normal, error / np.where(normal, np.abs(exact), 1.0), 0.0)
    return x[~same_class], relative.max(), error.max(), np.where(finite & ~normal, error, 0.0).max()


@pytest.mark.parametrize("name", ["exp", "log"])
def test_exp_and_log_are_within_a_few_ulp_over_the_whole_range(library, name):
    x = _sweep(name)
    wrong_class, relative, _, denormal = _errors(name, x, _run(library, name, x))
    assert wrong_class.size == 0, f"{name}: inf/nan/0 differ at {wrong_class[:8]}"
    assert relative <= 4e-7, f"{name}: max relative error {relative:.3g}"
    assert denormal <= DENORMAL_ULP, f"{name}: denormal results off by {denormal:.3g}"


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "erf"])
@pytest.mark.slow
def test_saturating_functions_are_accurate_to_2e7_absolute_and_1e6_relative(library, name):
    x = _sweep(name)
    wrong_class, relative, absolute, _ = _errors(name, x, _run(library, name, x))
    assert wrong_class.size == 0, f"{name}: inf/nan/0 differ at {wrong_class[:8]}"
    assert absolute <= 2e-7, f"{name}: max absolute error {absolute:.3g}"
    # over every normal result, tiny ones included: no cancellation near 0
    assert relative <= 1e-6, f"{name}: max relative error {relative:.3g}"


def test_tiny_inputs_keep_their_leading_term(library):
    x = np.float32([1e-30, -3e-20, 1e-10, 2e-38])
    np.testing.assert_array_equal(_run(library, "tanh", x), x)
    np.testing.assert_allclose(_run(library, "erf", x), x * np.float32(2 / math.sqrt(math.pi)), rtol=2e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sqrt_rsqrt_and_abs_equal_numpy_exactly(library, dtype):
    x = np.concatenate([_sweep("sqrt").astype(dtype), -SPECIALS.astype(dtype)])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run(library, "sqrt", x), np.sqrt(x))
        np.testing.assert_array_equal(_run(library, "rsqrt", x), dtype(1) / np.sqrt(x))
    np.testing.assert_array_equal(_run(library, "abs", x), np.abs(x))


@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh", "erf"])
def test_native_and_portable_helpers_agree_bit_for_bit(both, name):
    x = _sweep("exp" if name == "exp" else "sigmoid")
    native, portable = (_run(library, name, x) for library in both)
    np.testing.assert_array_equal(native, portable)  # NaN where NaN


def test_max_and_min_take_the_second_operand_where_either_is_nan_or_they_are_equal(both):
    a = np.float32([1, 2, np.nan, 3, np.nan, 0.0, -0.0, -np.inf] * (LANES // 4 if LANES >= 8 else 2))[:max(LANES, 8)]
    b = np.float32([2, 1, 5, np.nan, np.nan, -0.0, 0.0, np.inf] * (LANES // 4 if LANES >= 8 else 2))[:max(LANES, 8)]
    for library in both:
        for name, expected in (("max", np.where(a > b, a, b)), ("min", np.where(a < b, a, b))):
            y = np.empty_like(a)
            getattr(library, f"run_{name}_f32")(*(ctypes.c_void_p(v.ctypes.data) for v in (a, b, y)),
                                                ctypes.c_int64(a.size))
            np.testing.assert_array_equal(y.view(np.uint32), expected.view(np.uint32))
