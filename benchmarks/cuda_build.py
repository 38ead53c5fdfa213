"""Building GPU candidates: NVRTC against nvcc, on the same candidates, in one run (no GPU needed).

    python benchmarks/cuda_build.py [--candidates 32] [--only matmul_2048,conv2d_b1] [--out FILE]

For each workload, the first candidates that built in its kept H100 tuning log
(``benchmarks/records/gpu_h100_<workload>.json.xz``: what a taught search proposes) are
built again for sm_90 by ``LocalBuilder`` with one compiler, then the other, each into an
empty kernel cache, with as many compilations at once as this machine has cores; which
compiler goes first alternates from workload to workload, so a slow spell of a shared
machine does not favour either. Prints the wall seconds per candidate of each and their
ratio, and writes ``benchmarks/results/cuda_build.json``. Building is most of a GPU
search's time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.measure import LocalBuilder, MeasureErrorKind, MeasureInput
from tilecraft.runtime.nvrtc import nvrtc_version
from tilecraft.schedule.trace import Trace

from archive import restore  # benchmarks/archive.py, beside this script
from tables import numeric_table, print_table

RECORDS = Path(__file__).parent / "records"
WORKLOADS = ("matmul_1024", "matmul_2048", "matmul_4096", "conv2d_b1", "softmax_2048x2000")
COMPILERS = ("nvrtc", "nvcc")


def kept_candidates(name: str, count: int, scratch: Path) -> list[MeasureInput]:
    """The first ``count`` candidates of the kept H100 log of ``name`` that built and ran."""
    log = scratch / f"{name}.json"
    restore(RECORDS / f"gpu_h100_{name}.json.xz", log)
    records = [r for r in load_records(log) if r.is_valid][:count]
    target = tc.Target("cuda -arch=sm_90")
    dag = tc.SearchTask(func=records[0].workload["func"], args=tuple(records[0].workload["args"]),
                        target=target).compute_dag
    return [MeasureInput(dag, target, Trace.from_json(r.trace)) for r in records]


def build_seconds(inputs: list[MeasureInput], compiler: str) -> tuple[float, int]:
    """Wall seconds to build ``inputs`` into an empty cache, and how many built."""
    with tempfile.TemporaryDirectory() as cache:
        builder = LocalBuilder(cache_dir=Path(cache), cuda_compiler=compiler, timeout_secs=60)
        started = time.perf_counter()
        results = builder.build(inputs)
        return time.perf_counter() - started, sum(r.error_kind is MeasureErrorKind.NONE for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workload names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cuda_build.json"))
    options = parser.parse_args()
    if nvrtc_version() is None:
        raise SystemExit("NVRTC could not be loaded: pip install -e '.[cuda]'")
    rows = []
    for index, name in enumerate(options.only.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            inputs = kept_candidates(name, options.candidates, Path(scratch))
        row = {"workload": name, "candidates": len(inputs)}
        for compiler in COMPILERS if index % 2 == 0 else COMPILERS[::-1]:
            row[f"{compiler}_secs"], row[f"{compiler}_built"] = build_seconds(inputs, compiler)
        rows.append(row)
        print(json.dumps(row), flush=True)
    cores = os.cpu_count()
    table = numeric_table("workload", "candidates", "NVRTC s/candidate", "nvcc s/candidate", "nvcc / NVRTC",
                          title=f"building sm_90 candidates, {cores} compilations at once, {nvrtc_version()}")
    for r in rows:
        table.add_row(r["workload"], str(r["candidates"]), f"{r['nvrtc_secs'] / r['candidates']:.3f}",
                      f"{r['nvcc_secs'] / r['candidates']:.3f}", f"{r['nvcc_secs'] / r['nvrtc_secs']:.2f}x")
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"machine": {"platform": platform.platform(), "cores": cores,
                                                   "nvrtc": nvrtc_version()}, "rows": rows}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
