"""The GPU machine's check: the GPU tests on a real GPU, under compute-sanitizer, and the
hand-scheduled matmul of examples/cuda_matmul.py against cuBLAS, in one run.

    python benchmarks/gpu_check.py [--out DIR] [--sizes 1024,2048,4096] [--no-sanitizer]

1. ``pytest`` on the GPU tests: every test schedule runs as a kernel there and is compared
   with NumPy (``tests/codegen/test_cuda.py``), the runtime's tests with a GPU,
   ``torch.compile(backend="tilecraft")`` on CUDA tensors against eager PyTorch, and the
   tensor-core schedules (``tests/codegen/test_tensor_core.py``).
2. compute-sanitizer, memcheck and racecheck, on the example's kernel, a double-buffered
   matmul (``cp.async``), one with 64 KB of dynamic shared memory, a random-schedule sample,
   the tensor-core example and sketch candidates (A's tile laid out along i, and that
   double-buffered, a cp.async a float; an epilogue through shared memory; fragments loaded
   column major; a convolution's padded windows, zeros filled by ``cp.async``): what the CPU
   emulation cannot see (races, out-of-bounds or misaligned accesses).
3. The example's matmul at each size, checked against NumPy (at 1024) and timed with CUDA
   events after an L2 flush (``CudaModule.time_evaluator``), beside ``torch.matmul`` (cuBLAS,
   TF32 off) timed the same way in the same process, and two neighbouring schedules (a
   longer reduction step, virtual threads); then a float16 matmul on tensor cores, hand
   scheduled, beside cuBLAS's float16. Writes ``DIR/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = [(16, 1), (8, 2)]  # (reduction step, virtual threads) beside the example's (32, 1)
sys.path.insert(0, str(ROOT / "examples"))

SANITIZED = """
import sys, numpy as np, tilecraft as tc
sys.path.insert(0, "examples"); sys.path.insert(0, "tests/codegen"); sys.path.insert(0, "tests/ir")
import cuda_matmul, tensor_core_matmul as tensor_core, test_cuda, test_pipeline
schedules = [cuda_matmul.schedule(256), test_pipeline.pipelined_matmul()[1],  # double-buffered, cp.async
             test_cuda.tiled_matmul(256, 256, 256, threads=(16, 16), tile=(8, 8), k_step=64),  # 64 KB: dynamic
             test_cuda.split_k_matmul(64, 512, 48, parts=4)]  # blocks adding into a zeroed output
schedules += [test_cuda.random_gpu_schedule(np.random.default_rng(s)) for s in range(3)]
schedules += [tensor_core.schedule(tensor_core.half_matmul(128, 128, 128))]  # tensor cores (wmma), new: last
sys.path.insert(0, "tests/search")
from test_gpu_sketches import half_attention_scores, half_matmul
from tilecraft.search.space import generate_sketches


def candidate(dag, name):  # a sketch's candidate: barriers and layouts the rules place, not a hand's
    sketch = next(s for s in generate_sketches(dag, target=tc.Target("cuda")) if name in s.name.split())
    return sketch.trace_of(sketch.sample(np.random.default_rng(0), 1, 1)[0]).replay(dag)


schedules += [candidate(tc.SearchTask(func="matmul", args=(256, 256, 256)).compute_dag, "gpu_tile_transposed"),
              candidate(tc.SearchTask(func="matmul", args=(256, 256, 256)).compute_dag,
                        "gpu_tile_transposed_pipelined"),  # 4-byte cp.async into a padded, transposed tile
              candidate(half_matmul(128, 64, 128, bias_relu=True), "gpu_tensor_core_pipelined"),  # epilogue, shared
              candidate(half_attention_scores(transpose_a=True), "gpu_tensor_core"),  # fragments column major
              candidate(tc.SearchTask(func="conv2d_nhwc_gemm", args=(1, 8, 8, 16, 32, 3, 3, 1, 1, "float16"))
                        .compute_dag, "gpu_tensor_core_pipelined")]  # a padded window: cp.async filling zeros
for sch in schedules:
    inputs = sch.dag.random_inputs(np.random.default_rng(0))
    want = sch.dag.evaluate_numpy(inputs)[0]
    close = dict(rtol=2e-3, atol=2e-2) if want.dtype == np.float16 else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tc.build(sch, "cuda")(*inputs).astype(np.float32), want.astype(np.float32), **close)
