"""A round's candidates built and measured: GPU kernels timed while the rest still compile.

A round builds its candidates on the CPU's cores, then measures them on the device, one at
a time. For a CPU target the two must take turns, since a compilation running beside a
timing slows it. A GPU kernel is timed by the GPU's own clock, so its measurement can start
on the first candidates built while the others still compile: the round then lasts about
as long as its longer half, not both. On the H100 host, building was most of a GPU
search's time and measuring the rest (a 2048³ matmul: 43 s and 11 s of 58), and one
candidate that compiles for seconds held every other's measurement back.

CUDA compilations run at a lower priority than the rest (``runtime/compiler.py``,
``BACKGROUND_NICENESS``), so that the process launching and checking the kernels takes a
core whenever it needs one: a timing is never kept waiting between its start and its
kernel's launch, and every core still compiles.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Sequence

from .result import MeasureInput, MeasureResult


def build_and_run(inputs: Sequence[MeasureInput], builder: Any, runner: Any,
                  on_result: Callable[[int, MeasureResult], None] | None = None,
                  overlap: bool = False) -> tuple[list[MeasureResult], float, float]:
    """Build and measure ``inputs``; each result also goes to ``on_result(index, result)``
    as soon as it is known. With ``overlap`` (and a builder that can ``start``), the built
    candidates are measured in order while the later ones build, in runs of at least as
    many as the runner measures at once (its ``measures_at_once``, else 1).

    Returns:
        The results in input order, the seconds spent waiting for builds, and the seconds
        spent measuring.
    """
    if not overlap or not hasattr(builder, "start"):
        clock = perf_counter()
        builds = builder.build(inputs)
        build_secs, clock = perf_counter() - clock, perf_counter()
        results = runner.run(inputs, builds, on_result=on_result)
        return results, build_secs, perf_counter() - clock
    futures = builder.start(inputs)
    at_once = max(1, getattr(runner, "measures_at_once", 1))
    results: list[MeasureResult] = []
    build_secs = run_secs = 0.0
    while (first := len(results)) < len(inputs):
        clock = perf_counter()
        end = min(first + at_once, len(inputs))
        builds = [future.result() for future in futures[first:end]]
        while end < len(inputs) and futures[end].done():  # all that are ready: fewer, longer runs
            builds.append(futures[end].result())
            end += 1
        build_secs, clock = build_secs + perf_counter() - clock, perf_counter()
        report = None if on_result is None else (lambda index, result, first=first: on_result(first + index, result))
        results += runner.run(inputs[first:end], builds, on_result=report)
        run_secs += perf_counter() - clock
    return results, build_secs, run_secs
