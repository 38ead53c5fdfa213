"""Whole networks on a GPU: tilecraft's GpuModel against PyTorch eager on the same GPU, in one run.

    python benchmarks/gpu_models.py [--only bert_layer,resnet50] [--trials N] [--dtype float16] [--out FILE]
    python benchmarks/gpu_models.py --emulate [--cuda-source] [--launches] [--only ...]   # nvcc, no GPU

Each network of benchmarks/model_zoo.py (batch 1, fp32) is exported to ONNX, compiled by
``tc.compile_model(path, "cuda")`` with default GPU schedules (untuned) and, with ``--trials
N``, tuned on this GPU for N trials shared by its tasks (TaskScheduler) and compiled again
from the log. Each compiled model's output is checked against onnxruntime on the CPU (rtol
1e-3). With ``--dtype float16`` the networks are exported in float16 (``model.half()``),
PyTorch eager runs them so (cuBLAS on tensor cores), their products read float16 in
tilecraft too (``graph/half.py``, tensor-core sketches among the tuned), and the check is to
1e-2. With ``--dtype bfloat16`` alike, checked against PyTorch eager in bfloat16
(onnxruntime's CPU kernels lack most bfloat16 operators; on the CPU with ``--emulate``) to
3e-2: PyTorch rounds each operator's output to bfloat16, tilecraft each kernel's. Latencies
are medians of interleaved rounds (each system timed once per round): PyTorch eager under
``no_grad`` with TF32 off, and tilecraft called with the input as a PyTorch CUDA tensor,
both waited for with ``torch.cuda.synchronize``; each tilecraft model launched kernel by
kernel (``capture_after = None``) and as one CUDA graph (``GpuModel.capture``; a model does
that by itself from its second call). PyTorch's profiler then times each kernel of eager
PyTorch and of the untuned model (``kernel_ms``: the slowest printed, all in the results
file): which kernels to fix first. Needs a GPU, cuda-bindings, PyTorch with CUDA, onnx and
onnxruntime. With ``--emulate``, each model is compiled for sm_90 and its kernels emulated
on the CPU (``GpuModel.emulate``), checked against the same reference: what the GPU will compute,
on a machine without one; with ``--cuda-source`` too, the kernels' CUDA C itself runs there
(``tc.emulate_gpu(..., cuda_source=True)``), which checks the code generator's text; with
``--launches``, each kernel's launches are listed (blocks, threads a block: a block of a few
threads, or hundreds of thousands of blocks, is a default schedule gone wrong).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import tilecraft as tc
from tilecraft.model.compiled import DefaultScheduleWarning
from tilecraft.model.torch import as_tensor
from tilecraft.te.dtype import NUMPY_DTYPES

sys.path.insert(0, str(Path(__file__).parent))
from model_zoo import MODELS, export  # noqa: E402
from tables import numeric_table, print_table  # noqa: E402  (benchmarks/tables.py)

ROUNDS = 30


def latency_ms(systems: dict, rounds: int = ROUNDS) -> dict[str, float]:
    """The median milliseconds of each system's call, the systems interleaved round by round."""
    times = {name: [] for name in systems}
    for call in systems.values():  # warm-up: loads, first allocations
        call()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, call in systems.items():
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


TOLERANCES = {"float32": dict(rtol=1e-3, atol=1e-4), "float16": dict(rtol=1e-2, atol=1e-2),
              "bfloat16": dict(rtol=3e-2, atol=3e-2)}


def close(got: np.ndarray, expected: np.ndarray, dtype: str) -> bool:
    return bool(np.allclose(got.astype(np.float32), expected.astype(np.float32), **TOLERANCES[dtype]))


def _input(name: str, dtype: str) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(MODELS[name][1]).astype(NUMPY_DTYPES[dtype])