print("sanitized kernels:", len(schedules))
"""


def run(title: str, command: list[str], timeout: float) -> dict:
    print(f"=== {title}: {' '.join(command[:6])} ...", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as stopped:
        output, code = f"{stopped.stdout or ''}{stopped.stderr or ''}\ntimed out after {timeout} s", -1
    tail = "\n".join(output.strip().splitlines()[-25:])
    print(tail, flush=True)
    return {"title": title, "exit_code": code, "seconds": round(time.perf_counter() - start, 1), "tail": tail}


def benchmark(sizes: list[int]) -> list[dict]:
    import torch

    import cuda_matmul
    import tilecraft as tc
    from gpu_ops import time_torch  # beside this script: each call after an L2 flush, as ours

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for n in sizes:
        started = time.perf_counter()
        func = tc.build(cuda_matmul.schedule(n), "cuda")
        build_secs = time.perf_counter() - started
        rng = np.random.default_rng(0)
        a = torch.from_numpy(rng.standard_normal((n, n), dtype=np.float32)).cuda()
        b = torch.from_numpy(rng.standard_normal((n, n), dtype=np.float32)).cuda()
        c = func(a, b)  # device arrays in, a torch tensor out
        torch.cuda.synchronize()
        error = float((c - torch.matmul(a, b)).abs().max() / torch.matmul(a, b).abs().max())
        ours = func.time_evaluator(number=10, repeat=5, flush_l2=True)(a, b).median
        variants = {}  # the example's choices against their neighbours, measured in the same run
        for k_step, vthreads in VARIANTS:
            variant = tc.build(cuda_matmul.schedule(n, k_step, vthreads), "cuda")
            seconds = variant.time_evaluator(number=10, repeat=5, flush_l2=True)(a, b).median
            variants[f"k_step={k_step},vthreads={vthreads}"] = 2 * n**3 / seconds / 1e12
        cublas = time_torch(torch.matmul, (a, b), 10, 5)
        flops = 2 * n**3
        row = {"n": n, "tilecraft_tflops": flops / ours / 1e12, "cublas_tflops": flops / cublas / 1e12,
               "ratio": cublas / ours, "tilecraft_ms": ours * 1e3, "cublas_ms": cublas * 1e3,
               "variants_tflops": variants,
               "max_relative_error": error, "build_secs": build_secs}
        print(f"matmul {n}^3 fp32: tilecraft {row['tilecraft_tflops']:.1f} TFLOPS, cuBLAS {row['cublas_tflops']:.1f}"
              f" -> {row['ratio']:.2f}x (max relative error {error:.1e}, build {build_secs:.2f} s); variants: "
              + ", ".join(f"{name} {tflops:.1f}" for name, tflops in variants.items()), flush=True)
        row["tensor_core_fp16"] = tensor_core_row(n, a.half(), b.half())
        rows.append(row)
    return rows


def tensor_core_row(n: int, a, b) -> dict:
    """The hand-scheduled float16 matmul on tensor cores (``examples/tensor_core_matmul.py``,
    wmma, double-buffered, its shared rows padded) against cuBLAS's float16 matmul, timed the
    same way, beside variants of it."""
    import torch

    import tensor_core_matmul
    import tilecraft as tc
    from gpu_ops import time_torch

    dag = tensor_core_matmul.half_matmul(n, n, n)
    func = tc.build(tensor_core_matmul.schedule(dag), "cuda")
    variants = {"not double-buffered": dict(pipelined=False),
                "shared rows not padded (bank conflicts)": dict(padded=False),
                "fragments of A and B, 2x2 tiles a warp": dict(fragments=True, tiles=(2, 2)),
                "fragments, 2x2 tiles, stages of 64": dict(fragments=True, tiles=(2, 2), k_tiles=4)}
    c = func(a, b)
    torch.cuda.synchronize()
    want = torch.matmul(a.float(), b.float())
    error = float((c.float() - want).abs().max() / want.abs().max())
    ours = func.time_evaluator(number=10, repeat=5, flush_l2=True)(a, b).median
    others = {}
    for name, options in variants.items():
        try:
            variant = tc.build(tensor_core_matmul.schedule(dag, **options), "cuda")
            others[name] = 2 * n**3 / variant.time_evaluator(number=10, repeat=5, flush_l2=True)(a, b).median / 1e12
        except tc.TilecraftError as refused:  # over the registers, say: named, and the rest goes on
            others[name] = repr(refused)
    cublas = time_torch(torch.matmul, (a, b), 10, 5)
    row = {"tilecraft_tflops": 2 * n**3 / ours / 1e12, "cublas_tflops": 2 * n**3 / cublas / 1e12,
           "ratio": cublas / ours, "max_relative_error": error, "variants_tflops": others}
    print(f"matmul {n}^3 fp16 on tensor cores: tilecraft {row['tilecraft_tflops']:.1f} TFLOPS, cuBLAS "
          f"{row['cublas_tflops']:.1f} -> {row['ratio']:.2f}x (max relative error {error:.1e}); variants: {others}",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--sizes", default="1024,2048,4096")
    parser.add_argument("--no-sanitizer", action="store_true")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    import torch

    report: dict = {"device": torch.cuda.get_device_name(0), "steps": []}
    print("device:", report["device"], flush=True)
    report["steps"].append(run("GPU tests", [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                             "tests/codegen/test_cuda.py", "tests/test_cuda_runtime.py",
                                             "tests/tune/test_gpu_search.py", "tests/search/test_gpu_sketches.py",
                                             "tests/frontend/test_torch.py::test_on_a_gpu_torch_compile_and_from_torch_"
                                             "run_the_model_there",
                                             "tests/codegen/test_tensor_core.py",
                                             "tests/frontend/test_torch.py::test_on_a_gpu_bfloat16_tensors_cross_as_"
                                             "their_bits"], 150))  # new, last: -x stops there
    if not options.no_sanitizer:
        for tool in ("memcheck", "racecheck"):
            report["steps"].append(run(f"compute-sanitizer {tool}", ["compute-sanitizer", "--tool", tool,
                                       "--error-exitcode", "3", sys.executable, "-c", SANITIZED], 75))
    try:
        report["matmul"] = benchmark([int(s) for s in options.sizes.split(",")])
    except Exception as error:  # report what was measured before; the traceback goes to the log
        import traceback

        traceback.print_exc()
        report["benchmark_error"] = repr(error)
    (options.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print("wrote", options.out / "gpu_check.json")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
