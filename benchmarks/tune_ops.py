"""Auto-tuned operators against NumPy (and PyTorch CPU when installed), in one run.

    python benchmarks/tune_ops.py --trials N [--only matmul_512,softmax] [--out FILE]

Each workload is tuned from scratch for N trials (its log is written beside the results
file), its best schedule is rebuilt and timed the same way as NumPy and PyTorch, and the
tuning wall time is split into search + cost model, build and run. The cost model's
ranking quality is reported on held-out records of each log: a model trained on the
first 70% of the measurements ranks the last 30% (a-peak@32, recall@16).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.measure.worker import aligned_copy
from tilecraft.model.torch import as_tensor
from tilecraft.runtime import aligned_empty
from tilecraft.runtime.peak import peak_gflops
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.metrics import peak_at_k, recall_at_k
from tilecraft.search.policy import SketchPolicy

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(tc.Target.host().num_cores)  # as many threads as tilecraft's kernels
except ImportError:
    torch = None


def conv_numpy(stride, pad):
    """im2col (strided windows of the padded input) and one matmul, then bias and ReLU."""
    def run(x, w, b):
        r = w.shape[2]
        padded = np.pad(x[0], ((0, 0), (pad, pad), (pad, pad)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (r, r), axis=(1, 2))[:, ::stride, ::stride]
        c, h, wd = windows.shape[:3]
        cols = windows.transpose(0, 3, 4, 1, 2).reshape(c * r * r, h * wd)
        out = (w.reshape(w.shape[0], -1) @ cols).reshape(w.shape[0], h, wd)
        return np.maximum(out + b[:, None, None], 0)[None]
    return run


def conv_torch(stride, pad):
    return lambda x, w, b: F.relu(F.conv2d(x, w, b, stride=stride, padding=pad))


def conv_nhwc_numpy(stride, pad):
    """im2col in NHWC: rows of (ry, rx, c) windows times the HWIO kernel seen as a matrix."""
    def run(x, w, b):
        r = w.shape[0]
        padded = np.pad(x[0], ((pad, pad), (pad, pad), (0, 0)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (r, r), axis=(0, 1))[::stride, ::stride]
        h, wd, c = windows.shape[:3]
        cols = windows.transpose(0, 1, 3, 4, 2).reshape(h * wd, r * r * c)
        return np.maximum(cols @ w.reshape(-1, w.shape[3]) + b, 0).reshape(1, h, wd, -1)
    return run


def conv_nhwc_torch(stride, pad):
    """PyTorch on the same memory: an NHWC array is a channels_last NCHW tensor."""
    return lambda x, w, b: F.relu(F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), b, stride=stride,
                                           padding=pad))


def half_matmul_numpy(a, b):
    """NumPy has no fast 16-bit product: a user widens to float32 and rounds the result back."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


def softmax_numpy(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layer_norm_numpy(x, g, b):
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5) * g + b


# name -> (registered workload, args, numpy fn, torch fn or None)
WORKLOADS = {
    "matmul_512": ("matmul", (512, 512, 512), lambda a, b: a @ b, lambda a, b: a @ b),
    "matmul_1024": ("matmul", (1024, 1024, 1024), lambda a, b: a @ b, lambda a, b: a @ b),
    # prime sizes: no tile or vector width divides them (issue 43's awkward shapes)
    "matmul_997x1021x1009": ("matmul", (997, 1021, 1009), lambda a, b: a @ b, lambda a, b: a @ b),
    # 16-bit operands, summed in float32 and rounded once (PyTorch: oneDNN, AVX-512 BF16 where the CPU has it)
    **{f"matmul_{short}_1024": ("matmul", (1024, 1024, 1024, dtype), half_matmul_numpy, lambda a, b: a @ b)
       for short, dtype in (("bf16", "bfloat16"), ("fp16", "float16"))},
    "conv2d_r50_3x3": ("conv2d", (1, 64, 56, 56, 64, 3, 3, 1, 1), conv_numpy(1, 1), conv_torch(1, 1)),
    "conv2d_r50_1x1": ("conv2d", (1, 256, 56, 56, 64, 1, 1, 1, 0), conv_numpy(1, 0), conv_torch(1, 0)),
    "conv2d_r50_3x3_s2": ("conv2d", (1, 128, 56, 56, 128, 3, 3, 2, 1), conv_numpy(2, 1), conv_torch(2, 1)),
    "conv2d_r50_3x3_nhwc": ("conv2d_nhwc", (1, 56, 56, 64, 64, 3, 3, 1, 1), conv_nhwc_numpy(1, 1),
                            conv_nhwc_torch(1, 1)),
    "conv2d_r50_1x1_nhwc": ("conv2d_nhwc", (1, 56, 56, 256, 64, 1, 1, 1, 0), conv_nhwc_numpy(1, 0),
                            conv_nhwc_torch(1, 0)),
    "conv2d_r50_3x3_s2_nhwc": ("conv2d_nhwc", (1, 56, 56, 128, 128, 3, 3, 2, 1), conv_nhwc_numpy(2, 1),
                               conv_nhwc_torch(2, 1)),
    "dense_1x2048x1000": ("dense", (1, 2048, 1000), lambda x, w: x @ w.T, lambda x, w: F.linear(x, w)),
    "batch_matmul_12x128x64": ("batch_matmul", (12, 128, 64, 128), np.matmul, torch.bmm if torch else None),
    "softmax_128x768": ("softmax", (128, 768), softmax_numpy, lambda x: torch.softmax(x, dim=1)),
    "softmax_2048x2000": ("softmax", (2048, 2000), softmax_numpy, lambda x: torch.softmax(x, dim=1)),
    "layer_norm_128x768": ("layer_norm", (128, 768), layer_norm_numpy,
                           lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b)),
}


