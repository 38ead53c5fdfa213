"""The ``tilecraft`` command line.

    tilecraft tune NAME --shape 1024,1024,1024 [--trials N] [--log LOG]  tune a built-in workload
    tilecraft best LOG [--workload KEY] [--target TARGET]     what a log holds, and the best schedules
    tilecraft report LOG [-o report.png] [--workload KEY]      best-so-far GFLOPS by trial and by time
    tilecraft tasks MODEL.onnx                                 the tuning tasks of a model, with FLOPs and weights
    tilecraft tune-model MODEL.onnx [--trials N] [--log LOG]   tune all the tasks of a model, one shared budget
    tilecraft choose-in-place MODEL.onnx --log LOG             time each task's best schedules inside the model
    tilecraft run-model MODEL.onnx [--log LOG] [--input X.npy] compile (or load a saved model dir), run, time
    (MODEL: an .onnx file, or a .pt2 file that torch.export.save wrote)
    tilecraft serve [--port 9190] [--secret-file FILE]          measure candidates for tuners elsewhere (RPCRunner)
    tilecraft db import STORE LOG... | export STORE LOG         tuning logs into and out of a SQLite store

Each command is one ``add_<name>_command(subparsers)`` function that declares its
arguments and sets ``run``, the function that carries it out; ``COMMANDS`` lists them.
A command returns its exit status.

Errors a person reads: a mistake in the arguments is caught before any work starts and
exits with status 2 and one line that names the argument and the fix, never a traceback.
The checks of a single argument are argparse types (``_sizes``, ``_at_least``,
``_duration``, ``_target``, ``_pattern``, ``_tuning_log``, ...), so argparse prints them
as its own errors, after the usage; those that need more than one argument or the model
(``--shape`` against the workload's signature, ``--tasks`` against the model's tasks)
raise ``CommandError``, printed as one line. Any other ``TilecraftError`` or ``OSError``
of a command (a failed build, no valid record) is one line with status 1; ``--debug``
shows its traceback. Other exceptions are bugs and keep theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .database import (NoValidRecordError, RecordFormatError, RecordToFile, TuningRecord, WorkloadSummary,
                       canonical_target, iter_records, load_best_record, summarize, workload_label)
from .errors import TargetError, TilecraftError
from .measure import LocalRunner
from .measure.runner import visible_gpu_ids
from .search.policy import SketchPolicy
from .search.shared_model import SharedCostModel
from .tables import print_table
from .target import CudaTarget, Target
from .te.dtype import DTYPES, from_npy
from .tune.transfer import DEFAULT_RECORDS, transfer_model
from .tune.scheduler import STRATEGIES, TaskScheduler
from .tune.task import WORKLOADS, SearchTask, TuningOptions, check_measurable

PLOT_INSTALL_HINT = "pip install 'tilecraft[plot]'"


class CommandError(TilecraftError, argparse.ArgumentTypeError):
    """A command cannot run as asked; the message says why. Raised by an argparse type, argparse
    prints it as an error of the argument; raised by a command, ``main`` prints it (status 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except (TilecraftError, OSError) as error:
            if args.debug:
                raise
            print(f"tilecraft {args.command}: error: {error}", file=sys.stderr)
            return 2 if isinstance(error, CommandError) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilecraft", description="Automatic scheduling of tensor programs.",
        epilog="Exit status: 0 done, 1 the command failed, 2 a mistake in the arguments (one line says which "
               "and how to fix it).")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error, for a bug report")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


# -- tilecraft tune -------------------------------------------------------------------

def add_tune_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "tune", help="tune a built-in workload and append every measurement to a log",
        description="Tune a registered workload on this machine. The log is resumed when it exists: what it "
                    "holds of this workload is never measured again. The cost model first learns a sample of "
                    "what the log and tilecraft's default database hold of other workloads on this target, "
                    "or the nearest one of its ISA (see --no-transfer).")
    command.add_argument("workload", choices=sorted(WORKLOADS), metavar="WORKLOAD",
                         help=f"one of: {', '.join(sorted(WORKLOADS))}")
    sizes = "; ".join(f"{name}: {_describe_sizes(name)}" for name in sorted(WORKLOADS))
    command.add_argument("--shape", required=True, type=_sizes, metavar="N,N,...",
                         help=f"the workload's sizes, comma-separated, those in brackets optional ({sizes})")
    command.add_argument("--dtype", default="float32", choices=DTYPES, metavar="DTYPE",
                         help=f"the element type, one of {', '.join(DTYPES)} (default float32)")
    command.add_argument("--out-dtype", choices=DTYPES, metavar="DTYPE",
                         help="sum into this type instead (matmul: bfloat16 into float32, as TVM's out_dtype)")
    command.add_argument("--trials", type=_at_least(1, "the number of measurements to make"), default=1000,
                         help="measurements to make (default 1000)")
    command.add_argument("--per-round", type=_at_least(1, "the measurements per search round"), default=64,
                         help="measurements per search round (default 64)")
    command.add_argument("--log", type=_tuning_log_to_append, help="the JSON-lines log (default: WORKLOAD.json)")
    command.add_argument("--target", type=_target, help="target string (default: this machine)")
    _add_gpus_argument(command)
    _add_transfer_arguments(command, "in --log and ")
    _add_time_argument(command)
    _add_remeasure_argument(command)
    command.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    command.set_defaults(run=run_tune)


