"""C source of the helpers that explicit-SIMD loops call: blends, min/max and math functions.

The generated C uses GCC vector extensions (``f32x8`` is ``float`` with
``vector_size(32)``), so one source compiles for AVX2, AVX-512 and NEON; no intrinsics.
C has no ``?:`` on vectors: a comparison gives a lane mask of -1/0 in the integer type of
the same width (``i32x8``), and ``tc_select`` blends through it, which gcc turns into one
blend (``vpblendvb`` on AVX2; on AVX-512 a mask register and masked ops). Min and max are selects on
``a > b`` / ``a < b``, the scalar code's NaN rule (the second operand when either is NaN).
Written lane by lane instead (``r[i] = a[i] > b[i] ? a[i] : b[i]``) gcc's SLP vectorizer
gives ``vmaxps``/``vblendvps`` in simple loops but falls back to scalar code inside the
larger math functions, and at 16 lanes, so the bitwise form is the one used.

We compile without ``-ffast-math``, so gcc cannot vectorize libm calls; float32 exp, log,
tanh, sigmoid and erf are therefore our own branch-free functions (Cephes-style range
reduction and minimax polynomials) that agree with NumPy to a few ulp over the whole
range, infinities, NaN and denormals included (tests/codegen/test_vector_math.py).
sqrt stays per lane: with errno semantics (no ``-fno-math-errno``) gcc cannot emit
``vsqrtps`` from portable C, only ``vsqrtss`` per lane, which is still exact.
Other float64 math is left to the scalar loop.

Each template is written for a vector type ``$V`` of ``$N`` lanes of ``$T``, with lane
masks of type ``$M``; ``helpers`` instantiates the ones a kernel uses, dependencies first.

One exception to "no intrinsics": where gcc compiles for AVX-512, 16 float32 lanes take
``vmaxps``/``vminps`` for max and min (a select is three instructions) and exp scales by
2^n with ``vscalefps``, which rounds a denormal or an infinite result once by itself. exp
drops from 32 instructions to 17 and a softmax of 128x768 runs 1.4x faster; the results
are the portable code's, bit for bit (``TC_PORTABLE_MATH`` keeps the portable code, for the
tests that compare them). Two more: float16 vectors convert with F16C's instructions
(``half_helpers``), which gcc does not emit for vectors of ``_Float16`` without AVX-512 FP16,
and pairs of bfloat16 products take AVX-512 BF16's dot product (``codegen/dot_pairs.py``).
"""

from __future__ import annotations

from string import Template

from ..te.dtype import C_TYPES

VECTOR_DTYPES = ("float32", "float64", "int32", "int64")
_SHORT = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}
MASK_DTYPES = {"float32": "int32", "float64": "int64", "int32": "int32", "int64": "int64"}

