"""Wall-clock timing of a kernel with TVM's ``time_evaluator`` semantics.

Tuning ranks candidates by these numbers and reports compare them with TVM's, so the
protocol is TVM's: one untimed warm-up call, then ``repeat`` measurements, each the mean
of ``number`` back-to-back calls, with ``number`` grown until a measurement lasts at
least ``min_repeat_ms``. With a cache flush, every call starts from cold caches and only
the calls themselves are timed, never the flush.

One guard TVM lacks: ``number`` is grown from how long the first calls took, and on a
shared machine a slow spell can then make the grown batch last a thousand times longer
(a 6 us kernel grown to 16,000 calls ran 8 ms a call while its threads waited for a
core: two minutes). So the calls beyond the first ``number`` stop once the repeat has run
``DEADLINE_FACTOR`` times ``min_repeat_ms``; the repeat is then their mean, a slow reading
that a median over repeats leaves out, instead of a measurement killed by a timeout.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Callable

import numpy as np

DEADLINE_FACTOR = 10  # a repeat's grown calls stop after this many times min_repeat_ms
_CHECK_EVERY = 16  # calls between looks at the clock while a grown batch runs: ~60 ns a look


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
        deadline = None  # the first ``number`` calls always run
        while True:
            spent, made = _run(fn, batch, flush, deadline)
            total_secs, calls = total_secs + spent, calls + made
            if total_secs * 1e3 >= min_repeat_ms or made < batch:
                break
            deadline = deadline or perf_counter() - total_secs + DEADLINE_FACTOR * min_repeat_ms / 1e3
            per_call_ms = max(total_secs * 1e3 / calls, 1e-6)
            batch = int((min_repeat_ms - total_secs * 1e3) / per_call_ms) + 1
        results.append(total_secs / calls)
        number = calls  # the next repeats start at the size that was enough
    return ProfileResult(tuple(results))


def _run(fn: Callable[[], object], number: int, flush: Callable[[], object] | None,
         deadline: float | None = None) -> tuple[float, int]:
    """Seconds spent inside ``number`` calls of ``fn``, and the calls made: fewer when the
    clock passes ``deadline`` (a ``perf_counter`` time), looked at every few calls."""
    if flush is None:
        start = perf_counter()
        if deadline is None:
            for _ in range(number):
                fn()
            return perf_counter() - start, number
        made = 0
        while made < number:
            for _ in range(min(_CHECK_EVERY, number - made)):
                fn()
            made += min(_CHECK_EVERY, number - made)
            if perf_counter() > deadline:
                break
        return perf_counter() - start, made
    total_secs, made = 0.0, 0
    while made < number and (deadline is None or perf_counter() <= deadline):
        flush()
        start = perf_counter()
        fn()
        total_secs += perf_counter() - start
        made += 1
    return total_secs, made


def cache_flusher(nbytes: int) -> Callable[[], None]:
    """A function that evicts the CPU caches by reading and writing ``nbytes`` (choose
    more than the L3). Read-modify-write, because a plain large fill may use
    non-temporal stores that bypass the caches."""
    buffer = np.zeros(nbytes, dtype=np.uint8)

    def flush() -> None:
        np.add(buffer, 1, out=buffer)

    return flush
