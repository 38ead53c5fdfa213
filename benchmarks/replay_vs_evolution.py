"""Random search (ReplayTrace) against the evolutionary search, same trial budget.

    python benchmarks/replay_vs_evolution.py [--trials 256] [--only matmul_128] [--out FILE]

The MetaSchedule chapter's two workloads, its 128x128x128 matmul and the MLP's ``linear0``
(1x784 @ 784x128 + bias), are tuned from scratch with ``tune_tir`` over the generated space,
once with ``strategy="replay-trace"`` (uniform random candidates, no model) and once with
``strategy="evolutionary"`` (SketchPolicy, XGBoost). For each run the best schedule after
64 and after all trials is taken from its records, then every one of them is re-timed in
interleaved rounds in this process (the fastest round counts), so that load on a shared
machine hits all alike. The claim checked: the evolutionary search's best at 64 trials is
at least as fast as random search's best at the whole budget.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.database import Database, load_records
from tilecraft.schedule.trace import Trace

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

TARGET = "llvm --num-cores=2"
STRATEGIES = ("replay-trace", "evolutionary")
EARLY = 64


def matmul_128():
    A = te.placeholder((128, 128), name="A")
    B = te.placeholder((128, 128), name="B")
    k = te.reduce_axis((0, 128), name="k")
    C = te.compute((128, 128), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


def linear0():
    X = te.placeholder((1, 784), name="X")
    W = te.placeholder((128, 784), name="W")
    B = te.placeholder((128,), name="B")
    k = te.reduce_axis((0, 784), name="k")
    Y = te.compute((1, 128), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    Z = te.compute((1, 128), lambda i, j: Y[i, j] + B[j], name="Z")
    return tc.ComputeDAG([X, W, B, Z])


WORKLOADS = {"matmul_128": matmul_128, "linear0": linear0}


def best_after(records, trials: int):
    valid = [r for r in records[:trials] if r.is_valid]
    return min(valid, key=lambda r: r.mean_cost) if valid else None


def retime(dag, schedules: dict[str, tc.Schedule], rounds: int = 15) -> dict[str, float]:
    """Seconds per call of each schedule: the fastest of interleaved rounds, since load on
    a shared machine only ever slows a round down."""
    funcs = {name: tc.build(sch, TARGET) for name, sch in schedules.items()}
    inputs = dag.random_inputs()
    outputs = {name: func(*inputs) for name, func in funcs.items()}
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(rounds):
        for name, func in funcs.items():
            times[name].append(
                func.time_evaluator(number=20, repeat=1, min_repeat_ms=50)(*inputs, outputs[name]).median)
    return {name: min(t) for name, t in times.items()}


def run_workload(name: str, trials: int, work_root: Path, seed: int) -> dict:
    dag = WORKLOADS[name]()
    flop = dag.flop_count()
    row: dict = {"workload": name, "flop": flop, "trials": trials, "runs": {}}
    schedules = {}
    for strategy in STRATEGIES:
        work_dir = work_root / f"{name}_{strategy}"
        started = time.perf_counter()
        tc.tune_tir(dag, TARGET, work_dir, max_trials_global=trials, num_trials_per_iter=64, strategy=strategy,
                    seed=seed, task_name=name, verbose=1)
        records = load_records(Path(work_dir) / "records.json")
        run = {"wall_secs": time.perf_counter() - started, "measured": len(records),
               "valid": sum(r.is_valid for r in records)}
        for trials_seen in (EARLY, trials):
            best = best_after(records, trials_seen)
            run[f"tuning_best_ms@{trials_seen}"] = best.mean_cost * 1e3 if best else None
            if best:
                schedules[f"{strategy}@{trials_seen}"] = Trace.from_json(best.trace).replay(dag)
        row["runs"][strategy] = run
        assert len(Database(work_dir)) == len(records)
    for key, secs in retime(dag, schedules).items():
        strategy, trials_seen = key.split("@")
        row["runs"][strategy][f"retimed_ms@{trials_seen}"] = secs * 1e3
        row["runs"][strategy][f"retimed_gflops@{trials_seen}"] = flop / secs / 1e9
    evolution, replay = row["runs"]["evolutionary"], row["runs"]["replay-trace"]
    row["evolution_at_64_vs_replay_at_budget"] = replay[f"retimed_ms@{trials}"] / evolution[f"retimed_ms@{EARLY}"]
    return row


def print_runs(rows: list[dict], trials: int) -> None:
    """Each workload's best schedule of each strategy after ``EARLY`` and ``trials`` trials, re-timed."""
    print(f"best schedule after N trials, re-timed (ms; GFLOPS), target '{TARGET}'")
    table = numeric_table("workload", "strategy", f"@{EARLY}", f"@{trials}", "tuning wall", text_columns=2)
    for row in rows:
        for strategy, run in row["runs"].items():
            table.add_row(row["workload"], strategy,
                          *(f"{run[f'retimed_ms@{n}']:.4f}; {run[f'retimed_gflops@{n}']:.1f}" for n in (EARLY, trials)),
                          f"{run['wall_secs']:.0f} s")
    print_table(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the work dirs here (default: temporary)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/replay_vs_evolution.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_workload(name, args.trials, args.work_dir or Path(tmp), args.seed)
                for name in args.only.split(",")]

    print()
    print_runs(rows, args.trials)
    for row in rows:
        ratio = row["evolution_at_64_vs_replay_at_budget"]
        print(f"{row['workload']}: evolutionary@{EARLY} is {ratio:.2f}x the speed of replay-trace@{args.trials} "
              f"({'holds' if ratio >= 1 else 'does NOT hold'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "target": str(tc.Target(TARGET)), "numpy": np.__version__},
        "trials": args.trials, "seed": args.seed, "workloads": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
