"""Ablation of the search policies: the sketch bandit and the learned mutation policy.

    python benchmarks/ablation.py [--trials 1000] [--seeds 3] [--only matmul_1024,dense]
                                  [--arms baseline,both] [--live] [--remeasure N]
                                  [--no-defaults] [--transfer-rows N] [--records DIR] [--out FILE]
    python benchmarks/ablation.py --tables RESULTS.json [RESULTS.json ...]

Four arms, the same trial budget and seeds each:

    baseline   sketch_policy="uniform", mutation_policy="fixed"   (Ansor's)
    bandit     sketch_policy="bandit",  mutation_policy="fixed"
    predictor  sketch_policy="uniform", mutation_policy="learned"
    both       sketch_policy="bandit",  mutation_policy="learned"

and any of them with modifiers joined by "+" (``--arms baseline,both+ties+transfer``):

    +scored-slots   the sketch shares split only the random population; the measurement
                    slots go by the cost model's ranking alone (SearchParams.sketch_quotas)
    +quotas         the sketch shares set quotas of the measurement slots even for a cost model
                    taught before the search (+transfer), which by default leaves them to its ranking
    +ties           the bandit counts a sketch whose best is within 5% of the task's best as
                    level with it (SearchParams.sketch_tie)
    +gentle         the bandit's softmax runs at temperature GENTLE (SearchParams.sketch_temperature)
    +reseeded       the same search on other random streams (seeds from RESEED on): "baseline+reseeded"
                    is the null, how far the baseline's own seed luck moves every share
    +transfer       the cost model first learns a sample of the other workloads' records
                    (``tilecraft.tune.transfer``; ``--transfer-rows`` of each), as a user's
                    can who tuned other operators on the machine before; a whole model's
                    shared one learns tilecraft's default database, as ``tune-model``'s does
    +short-warm-up  whole models only: the task scheduler warms each task up with
                    SHORT_WARM_UP trials instead of a whole round (``TaskScheduler(warm_up_trials=...)``)

The modifiers of finished studies whose code left tilecraft (REMOVED: +local, +basins,
+measured, +walk) are refused by --arms with the write-up that holds their result; saved
results whose arms name them still print with --tables, where an arm's name is a label.

The workloads are single operators, and, when named in --only, whole models tuned by the
task scheduler (``--only resnet50 --trials 4000``; exporting the model needs torch). A
model's curve is its throughput: all its FLOPs over the weighted sum of its tasks' best
latencies. Its record takes in what the log benchmarks/models.py keeps for it holds of
this machine's target (once; ``archive.merge``).

Every search measures each sketch's default schedule first (SearchParams.defaults_first),
as tilecraft's tuning does. Where a default already sits on the plateau (matmul 1024, the
1x1 convolution) that leaves a policy little to find; ``--no-defaults`` searches from
random samples only, as Ansor does, which measures the search itself.

By default the searches run against a replay of recorded measurements, so that the
comparison is cheap to repeat and not hostage to the load on a shared machine: each
workload has a record (a tuning log in ``--records``) keyed by the trace of a schedule. A
candidate the record holds costs what the record says; one it does not hold is built and
measured live and added to the record, so the record grows with every run and later runs
replay more. Every arm thus sees one fixed cost per schedule. Live costs measured while
the machine is faster than when the record began are scaled by a reference candidate
measured around them (``Measurements``); the scales applied are in the output. ``--live`` measures
everything afresh instead. The records are kept in the repository (``--archive``,
xz-compressed) and unpacked into ``--records`` when missing there.

Time is simulated the same way for every arm: the search and cost-model seconds the arm
really spent, plus each measured candidate's recorded build-and-run seconds (its
``all_cost``; builds count one after another, though the tuner builds in parallel).

Reported per workload and arm: the best GFLOPS after all trials (mean and range over
seeds), and the trials and simulated time the arm's mean curve needs to reach the
baseline's final mean best, as a share of the baseline's budget and time; and the same
for coming within 1% of it (the measurement noise). Where the null arm ran, the baseline's
final and time are means over its seeds and the null's together, and the null's row says
what the baseline's own luck does to every share. ``--tables`` prints these tables
again, and their means over workloads, from the results of earlier runs. Beside the means,
the seeds are drawn again with replacement (a bootstrap, ``bootstrap_shares``): the range
that holds 90% of the redrawn mean trial shares, and how often a redraw meets the bar
(trial and time shares both at most 0.60), so a share is read with its seed noise. A PNG
per workload plots best GFLOPS against trials and time (mean, and the range over seeds).

The bar's level sits where the baseline's curve is flat, so which arm reaches it first is
mostly the seeds' luck. Each arm's pace is judged too: the trials and time its mean curve
needs to come within 3% of the baseline's final, over the trials and time the baseline's
own mean curve needs. A pace of 0.5 is twice the baseline's speed; the means print it
with its redrawn range and how often a redraw has both paces at most 0.60. Above about
95% of the final the curves are flat within what one measurement resolves on a noisy
machine, so a pace there still carries luck (docs/experiments/timed-best-and-pace.md).

A search's best is the best of many noisy measurements, and reads high by the luck of
when each was measured. So at the end of a workload every schedule any search believed
best (recorded within 10% of the best final) is timed anew in one sitting, three passes
in random order, and each run gets a second curve: at each trial, the timed speed of the
schedule its search then believed best, what its user would get (``true_curves``). The
tables are printed for both curves; ``--no-sitting`` leaves the sitting out.
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.database.record import trace_key
from tilecraft.measure import LocalBuilder, LocalRunner, MeasureErrorKind, MeasureInput, MeasureResult
from tilecraft.schedule.trace import Trace
from tilecraft.search.default import default_schedule
from tilecraft.search.evolution import SearchParams
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.shared_model import SharedCostModel
from tilecraft.tune.transfer import DEFAULT_RECORDS, TRANSFER_ROWS, transfer_model

from archive import merge, restore, save  # benchmarks/archive.py, beside this script
from tables import numeric_table, print_table  # benchmarks/tables.py

WORKLOADS = {
    "conv2d_r50_3x3": ("conv2d_nhwc", (1, 56, 56, 64, 64, 3, 3, 1, 1)),
    "conv2d_r50_1x1": ("conv2d_nhwc", (1, 56, 56, 256, 64, 1, 1, 1, 0)),
    "conv2d_r50_3x3_s2": ("conv2d_nhwc", (1, 56, 56, 128, 128, 3, 3, 2, 1)),
    "matmul_1024": ("matmul", (1024, 1024, 1024)),
    "dense_1x2048x1000": ("dense", (1, 2048, 1000)),
    "batch_matmul_12x128x64": ("batch_matmul", (12, 128, 64, 128)),
}
# For a quick look (--only matmul_128), and the README's first tuning (--only matmul_512 --trials 200).
QUICK = {"matmul_128": ("matmul", (128, 128, 128)), "matmul_512": ("matmul", (512, 512, 512))}
# Whole models, tuned by the task scheduler: name (benchmarks/model_zoo.py) -> the log of
# benchmarks/models.py whose records of this target join the record. Run only when named in --only.
MODELS = {"resnet50": "resnet50_tuning"}
SHORT_WARM_UP = 16  # trials of each task's warm-up round in the +short-warm-up arms (Ansor's: 64)
GENTLE = 0.2  # the +gentle arms' bandit temperature: a 10% lead buys 1.65x the share, not 7.4x
TIE = 0.05  # the +ties arms: sketches within 5% of the task's best (the seeds' spread) count as level
RESEED = 1000  # the +reseeded arms' seeds are the run's seeds plus this, so they share none with the others
NULL = "baseline+reseeded"  # the null arm: more of the baseline's seeds, which the baseline's final pools


class Arm(NamedTuple):
    """A search policy the ablation compares; the fields past the first two come from modifiers,
    and those that are SearchParams' default to its defaults."""
    sketch_policy: str
    mutation_policy: str
    transfer: bool = False  # the cost model first learns the other workloads' records
    warm_up_trials: int | None = None  # of each task's warm-up round in a model (None: a whole round)
    sketch_quotas: bool | None = SearchParams.sketch_quotas  # the sketch shares set quotas of the slots
    sketch_tie: float = SearchParams.sketch_tie  # the bandit counts sketches this close to the task's best as level
    sketch_temperature: float = SearchParams.sketch_temperature  # the bandit's softmax temperature
    reseed: int = 0  # added to each search's seed: the same policy on other random streams

    def params(self, defaults_first: bool) -> SearchParams:
        return SearchParams(sketch_quotas=self.sketch_quotas, sketch_tie=self.sketch_tie,
                            sketch_temperature=self.sketch_temperature,
                            defaults_first=defaults_first)


