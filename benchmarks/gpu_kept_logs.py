"""What the kept GPU tuning logs say of today's GPU rules (no GPU needed).

    python benchmarks/gpu_kept_logs.py [--only matmul_2048,conv2d_b1] [--out FILE]

Every record of each kept H100 log (``benchmarks/records/gpu_h100_<workload>.json.xz``) is
replayed, lowered and checked by today's verifier (``tilecraft/codegen/gpu_verify.py``).
The first table counts the records the verifier now refuses, trials a search would no
longer build or time, by the limit they break, with the seconds they took to build and run
(``all_cost``, of all the trials' seconds) and how far the fastest of them was from the
log's best. The second splits the records by their virtual threads (one, or more), with
the fastest and the median over the log's best; the third by sketch, with its fastest and
median time (which sketch an untuned task should take: docs/experiments/gpu-default-sketch.md);
the fourth, of the tiled sketches' records, by a block's threads and a thread's outputs along
the two innermost spatial axes, today's default's shape marked (which shape an untuned task
should take: docs/experiments/gpu-default-tile.md). Prints the four and writes
``benchmarks/results/gpu_kept_logs.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.codegen.cuda import bound_loops
from tilecraft.codegen.gpu_verify import verify_gpu
from tilecraft.database import load_records
from tilecraft.errors import GpuLimitError
from tilecraft.ir.lower import lower
from tilecraft.schedule.trace import Trace
from tilecraft.search.default import default_choice
from tilecraft.search.gpu_rules import gpu_default_row
from tilecraft.search.space import generate_sketches

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

RECORDS = Path(__file__).parent / "records"
LIMITS = {"registers": r"registers a thread", "shared memory": r"shared memory", "virtual threads": r"virtual threads",
          "threads": r"threads"}  # the first whose words the error has
TILE_ROWS = 6  # the fastest thread tiles a workload shows (and the default's, wherever it ranks)


def limit_broken(error: GpuLimitError) -> str:
    """The name of the limit a verifier's error names."""
    return next((name for name, pattern in LIMITS.items() if re.search(pattern, str(error))), "other")


def thread_tile(sketch, row) -> str | None:
    """Threads x outputs a thread along the two innermost spatial axes of a tiled sketch's
    row, as ``"8x16 threads, 16x4 outputs"``; None for a sketch that tiles no two axes."""
    tiles = [n for n, slot in enumerate(sketch.slots) if slot.role == "tile" and slot.spatial
             and len(slot.domain[0]) == 5][-2:]
    if len(tiles) < 2:
        return None
    levels = [sketch.slots[n].domain[row[n]] for n in tiles]
    return (f"{'x'.join(str(level[2]) for level in levels)} threads, "
            f"{'x'.join(str(level[3] * level[4]) for level in levels)} outputs")


def by_thread_tile(records, task, best: float) -> dict:
    """The valid records of tiled sketches grouped by ``thread_tile``, fastest first; the group
    of the default candidate named, where an untuned task takes a tiled sketch."""
    sketches = {sketch.name: sketch for sketch in generate_sketches(task.compute_dag, target=task.target)}
    groups = {}
    for record in records:
        sketch = sketches.get(record.sketch)
        row = None if sketch is None or not record.is_valid else sketch.row_of(Trace.from_json(record.trace))
        shape = None if row is None else thread_tile(sketch, row)
        if shape is not None:
            groups.setdefault(shape, []).append(record.cost / best)
    chosen = sketches[default_choice(task.compute_dag, task.target)[1]]  # the sketch an untuned task takes
    default = thread_tile(chosen, gpu_default_row(chosen))
    return {shape: {"trials": len(ratios), "fastest_over_best": min(ratios),
                    "median_over_best": float(np.median(ratios)), "default": shape == default}
            for shape, ratios in sorted(groups.items(), key=lambda item: min(item[1]))}


