"""A GPU round built then measured, against measured while the rest builds, on a simulated device.

    python benchmarks/gpu_overlap.py [--candidates 64] [--only matmul_2048,matmul_4096] [--out FILE]

For each workload, the first candidates of its kept H100 tuning log
(``benchmarks/records/gpu_h100_<workload>.json.xz``, as ``cuda_build.py`` takes them) make
one round, built for sm_90 by ``LocalBuilder`` (NVRTC where it loads, each arm into an empty
kernel cache) and measured by ``build_and_run`` twice: the whole round built and then
measured, and each candidate measured once built while the later ones still build, as
tuning for a GPU does. The device is simulated: measuring a candidate that built sleeps the
seconds a trial kept the H100's measuring worker busy when the workload was tuned there
(``MEASURE_MS``), so the figure is the host's side of a round; the measuring process's own
use of a core (launching, checking) is not simulated. Which arm goes first alternates from
workload to workload, after a warm-up that starts NVRTC's workers. Prints seconds a round
and trials a minute of each, and writes ``benchmarks/results/gpu_overlap.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tilecraft.measure import LocalBuilder, MeasureErrorKind, MeasureResult
from tilecraft.measure.overlap import build_and_run
from tilecraft.runtime.nvrtc import nvrtc_version

from cuda_build import kept_candidates  # benchmarks/cuda_build.py, beside this script
from tables import numeric_table, print_table

# Seconds of the measuring worker a trial on the H100 (docs/performance.md: the worker's share
# of the tuning time over its trials): matmul 1024³ 6.7 s / 300, 2048³ 10.6 / 235, 4096³ 26.0 / 103.
MEASURE_MS = {"matmul_1024": 22.0, "matmul_2048": 45.0, "matmul_4096": 252.0}
ARMS = ("after", "overlapped")


class SleepingDevice:
    """Measures a built candidate by sleeping ``measure_ms``; a failed build costs nothing."""

    def __init__(self, measure_ms: float) -> None:
        self.measure_secs = measure_ms / 1e3

    def run(self, inputs, builds, on_result=None):
        results = []
        for index, build in enumerate(builds):
            if build.error_kind is MeasureErrorKind.NONE:
                time.sleep(self.measure_secs)
                result = MeasureResult((self.measure_secs,), MeasureErrorKind.NONE, "", build.time_cost, time.time())
            else:
                result = MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time.time())
            results.append(result)
            if on_result is not None:
                on_result(index, result)
        return results


def round_seconds(inputs, measure_ms: float, overlap: bool) -> dict:
    """Wall seconds of one round into an empty cache, and where ``build_and_run`` says they went."""
    with tempfile.TemporaryDirectory() as cache:
        builder = LocalBuilder(cache_dir=Path(cache), timeout_secs=60)
        started = time.perf_counter()
        results, build_secs, run_secs = build_and_run(inputs, builder, SleepingDevice(measure_ms), overlap=overlap)
        return {"secs": time.perf_counter() - started, "waiting_for_builds_secs": build_secs,
                "measuring_secs": run_secs, "built": sum(r.error_kind is MeasureErrorKind.NONE for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=64, help="a round: tuning's default is 64")
    parser.add_argument("--only", default=",".join(MEASURE_MS), help="comma-separated workload names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_overlap.json"))
    options = parser.parse_args()
    rows = []
    for index, name in enumerate(options.only.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            inputs = kept_candidates(name, options.candidates, Path(scratch))
        row = {"workload": name, "candidates": len(inputs), "measure_ms": MEASURE_MS[name]}
        with tempfile.TemporaryDirectory() as cache:  # NVRTC's workers started, a core each, before either arm
            LocalBuilder(cache_dir=Path(cache)).build(inputs[:os.cpu_count() or 1])
        for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
            row[arm] = round_seconds(inputs, MEASURE_MS[name], overlap=arm == "overlapped")
        rows.append(row)
        print(json.dumps(row), flush=True)
    cores = os.cpu_count()
    table = numeric_table("workload", "candidates", "measure ms", "after: s", "trials/min", "overlapped: s",
                          "trials/min", "speed-up", title=f"a GPU round on {cores} cores, {nvrtc_version() or 'nvcc'}, "
                                                          "the device simulated")
    for r in rows:
        after, overlapped = r["after"]["secs"], r["overlapped"]["secs"]
        table.add_row(r["workload"], str(r["candidates"]), f"{r['measure_ms']:g}", f"{after:.1f}",
                      f"{60 * r['candidates'] / after:.0f}", f"{overlapped:.1f}",
                      f"{60 * r['candidates'] / overlapped:.0f}", f"{after / overlapped:.2f}x")
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"machine": {"platform": platform.platform(), "cores": cores,
                                                   "compiler": nvrtc_version() or "nvcc"}, "rows": rows}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