# An arm is named by a policy pair and any modifiers after it, joined by "+": "both+ties+transfer".
POLICIES = {"baseline": ("uniform", "fixed"), "bandit": ("bandit", "fixed"), "predictor": ("uniform", "learned"),
            "both": ("bandit", "learned")}
MODIFIERS = {"transfer": {"transfer": True}, "scored-slots": {"sketch_quotas": False},
             "quotas": {"sketch_quotas": True}, "ties": {"sketch_tie": TIE}, "gentle": {"sketch_temperature": GENTLE},
             "reseeded": {"reseed": RESEED}, "short-warm-up": {"warm_up_trials": SHORT_WARM_UP}}
# Modifiers of finished studies whose code left tilecraft (at commit 797298c) -> the write-up of each.
# Saved results still name them; --tables reads those names as labels and never calls arm_of.
REMOVED = {"local": "docs/experiments/local-search.md", "basins": "docs/experiments/basins.md",
           "measured": "docs/experiments/measured-mutations.md", "walk": "docs/experiments/untrained-walk.md"}


def arm_of(name: str) -> Arm:
    """The arm a name such as "both+ties+transfer" stands for."""
    policies, *modifiers = name.split("+")
    for modifier in modifiers:
        if modifier in REMOVED:
            raise ValueError(f"arm {name!r}: +{modifier} was a study whose code left tilecraft; its result is in "
                             f"{REMOVED[modifier]} (the code at commit 797298c). Saved results naming it still "
                             f"print with --tables")
    if policies not in POLICIES or any(m not in MODIFIERS for m in modifiers) or len(set(modifiers)) < len(modifiers):
        raise ValueError(f"unknown arm {name!r}: name one of {', '.join(POLICIES)}, then any of "
                         f"{', '.join('+' + m for m in MODIFIERS)} once each (both+ties+transfer, say)")
    fields = dict(zip(Arm._fields, POLICIES[policies]))
    return Arm(**(fields | {k: v for m in modifiers for k, v in MODIFIERS[m].items()}))


DEFAULT_ARMS = ("baseline", "bandit", "predictor", "both")
PER_ROUND = 64
CHECKPOINT_SECONDS = 15 * 60
# The second, looser level the shares are reported at: within the measurement noise
# (about 1%) of the baseline's final mean best. Reaching the final itself is luck when the
# default schedule already sits on the plateau (conv2d_r50_1x1).
NEAR = 0.99
# A third level, where the curves still climb steeply: within 3% of the baseline's final.
# On flat curves the first two are reached by whichever arm had the luckier seeds; this
# one is where a policy's speed shows (docs/experiments/timed-best-and-pace.md).
STEEP = 0.97
# The bar: the share of the baseline's trials (and time) in which an arm's mean
# over the workloads must reach the baseline's final best. The pace (``summarise``) is
# judged against it too: the trials and time an arm needs to come within STEEP of that
# final, over the baseline's own.
BAR = 0.60
# The levels, as shares of the baseline's final, each arm's pace is printed at: below about 95%
# the curves still climb, and there a policy's speed can show where this machine's noise decides
# the plateau (docs/experiments/timed-best-and-pace.md). The last is STEEP.
LEVELS = (0.85, 0.90, 0.95, STEEP)
BOOTSTRAP_DRAWS = 1000
# The sitting that times the schedules each search believes best (``true_curves``): passes
# over them, and the share of the best final below which a schedule is not timed again.
SITTING_PASSES = 3
FLOOR = 0.9
CURVES = {"best_gflops": "as recorded", "true_gflops": "the believed best, timed in one sitting"}  # judged on
SCALE_CHUNK = 32  # live measurements between two of the reference
SCALE_WINDOW = 9  # chunks (a few minutes) over which the reference's cost is a median
REFERENCE = "reference"  # the sketch name that marks the reference's measurement setting a record's speed


def transfers(arms: list[str]) -> bool:
    """Whether any of ``arms`` starts from a model taught the other workloads' records."""
    return any(arm_of(arm).transfer for arm in arms)


