"""Sampling of schedule decisions: tile sizes and categorical choices."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every way to write ``extent`` as an ordered product of ``parts`` factors, innermost <= max_innermost."""
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


def sample_perfect_tile(rng: np.random.Generator, extent: int, parts: int, max_innermost: int) -> tuple[int, ...]:
    """A factorization drawn uniformly from all of them (Ansor's InitFillTileSize)."""
    choices = factorizations(extent, parts, max_innermost)
    return choices[int(rng.integers(len(choices)))]
