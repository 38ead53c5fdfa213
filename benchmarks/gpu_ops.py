"""Auto-tuned GPU operators against the vendor libraries through PyTorch, in one run on one GPU.

    python benchmarks/gpu_ops.py --trials N [--only matmul_2048,softmax] [--budget SECS] [--compile] [--out FILE]

Each workload is tuned for N trials (or ``--budget`` seconds) on GPU 0, its cost model
taught from tilecraft's default database as ``tilecraft tune`` teaches it (``--no-transfer``:
from nothing; a workload is never taught its own records), its log written beside the
results file; its best schedule is rebuilt, checked against PyTorch and timed with CUDA
events after an L2 flush (``CudaModule.time_evaluator``), beside the same operator in
PyTorch (cuBLAS / cuDNN, TF32 off) timed the same way in the same process, and so is the
default schedule an untuned task runs (``tilecraft.search.default``). ``--compile``
adds ``torch.compile(mode="max-autotune-no-cudagraphs")`` with its compile time. The
columns: milliseconds, TFLOPS, the vendor's time over ours (above 1: tilecraft is faster), tuned and untuned,
the trials, the tuning wall time, the measured trials a minute and the best schedule's
sketch (``gpu_split_k`` where splitting the reduction won).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.database.log import best_records
from tilecraft.model.torch import as_tensor
from tilecraft.search.default import default_schedule

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script


def _conv(n: int, channels: int = 64, side: int = 56):
    return ("conv2d", (n, channels, side, side, channels, 3, 3, 1, 1),
            lambda F, x, w, b: F.relu(F.conv2d(x, w, b, padding=1)), 2 * n * channels * side * side * channels * 9)


def _nhwc_conv(F, x, w, b):
    """conv2d_nhwc_gemm in PyTorch: NHWC data and an HWIO kernel as channels-last views, the
    output's pixels as rows."""
    out = F.relu(F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), b, padding=1))
    return out.permute(0, 2, 3, 1).reshape(-1, w.shape[3])


# name -> (workload, arguments, the operator in PyTorch, FLOPs of one call)
WORKLOADS = {
    **{f"matmul_{n}": ("matmul", (n, n, n), lambda F, a, b: a @ b, 2 * n**3) for n in (1024, 2048, 4096)},
    "matmul_256x16384x256": ("matmul", (256, 16384, 256), lambda F, a, b: a @ b, 2 * 256 * 16384 * 256),  # split-K's
    # float16 in, summed in float32: tensor cores (the gpu_tensor_core sketch) against cuBLAS's float16 GEMM
    **{f"matmul_fp16_{n}": ("matmul", (n, n, n, "float16"), lambda F, a, b: a @ b, 2 * n**3) for n in (2048, 4096)},
    # bfloat16 in and out, summed in float32 (rounded as the warps store), against cuBLAS's bfloat16 GEMM
    "matmul_bf16_4096": ("matmul", (4096, 4096, 4096, "bfloat16"), lambda F, a, b: a @ b, 2 * 4096**3),
    # an epilogue through the block's tile in shared memory, and a batch (BERT's attention scores, 48 heads of 512)
    "matmul_add_fp16_2048": ("matmul_add", (2048, 2048, 2048, "float16"), lambda F, a, b, c: a @ b + c, 2 * 2048**3),
    "batch_matmul_fp16_48x512": ("batch_matmul", (48, 512, 64, 512, "float16"), lambda F, a, b: a @ b,
                                 2 * 48 * 512 * 64 * 512),
    # ResNet-50's 3x3 64->64 at 56x56 in float16 as one matrix product (implicit GEMM), against cuDNN's NHWC
    **{f"conv2d_fp16_gemm_b{n}": ("conv2d_nhwc_gemm", (n, 56, 56, 64, 64, 3, 3, 1, 1, "float16"), _nhwc_conv,
                                  2 * n * 64 * 56 * 56 * 64 * 9) for n in (1, 32)},
    # its 14x14 and 7x7 stages at batch 1: 196 and 49 pixels, padded to rows of whole tiles (208, 64)
    **{f"conv2d_fp16_gemm_{side}x{side}_b1": ("conv2d_nhwc_gemm", (1, side, side, c, c, 3, 3, 1, 1, "float16", 16),
                                              _nhwc_conv, 2 * c * side * side * c * 9)
       for side, c in ((14, 256), (7, 512))},
    "conv2d_b1": _conv(1),
    "conv2d_b32": _conv(32),
    "conv2d_512x7x7_b1": _conv(1, 512, 7),  # ResNet-50's last stage: few outputs, a long sum, a ReLU (split-K's)
    "dense_2048x1000": ("dense", (1, 2048, 1000), lambda F, x, w: F.linear(x, w), 2 * 2048 * 1000),
    # a ViT-B's MLP at 197 tokens in float16, padded to 208 rows of tensor cores' tiles
    "dense_fp16_197x768x3072": ("dense", (197, 768, 3072, "float16", 16), lambda F, x, w: F.linear(x, w),
                                2 * 197 * 768 * 3072),
    "softmax_2048x2000": ("softmax", (2048, 2000), lambda F, x: F.softmax(x, dim=-1), 5 * 2048 * 2000),
    "layer_norm_128x768": ("layer_norm", (128, 768), lambda F, x, g, b: F.layer_norm(x, (768,), g, b, 1e-5),
                           8 * 128 * 768),
}


