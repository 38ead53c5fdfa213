"""The ``tilecraft`` command line.

    tilecraft tune NAME --shape 1024,1024,1024 [--trials N] [--log LOG]  tune a built-in workload
    tilecraft best LOG [--workload KEY] [--target TARGET]     what a log holds, and the best schedules
    tilecraft report LOG [-o report.png] [--workload KEY]      best-so-far GFLOPS by trial and by time
    tilecraft tasks MODEL.onnx                                 the tuning tasks of a model, with FLOPs and weights
    tilecraft run-model MODEL.onnx [--log LOG] [--input X.npy] compile (or load a saved model dir), run, time

Each command is one ``add_<name>_command(subparsers)`` function that declares its
arguments and sets ``run``, the function that carries it out; ``COMMANDS`` lists them.
A command returns its exit status. A user error (no such file, no records, a missing
optional dependency) exits with status 2 and one line on standard error, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .database import (NoValidRecordError, RecordToFile, TuningRecord, WorkloadSummary, canonical_target,
                       iter_records, load_best_record, summarize, workload_label)
from .errors import TilecraftError
from .measure import LocalRunner
from .search.policy import SketchPolicy
from .search.shared_model import SharedCostModel
from .tables import print_table
from .tune.transfer import DEFAULT_RECORDS, transfer_model
from .tune.scheduler import STRATEGIES, TaskScheduler
from .tune.task import WORKLOADS, SearchTask, TuningOptions

PLOT_INSTALL_HINT = "pip install 'tilecraft[plot]'"


class CommandError(TilecraftError):
    """A command cannot run as asked; the message says why."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except (TilecraftError, OSError) as error:
            print(f"tilecraft {args.command}: error: {error}", file=sys.stderr)
            return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilecraft", description="Automatic scheduling of tensor programs.")
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
    command.add_argument("--shape", required=True, help="the workload's integer arguments, comma-separated "
                                                        "(matmul: N,L,M; conv2d: N,C,H,W,F,KH,KW,stride,pad)")
    command.add_argument("--dtype", default="float32")
    command.add_argument("--trials", type=int, default=1000, help="measurements to make (default 1000)")
    command.add_argument("--per-round", type=int, default=64, help="measurements per search round (default 64)")
    command.add_argument("--log", help="the JSON-lines log (default: WORKLOAD.json)")
    command.add_argument("--target", help="target string (default: this machine)")
    _add_transfer_arguments(command, "in --log and ")
    _add_time_argument(command)
    _add_remeasure_argument(command)
    command.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    command.set_defaults(run=run_tune)


def _add_time_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--time", metavar="DURATION",
                         help="stop searching after this long, such as 90s, 10m or 1h30m, even if trials are left "
                              "(whichever comes first); the re-measurement at the end still runs")


def _time_budget(args: argparse.Namespace) -> float | None:
    """``--time`` in seconds; None without one."""
    if args.time is None:
        return None
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", args.time.strip())
    seconds = sum(float(n) * unit for n, unit in zip(match.groups(), (3600, 60, 1)) if n) if match else 0.0
    if not seconds > 0:
        raise CommandError(f"--time {args.time!r}: give a duration such as 90s, 10m or 1h30m")
    return seconds


def _add_remeasure_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--remeasure", type=int, default=5, metavar="K",
                         help="when the search ends, measure its K fastest candidates and every sketch's fastest "
                              "again, interleaved, in a fresh worker; the best is the median of that (default 5; "
                              "0: the best single measurement)")


def _remeasured(args: argparse.Namespace) -> int:
    if args.remeasure < 0:
        raise CommandError(f"--remeasure {args.remeasure}: give the number of finalists to measure again, or 0 "
                           "for none")
    return args.remeasure


def _add_transfer_arguments(command: argparse.ArgumentParser, implicit: str) -> None:
    command.add_argument("--transfer", action="append", default=[], metavar="LOG",
                         help="a log of other workloads tuned on this target: the cost model learns a sample of "
                              "each one's records before the first measurement (repeat for more logs)")
    command.add_argument("--no-transfer", action="store_true",
                         help=f"do not learn from the other workloads {implicit}the default database: start "
                              "the cost model from nothing")


