"""Tuning tasks: a workload on a target, tuned with measurements written to a log.

Names follow Ansor (``register_workload``, ``SearchTask``, ``TuningOptions``,
``apply_best``, ``print_best``), so the Ansor tutorial reads the same with ``tilecraft``.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..database.log import load_best_record, load_records
from ..errors import TargetError, TilecraftError
from ..measure import LocalBuilder, LocalRunner, MeasureInput
from ..measure.overlap import build_and_run
from ..runtime.cuda import cuda_available
from ..runtime.peak import peak_gflops
from ..schedule.trace import Trace
from ..target import Target
from ..te.dag import ComputeDAG
from .progress import ProgressReporter
from .remeasure import remeasure

WORKLOADS: dict[str, Callable[..., Sequence]] = {}


def register_workload(func: Callable[..., Sequence] | None = None, *, name: str | None = None):
    """Register a function returning a workload's tensors, so that a task (and a log
    record) can name it by function name and arguments.

    Use it as ``@tc.register_workload`` or ``@tc.register_workload(name="...")``. The
    function takes JSON-serialisable arguments (ints, strings) and returns its tensors,
    inputs first and outputs last, as ``ComputeDAG`` takes them. A log record of such a
    task carries the name and arguments, so ``transfer_model`` can rebuild the workload.

    Args:
        func: The function; None when called with ``name`` only.
        name: The name to register it under; its ``__name__`` by default.

    Returns:
        The function itself (or, without ``func``, a decorator).
    """

    def register(f: Callable[..., Sequence]) -> Callable[..., Sequence]:
        WORKLOADS[name or f.__name__] = f
        return f

    return register(func) if func is not None else register


@dataclass
class TuningOptions:
    """How long and how to tune. ``early_stopping``: stop after this many trials without
    a better candidate (None: never). ``verbose``: 0 silent, 1 a status line, 2 also a
    line per round. ``sketch_policy`` ("uniform" or "bandit") and ``mutation_policy``
    ("fixed" or "learned") switch the search policy's choices; None keeps its own
    (Ansor's: uniform, fixed).

    Args:
        num_measure_trials: Candidates to measure in all.
        num_measures_per_round: Candidates the search proposes and measures per round.
        early_stopping: Stop after this many trials without a better candidate; None for never.
        builder: The builder; None for a ``LocalBuilder``.
        runner: The runner; None for a ``LocalRunner``, made and closed by each ``tune`` call.
        measure_callbacks: Called as ``callback(task, inputs, results, sketches=...)`` with
            each measurement as it arrives, e.g. ``RecordToFile(log)``.
        verbose: 0 silent, 1 a status line, 2 also a line per round.
        sketch_policy: ``"uniform"`` or ``"bandit"``; None keeps the policy's own.
        mutation_policy: ``"fixed"`` or ``"learned"``; None keeps the policy's own.
        num_remeasured: When the search ends, this many of its fastest candidates, and the
            fastest of every sketch, are measured again in a fresh worker
            (``tune/remeasure.py``); their medians rank the schedules and are what the
            summary reports. 0 skips it, and the best single measurement is reported.
        remeasure_repeats: Interleaved rounds of that re-measurement, one call each.
        time_budget_secs: Stop searching once this many seconds have passed, whatever
            trials are left (a round near the end is shortened to fit, at the pace so far);
            the re-measurement then still runs. None: only ``num_measure_trials`` limits.

    Raises:
        ValueError: If ``num_measure_trials`` or ``num_remeasured`` is negative,
            ``num_measures_per_round`` or ``remeasure_repeats`` below 1, or
            ``time_budget_secs`` not positive.
    """

    num_measure_trials: int = 1000
    num_measures_per_round: int = 64
    early_stopping: int | None = None
    builder: Any = None
    runner: Any = None
    measure_callbacks: Sequence[Callable] = ()
    verbose: int = 1
    sketch_policy: str | None = None
    mutation_policy: str | None = None
    num_remeasured: int = 5
    remeasure_repeats: int = 5
    time_budget_secs: float | None = None

    def __post_init__(self) -> None:
        if self.num_measure_trials < 0 or self.num_measures_per_round < 1:
            raise ValueError("TuningOptions: num_measure_trials must be >= 0 and num_measures_per_round >= 1")
        if self.num_remeasured < 0 or self.remeasure_repeats < 1:
            raise ValueError(f"TuningOptions: num_remeasured={self.num_remeasured} must be >= 0 (0: no "
                             f"re-measurement) and remeasure_repeats={self.remeasure_repeats} >= 1")
        if self.time_budget_secs is not None and not self.time_budget_secs > 0:
            raise ValueError(f"TuningOptions: time_budget_secs={self.time_budget_secs} must be > 0 seconds, or None "
                             "for no time limit")

    def round_size(self, wanted: int, trials: int, elapsed_secs: float) -> int:
        """How many candidates the next round may measure: ``wanted``, fewer when the trials
        or the time budget run short (the round must fit in the time left at the pace of
        ``trials`` in ``elapsed_secs``); 0 when either is spent."""
        count = min(wanted, self.num_measure_trials - trials)
        if self.time_budget_secs is not None:
            left_secs = self.time_budget_secs - elapsed_secs
            if left_secs <= 0:
                return 0
            if trials:
                count = min(count, max(1, int(left_secs * trials / elapsed_secs)))
        return max(count, 0)


@dataclass
class TuningSummary:
    """What one ``tune`` call did, and where its time went (seconds). ``best_cost`` is the
    best single measurement while searching; ``final_costs`` the repeats of the best
    finalist re-measured when the search ended (empty without one), whose median,
    ``final_cost``, is the number to compare with a user's own timing."""

    trials: int = 0
    valid: int = 0
    best_cost: float = float("inf")
    final_costs: tuple[float, ...] = ()
    remeasure_secs: float = 0.0
    search_secs: float = 0.0  # evolutionary search, features and prediction
    model_secs: float = 0.0  # cost-model training
    build_secs: float = 0.0  # waiting for builds (GPU targets measure while later candidates build)
    run_secs: float = 0.0
    wall_secs: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # candidates the GPU verifier refused before any build (not trials)

    @property
    def final_cost(self) -> float:
        """The median of ``final_costs``; ``best_cost`` when nothing was re-measured."""
        return statistics.median(self.final_costs) if self.final_costs else self.best_cost


class SearchTask:
    """A computation to tune on a target: ``func(*args)`` registered with
    ``register_workload``, or a ``compute_dag`` given directly.

    The workload key names the computation in tuning logs: ``["func", *args]`` for a
    registered workload (so a log can rebuild it), else the DAG's ``workload_key``.

    Args:
        func: A registered workload function, or its name; an unregistered function is
            registered here.
        args: The arguments of ``func``.
        compute_dag: The computation, instead of ``func`` and ``args``.
        workload_key: A key to use instead of the one derived as above.
        target: A ``Target``, a target string, or None for the host.
        desc: A short description for progress lines and tables; the function's name by
            default.

    Attributes:
        compute_dag: The ``ComputeDAG`` to tune.
        workload_key: The key its records carry.
        workload: ``{"func": name, "args": [...]}`` for a registered workload, else None.
        target: The ``Target``.
        desc: The description.

    Raises:
        TilecraftError: If both or neither of ``func`` and ``compute_dag`` are given, or
            ``func`` is a name no workload is registered under.
        TargetError: If ``target`` cannot be understood.

    Example:
        Ansor's tutorial::

            task = tc.SearchTask(func=matmul_add, args=(1024, 1024, 1024, "float32"), target=tc.Target.host())
            log = "matmul.json"
            task.tune(tc.TuningOptions(num_measure_trials=1000, measure_callbacks=[tc.RecordToFile(log)]))
            sch = task.apply_best(log)
            func = tc.build(sch, task.target)
    """

    def __init__(self, func: Callable | str | None = None, args: Sequence = (), compute_dag: ComputeDAG | None = None,
                 workload_key: str | None = None, target: Target | str | None = None, desc: str = ""):
        if (func is None) == (compute_dag is None):
            raise TilecraftError("SearchTask needs either func= (a function registered with "
                                 "tc.register_workload) and args=, or compute_dag=, not both or neither")
        self.workload: dict | None = None
        if func is not None:
            name = func if isinstance(func, str) else getattr(func, "__name__", str(func))
            if name not in WORKLOADS:
                if callable(func):
                    register_workload(func)
                else:
                    raise TilecraftError(f"no workload named {name!r} is registered; decorate its function with "
                                         f"@tc.register_workload (registered: {', '.join(WORKLOADS) or 'none'})")
            compute_dag = ComputeDAG(WORKLOADS[name](*args))
            self.workload = {"func": name, "args": list(args)}
            workload_key = workload_key or json.dumps([name, *args])
        self.compute_dag = compute_dag
        self.workload_key = workload_key or compute_dag.workload_key
        self.target = target if isinstance(target, Target) else Target(target)
        self.desc = desc or (self.workload["func"] if self.workload else "")

    def __repr__(self) -> str:
        return f"SearchTask({self.workload_key}, target={self.target})"

    def tune(self, tuning_options: TuningOptions | None = None, search_policy=None,
             resume_from: str | None = None) -> TuningSummary:
        """Measure ``num_measure_trials`` candidates chosen by ``search_policy`` (a
        ``SketchPolicy`` with an XGBoost model by default). ``resume_from``: a log whose
        records warm the model and are never measured again.

        Each round the policy proposes ``num_measures_per_round`` unmeasured candidates,
        the builder and runner measure them, every result goes to the measure callbacks
        as it arrives, and the policy learns from the costs. A failing candidate is a
        result with an error kind, never an exception. Tuning stops early when the search
        space has no unmeasured candidate left or by ``early_stopping``. Then the policy's
        finalists are measured again in a fresh worker (``num_remeasured``,
        ``tune/remeasure.py``), reaching the callbacks as ``"final"`` results: their median
        is the best that ``summary.final_cost`` and ``apply_best`` report.

        Args:
            tuning_options: The budget, rounds, builder, runner and callbacks; None for the
                defaults (1,000 trials, nothing recorded).
            search_policy: The search policy; None for a new ``SketchPolicy`` of this task.
            resume_from: A tuning log to warm the policy from.

        Returns:
            A ``TuningSummary``: trials, valid ones, the best single measurement, the best
            finalist's re-measured repeats, and where the time went.

        Raises:
            ValueError: If the options name an unknown sketch or mutation policy.
            TilecraftError: If they name one and ``search_policy`` cannot switch.
            FileNotFoundError: If ``resume_from`` does not exist.

        Example:
            ::

                options = tc.TuningOptions(num_measure_trials=200, measure_callbacks=[tc.RecordToFile(log)])
                summary = task.tune(options)
                task.tune(options, resume_from=log)   # 200 more, none measured twice
        """
        from ..search.policy import SketchPolicy

        options = tuning_options or TuningOptions()
        policy = search_policy or SketchPolicy(self)
        use_policies(policy, options)
        if resume_from is not None:
            policy.preload(load_records(resume_from, self.workload_key, self.target))
        return _tune(self, policy, options)

    def apply_best(self, log_file: str):
        """The schedule of the best record in the whole log for this workload and target.

        Raises:
            NoValidRecordError: If there is none; the message says why.
        """
        record = load_best_record(log_file, self.workload_key, self.target)
        return Trace.from_json(record.trace).replay(self.compute_dag)

    def print_best(self, log_file: str) -> str:
        """The best schedule of the whole log for this workload and target, as the source of
        a Python function of a schedule (``Trace.to_python``).

        Raises:
            NoValidRecordError: If there is none; the message says why.
        """
        record = load_best_record(log_file, self.workload_key, self.target)
        return Trace.from_json(record.trace).to_python()


def use_policies(policy, options: TuningOptions) -> None:
    """Switch ``policy`` to the sketch and mutation policies that ``options`` name."""
    if options.sketch_policy is None and options.mutation_policy is None:
        return
    if not hasattr(policy, "use"):
        raise TilecraftError(f"TuningOptions names sketch_policy={options.sketch_policy!r} and mutation_policy="
                             f"{options.mutation_policy!r}, but the search policy {type(policy).__name__} cannot "
                             f"switch them; leave both None or search with a tc.SketchPolicy")
    policy.use(options.sketch_policy, options.mutation_policy)


def check_measurable(target) -> None:
    """Refuse to tune for a GPU where none can run kernels: GPU candidates are built anywhere,
    but timed only where a GPU is, and a log of launches that failed here would keep them from
    being measured where one is (a resumed tuning measures no candidate twice).

    Raises:
        TargetError: For a CUDA target on a machine where no GPU can run kernels.
    """
    if getattr(target, "kind", "llvm") == "cuda" and not cuda_available():
        raise TargetError(f"tuning for {target.arch} times CUDA kernels on a GPU, and none can run here (no GPU, "
                          "or no cuda-bindings: pip install -e '.[cuda]'); tune on a machine with one, "
                          "or schedule by hand and build with tc.build(sch, 'cuda')")


def measuring_runner(runner, *targets):
    """``runner``, or where None a ``LocalRunner``, whose worker runs CPU kernels, and CUDA
    kernels on GPU 0: a runner that measures on this machine needs a GPU here for a CUDA
    target (``check_measurable``), one that measures elsewhere (RPC, Ray) does not."""
    for target in targets if runner is None or isinstance(runner, LocalRunner) else ():
        check_measurable(target)
    return runner or LocalRunner()


def _peak_gflops(task: SearchTask) -> float | None:
    """The share of peak the progress reports is of: float32's FMA rate, twice it for a
    bfloat16 product on a CPU that sums two of its products a lane in one instruction."""
    peak = peak_gflops(task.target)
    pairs = getattr(task.target, "has_bfloat16_dot", False) and any(
        t.op.reduce_axis and "bfloat16" in {i.dtype for i in t.op.input_tensors} for t in task.compute_dag.compute_ops)
    return peak * 2 if peak and pairs else peak


def _tune(task: SearchTask, policy, options: TuningOptions) -> TuningSummary:
    builder = options.builder or LocalBuilder()
    runner = measuring_runner(options.runner, task.target)
    summary = TuningSummary()
    started = time.perf_counter()
    since_best = 0
    peak = _peak_gflops(task) if options.verbose else None
    reporter = ProgressReporter(options.num_measure_trials, options.verbose, peak, task.desc or task.workload_key,
                                time_budget_secs=options.time_budget_secs)
    try:
        while count := options.round_size(options.num_measures_per_round, summary.trials,
                                          time.perf_counter() - started):
            best_before = summary.best_cost
            results = tune_round(task, policy, count, builder, runner, options.measure_callbacks, summary, reporter)
            if not results:
                reporter.note("the search space is exhausted: every candidate it found was measured")
                break
            for result in results:
                if result.mean_cost < best_before:
                    best_before, since_best = result.mean_cost, 0
                else:
                    since_best += 1
            reporter.note(f"round done: {summary.trials} trials, best {summary.best_cost * 1e3:.3f} ms")
            if options.early_stopping is not None and since_best >= options.early_stopping:
                reporter.note(f"early stopping: no better candidate in the last {since_best} trials")
                break
        final_round(task, policy, options, builder, runner, summary, reporter)
    finally:
        reporter.close()
        if options.runner is None:
            runner.close()
    summary.wall_secs = time.perf_counter() - started
    return summary


def final_round(task: SearchTask, policy, options: TuningOptions, builder, runner, summary: TuningSummary,
                reporter: ProgressReporter | None) -> None:
    """Re-measure the search's finalists (``tune/remeasure.py``) and put the best one's
    repeats in ``summary`` (and the reporter's summary)."""
    if not options.num_remeasured or not hasattr(policy, "finalists") or not summary.valid:
        return
    clock = time.perf_counter()
    if reporter is not None:
        reporter.phase("re-measuring")
    results = remeasure(task, policy.finalists(options.num_remeasured), builder, runner, options.remeasure_repeats,
                        options.measure_callbacks)
    summary.remeasure_secs += time.perf_counter() - clock
    valid = [r for r in results if r.is_valid]
    if valid:
        summary.final_costs = min((r.costs for r in valid), key=statistics.median)
        if reporter is not None:
            reporter.remeasured(task.compute_dag.flop_count(), summary.final_costs, len(results))


def tune_round(task: SearchTask, policy, count: int, builder, runner, callbacks: Sequence[Callable],
               summary: TuningSummary, reporter: ProgressReporter) -> list:
    """Search, build and measure up to ``count`` candidates of ``task`` and learn from
    them; each result reaches ``callbacks`` and ``reporter`` as it arrives, and
    ``summary`` counts them. An empty list when the search space is exhausted."""
    flop = task.compute_dag.flop_count()
    clock = time.perf_counter()
    candidates = policy.next_batch(count)
    summary.search_secs += time.perf_counter() - clock
    summary.rejected = reporter.rejected = getattr(policy, "rejected", 0)
    if not candidates:
        return []
    sketches = [policy.sketches[c.sketch].name for c in candidates]
    inputs = [MeasureInput(task.compute_dag, task.target, policy.trace_of(c)) for c in candidates]

    def record(index: int, result) -> None:
        for callback in callbacks:
            callback(task, [inputs[index]], [result], sketches=[sketches[index]])
        cost = result.mean_cost
        reporter.update(flop / cost / 1e9 if result.is_valid else None,
                        cost if result.is_valid else None, result.error_kind.value)

    on_gpu = getattr(task.target, "kind", "llvm") == "cuda"  # timed on the GPU: measure while the rest build
    results, build_secs, run_secs = build_and_run(inputs, builder, runner, record, overlap=on_gpu)
    summary.build_secs += build_secs
    summary.run_secs += run_secs
    clock = time.perf_counter()
    policy.update(candidates, [r.mean_cost for r in results])
    summary.model_secs += time.perf_counter() - clock
    for result in results:
        summary.trials += 1
        if result.is_valid:
            summary.valid += 1
        else:
            summary.errors[result.error_kind.value] = summary.errors.get(result.error_kind.value, 0) + 1
        summary.best_cost = min(summary.best_cost, result.mean_cost)
    return results
