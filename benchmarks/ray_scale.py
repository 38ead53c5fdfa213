"""Does measuring grow with the devices of a Ray cluster? RayRunner with 1, 2, 4 and 8 actors on a simulated device.

    python benchmarks/ray_scale.py [--latency-ms 100] [--trials-per-actor 24] [--actors 1,2,4,8]

The device is simulated by its latency: the candidate is a kernel that sleeps half of
``--latency-ms`` and then adds two vectors, and a measurement calls it twice (the check
against NumPy, then one timed call), so each trial keeps its device busy for the latency
while the rest of the path is the real one: the library shipped to an actor as bytes, the
isolated worker, the check, the result back through Ray. A local Ray cluster (2 CPUs, 8
"device" resources, token authentication on) runs the actors; each count of actors
measures ``--trials-per-actor`` trials an actor after a warm-up round (actors and workers
started, the workload's data sent). Ideal is one trial per latency per actor; the overhead
of a trial is what an actor spends on it beyond the latency (actors x wall / trials -
latency). ``LocalRunner`` on the same kernel, in this process, is the baseline. Prints a
table and writes ``benchmarks/results/ray_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import tempfile
import time
from pathlib import Path

import tilecraft as tc
from tilecraft import te
from tilecraft.measure import BuildResult, MeasureErrorKind, MeasureInput
from tilecraft.runtime import ArgSpec, compile_c

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

ARGS = (ArgSpec("A", (64,), "float32", False), ArgSpec("B", (64,), "float32", False),
        ArgSpec("C", (64,), "float32", True))
SETTINGS = {"number": 1, "repeat": 1, "min_repeat_ms": 0, "stop_slow_candidates": False}


def simulated_device(latency_secs: float, cache_dir: Path) -> tuple[MeasureInput, BuildResult]:
    """A candidate whose measurement (two calls) keeps its device busy for ``latency_secs``."""
    A = te.placeholder((64,), name="A")
    B = te.placeholder((64,), name="B")
    dag = tc.ComputeDAG([A, B, te.compute((64,), lambda i: A[i] + B[i], name="C")])
    source = ("#include <unistd.h>\nvoid sleep_add(const float* restrict a, const float* restrict b, "
              f"float* restrict c) {{\n  usleep({int(latency_secs / 2 * 1e6)});\n"
              "  for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i];\n}\n")
    lib_path = str(compile_c(source, tc.Target.host(), cache_dir))
    build = BuildResult(lib_path, source, "sleep_add", ARGS, (), MeasureErrorKind.NONE, "", 0.0)
    return MeasureInput(dag, tc.Target.host(), tc.Schedule(dag).trace), build


def measure(runner, candidate, build, actors: int, trials: int, latency_secs: float) -> dict:
    """A warm-up round, then ``trials`` timed; every result must be a valid cost of about half the latency."""
    runner.run([candidate] * actors, [build] * actors)
    started = time.perf_counter()
    results = runner.run([candidate] * trials, [build] * trials)
    wall = time.perf_counter() - started
    bad = [r for r in results if not r.is_valid or not latency_secs / 2 <= r.costs[0] < latency_secs]
    if bad:
        raise SystemExit(f"{len(bad)} of {trials} measurements are not the simulated device's: {bad[0]}")
    return {"actors": actors, "trials": trials, "wall_secs": wall, "trials_per_minute": 60 * trials / wall,
            "ideal_per_minute": 60 * actors / latency_secs,
            "overhead_ms": 1e3 * (actors * wall / trials - latency_secs),
            "devices": len({r.device for r in results})}  # how many measured: every actor should have


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--trials-per-actor", type=int, default=24)
    parser.add_argument("--actors", default="1,2,4,8")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_scale.json"))
    options = parser.parse_args()
    try:
        import ray
    except ImportError:
        raise SystemExit("this benchmark needs Ray: pip install 'tilecraft[ray]'") from None

    latency = options.latency_ms / 1e3
    counts = [int(n) for n in options.actors.split(",")]
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))  # token authentication on, ~/.ray untouched
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        candidate, build = simulated_device(latency, Path(directory))
        with tc.LocalRunner(**SETTINGS) as local:
            rows.append({"runner": "LocalRunner", **measure(local, candidate, build, 1, options.trials_per_actor,
                                                              latency)})
        ray.init(address="local", num_cpus=2, resources={"device": max(counts)}, include_dashboard=False,
                 object_store_memory=200 << 20, log_to_driver=False)
        try:
            for actors in counts:
                with tc.RayRunner(actor_resources={"device": 1}, n_actors=actors, **SETTINGS) as runner:
                    rows.append({"runner": "RayRunner", **measure(runner, candidate, build, actors,
                                                                  actors * options.trials_per_actor, latency)})
        finally:
            ray.shutdown()
    table = numeric_table("runner", "actors", "trials", "wall s", "trials a minute", "ideal", "of ideal",
                          "overhead ms a trial",
                          title=f"a simulated device of {options.latency_ms:g} ms a measurement, "
                                f"{options.trials_per_actor} trials an actor")
    for row in rows:
        table.add_row(row["runner"], str(row["actors"]), str(row["trials"]), f"{row['wall_secs']:.2f}",
                      f"{row['trials_per_minute']:.0f}", f"{row['ideal_per_minute']:.0f}",
                      f"{row['trials_per_minute'] / row['ideal_per_minute']:.0%}", f"{row['overhead_ms']:.1f}")
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                       "latency_ms": options.latency_ms, "rows": rows}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