class Measurements:
    """Costs of candidates: from the record when it holds them, else measured live (and
    then added to the record, unless ``live``, which measures everything).

    Live costs are never read faster than the machine was when the record began. Every
    chunk of live measurements is bracketed by two measurements of a reference candidate
    (the task's default schedule); when the reference now runs faster than the cost that
    set the record's speed (recorded under the sketch name REFERENCE), the chunk's costs
    are multiplied by the ratio. On a shared machine the
    speed moves by up to 1.5x over hours, and unscaled, all arms' best-so-far curves
    jumped together in the round it got faster. Costs are never scaled down: the load of
    the other tenants is intermittent, so a slowed reference says little about the
    candidates measured beside it, and dividing by it made chunks read up to 1.35x fast
    (above the machine's peak); a wrongly fast candidate becomes every arm's best. The
    reference's cost now is the median over the last SCALE_WINDOW chunks of the faster of
    its two measurements."""

    def __init__(self, task: tc.SearchTask, record: Path, live: bool, runner: LocalRunner):
        self.task = task
        recorded = load_records(record, task.workload_key, task.target) if record.exists() and not live else []
        self.known: dict[str, tuple[float, float]] = {}  # trace key -> (latest cost, first measurement's seconds)
        self.sketch_of = {r.trace_json: r.sketch for r in recorded}
        for r in recorded:
            first = self.known.get(r.trace_json)
            self.known[r.trace_json] = (r.mean_cost, first[1] if first else r.all_cost)
        reference = default_schedule(task.compute_dag, task.target).trace
        self.reference = MeasureInput(task.compute_dag, task.target, reference)
        reference_key = trace_key(reference)
        self.reference_cost = next((r.mean_cost for r in reversed(recorded)  # the speed the record is kept at
                                    if r.trace_json == reference_key and r.sketch == REFERENCE), None)
        self.scales: list[float] = []  # of every chunk measured live, in order
        self.reference_now: list[float] = []  # the reference's cost around every chunk
        self.builder, self.runner = LocalBuilder(), runner  # the runner is shared by a model's tasks
        self.write = tc.RecordToFile(record)
        self.replayed = self.measured = 0

    def _measure(self, traces: list[Trace], sketches: list[str]) -> list[MeasureResult]:
        """Measure ``traces`` live, slowed to the record's speed, and record them."""
        scaled = []
        for at in range(0, len(traces), SCALE_CHUNK):
            inputs = [MeasureInput(self.task.compute_dag, self.task.target, t) for t in traces[at:at + SCALE_CHUNK]]
            bracketed = [self.reference, *inputs, self.reference]
            before, *results, after = self.runner.run(bracketed, self.builder.build(bracketed))
            if not (before.is_valid and after.is_valid):
                raise RuntimeError(f"the reference (default) schedule of {self.task.desc} failed: "
                                   f"{before.error_msg or after.error_msg}")
            self.reference_now.append(min(before.mean_cost, after.mean_cost))
            if self.reference_cost is None:  # a new record, or a re-measuring sitting: this speed becomes the record's
                self.reference_cost = self.reference_now[-1]
                self.write(self.task, [self.reference], [min(before, after, key=lambda r: r.mean_cost)],
                           sketches=[REFERENCE])
            scale = max(1.0, self.reference_cost / float(np.median(self.reference_now[-SCALE_WINDOW:])))
            self.scales.append(scale)
            results = [replace(r, costs=tuple(c * scale for c in r.costs)) for r in results]
            self.write(self.task, inputs, results, sketches=sketches[at:at + SCALE_CHUNK])
            scaled += results
        return scaled

    def remeasure(self, count: int, seed: int = 0) -> None:
        """Measure the ``count`` fastest recorded candidates again, in one sitting and in
        random order, and replay their new costs (failures keep the old ones): records
        made before costs were scaled, or scaled by another reference, come onto this scale.
        The sitting sets the record's speed anew: the reference's earlier cost belongs to
        whatever the machine's speed was then (one read 1.6x slower than this sitting)."""
        self.reference_cost = None
        best = sorted((cost, key) for key, (cost, _) in self.known.items() if np.isfinite(cost))[:count]
        keys = [key for _, key in best]
        np.random.default_rng(seed).shuffle(keys)
        results = self._measure([Trace.from_json(json.loads(key)) for key in keys],
                                [self.sketch_of.get(key, "") for key in keys])
        for key, result in zip(keys, results):
            if result.is_valid:
                self.known[key] = (result.mean_cost, self.known[key][1])

    def sitting(self, keys: list[str], passes: int = SITTING_PASSES, seed: int = 0) -> dict[str, float]:
        """The cost of each schedule in ``keys`` measured anew in one sitting: ``passes`` times,
        each pass in its own random order, the median kept (inf where every pass failed). The
        record is left as it was, so later replays still reproduce this run's curves."""
        traces = {key: MeasureInput(self.task.compute_dag, self.task.target, Trace.from_json(json.loads(key)))
                  for key in keys}
        built = dict(zip(keys, self.builder.build([traces[key] for key in keys])))
        costs: dict[str, list[float]] = {key: [] for key in keys}
        rng = np.random.default_rng(seed)
        for _ in range(passes):
            order = list(rng.permutation(keys))
            for key, result in zip(order, self.runner.run([traces[k] for k in order], [built[k] for k in order])):
                costs[key].append(result.mean_cost if result.is_valid else np.inf)
        return {key: float(np.median(values)) for key, values in costs.items()}

    def costs(self, traces, sketches) -> tuple[list[float], list[float]]:
        """(mean cost, seconds the measurement took) per trace."""
        keys = [trace_key(t) for t in traces]
        missing = [n for n, k in enumerate(keys) if k not in self.known]
        if missing:
            results = self._measure([traces[n] for n in missing], [sketches[n] for n in missing])
            for n, result in zip(missing, results):
                self.known[keys[n]] = (result.mean_cost, result.all_cost)
                self.sketch_of[keys[n]] = sketches[n]
        self.measured += len(missing)
        self.replayed += len(keys) - len(missing)
        return [self.known[k][0] for k in keys], [self.known[k][1] for k in keys]