_GENERIC = {
    "broadcast": ((), """\
static inline $V tc_broadcast_$V($T x) { return ($V){$BROADCAST}; }
"""),
    "select": ((), """\
static inline $V tc_select_$V($M mask, $V a, $V b) { return ($V)((mask & ($M)a) | (~mask & ($M)b)); }
"""),
    "max": (("select",), """\
static inline $V tc_max_$V($V a, $V b) { return tc_select_$V(a > b, a, b); }
"""),
    "min": (("select",), """\
static inline $V tc_min_$V($V a, $V b) { return tc_select_$V(a < b, a, b); }
"""),
}
_INT = {
    "abs": (("select",), """\
static inline $V tc_abs_$V($V x) { return tc_select_$V(x < 0, -x, x); }
"""),
}
_FLOAT = {
    "abs": ((), """\
static inline $V tc_abs_$V($V x) { return ($V)(($M)x & ~$SIGN); }
"""),
    "sqrt": ((), """\
static inline $V tc_sqrt_$V($V x) { $V r; for (int i = 0; i < $N; ++i) r[i] = __builtin_sqrt$F(x[i]); return r; }
"""),
    "rsqrt": (("sqrt",), """\
static inline $V tc_rsqrt_$V($V x) { return 1.0$F / tc_sqrt_$V(x); }
"""),
}
_FLOAT32 = {
    # x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact product); exp(r) by
    # Cephes' expf polynomial; 2^n as two normal factors so that a denormal or an infinite
    # result is rounded once. x is clamped where exp is 0 or inf anyway.
    "exp": (("broadcast", "select", "max", "min"), """\
static inline $V tc_exp_$V($V x) {
  $V xc = tc_min_$V(tc_max_$V(x, tc_broadcast_$V(-104.0f)), tc_broadcast_$V(89.0f));  /* NaN: -104 */
  $V t = xc * 1.44269504f + 12582912.0f;  /* 1.5 * 2^23: the low bits of t hold round(x / ln2) */
  $V n = t - 12582912.0f;
  $V r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  $V p = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
            + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r) + 1.0f;
  $M k = ($M)t - 0x4b400000;
  $M h = k >> 1;
  p = p * ($V)((h + 127) << 23) * ($V)((k - h + 127) << 23);
  return tc_select_$V(x == x, p, x);
}
"""),
    # x = m 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = f - f^2/2 + f^3 P(f), f = m - 1
    # (Cephes' logf); denormals are scaled by 2^23 first.
    "log": (("broadcast", "select"), """\
static inline $V tc_log_$V($V x) {
  $M tiny = x < 1.17549435e-38f;
  $M bits = ($M)tc_select_$V(tiny, x * 8388608.0f, x);
  $M e = ((bits >> 23) & 0xff) - 126 + (tiny & -23);
  $V m = ($V)((bits & 0x007fffff) | 0x3f000000);  /* in [0.5, 1) */
  $M low = m < 0.707106781f;
  $V f = m + ($V)(low & ($M)m) - 1.0f;  /* below sqrt(1/2): 2m - 1, e - 1 */
  $V ef = __builtin_convertvector(e + low, $V);
  $V z = f * f;
  $V y = ((((((((7.0376836292e-2f * f - 1.1514610310e-1f) * f + 1.1676998740e-1f) * f - 1.2420140846e-1f) * f
              + 1.4249322787e-1f) * f - 1.6668057665e-1f) * f + 2.0000714765e-1f) * f - 2.4999993993e-1f) * f
           + 3.3333331174e-1f) * f * z;
  y = (y + ef * -2.12194440e-4f) - 0.5f * z;
  y = (f + y) + ef * 0.693359375f;
  y = tc_select_$V(x == INFINITY, x, y);
  y = tc_select_$V(x == 0.0f, tc_broadcast_$V(-INFINITY), y);
  return tc_select_$V(x >= 0.0f, y, tc_broadcast_$V(NAN));
}
"""),
    "sigmoid": (("exp",), """\
static inline $V tc_sigmoid_$V($V x) { return 1.0f / (1.0f + tc_exp_$V(-x)); }
"""),
    # Cephes' tanhf: an odd polynomial below 0.625, else 1 - 2s / (1 + s) with s = e^-2|x|
    # (no cancellation, no overflow) and the sign of x.
    "tanh": (("exp", "abs", "select"), """\
static inline $V tc_tanh_$V($V x) {
  $V z = x * x;
  $V small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z
              - 3.33332819422e-1f) * z * x + x;
  $V a = tc_abs_$V(x);
  $V s = tc_exp_$V(-(a + a));
  $V big = ($V)(($M)(1.0f - (s + s) / (1.0f + s)) | (($M)x & $SIGN));
  return tc_select_$V(a < 0.625f, small, big);
}
"""),
    # Our minimax fits: erf(x) = x + x P(x^2) below 0.9; above, erf = 1 - exp(Q(|x|)) where Q
    # fits log(erfc) on [0.9, 4] (relative error 1e-8 of erfc); erf(4) rounds to 1.
    "erf": (("exp", "abs", "broadcast", "min", "select"), """\
static inline $V tc_erf_$V($V x) {
  $V z = x * x;
  $V small = x + x * (((((-6.11129391e-4f * z + 5.01622865e-3f) * z - 2.67819576e-2f) * z + 1.12822302e-1f) * z
                       - 3.76125336e-1f) * z + 1.28379151e-1f);  /* 2/sqrt(pi) - 1: no rounding of 1.128 */
  $V a = tc_min_$V(tc_broadcast_$V(4.0f), tc_abs_$V(x));  /* NaN stays NaN */
  $V t = a - 0.9f;
  $V q = (((((((1.60248635e-6f * t - 3.38166028e-5f) * t + 3.41325562e-4f) * t - 2.24648020e-3f) * t
             + 1.11428350e-2f) * t - 4.58084047e-2f) * t - 8.30011368e-1f) * t - 2.47163415f) * t - 1.59409726f;
  $V big = ($V)(($M)(1.0f - tc_exp_$V(q)) | (($M)x & $SIGN));
  return tc_select_$V(a < 0.9f, small, big);
}
"""),
}
# Where gcc targets AVX-512 (``__AVX512F__``), these replace the portable float32 helpers of
# 16 lanes. MAXPS(a, b) is ``a > b ? a : b``, the select's rule; x is clamped with NaN as the
# second operand, so NaN passes through, and the rest is the portable exp's arithmetic.
_AVX512_FLOAT32 = {
    "max": """\
static inline $V tc_max_$V($V a, $V b) { return ($V)_mm512_max_ps((__m512)a, (__m512)b); }
""",
    "min": """\
static inline $V tc_min_$V($V a, $V b) { return ($V)_mm512_min_ps((__m512)a, (__m512)b); }
""",
    "exp": """\
static inline $V tc_exp_$V($V x) {
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), (__m512)x));
  __m512 n = _mm512_roundscale_ps(xc * 1.44269504f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  $V r = (($V)xc - ($V)n * 0.693359375f) - ($V)n * -2.12194440e-4f;
  $V p = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
            + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r) + 1.0f;
  return ($V)_mm512_scalef_ps((__m512)p, n);
}
""",
}
_AVX512_GUARD = "#if defined(__AVX512F__) && !defined(TC_PORTABLE_MATH)\n"
_ORDER = ("broadcast", "select", "max", "min", "abs", "sqrt", "rsqrt", "exp", "log", "sigmoid", "tanh", "erf")


