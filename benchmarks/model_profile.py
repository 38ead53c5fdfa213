"""Each kernel of a tuned model: its time inside the model against its time alone.

    python benchmarks/model_profile.py [--model resnet50] [--rounds 20] [--untuned] [--out FILE]

The tuner times a candidate by calling it many times in a row on the same buffers, so its
weights and inputs sit in the caches; inside the model every layer's weights are evicted
by the layers between two calls. This script compiles the model from its kept tuning logs
(benchmarks/records) and, per kernel, puts side by side: the seconds it spends in a model
call (``CompiledModel.profile``, all its calls), the same calls timed alone with warm
caches and with its weights evicted from the caches before every call, and the tuning record's cost
(``--untuned``: the default schedules, no records). The
ratios show whether the tuned objective predicts the model's latency, and which
measurement protocol to tune model tasks with. A second table sets the kernels beside
onnxruntime's nodes (its own profiler, 2 threads), summed by output shape, so the layers
where tilecraft loses are named.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

import tilecraft as tc
from tilecraft.database.log import best_records

sys.path.insert(0, str(Path(__file__).parent))
import model_zoo  # noqa: E402
from archive import restore  # noqa: E402
from tables import numeric_table, print_table  # noqa: E402


def alone_seconds(module, cold_weights: bool) -> float:
    """Seconds per call of ``module`` on random arguments, repeated on the same buffers."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(a.shape).astype(a.dtype) for a in module.args if not a.is_output]
    packed = {module.args[p.arg_index].name: inputs[p.arg_index] for p in module.packs}
    bound = module.bind_weights(**packed) if packed else module
    free = [array for arg, array in zip(module.args, inputs) if arg.name not in packed]
    timer = bound.time_evaluator(number=3, repeat=5, min_repeat_ms=50, evict_weights=cold_weights)
    return timer(*free).median


def onnxruntime_ms_by_shape(path: Path, x: np.ndarray, runs: int, directory: Path) -> dict[tuple, float]:
    """Milliseconds per model call that onnxruntime's nodes spend, summed by output shape (as NHWC)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.enable_profiling, options.profile_file_prefix = True, str(directory / "onnxruntime_profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, {"input": x})
    events = json.loads(Path(session.end_profiling()).read_text())
    spent: dict[tuple, float] = defaultdict(float)
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        shape = tuple(next(iter(event["args"]["output_type_shape"][0].values())))
        nhwc = (shape[0], *shape[2:], shape[1]) if len(shape) == 4 else shape
        spent[nhwc] += event["dur"] / 1e3 / runs
    return spent


def print_kernels(rows: list[dict], totals: dict[str, float]) -> None:
    """Each kernel's milliseconds per model call in the model, alone warm, alone cold and as recorded."""
    table = numeric_table("kernel", "calls", "in model", "warm", "cold", "record", "model/warm", "model/cold")
    for r in rows:
        table.add_row(r["kernel"], str(r["calls"]), f"{r['in_model_ms']:.3f}", f"{r['alone_warm_ms']:.3f}",
                      f"{r['alone_cold_ms']:.3f}", "-" if r["record_ms"] is None else f"{r['record_ms']:.3f}",
                      f"{r['in_model_ms'] / r['alone_warm_ms']:.2f}", f"{r['in_model_ms'] / r['alone_cold_ms']:.2f}")
    table.add_section()
    table.add_row("total (ms)", "", f"{totals['in_model_ms']:.2f}", f"{totals['alone_warm_ms']:.2f}",
                  f"{totals['alone_cold_ms']:.2f}", f"{totals['record_ms']:.2f}",
                  f"{totals['in_model_ms'] / totals['alone_warm_ms']:.2f}",
                  f"{totals['in_model_ms'] / totals['alone_cold_ms']:.2f}")
    print_table(table)


