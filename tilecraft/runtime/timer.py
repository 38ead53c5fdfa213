"""Wall-clock timing of a kernel with TVM's ``time_evaluator`` semantics.

Tuning ranks candidates by these numbers and reports compare them with TVM's, so the
protocol is TVM's: one untimed warm-up call, then ``repeat`` measurements, each the mean
of ``number`` back-to-back calls, with ``number`` grown until a measurement lasts at
least ``min_repeat_ms``. With a cache flush, every call starts from cold caches and only
the calls themselves are timed, never the flush.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Callable

import numpy as np


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """Seconds per call, one entry per repeat."""

    results: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.results:
            raise ValueError("ProfileResult needs at least one measurement; time with repeat >= 1")

    @property
    def mean(self) -> float:
        """Seconds per call, averaged over the repeats."""
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        """Seconds per call of the median repeat, the figure least moved by a noisy repeat."""
        return statistics.median(self.results)

    @property
    def min(self) -> float:
        """Seconds per call of the fastest repeat."""
        return min(self.results)

    @property
    def max(self) -> float:
        """Seconds per call of the slowest repeat."""
        return max(self.results)

    @property
    def std(self) -> float:
        """Population standard deviation, as NumPy's ``std`` (0 for one repeat)."""
        return statistics.pstdev(self.results)


def time_callable(fn: Callable[[], object], number: int = 10, repeat: int = 3, min_repeat_ms: float = 0.0,
                  flush: Callable[[], object] | None = None, warmup: bool = True) -> ProfileResult:
    """Time ``fn()``; ``flush``, when given, runs untimed before every timed call. The
    untimed first call can be skipped (``warmup=False``) when the caller just ran ``fn``."""
    for name, value, least in (("number", number, 1), ("repeat", repeat, 1), ("min_repeat_ms", min_repeat_ms, 0)):
        if value < least:
            raise ValueError(f"time_callable: {name}={value} must be >= {least}")
    if warmup:
        fn()
    results = []
    for _ in range(repeat):
        # At least ``number`` calls and ``min_repeat_ms``. Unlike TVM, which restarts with a
        # larger number when a batch is too short, later batches add to the first: the
        # same accuracy, without throwing away up to half of a tuner's measuring time.
        total_secs, calls, batch = 0.0, 0, number
        while True:
            total_secs += _run(fn, batch, flush)
            calls += batch
            if total_secs * 1e3 >= min_repeat_ms:
                break
            per_call_ms = max(total_secs * 1e3 / calls, 1e-6)
            batch = int((min_repeat_ms - total_secs * 1e3) / per_call_ms) + 1
        results.append(total_secs / calls)
        number = calls  # the next repeats start at the size that was enough
    return ProfileResult(tuple(results))


def _run(fn: Callable[[], object], number: int, flush: Callable[[], object] | None) -> float:
    """Seconds spent inside ``number`` calls of ``fn``."""
    if flush is None:
        start = perf_counter()
        for _ in range(number):
            fn()
        return perf_counter() - start
    total_secs = 0.0
    for _ in range(number):
        flush()
        start = perf_counter()
        fn()
        total_secs += perf_counter() - start
    return total_secs


def cache_flusher(nbytes: int) -> Callable[[], None]:
    """A function that evicts the CPU caches by reading and writing ``nbytes`` (choose
    more than the L3). Read-modify-write, because a plain large fill may use
    non-temporal stores that bypass the caches."""
    buffer = np.zeros(nbytes, dtype=np.uint8)

    def flush() -> None:
        np.add(buffer, 1, out=buffer)

    return flush