class Search:
    """One arm's search with one seed, advanced a round at a time; it keeps the best
    GFLOPS and the simulated seconds after each trial."""

    def __init__(self, task: tc.SearchTask, measurements: Measurements, arm: str, seed: int, trials: int,
                 taught: SharedCostModel | None, defaults_first: bool = True, teaching_secs: float = 0.0):
        """``teaching_secs``: how long teaching ``taught`` took, which a +transfer arm's clock
        starts with, as its user waits for it before the first round."""
        chosen = arm_of(arm)
        model = copy.deepcopy(taught) if chosen.transfer else None  # each search learns on from its own copy
        self.policy = SketchPolicy(task, model, chosen.params(defaults_first), seed=seed + chosen.reseed,
                                   sketch_policy=chosen.sketch_policy, mutation_policy=chosen.mutation_policy)
        self.measurements = measurements
        self.arm, self.seed, self.trials = arm, seed, trials
        self.flop = task.compute_dag.flop_count()
        self.best_gflops: list[float] = []
        self.seconds: list[float] = []
        self.believed: list[tuple[int, str]] = []  # (trial, trace key) where the best measured changed
        self.best_cost, self.exhausted = np.inf, False
        self.simulated = teaching_secs if chosen.transfer else 0.0

    @property
    def done(self) -> bool:
        return self.exhausted or len(self.best_gflops) >= self.trials

    def round(self) -> None:
        policy = self.policy
        started = time.perf_counter()
        candidates = policy.next_batch(min(PER_ROUND, self.trials - len(self.best_gflops)))
        if not candidates:
            self.exhausted = True
            return
        searched = time.perf_counter() - started
        traces = [policy.trace_of(c) for c in candidates]
        costs, seconds = self.measurements.costs(traces, [policy.sketches[c.sketch].name for c in candidates])
        started = time.perf_counter()
        policy.update(candidates, costs)
        self.simulated += searched + time.perf_counter() - started
        for trace, cost, spent in zip(traces, costs, seconds):
            if cost < self.best_cost:
                self.best_cost = cost
                self.believed.append((len(self.best_gflops), trace_key(trace)))
            self.simulated += spent if np.isfinite(spent) else 0.0
            self.best_gflops.append(self.flop / self.best_cost / 1e9 if np.isfinite(self.best_cost) else 0.0)
            self.seconds.append(self.simulated)

    def result(self) -> dict:
        shares = self.policy.sketch_policy.shares()
        return {"arm": self.arm, "seed": self.seed, "best_gflops": self.best_gflops, "seconds": self.seconds,
                "final_sketch_shares": None if shares is None else shares.tolist()}


class ModelSearch:
    """One arm's tuning of a whole model by the task scheduler (Ansor's gradient policy,
    one cost model shared by the tasks), with one seed, a round at a time. Its curve is the
    model's throughput: the FLOPs of all its subgraphs over the weighted sum of its tasks'
    best latencies, 0 until every task has a valid one (the warm-up round of each)."""

    def __init__(self, tasks: list, weights: list, measurements: list[Measurements], arm: str, seed: int,
                 trials: int, defaults_first: bool = True, taught: SharedCostModel | None = None,
                 teaching_secs: float = 0.0):
        chosen = arm_of(arm)
        shared = copy.deepcopy(taught) if chosen.transfer else SharedCostModel()
        params = chosen.params(defaults_first)
        seed += chosen.reseed

        def policy(task: tc.SearchTask, n: int) -> SketchPolicy:
            return SketchPolicy(task, shared, params, seed=seed * 1000 + n, sketch_policy=chosen.sketch_policy,
                                mutation_policy=chosen.mutation_policy)

        # A whole round each by default, named: the scheduler would share the budget of the
        # one round it is given at a time among the tasks still to warm up.
        self.scheduler = tc.TaskScheduler(tasks, weights, seed=seed, policy_factory=policy,
                                          warm_up_trials=chosen.warm_up_trials or PER_ROUND)
        self.runner = _ReplayRunner({id(m.task.compute_dag): m for m in measurements}, self._measured)
        self.weight = {id(t.compute_dag): w for t, w in zip(tasks, weights)}
        self.best = dict.fromkeys(self.weight, np.inf)
        self.flop = sum(w * t.compute_dag.flop_count() for t, w in zip(tasks, weights))
        self.arm, self.seed, self.trials = arm, seed, trials
        self.best_gflops: list[float] = []
        self.seconds: list[float] = []
        self.simulated, self.exhausted = teaching_secs if chosen.transfer else 0.0, False

    @property
    def done(self) -> bool:
        return self.exhausted or len(self.best_gflops) >= self.trials

    def round(self) -> None:
        before = len(self.best_gflops)
        warming = any(not state.best_after_round for state in self.scheduler.states)
        started, self.runner.spent = time.perf_counter(), 0.0
        size = (self.scheduler.warm_up_trials or PER_ROUND) if warming else PER_ROUND  # one round, whole
        self.scheduler.tune(tc.TuningOptions(num_measure_trials=min(size, self.trials - before),
                                             num_measures_per_round=PER_ROUND, builder=_NoBuild(),
                                             runner=self.runner, verbose=0, num_remeasured=0))
        # The search's and the cost model's own seconds; they count at the end of the round.
        self.simulated += time.perf_counter() - started - self.runner.spent
        self.exhausted = len(self.best_gflops) == before

    def _measured(self, dag: int, cost: float, seconds: float) -> None:
        self.best[dag] = min(self.best[dag], cost)
        self.simulated += seconds if np.isfinite(seconds) else 0.0
        latency = sum(self.weight[d] * c for d, c in self.best.items())
        self.best_gflops.append(self.flop / latency / 1e9 if np.isfinite(latency) else 0.0)
        self.seconds.append(self.simulated)

    def result(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "best_gflops": self.best_gflops, "seconds": self.seconds,
                "trials_per_task": [s.summary.trials for s in self.scheduler.states]}


class _NoBuild:
    """The task scheduler's builder in the ablation: nothing to build before a replay, and
    a live measurement builds in ``Measurements``."""

    def build(self, inputs: list) -> list[None]:
        return [None] * len(inputs)


class _ReplayRunner:
    """The task scheduler's runner in the ablation: each candidate costs what its task's
    ``Measurements`` say (replayed, or measured live and recorded), and ``measured`` hears
    of each with the seconds the record gives it. ``spent`` counts the seconds spent here,
    which are not the search's."""

    def __init__(self, measurements: dict[int, Measurements], measured):
        self.measurements, self.measured, self.spent = measurements, measured, 0.0

    def run(self, inputs: list[MeasureInput], builds: list, on_result=None) -> list[MeasureResult]:
        started = time.perf_counter()
        dag = id(inputs[0].dag)
        costs, seconds = self.measurements[dag].costs([i.trace for i in inputs], [None] * len(inputs))
        self.spent += time.perf_counter() - started
        results = []
        for n, (cost, spent) in enumerate(zip(costs, seconds)):
            valid = np.isfinite(cost)
            results.append(MeasureResult((cost,) if valid else (), MeasureErrorKind.NONE if valid else
                                         MeasureErrorKind.RUNTIME, "" if valid else "failed when recorded",
                                         spent, time.time()))
            self.measured(dag, cost, spent)
            if on_result is not None:
                on_result(n, results[-1])
        return results


MEASURING_LOCK = Path(tempfile.gettempdir()) / "tilecraft-ablation-measuring.lock"