def named(only: str, workloads) -> list[str]:
    """The names of ``workloads`` that ``--only`` (comma-separated names or their prefixes) asks for.

    Raises:
        SystemExit: If it asks for none of them.
    """
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = [n for n in workloads if any(n == w or n.startswith(w) for w in wanted)]
    if not names:
        raise SystemExit(f"--only {only!r} names no workload; the workloads are {', '.join(workloads)}")
    return names


def time_torch(fn, args, number: int, repeat: int) -> float:
    """Median over ``repeat`` of the mean of ``number`` calls, each after an L2 flush (as
    ``CudaModule.time_evaluator`` times ours)."""
    import torch

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn(*args)
    means = []
    for _ in range(repeat):
        total = 0.0
        for _ in range(number):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            total += start.elapsed_time(end) / 1e3
        means.append(total / number)
    return float(np.median(means))


def time_checked(module, inputs, reference) -> tuple[float, float]:
    """Seconds a call of ``module`` (the median of five, each of 20 calls after an L2 flush)
    and the largest error of its output relative to ``reference``'s largest value."""
    import torch

    out = module(*inputs)
    torch.cuda.synchronize()
    error = float((out - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
    return module.time_evaluator(number=20, repeat=5, flush_l2=True)(*inputs).median, error


def bench(name: str, trials: int, target, log_dir: Path, with_compile: bool, transfer: bool,
          budget: float | None) -> dict:
    import torch
    import torch.nn.functional as F

    workload, args, torch_op, flop = WORKLOADS[name]
    dtyped = any(isinstance(arg, str) for arg in args)  # a workload in another dtype names it
    task = tc.SearchTask(func=workload, args=args if dtyped else (*args, "float32"), target=target)
    log = log_dir / f"gpu_ops_{name}.json"
    log.unlink(missing_ok=True)
    started = time.perf_counter()
    policy = None
    if transfer:
        try:
            policy = tc.SketchPolicy(task, tc.transfer_model([tc.DEFAULT_RECORDS], task))
        except ValueError as error:  # nothing of this arch in the database
            print(f"{name}: the cost model starts from nothing: {error}")
    summary = task.tune(tc.TuningOptions(num_measure_trials=trials, measure_callbacks=[tc.RecordToFile(log)],
                                         time_budget_secs=budget), search_policy=policy)
    tune_secs = time.perf_counter() - started
    inputs = [as_tensor(a).cuda() for a in task.compute_dag.random_inputs(np.random.default_rng(0))]
    reference = torch_op(F, *inputs)
    (ours, error), (untuned, untuned_error) = (
        time_checked(tc.build(sch, target), inputs, reference)
        for sch in (task.apply_best(log), default_schedule(task.compute_dag, target)))
    vendor = time_torch(lambda *a: torch_op(F, *a), inputs, 20, 5)
    row = {"workload": name, "trials": summary.trials, "valid": summary.valid, "tune_secs": tune_secs,
           "refused_unbuilt": summary.rejected, "transfer": policy is not None,
           "secs": {"search": summary.search_secs, "model": summary.model_secs, "build": summary.build_secs,
                    "run": summary.run_secs, "remeasure": summary.remeasure_secs},
           "trials_per_minute": summary.trials / max(summary.search_secs + summary.model_secs + summary.build_secs
                                                     + summary.run_secs, 1e-9) * 60,
           "wall_trials_per_minute": summary.trials / tune_secs * 60, "errors": summary.errors,
           "tilecraft_ms": ours * 1e3, "vendor_ms": vendor * 1e3, "vs_vendor": vendor / ours,
           "tilecraft_tflops": flop / ours / 1e12, "vendor_tflops": flop / vendor / 1e12,
           "max_relative_error": error, "records": len(load_records(log)), "untuned_ms": untuned * 1e3,
           "vs_vendor_untuned": vendor / untuned, "untuned_max_relative_error": untuned_error,
           "best_sketch": best_records(log, top_k=1)[0].sketch}
    if with_compile:
        compiled = torch.compile(lambda *a: torch_op(F, *a), mode="max-autotune-no-cudagraphs")
        started = time.perf_counter()
        compiled(*inputs)
        torch.cuda.synchronize()
        row["compile_secs"] = time.perf_counter() - started
        row["compiled_ms"] = time_torch(compiled, inputs, 20, 5) * 1e3
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workload names (or prefixes)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile max-autotune (minutes a workload)")
    parser.add_argument("--budget", type=float, default=None, help="seconds of tuning a workload, at most")
    parser.add_argument("--no-transfer", dest="transfer", action="store_false",
                        help="tune from nothing instead of teaching the model from the default database")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_ops.json"))
    options = parser.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    names = named(options.only, WORKLOADS)
    target = tc.Target("cuda")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        try:
            rows.append(bench(name, options.trials, target, options.out.parent, options.compile, options.transfer,
                              options.budget))
        except Exception as error:  # a workload that fails is reported; the others still run
            import traceback

            traceback.print_exc()
            rows.append({"workload": name, "error": f"{type(error).__name__}: {error}"})
    table = numeric_table("workload", "tilecraft ms", "vendor ms", "vendor/ours", "TFLOPS", "untuned ms",
                          "vendor/untuned", "compiled ms", "compile s", "trials", "tune s", "trials/min", "best sketch",
                          title=f"{torch.cuda.get_device_name(0)}, fp32",
                          caption="vendor: PyTorch (cuBLAS / cuDNN, TF32 off); compiled: torch.compile max-autotune")
    for r in rows:
        if "error" in r:
            table.add_row(r["workload"], r["error"][:60], *[""] * 11)
            continue
        table.add_row(r["workload"], f"{r['tilecraft_ms']:.4f}", f"{r['vendor_ms']:.4f}", f"{r['vs_vendor']:.2f}",
                      f"{r['tilecraft_tflops']:.2f}", f"{r['untuned_ms']:.4f}", f"{r['vs_vendor_untuned']:.2f}",
                      f"{r.get('compiled_ms', float('nan')):.4f}",
                      f"{r.get('compile_secs', float('nan')):.0f}", str(r["trials"]), f"{r['tune_secs']:.0f}",
                      f"{r['wall_trials_per_minute']:.0f}", r["best_sketch"])
    print_table(table)
    options.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "target": str(target),
                                       "rows": rows}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