def _add_time_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--time", metavar="DURATION", type=_duration,
                         help="stop searching after this long, such as 90s, 10m or 1h30m, even if trials are left "
                              "(whichever comes first); the re-measurement at the end still runs")


def _add_remeasure_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--remeasure", type=_at_least(0, "the number of finalists to measure again (0: none)"),
                         default=5, metavar="K",
                         help="when the search ends, measure its K fastest candidates and every sketch's fastest "
                              "again, interleaved, in a fresh worker; the best is the median of that (default 5; "
                              "0: the best single measurement)")


def _add_transfer_arguments(command: argparse.ArgumentParser, implicit: str) -> None:
    command.add_argument("--transfer", action="append", default=[], metavar="LOG", type=_tuning_log,
                         help="a log of other workloads tuned on this target: the cost model learns a sample of "
                              "each one's records before the first measurement (repeat for more logs)")
    command.add_argument("--no-transfer", action="store_true",
                         help=f"do not learn from the other workloads {implicit}the default database: start "
                              "the cost model from nothing")


def run_tune(args: argparse.Namespace) -> int:
    gpus = _measuring_gpus(args)
    task = SearchTask(func=args.workload, args=_workload_args(args.workload, args.shape, args.dtype, args.out_dtype),
                      target=args.target)
    check_measurable(task.target)  # before the cost model is taught, and before the log is written
    log = Path(args.log or _tuning_log_to_append(f"{args.workload}.json"))
    resume = str(log) if log.exists() else None
    model = _taught_model(task, resume, args)
    with contextlib.ExitStack() as stack:
        runner = None if gpus is None else stack.enter_context(LocalRunner(gpus=gpus))
        options = TuningOptions(num_measure_trials=args.trials, num_measures_per_round=args.per_round, runner=runner,
                                measure_callbacks=[RecordToFile(log)], verbose=args.verbose,
                                num_remeasured=args.remeasure, time_budget_secs=args.time)
        task.tune(options, search_policy=SketchPolicy(task, model) if model else None, resume_from=resume)
    best = load_best_record(log, task.workload_key, task.target)
    print(f"best of the whole log {log}: {best.gflops:.1f} GFLOPS, {best.cost * 1e3:.3f} ms{_how_measured(best)}; "
          f"see it with: tilecraft best {log}")
    return 0


def _workload_args(workload: str, shape: tuple[int, ...], dtype: str, out_dtype: str | None = None) -> tuple:
    """The arguments of a registered workload: the sizes of ``--shape``, the defaults of the
    optional ones it leaves out, then the dtype, and the ``out_dtype`` where given (the
    parameters between them at their defaults)."""
    sizes = _size_parameters(workload)
    required = sum(p.default is p.empty for p in sizes)
    if not required <= len(shape) <= len(sizes):
        takes = f"{required}" if required == len(sizes) else f"{required} to {len(sizes)}"
        raise CommandError(f"--shape: {workload} takes {takes} sizes ({_describe_sizes(workload)}), got "
                           f"{len(shape)}: {','.join(map(str, shape))}")
    given = (*shape, *(p.default for p in sizes[len(shape):]), dtype)
    if out_dtype is None:
        return given
    after = list(inspect.signature(WORKLOADS[workload]).parameters.values())[len(given):]
    if "out_dtype" not in [p.name for p in after]:
        takers = [name for name in sorted(WORKLOADS) if "out_dtype" in inspect.signature(WORKLOADS[name]).parameters]
        raise CommandError(f"--out-dtype: {workload} sums in its own dtype; {', '.join(takers)} take(s) another")
    return (*given, *(p.default for p in after[:[p.name for p in after].index("out_dtype")]), out_dtype)


def _size_parameters(workload: str) -> list[inspect.Parameter]:
    """The parameters of a registered workload that ``--shape`` gives: those before its dtype
    (any after it, a padding ``multiple``, keep their defaults)."""
    parameters = list(inspect.signature(WORKLOADS[workload]).parameters.values())
    names = [p.name for p in parameters]
    return parameters[:names.index("dtype")] if "dtype" in names else parameters


def _describe_sizes(workload: str) -> str:
    """``N, L, M``; the optional ones in brackets: ``N, C, H, W, F, KH, KW[, stride, padding]``."""
    sizes = _size_parameters(workload)
    optional = ", ".join(p.name for p in sizes if p.default is not p.empty)
    return ", ".join(p.name for p in sizes if p.default is p.empty) + (f"[, {optional}]" if optional else "")


def _taught_model(task: SearchTask | list[SearchTask], resume: str | None,
                  args: argparse.Namespace) -> SharedCostModel | None:
    """A cost model that first learned the other workloads of the ``--transfer`` logs, of the
    resumed log and of the default database (on the 1x1 convolution, it reached 90% of the
    untaught search's final in a third of its trials: docs/experiments/transfer-from-other-logs.md);
    None, the default model, when there is nothing to learn."""
    logs = args.transfer
    implicit = [] if args.no_transfer else [log for log in (resume, str(DEFAULT_RECORDS)) if log and log not in logs]
    try:
        model = transfer_model([*logs, *implicit], task)
    except ValueError as error:
        if logs:
            raise CommandError(f"--transfer: {error}") from None
        if args.verbose:  # none of its kind, only its own records, or none of this ISA
            print(f"the cost model starts from nothing: {error}")
        return None
    if args.verbose:
        donors = len(model.groups)
        named = ", ".join("the default database" if log == str(DEFAULT_RECORDS) else log for log in [*logs, *implicit])
        print(f"the cost model first learns {model.model.num_samples} records of {donors} other workload"
              f"{'s' * (donors != 1)} in {named}" + (" (--no-transfer: start from nothing)" if implicit else ""))
    return model