def hold_measuring_lock(path: Path = MEASURING_LOCK):
    """Hold the machine's measuring lock for this run (the open file; closing it releases).
    Two runs measuring side by side slow each other's kernels, and a run's live costs are
    never scaled down (``Measurements``), so the arms that measure most live read slow; a
    second run is refused instead, naming the first."""
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise SystemExit(f"another ablation run (pid {holder}) is measuring on this machine; measurements made "
                         f"beside it read slow. Wait for it to end, or stop it with: kill {holder}") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def run_lockstep(searches: list, measurements: list[Measurements], checkpoint=lambda: None) -> list[dict]:
    """Every search (an arm and a seed) in lockstep, a round each in turn, so that whatever
    load the machine has while the record grows falls on all arms alike. ``checkpoint``
    (packing the record into the archive) runs every CHECKPOINT_SECONDS, so a run cut off
    by the machine's end keeps most of what it measured."""
    started = saved = time.perf_counter()
    while not all(s.done for s in searches):
        for one in searches:
            if not one.done:
                one.round()
        if time.perf_counter() - saved > CHECKPOINT_SECONDS:
            checkpoint()
            saved = time.perf_counter()
        progress = min(len(s.best_gflops) for s in searches)
        leaders = ", ".join(f"{s.arm}/{s.seed} {s.best_gflops[-1]:.1f}" for s in searches if s.best_gflops)
        scales = [scale for m in measurements for scale in m.scales[-1:]]
        scale = f", scale {max(scales):.2f}" if scales else ""
        print(f"  {progress} trials each ({time.perf_counter() - started:.0f} s, "
              f"{sum(m.measured for m in measurements)} measured live, "
              f"{sum(m.replayed for m in measurements)} replayed{scale}): {leaders}", flush=True)
    return [s.result() for s in searches]


def true_curves(searches: list[Search], measurements: Measurements, runs: list[dict]) -> None:
    """Add to each run its curve as its user would see it: at each trial, the speed of the
    schedule its search believes best, timed anew in one sitting with every other run's
    (``Measurements.sitting``). A search's best is the best of many noisy measurements,
    which reads high by as much as the luck of when each was measured; in one sitting every
    arm's choices are timed alike. Schedules recorded below FLOOR of the best final are not
    timed again: they lie far below every level judged, and enter at their recorded speed
    on the sitting's scale (times the median ratio of the timed ones to their records)."""
    top = max(run["best_gflops"][-1] for run in runs)
    recorded = {key: search.best_gflops[trial] for search in searches for trial, key in search.believed}
    keys = [key for key, gflops in recorded.items() if gflops >= FLOOR * top]
    started = time.perf_counter()
    now = {key: searches[0].flop / cost / 1e9 if np.isfinite(cost) else 0.0
           for key, cost in measurements.sitting(keys).items()}
    scale = float(np.median([now[key] / recorded[key] for key in keys]))
    print(f"  timed the {len(keys)} schedules believed best, recorded within {1 - FLOOR:.0%} of the best final, "
          f"in one sitting ({time.perf_counter() - started:.0f} s): {scale:.3f} of their recorded speed", flush=True)
    sitting = time.time()
    for search, run in zip(searches, runs):
        changes, curve, value = dict(search.believed), [], 0.0
        for trial in range(len(search.best_gflops)):
            if trial in changes:
                value = now.get(changes[trial], recorded[changes[trial]] * scale)
            curve.append(value)
        run["true_gflops"], run["sitting"] = curve, sitting


def operator_searches(task: tc.SearchTask, measurements: Measurements, arms: list[str], seeds: int, trials: int,
                      donor_logs: list[Path] = (), defaults_first: bool = True,
                      transfer_rows: int = TRANSFER_ROWS) -> list[Search]:
    started, taught = time.perf_counter(), None
    try:
        taught = transfer_model(donor_logs, task, transfer_rows) if transfers(arms) else None
    except ValueError as error:  # the +transfer arms search on a model of their own, as tilecraft tune does
        print(f"  {error}", flush=True)
    teaching = time.perf_counter() - started
    return [Search(task, measurements, arm, seed, trials, taught, defaults_first, teaching)
            for seed in range(seeds) for arm in arms]


def model_tasks(name: str, directory: Path) -> tuple[list, list]:
    """The tasks and weights of model ``name``, exported to ONNX once (that needs torch)."""
    try:
        import model_zoo  # benchmarks/model_zoo.py, beside this script
    except ImportError as error:
        raise SystemExit(f"the model workloads are exported to ONNX from PyTorch ({error}): pip install torch")
    return tc.extract_tasks(str(model_zoo.export(name, directory / "onnx")), tc.Target.host())


def recorded_workloads(known: dict, archive: Path, records: Path, but: str) -> list[Path]:
    """The records of every workload but ``but`` that has one, for the +transfer arms."""
    found = []
    for name in known:
        record = records / f"{name}.json"
        restore(archive / f"{name}.json.xz", record)
        if name != but and record.exists():
            found.append(record)
    print(f"  transfer from {', '.join(r.stem for r in found) or 'nothing (no other records)'}", flush=True)
    return found


def reach(curve: np.ndarray, level: float) -> int | None:
    """The first trial (1-based) at which ``curve`` reaches ``level``; None if never."""
    hit = np.flatnonzero(curve >= level * (1 - 1e-9))
    return int(hit[0]) + 1 if len(hit) else None


def baseline_runs(runs: list[dict]) -> list[dict]:
    """The runs of the baseline's seeds, the null arm's (NULL) included; none without the baseline."""
    return [r for r in runs if r["arm"] in ("baseline", NULL)] if any(r["arm"] == "baseline" for r in runs) else []


