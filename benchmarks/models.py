"""Whole networks against onnxruntime and PyTorch CPU, in one run.

    python benchmarks/models.py [--trials N [--cold-weights] | --kept [--in-place]] [--only resnet50,bert_layer]
                                [--tasks REGEX] [--dtype bfloat16] [--out FILE]

Each network (benchmarks/model_zoo.py: ResNet-50, MobileNetV2, a BERT-base encoder layer
at sequence 128 and at a ViT-B/16's 197 tokens, ...; batch 1, fp32; with --kept, those with a
kept log) is exported to ONNX, imported and compiled by tilecraft
with default schedules (untuned), and, with --trials N > 0, tuned for N trials shared by
its tasks (TaskScheduler; with --tasks, only the tasks whose description matches the
regular expression, say the 7x7 layers) and compiled again from the log. After tuning, each
task's four best schedules are timed inside the model and the fastest there chosen
(``tc.choose_in_place``, as ``tilecraft tune-model`` ends). The log is kept in
benchmarks/records (xz-compressed), so a later run resumes the tuning; --kept compiles the
tuned model from that log as it is, tuning nothing, to time it again (--in-place: after
choosing in place again). --cold-weights tunes with
each kernel's weights evicted from the caches before every timed call (as a layer finds them
inside a model, whose other layers' weights pass through the caches between two of its calls),
into a log of its own (MODEL_cold); the tuned model takes a kernel's schedule from that log
first, then from the warm one (on ResNet-50's 7x7 layers it made the model slower:
docs/experiments/tuning-with-weights-evicted.md). Every compiled model's output
is checked against onnxruntime's (rtol 1e-3). Latencies are medians of interleaved rounds
(each system timed once per round), every system on as many threads as the host has cores
(tilecraft's host target; 2 on the development machines). With ``--dtype bfloat16`` each
network is exported in bfloat16 and checked against eager PyTorch in bfloat16 (rtol 3e-2:
each rounds its operators' outputs); onnxruntime's CPU kernels lack most bfloat16 operators.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import tilecraft as tc
from tilecraft.model.torch import as_tensor
from tilecraft.te.dtype import NUMPY_DTYPES

sys.path.insert(0, str(Path(__file__).parent))
import model_zoo  # noqa: E402
from archive import restore, save  # noqa: E402
from tables import numeric_table, print_table  # noqa: E402

ARCHIVE = Path("benchmarks/records")  # tuning logs kept in the repository, so tuning resumes across runs

THREADS = tc.Target.host().num_cores  # tilecraft's threads; onnxruntime and PyTorch are given as many


def interleaved_ms(systems: dict, rounds: int, min_ms: float) -> dict:
    """Median milliseconds per call of each system over rounds that time each once."""
    numbers = {}
    for name, fn in systems.items():
        fn()
        started = time.perf_counter()
        fn()
        numbers[name] = max(1, int(min_ms / max((time.perf_counter() - started) * 1e3, 1e-3)))
    times = {name: [] for name in systems}
    for _ in range(rounds):
        for name, fn in systems.items():
            time.sleep(0.05)  # the previous system's threads stop spinning
            started = time.perf_counter()
            for _ in range(numbers[name]):
                fn()
            times[name].append((time.perf_counter() - started) * 1e3 / numbers[name])
    return {name: statistics.median(t) for name, t in times.items()}


def run(name: str, trials: int, directory: Path, rounds: int, min_ms: float, only_tasks: str = "",
        kept: bool = False, cold_weights: bool = False, in_place: bool = False, dtype: str = "float32") -> dict:
    path = model_zoo.export(name, directory / "onnx", dtype)
    shape = model_zoo.MODELS[name][1]
    x = np.random.default_rng(0).standard_normal(shape).astype(NUMPY_DTYPES[dtype])
    target = tc.Target.host()

    torch.manual_seed(0)
    module = model_zoo.MODELS[name][0]().eval().to(getattr(torch, dtype))
    tensor = as_tensor(x)
    systems = {"pytorch": lambda: module(tensor)}
    if dtype == "float32":
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        expected, tolerance = session.run(None, {"input": x})[0], dict(rtol=1e-3, atol=1e-4)
        systems["onnxruntime"] = lambda: session.run(None, {"input": x})
    else:
        with torch.no_grad():
            expected, tolerance = module(tensor).float().numpy(), dict(rtol=3e-2, atol=3e-2)

    def correct(model) -> bool:
        return bool(np.allclose(model(input=x).astype("float32"), expected, **tolerance))

    started = time.perf_counter()
    tasks, weights = tc.extract_tasks(str(path), target)
    untuned = tc.compile_model(str(path), target)
    compile_secs = time.perf_counter() - started
    systems["tilecraft_untuned"] = lambda: untuned(input=x)
    row = {"model": name, "dtype": dtype, "tasks": len(tasks), "subgraphs": int(sum(weights)),
           "compile_secs": compile_secs, "untuned_correct": correct(untuned)}
    logs, stem = directory / "model_logs", name if dtype == "float32" else f"{name}_{dtype}"
    warm_log, cold_log = logs / f"{stem}.json", logs / f"{stem}_cold.json"
    archives = {warm_log: ARCHIVE / f"{stem}_tuning.json.xz", cold_log: ARCHIVE / f"{stem}_cold.json.xz"}
    for kept_log, archive in archives.items():
        restore(archive, kept_log)
    log, archive = (cold_log, archives[cold_log]) if cold_weights else (warm_log, archives[warm_log])
    if kept:
        if not warm_log.exists():
            raise SystemExit(f"--kept: {name} has no kept tuning log ({archives[warm_log]}); tune it first with "
                             "--trials N")
    elif trials:
        log.parent.mkdir(parents=True, exist_ok=True)
        chosen = [n for n, task in enumerate(tasks) if re.search(only_tasks, task.desc)]
        if not chosen:
            raise SystemExit(f"--tasks {only_tasks!r} matches none of {name}'s tasks: "
                             + "; ".join(t.desc for t in tasks))
        started = time.perf_counter()
        try:
            scheduler = tc.TaskScheduler([tasks[n] for n in chosen], [weights[n] for n in chosen],
                                         load_log_file=str(log) if log.exists() else None)
            with tc.LocalRunner(evict_weights=cold_weights) as runner:
                scheduler.tune(tc.TuningOptions(num_measure_trials=trials, runner=runner,
                                                measure_callbacks=[tc.RecordToFile(str(log))], verbose=1))
            if not cold_weights:
                row["in_place"] = choose(path, log, target)
        finally:
            save(log, archive)
        row["tuning_wall_secs"] = time.perf_counter() - started
    if kept and in_place:
        try:
            row["in_place"] = choose(path, warm_log, target)
        finally:
            save(warm_log, archives[warm_log])
    if trials or kept:
        tuned = tc.compile_model(str(path), target, log=[str(p) for p in (cold_log, warm_log) if p.exists()])
        systems["tilecraft_tuned"] = lambda: tuned(input=x)
        row["tuned_correct"] = correct(tuned)
    with torch.no_grad():
        row.update({f"{k}_ms": v for k, v in interleaved_ms(systems, rounds, min_ms).items()})
    return row


def choose(path: Path, log: Path, target) -> dict:
    """Each task's best few schedules timed inside the model, the fastest there chosen (model records in ``log``)."""
    started = time.perf_counter()
    report = tc.choose_in_place(str(path), log, target)
    return {"tasks": len(report.choices), "before_ms": report.before_seconds * 1e3,
            "after_ms": report.after_seconds * 1e3, "secs": time.perf_counter() - started}


