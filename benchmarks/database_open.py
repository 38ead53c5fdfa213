"""How long a work dir of 100,000 tuning records takes to open and query.

    python benchmarks/database_open.py [--records 100000] [--out FILE]

Writes synthetic but valid records (real sketch traces of several workloads with sampled
decisions, 5% of them errors) into a temporary work dir, then times ``tc.Database(dir)``
and ``query_best`` / ``query_schedule`` for every workload, in a fresh process so that no
cache of this one helps. MetaSchedule users report minutes for a JSON database this size.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import TuningRecord
from tilecraft.database.database import RECORDS_FILE
from tilecraft.search.space import generate_sketches

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

WORKLOADS = [("matmul", (128, 128, 128)), ("matmul", (512, 512, 512)), ("dense", (1, 784, 128)),
             ("conv2d", (1, 64, 56, 56, 64, 3, 3, 1, 1)), ("softmax", (128, 1000)),
             ("batch_matmul", (8, 128, 128, 64))]
DISTINCT_PER_WORKLOAD = 400

TIMER = """
import sys, time
t0 = time.perf_counter()
import tilecraft as tc
tasks = [tc.SearchTask(func=name, args=args) for name, args in {workloads}]
t1 = time.perf_counter()
db = tc.Database(sys.argv[1])
t2 = time.perf_counter()
best = [db.query_best(task, task.target) for task in tasks]
t3 = time.perf_counter()
tc.build(db.query_schedule(tasks[0], tasks[0].target))
t4 = time.perf_counter()
print({{"records": len(db), "import_and_tasks_secs": t1 - t0, "open_secs": t2 - t1, "query_best_all_secs": t3 - t2,
       "query_schedule_and_build_secs": t4 - t3}})
"""


def write_records(path: Path, count: int, rng: np.random.Generator) -> float:
    """``count`` records spread over ``WORKLOADS``; returns the file size in MB."""
    target = tc.Target.host()
    pools = []
    for name, args in WORKLOADS:
        task = tc.SearchTask(func=name, args=args, target=target)
        sketches = generate_sketches(task.compute_dag, target=target)
        traces = [sketch.trace_of(row) for sketch in sketches
                  for row in sketch.sample(rng, DISTINCT_PER_WORKLOAD // len(sketches) + 1, 32)]
        pools.append((task, task.compute_dag.flop_count(), [t.dumps() for t in traces],
                      [s.name for s in sketches for _ in range(DISTINCT_PER_WORKLOAD // len(sketches) + 1)]))
    with open(path, "w") as file:
        for n in range(count):
            task, flop, traces, sketch_names = pools[n % len(pools)]
            pick = int(rng.integers(len(traces)))
            failed = rng.random() < 0.05
            record = TuningRecord(
                workload_key=task.workload_key, workload=task.workload, target=str(target), trace_json=traces[pick],
                costs=() if failed else tuple(float(c) for c in rng.uniform(1e-4, 1e-2, 3)),
                error_kind="compile" if failed else "none", error_msg="synthetic" if failed else "",
                all_cost=0.5, timestamp=1.7e9 + n, flop=flop, sketch=sketch_names[pick])
            file.write(record.to_json_line() + "\n")
    return path.stat().st_size / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed opens, each in a fresh process")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/database_open.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        started = time.perf_counter()
        megabytes = write_records(Path(work_dir) / RECORDS_FILE, args.records, np.random.default_rng(0))
        print(f"wrote {args.records} records ({megabytes:.0f} MB) in {time.perf_counter() - started:.1f} s")
        code = TIMER.format(workloads=WORKLOADS)
        runs = [eval(subprocess.run([sys.executable, "-c", code, work_dir], check=True, capture_output=True,
                                    text=True).stdout) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["open_secs"])
    table = numeric_table("records", "open (s)", f"query_best x{len(WORKLOADS)} (s)", "query_schedule + build (s)",
                          text_columns=0)
    for run in runs:
        table.add_row(str(run["records"]), f"{run['open_secs']:.2f}", f"{run['query_best_all_secs']:.4f}",
                      f"{run['query_schedule_and_build_secs']:.2f}")
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "target": str(tc.Target.host())},
        "records": args.records, "file_mb": round(megabytes, 1), "workloads": [[n, list(a)] for n, a in WORKLOADS],
        "runs": runs, "best_open_secs": best["open_secs"]}, indent=2))
    print(f"wrote {args.out}")
    return 0 if best["open_secs"] + best["query_best_all_secs"] < 2.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