def summarise(runs: list[dict], trials: int, curve: str = "best_gflops") -> dict:
    """Per arm: final best (mean, min, max over seeds), and the trials and time its mean
    curve needs to reach the baseline's final mean best, and to come within NEAR and STEEP of it.
    Its paces at each of LEVELS (``paces_of``), the last one, within STEEP, also as its pace:
    nearer to where the curves climb than the final, so more of a policy's speed shows and
    less of its luck. The baseline's final and time are means over all its seeds, the null
    arm's (NULL) included: twice the seeds halve the luck in the level every arm is judged
    by, and the two sets' own shares show how far that luck moves an arm of ten seeds.
    ``curve``: the recorded best ("best_gflops") or the believed best timed in one sitting
    ("true_gflops")."""
    by_arm: dict[str, list[dict]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    curves = {arm: np.mean([_padded(r[curve], trials) for r in rs], axis=0) for arm, rs in by_arm.items()}
    clocks = {arm: np.mean([_padded(r["seconds"], trials) for r in rs], axis=0) for arm, rs in by_arm.items()}
    baseline = baseline_runs(runs)
    target = budget = None
    if baseline:  # the pooled baseline's mean curve and clock: its final, its time, and its way to LEVELS
        base_rows = np.array([_padded(r[curve], trials) for r in baseline])
        base_curve = base_rows.mean(axis=0)
        base_clock = np.mean([_padded(r["seconds"], trials) for r in baseline], axis=0)
        target, budget = float(base_curve[-1]), float(base_clock[-1])
        base_at = [reach(base_curve, level * target) for level in LEVELS]
        apart = np.flatnonzero(np.ptp(base_rows, axis=0) > 0)
        alike = (int(apart[0]) if len(apart) else trials) if len(baseline) > 1 else 0  # trials its seeds share

    def spent(arm: str, at: int | None) -> tuple[int | None, float | None, float | None]:
        if not at:
            return None, None, None
        return at, at / trials, float(clocks[arm][at - 1] / budget)

    def paced(arm: str) -> list[tuple[float, float] | None]:
        at = [reach(curves[arm], level * target) or trials for level in LEVELS]
        return [(a / b, float(clocks[arm][a - 1] / base_clock[b - 1])) if b > alike else None
                for a, b in zip(at, base_at)]

    table = {}
    for arm, rs in by_arm.items():
        finals = [r[curve][-1] for r in rs]
        at, trial_share, time_share = spent(arm, reach(curves[arm], target) if target else None)
        near, near_trial_share, near_time_share = spent(arm, reach(curves[arm], NEAR * target) if target else None)
        steep, steep_trial_share, _ = spent(arm, reach(curves[arm], STEEP * target) if target else None)
        arm_paces = paced(arm) if baseline else None
        pace = (arm_paces and arm_paces[-1]) or (None, None)
        table[arm] = {
            "final_gflops_mean": float(np.mean(finals)), "final_gflops_min": float(min(finals)),
            "final_gflops_max": float(max(finals)), "seeds": len(rs),
            "trials_to_baseline_best": at, "trial_share": trial_share, "time_share": time_share,
            "trials_to_near_baseline": near, "near_trial_share": near_trial_share,
            "near_time_share": near_time_share, "trials_to_steep": steep, "steep_trial_share": steep_trial_share,
            "trial_pace": pace[0], "time_pace": pace[1], "paces": arm_paces,
            "baseline_gflops": target,
            "simulated_secs": float(clocks[arm][-1]),
        }
    return table


def paces_of(table: dict) -> dict[str, list[tuple[float, float] | None]]:
    """Per arm of a ``summarise`` table, its pace at each of LEVELS of the baseline's final
    (pooled with the null's seeds): the trials and the time its mean curve needs to get
    there, over those the pooled baseline's own mean curve needs. An arm never there counts
    as there at the budget's end. None at a level the baseline reached while its seeds all
    still had the same best (the default schedules, measured first): no search to compare
    there, and the time a taught arm takes to the same trial is its teaching. Empty where
    the table had no baseline to judge by."""
    return {arm: row["paces"] for arm, row in table.items() if row["paces"] is not None}


def bootstrap_shares(workloads: dict, draws: int = BOOTSTRAP_DRAWS, seed: int = 0,
                     curve: str = "best_gflops") -> dict[str, np.ndarray]:
    """Per arm, ``draws`` rows (mean trial share, mean time share, mean trial pace, mean time
    pace) over the workloads, each with every arm's seeds, the baseline's too, drawn again
    with replacement: how far the means could move with other seeds. ``workloads``: name ->
    (runs, trials). Three seeds give few distinct draws and, as any bootstrap of n samples,
    a spread too narrow by about sqrt(n / (n - 1)): it shows the scale of the seed noise,
    not exact odds."""
    rng = np.random.default_rng(seed)
    grouped = []
    for runs, trials in workloads.values():
        by_arm: dict[str, list[dict]] = {}
        for run in runs:
            by_arm.setdefault(run["arm"], []).append(run)
        grouped.append((list(by_arm.values()), trials))
    drawn: dict[str, list[tuple[float, ...]]] = {}
    for _ in range(draws):
        shares: dict[str, list[tuple[float, ...]]] = {}
        for arms, trials in grouped:
            again = [rs[n] for rs in arms for n in rng.integers(len(rs), size=len(rs))]
            for arm, row in summarise(again, trials, curve).items():
                shares.setdefault(arm, []).append((_counted(row["trial_share"]), _counted(row["time_share"]),
                                                   _counted(row["trial_pace"]), _counted(row["time_pace"])))
        for arm, values in shares.items():
            drawn.setdefault(arm, []).append(tuple(np.mean(values, axis=0)))
    return {arm: np.array(values) for arm, values in drawn.items()}


def _counted(share: float | None) -> float:
    """A share as means over workloads count it: the whole budget where the level was never reached."""
    return 1.0 if share is None else share


def _padded(values: list[float], length: int) -> np.ndarray:
    """A curve cut or extended (by its last value) to ``length`` trials."""
    out = np.asarray(values[:length], dtype=float)
    return np.concatenate([out, np.full(length - len(out), out[-1] if len(out) else 0.0)])


def plot(name: str, runs: list[dict], trials: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_trials, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    timed = timed_alike(runs)
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        curves = np.array([_padded(r["best_gflops"], trials) for r in mine])
        clock = np.mean([_padded(r["seconds"], trials) for r in mine], axis=0)
        x = np.arange(1, trials + 1)
        line, = by_trials.plot(x, curves.mean(axis=0), label=arm)
        by_trials.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.15)
        by_time.plot(clock / 60, curves.mean(axis=0), label=arm, color=line.get_color())
        if timed:
            by_trials.plot(x, np.mean([_padded(r["true_gflops"], trials) for r in mine], axis=0),
                           color=line.get_color(), linestyle="--", label=f"{arm}, timed in one sitting")
    by_trials.set(xlabel="trials", ylabel="best GFLOPS", title=f"{name}: best vs trials")
    by_time.set(xlabel="simulated minutes", ylabel="best GFLOPS", title=f"{name}: best vs time")
    by_trials.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated arms: one of {', '.join(POLICIES)}, each with any of "
                             f"{', '.join('+' + m for m in MODIFIERS)} (both+transfer, say)")
    parser.add_argument("--live", action="store_true", help="measure every candidate afresh, no replay")
    parser.add_argument("--records", default="benchmarks/results/ablation_records")
    parser.add_argument("--archive", default="benchmarks/records", help="where the records are kept, compressed")
    parser.add_argument("--out", default="benchmarks/results/ablation.json")
    parser.add_argument("--remeasure", type=int, default=0, metavar="N",
                        help="first measure the N fastest recorded candidates again, in one sitting")
    parser.add_argument("--transfer-rows", type=int, default=TRANSFER_ROWS, metavar="N",
                        help=f"how many of each other workload's records the +transfer arms learn "
                             f"(default {TRANSFER_ROWS})")
    parser.add_argument("--no-defaults", action="store_true",
                        help="search from random samples only, as Ansor does: no sketch's default schedule first")
    parser.add_argument("--no-sitting", action="store_true",
                        help="leave out the sitting at the end that times every search's believed best anew "
                             "(the curves as a user would see them; a few minutes a workload)")
    parser.add_argument("--tables", nargs="+", metavar="RESULTS",
                        help="measure nothing: print the tables of saved results (--out files of earlier runs)")
    args = parser.parse_args()
    if args.tables:
        return print_saved(args.tables)
    if args.transfer_rows < 1:
        raise SystemExit(f"--transfer-rows {args.transfer_rows}: give how many records of each other workload "
                         f"the +transfer arms learn (at least 1)")
    if args.remeasure < 0:
        raise SystemExit(f"--remeasure {args.remeasure}: give how many recorded candidates to measure again (0: none)")
    known = {**WORKLOADS, **QUICK}
    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    arms = [a for a in args.arms.split(",") if a]
    for name in names:
        if name not in known and name not in MODELS:
            raise SystemExit(f"unknown workload {name!r}; workloads: {', '.join([*known, *MODELS])}")
    try:
        chosen = {arm: arm_of(arm) for arm in arms}
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if any(arm.warm_up_trials for arm in chosen.values()) and any(name not in MODELS for name in names):
        raise SystemExit("the +short-warm-up arms are for whole models (a single operator has no warm-up "
                         "rounds to shorten): run them with --only resnet50")
    # A run stopped by `kill` packs what it measured into the archive too (the `finally` below),
    # as one stopped by Ctrl-C does; Python's default for SIGTERM would skip it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    lock = hold_measuring_lock()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"machine": platform.processor() or platform.machine(), "trials": args.trials, "seeds": args.seeds,
               "live": args.live, "defaults_first": not args.no_defaults, "transfer_rows": args.transfer_rows,
               "workloads": {}}
    for name in names:
        record, archive = Path(args.records) / f"{name}.json", Path(args.archive) / f"{name}.json.xz"
        restore(archive, record)
        if name in MODELS:
            tasks, weights = model_tasks(name, out.parent)
            warm_up = len(tasks) * PER_ROUND
            if args.trials <= warm_up:
                raise SystemExit(f"{name} has {len(tasks)} tasks, whose warm-up rounds alone take {warm_up} trials: "
                                 f"give --trials well above that (4000, say)")
            added = merge(Path(args.archive) / f"{MODELS[name]}.json.xz", record, str(tasks[0].target))
            print(f"  {added} records of this target joined from {MODELS[name]}, the log models.py keeps", flush=True)
        else:
            func, workload_args = known[name]
            tasks = [tc.SearchTask(func=func, args=workload_args, target=tc.Target.host())]
        runner = LocalRunner()
        measurements = [Measurements(task, record, args.live, runner) for task in tasks]
        try:
            for each in measurements if args.remeasure else []:
                each.remeasure(args.remeasure)
            if name in MODELS:
                started = time.perf_counter()
                taught = transfer_model([DEFAULT_RECORDS], tasks, args.transfer_rows) if transfers(arms) else None
                teaching = time.perf_counter() - started
                searches = [ModelSearch(tasks, weights, measurements, arm, seed, args.trials, not args.no_defaults,
                                        taught, teaching) for seed in range(args.seeds) for arm in arms]
            else:
                donor_logs = (recorded_workloads(known, Path(args.archive), Path(args.records), but=name)
                              if transfers(arms) else [])
                searches = operator_searches(tasks[0], measurements[0], arms, args.seeds, args.trials, donor_logs,
                                             not args.no_defaults, args.transfer_rows)
            runs = run_lockstep(searches, measurements, checkpoint=lambda: save(record, archive))
            if name not in MODELS and not args.no_sitting:
                true_curves(searches, measurements[0], runs)
        finally:
            runner.close()
            save(record, archive)
        results["workloads"][name] = {"table": summarise(runs, args.trials), "runs": runs,
                                      "replayed": sum(m.replayed for m in measurements),
                                      "measured_live": sum(m.measured for m in measurements),
                                      "scales": [m.scales for m in measurements] if name in MODELS else
                                      measurements[0].scales}
        plot(name, runs, args.trials, out.with_name(f"ablation_{name}.png"))
        out.write_text(json.dumps(results, indent=1))
        print_workload(name, runs, args.trials)
    lock.close()
    print_overall(results)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_summary(name: str, table: dict, ranges: dict[str, tuple[float, float]]) -> None:
    """A workload's ``summarise`` table, a row per arm, with its final's redrawn range (``final_ranges``)."""
    printed = numeric_table("arm", "final GFLOPS (min-max)", "vs base, 90% of redraws", "trials to base",
                            "trial share", "time share", "to 99%", "trial share", "time share", "to 97%",
                            "pace (trials, time)", title=name)
    for arm, row in table.items():
        low, high = ranges.get(arm, (np.nan, np.nan))
        printed.add_row(arm, f"{row['final_gflops_mean']:.1f} ({row['final_gflops_min']:.1f}-"
                             f"{row['final_gflops_max']:.1f})", f"{low:.3f}-{high:.3f}",
                        str(row["trials_to_baseline_best"] or "never"), _share(row["trial_share"]),
                        _share(row["time_share"]), str(row["trials_to_near_baseline"] or "never"),
                        _share(row["near_trial_share"]), _share(row["near_time_share"]),
                        str(row["trials_to_steep"] or "never"),
                        f"{_share(row['trial_pace'])}, {_share(row['time_pace'])}")
    print()
    print_table(printed)