# -- tilecraft best -------------------------------------------------------------------

def add_best_command(subparsers: Any) -> None:
    command = subparsers.add_parser("best", help="summarize a tuning log and print its best schedules",
                                    description="A table per workload and target of a tuning log (records, "
                                                "valid, errors by kind, best GFLOPS and latency), then the best "
                                                "schedule of each as Python. Best is over the whole log.")
    _add_log_arguments(command)
    command.set_defaults(run=run_best)


def run_best(args: argparse.Namespace) -> int:
    from rich.console import Console

    summaries = _select(args.log, args.workload, args.target)
    console = Console(highlight=False)
    print_table(_summary_table(summaries, Path(args.log).name), console)
    for summary in summaries:
        console.print()
        if summary.best is None:
            console.print(f"# {summary.label} on {summary.target}: no valid record, all {summary.count} are "
                          f"errors (most common: {summary.common_error_msg!r})", markup=False, soft_wrap=True)
            continue
        console.print(_best_header(summary), markup=False, soft_wrap=True)
        console.print(_schedule_as_python(summary.best), markup=False, soft_wrap=True)
    if all(summary.best is None for summary in summaries):
        raise NoValidRecordError(f"none of the {sum(s.count for s in summaries)} records selected in {args.log} "
                                 f"is valid (the errors are counted above)")
    return 0


def _summary_table(summaries: list[WorkloadSummary], title: str):
    from rich.table import Table

    targets = {s.target for s in summaries}
    one_target = len(targets) == 1  # then it is named once, under the table, not on every row
    table = Table(title=f"Tuning log {title}", title_justify="left", caption_justify="left",
                  caption=f"target: {next(iter(targets))}" if one_target else None)
    columns = ["workload"] + ([] if one_target else ["target"])
    columns += ["records", "valid", "errors", "best GFLOPS", "best latency", "sketch"]
    for name in columns:
        numeric = name in ("records", "valid", "best GFLOPS", "best latency")
        table.add_column(name, justify="right" if numeric else "left", overflow="fold", no_wrap=numeric)
    for s in summaries:
        best = s.best
        row = [s.label] + ([] if one_target else [s.target])
        row += [str(s.count), str(s.valid), ", ".join(f"{kind} {n}" for kind, n in s.errors.items()) or "-",
                f"{best.gflops:.2f}" if best else "-", f"{best.cost * 1e3:.4g} ms" if best else "-",
                (best.sketch or "-") if best else "-"]
        table.add_row(*row)
    return table


def _best_header(summary: WorkloadSummary) -> str:
    best = summary.best
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(best.timestamp))
    return (f"# Best of {summary.label}: {best.gflops:.2f} GFLOPS, {best.cost * 1e3:.4g} ms{_how_measured(best)}, "
            f"sketch {best.sketch or '-'}, measured {when}\n"
            f"# workload key: {summary.workload_key}\n# target: {summary.target}")


def _how_measured(record: TuningRecord) -> str:
    """`` (median of 5 re-measured)`` for a final record, `` (median of 8 in the model)`` for a
    model record: the rule of database/best.py."""
    how = {"final": "re-measured", "model": "in the model"}.get(record.phase)
    return f" (median of {len(record.costs)} {how})" if how else ""


def _schedule_as_python(record: TuningRecord) -> str:
    from .schedule.trace import Trace

    try:
        return Trace.from_json(record.trace).to_python()
    except TilecraftError as error:
        return f"# the trace of this record cannot be read: {error}"


# -- tilecraft report -----------------------------------------------------------------

def add_report_command(subparsers: Any) -> None:
    command = subparsers.add_parser("report", help="plot best-so-far GFLOPS of a tuning log",
                                    description="A PNG with two panels: best-so-far GFLOPS against the trial "
                                                "number and against wall time, every trial a point, errors "
                                                f"marked. Needs matplotlib ({PLOT_INSTALL_HINT}).")
    _add_log_arguments(command)
    command.add_argument("-o", "--output", type=Path, default=None,
                         help="the PNG to write (default: LOG with the suffix .png)")
    command.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    _select(args.log, args.workload, args.target)  # the same checks and messages as `best`
    figure_cls = _matplotlib_figure()
    target = canonical_target(args.target)
    groups: dict[tuple[str, str], list[TuningRecord]] = {}
    for record in iter_records(args.log, target=target):
        if args.workload is None or _matches(record.workload_key, record.workload, args.workload):
            groups.setdefault((record.workload_key, record.target), []).append(record)
    output = args.output or Path(args.log).with_suffix(".png")
    figure = figure_cls(figsize=(13, 5), layout="constrained")
    by_trial, by_time = figure.subplots(1, 2)
    start = min(r.timestamp for records in groups.values() for r in records)
    span = max(r.timestamp for records in groups.values() for r in records) - start
    time_unit, time_scale = ("h", 3600.0) if span > 7200 else ("min", 60.0) if span > 120 else ("s", 1.0)
    several_targets = len({target for _, target in groups}) > 1
    for n, records in enumerate(groups.values()):
        color = f"C{n % 10}"
        label = workload_label(records[0].workload_key, records[0].workload)
        label = _short(f"{label} on {records[0].target}" if several_targets else label)
        trials = list(range(1, len(records) + 1))
        times = [(r.timestamp - start) / time_scale for r in records]
        for axes, xs in ((by_trial, trials), (by_time, times)):
            _plot_group(axes, xs, records, color, label, errors_label="errors" if n == 0 else None)
    by_trial.set(xlabel="trial", ylabel="GFLOPS", title="best so far, by trial")
    by_time.set(xlabel=f"wall time ({time_unit}) since the first record", ylabel="GFLOPS",
                title="best so far, by wall time")
    for axes in (by_trial, by_time):
        axes.grid(alpha=0.3)
        axes.set_ylim(bottom=0)
    by_trial.legend(loc="lower right", fontsize="small")
    figure.suptitle(f"tilecraft tuning log {Path(args.log).name}"
                    + ("" if several_targets else f"\ntarget: {next(iter(groups))[1]}"), fontsize="medium")
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    total = sum(len(records) for records in groups.values())
    print(f"wrote {output} ({total} trials of {len(groups)} workload/target pair(s))")
    return 0


