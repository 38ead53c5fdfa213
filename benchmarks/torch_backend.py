"""torch.compile(backend="tilecraft") against eager PyTorch on the three test networks, untuned and tuned.

    python benchmarks/torch_backend.py [--trials N [--per-round M]] [--only cnn,mlp] [--out FILE]

The networks are those of tests/frontend/test_torch.py (tests/frontend/torch_networks.py: a
branchy CNN of inception blocks, a transformer block, an MLP; CPU, fp32, 2 threads). Each is
compiled by the backend with default schedules (untuned); with --trials N > 0 its tasks (from
the ONNX model that ``tc.from_torch`` exports, the graph the backend compiles) are tuned for N
trials shared by the task scheduler, M a round (so that a brief tuning reaches every task), into
a fresh log, and compiled again with
``options={"log": LOG}``. Every output is checked against eager PyTorch (relative error at most
1e-4). Latencies are medians of interleaved rounds (benchmarks/models.py), under torch.no_grad().
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import tilecraft as tc
from tilecraft.model.compiled import DefaultScheduleWarning

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "frontend"))
from models import THREADS, interleaved_ms  # noqa: E402
from tables import numeric_table, print_table  # noqa: E402
from torch_networks import MODELS, network  # noqa: E402


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


def compiled(net, x, log=None):
    """The backend's module and the seconds its first call took (the capture and the compilation)."""
    module = torch.compile(net, backend="tilecraft", options={"log": str(log)} if log else None)
    started = time.perf_counter()
    module(x)
    return module, time.perf_counter() - started


def run(name: str, trials: int, per_round: int, directory: Path, rounds: int, min_ms: float) -> dict:
    net, x = network(name)
    expected = net(x)
    untuned, compile_secs = compiled(net, x)
    systems = {"eager": lambda: net(x), "untuned": lambda: untuned(x)}
    row = {"model": name, "compile_secs": compile_secs, "untuned_error": relative_error(untuned(x), expected)}
    if trials:
        onnx_path, log = directory / f"{name}.onnx", directory / f"{name}.json"
        tc.from_torch(net, x).save_onnx(onnx_path)
        tasks, weights = tc.extract_tasks(str(onnx_path))
        started = time.perf_counter()
        tc.TaskScheduler(tasks, weights).tune(tc.TuningOptions(num_measure_trials=trials,
                                                               num_measures_per_round=per_round,
                                                               measure_callbacks=[tc.RecordToFile(str(log))]))
        row.update(tasks=len(tasks), tuning_wall_secs=time.perf_counter() - started)
        torch._dynamo.reset()  # the captured graphs compile again, with the log
        tuned, _ = compiled(net, x, log)
        systems["tuned"] = lambda: tuned(x)
        row["tuned_error"] = relative_error(tuned(x), expected)
    row.update({f"{k}_ms": v for k, v in interleaved_ms(systems, rounds, min_ms).items()})
    return row


def print_results(rows: list[dict]) -> None:
    """A row per network: milliseconds per call of eager PyTorch and of the backend, untuned and tuned."""
    fmt = lambda v, unit="": "-" if v is None else f"{v:.2f}{unit}"  # noqa: E731
    table = numeric_table("network", "eager ms", "tc untuned ms", "tc tuned ms", "eager/untuned", "eager/tuned",
                          "tasks", "tune s", "max rel. error")
    for r in rows:
        tuned = r.get("tuned_ms")
        error = max(r["untuned_error"], r.get("tuned_error", 0.0))
        table.add_row(r["model"], fmt(r["eager_ms"]), fmt(r["untuned_ms"]), fmt(tuned),
                      fmt(r["eager_ms"] / r["untuned_ms"], "x"), fmt(tuned and r["eager_ms"] / tuned, "x"),
                      str(r.get("tasks", "-")), fmt(r.get("tuning_wall_secs")), f"{error:.1e}")
    print_table(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per network (0: untuned only)")
    parser.add_argument("--per-round", type=int, default=8, help="measurements per round of a task")
    parser.add_argument("--only", default="", help="comma-separated network names: " + ", ".join(MODELS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/torch_backend.json"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=200)
    options = parser.parse_args()
    names = [n for n in options.only.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown network(s) {unknown}; choose from {', '.join(MODELS)}")
    torch.set_num_threads(THREADS)
    warnings.simplefilter("ignore", DefaultScheduleWarning)  # untuned is what the first column measures
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as directory:
        for name in names:
            rows.append(run(name, options.trials, options.per_round, Path(directory), options.rounds,
                            options.min_ms))
            print(f"  {name}: done", flush=True)
    print()
    print_results(rows)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "target": str(tc.Target.host()), "torch": torch.__version__,
                    "threads": THREADS},
        "trials": options.trials, "per_round": options.per_round, "networks": rows}, indent=2))
    print(f"wrote {options.out}")
    return 0 if all(max(r["untuned_error"], r.get("tuned_error", 0.0)) <= 1e-4 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