def ranking_quality(task, log):
    """a-peak@32 and recall@16 of a model trained on the first 70% of the log, on the rest."""
    records = load_records(log, task.workload_key, task.target)
    policy = SketchPolicy(task, XGBModel(num_warmup_sample=0))
    by_name = {s.name: n for n, s in enumerate(policy.sketches)}
    rows, costs = [], []
    for record in records:
        sketch = by_name.get(record.sketch)
        row = None if sketch is None else policy.sketches[sketch].row_of(tc.Trace.from_json(record.trace))
        if row is not None:
            rows.append(policy.feature_space.features(sketch, row[None])[0])
            costs.append(record.mean_cost)
    split = int(0.7 * len(rows))
    if split < 32 or len(rows) - split < 32:
        return None
    features, costs = np.array(rows), np.array(costs)
    policy.model.update(features[:split], costs[:split])
    scores = policy.model.predict(features[split:])
    return {"peak@32": peak_at_k(scores, costs[split:], 32), "recall@16": recall_at_k(scores, costs[split:], 16),
            "train": split, "test": len(rows) - split}


def run(name, trials, log_dir, repeat, min_ms):
    workload, args, _, _ = WORKLOADS[name]
    task = tc.SearchTask(func=workload, args=args, target=tc.Target.host())
    log = log_dir / f"{name}.json"
    log.unlink(missing_ok=True)
    started = time.perf_counter()
    summary = task.tune(tc.TuningOptions(num_measure_trials=trials, measure_callbacks=[tc.RecordToFile(log)],
                                         verbose=1))
    wall = time.perf_counter() - started
    # Timed in a fresh process: in the tuner's, the threads left by tuning slowed every
    # kernel by up to 40% (measured), which would misstate both columns.
    timed = subprocess.run([sys.executable, __file__, "--time", name, "--log", str(log), "--repeat", str(repeat),
                            "--min-ms", str(min_ms)], capture_output=True, text=True, check=True)
    search = summary.search_secs + summary.model_secs
    return {
        "workload": name, "trials": summary.trials, "valid": summary.valid, "errors": summary.errors,
        **json.loads(timed.stdout.strip().splitlines()[-1]), "tuning_wall_secs": wall,
        "best_measured_while_tuning_gflops": task.compute_dag.flop_count() / summary.best_cost / 1e9,
        "reported_gflops": task.compute_dag.flop_count() / summary.final_cost / 1e9,  # the re-measured median
        "share_search_model": search / wall, "share_build": summary.build_secs / wall,
        "share_run": summary.run_secs / wall, "trials_per_minute": 60 * summary.trials / wall,
        "ranking": ranking_quality(task, log),
    }