# 16-bit floats in vectors: held as their own type's lanes, widened to float32 lanes when read
# and rounded back when stored (to nearest, ties to even, as the scalar code's tc_f2bf and
# _Float16 casts round). bfloat16 is float32's top half, a shift either way. gcc widens and
# rounds vectors of _Float16 lane by lane without AVX-512 FP16, so float16 takes the F16C
# conversions (vcvtph2ps, vcvtps2ph) where the target has them: 16 lanes on AVX-512, 8 on F16C.
_HALF_VECTOR = {"bfloat16": ("bf16", "uint16_t"), "float16": ("f16", "_Float16")}
_BFLOAT16 = """\
typedef uint32_t tc_u32x$N __attribute__((vector_size($WIDE), aligned(4)));
static inline f32x$N tc_widen_bf16x$N(bf16x$N h) { return (f32x$N)(__builtin_convertvector(h, tc_u32x$N) << 16); }
static inline bf16x$N tc_round_bf16x$N(f32x$N f) {
  tc_u32x$N u = (tc_u32x$N)f, nan = (tc_u32x$N)((u & 0x7fffffffu) > 0x7f800000u);  /* a NaN stays one */
  return __builtin_convertvector((nan & ((u >> 16) | 0x40u)) | (~nan & ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)),
                                 bf16x$N);
}
"""
_FLOAT16 = """\
static inline f32x$N tc_widen_f16x$N(f16x$N h) { return __builtin_convertvector(h, f32x$N); }
static inline f16x$N tc_round_f16x$N(f32x$N f) { return __builtin_convertvector(f, f16x$N); }
"""
_F16C = {  # lanes -> (the guard, the widening, the rounding)
    16: ("defined(__AVX512F__)", "_mm512_cvtph_ps((__m256i)h)", "_mm512_cvtps_ph((__m512)f, $ROUND)"),
    8: ("defined(__F16C__)", "_mm256_cvtph_ps((__m128i)h)", "_mm256_cvtps_ph((__m256)f, $ROUND)"),
}
_F16C_TEMPLATE = """\
static inline f32x$N tc_widen_f16x$N(f16x$N h) { return (f32x$N)$WIDEN; }
static inline f16x$N tc_round_f16x$N(f32x$N f) { return (f16x$N)$ROUNDED; }
"""