def run_tune(args: argparse.Namespace) -> int:
    try:
        shape = [int(part) for part in args.shape.split(",") if part.strip()]
    except ValueError:
        raise CommandError(f"--shape {args.shape!r} must be integers separated by commas, e.g. 1024,1024,1024")
    try:
        task = SearchTask(func=args.workload, args=(*shape, args.dtype), target=args.target)
    except TypeError as error:
        raise CommandError(f"--shape {args.shape!r} does not fit workload {args.workload}: {error}") from None
    log = Path(args.log or f"{args.workload}.json")
    resume = str(log) if log.exists() else None
    options = TuningOptions(num_measure_trials=args.trials, num_measures_per_round=args.per_round,
                            measure_callbacks=[RecordToFile(log)], verbose=args.verbose,
                            num_remeasured=_remeasured(args), time_budget_secs=_time_budget(args))
    model = _taught_model(task, resume, args)
    task.tune(options, search_policy=SketchPolicy(task, model) if model else None, resume_from=resume)
    best = load_best_record(log, task.workload_key, task.target)
    print(f"best of the whole log {log}: {best.gflops:.1f} GFLOPS, {best.cost * 1e3:.3f} ms{_how_measured(best)}; "
          f"see it with: tilecraft best {log}")
    return 0


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
    """`` (median of 5 re-measured)`` for a final record: the rule of database/best.py."""
    return f" (median of {len(record.costs)} re-measured)" if record.phase == "final" else ""


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

    tasks, weights = extract_tasks(_model_path(args.model), args.target, _input_shapes(args.input_shape))
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
    command.add_argument("--trials", type=int, default=2000, help="measurements over all tasks (default 2000)")
    command.add_argument("--per-round", type=int, default=64, help="measurements per round of a task (default 64)")
    command.add_argument("--log", help="the JSON-lines log (default: the model's name with .json)")
    command.add_argument("--warm-up", type=int, metavar="TRIALS",
                         help="measurements in each task's first round (default: --per-round, as Ansor); fewer "
                              "reach a whole tuned model sooner when it has many tasks")
    command.add_argument("--strategy", choices=STRATEGIES, default="gradient")
    command.add_argument("--per-task-early-stopping", type=int, metavar="TRIALS",
                         help="stop tuning a task after this many trials without improvement")
    command.add_argument("--tasks", metavar="REGEX", help="tune only the tasks whose description matches")
    command.add_argument("--cache-flush", action="store_true",
                         help="flush the caches before every timed call, as a layer whose weights come from memory "
                              "finds them inside a large model; keep such a log apart from a warm one and give it "
                              "first to run-model")
    _add_transfer_arguments(command, "of ")
    _add_time_argument(command)
    _add_remeasure_argument(command)
    command.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2))
    command.set_defaults(run=run_tune_model)


def run_tune_model(args: argparse.Namespace) -> int:
    from .model.tasks import extract_tasks, print_tasks

    tasks, weights = extract_tasks(_model_path(args.model), args.target, _input_shapes(args.input_shape))
    if args.tasks is not None:
        try:
            pattern = re.compile(args.tasks)
        except re.error as error:
            raise TilecraftError(f"--tasks {args.tasks!r} is not a regular expression ({error}); match task "
                                 "descriptions as `tilecraft tasks` prints them, say '1x7x7x'") from None
        chosen = [n for n, task in enumerate(tasks) if pattern.search(task.desc)]
        if not chosen:
            raise TilecraftError(f"--tasks {args.tasks!r} matches none of the model's tasks: "
                                 + "; ".join(task.desc for task in tasks))
        tasks, weights = [tasks[n] for n in chosen], [weights[n] for n in chosen]
    if args.verbose:
        print_tasks(tasks, weights)
    log = Path(args.log or Path(args.model).with_suffix(".json").name)
    if args.warm_up is not None and args.warm_up < 1:
        raise CommandError(f"--warm-up {args.warm_up}: give at least 1 measurement per task, or leave it out")
    scheduler = TaskScheduler(tasks, weights, strategy=args.strategy, load_log_file=str(log) if log.exists() else None,
                              warm_up_trials=args.warm_up, cost_model=_taught_model(tasks, None, args))
    with LocalRunner(enable_cpu_cache_flush=args.cache_flush) as runner:
        options = TuningOptions(num_measure_trials=args.trials, num_measures_per_round=args.per_round, runner=runner,
                                measure_callbacks=[RecordToFile(log)], verbose=args.verbose,
                                num_remeasured=_remeasured(args), time_budget_secs=_time_budget(args))
        latency = scheduler.tune(options, per_task_early_stopping=args.per_task_early_stopping)
    print(f"model latency as the sum of weight x best kernel latency: {latency * 1e3:.3f} ms; log {log}; "
          f"run it with: tilecraft run-model {args.model} --log {log}")
    return 0


def add_run_model_command(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "run-model", help="compile an ONNX model and run it once, with its latency",
        description="Compile an ONNX model with the best schedules of a tuning log (the default schedule for the "
                    "rest), or load a model saved with CompiledModel.save (a directory); run it on the given inputs "
                    "(random ones by default), print the outputs' shapes and first values and the latency.")
    _add_model_arguments(command)
    command.add_argument("--log", action="append", metavar="LOG",
                         help="a tuning log to take schedules from; repeated, a kernel's schedule comes from the "
                              "first log with a record for it")
    command.add_argument("--input", action="append", default=[], metavar="[NAME=]X.npy",
                         help="an input array; NAME= may be left out for a model with one input (repeatable)")
    command.add_argument("--output", type=Path, help="save the output to this .npy (several: one file each)")
    command.add_argument("--profile", action="store_true",
                         help="also list each kernel's time inside a model call, most expensive first")
    command.set_defaults(run=run_run_model)


