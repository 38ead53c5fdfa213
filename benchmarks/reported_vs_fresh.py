"""Does the tuner's number agree with the user's? The reported best against fresh-process timings.

    python benchmarks/reported_vs_fresh.py [--shape 512,512,512] [--trials 200] [--processes 5] [--log FILE]

Runs the README's command (``tilecraft tune matmul --shape ... --trials ...``, with a fresh
log) and reads the best it reports (the median of the re-measurement that ends the tuning),
and the best single measurement of the search, which is what was reported before. Then, in
``--processes`` fresh processes one after another, builds ``apply_best``'s schedule and
times it with ``time_evaluator`` and the tuning runner's protocol (3 calls a measurement, at
least 100 ms, a warm-up call), on plain NumPy arrays (NumPy aligns them to 16 bytes) and on
copies aligned to a cache line (as the tuner's worker and a compiled model pass them), the
two interleaved. Prints the reported figure beside the median of the fresh ones, and writes
``benchmarks/results/reported_vs_fresh.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tilecraft as tc
from tilecraft.measure.worker import aligned_copy

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

RUNNER_PROTOCOL = {"number": 3, "repeat": 1, "min_repeat_ms": 100}  # LocalRunner's defaults
ROUNDS = 5  # interleaved measurements of each input layout in one process


def time_best(log: str, shape: tuple[int, ...]) -> dict[str, float]:
    """GFLOPS of the log's best schedule on NumPy's arrays and on cache-line-aligned copies (one process)."""
    task = tc.SearchTask(func="matmul", args=(*shape, "float32"), target=tc.Target.host())
    module = tc.build(task.apply_best(log), task.target)
    plain = task.compute_dag.random_inputs()
    aligned = [aligned_copy(x) for x in plain]
    timer = module.time_evaluator(**RUNNER_PROTOCOL)
    flop = task.compute_dag.flop_count()
    seconds: dict[str, list[float]] = {"numpy": [], "aligned": []}
    for _ in range(ROUNDS):
        for name, arrays in (("numpy", plain), ("aligned", aligned)):
            seconds[name].append(timer(*arrays).median)
    offsets = sorted({x.ctypes.data % 64 for x in plain})
    return {**{name: flop / statistics.median(s) / 1e9 for name, s in seconds.items()}, "numpy_offsets": offsets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="512,512,512")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reported_vs_fresh.json"))
    parser.add_argument("--log", type=Path, help="keep the tuning log here, started afresh (default: a temporary file)")
    parser.add_argument("--time", help=argparse.SUPPRESS)  # internal: one fresh process's timing of this log
    options = parser.parse_args()
    shape = tuple(int(n) for n in options.shape.split(","))
    if options.time:
        print(json.dumps(time_best(options.time, shape)))
        return
    with tempfile.TemporaryDirectory() as directory:
        log = str(options.log or Path(directory) / "matmul.json")
        Path(log).unlink(missing_ok=True)  # the README's command on a fresh log: nothing resumed
        started = time.perf_counter()
        said = subprocess.run([sys.executable, "-m", "tilecraft.cli", "tune", "matmul", "--shape", options.shape,
                               "--trials", str(options.trials), "--log", log, "--verbose", "0"],
                              capture_output=True, text=True, check=True).stdout
        tuning_secs = time.perf_counter() - started
        reported = float(re.search(r"best of the whole log .*?: ([\d.]+) GFLOPS", said).group(1))
        searched = max(r.gflops for r in tc.load_records(log) if r.phase == "search")  # what was reported before
        fresh = [json.loads(subprocess.run([sys.executable, __file__, "--shape", options.shape, "--time", log],
                                           capture_output=True, text=True, check=True).stdout.splitlines()[-1])
                 for _ in range(options.processes)]
    numpy = [f["numpy"] for f in fresh]
    aligned = [f["aligned"] for f in fresh]
    rows = [("reported by the tuner", f"{reported:.1f}", "-", "1.00"),
            ("best single measurement", f"{searched:.1f}", "-", f"{searched / reported:.2f}"),
            ("fresh, NumPy's arrays", f"{statistics.median(numpy):.1f}", f"{min(numpy):.1f}-{max(numpy):.1f}",
             f"{statistics.median(numpy) / reported:.2f}"),
            ("fresh, aligned copies", f"{statistics.median(aligned):.1f}", f"{min(aligned):.1f}-{max(aligned):.1f}",
             f"{statistics.median(aligned) / reported:.2f}")]
    table = numeric_table("timing", "GFLOPS (median)", "range", "/ reported",
                          title=f"matmul {options.shape}, {options.trials} trials ({tuning_secs:.0f} s), "
                                f"{options.processes} fresh processes")
    for row in rows:
        table.add_row(*row)
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "target": str(tc.Target.host())},
        "shape": shape, "trials": options.trials, "tuning_secs": tuning_secs, "reported_gflops": reported,
        "best_single_measurement_gflops": searched,
        "fresh": fresh, "fresh_numpy_median": statistics.median(numpy),
        "fresh_aligned_median": statistics.median(aligned)}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
