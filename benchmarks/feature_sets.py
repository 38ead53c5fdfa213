"""Decision features against IR features: how well each ranks held-out records, and its cost.

    python benchmarks/feature_sets.py LOG [LOG...] [--seeds 5] [--out FILE]

The search's cost model reads features computed from a candidate's decisions alone
(``tilecraft/search/features.py``, one NumPy pass for a whole population). Ansor instead
lowers every candidate and reads features from the loop nest; ``ir_features.py`` does
the same here. For every tuning log (records of a registered workload), both feature
sets, and the two side by side, are computed for the records that a sketch of the task
stands for; an ``XGBModel`` trained on 70% of them ranks the other 30%: a-peak@32,
recall@16 and Spearman's rho (``tilecraft/search/metrics.py``). The split is first in
time order (as the tuner sees its data: train on the past, rank what comes next), then
random, once per seed, because one split of a few hundred records is noisy. Extraction
is timed per candidate: the decision features as the search computes them (per sketch,
for a batch of decision rows), the IR features as replay + lower + ``ir_features``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.errors import TilecraftError
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.metrics import peak_at_k, rank_correlation, recall_at_k
from tilecraft.search.policy import SketchPolicy

from ir_features import IR_FEATURE_NAMES, ir_features  # benchmarks/ir_features.py, beside this script
from tables import numeric_table, print_table  # benchmarks/tables.py

METRICS = ("peak@32", "recall@16", "rho")


def decision_features(policy, records):
    """The records' decision features (None where no sketch of the task stands for the
    record's trace) and the seconds per candidate to compute them, batched per sketch."""
    by_name = {s.name: n for n, s in enumerate(policy.sketches)}
    located = []
    for record in records:
        sketch = by_name.get(record.sketch)
        row = None if sketch is None else policy.sketches[sketch].row_of(tc.Trace.from_json(record.trace))
        located.append(None if row is None else (sketch, row))
    features = [None] * len(records)
    started = time.perf_counter()
    for sketch in {loc[0] for loc in located if loc is not None}:
        positions = [n for n, loc in enumerate(located) if loc is not None and loc[0] == sketch]
        rows = policy.feature_space.features(sketch, np.array([located[n][1] for n in positions]))
        for n, row in zip(positions, rows):
            features[n] = row
    found = sum(f is not None for f in features)
    return features, (time.perf_counter() - started) / max(found, 1)


def lowered_features(task, records):
    """IR features of every record and the mean seconds of replay, lowering and extraction."""
    out = np.zeros((len(records), len(IR_FEATURE_NAMES)), dtype=np.float32)
    secs = np.zeros(3)
    for n, record in enumerate(records):
        trace = tc.Trace.from_json(record.trace)
        try:
            t0 = time.perf_counter()
            sch = trace.replay(task.compute_dag)
            t1 = time.perf_counter()
            func = tc.lower(sch)
            t2 = time.perf_counter()
            out[n] = ir_features(func, task.target)
            secs += [t1 - t0, t2 - t1, time.perf_counter() - t2]
        except TilecraftError:
            pass  # a zero row, as ir_feature_matrix gives
    return out, secs / max(len(records), 1)


def rank_held_out(features, costs, train, test):
    model = XGBModel(num_warmup_sample=0)
    started = time.perf_counter()
    model.update(features[train], costs[train])
    train_secs = time.perf_counter() - started
    scores = model.predict(features[test])
    return {"peak@32": peak_at_k(scores, costs[test], 32), "recall@16": recall_at_k(scores, costs[test], 16),
            "rho": rank_correlation(scores, costs[test]), "train_secs": train_secs}


