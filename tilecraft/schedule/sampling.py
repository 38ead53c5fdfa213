"""Sampling of schedule decisions: tile sizes and categorical choices."""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ScheduleError

PADDED_SHARE = 0.5  # of random tilings, the share that pads the loop (when it can be padded)


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every way to write ``extent`` as an ordered product of ``parts`` factors, innermost <= max_innermost."""
    if parts < 1:
        raise ScheduleError(f"a tiling needs at least one factor, not {parts}")
    if parts == 1:
        return ((extent,),) if extent <= max_innermost else ()
    results = []
    for outer in divisors(extent):
        for rest in factorizations(extent // outer, parts - 1, max_innermost):
            results.append((outer,) + rest)
    return tuple(results)


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=4096)
def padded_factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Tilings whose innermost factor does not divide ``extent``: the extent is rounded up
    to a multiple of it and the partial last tile is guarded. A 1024-row matmul gets its
    6-row register tiles this way."""
    if parts < 2:  # one factor is the whole loop: nothing to pad
        return ()
    results = []
    for inner in range(2, min(max_innermost, extent) + 1):
        if extent % inner:
            padded = -(-extent // inner)
            results += [rest + (inner,) for rest in factorizations(padded, parts - 1, padded)]
    return tuple(results)


def sample_perfect_tile(rng: np.random.Generator, extent: int, parts: int, max_innermost: int) -> tuple[int, ...]:
    """A factorization drawn uniformly from all of them (Ansor's InitFillTileSize)."""
    choices = factorizations(extent, parts, max_innermost)
    if not choices:
        raise ScheduleError(f"a loop of extent {extent} has no tiling into {parts} factor(s) with the innermost at "
                            f"most {max_innermost}; ask for more factors or a larger max_innermost_factor")
    return choices[int(rng.integers(len(choices)))]


@functools.lru_cache(maxsize=4096)
def tile_factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """The decisions of ``sample_tile``: perfect tilings first, then padded ones."""
    return factorizations(extent, parts, max_innermost) + padded_factorizations(extent, parts, max_innermost)


def sample_tile(rng: np.random.Generator, extent: int, parts: int, max_innermost: int) -> tuple[int, ...]:
    """A perfect tiling or, as often, a padded one, each uniformly among its kind."""
    padded = padded_factorizations(extent, parts, max_innermost)
    if padded and rng.random() < PADDED_SHARE:
        return padded[int(rng.integers(len(padded)))]
    return sample_perfect_tile(rng, extent, parts, max_innermost)