def _plot_group(axes, xs: list[float], records: list[TuningRecord], color: str, label: str,
                errors_label: str | None) -> None:
    gflops = [r.gflops if r.is_valid else math.nan for r in records]
    best, running = [], math.nan
    for value in gflops:
        if not math.isnan(value) and not value <= running:
            running = value
        best.append(running)
    valid_x = [x for x, g in zip(xs, gflops) if not math.isnan(g)]
    axes.scatter(valid_x, [g for g in gflops if not math.isnan(g)], s=9, color=color, alpha=0.35, linewidths=0)
    axes.plot(xs, best, drawstyle="steps-post", color=color, linewidth=1.8, label=label)
    error_x = [x for x, g in zip(xs, gflops) if math.isnan(g)]
    if error_x:
        axes.scatter(error_x, [0.0] * len(error_x), marker="x", s=16, color="red", linewidths=1,
                     label=errors_label, clip_on=False, zorder=3)


def _matplotlib_figure() -> Callable[..., Any]:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    except ImportError:
        raise CommandError(f"the report needs matplotlib, which is not installed: {PLOT_INSTALL_HINT}") from None
    return Figure


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


# -- tilecraft tasks, tilecraft run-model ---------------------------------------------

def add_tasks_command(subparsers: Any) -> None:
    command = subparsers.add_parser("tasks", help="list the tuning tasks of an ONNX model",
                                    description="The distinct fused subgraphs of a model, one tuning task each: "
                                                "operators, output shape, FLOPs and how often the model runs it.")
    _add_model_arguments(command)
    command.set_defaults(run=run_tasks)


def run_tasks(args: argparse.Namespace) -> int:
    from .model.tasks import extract_tasks, print_tasks

    tasks, weights = extract_tasks(_onnx_model(args), args.target, dict(args.input_shape))
    print_tasks(tasks, weights)
    return 0


def add_tune_model_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "tune-model", help="tune every task of an ONNX model with one shared budget",
        description="Extract the model's tasks and tune them with the task scheduler (Ansor's gradient policy), "
                    "every measurement appended to one log. A log that exists is resumed: its tasks skip the "
                    "warm-up and its candidates are never measured again. The shared cost model first learns a sample "
                    "of what tilecraft's default database holds of operators on this target, or the nearest one of "
                    "its ISA (see --no-transfer). Then: tilecraft run-model MODEL --log LOG")
    _add_model_arguments(command)
    command.add_argument("--trials", type=_at_least(1, "the number of measurements to make"), default=2000,
                         help="measurements over all tasks (default 2000)")
    command.add_argument("--per-round", type=_at_least(1, "the measurements per round of a task"), default=64,
                         help="measurements per round of a task (default 64)")
    command.add_argument("--log", type=_tuning_log_to_append,
                         help="the JSON-lines log (default: the model's name with .json)")
    command.add_argument("--warm-up", type=_at_least(1, "the measurements of each task's first round"),
                         metavar="TRIALS",
                         help="measurements in each task's first round (default: --per-round, as Ansor); fewer "
                              "reach a whole tuned model sooner when it has many tasks")
    command.add_argument("--strategy", choices=STRATEGIES, default="gradient")
    command.add_argument("--per-task-early-stopping", type=_at_least(1, "the trials without improvement that stop "
                                                                       "a task"), metavar="TRIALS",
                         help="stop tuning a task after this many trials without improvement")
    command.add_argument("--tasks", metavar="REGEX", type=_pattern,
                         help="tune only the tasks whose description (as `tilecraft tasks` prints it) matches")
    command.add_argument("--cache-flush", action="store_true",
                         help="flush the caches before every timed call, as a layer whose weights come from memory "
                              "finds them inside a large model; keep such a log apart from a warm one and give it "
                              "first to run-model")
    _add_gpus_argument(command)
    _add_transfer_arguments(command, "of ")
    _add_time_argument(command)
    _add_remeasure_argument(command)
    command.add_argument("--in-place", type=_in_place_candidates, default=4, metavar="N",
                         help="when tuning ends, time each task's N best schedules inside the compiled model and "
                              "choose the fastest there (tc.choose_in_place; default 4, 0 to skip; CPU targets)")
    command.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    command.set_defaults(run=run_tune_model)