def _expected(name: str, path: Path, x: np.ndarray, dtype: str, device: str = "cpu") -> np.ndarray:
    """The reference output: onnxruntime's on the CPU; of bfloat16, which most of its CPU kernels
    lack, eager PyTorch's (the exported weights: seeded alike) on ``device``, as float32."""
    if dtype != "bfloat16":
        return ort.InferenceSession(str(path)).run(None, {"input": x})[0].astype(np.float32)
    factory, _ = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval().to(device, torch.bfloat16)
    with torch.no_grad():
        return module(as_tensor(x).to(device)).float().cpu().numpy()



def bench(name: str, trials: int, directory: Path, dtype: str) -> dict:
    path = export(name, directory, dtype)
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval().cuda().to(getattr(torch, dtype))
    x = _input(name, dtype)
    expected = _expected(name, path, x, dtype, "cuda")
    tensor = as_tensor(x).cuda()
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        untuned = tc.compile_model(str(path), "cuda")
    untuned.capture_after = None  # kernel by kernel: the graph is the next system's
    row = {"model": name, "dtype": dtype, "kernels": len(untuned.kernels),
           "compile_secs": time.perf_counter() - started, "untuned_correct": close(untuned(input=x), expected, dtype)}
    graphed = _captured(str(path), None, tensor)
    row["graph_correct"] = close(graphed(input=x), expected, dtype)
    systems = {"pytorch_eager": lambda: module(tensor), "tilecraft_untuned": lambda: untuned(input=tensor),
               "tilecraft_untuned_graph": lambda: graphed(input=tensor)}
    if trials:
        log = directory / f"{name}_cuda.json"
        tasks, weights = tc.extract_tasks(str(path), "cuda")
        started = time.perf_counter()
        scheduler = tc.TaskScheduler(tasks, weights)
        scheduler.tune(tc.TuningOptions(num_measure_trials=trials, measure_callbacks=[tc.RecordToFile(str(log))],
                                        verbose=1))
        tuned = tc.compile_model(str(path), "cuda", log=str(log))
        tuned.capture_after = None
        row.update(tasks=len(tasks), trials=trials, tuning_secs=time.perf_counter() - started,
                   tuned_correct=close(tuned(input=x), expected, dtype))
        tuned_graph = _captured(str(path), str(log), tensor)
        systems.update(tilecraft_tuned=lambda: tuned(input=tensor),
                       tilecraft_tuned_graph=lambda: tuned_graph(input=tensor))
    with torch.no_grad():
        row.update({f"{system}_ms": ms for system, ms in latency_ms(systems).items()})
        try:  # a diagnosis: the latencies above stand without it
            row["kernel_ms"] = {system: kernel_ms(systems[system]) for system in ("pytorch_eager", "tilecraft_untuned")}
        except Exception as error:  # noqa: BLE001  (a profiler this PyTorch build lacks, CUPTI refused)
            row["kernel_ms_error"] = f"{type(error).__name__}: {error}"
    for system, kernels in row.get("kernel_ms", {}).items():
        print(f"{name}, {system}: " + ", ".join(f"{kernel} {ms:.3f}" for kernel, ms in list(kernels.items())[:8]))
    return row


