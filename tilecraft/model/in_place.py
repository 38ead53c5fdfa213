"""Each task's schedule chosen by its time inside the compiled model.

The tuner times a candidate alone: called again and again on the same buffers, its weights
sit in the caches. Inside a model the layers between two calls have evicted them, and the
fastest of a task's finalists alone need not be the fastest there: one waits for its weights
before it computes, another streams them while it does. So ``choose_in_place`` compiles the
model with the log's best schedules and then, task by task, the largest share of the model's
time first, builds the task's schedule in use and its next best (``_candidates``) into copies
of the model that differ only in that task's kernels (they share every other kernel's packed
weights and the buffers between kernels, so not even in where their memory lies: copies of one
model's kernels placed apart ran up to 8% apart), checks each copy's output against the
model's, and times each copy's calls of those kernels in place, in interleaved rounds (each round times every
copy once, in a rotated order, so a slow spell of a shared machine slows them all alike).
The schedule in use stays unless another beats it in a paired test (``paired_choice``): many
tasks' best few run within a percent or two of each other, and a choice by medians alone
changed a third to a half of a model's tasks at every run, back and forth with the noise. The schedule
kept stays in the model the next tasks are timed in; its seconds a call are appended to the
log as a ``"model"`` record, every other candidate's as a ``"model_rival"`` one. The kept
schedule's model record ranks first (``database/best.py``), so ``compile_model`` and every
reader of the log choose as this choice did from then on.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from ..database.best import rank
from ..database.log import append_records, load_records
from ..database.record import TuningRecord
from ..measure.worker import TOLERANCES, least_precise
from ..target import Target
from .compiled import CompiledModel, assemble, compile_kernels, example_inputs, kernel_jobs
from .tasks import ALONE, best_alone, prepare_graph

CALLS_PER_ROUND = 3  # model calls a round times each copy for: the median is one repeat
SIGNIFICANCE = 0.05  # a challenger's paired wins must be this unlikely by chance (one-sided sign test)
MIN_ROUNDS = 5  # the fewest rounds in which a challenger can win so: all 5 (p = 1/32)
WHOLE_MODEL_ROUNDS = 20  # interleaved calls of the model before and after, for the report


@dataclass(frozen=True)
class InPlaceChoice:
    """One task's candidates timed in the model: ``seconds`` a call of each (the median of
    its rounds; inf for one that failed to build or gave a wrong answer), the first being
    the schedule in use (the log ranked it first), and the index of the one ``chosen``
    (``paired_choice``)."""

    desc: str
    workload_key: str
    calls: int
    seconds: tuple[float, ...]
    chosen: int


@dataclass(frozen=True)
class InPlaceReport:
    """What ``choose_in_place`` did: a choice per task timed, and a model call's seconds
    (median of interleaved calls) with the log's schedules before and with the choices after."""

    choices: tuple[InPlaceChoice, ...]
    before_seconds: float
    after_seconds: float