_BFLOAT16_DOT = {  # lanes -> AVX-512 BF16's dot product of pairs, its types, and what else it needs
    16: ("_mm512_dpbf16_ps", "__m512", "__m512bh", ""),
    8: ("_mm256_dpbf16_ps", "__m256", "__m256bh", " && defined(__AVX512VL__)"),
    4: ("_mm_dpbf16_ps", "__m128", "__m128bh", " && defined(__AVX512VL__)"),
}
_BFLOAT16_DOT_TEMPLATE = """\
typedef uint32_t tc_bf16_pairs$N __attribute__((vector_size($WIDE), aligned(4), may_alias));
static inline f32x$N tc_dot_pairs_bf16x$N(f32x$N acc, uint32_t a, tc_bf16_pairs$N b) {
  /* acc + a0 b0 + a1 b1 in each lane: b a pair a lane (b0 the low half), a's pair in every lane */
  return (f32x$N)$DOT(($PS)acc, ($BH)((tc_u32x$N){} + a), ($BH)b);
}
static inline f32x$N tc_dot_bf16x$N(f32x$N acc, uint32_t a, bf16x$N b0, bf16x$N b1) {
  /* the same, b's two rows interleaved into pairs */
  return tc_dot_pairs_bf16x$N(acc, a, __builtin_convertvector(b0, tc_u32x$N)
                                         | (__builtin_convertvector(b1, tc_u32x$N) << 16));
}
"""
_BFLOAT16_PAIR = """\
typedef uint32_t tc_bf16_pair __attribute__((may_alias, aligned(2)));  /* two neighbours, one load */
"""


def bfloat16_dot_guard(lanes: int) -> str:
    """The preprocessor condition under which ``tc_dot_bf16x{lanes}`` exists (``dot_pairs.py``):
    the compiler targets AVX-512 BF16 (and VL for fewer than 16 lanes), and the portable code
    was not asked for."""
    return f"#if defined(__AVX512BF16__){_BFLOAT16_DOT[lanes][3]} && !defined(TC_PORTABLE_MATH)\n"


def half_vector_type(dtype: str, lanes: int) -> str:
    """The vector type of ``lanes`` 16-bit floats of ``dtype`` as memory holds them."""
    return f"{_HALF_VECTOR[dtype][0]}x{lanes}"