def print_results(rows: list[dict]) -> None:
    """A row per model: milliseconds per call of onnxruntime (float32 only), PyTorch and tilecraft
    untuned and tuned; the ratios against onnxruntime, or in bfloat16 against PyTorch."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    table = numeric_table("model", "ORT ms", "torch ms", "tc untuned", "tc tuned", "untuned/ref", "tuned/ref",
                          "tasks", "tune s", "correct", caption="ref: onnxruntime, or PyTorch in bfloat16")
    for r in rows:
        tuned, reference = r.get("tilecraft_tuned_ms"), r.get("onnxruntime_ms") or r["pytorch_ms"]
        correct = r["untuned_correct"] and r.get("tuned_correct", True)
        table.add_row(r["model"] + ("" if r["dtype"] == "float32" else f" ({r['dtype']})"),
                      fmt(r.get("onnxruntime_ms")), f"{r['pytorch_ms']:.2f}", f"{r['tilecraft_untuned_ms']:.2f}",
                      fmt(tuned), f"{r['tilecraft_untuned_ms'] / reference:.2f}x",
                      f"{tuned / reference:.2f}x" if tuned else "-", str(r["tasks"]),
                      fmt(r.get("tuning_wall_secs")), "yes" if correct else "NO")
    print_table(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per model (0: untuned only)")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/models.json"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=200)
    parser.add_argument("--tasks", default="", help="tune only the tasks whose description matches this regex")
    parser.add_argument("--kept", action="store_true", help="time the tuned model of the kept log, tuning nothing")
    parser.add_argument("--in-place", action="store_true",
                        help="with --kept: time each task's best schedules inside the model first, into the kept log")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="export and run each network in this type (bfloat16: checked against PyTorch's)")
    parser.add_argument("--cold-weights", action="store_true",
                        help="tune with the weights evicted before every timed call, into the model's cold log")
    options = parser.parse_args()
    if options.kept and options.trials:
        parser.error(f"--kept times the kept log as it is; --trials {options.trials} would tune it further: "
                     f"give one of the two")
    if options.in_place and not options.kept:
        parser.error("--in-place chooses among the kept log's schedules: give --kept as well (a run with --trials "
                     "chooses in place when its tuning ends)")
    if options.cold_weights and not options.trials:
        parser.error("--cold-weights says how to tune: give --trials N > 0 as well")
    if options.tasks:
        if not options.trials:
            parser.error(f"--tasks {options.tasks!r} picks tasks to tune: give --trials N > 0 as well")
        try:
            re.compile(options.tasks)
        except re.error as error:
            parser.error(f"--tasks {options.tasks!r} is not a regular expression ({error}); "
                         f"match task descriptions such as '1x7x7x'")
    names = [n for n in options.only.split(",") if n] or [  # --kept: every model with a kept log
        n for n in model_zoo.MODELS if not options.kept
        or (ARCHIVE / f"{n if options.dtype == 'float32' else f'{n}_{options.dtype}'}_tuning.json.xz").exists()]
    unknown = [n for n in names if n not in model_zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(model_zoo.MODELS)}")
    torch.set_num_threads(THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    rows = []
    for name in names:
        rows.append(run(name, options.trials, options.out.parent, options.rounds, options.min_ms, options.tasks,
                        options.kept, options.cold_weights, options.in_place, options.dtype))
        print(f"  {name}: done", flush=True)

    print()
    print_results(rows)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "target": str(tc.Target.host()), "onnxruntime": ort.__version__,
                    "torch": torch.__version__, "threads": THREADS},
        "trials": options.trials, "models": rows}, indent=2))
    print(f"wrote {options.out}")
    return 0 if all(r["untuned_correct"] and r.get("tuned_correct", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
