"""Tile-size sampling: every draw is a legal tiling, the draws cover the tilings
uniformly, and padded tilings come as often as ``PADDED_SHARE`` says."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.schedule.sampling import (
    PADDED_SHARE, divisors, factorizations, padded_factorizations, sample_perfect_tile, sample_tile,
    tile_factorizations,
)


@pytest.mark.parametrize("extent", [1, 7, 12, 64, 96, 1000])
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_perfect_tiles_multiply_to_the_extent_over_many_draws(extent, parts):
    rng = np.random.default_rng(extent * 10 + parts)
    for _ in range(200):
        tile = sample_perfect_tile(rng, extent, parts, 16)
        assert len(tile) == parts and math.prod(tile) == extent and tile[-1] <= 16, tile


def test_the_innermost_factor_never_exceeds_its_maximum_and_reaches_it():
    rng = np.random.default_rng(0)
    innermost = {sample_perfect_tile(rng, 64, 3, 4)[-1] for _ in range(500)}
    assert innermost == {1, 2, 4}


def test_perfect_tiles_draw_every_tiling_of_the_extent():
    rng = np.random.default_rng(1)
    drawn = {sample_perfect_tile(rng, 64, 4, 16) for _ in range(2000)}
    assert len(drawn) == 80  # 2^6 in 4 ordered parts, the last at most 2^4
    assert drawn == set(factorizations(64, 4, 16))


def test_perfect_tiles_are_drawn_uniformly():
    rng = np.random.default_rng(2)
    counts = Counter(sample_perfect_tile(rng, 12, 2, 16) for _ in range(6000))
    assert len(counts) == 6  # (1, 12) (2, 6) (3, 4) (4, 3) (6, 2) (12, 1)
    assert all(850 < n < 1150 for n in counts.values()), counts


def test_the_same_seed_draws_the_same_tiles():
    draws = [[sample_tile(np.random.default_rng(7), 96, 4, 16) for _ in range(3)] for _ in range(2)]
    assert draws[0] == draws[1]
    other = {sample_tile(np.random.default_rng(seed), 96, 4, 16) for seed in range(20)}
    assert len(other) > 5


def test_factorizations_are_all_ordered_products_each_once():
    for extent, (parts, max_innermost) in itertools.product(range(1, 25), [(1, 16), (2, 4), (3, 16), (3, 1)]):
        brute = {t for t in itertools.product(range(1, extent + 1), repeat=parts)
                 if math.prod(t) == extent and t[-1] <= max_innermost}
        found = factorizations(extent, parts, max_innermost)
        assert len(found) == len(set(found)) and set(found) == brute, (extent, parts, max_innermost)


def test_a_prime_extent_has_only_the_tilings_that_put_it_in_one_loop():
    assert set(factorizations(13, 3, 16)) == {(13, 1, 1), (1, 13, 1), (1, 1, 13)}
    assert set(factorizations(13, 3, 8)) == {(13, 1, 1), (1, 13, 1)}  # 13 is too big for the innermost


def test_divisors_are_every_divisor_in_increasing_order():
    for n in range(1, 200):
        assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)


@pytest.mark.parametrize("extent", [5, 10, 37, 100, 1024])
def test_a_padded_tiling_rounds_the_extent_up_to_a_multiple_of_its_non_dividing_innermost(extent):
    padded = padded_factorizations(extent, 3, 8)
    assert padded or extent == 1024  # 1024 has no non-dividing innermost factor up to 8 but 3, 5, 6, 7
    for tile in padded:
        inner = tile[-1]
        assert 2 <= inner <= 8 and extent % inner != 0, tile
        assert math.prod(tile) == math.ceil(extent / inner) * inner, tile


def test_padded_tilings_are_never_perfect_ones_and_come_after_them():
    perfect, padded = factorizations(10, 2, 8), padded_factorizations(10, 2, 8)
    assert set(padded) == {(4, 3), (3, 4), (2, 6), (2, 7), (2, 8)}
    assert not set(perfect) & set(padded)
    assert tile_factorizations(10, 2, 8) == perfect + padded


def test_sample_tile_pads_its_share_of_the_draws_when_the_extent_can_be_padded():
    rng = np.random.default_rng(3)
    legal = set(tile_factorizations(10, 2, 8))
    draws = [sample_tile(rng, 10, 2, 8) for _ in range(4000)]
    assert set(draws) == legal  # every tiling of either kind, nothing else
    padded_share = sum(math.prod(t) != 10 for t in draws) / len(draws)
    assert abs(padded_share - PADDED_SHARE) < 0.03, padded_share


def test_sample_tile_draws_only_perfect_tilings_when_every_allowed_innermost_divides():
    rng = np.random.default_rng(4)
    assert padded_factorizations(12, 3, 4) == ()
    assert all(math.prod(sample_tile(rng, 12, 3, 4)) == 12 for _ in range(300))


def test_a_one_factor_tiling_is_the_whole_loop_and_is_never_padded():
    rng = np.random.default_rng(0)
    assert tile_factorizations(32, 1, 64) == ((32,),)
    assert sample_tile(rng, 32, 1, 64) == (32,)


def test_a_loop_with_no_allowed_tiling_is_refused_with_what_to_change():
    dag = tc.ComputeDAG([te.placeholder((32,), name="X"), te.compute((32,), lambda i: i * 2, name="Y")])
    sch = tc.Schedule(dag)
    (loop,) = sch.get_loops(sch.get_block("Y"))
    with pytest.raises(tc.ScheduleError, match=r"extent 32 has no tiling into 1 factor\(s\) .* at most 16; ask for"):
        sch.sample_perfect_tile(loop, n=1, max_innermost_factor=16)
    with pytest.raises(tc.ScheduleError, match="at least one factor, not 0"):
        sch.sample_perfect_tile(loop, n=0)