def evaluate_log(log: Path, seeds: int):
    records = load_records(log)
    if not records or records[0].workload is None:
        print(f"  {log}: skipped (no records of a registered workload)")
        return []
    results = []
    for key in dict.fromkeys(r.workload_key for r in records):
        group = [r for r in records if r.workload_key == key]
        first = group[0]
        task = tc.SearchTask(func=first.workload["func"], args=first.workload["args"], target=first.target)
        policy = SketchPolicy(task, XGBModel(num_warmup_sample=0))
        decision, decision_secs = decision_features(policy, group)
        kept = [n for n, f in enumerate(decision) if f is not None]
        group = [group[n] for n in kept]
        lowered, lowered_secs = lowered_features(task, group)
        sets = {"decisions": np.array([decision[n] for n in kept]), "ir": lowered}
        sets["both"] = np.concatenate([sets["decisions"], sets["ir"]], axis=1)
        extract = {"decisions": decision_secs, "ir": lowered_secs.sum(), "both": decision_secs + lowered_secs.sum()}
        costs = np.array([r.mean_cost for r in group])
        split = int(0.7 * len(group))
        if split < 32 or len(group) - split < 32:
            print(f"  {log.name}: skipped ({len(group)} usable records: too few for 32 in each part of a 70/30 split)")
            continue
        order = np.arange(len(group))
        splits = [order] + [np.random.default_rng(seed).permutation(len(group)) for seed in range(seeds)]
        for name, features in sets.items():
            runs = [rank_held_out(features, costs, s[:split], s[split:]) for s in splits]
            random_runs = runs[1:]
            results.append({
                "log": log.name, "workload_key": key, "features": name, "num_features": features.shape[1],
                "records": len(group), "train": split, "test": len(group) - split,
                "extract_ms_per_candidate": 1e3 * extract[name],
                "ir_ms_per_candidate": dict(zip(("replay", "lower", "features"), (1e3 * lowered_secs).tolist())),
                "train_secs": float(np.mean([r["train_secs"] for r in runs])),
                "time_split": runs[0], "random_splits": random_runs,
                "random_mean": {m: float(np.nanmean([r[m] for r in random_runs])) for m in METRICS},
                "random_std": {m: float(np.nanstd([r[m] for r in random_runs])) for m in METRICS},
            })
        print(f"  {log.name}: done", flush=True)
    return results


def print_results(rows, seeds):
    """A row per log and feature set: the held-out ranking on the split in time order and on
    the random splits, then each feature set's means over the logs."""
    table = numeric_table("log", "features", "n", "ms/cand", "train s", "time pk@32", "time rc@16", "time rho",
                          "random peak@32", "random recall@16", "random rho", text_columns=2,
                          caption=f"time: the split in time order; random: mean ± std over {seeds} random splits")
    for r in rows:
        t, mean, std = r["time_split"], r["random_mean"], r["random_std"]
        table.add_row(r["log"], r["features"], str(r["records"]), f"{r['extract_ms_per_candidate']:.3f}",
                      f"{r['train_secs']:.2f}", f"{t['peak@32']:.3f}", f"{t['recall@16']:.2f}", f"{t['rho']:.2f}",
                      *(f"{mean[m]:.3f}±{std[m]:.3f}" for m in METRICS))
    table.add_section()
    for name in dict.fromkeys(r["features"] for r in rows):
        mine = [r for r in rows if r["features"] == name]
        table.add_row("mean over logs", name, "", f"{np.mean([r['extract_ms_per_candidate'] for r in mine]):.3f}",
                      f"{np.mean([r['train_secs'] for r in mine]):.2f}",
                      *(f"{np.nanmean([r['time_split'][m] for r in mine]):.3f}" for m in METRICS),
                      *(f"{np.nanmean([r['random_mean'][m] for r in mine]):.3f}" for m in METRICS))
    print()
    print_table(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="tuning logs (JSON lines written by tilecraft)")
    parser.add_argument("--seeds", type=int, default=5, help="random 70/30 splits per log")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/feature_sets.json"))
    options = parser.parse_args()
    missing = [str(p) for p in options.logs if not p.is_file()]
    if missing:
        parser.error(f"no such log file: {', '.join(missing)}")
    rows = []
    for log in options.logs:
        rows += evaluate_log(log, options.seeds)
    if not rows:
        print("no log had enough usable records")
        return 1
    print_results(rows, options.seeds)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "target": str(tc.Target.host()), "numpy": np.__version__},
        "seeds": options.seeds, "ir_feature_names": list(IR_FEATURE_NAMES), "results": rows}, indent=2))
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
