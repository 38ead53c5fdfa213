"""Attention's scores on this CPU: the keys copied transposed, then multiplied, against multiplied as they lie.

    python benchmarks/keys_transposed.py [--trials 150] [--out FILE]

BERT's scores, 12 heads of 128 tokens by 64 features, divided by 8: ``batch_matmul`` of the
queries and the keys transposed (B [12, 64, 128], after a copy, which is tuned too) against
``batch_matmul(..., transpose_b=True)`` reading the keys [12, 128, 64] as they lie, which is
what a GPU model computes (``graph/transposed_operands.py``). Each tuned with the same trials,
then timed interleaved. Writes ``benchmarks/results/keys_transposed.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tables import numeric_table, print_table
from tilecraft import te
from tilecraft.ops.linalg import batch_matmul
from tilecraft.ops.transform import transpose

HEADS, TOKENS, FEATURES = 12, 128, 64
ROUNDS = 200


def scores(keys_as_they_lie: bool) -> tc.ComputeDAG:
    queries = te.placeholder((HEADS, TOKENS, FEATURES), name="Q")
    keys = te.placeholder((HEADS, TOKENS, FEATURES) if keys_as_they_lie else (HEADS, FEATURES, TOKENS), name="K")
    product = batch_matmul(queries, keys, transpose_b=keys_as_they_lie)
    scaled = te.compute(product.shape, lambda b, i, j: product[b, i, j] / te.const(8.0, "float32"), name="scores")
    return tc.ComputeDAG([queries, keys, scaled])


def keys_copied() -> tc.ComputeDAG:
    keys = te.placeholder((HEADS, TOKENS, FEATURES), name="K")
    return tc.ComputeDAG([keys, transpose(keys, (0, 2, 1))])


def tuned(dag: tc.ComputeDAG, trials: int, log: Path) -> tuple[tc.Module, float]:
    task = tc.SearchTask(compute_dag=dag, target=tc.Target.host())
    started = time.perf_counter()
    task.tune(tc.TuningOptions(num_measure_trials=trials, measure_callbacks=[tc.RecordToFile(str(log))]))
    return tc.build(task.apply_best(str(log))), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150, help="tuning trials of each product (the copy: 64)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "keys_transposed.json")
    options = parser.parse_args()
    rng = np.random.default_rng(0)
    queries, keys = (rng.standard_normal((HEADS, TOKENS, FEATURES)).astype(np.float32) for _ in range(2))
    with tempfile.TemporaryDirectory() as directory:
        nn, nn_tuning = tuned(scores(False), options.trials, Path(directory) / "copied.json")
        nt, nt_tuning = tuned(scores(True), options.trials, Path(directory) / "as_they_lie.json")
        copy, copy_tuning = tuned(keys_copied(), 64, Path(directory) / "copy.json")
    np.testing.assert_allclose(nt(queries, keys), nn(queries, copy(keys)), rtol=1e-5, atol=1e-5)
    moved = copy(keys)
    calls = {"keys copied": lambda: copy(keys), "product of the copy": lambda: nn(queries, moved),
             "product of the keys as they lie": lambda: nt(queries, keys)}
    times = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    ms["copied, then the product"] = ms["keys copied"] + ms["product of the copy"]
    table = numeric_table("kernels", "ms a call", title=f"BERT's attention scores, {options.trials} trials a "
                          f"product, median of {ROUNDS} interleaved calls")
    for name, value in ms.items():
        table.add_row(name, f"{value:.4f}")
    print_table(table)
    print(f"as they lie / copied first: {ms['product of the keys as they lie'] / ms['copied, then the product']:.2f}x")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"machine": {"platform": platform.platform(), "processor": platform.processor()},
                                       "trials": options.trials, "ms": ms,
                                       "tuning_s": {"copied": nn_tuning, "as they lie": nt_tuning,
                                                    "copy": copy_tuning}}, indent=1))


if __name__ == "__main__":
    main()