def timed_alike(runs: list[dict]) -> bool:
    """Whether every run carries its believed best timed in one and the same sitting."""
    return all("true_gflops" in run for run in runs) and len({run["sitting"] for run in runs}) == 1


def print_workload(name: str, runs: list[dict], trials: int) -> None:
    for curve, says in CURVES.items():
        if curve == "best_gflops" or timed_alike(runs):
            table = summarise(runs, trials, curve)
            print_summary(f"{name}, {says}", table, final_ranges(runs, trials, curve))
            print_paces(paces_of(table), "pace")


def print_paces(rows: dict[str, list[tuple[float, float] | None]], what: str) -> None:
    """Each arm's pace at every level (``paces_of``): trials, and time in brackets; "-" where
    the baseline's default schedules were already there."""
    if not rows:
        return
    # A line of its own, not the table's title: rich would wrap a title wider than the table to its width.
    print(f"{what} to a share of the baseline's final: trials (time) over the baseline's own")
    table = numeric_table("arm", *(f"{level:.0%}" for level in LEVELS))
    for arm, row in rows.items():
        table.add_row(arm, *("-" if pace is None else f"{pace[0]:.2f} ({pace[1]:.2f})" for pace in row))
    print_table(table)


def mean_paces(rows: list[list[tuple[float, float] | None]]) -> list[tuple[float, float] | None]:
    """An arm's paces at each level averaged over the workloads that have one there."""
    levels = [[pace for pace in level if pace is not None] for level in zip(*rows)]
    return [tuple(np.mean(level, axis=0)) if level else None for level in levels]


