"""Every GPU figure the project still owes, in one run on one GPU, within a time budget.

    python benchmarks/gpu_figures.py [--budget 540] [--only check,matmuls,...] [--out DIR]

A GPU is lent for minutes at a time, so its sitting is one prepared command: this runs the GPU
benchmarks in order of what they are still needed for, each in a process of its own with a
timeout cut to the budget left (a step that would get under a minute is skipped and named),
prints the last lines of each, and writes ``DIR/gpu_figures.json``: every step's command,
exit status, seconds and output tail, beside the files each step writes. The steps:

- ``check``: the GPU tests on the GPU and compute-sanitizer (``gpu_check.py``), with the
  hand-scheduled matmul against cuBLAS;
- ``matmuls``: matmul 2048³ and 4096³ tuned (300 trials or 45 s each) against cuBLAS,
  with the trials a minute (``gpu_ops.py``);
- ``split_k``: the long-reduction matmul and matmul 1024³, where splitting the reduction
  can fill the SMs, and ResNet-50's last-stage convolution at batch 1 (its ReLU splits
  through a workspace and a second kernel);
- ``conv``: conv2d 3x3 at batch 1 against cuDNN;
- ``pipeline``: double-buffered shared tiles, A's tile laid out along i, and both, against the same tiles
  as tuned (``gpu_pipeline.py``);
- ``bert``: the BERT layer compiled for the GPU, untuned and tuned (200 trials), against
  PyTorch eager (``gpu_models.py``);
- ``small_m``: BERT's and ViT's dense layers at batch 1, each GPU sketch's default candidate
  against cuBLAS (``gpu_small_m.py``): whether an untuned product of few rows should split K
  with whole tiles rather than halve a thread's tile;
- ``tensor_cores``: a float16 matmul 4096³ tuned (its sketches include the tensor-core tiling)
  against cuBLAS's float16 GEMM;
- ``bert_float16``: the BERT layer in float16, its products on float16 operands (tensor cores
  among their sketches), untuned and tuned (200 trials), against PyTorch eager in float16;
- ``vit_float16``: a ViT-B/16 encoder layer in float16 (197 tokens: its products padded to
  whole tensor-core tiles), untuned and tuned (200 trials), against PyTorch eager in float16;
- ``bfloat16``: a bfloat16 matmul 4096³ (summed in float32) on tensor cores against cuBLAS's
  bfloat16 GEMM (``check`` runs a bfloat16 MLP through PyTorch, its tensors crossing as their bits);
- ``vit``: a ViT-B/16 encoder layer in float32, untuned, against PyTorch eager: its products
  padded from 197 tokens to 208 (``graph/half.py``), which had run blocks of one thread.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
MIN_STEP_SECS = 60  # a step given less than this is skipped: no benchmark here finishes sooner
STEPS = {
    "check": ["gpu_check.py", "--sizes", "2048,4096"],
    "matmuls": ["gpu_ops.py", "--trials", "300", "--budget", "45", "--only", "matmul_2048,matmul_4096"],
    "split_k": ["gpu_ops.py", "--trials", "300", "--budget", "45", "--only",
                "matmul_256x16384x256,matmul_1024,conv2d_512x7x7_b1"],
    "conv": ["gpu_ops.py", "--trials", "300", "--budget", "45", "--only", "conv2d_b1"],
    "pipeline": ["gpu_pipeline.py"],
    "bert": ["gpu_models.py", "--only", "bert_layer", "--trials", "200"],
    "small_m": ["gpu_small_m.py"],
    "tensor_cores": ["gpu_ops.py", "--trials", "300", "--budget", "45", "--only", "matmul_fp16_4096"],
    "bert_float16": ["gpu_models.py", "--only", "bert_layer", "--trials", "200", "--dtype", "float16"],
    "vit_float16": ["gpu_models.py", "--only", "vit_layer", "--trials", "200", "--dtype", "float16"],
    "bfloat16": ["gpu_ops.py", "--trials", "300", "--budget", "45", "--only", "matmul_bf16_4096"],
    "vit": ["gpu_models.py", "--only", "vit_layer"],
}
TAIL_LINES = 40


def run_step(name: str, seconds: float, out: Path) -> dict:
    """Run one step with ``seconds`` to finish; its command, status, seconds and output tail."""
    script, *arguments = STEPS[name]
    if script == "gpu_check.py":
        arguments += ["--out", str(out)]
    else:
        arguments += ["--out", str(out / f"{name}.json")]
    command = [sys.executable, str(HERE / script), *arguments]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds)
        status, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        status = "timeout"
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                         for part in (stopped.stdout, stopped.stderr))
    tail = "\n".join(output.splitlines()[-TAIL_LINES:])
    return {"step": name, "command": " ".join(["python", f"benchmarks/{script}", *arguments]), "status": status,
            "seconds": round(time.perf_counter() - started, 1), "tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=540, help="seconds for all the steps together")
    parser.add_argument("--only", default=",".join(STEPS), help="comma-separated steps, run in this order")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_figures"))
    options = parser.parse_args()
    names = [name for name in options.only.split(",") if name]
    unknown = [name for name in names if name not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    options.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + options.budget
    results = []
    for name in names:
        left = deadline - time.perf_counter()
        if left < MIN_STEP_SECS:
            print(f"== {name}: skipped, {left:.0f} s of the budget left", flush=True)
            results.append({"step": name, "status": "skipped", "seconds": 0.0, "tail": ""})
            continue
        result = run_step(name, left, options.out)
        results.append(result)
        print(f"== {name}: {result['status']} in {result['seconds']} s ({result['command']})\n{result['tail']}",
              flush=True)
    (options.out / "gpu_figures.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {options.out / 'gpu_figures.json'}")
    return 0 if all(r["status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
