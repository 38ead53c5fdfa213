"""What a call from Python costs over its kernel: a tilecraft ``Module`` beside ``torch.add`` and NumPy.

    python benchmarks/call_overhead.py [--calls 20000] [--out FILE]

The kernel adds 1 to 128 floats (about 20 ns), so a call's time is its overhead: the checks
of the arrays, reading their addresses, making the outputs and the C call. Timed serial and
parallel (OpenMP's threads woken at each call), with outputs made by the call and given to
it, in interleaved rounds (the median of 5). Writes ``benchmarks/results/call_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tables import numeric_table, print_table
from tilecraft import te

try:
    import torch
except ImportError:
    torch = None

SHAPE = (8, 16)
ROUNDS = 5


def add_one(parallel: bool) -> tc.Module:
    a = te.placeholder(SHAPE, name="a")
    b = te.compute(SHAPE, lambda i, j: a[i, j] + 1.0, name="b")
    sch = tc.Schedule(tc.ComputeDAG([a, b]))
    if parallel:
        sch.parallel(sch.get_loops(sch.get_block("b"))[0])
    return tc.build(sch)


def microseconds_a_call(fn, calls: int) -> float:
    for _ in range(200):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "call_overhead.json")
    options = parser.parse_args()
    a, out = np.zeros(SHAPE, np.float32), np.empty(SHAPE, np.float32)
    systems = {}
    for parallel in (False, True):
        module, kind = add_one(parallel), "parallel" if parallel else "serial"
        systems[f"tilecraft {kind}, output made"] = lambda module=module: module(a)
        systems[f"tilecraft {kind}, output given"] = lambda module=module: module(a, out)
    systems["numpy.add, out="] = lambda: np.add(a, 1.0, out=out)
    if torch is not None:
        ta, tout = torch.from_numpy(a), torch.from_numpy(out)
        systems["torch.add"] = lambda: torch.add(ta, 1.0)
        systems["torch.add, out="] = lambda: torch.add(ta, 1.0, out=tout)
    times = {name: [] for name in systems}
    for _ in range(ROUNDS):
        for name, fn in systems.items():
            times[name].append(microseconds_a_call(fn, options.calls))
    medians = {name: statistics.median(values) for name, values in times.items()}
    table = numeric_table("call", "us a call", title=f"A call of a 20 ns kernel, median of {ROUNDS} rounds")
    for name, value in medians.items():
        table.add_row(name, f"{value:.2f}")
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"machine": {"platform": platform.platform(), "numpy": np.__version__,
                                                   "torch": torch.__version__ if torch else None},
                                       "us_a_call": medians}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