def survey(log: Path) -> dict:
    """Per limit broken, the records of ``log`` that the verifier refuses now; per count of
    virtual threads (one, more), the records' costs over the log's best."""
    records = load_records(log)
    first = records[0]
    task = tc.SearchTask(func=first.workload["func"], args=tuple(first.workload["args"]), target=first.target)
    best = min((r.cost for r in records if r.is_valid), default=math.inf)
    counts, seconds, fastest, failed = Counter(), Counter(), {}, Counter()
    by_vthreads, by_sketch = {"one": [], "more": []}, {}
    for record in records:
        if record.is_valid:
            by_sketch.setdefault(record.sketch, []).append(record.cost)
        func = lower(Trace.from_json(record.trace).replay(task.compute_dag))
        vthreads = math.prod(loop.extent for loop in bound_loops(func.body) if loop.kind.startswith("vthread"))
        by_vthreads["more" if vthreads > 1 else "one"].append(record.cost / best if record.is_valid else math.inf)
        try:
            verify_gpu(func, task.target)
            continue
        except GpuLimitError as error:
            limit = limit_broken(error)
        counts[limit] += 1
        seconds[limit] += record.all_cost
        failed[limit] += not record.is_valid
        if record.is_valid:
            fastest[limit] = min(fastest.get(limit, math.inf), record.cost / best)
    return {"trials": len(records), "seconds": sum(r.all_cost for r in records),
            "refused": {limit: {"trials": counts[limit], "seconds": seconds[limit], "failed": failed[limit],
                                "fastest_over_best": fastest.get(limit)} for limit in counts},
            "virtual_threads": {kind: {"trials": len(ratios), "fastest_over_best": min(ratios),
                                       "median_over_best": float(np.median(ratios))}
                                for kind, ratios in by_vthreads.items() if ratios},
            "sketches": {sketch: {"trials": len(costs), "fastest_ms": min(costs) * 1e3,
                                  "median_ms": float(np.median(costs)) * 1e3, "fastest_over_best": min(costs) / best}
                         for sketch, costs in sorted(by_sketch.items(), key=lambda item: min(item[1]))},
            "thread_tiles": by_thread_tile(records, task, best)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated workloads (the names after gpu_h100_ in benchmarks/records)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_kept_logs.json")
    args = parser.parse_args()
    logs = sorted(RECORDS.glob("gpu_h100_*.json.xz"))
    names = [log.name[len("gpu_h100_"):-len(".json.xz")] for log in logs]
    wanted = set(args.only.split(",")) if args.only else set(names)
    results = {}
    table = numeric_table("workload", "limit broken", "trials refused", "their seconds / all", "of them failed",
                          "fastest refused / best", text_columns=2, title="refused by today's verifier")
    vthreads = numeric_table("workload", "virtual threads", "trials", "fastest / best", "median / best",
                             text_columns=2, title="by virtual threads")
    sketches = numeric_table("workload", "sketch", "trials", "fastest ms", "median ms", "fastest / best",
                             text_columns=2, title="by sketch")
    tiles = numeric_table("workload", "threads and a thread's outputs (i x j)", "trials", "fastest / best",
                          "median / best", text_columns=2, title="tiled sketches by thread tile (*: today's default)")
    for name, log in zip(names, logs):
        if name not in wanted:
            continue
        results[name] = found = survey(log)
        for limit, refused in sorted(found["refused"].items()) or [("-", None)]:
            fastest = refused and refused["fastest_over_best"]
            table.add_row(name, limit, f"{refused['trials'] if refused else 0} / {found['trials']}",
                          f"{refused['seconds'] if refused else 0:.0f} / {found['seconds']:.0f}",
                          str(refused["failed"] if refused else 0), f"{fastest:.1f}x" if fastest else "-")
        for kind, row in found["virtual_threads"].items():
            vthreads.add_row(name, kind, str(row["trials"]), f"{row['fastest_over_best']:.2f}x",
                             f"{row['median_over_best']:.2f}x")
        for sketch, row in found["sketches"].items():
            sketches.add_row(name, sketch, str(row["trials"]), f"{row['fastest_ms']:.4f}", f"{row['median_ms']:.4f}",
                             f"{row['fastest_over_best']:.1f}x")
        for rank, (shape, row) in enumerate(found["thread_tiles"].items()):
            if rank < TILE_ROWS or row["default"]:
                tiles.add_row(name, shape + (" *" if row["default"] else ""), str(row["trials"]),
                              f"{row['fastest_over_best']:.2f}x", f"{row['median_over_best']:.2f}x")
    print_table(table)
    print_table(vthreads)
    print_table(sketches)
    print_table(tiles)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