def choose_in_place(model_or_graph: Any, log: str | Path, target: Target | str | None = None, candidates: int = 4,
                    rounds: int = 8, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                    min_share: float = 0.01, cache_dir: str | Path | None = None, verbose: int = 1) -> InPlaceReport:
    """Time each task's ``candidates`` best schedules inside the compiled model, keep the one
    in use unless another is faster there in a paired test, and append their times to ``log``
    (the kept one's as a model record, which ranks first): the model compiled from the log
    afterwards is the one chosen here.

    Args:
        model_or_graph: The model, as ``compile_model`` takes it.
        log: The tuning log (or SQLite store) its tasks were tuned into; the records are
            appended to it.
        target: A CPU target; None for the host.
        candidates: The schedules to time of each task: the one in use, and the next best
            by the rule without model records.
        rounds: Interleaved rounds; each times every candidate in ``CALLS_PER_ROUND`` model
            calls, their median one repeat. At least ``MIN_ROUNDS``: the schedule in use is
            replaced only by one faster in nearly every round (``paired_choice``).
        input_shapes: Sizes of the ONNX model's dynamic inputs, by input name.
        min_share: Tasks below this share of the model's time are left as they are.
        cache_dir: Where kernels are compiled and cached (see ``tc.build``).
        verbose: 0 for silence, 1 for a line per task and the whole model's time.

    Returns:
        The choices and the model's time before and after.

    Raises:
        ValueError: If ``candidates`` is below 2, ``rounds`` below ``MIN_ROUNDS``, or the target
            is a GPU.
        FileNotFoundError: If the log does not exist.
    """
    if candidates < 2 or rounds < MIN_ROUNDS:
        raise ValueError(f"choose_in_place: candidates={candidates} must be >= 2 and rounds={rounds} >= {MIN_ROUNDS}: "
                         f"another schedule replaces the one in use when it is faster in nearly every round, which "
                         f"chance alone makes in under {SIGNIFICANCE:.0%} of choices only from {MIN_ROUNDS} rounds")
    target = target if isinstance(target, Target) else Target(target)
    if target.kind != "llvm":
        raise ValueError(f"choose_in_place times a model's kernels on this machine's CPU, not on {target.kind}; "
                         "compile a GPU model from its log with tc.compile_model")
    if not Path(log).is_file():
        raise FileNotFoundError(f"the tuning log {log} does not exist; tune the model's tasks into it first "
                                "(tilecraft tune-model)")
    logged = load_records(log, target=target)  # read once, ranked two ways
    ranked = _candidates(logged, candidates)
    best = {key: records[0] for key, records in ranked.items()}
    graph = prepare_graph(model_or_graph, input_shapes, target, best_alone(logged, log))
    jobs, steps = kernel_jobs(graph, best)
    built = compile_kernels(jobs, str(log), target, cache_dir)
    unbuilt = {job.dag.workload_key for job, (_, why) in zip(jobs, built) if why}  # default schedules, left alone
    before = model = assemble(graph, steps, [kernel for kernel, _ in built], target, cache_dir)
    inputs = example_inputs(model.inputs)
    expected = model.run(inputs)

    spent: dict[str, float] = defaultdict(float)
    for timed in model.profile(inputs, rounds=rounds):
        spent[timed.workload_key] += timed.seconds
    order = [key for key in sorted(spent, key=spent.get, reverse=True) if len(ranked.get(key, ())) > 1
             and key not in unbuilt and spent[key] >= min_share * sum(spent.values())]
    choices = []
    for key in order:
        owned = [n for n, job in enumerate(jobs) if job.dag.workload_key == key]
        model, choice, records = _choose(model, key, owned, jobs, ranked[key], graph, steps, target, str(log),
                                         cache_dir, inputs, expected, rounds)
        append_records(log, records)  # as each task is timed: nothing measured is lost
        choices.append(choice)
        if verbose:
            _print_choice(choice)
    before_seconds, after_seconds = _whole_model_seconds(before, model, inputs)
    if verbose:
        print(f"whole model, interleaved: {before_seconds * 1e3:.2f} ms with the log's best schedules, "
              f"{after_seconds * 1e3:.2f} ms chosen in place ({after_seconds / before_seconds:.3f}x); "
              f"{len(choices)} tasks timed, records appended to {log}")
    return InPlaceReport(tuple(choices), before_seconds, after_seconds)


def _candidates(records: list[TuningRecord], count: int) -> dict[str, list[TuningRecord]]:
    """Per workload of a log's ``records``, the schedule in use (the best by the rule) and the
    next best by the rule among times taken alone, ``count`` in all: a schedule found since the
    last choice is timed too, however fast the schedules timed then were in the model."""
    by_workload: dict[str, list[TuningRecord]] = defaultdict(list)
    for record in records:
        by_workload[record.workload_key].append(record)
    chosen = {}
    for key, theirs in by_workload.items():
        distinct: dict[str, TuningRecord] = {}
        for record in rank(theirs)[:1] + rank([r for r in theirs if r.phase in ALONE]):
            distinct.setdefault(record.trace_json, record)
        if distinct:  # a workload whose every record failed keeps its default schedule
            chosen[key] = list(distinct.values())[:count]
    return chosen


