"""Choices in place by a paired test against choices by medians alone: how many tasks each changes.

    python benchmarks/in_place_churn.py MODEL.onnx LOG [--runs 3] [--out FILE]

Two copies of a model's tuning log (``LOG``, tuned on this machine, left as it is) are chosen
in place ``--runs`` times each, alternating (paired, median, paired, ...): one by
``tc.choose_in_place`` as it is, the schedule in use kept unless another beats it in a paired
test; the other with the fastest median always kept, as choices were made before the test.
Every run times the same candidates the same way; the rules differ only in what they keep.
Prints, per run, the tasks timed and the tasks whose schedule changed, and what the other
rule would have kept on the same times; then the model compiled from each copy's log and
from the original, timed in one process (60 interleaved calls each, medians). Writes
``benchmarks/results/in_place_churn.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.model import in_place

RULES = ("paired", "median")
PAIRED = in_place.paired_choice  # the rule as tilecraft has it


def by_median(costs: list[list[float]]) -> int:
    """The rule before the paired test: the fastest median, whatever the rounds say."""
    return min((c for c in range(len(costs)) if costs[c]), key=lambda c: statistics.median(costs[c]))


def one_run(model: str, log: Path, rule: str) -> dict:
    """One ``choose_in_place`` on ``log`` under ``rule``, and what each rule would have kept."""
    kept = {"paired": PAIRED, "median": by_median}
    seen: list[tuple[int, int]] = []  # (what the paired test keeps, what the median keeps), per task

    def choose(costs):
        seen.append((PAIRED(costs), by_median(costs)))
        return kept[rule](costs)

    in_place.paired_choice = choose
    try:
        report = tc.choose_in_place(model, log, verbose=0)
    finally:
        in_place.paired_choice = PAIRED
    return {"rule": rule, "tasks": len(report.choices),
            "changed": sum(c.chosen != 0 for c in report.choices),
            "paired_would_change": sum(p != 0 for p, _ in seen), "median_would_change": sum(m != 0 for _, m in seen),
            "before_ms": report.before_seconds * 1e3, "after_ms": report.after_seconds * 1e3}


def model_ms(models: dict[str, tc.CompiledModel], calls: int = 60) -> dict[str, float]:
    """Each model's median milliseconds a call, the calls interleaved."""
    first = next(iter(models.values()))
    rng = np.random.default_rng(0)
    inputs = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in first.inputs}
    spent: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(calls):
        for name, model in models.items():
            started = time.perf_counter()
            model.run(inputs)
            spent[name].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(times) for name, times in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("log", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/in_place_churn.json"))
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        logs = {rule: Path(scratch) / f"{rule}.json" for rule in RULES}
        for log in logs.values():
            shutil.copyfile(options.log, log)
        for run in range(options.runs):
            for rule in RULES:
                row = {"run": run + 1, **one_run(options.model, logs[rule], rule)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        models = {"original log": tc.compile_model(options.model, log=str(options.log)),
                  **{f"{rule} log": tc.compile_model(options.model, log=str(log)) for rule, log in logs.items()}}
        times = model_ms(models)
    print(f"{'rule':<8} {'run':>3} {'tasks':>5} {'changed':>7} {'paired test would':>17} {'median would':>12} "
          f"{'before ms':>9} {'after ms':>8}")
    for r in rows:
        print(f"{r['rule']:<8} {r['run']:>3} {r['tasks']:>5} {r['changed']:>7} {r['paired_would_change']:>17} "
              f"{r['median_would_change']:>12} {r['before_ms']:>9.3f} {r['after_ms']:>8.3f}")
    print("compiled from each log, 60 interleaved calls: "
          + ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items()))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"runs": rows, "model_ms": times}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