def final_ranges(runs: list[dict], trials: int, curve: str = "best_gflops", draws: int = BOOTSTRAP_DRAWS,
                 seed: int = 0) -> dict[str, tuple[float, float]]:
    """Per arm, the range holding 90% of its mean final over the baseline's (all its seeds,
    the null's included) when the seeds of both are drawn again with replacement. A final
    is told apart from the baseline's only where its range leaves out 1; the shares,
    taken where the curves are flat, are not (docs/experiments/timed-best-and-pace.md)."""
    finals: dict[str, list[float]] = {}
    for run in runs:
        finals.setdefault(run["arm"], []).append(_padded(run[curve], trials)[-1])
    baseline = np.array([_padded(run[curve], trials)[-1] for run in baseline_runs(runs)])
    if not len(baseline):
        return {}
    rng = np.random.default_rng(seed)
    base = rng.choice(baseline, (draws, len(baseline))).mean(axis=1)
    return {arm: tuple(np.percentile(rng.choice(values, (draws, len(values))).mean(axis=1) / base, [5, 95]))
            for arm, values in finals.items()}


def print_overall(results: dict) -> None:
    """Means over the workloads of each arm's shares and final best relative to baseline,
    as recorded and, over the workloads whose runs were timed in one sitting, as timed."""
    for curve, says in CURVES.items():
        workloads = {name: (data["runs"], data.get("trials", results.get("trials")))
                     for name, data in results["workloads"].items()
                     if curve == "best_gflops" or timed_alike(data["runs"])}
        if workloads:
            print_means(workloads, curve, says)


def print_means(workloads: dict, curve: str, says: str) -> None:
    rows: dict[str, list[dict]] = {}
    paced: dict[str, list] = {}
    for runs, trials in workloads.values():
        table = summarise(runs, trials, curve)
        for arm, row in table.items():
            ratio = row["final_gflops_mean"] / row["baseline_gflops"] if row["baseline_gflops"] else float("nan")
            rows.setdefault(arm, []).append({**row, "ratio": ratio})
        for arm, row in paces_of(table).items():
            paced.setdefault(arm, []).append(row)
    drawn = bootstrap_shares(workloads, curve=curve)
    table = numeric_table("arm", "workloads", "mean trial share", "mean time share", "within 1%: trial", "time",
                          "within 3%: trial", "worst final vs base", "redrawn seeds: trial share, 90%",
                          f"meets {BAR:.2f}", "pace to 97%: trials", "time", "redrawn, 90%", f"meets {BAR:.2f}",
                          title=f"over {len(workloads)} workloads, {says} (shares count 1.0 where the arm never "
                                f"reached the level)")
    for arm, values in rows.items():
        def mean(key: str) -> float:
            return float(np.mean([_counted(v[key]) for v in values]))
        low, high = np.percentile(drawn[arm][:, 0], [5, 95])
        meets = np.mean(np.all(drawn[arm][:, :2] <= BAR + 1e-9, axis=1))
        pace_low, pace_high = np.percentile(drawn[arm][:, 2], [5, 95])
        pace_meets = np.mean(np.all(drawn[arm][:, 2:] <= BAR + 1e-9, axis=1))
        table.add_row(arm, str(len(values)), f"{mean('trial_share'):.2f}", f"{mean('time_share'):.2f}",
                      f"{mean('near_trial_share'):.2f}", f"{mean('near_time_share'):.2f}",
                      f"{mean('steep_trial_share'):.2f}", f"{min(v['ratio'] for v in values):.3f}",
                      f"{low:.2f}-{high:.2f}", f"{meets:.2f}", f"{mean('trial_pace'):.2f}",
                      f"{mean('time_pace'):.2f}", f"{pace_low:.2f}-{pace_high:.2f}", f"{pace_meets:.2f}")
    print()
    print_table(table)
    print_paces({arm: mean_paces(per_workload) for arm, per_workload in paced.items()},
                "mean pace over the workloads that ran the arm")


def print_saved(paths: list[str]) -> None:
    """The tables of earlier runs, summarised anew from their saved curves. A workload's arms
    gather from every file that holds it, so arms run on different days share one table
    (the null's beside any other); where several files hold one arm, the last one named wins.
    The curves timed in one sitting are judged only where all of a workload's arms share it."""
    arms: dict[str, dict[str, list[dict]]] = {}  # workload -> arm -> its runs, from the last file holding it
    trials: dict[str, int] = {}
    for path in paths:
        try:
            saved = json.loads(Path(path).read_text())
            workloads, budget = saved["workloads"], saved["trials"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"--tables {path}: not the results of an ablation run ({type(error).__name__}: "
                             f"{error}); name files that ablation.py wrote with --out")
        for name, data in workloads.items():
            if trials.setdefault(name, budget) != budget:
                raise SystemExit(f"--tables {path}: {name} ran {budget} trials there and {trials[name]} in an "
                                 f"earlier file; name only files of one budget for a workload")
            for arm in dict.fromkeys(run["arm"] for run in data["runs"]):
                arms.setdefault(name, {})[arm] = [run for run in data["runs"] if run["arm"] == arm]
    results: dict = {"workloads": {}}
    for name, by_arm in arms.items():
        runs = [run for arm_runs in by_arm.values() for run in arm_runs]
        results["workloads"][name] = {"runs": runs, "trials": trials[name]}
        print_workload(name, runs, trials[name])
    print_overall(results)


if __name__ == "__main__":
    main()