def _choose(model: CompiledModel, key: str, owned: list[int], jobs, records: list[TuningRecord], graph, steps,
            target: Target, log: str, cache_dir, inputs, expected, rounds: int):
    """The copy of ``model`` with the kept one of ``records`` in place for ``key``'s kernels
    (at ``owned``), that task's choice, and a record per candidate: a model record of the kept
    one and of each failure, a model rival record of each other."""
    started = time.perf_counter()
    rebuilt = compile_kernels([dataclasses.replace(jobs[n], record=record) for record in records[1:] for n in owned],
                              log, target, cache_dir)
    copies: list[CompiledModel | None] = [model]
    failures = {}
    precision = least_precise(v.dtype for v in graph.values.values())  # what a copy is judged to
    for c in range(1, len(records)):
        built = rebuilt[(c - 1) * len(owned):c * len(owned)]
        why = next((reason for _, reason in built if reason), "")
        if why:
            copies.append(None)
            failures[c] = ("compile", why)
            continue
        kernels = list(model.kernels)
        for n, (kernel, _) in zip(owned, built):
            kernels[n] = kernel
        copy = assemble(graph, steps, kernels, target, cache_dir, reuse=model)  # alike but in this task's kernels
        if not _agrees(copy.run(inputs), expected, precision):
            copies.append(None)
            failures[c] = ("wrong_answer", "its model's outputs differ from the model compiled from the log's best")
            continue
        copies.append(copy)
    alive = [c for c in range(len(records)) if copies[c] is not None]
    costs: list[list[float]] = [[] for _ in records]
    calls = sum(1 for step in steps if step.kernel in owned)
    for r in range(rounds):
        for c in alive[r % len(alive):] + alive[:r % len(alive)]:
            times = copies[c].profile(inputs, rounds=CALLS_PER_ROUND)
            costs[c].append(sum(t.seconds for t in times if t.workload_key == key) / calls)
    chosen = paired_choice(costs)
    now, device, wall = time.time(), f"local@{socket.gethostname()}", time.perf_counter() - started
    measured = []
    for c, record in enumerate(records):
        kind, message = failures.get(c, ("none", ""))
        phase = "model" if c == chosen or c in failures else "model_rival"
        measured.append(dataclasses.replace(record, costs=tuple(costs[c]), error_kind=kind, error_msg=message,
                                            all_cost=wall, timestamp=now, phase=phase, device=device))
    seconds = tuple(statistics.median(costs[c]) if c in alive else float("inf") for c in range(len(records)))
    return copies[chosen], InPlaceChoice(jobs[owned[0]].desc, key, calls, seconds, chosen), measured


def paired_choice(costs: list[list[float]]) -> int:
    """Which candidate to keep, given each one's seconds by round (none for a failed one):
    0, the schedule in use, unless others beat it in so many rounds that chance alone would
    make as many in under ``SIGNIFICANCE`` of choices (a one-sided sign test on the rounds,
    where every candidate was timed once in a rotated order); then the fastest of those by
    its median."""
    rounds = len(costs[0])

    def beats_the_one_in_use(c: int) -> bool:
        wins = sum(theirs < ours for ours, theirs in zip(costs[0], costs[c]))
        chance = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2 ** rounds
        return chance <= SIGNIFICANCE and statistics.median(costs[c]) < statistics.median(costs[0])

    winners = [c for c in range(1, len(costs)) if costs[c] and beats_the_one_in_use(c)]
    return min(winners, key=lambda c: statistics.median(costs[c]), default=0)


def _agrees(outputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], precision: str) -> bool:
    """Whether a copy's outputs match the model's, to the rounding of a reordered sum in float32,
    or in the least precise type the model computes in (``precision``: a bfloat16 model's
    kernels, each rounding its output, differ by its ulps)."""
    tolerance = max(1e-3, TOLERANCES.get(precision, (0.0,))[0])
    return all(np.allclose(outputs[name].astype(np.float64), wide := want.astype(np.float64), rtol=tolerance,
                           atol=tolerance * float(np.max(np.abs(wide), initial=1.0)))
               for name, want in expected.items())


def _whole_model_seconds(before: CompiledModel, after: CompiledModel, inputs) -> tuple[float, float]:
    """A call's seconds of each model, the median of ``WHOLE_MODEL_ROUNDS`` interleaved calls."""
    seconds: tuple[list[float], list[float]] = ([], [])
    for _ in range(WHOLE_MODEL_ROUNDS):
        for model, spent in zip((before, after), seconds):
            started = time.perf_counter()
            model.run(inputs)
            spent.append(time.perf_counter() - started)
    return statistics.median(seconds[0]), statistics.median(seconds[1])


def _print_choice(choice: InPlaceChoice) -> None:
    """One line: the task, then each candidate's milliseconds a call in the model, the chosen one starred."""
    times = " ".join(f"{s * 1e3:.3f}{'*' if n == choice.chosen else ''}" if s < float("inf") else "failed"
                     for n, s in enumerate(choice.seconds))
    print(f"{choice.desc:<44} {choice.calls:>3} calls, ms a call in the model: {times}", flush=True)