def run_run_model(args: argparse.Namespace) -> int:
    import numpy as np

    from .model.compiled import compile_model, load_model
    from .runtime.timer import time_callable

    path = Path(args.model)
    if path.is_dir():
        model = load_model(path)
    else:
        model = compile_model(_model_path(args.model), args.target, args.log, _input_shapes(args.input_shape))
    inputs = _read_inputs(args.input, model.inputs)
    outputs = model.run(inputs)
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)} {np.array2string(array.reshape(-1)[:6], precision=4)}")
    result = time_callable(lambda: model.run(inputs), number=1, repeat=7, min_repeat_ms=20)
    print(f"latency: {result.median * 1e3:.3f} ms (median of {len(result.results)})")
    if args.profile:
        _print_profile(model.profile(inputs))
    if args.output:
        for name, array in outputs.items():
            file = args.output if len(outputs) == 1 else args.output.with_name(f"{args.output.stem}_{name}.npy")
            np.save(file, array, allow_pickle=False)
            print(f"wrote {file}")
    return 0


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


def _add_model_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("model", metavar="MODEL", help="an ONNX model file")
    command.add_argument("--target", help="target string (default: this machine)")
    command.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...",
                         help="the shape of an input with dynamic sizes (repeatable)")


def _model_path(model: str) -> str:
    if not Path(model).is_file():
        raise CommandError(f"{model} does not exist" if not Path(model).exists() else f"{model} is not a file")
    if importlib.util.find_spec("onnx") is None:
        raise CommandError("reading an ONNX model needs the onnx package: pip install 'tilecraft[onnx]'")
    return model


def _input_shapes(given: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in given:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise CommandError(f"--input-shape {item!r} must be NAME=D,D,... with integer sizes") from None
    return shapes


def _read_inputs(given: list[str], inputs) -> dict:
    """Arrays by input name from ``NAME=path.npy`` (or a bare path for a one-input model); random
    standard-normal values for the inputs not given."""
    import numpy as np

    arrays = {}
    for item in given:
        name, eq, file = item.partition("=")
        if not eq:
            if len(inputs) != 1:
                raise CommandError(f"--input {item}: the model has inputs {[v.name for v in inputs]}; "
                                   f"name each, as --input NAME=path.npy")
            name, file = inputs[0].name, item
        try:
            arrays[name] = np.load(file, allow_pickle=False)
        except ValueError as error:
            raise CommandError(f"--input {item}: {file} is not a NumPy .npy array ({error})") from None
    rng = np.random.default_rng(0)
    for value in inputs:
        if value.name not in arrays:
            arrays[value.name] = rng.standard_normal(value.shape).astype(value.dtype)
    return arrays


# -- shared -----------------------------------------------------------------------------

def _add_log_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("log", metavar="LOG", help="a tuning log (JSON lines, written by RecordToFile)")
    command.add_argument("--workload", metavar="KEY",
                         help="only this workload: its key, or the name of a registered workload")
    command.add_argument("--target", metavar="TARGET", help="only this target, e.g. 'llvm -isa=avx2'")


def _select(log: str, workload: str | None, target: str | None) -> list[WorkloadSummary]:
    """The summaries of the log's (workload, target) pairs that match the options; raises
    with the reason when there is none."""
    path = Path(log)
    if not path.is_file():
        raise CommandError(f"{log} does not exist" if not path.exists() else f"{log} is not a file")
    summaries = summarize(path)
    if not summaries:
        raise CommandError(f"{log} holds no tuning records")
    target = canonical_target(target)
    chosen = [s for s in summaries if (workload is None or _matches(s.workload_key, s.workload, workload))
              and (target is None or s.target == target)]
    if chosen:
        return chosen
    keys = {s.workload_key for s in summaries if workload is None or _matches(s.workload_key, s.workload, workload)}
    if workload is not None and not keys:
        keys = {workload}  # not in the log at all: load_best_record names what the log has
    load_best_record(path, sorted(keys)[0], target)  # raises NoValidRecordError with the reason
    raise NoValidRecordError(f"{log} has no records of {workload} on {target}")  # (not reached)


def _matches(workload_key: str, workload: dict | None, query: str) -> bool:
    return query == workload_key or (workload is not None and query in (workload.get("func"),
                                                                        workload_label(workload_key, workload)))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"tilecraft: warning: {message}", file=sys.stderr)


# The commands, in the order `tilecraft --help` lists them. The tuner's `tune` goes here.
COMMANDS: tuple[Callable[[Any], None], ...] = (add_tune_command, add_best_command, add_report_command,
                                               add_tasks_command, add_tune_model_command, add_run_model_command)


if __name__ == "__main__":
    sys.exit(main())