def time_best(name, log, repeat, min_ms):
    """GFLOPS of the log's best schedule, NumPy and PyTorch, and whether all agree."""
    workload, args, numpy_fn, torch_fn = WORKLOADS[name]
    task = tc.SearchTask(func=workload, args=args, target=tc.Target.host())
    flop = task.compute_dag.flop_count()
    inputs = task.compute_dag.random_inputs()
    module = tc.build(task.apply_best(log), task.target)
    expected = task.compute_dag.evaluate_numpy(inputs)[0]
    rtol, atol = {"float16": (2e-3, 1e-2), "bfloat16": (1.6e-2, 2e-2)}.get(expected.dtype.name, (1e-3, 1e-3))
    expected = expected.astype(np.float32)  # two roundings of a 16-bit sum may differ by its last place
    correct = all(np.allclose(got.astype(np.float32), expected, rtol=rtol, atol=atol)
                  for got in (module(*inputs), numpy_fn(*inputs)))
    packed = {module.args[p.arg_index].name for p in module.packs}
    bound = module.bind_weights(**{a.name: x for a, x in zip(module.args, inputs) if a.name in packed})
    # On cache lines, as the runtime allocates a model's buffers; NumPy gives 16 bytes.
    free = [aligned_copy(x) for a, x in zip(module.args, inputs) if a.name not in packed]
    outputs = [aligned_empty(a.shape, a.dtype) for a in module.args if a.is_output]
    systems = {"tilecraft": lambda: bound(*free, *outputs), "numpy": lambda: numpy_fn(*inputs)}
    if torch is not None and torch_fn is not None:
        tensors = [as_tensor(x) for x in inputs]
        systems["torch"] = lambda: torch_fn(*tensors)
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        secs = interleaved_times(systems, repeat, min_ms)
    return {"correct": correct, **{f"{name}_gflops": flop / secs[name] / 1e9 if name in secs else None
                                   for name in ("tilecraft", "numpy", "torch")}}


def interleaved_times(systems, repeat, min_ms):
    """Median seconds per call of each system over ``repeat`` rounds that time every system
    once (a batch of at least ``min_ms``), so that a noisy spell of this shared machine
    slows all of them alike instead of whichever happened to be running."""
    numbers = {}
    for name, fn in systems.items():
        fn()
        number, elapsed = 1, 0.0
        while elapsed * 1e3 < min_ms:
            number = max(2 * number, int(number * min_ms / max(elapsed * 1e3, 1e-3)) + 1) if elapsed else 1
            started = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = time.perf_counter() - started
        numbers[name] = number
    rounds = {name: [] for name in systems}
    for _ in range(repeat):
        for name, fn in systems.items():
            time.sleep(0.05)  # let the previous system's spinning threads go to sleep
            started = time.perf_counter()
            for _ in range(numbers[name]):
                fn()
            rounds[name].append((time.perf_counter() - started) / numbers[name])
    return {name: statistics.median(times) for name, times in rounds.items()}


def print_results(rows: list[dict], peak: float) -> None:
    """A row per workload: GFLOPS against NumPy and PyTorch, and how the tuning time was spent."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    table = numeric_table("workload", "tilecraft", "%peak", "NumPy", "PyTorch", "tc/NumPy", "tc/torch", "tune s",
                          "search", "build", "run", "tr/min", "peak@32", caption="GFLOPS; shares of tuning time")
    for r in rows:
        rank = r["ranking"]["peak@32"] if r["ranking"] else None
        vs_torch = r["tilecraft_gflops"] / r["torch_gflops"] if r["torch_gflops"] else None
        table.add_row(r["workload"] + ("" if r["correct"] else "  WRONG"), f"{r['tilecraft_gflops']:.1f}",
                      f"{r['tilecraft_gflops'] / peak:.0%}", f"{r['numpy_gflops']:.1f}", fmt(r["torch_gflops"], ".1f"),
                      f"{r['tilecraft_gflops'] / r['numpy_gflops']:.2f}x", fmt(vs_torch, ".2f") + "x" * bool(vs_torch),
                      f"{r['tuning_wall_secs']:.0f}", f"{r['share_search_model']:.0%}", f"{r['share_build']:.0%}",
                      f"{r['share_run']:.0%}", f"{r['trials_per_minute']:.0f}", fmt(rank, ".2f"))
    print_table(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tune_ops.json"))
    parser.add_argument("--quick", action="store_true", help="short timing of the results")
    parser.add_argument("--time", help=argparse.SUPPRESS)  # internal: time one workload's best, print JSON
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=7, help=argparse.SUPPRESS)
    parser.add_argument("--min-ms", type=float, default=300, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.time:
        print(json.dumps(time_best(options.time, options.log, options.repeat, options.min_ms)))
        return 0
    names = [n for n in options.only.split(",") if n] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
    repeat, min_ms = (3, 50) if options.quick else (7, 300)
    log_dir = options.out.parent / "tune_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    peak = peak_gflops()
    print(f"measured fp32 FMA peak: {peak:.0f} GFLOPS", flush=True)
    rows = []
    for name in names:
        rows.append(run(name, options.trials, log_dir, repeat, min_ms))
        print(f"  {name}: done", flush=True)

    print()
    print_results(rows, peak)
    if torch is None:
        print("(PyTorch not installed: its column is skipped; pip install 'tilecraft[bench]')")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "target": str(tc.Target.host()), "numpy": np.__version__,
                    "torch": torch.__version__ if torch else None, "fma_peak_gflops": peak},
        "trials": options.trials, "workloads": rows}, indent=2))
    print(f"wrote {options.out}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