def run_tune_model(args: argparse.Namespace) -> int:
    from .model.tasks import extract_tasks, print_tasks

    gpus = _measuring_gpus(args)
    check_measurable(Target(args.target))  # before the import: its LocalRunner would log every launch as failed
    model = _onnx_model(args)
    tasks, weights = extract_tasks(model, args.target, dict(args.input_shape))
    if args.tasks is not None:
        chosen = [n for n, task in enumerate(tasks) if args.tasks.search(task.desc)]
        if not chosen:
            raise CommandError(f"--tasks {args.tasks.pattern!r} matches none of the model's tasks: "
                               + "; ".join(task.desc for task in tasks))
        tasks, weights = [tasks[n] for n in chosen], [weights[n] for n in chosen]
    log = Path(args.log or _tuning_log_to_append(Path(args.model).with_suffix(".json").name))
    if args.verbose:
        print_tasks(tasks, weights)
    scheduler = TaskScheduler(tasks, weights, strategy=args.strategy, load_log_file=str(log) if log.exists() else None,
                              warm_up_trials=args.warm_up, cost_model=_taught_model(tasks, None, args))
    with LocalRunner(enable_cpu_cache_flush=args.cache_flush, gpus=gpus) as runner:
        options = TuningOptions(num_measure_trials=args.trials, num_measures_per_round=args.per_round, runner=runner,
                                measure_callbacks=[RecordToFile(log)], verbose=args.verbose,
                                num_remeasured=args.remeasure, time_budget_secs=args.time)
        latency = scheduler.tune(options, per_task_early_stopping=args.per_task_early_stopping)
    print(f"model latency as the sum of weight x best kernel latency: {latency * 1e3:.3f} ms; log {log}")
    if args.in_place and _is_cpu(args.target):
        from .model.in_place import choose_in_place

        choose_in_place(model, log, args.target, candidates=args.in_place, input_shapes=dict(args.input_shape),
                        verbose=args.verbose)
    print(f"run it with: tilecraft run-model {args.model} --log {log}")
    return 0


def add_choose_in_place_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "choose-in-place", help="time each task's best schedules inside the compiled model and keep the fastest",
        description="Compile the model with the log's best schedules, then time each task's few best schedules "
                    "inside it, where each layer's weights come from memory; keep the one in use unless another is "
                    "faster in nearly every interleaved round (a paired test), and append their times to the log, "
                    "the kept one's as a model record, which ranks first: the model compiled from the log is then "
                    "the one chosen. tune-model does this when it ends; this command does it for a log tuned before.")
    _add_model_arguments(command)
    command.add_argument("--log", required=True, type=_tuning_log, help="the model's tuning log; appended to")
    command.add_argument("--candidates", type=_at_least(2, "the schedules to time of each task"), default=4,
                         metavar="N",
                         help="the best schedules of each task to time (default 4)")
    command.add_argument("--rounds", type=_at_least(5, "the interleaved rounds (a paired test)"), default=8,
                         help="interleaved rounds, each timing every candidate (default 8, at least 5); another "
                              "schedule replaces the one in use only where it is faster in nearly every round")
    command.add_argument("--verbose", type=int, default=1, choices=(0, 1))
    command.set_defaults(run=run_choose_in_place)


def run_choose_in_place(args: argparse.Namespace) -> int:
    from .model.in_place import choose_in_place

    if not _is_cpu(args.target):
        raise CommandError(f"--target {args.target}: models are timed in place on this machine's CPU only")
    choose_in_place(_onnx_model(args), args.log, args.target, candidates=args.candidates, rounds=args.rounds,
                    input_shapes=dict(args.input_shape), verbose=args.verbose)
    print(f"run it with: tilecraft run-model {args.model} --log {args.log}")
    return 0


def add_run_model_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "run-model", help="compile an ONNX model and run it once, with its latency",
        description="Compile an ONNX model with the best schedules of a tuning log (the default schedule for the "
                    "rest), or load a model saved with CompiledModel.save (a directory); run it on the given inputs "
                    "(random ones by default), print the outputs' shapes and first values and the latency.")
    _add_model_arguments(command)
    command.add_argument("--log", action="append", metavar="LOG", type=_tuning_log,
                         help="a tuning log to take schedules from; repeated, a kernel's schedule comes from the "
                              "first log with a record for it")
    command.add_argument("--input", action="append", default=[], metavar="[NAME=]X.npy", type=_input_file,
                         help="an input array; NAME= may be left out for a model with one input (repeatable)")
    command.add_argument("--output", type=Path, help="save the output to this .npy (several: one file each)")
    command.add_argument("--profile", action="store_true",
                         help="also list each kernel's time inside a model call, most expensive first")
    command.add_argument("--emulate", action="store_true",
                         help="with --target cuda: run the GPU kernels emulated on this CPU (no GPU needed), to check "
                              "the outputs; no latency")
    command.add_argument("--cuda-source", action="store_true",
                         help="with --emulate: run the kernels' CUDA C itself on this CPU, each thread a fiber, under "
                              "sanitizers (checks the code generator too; slower)")
    command.set_defaults(run=run_run_model)


