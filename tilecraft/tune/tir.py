"""MetaSchedule's flow: ``tune_tir`` into a work dir, ``compile_tir`` from its database.

The work dir is the database: ``records.json`` is a tuning log in the format every other
reader uses (so ``SearchTask.apply_best``, ``tilecraft best`` and ``Database`` agree on the
best over the whole history), and ``tuning.log`` is a readable account of each run, a line
per trial and the best schedule as Python at the end.

``max_trials_global`` counts the work dir's whole history of the workload on the target:
re-running a call that was interrupted finishes it instead of starting over, never
measuring a recorded candidate again, and re-running a finished call measures nothing
(raise the budget to tune further).
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any

from ..database.database import RECORDS_FILE, STORE_FILE, Database, dag_of
from ..database.log import NoValidRecordError, RecordToFile
from ..database.sqlite import RecordToStore
from ..schedule.trace import Trace
from ..search.policy import SketchPolicy
from ..search.replay import ReplayTrace
from ..search.space import ScheduleFn
from ..target import Target
from .task import SearchTask, TuningOptions

LOG_FILE = "tuning.log"
STRATEGIES = {"evolutionary": SketchPolicy, "replay-trace": ReplayTrace}


def tune_tir(mod: Any, target: Target | str, work_dir: str | Path, max_trials_global: int,
             num_trials_per_iter: int = 64, space: ScheduleFn | None = None, task_name: str = "main",
             strategy: str = "evolutionary", seed: int = 0, builder: Any = None, runner: Any = None,
             verbose: int = 1) -> Database:
    """Tune ``mod`` (a ``ComputeDAG``, its te tensors, or a ``SearchTask`` of a registered
    workload) on ``target`` and return the work dir's ``Database``, MetaSchedule style.

    Measurements are appended to the work dir's ``records.json`` (a tuning log) and a
    readable account of the run to its ``tuning.log``. ``max_trials_global`` counts the
    work dir's whole history of the workload on the target: re-running an interrupted
    call finishes it, never measuring a recorded candidate again, and re-running a
    finished one measures nothing.

    Args:
        mod: A ``ComputeDAG``, its te tensors, or a ``SearchTask`` of a registered workload.
        target: A ``Target`` or a target string.
        work_dir: The work dir (created if needed).
        max_trials_global: Trials of the workload on the target in the work dir, counting
            earlier runs.
        num_trials_per_iter: Candidates measured per round.
        space: A user's ``ScheduleFn`` to search; None for the sketches of the sketch rules.
        task_name: The task's name in ``tuning.log`` and its description.
        strategy: ``"evolutionary"`` (``SketchPolicy``) or ``"replay-trace"``
            (``ReplayTrace``, random search).
        seed: Seed of the search.
        builder: The builder; None for a ``LocalBuilder``.
        runner: The runner; None for a ``LocalRunner``, closed at the end.
        verbose: 0 silent, 1 a status line, 2 also a line per round.

    Returns:
        The ``Database`` of the work dir, opened after tuning.

    Raises:
        ValueError: If ``strategy`` is unknown.
        TargetError: If ``target`` cannot be understood.
        TypeError: If ``mod`` names no computation.

    Example:
        ::

            database = tc.tune_tir(mod=dag, target="llvm --num-cores=2", work_dir="./tune_tmp",
                                   max_trials_global=64, space=tc.ScheduleFn(stochastic_schedule_mm))
            sch = tc.compile_tir(database, dag, "llvm --num-cores=2")
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"tune_tir: strategy {strategy!r} is unknown; use one of {', '.join(STRATEGIES)}")
    task = _task(mod, target, task_name)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    done = [r for r in Database(work_dir).records(task, task.target) if r.phase == "search"]
    remaining = max(0, max_trials_global - len(done))
    with open(work_dir / LOG_FILE, "a", encoding="utf-8") as log:
        log.write(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} tune_tir {task_name!r}: workload {task.workload_key}, "
                  f"target '{task.target}', strategy {strategy}, space "
                  f"{space.name if space is not None else 'generated sketches'}\n"
                  f"{len(done)} trials already in the work dir, {remaining} to go of max_trials_global "
                  f"{max_trials_global}\n")
        if remaining:
            policy = STRATEGIES[strategy](task, seed=seed, space=space)
            policy.preload(done)
            options = TuningOptions(num_measure_trials=remaining, num_measures_per_round=num_trials_per_iter,
                                    builder=builder, runner=runner, verbose=verbose,
                                    measure_callbacks=[_recorder(work_dir), _LogLines(log, done)])
            summary = task.tune(options, search_policy=policy)
            log.write(f"measured {summary.trials} ({summary.valid} valid) in {summary.wall_secs:.1f} s: search "
                      f"{summary.search_secs:.1f} s, build {summary.build_secs:.1f} s, run {summary.run_secs:.1f} s\n")
            if summary.trials < remaining:
                log.write("stopped early: the search space has no unmeasured candidate left\n")
        database = Database(work_dir)
        try:
            best = database.query_best(task, task.target)
            log.write(f"best over the work dir: {best.cost * 1e3:.4f} ms, {best.gflops:.2f} GFLOPS"
                      f"{' (re-measured)' if best.phase == 'final' else ''}\n"
                      f"{Trace.from_json(best.trace).to_python()}\n")
        except NoValidRecordError as error:
            log.write(f"no best: {error}\n")
    return database


