"""Whether an occupancy estimate helps the cost model rank GPU candidates (no GPU needed).

    python benchmarks/gpu_occupancy.py [--seeds 8] [--out FILE]

The GPU decision features (``tilecraft/search/features.py``) give a candidate's tile factors,
its block and thread extents, its shared memory and ``gpu_waves`` (blocks over what the SMs
hold, counting threads alone). A fuller estimate adds what a GPU's occupancy calculator
counts: blocks an SM holds by threads, registers (the thread's accumulator words, plus 32)
and shared memory; the waves and the last wave's share at that occupancy; warps an SM runs.
Each kept H100 log (``benchmarks/records/gpu_h100_<workload>.json.xz``) is ranked with and
without those four columns by an ``XGBModel``: trained on 70% of the log, in time order and
on ``--seeds`` random splits, ranking the rest; then each matmul ranked by a model taught the
other matmuls alone (transfer across sizes, as a new task is taught). a-peak@32, recall@16,
Spearman's rho (``tilecraft/search/metrics.py``). Writes ``benchmarks/results/gpu_occupancy.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.metrics import peak_at_k, rank_correlation, recall_at_k
from tilecraft.search.policy import SketchPolicy

from feature_sets import decision_features, rank_held_out  # beside this script
from tables import numeric_table, print_table

RECORDS = Path(__file__).parent / "records"
WORKLOADS = ("matmul_1024", "matmul_2048", "matmul_4096", "conv2d_b1", "dense_2048x1000", "softmax_2048x2000",
             "layer_norm_128x768")
MATMULS = WORKLOADS[:3]
SM_THREADS, SM_REGISTERS, SM_SHARED, SM_BLOCKS = 2048, 65536, 228 << 10, 32  # an H100's SM
METRICS = ("peak@32", "recall@16", "rho")


def occupancy(policy: SketchPolicy, records) -> np.ndarray:
    """Per record: log2 of the blocks an SM holds, log2 of the waves, the last wave's share
    of its slots, log2 of the warps an SM runs."""
    sketches = {sketch.name: sketch for sketch in policy.sketches}
    out = []
    for record in records:
        sketch = sketches[record.sketch]
        rows = np.array([sketch.row_of(tc.Trace.from_json(record.trace))])
        logs = sketch.log_factors(rows)
        extents = sketch.gpu_extents(rows, logs)
        threads = 2 ** sum(e[0] for axis, e in extents.items() if axis.startswith("threadIdx"))
        blocks = 2 ** sum(e[0] for axis, e in extents.items() if axis.startswith("blockIdx"))
        registers = (sketch.local_words(rows, logs)[0] if sketch.local_tiles else 0) + 32
        shared = sketch.shared_bytes(rows, logs)[0] if sketch.shared_tiles else 0
        per_sm = max(min(SM_THREADS // threads, SM_REGISTERS // (registers * threads),
                         SM_SHARED // shared if shared else SM_BLOCKS, SM_BLOCKS), 1)
        slots = per_sm * sketch.gpu_limits["sm_count"]
        waves = blocks / slots
        warps = min(per_sm, math.ceil(blocks / sketch.gpu_limits["sm_count"])) * math.ceil(threads / 32)
        out.append([math.log2(per_sm), math.log2(waves), blocks / (math.ceil(waves) * slots), math.log2(warps)])
    return np.array(out)


def features_of(name: str) -> dict:
    """The log's valid records' decision features by name, the occupancy columns and costs."""
    records = [r for r in load_records(RECORDS / f"gpu_h100_{name}.json.xz") if r.is_valid]
    first = records[0]
    task = tc.SearchTask(func=first.workload["func"], args=tuple(first.workload["args"]), target=first.target)
    policy = SketchPolicy(task, XGBModel(num_warmup_sample=0))
    features, _ = decision_features(policy, records)
    kept = [n for n, f in enumerate(features) if f is not None]
    return {"names": policy.feature_space.names, "base": np.array([features[n] for n in kept]),
            "occupancy": occupancy(policy, [records[n] for n in kept]),
            "costs": np.array([records[n].mean_cost for n in kept])}


def with_occupancy(data: dict, columns: list[str], added: bool) -> np.ndarray:
    base = data["base"][:, [data["names"].index(c) for c in columns]]
    return np.concatenate([base, data["occupancy"]], axis=1) if added else base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_occupancy.json")
    options = parser.parse_args()
    data = {name: features_of(name) for name in WORKLOADS}
    rows = []
    for name, log in data.items():
        split, count = int(0.7 * len(log["costs"])), len(log["costs"])
        orders = [np.arange(count)] + [np.random.default_rng(seed).permutation(count) for seed in range(options.seeds)]
        for added in (False, True):
            features = with_occupancy(log, log["names"], added)
            runs = [rank_held_out(features, log["costs"], order[:split], order[split:]) for order in orders]
            rows.append({"workload": name, "occupancy": added, "ranked": "held-out 30%", "records": count,
                         "time": {m: runs[0][m] for m in METRICS},
                         "random": {m: float(np.nanmean([r[m] for r in runs[1:]])) for m in METRICS}})
    for held in MATMULS:
        donors = [name for name in MATMULS if name != held]
        common = [c for c in data[held]["names"] if all(c in data[d]["names"] for d in donors)]
        for added in (False, True):
            model = XGBModel(num_warmup_sample=0)
            model.update(np.concatenate([with_occupancy(data[d], common, added) for d in donors]),
                         np.concatenate([data[d]["costs"] / data[d]["costs"].min() for d in donors]))
            scores, costs = model.predict(with_occupancy(data[held], common, added)), data[held]["costs"]
            rows.append({"workload": held, "occupancy": added, "ranked": "all, taught the other matmuls",
                         "records": len(costs), "time": {"peak@32": peak_at_k(scores, costs, 32),
                                                         "recall@16": recall_at_k(scores, costs, 16),
                                                         "rho": rank_correlation(scores, costs)}})
    table = numeric_table("workload", "ranked", "occupancy", "n", "peak@32", "recall@16", "rho",
                          "random peak@32", "random recall@16", "random rho", text_columns=3,
                          caption=f"first three: the split in time order (or the whole log, taught the other "
                                  f"matmuls); random: the mean over {options.seeds} random 70/30 splits")
    for r in rows:
        random = [f"{r['random'][m]:.3f}" for m in METRICS] if "random" in r else ["-"] * 3
        table.add_row(r["workload"], r["ranked"], "yes" if r["occupancy"] else "no", str(r["records"]),
                      *(f"{r['time'][m]:.3f}" for m in METRICS), *random)
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"seeds": options.seeds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