def run_run_model(args: argparse.Namespace) -> int:
    import numpy as np

    from .model.compiled import ModelInputError, ModelLoadError, compile_model, load_model
    from .runtime.timer import time_callable

    if args.cuda_source and not args.emulate:
        raise CommandError("--cuda-source: it says how --emulate runs the kernels; add --emulate")
    path = Path(args.model)
    try:
        model = load_model(path) if path.is_dir() else compile_model(_onnx_model(args), args.target, args.log,
                                                                     dict(args.input_shape))
    except ModelLoadError as error:
        raise CommandError(f"MODEL: {error}") from None
    if args.emulate and not hasattr(model, "emulate"):
        raise CommandError("--emulate: only a model compiled for a GPU is emulated; add --target cuda")
    inputs = _read_inputs(args.input, model.inputs)
    try:
        outputs = model.emulate(inputs, args.cuda_source) if args.emulate else model.run(inputs)
    except ModelInputError as error:
        raise CommandError(f"--input: {error}") from None
    except TilecraftError as error:  # a loaded GPU model keeps no DAGs to emulate
        raise CommandError(f"--emulate: {error}") from None
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)} {np.array2string(array.reshape(-1)[:6], precision=4)}")
    if args.emulate:
        _save_outputs(args.output, outputs)
        return 0
    result = time_callable(lambda: model.run(inputs), number=1, repeat=7, min_repeat_ms=20)
    print(f"latency: {result.median * 1e3:.3f} ms (median of {len(result.results)})")
    if args.profile:
        _print_profile(model.profile(inputs))
    _save_outputs(args.output, outputs)
    return 0


def _save_outputs(output: Path | None, outputs: dict) -> None:
    import numpy as np

    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            file = output if len(outputs) == 1 else output.with_name(f"{output.stem}_{name}.npy")
            np.save(file, array, allow_pickle=False)
            print(f"wrote {file}")


def _print_profile(times) -> None:
    from rich.table import Table

    total = sum(t.seconds for t in times)
    table = Table()
    for name in ("kernel", "calls", "ms", "share", "schedule"):
        table.add_column(name, justify="right" if name in ("calls", "ms", "share") else "left", no_wrap=True)
    for t in times:
        table.add_row(t.desc, str(t.calls), f"{t.seconds * 1e3:.3f}", f"{t.seconds / (total or 1.0):.1%}",
                      "tuned" if t.tuned else "default")
    table.add_section()
    table.add_row("all kernels", str(sum(t.calls for t in times)), f"{total * 1e3:.3f}", "", "")
    print_table(table)


# -- tilecraft serve ------------------------------------------------------------------

def add_serve_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "serve", help="measure candidates for tuners on other machines (tc.RPCRunner)",
        description="Serve this machine as a measuring device: a tuner elsewhere connects with tc.RPCRunner, builds "
                    "for the target printed here, and sends candidates, each checked and timed in an isolated "
                    "worker. Clients must hold the secret. It listens on 127.0.0.1 unless --host says otherwise, "
                    "and beyond loopback only with --secret-file. Ctrl-C stops it.")
    command.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    command.add_argument("--port", type=_at_least(0, "a TCP port (0: any free one)"), default=9190, help="default 9190")
    command.add_argument("--secret-file", help="a file holding the shared secret, 16 bytes or more (make one with "
                                               "python -c 'import secrets; print(secrets.token_hex(32))' > FILE)")
    command.add_argument("--key", default="cpu", help="the device's label, RPCRunner's key= (default cpu)")
    command.add_argument("--target", type=_target, help="the target to report (default: this machine)")
    command.add_argument("--device", type=_cuda_devices, metavar="cuda:N[,cuda:M...]",
                         help="measure CUDA kernels on these GPUs instead of CPU kernels, a client's session on each, "
                              "all at once (RPCRunner opens a session a GPU); GPUs of one kind, the first one's arch "
                              "the target")
    command.add_argument("--certfile", help="serve TLS with this PEM certificate (clients pass ca_file=)")
    command.add_argument("--keyfile", help="the certificate's private key, when not in --certfile")
    command.set_defaults(run=run_serve)


def _cuda_device(text: str) -> int:
    if not re.fullmatch(r"cuda:\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU; write cuda:0 (the first), cuda:1, ...")
    return int(text.split(":")[1])


def _cuda_devices(text: str) -> tuple[int, ...]:
    devices = tuple(_cuda_device(item.strip()) for item in text.split(","))
    if len(set(devices)) < len(devices):
        raise argparse.ArgumentTypeError(f"{text!r} names a GPU twice; name each once, as in cuda:0,cuda:1")
    return devices


def _add_gpus_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--device", type=_cuda_devices, metavar="cuda:N[,cuda:M...]",
                         help="with a CUDA target: measure on these GPUs, each in a worker of its own, all at once "
                              "(default cuda:0); GPUs of one kind, the first one's arch the target")


def _show_only_gpus(devices: Sequence[int]) -> None:
    """Let this process, its workers and the target's reading of GPU 0 see ``devices`` alone, in
    that order, each counted as the process saw it (within ``CUDA_VISIBLE_DEVICES`` where set)."""
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpu_ids(devices).values())
    except ValueError as error:
        raise CommandError(f"--device: {error}") from None


def _measuring_gpus(args: argparse.Namespace) -> tuple[int, ...] | None:
    """The ordinals of the GPUs ``--device`` names once this process sees those alone; the
    target, when ``--target`` gives none, is the first one's. None without ``--device``."""
    if args.device is None:
        return None
    if args.target is not None and _is_cpu(args.target):
        raise CommandError(f"--device measures CUDA kernels, and --target {args.target} is a CPU; give a CUDA "
                           f"target (or none: the first GPU's)")
    _show_only_gpus(args.device)
    args.target = args.target or CudaTarget.device()  # no GPU there: a TargetError, one line
    return tuple(range(len(args.device)))


