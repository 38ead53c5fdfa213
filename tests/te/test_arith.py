"""Index arithmetic: split and fuse indices cancel to loop variables where the ranges
allow, bounds hold every value an index takes, and nothing non-linear is rewritten."""

import numpy as np
import pytest

from tilecraft import te
from tilecraft.te.arith import Linear, bounds, interval, simplify, to_linear
from tilecraft.te.expr import Binary, Var, const, substitute
from tilecraft.te.reference import evaluate


@pytest.fixture
def o_i():
    """An outer loop ``o`` of 4 iterations and an inner loop ``i`` of 16, as a split by 16 makes."""
    o, i = Var("o"), Var("i")
    return o, i, {o: 4, i: 16}


def test_a_split_index_cancels_to_the_outer_loop_when_the_inner_extent_is_the_divisor(o_i):
    o, i, ranges = o_i
    assert simplify((o * 16 + i) // 16, ranges) == o


def test_a_split_index_modulo_the_inner_extent_is_the_inner_loop(o_i):
    o, i, ranges = o_i
    assert simplify((o * 16 + i) % 16, ranges) == i


def test_a_division_does_not_cancel_when_the_inner_loop_crosses_a_multiple_of_the_divisor():
    o, i = Var("o"), Var("i")
    ranges = {o: 4, i: 32}  # i reaches past 16: (o*16 + i) // 16 is o or o + 1
    linear = to_linear((o * 16 + i) // 16, ranges)
    assert linear.terms == {o: 1, Binary("floordiv", i, const(16)): 1} and linear.const == 0
    assert simplify((o * 16 + i) % 16, ranges) == Binary("floormod", i, const(16))


def test_a_division_by_a_factor_of_the_stride_keeps_the_quotient_of_the_outer_loop(o_i):
    o, i, ranges = o_i
    linear = to_linear((o * 16 + i) // 8, ranges)
    assert linear.terms == {o: 2, Binary("floordiv", i, const(8)): 1}
    assert simplify((o * 16 + i) % 8, ranges) == Binary("floormod", i, const(8))


def test_a_step_dividing_the_divisor_keeps_a_vector_contiguous_across_the_wrap():
    """(4x + v) % 8 with v < 4 is 4 (x % 2) + v, and (4x + v) // 8 is x // 2: the lanes of a
    vector of four stay contiguous in a fused index that wraps every eight elements."""
    x, v = Var("x"), Var("v")
    ranges = {x: 16, v: 4}
    linear = to_linear((x * 4 + v) % 8, ranges)
    assert linear.terms == {Binary("floormod", x, const(2)): 4, v: 1} and linear.const == 0
    assert simplify((x * 4 + v) // 8, ranges) == Binary("floordiv", x, const(2))
    for value in range(64):  # the rewritten forms agree with Python's arithmetic everywhere
        point = {x: const(value // 4), v: const(value % 4)}
        for op, expected in (("floordiv", value // 8), ("floormod", value % 8)):
            rewritten = simplify(Binary(op, x * 4 + v, const(8)), ranges)
            assert simplify(substitute(rewritten, point), {}) == const(expected)


def test_a_constant_offset_inside_one_period_folds_into_the_quotient(o_i):
    o, i, ranges = o_i
    assert simplify((o * 16 + i + 32) // 16, ranges) == o + 2
    assert simplify((o * 16 + i + 32) % 16, ranges) == i
    assert simplify((i + 3) // 32, ranges) == const(0)  # i + 3 stays below 32


def test_constant_division_and_modulo_round_toward_negative_infinity():
    assert simplify(const(-7) // 2, {}) == const(-4)
    assert simplify(const(-7) % 2, {}) == const(1)
    assert simplify(const(7) // 2, {}) == const(3)


def test_a_negative_multiple_of_the_divisor_cancels_as_well(o_i):
    o, i, ranges = o_i
    assert to_linear((i - o * 16) // 16, ranges).terms == {o: -1}


def test_terms_of_the_same_atom_are_collected_and_cancel(o_i):
    o, i, ranges = o_i
    assert simplify(o * 3 + i - o * 3, ranges) == i
    assert to_linear(o * i + o * i, ranges).terms == {Binary("mul", o, i): 2}
    assert simplify(o * i - o * i + 5, ranges) == const(5)


def test_a_product_of_loop_variables_is_left_alone(o_i):
    o, i, ranges = o_i
    assert simplify(o * i, ranges) == Binary("mul", o, i)


def test_a_division_by_a_variable_is_left_alone(o_i):
    o, i, ranges = o_i
    assert simplify(i // (o + 1), ranges) == i // (o + 1)
    assert bounds(i // (o + 1), ranges) is None


def test_min_and_max_resolve_to_the_side_that_is_always_smaller_or_larger(o_i):
    o, i, ranges = o_i
    assert simplify(te.min(i, o + 16), ranges) == i  # i <= 15 < o + 16
    assert simplify(te.max(i, o + 16), ranges) == o + 16
    assert simplify(te.min(i, o), ranges) == Binary("min", i, o)  # either can be smaller


def test_a_linear_form_round_trips_through_an_expression(o_i):
    o, i, ranges = o_i
    linear = Linear({o: 16, i: -1}, 7)
    back = to_linear(linear.to_expr(), ranges)
    assert back.terms == linear.terms and back.const == 7
    assert Linear({o: 0}, 0).to_expr() == const(0)  # a zero coefficient drops the term


def test_bounds_of_a_linear_form_take_each_coefficients_sign_into_account(o_i):
    o, i, ranges = o_i  # o in [0, 3], i in [0, 15]
    assert bounds(o * 3 - i * 2 + 5, ranges) == (0 - 30 + 5, 9 + 5)
    assert bounds(0 - o, ranges) == (-3, 0)


def test_bounds_of_a_product_are_the_extreme_products_of_the_factors(o_i):
    o, i, ranges = o_i  # o - 2 in [-2, 1], i - 8 in [-8, 7]
    assert bounds((o - 2) * (i - 8), ranges) == (-14, 16)


def test_bounds_of_division_and_modulo_by_a_positive_constant(o_i):
    o, i, ranges = o_i
    assert bounds((o * 16 + i) // 16, ranges) == (0, 3)
    assert bounds((i + 16) % 32, ranges) == (16, 31)  # inside one period: exact
    assert bounds((o * 16 + i) % 16, ranges) == (0, 15)  # across periods: the whole range


def test_bounds_of_a_free_variable_are_unknown_except_modulo_a_constant():
    x = Var("x")
    assert bounds(x, {}) is None
    assert bounds(x + 1, {}) is None
    assert bounds(x % 6, {}) == (0, 5)


def test_bounds_of_min_and_max(o_i):
    o, i, ranges = o_i
    assert bounds(te.min(i, o + 2), ranges) == (0, 5)
    assert bounds(te.max(i, o + 2), ranges) == (2, 15)


def test_the_interval_of_a_split_index_over_its_inner_loop_is_one_tile(o_i):
    o, i, ranges = o_i
    assert interval(o * 16 + i, {i: 16}, ranges) == (o * 16, 16)


def test_the_interval_of_a_negative_coefficient_starts_at_its_far_end(o_i):
    o, i, ranges = o_i
    start, extent = interval(o * 16 - i, {i: 16}, ranges)
    assert extent == 16 and to_linear(start, ranges).terms == {o: 16} and to_linear(start, ranges).const == -15


def test_the_interval_of_a_strided_sweep_spans_from_its_first_to_its_last_element():
    i, kh = Var("i"), Var("kh")
    ranges = {i: 4, kh: 3}
    assert interval(i * 2 + kh, {i: 4, kh: 3}, ranges) == (const(0), 6 + 2 + 1)  # a strided window


def test_the_interval_is_unknown_when_a_non_linear_term_mixes_fixed_and_varying_loops(o_i):
    o, i, ranges = o_i
    assert interval(o * i, {i: 16}, ranges) is None
    assert interval(o * i + i, {o: 4, i: 16}, ranges) == (const(0), 3 * 15 + 15 + 1)


# ----------------------------------------------------------------------------- property
EXTENTS = (3, 5, 8)


def _random_index(rng: np.random.Generator, variables, depth: int):
    """A random integer index of split/fuse shape: sums, scalings, // and % by constants,
    ``(a*c + b) // c`` and ``% c`` whose ``b`` may or may not stay below ``c``, min/max, and an
    occasional product of variables."""
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.75:
            return variables[int(rng.integers(len(variables)))]
        return const(int(rng.integers(-6, 7)))
    a = _random_index(rng, variables, depth - 1)
    b = _random_index(rng, variables, depth - 1)
    c = int(rng.integers(1, 9))
    choice = int(rng.integers(10))
    return [a + b, a - b, a * c, a * b, a // c, a % c, te.min(a, b), te.max(a, b),
            (a * c + b) // c, (a * c + b) % c][choice]


def _values(index, variables) -> np.ndarray:
    """``index`` at every point of ``variables`` over ``EXTENTS``, by the NumPy reference."""
    tensor = te.compute(EXTENTS, lambda *axes: substitute(index, dict(zip(variables, axes))), name="index")
    return evaluate(tensor, {})[tensor]


@pytest.mark.parametrize("depth", [2, 4])
def test_simplified_indices_equal_the_originals_and_stay_in_their_bounds_at_every_point(depth):
    rng = np.random.default_rng(depth)
    for _ in range(150):
        probe = te.compute(EXTENTS, lambda a, b, c: _random_index(rng, [a, b, c], depth), name="probe")
        body, variables = probe.op.body, [iv.var for iv in probe.op.axis]
        ranges = dict(zip(variables, EXTENTS))
        simplified = simplify(body, ranges)
        expected, got = _values(body, variables), _values(simplified, variables)
        assert np.array_equal(got, expected), f"{body} simplified to {simplified}"
        span = bounds(body, ranges)
        if span is not None:
            assert span[0] <= expected.min() and expected.max() <= span[1], f"{body}: {span}"