def half_helpers(halves: set[tuple[str, int]], dots: frozenset[int] | set[int] = frozenset()) -> str:
    """Typedefs of the 16-bit float vectors ``halves`` (dtype, lanes) and their widening to
    float32 vectors (``tc_widen_bf16x16``) and rounding back (``tc_round_bf16x16``), and the
    dot products of bfloat16 pairs of ``dots`` lanes (``tc_dot_bf16x16``, bfloat16's vectors of
    as many lanes among ``halves``); the float32 vectors of as many lanes must be typedef'd before."""
    text = ""
    for dtype, lanes in sorted(halves):
        short, ctype = _HALF_VECTOR[dtype]
        text += f"typedef {ctype} {short}x{lanes} __attribute__((vector_size({2 * lanes}), aligned(2)));\n"
        if dtype == "bfloat16":
            text += Template(_BFLOAT16).substitute(N=lanes, WIDE=4 * lanes)
        elif lanes in _F16C:
            guard, widen, rounded = _F16C[lanes]
            rounded = rounded.replace("$ROUND", "_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC")
            text += (f"#if {guard}\n#include <immintrin.h>\n"
                     + Template(_F16C_TEMPLATE).substitute(N=lanes, WIDEN=widen, ROUNDED=rounded)
                     + "#else\n" + Template(_FLOAT16).substitute(N=lanes) + "#endif\n")
        else:
            text += Template(_FLOAT16).substitute(N=lanes)
    text += _BFLOAT16_PAIR if dots else ""
    for lanes in sorted(dots):
        dot, ps, bh, _ = _BFLOAT16_DOT[lanes]
        dots_text = Template(_BFLOAT16_DOT_TEMPLATE).substitute(N=lanes, WIDE=4 * lanes, DOT=dot, PS=ps, BH=bh)
        text += bfloat16_dot_guard(lanes) + "#include <immintrin.h>\n" + dots_text + "#endif\n"
    return text


def _catalogue(dtype: str) -> dict[str, tuple[tuple[str, ...], str]]:
    if dtype.startswith("int"):
        return {**_GENERIC, **_INT}
    return {**_GENERIC, **_FLOAT, **(_FLOAT32 if dtype == "float32" else {})}


def vector_type(dtype: str, lanes: int) -> str:
    return f"{_SHORT[dtype]}x{lanes}"


def has_helper(name: str, dtype: str) -> bool:
    return dtype in VECTOR_DTYPES and name in _catalogue(dtype)


def helpers(types: set[tuple[str, int]], used: set[tuple[str, str, int]]) -> str:
    """Typedefs of the vector ``types`` (dtype, lanes) and their masks, then the ``used``
    helpers (name, dtype, lanes) with everything they call, dependencies first."""
    needed: set[tuple[str, str, int]] = set()
    stack = list(used)
    while stack:
        name, dtype, lanes = stack.pop()
        if (name, dtype, lanes) not in needed:
            needed.add((name, dtype, lanes))
            stack.extend((dep, dtype, lanes) for dep in _catalogue(dtype)[name][0])
    all_types = {t for d, n in types | {(d, n) for _, d, n in needed} for t in ((d, n), (MASK_DTYPES[d], n))}
    text = "".join(_typedef(d, n) for d, n in sorted(all_types))
    if any(dtype == "float32" and lanes == 16 and name in _AVX512_FLOAT32 for name, dtype, lanes in needed):
        text += f"{_AVX512_GUARD}#include <immintrin.h>\n#endif\n"
    for name in _ORDER:
        for _, dtype, lanes in sorted(k for k in needed if k[0] == name):
            portable = _instantiate(_catalogue(dtype)[name][1], dtype, lanes)
            if dtype == "float32" and lanes == 16 and name in _AVX512_FLOAT32:
                avx512 = _instantiate(_AVX512_FLOAT32[name], dtype, lanes)
                portable = f"{_AVX512_GUARD}{avx512}#else\n{portable}#endif\n"
            text += portable
    return text


def _typedef(dtype: str, lanes: int) -> str:
    size = 8 if dtype.endswith("64") else 4
    return (f"typedef {C_TYPES[dtype]} {vector_type(dtype, lanes)} "
            f"__attribute__((vector_size({lanes * size}), aligned({size})));\n")


def _instantiate(template: str, dtype: str, lanes: int) -> str:
    wide = dtype.endswith("64")
    return Template(template).substitute(
        V=vector_type(dtype, lanes), M=vector_type(MASK_DTYPES[dtype], lanes), T=C_TYPES[dtype], N=lanes,
        BROADCAST=", ".join(["x"] * lanes), F="" if dtype == "float64" else "f",
        SIGN="INT64_MIN" if wide else "INT32_MIN")