def print_by_shape(by_shape: list[dict]) -> None:
    """tilecraft's and onnxruntime's milliseconds per model call, summed by output shape."""
    table = numeric_table("output shape (NHWC)", "tilecraft ms", "onnxruntime ms", "ratio")
    for row in by_shape:
        ratio = row["tilecraft_ms"] / row["onnxruntime_ms"] if row["onnxruntime_ms"] else float("nan")
        table.add_row("x".join(map(str, row["output_shape"])), f"{row['tilecraft_ms']:.3f}",
                      f"{row['onnxruntime_ms']:.3f}", f"{ratio:.2f}")
    table.add_section()
    table.add_row("total", f"{sum(row['tilecraft_ms'] for row in by_shape):.2f}",
                  f"{sum(row['onnxruntime_ms'] for row in by_shape):.2f}", "")
    print_table(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=sorted(model_zoo.MODELS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--directory", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/model_profile.json"))
    parser.add_argument("--untuned", action="store_true", help="the default schedules, not the kept log's")
    args = parser.parse_args()
    path = model_zoo.export(args.model, args.directory / "onnx")
    log = args.directory / "model_logs" / f"{args.model}.json"
    cold = log.with_name(f"{args.model}_cold.json")  # models.py --cold-weights; its records come first
    restore(Path("benchmarks/records") / f"{args.model}_tuning.json.xz", log)
    restore(Path("benchmarks/records") / f"{args.model}_cold.json.xz", cold)
    if not args.untuned and not log.exists():
        raise SystemExit(f"no tuning log for {args.model}; tune it first: python benchmarks/models.py "
                         f"--only {args.model} --trials 2000")
    target = tc.Target.host()
    logs = [] if args.untuned else [str(p) for p in (cold, log) if p.exists()]
    model = tc.compile_model(str(path), target, log=logs or None)
    recorded = {r.workload_key: r.mean_cost for path in reversed(logs) for r in best_records(path, target=target)}
    x = np.random.default_rng(0).standard_normal(model_zoo.MODELS[args.model][1]).astype("float32")
    modules = {k.workload_key: k.module for k in model.kernels}

    rows = []
    for t in model.profile({"input": x}, rounds=args.rounds):
        module = modules[t.workload_key]
        rows.append({"kernel": t.desc, "calls": t.calls, "in_model_ms": t.seconds * 1e3,
                     "alone_warm_ms": alone_seconds(module, cold_weights=False) * t.calls * 1e3,
                     "alone_cold_ms": alone_seconds(module, cold_weights=True) * t.calls * 1e3,
                     "record_ms": recorded[t.workload_key] * t.calls * 1e3 if t.workload_key in recorded else None})
    whole = model.profile({"input": x}, rounds=args.rounds)  # again, after the kernels ran alone
    totals = {key: sum(r[key] or 0.0 for r in rows) for key in ("in_model_ms", "alone_warm_ms", "alone_cold_ms",
                                                                 "record_ms")}
    totals["in_model_again_ms"] = sum(t.seconds for t in whole) * 1e3

    print_kernels(rows, totals)
    print(f"in-model total timed again after the kernels ran alone: {totals['in_model_again_ms']:.2f} ms")

    theirs = onnxruntime_ms_by_shape(path, x, args.rounds, args.directory)
    ours: dict[tuple, float] = defaultdict(float)
    for t in whole:
        ours[next(a.shape for a in modules[t.workload_key].args if a.is_output)] += t.seconds * 1e3
    by_shape = [{"output_shape": list(shape), "tilecraft_ms": ours.get(shape, 0.0),
                 "onnxruntime_ms": theirs.get(shape, 0.0)}
                for shape in sorted(set(ours) | set(theirs), key=lambda k: -max(ours.get(k, 0), theirs.get(k, 0)))]
    print()
    print_by_shape(by_shape)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "rows": rows, "totals": totals, "by_output_shape": by_shape},
                                   indent=1))


if __name__ == "__main__":
    main()