def run_serve(args: argparse.Namespace) -> int:
    from .measure import DeviceServer
    from .measure.rpc_protocol import secret_bytes

    gpus = _measuring_gpus(args)  # the workers (and the target's reading of "GPU 0") see those GPUs alone
    with DeviceServer(args.host, args.port, secret_bytes(None, args.secret_file), args.key, target=args.target,
                      certfile=args.certfile, keyfile=args.keyfile, log=lambda line: print(line, flush=True),
                      gpus=gpus) as server:
        print(f"tilecraft serve: device {server.key!r} on {args.host}:{server.port}"
              f"{'' if server.secret else ' without a secret: any local user may run code as you'}\n"
              f"target: {server.target}", flush=True)
        if gpus:
            print(f"measuring on GPU(s) {', '.join(server.gpu_ids.values())}, a session on each", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("tilecraft serve: stopped")
    return 0


def _add_model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", metavar="MODEL",
                         help="an ONNX model file, or a PyTorch program that torch.export.save wrote (.pt2)")
    command.add_argument("--target", type=_target, help="target string (default: this machine)")
    command.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...", type=_input_shape,
                         help="the shape of an input with dynamic sizes (repeatable)")


def _onnx_model(args: argparse.Namespace):
    """The ONNX model of the file MODEL, read once; the error names a missing file or package, or
    an ``--input-shape`` of no input."""
    model = args.model
    if not Path(model).is_file():
        raise CommandError(f"MODEL: {model} does not exist" if not Path(model).exists() else
                           f"MODEL: {model} is not a file; give an ONNX model (.onnx)")
    if Path(model).suffix == ".pt2":  # a program saved by torch.export.save, exported to ONNX here
        from .frontend import OnnxImportError
        from .frontend.torch import from_export_file

        try:
            loaded = from_export_file(model)
        except (ImportError, OnnxImportError) as error:
            raise CommandError(f"MODEL: {error}") from None
    else:
        try:
            import onnx
        except ImportError:
            raise CommandError("reading an ONNX model needs the onnx package: pip install 'tilecraft[onnx]'") from None
        try:
            loaded = onnx.load(model)
        except Exception as error:  # protobuf's DecodeError or ParseError, by the format onnx infers from the suffix
            raise CommandError(f"MODEL: {model} is not an ONNX model ({type(error).__name__}: {error}); give the "
                               ".onnx file the model was exported to") from None
    weights = {tensor.name for tensor in loaded.graph.initializer}
    inputs = [value.name for value in loaded.graph.input if value.name not in weights]
    for name, _ in args.input_shape:
        if name not in inputs:
            raise CommandError(f"--input-shape: {model} has no input {name}; its inputs are {', '.join(inputs)}")
    return loaded


def _read_inputs(given: list[str], inputs) -> dict:
    """Arrays by input name from ``NAME=path.npy`` (or a bare path for a one-input model);
    ``example_inputs`` for the inputs not given."""
    import numpy as np

    from .model.compiled import example_inputs

    arrays = {}
    for item in given:
        name, eq, file = item.partition("=")
        if not eq:
            if len(inputs) != 1:
                raise CommandError(f"--input {item}: the model has inputs {[v.name for v in inputs]}; "
                                   f"name each, as --input NAME=path.npy")
            name, file = inputs[0].name, item
        try:
            arrays[name] = from_npy(np.load(file, allow_pickle=False))
        except (ValueError, OSError, EOFError) as error:
            raise CommandError(f"--input {item}: {file} is not a NumPy .npy array ({error})") from None
    return {**example_inputs([value for value in inputs if value.name not in arrays]), **arrays}


# -- shared -----------------------------------------------------------------------------

def _add_log_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("log", metavar="LOG", type=_tuning_log,
                         help="a tuning log (JSON lines, written by RecordToFile)")
    command.add_argument("--workload", metavar="KEY",
                         help="only this workload: its key, or the name of a registered workload")
    command.add_argument("--target", metavar="TARGET", type=_target, help="only this target, e.g. 'llvm -isa=avx2'")


def _select(log: str, workload: str | None, target: str | None) -> list[WorkloadSummary]:
    """The summaries of the log's (workload, target) pairs that match the options; raises
    with the reason when there is none."""
    path = Path(log)
    summaries = summarize(path)
    if not summaries:
        raise CommandError(f"LOG: {log} holds no tuning records; tune into it first (tilecraft tune)")
    asked = " ".join(f"--{name} {value!r}" for name, value in (("workload", workload), ("target", target)) if value)
    target = canonical_target(target)
    chosen = [s for s in summaries if (workload is None or _matches(s.workload_key, s.workload, workload))
              and (target is None or s.target == target)]
    if chosen:
        return chosen
    keys = {s.workload_key for s in summaries if workload is None or _matches(s.workload_key, s.workload, workload)}
    if workload is not None and not keys:
        keys = {workload}  # not in the log at all: load_best_record names what the log has
    try:
        load_best_record(path, sorted(keys)[0], target)  # raises NoValidRecordError with the reason
    except NoValidRecordError as error:
        raise CommandError(f"{asked}: {error}") from None
    raise CommandError(f"{asked}: {log} has no records of {workload} on {target}")  # (not reached)


def _matches(workload_key: str, workload: dict | None, query: str) -> bool:
    return query == workload_key or (workload is not None and query in (workload.get("func"),
                                                                        workload_label(workload_key, workload)))


# -- argparse types: each checks one argument; argparse names it in the error --------------

