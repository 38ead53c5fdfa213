"""TaskScheduler: one tuning budget shared by the tasks of a model (Ansor's §6).

The objective is the model's latency, the sum of weight x best latency over the tasks
(or a user's ``objective_func`` of the best latencies). After a warm-up round for every
task, the most work (weight x FLOPs) first (skipped for tasks the log already covers;
``warm_up_trials`` shortens it, since a model of 29 tasks spends 1,856 trials on Ansor's;
a budget short of whole rounds gets each task an equal share of it, at least
``MIN_WARM_UP_TRIALS``, rather than leaving the last tasks none), each round goes to the task whose next
round is expected to lower the objective most. Its gradient mixes the improvement of its
last ``backward_window_size`` rounds (backward) with an optimistic forecast (forward: the
best of "one more round helps as much as the average round did" and "it reaches ``beta``
times the throughput of similar tasks"), ``alpha`` weighing history against optimism;
similar tasks share an operator name and a FLOP count within a golden-ratio bucket. Tasks
resumed from a log start from their best schedule measured again in this sitting (a log's
costs come from hours of a machine whose speed drifts), or today's default where it is faster
(a log kept from older code may never have measured it), with the rounds that the log's trials
fill behind them (so a task tuned long ago for long is not forecast as one round old). A task
stops when it has nothing valid after warm-up, its space is exhausted, or it has not
improved for ``per_task_early_stopping`` trials. ``strategy="round-robin"`` just cycles.
As in Ansor, the tasks learn one cost model together (``share_cost_model``;
``search/shared_model.py``), so a task's first round is ranked by what the others measured.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from rich.table import Table

from ..database.best import rank
from ..database.log import load_records
from ..database.record import TuningRecord, trace_key
from ..measure import LocalBuilder
from ..schedule.trace import Trace
from ..search.default import default_choice
from ..search.shared_model import SharedCostModel
from ..tables import print_table
from .progress import ProgressReporter
from .remeasure import remeasure
from .task import SearchTask, TuningOptions, TuningSummary, final_round, measuring_runner, tune_round, use_policies

STRATEGIES = ("gradient", "round-robin")


MIN_WARM_UP_TRIALS = 8  # a warm-up round measures each sketch's default and a few more


@dataclass
class _TaskState:
    task: SearchTask
    weight: float
    policy: object
    summary: TuningSummary = field(default_factory=TuningSummary)
    best_after_round: list[float] = field(default_factory=list)
    since_improvement: int = 0
    done: str = ""  # why the task gets no more rounds
    loaded: TuningRecord | None = None  # the log's best, until tuning starts from it
    logged_trials: int = 0  # the log's search records of the task

    def __post_init__(self) -> None:
        self.flop = self.task.compute_dag.flop_count()
        self.tag = (self.task.desc.split(" ")[0], int(math.log(max(self.flop, 1.0)) / math.log(1.618)))

    @property
    def best(self) -> float:
        """The median of its best finalist when tuning ended, else its best while searching."""
        if self.summary.final_costs:
            return self.summary.final_cost
        return self.best_after_round[-1] if self.best_after_round else math.inf


class TaskScheduler:
    """Shares one tuning budget among the tasks of a model, round by round (Ansor's §6).

    Ansor's names: ``TaskScheduler(tasks, task_weights, objective_func=None,
    strategy="gradient", load_log_file=None, alpha=0.2, beta=2, backward_window_size=3)``
    then ``.tune(TuningOptions(...), per_task_early_stopping=None)``; ``warm_up_trials`` is
    tilecraft's (each task's first round, when shorter than ``num_measures_per_round``), and so
    is ``cost_model``, the shared model to start from, e.g. one that ``transfer_model`` taught.
    Every task gets one warm-up round (tasks the log already covers skip it); then each
    round goes to the task whose round is expected to lower the objective most (see this
    module's docstring for the gradient).

    Args:
        tasks: The tasks, e.g. from ``extract_tasks``.
        task_weights: How many times the model runs each task; None for 1 each.
        objective_func: A function of the tasks' best latencies (seconds, in task order)
            to minimise; None for the weighted sum, the model's latency.
        strategy: ``"gradient"`` (Ansor's) or ``"round-robin"``.
        load_log_file: A tuning log whose records of each task warm its policy and are
            never searched again; each task's best is measured once more when tuning
            starts (with ``num_remeasured``), so the rounds go by costs of one sitting.
        alpha: How much the gradient trusts a task's recent history over its forecast.
        beta: The forecast's optimism: a task may reach ``beta`` times the throughput of
            its similar tasks.
        backward_window_size: Rounds of history in the backward gradient.
        seed: Seed of the policies (task ``n`` gets ``seed + n``) and of ties.
        policy_factory: ``policy_factory(task, n)`` makes task ``n``'s search policy; None
            for a ``SketchPolicy`` on the shared cost model.
        share_cost_model: The tasks learn one ``SharedCostModel`` together (Ansor's
            behaviour); False gives each task a model of its own.
        warm_up_trials: Trials of each task's first round; None for a whole round.
        cost_model: The shared model to start from; None for a new one.

    Attributes:
        states: Per task, its policy, best latency after each round, trials and state.

    Raises:
        ValueError: If ``tasks`` is empty, the weights are not one per task, ``strategy``
            is unknown, ``warm_up_trials`` is below 1, or ``cost_model`` is given with
            ``share_cost_model=False``.

    Example:
        ::

            tasks, weights = tc.extract_tasks("resnet50.onnx")
            scheduler = tc.TaskScheduler(tasks, weights)
            latency = scheduler.tune(tc.TuningOptions(num_measure_trials=2000,
                                                      measure_callbacks=[tc.RecordToFile("resnet50.json")]))
    """

    def __init__(self, tasks: Sequence[SearchTask], task_weights: Sequence[float] | None = None,
                 objective_func: Callable[[list[float]], float] | None = None, strategy: str = "gradient",
                 load_log_file: str | None = None, alpha: float = 0.2, beta: float = 2.0,
                 backward_window_size: int = 3, seed: int = 0, policy_factory: Callable | None = None,
                 share_cost_model: bool = True, warm_up_trials: int | None = None,
                 cost_model: SharedCostModel | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"TaskScheduler strategy {strategy!r} is unknown; use one of {', '.join(STRATEGIES)}")
        if warm_up_trials is not None and warm_up_trials < 1:
            raise ValueError(f"TaskScheduler warm_up_trials={warm_up_trials}: give at least 1 trial per task, "
                             f"or None for a whole round (num_measures_per_round) as Ansor does")
        if not tasks:
            raise ValueError("TaskScheduler needs at least one task")
        weights = list(task_weights) if task_weights is not None else [1.0] * len(tasks)
        if len(weights) != len(tasks):
            raise ValueError(f"TaskScheduler: {len(tasks)} tasks but {len(weights)} task_weights; give one per task")
        if cost_model is not None and not share_cost_model:
            raise ValueError("TaskScheduler: a cost_model is shared by the tasks; leave out share_cost_model=False")
        from ..search.policy import SketchPolicy

        shared = (cost_model or SharedCostModel()) if share_cost_model else None
        make_policy = policy_factory or (lambda task, n: SketchPolicy(task, program_cost_model=shared, seed=seed + n))
        self.states = [_TaskState(task, float(w), make_policy(task, n)) for n, (task, w) in
                       enumerate(zip(tasks, weights))]
        self.objective_func = objective_func
        self.strategy, self.alpha, self.beta, self.window = strategy, alpha, beta, backward_window_size
        self.warm_up_trials = warm_up_trials
        self.rng = np.random.default_rng(seed)
        self._next_robin = 0
        if load_log_file is not None:
            for state in self.states:
                records = load_records(load_log_file, state.task.workload_key, state.task.target)
                if records:
                    state.policy.preload(records)
                    state.loaded = next(iter(rank(records)), None)
                    state.logged_trials = sum(r.phase == "search" for r in records)
                    state.best_after_round.append(math.inf if state.loaded is None else state.loaded.cost)

    def objective(self, costs: Sequence[float] | None = None) -> float:
        """The objective (seconds) for the tasks' best latencies, or for ``costs`` given in
        task order (a task with no valid measurement counts as inf)."""
        costs = [s.best for s in self.states] if costs is None else list(costs)
        if self.objective_func is not None:
            return float(self.objective_func(costs))
        return sum(s.weight * c for s, c in zip(self.states, costs))

    def tune(self, tuning_options: TuningOptions | None = None,
             per_task_early_stopping: int | None = None) -> float:
        """Spend ``num_measure_trials`` over the tasks; returns the objective (seconds).

        Tuning stops early when every task is done (nothing valid after its warm-up, its
        space exhausted, or no improvement in ``per_task_early_stopping`` trials) or the
        objective has not improved in ``early_stopping`` trials. With ``verbose``, a table
        of the tasks is printed at the end. A runner made here is closed at the end.

        Args:
            tuning_options: The budget, rounds, builder, runner and measure callbacks; None
                for the defaults (1,000 trials, nothing recorded).
            per_task_early_stopping: Stop tuning a task after this many trials without
                improvement; None for never.

        Raises:
            ValueError: If ``tuning_options`` names an unknown sketch or mutation policy.
            TilecraftError: If it names one and a task's search policy cannot switch.
        """
        options = tuning_options or TuningOptions()
        builder = options.builder or LocalBuilder()
        runner = measuring_runner(options.runner, *{state.task.target for state in self.states})
        reporter = ProgressReporter(options.num_measure_trials, options.verbose, None, "model",
                                    time_budget_secs=options.time_budget_secs)
        started = time.perf_counter()
        for state in self.states:
            use_policies(state.policy, options)
            state.summary.final_costs = ()  # the search steers by its own measurements; the end re-measures
        trials, since_better, best_objective = 0, 0, math.inf
        try:
            if options.num_remeasured and any(s.loaded for s in self.states):
                reporter.phase("re-measuring the log's best")
            for state in self.states:
                self._resume(state, options, builder, runner)
            best_objective = self.objective()
            while trials < options.num_measure_trials:
                index = self._pick()
                if index is None:
                    reporter.note("every task is done")
                    break
                state = self.states[index]
                reporter.task_name = f"task {index + 1}/{len(self.states)} {state.task.desc}"
                per_round = options.num_measures_per_round
                if not state.best_after_round and self.warm_up_trials is not None:
                    per_round = self.warm_up_trials
                elif not state.best_after_round:  # a budget short of a round each: a share each, so all get one
                    fresh = sum(not s.best_after_round and not s.done for s in self.states)
                    per_round = min(per_round, max(MIN_WARM_UP_TRIALS, (options.num_measure_trials - trials) // fresh))
                count = options.round_size(per_round, trials, time.perf_counter() - started)
                if not count:
                    reporter.note("the time budget is spent")
                    break
                results = self._round(state, count, builder, runner, options.measure_callbacks, reporter,
                                      per_task_early_stopping)
                trials += len(results)
                objective = self.objective()
                since_better = 0 if objective < best_objective else since_better + len(results)
                best_objective = min(best_objective, objective)
                reporter.note(f"round of {state.task.desc}: best {state.best * 1e3:.3f} ms; "
                              f"objective {objective * 1e3:.3f} ms")
                if options.early_stopping is not None and since_better >= options.early_stopping:
                    reporter.note(f"early stopping: the objective has not improved in {since_better} trials")
                    break
            reporter.phase("re-measuring")
            for state in self.states:
                final_round(state.task, state.policy, options, builder, runner, state.summary, None)
        finally:
            reporter.close()
            if options.runner is None:
                runner.close()
        if options.verbose:
            print_table(self.table())
        return self.objective()

    def table(self) -> Table:
        """A ``rich`` table of each task's weight, trials, best and weighted latency and state."""
        table = Table(title=f"Tasks (objective {self.objective() * 1e3:.3f} ms)")
        for column in ("task", "weight", "trials", "best ms", "weighted ms", "state"):
            table.add_column(column, justify="left" if column in ("task", "state") else "right")
        for state in self.states:
            best = "-" if math.isinf(state.best) else f"{state.best * 1e3:.3f}"
            weighted = "-" if math.isinf(state.best) else f"{state.weight * state.best * 1e3:.3f}"
            table.add_row(state.task.desc, f"{state.weight:g}", str(state.summary.trials), best, weighted,
                          state.done or "tuning")
        return table

    def _resume(self, state: _TaskState, options: TuningOptions, builder, runner) -> None:
        """Start ``state``'s task where its log left it. Its best schedule is measured again
        in this sitting (with ``num_remeasured``), as a final record: a log's costs come from
        hours of a machine whose speed drifts (ResNet-50's records of one day read 1.3x fast
        two days later). So is today's default beside it, where it differs: a task no round
        returns to would otherwise keep a log's best that today's code outruns untuned (a
        bfloat16 BERT layer, tuned before its weights were packed in pairs, ran 1.05x slower
        than untuned). And its history holds as many rounds as the log's trials fill, so
        the forecast "one more round helps as much as the average round did" counts earlier
        runs: without them every resumed task looked one round old, and the rounds went to
        the largest tasks however long they had been tuned. One that fails now is warmed up."""
        record, state.loaded = state.loaded, None
        if record is None:
            return
        cost = record.cost
        if options.num_remeasured:
            finalists = [(Trace.from_json(record.trace), record.sketch)]
            default, sketch = default_choice(state.task.compute_dag, state.task.target)
            if trace_key(default.trace) != trace_key(finalists[0][0]):
                finalists.append((default.trace, sketch))
            results = remeasure(state.task, finalists, builder, runner, options.remeasure_repeats,
                                options.measure_callbacks)
            if not results[0].is_valid:
                state.best_after_round = []
                return
            cost = min(statistics.median(result.costs) for result in results if result.is_valid)
        state.best_after_round = [cost] * max(1, round(state.logged_trials / options.num_measures_per_round))

    # -- one round --------------------------------------------------------------------

    def _round(self, state: _TaskState, count: int, builder, runner, callbacks, reporter,
               per_task_early_stopping: int | None) -> list:
        before = state.best
        summary = state.summary
        objective_reporter = _ObjectiveReporter(reporter, self, state)
        results = tune_round(state.task, state.policy, count, builder, runner, callbacks, summary, objective_reporter)
        state.best_after_round.append(min(before, summary.best_cost))
        state.since_improvement = 0 if state.best < before else state.since_improvement + len(results)
        if not results:
            state.done = "space exhausted"
        elif math.isinf(state.best):
            state.done = "nothing valid after warm-up"
        elif per_task_early_stopping is not None and state.since_improvement >= per_task_early_stopping:
            state.done = f"no improvement in {state.since_improvement} trials"
        return results

    def _pick(self) -> int | None:
        alive = [n for n, s in enumerate(self.states) if not s.done]
        if not alive:
            return None
        fresh = [n for n in alive if not self.states[n].best_after_round]
        if fresh:  # warm-up: one round for every task the log does not cover, the most work first
            return max(fresh, key=lambda n: (self.states[n].weight * self.states[n].flop, -n))
        if self.strategy == "round-robin":
            later = [n for n in alive if n >= self._next_robin] or alive
            self._next_robin = later[0] + 1
            return later[0]
        gradients = np.array([self._gradient(n) for n in alive])
        best = np.flatnonzero(gradients == gradients.min())
        return alive[int(best[self.rng.integers(len(best))])]

    def _gradient(self, n: int) -> float:
        """d objective / d round of task ``n`` (negative: the round is expected to help)."""
        state = self.states[n]
        history, rounds, best = state.best_after_round, len(state.best_after_round), state.best
        backward = (history[-1] - history[-1 - self.window]) / self.window if rounds > self.window else 0.0
        similar = max((s.flop / s.best for s in self.states if s.tag == state.tag and math.isfinite(s.best)),
                      default=0.0)  # the best throughput among similar tasks (0 for data movement)
        optimistic = self.beta * state.flop / similar if similar > 0 else best
        forward = min(best - best / rounds, optimistic) - best
        return self._partial(n) * (self.alpha * backward + (1 - self.alpha) * forward)

    def _partial(self, n: int) -> float:
        """d objective / d best latency of task ``n``: its weight, or numerically for an objective_func."""
        if self.objective_func is None:
            return self.states[n].weight
        costs = [s.best for s in self.states]
        delta = 1e-4 * costs[n]
        shifted = costs.copy()
        shifted[n] -= delta
        return (self.objective(costs) - self.objective(shifted)) / delta


class _ObjectiveReporter:
    """The shared reporter, told the model's objective instead of one task's latency."""

    def __init__(self, reporter: ProgressReporter, scheduler: TaskScheduler, state: _TaskState):
        self.reporter, self.scheduler, self.state = reporter, scheduler, state

    def update(self, result_gflops, latency_secs, error_kind) -> None:
        costs = [s.best for s in self.scheduler.states]
        index = self.scheduler.states.index(self.state)
        if latency_secs is not None:
            costs[index] = min(costs[index], latency_secs)
        objective = self.scheduler.objective(costs)
        self.reporter.update(None, objective if math.isfinite(objective) else None, error_kind)