def kernel_ms(call, calls: int = 10) -> dict[str, float]:
    """The GPU time of each kernel a call launches, milliseconds a call, slowest first
    (PyTorch's profiler sees every launch in the process, tilecraft's through the driver too):
    which of a model's kernels to tune or fix first."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] = times.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3 / calls
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def _captured(path: str, log: str | None, tensor):
    """The model compiled again, its launches captured in a CUDA graph (``GpuModel.capture``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        model = tc.compile_model(path, "cuda", log=log)
    model.capture({"input": tensor})
    return model


def emulate(name: str, directory: Path, dtype: str, cuda_source: bool = False) -> dict:
    """The model compiled for sm_90 (default GPU schedules), emulated (its kernels' loop nests,
    or their CUDA C), against onnxruntime."""
    path = export(name, directory, dtype)
    x = _input(name, dtype)
    expected = _expected(name, path, x, dtype)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        model = tc.compile_model(str(path), "cuda -arch=sm_90")
    compiled = time.perf_counter() - started
    got = model.emulate({"input": x}, cuda_source=cuda_source)["output"].astype("float32")
    launches = [{"kernel": kernel.desc, "blocks": math.prod(launch.grid), "threads": math.prod(launch.block),
                 "mflop": job.dag.flop_count() / 1e6}
                for kernel, job in zip(model.kernels, model._jobs) for launch in kernel.module.launches]
    return {"model": name, "dtype": dtype, "kernels": len(model.kernels), "launches": launches,
            "compile_secs": compiled,
            "emulate_secs": time.perf_counter() - started - compiled,
            "max_relative_error": float(np.abs(got - expected).max() / np.abs(expected).max()),
            "correct": close(got, expected, dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="bert_layer,resnet50", help="comma-separated models of model_zoo.MODELS")
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per model (0: untuned only)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_models.json"))
    parser.add_argument("--emulate", action="store_true", help="no GPU: emulate each model's kernels on the CPU")
    parser.add_argument("--cuda-source", action="store_true", help="with --emulate: run the kernels' CUDA C")
    parser.add_argument("--launches", action="store_true",
                        help="with --emulate: each kernel's launches too (blocks, threads a block, MFLOP)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCES), default="float32", help="the networks' element type")
    args = parser.parse_args()
    if args.emulate:
        with tempfile.TemporaryDirectory() as scratch:
            rows = [emulate(name, Path(scratch), args.dtype, args.cuda_source) for name in args.only.split(",")]
        table = numeric_table("model", "kernels", "nvcc s", "emulated s", "max rel. error", "correct",
                              title=f"whole models ({args.dtype}) compiled for sm_90, emulated on the CPU"
                                    f"{' from their CUDA C' if args.cuda_source else ''}, "
                                    f"against {'PyTorch' if args.dtype == 'bfloat16' else 'onnxruntime'}")
        for r in rows:
            table.add_row(r["model"], str(r["kernels"]), f"{r['compile_secs']:.1f}", f"{r['emulate_secs']:.1f}",
                          f"{r['max_relative_error']:.1e}", str(r["correct"]))
        print_table(table)
        if args.launches:
            launches = numeric_table("model", "kernel", "blocks", "threads a block", "MFLOP", text_columns=2,
                                     title="their launches for sm_90 (untuned)")
            for r in rows:
                for launch in r["launches"]:
                    launches.add_row(r["model"], launch["kernel"], str(launch["blocks"]), str(launch["threads"]),
                                     f"{launch['mflop']:.1f}")
            print_table(launches)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_name(f"gpu_models_emulated{'_cuda_source' if args.cuda_source else ''}"
                           f"_{args.dtype}.json").write_text(json.dumps(rows, indent=1))
        return
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as scratch:
        rows = [bench(name, args.trials, Path(scratch), args.dtype) for name in args.only.split(",")]
    table = numeric_table("model", "kernels", "eager ms", "untuned ms", "graph ms", "tuned ms", "graph ms",
                          "eager/tuned", "trials", "tuning s", "correct",
                          title=f"whole models on {torch.cuda.get_device_name()}, batch 1, {args.dtype} (graph: "
                                "captured)")
    for r in rows:
        tuned, tuned_graph = r.get("tilecraft_tuned_ms"), r.get("tilecraft_tuned_graph_ms")
        table.add_row(r["model"], str(r["kernels"]), f"{r['pytorch_eager_ms']:.3f}", f"{r['tilecraft_untuned_ms']:.3f}",
                      f"{r['tilecraft_untuned_graph_ms']:.3f}", f"{tuned:.3f}" if tuned else "-",
                      f"{tuned_graph:.3f}" if tuned_graph else "-",
                      f"{r['pytorch_eager_ms'] / min(tuned, tuned_graph):.2f}" if tuned else "-",
                      str(r.get("trials", 0)), f"{r.get('tuning_secs', 0):.0f}",
                      str(r["untuned_correct"] and r["graph_correct"] and r.get("tuned_correct", True)))
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