def compile_tir(database: Database | str | Path, mod: Any, target: Target | str):
    """The best schedule of ``mod`` on ``target`` in ``database`` (a ``Database`` or a work
    dir), replayed on ``mod``'s DAG, ready for ``tc.build``.

    Args:
        database: A ``Database`` or the path of a work dir.
        mod: The computation, as given to ``tune_tir``.
        target: A ``Target`` or a target string.

    Raises:
        NoValidRecordError: If there is no valid record; the message says why.
        TargetError: If ``target`` cannot be understood.
    """
    database = database if isinstance(database, Database) else Database(database)
    task = _task(mod, target, "main")
    return database.query_schedule(task, task.target)


def _task(mod: Any, target: Target | str, task_name: str) -> SearchTask:
    """The task whose workload key the records carry: a ``SearchTask``'s own key (that of
    its registered workload), else the DAG's, as ``SearchTask(compute_dag=...)`` has it."""
    target = target if isinstance(target, Target) else Target(target)
    if isinstance(mod, SearchTask):
        task = copy.copy(mod)
        task.target = target
        return task
    return SearchTask(compute_dag=dag_of(mod), target=target, desc=task_name)


def _recorder(work_dir: Path):
    """Where the work dir's records go: its SQLite store if it has one (several tuners may
    write it at once), else its log."""
    if (work_dir / STORE_FILE).exists():
        return RecordToStore(work_dir / STORE_FILE)
    return RecordToFile(work_dir / RECORDS_FILE)


class _LogLines:
    """Measure callback: a line per trial in ``tuning.log``, numbered over the history."""

    def __init__(self, log, done: list) -> None:
        self.log = log
        self.trials = len(done)
        self.best = min((r.mean_cost for r in done), default=float("inf"))

    def __call__(self, task, measure_inputs, measure_results, sketches=None) -> None:
        flop = task.compute_dag.flop_count()
        for n, result in enumerate(measure_results):
            sketch = f" [{sketches[n]}]" if sketches else ""
            if result.phase == "final" and result.is_valid:
                median = statistics.median(result.costs)
                self.log.write(f"re-measured{sketch}: {median * 1e3:.4f} ms, {flop / median / 1e9:.2f} GFLOPS, "
                               f"median of {len(result.costs)}\n")
                continue
            if result.phase == "final":
                self.log.write(f"re-measured{sketch}: {result.error_kind.value} error\n")
                continue
            self.trials += 1
            if result.is_valid:
                cost = result.mean_cost
                self.best = min(self.best, cost)
                self.log.write(f"trial {self.trials}: {cost * 1e3:.4f} ms, {flop / cost / 1e9:.2f} GFLOPS "
                               f"(best {self.best * 1e3:.4f} ms){sketch}\n")
            else:
                self.log.write(f"trial {self.trials}: {result.error_kind.value} error{sketch}: "
                               f"{str(result.error_msg).splitlines()[0][:200] if result.error_msg else ''}\n")
        self.log.flush()