def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise CommandError(f"{text!r}: give positive integers separated by commas, such as 512,512,512")
    return sizes


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, eq, dims = text.partition("=")
    if not (name and eq):
        raise CommandError(f"{text!r}: give an input's name and its sizes, such as data=1,3,224,224")
    return name, _sizes(dims)


def _at_least(least: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``least``; ``what`` says what it counts."""
    def count(text: str) -> int:
        if not re.fullmatch(r"\s*[-+]?\d+\s*", text) or int(text) < least:
            raise CommandError(f"{text}: give {what}, a whole number, {least} or more")
        return int(text)
    return count


def _in_place_candidates(text: str) -> int:
    """An argparse type: 0 (choose nothing in place) or a number of candidates, 2 or more."""
    if not re.fullmatch(r"\s*\d+\s*", text) or int(text) == 1:
        raise CommandError(f"{text}: give the schedules to time of each task, 2 or more, or 0 to skip")
    return int(text)


def _duration(text: str) -> float:
    """Seconds from ``90s``, ``10m``, ``1h30m`` or a bare number of seconds."""
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip())
    seconds = sum(float(n) * unit for n, unit in zip(match.groups(), (3600, 60, 1)) if n) if match else 0.0
    if not seconds > 0:
        raise CommandError(f"{text!r}: give a duration longer than 0, such as 90s, 10m, 1h30m or 45 (seconds)")
    return seconds


def _target(text: str) -> str:
    try:
        Target(text)
    except TargetError as error:
        raise CommandError(f"{text!r}: {error}") from None
    return text


def _is_cpu(target: str | None) -> bool:
    """Whether ``--target`` (None: this machine) is a CPU."""
    return target is None or Target(target).kind == "llvm"


def _pattern(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as error:
        raise CommandError(f"{text!r} is not a regular expression ({error}); match task descriptions as "
                           "`tilecraft tasks` prints them, such as '1x7x7x'") from None


def _tuning_log(text: str) -> str:
    """An argparse type: a tuning log to read. A file with lines but no record in any of them
    (someone's other file) is refused; an empty one is a log with no records yet."""
    path = Path(text)
    if not path.is_file():
        raise CommandError(f"{text} does not exist; give a tuning log, as `tilecraft tune` writes" if not
                           path.exists() else f"{text} is not a file; give a tuning log (JSON lines)")
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        try:
            is_log = next(iter_records(path), None) is not None
        except RecordFormatError as error:  # a newer record version, or a *.xz that is not xz
            raise CommandError(str(error)) from None
    if not is_log and skipped:
        first = str(skipped[0].message).removeprefix(f"{path} ").removesuffix("; the line is skipped")
        raise CommandError(f"{text} is not a tuning log: no line of it is a record ({first}); give a log that "
                           "tilecraft tune wrote")
    return text


def _tuning_log_to_append(text: str) -> str:
    """An argparse type: a log to append to, new or to resume; not *.xz (a log grows a line at a time)."""
    if text.endswith(".xz"):
        raise CommandError(f"{text}: a log is appended a line at a time and cannot be xz-compressed; name it "
                           "without .xz (compress it when tuning is done)")
    return _tuning_log(text) if Path(text).exists() else text


def _input_file(text: str) -> str:
    file = text.partition("=")[2] or text
    if not Path(file).is_file():
        raise CommandError(f"{file} does not exist; give a .npy file, as numpy.save writes")
    return text


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"tilecraft: warning: {message}", file=sys.stderr)


# -- tilecraft db ---------------------------------------------------------------------

def add_db_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "db", help="move tuning records between logs and a SQLite store",
        description="Tuning logs (JSON lines) are the exchange format; a SQLite store is what several tuners "
                    "write at once (tc.RecordToStore). `import STORE LOG...` adds logs to a store, made if "
                    "missing; `export STORE LOG` writes its records as a new log (.xz compresses it).")
    actions = command.add_subparsers(dest="action", required=True, metavar="{import,export}")
    into = actions.add_parser("import", help="add tuning logs to a store (made if missing)")
    into.add_argument("store", type=Path, help="the SQLite store")
    into.add_argument("logs", type=Path, nargs="+", metavar="LOG", help="tuning logs (.json lines, or .xz)")
    out = actions.add_parser("export", help="write a store's records as a new tuning log")
    out.add_argument("store", type=Path, help="the SQLite store")
    out.add_argument("log", type=Path, help="the log to write; it must not exist")
    command.set_defaults(run=run_db)


def run_db(args: argparse.Namespace) -> int:
    from .database import RecordStore

    missing = [str(path) for path in ([args.store] if args.action == "export" else args.logs) if not path.is_file()]
    if missing:
        raise CommandError(f"no such file: {', '.join(missing)}")
    with RecordStore(args.store) as store:
        if args.action == "import":
            for log in args.logs:
                print(f"{log}: {store.import_log(log)} records added to {args.store} ({store.count()} in all)")
            return 0
        try:
            print(f"{args.log}: {store.export_log(args.log)} records from {args.store}")
        except FileExistsError:
            raise CommandError(f"{args.log} exists; export into a new file (to merge logs, import them into one "
                               f"store)") from None
    return 0


# The commands, in the order `tilecraft --help` lists them. The tuner's `tune` goes here.
COMMANDS: tuple[Callable[[Any], None], ...] = (add_tune_command, add_best_command, add_report_command,
                                               add_tasks_command, add_tune_model_command,
                                               add_choose_in_place_command, add_run_model_command,
                                               add_serve_command, add_db_command)


if __name__ == "__main__":
    sys.exit(main())
