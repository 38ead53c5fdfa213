"""The re-measurement that ends a tuning: the number a user will see when they time the kernel.

While searching, each candidate is measured once, and the best of hundreds of noisy
measurements is chosen for being high (the winner's curse); the search's worker has
also run hundreds of kernels before it. So when the search ends, its finalists (the
fastest few and the fastest of every sketch) are built again and measured in a fresh
worker, interleaved: each round measures every finalist once, in a rotated order, so a
slow spell of a shared machine slows them all alike. Each finalist's repeats become one
``"final"`` record, and the schedules rank by the median of those repeats
(``database/best.py``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..measure import MeasureErrorKind, MeasureInput, MeasureResult
from ..schedule.trace import Trace


def remeasure(task: Any, finalists: Sequence[tuple[Trace, str | None]], builder: Any, runner: Any, repeats: int,
              callbacks: Sequence[Callable] = ()) -> list[MeasureResult]:
    """Measure ``finalists`` (traces with their sketch names) of ``task`` again, ``repeats``
    interleaved rounds of one call each, in a fresh worker on one device when the runner can
    start one (``on_one_device``: the first of its GPUs, servers or actors), every finalist
    timed in full; give each callback the final results and return them, in the order of
    ``finalists``. A finalist that fails in any round is an error of its kind."""
    if not finalists:
        return []
    inputs = [MeasureInput(task.compute_dag, task.target, trace) for trace, _ in finalists]
    builds = builder.build(inputs)
    changes = {"repeat": 1, "stop_slow_candidates": False}
    fresh = runner.on_one_device(**changes) if hasattr(runner, "on_one_device") else runner
    costs: list[list[float]] = [[] for _ in inputs]
    failed: dict[int, MeasureResult] = {n: _failed(b) for n, b in enumerate(builds)
                                        if b.error_kind is not MeasureErrorKind.NONE}
    spent = [b.time_cost for b in builds]
    device = None
    try:
        for round_index in range(repeats):
            alive = [n for n in range(len(inputs)) if n not in failed]
            order = alive[round_index % len(alive):] + alive[:round_index % len(alive)] if alive else []
            for n, result in zip(order, fresh.run([inputs[n] for n in order], [builds[n] for n in order])):
                spent[n] += result.all_cost
                device = result.device or device
                if result.is_valid:
                    costs[n] += result.costs
                else:
                    failed[n] = result
    finally:
        if fresh is not runner:
            fresh.close()
    now = time.time()
    results = [MeasureResult((), failed[n].error_kind, failed[n].error_msg, spent[n], now, "final", device)
               if n in failed else MeasureResult(tuple(costs[n]), MeasureErrorKind.NONE, "", spent[n], now, "final",
                                                 device)
               for n in range(len(inputs))]
    for callback in callbacks:
        callback(task, inputs, results, sketches=[sketch for _, sketch in finalists])
    return results


def _failed(build: Any) -> MeasureResult:
    return MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time.time())
