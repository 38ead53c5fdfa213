"""Products of few rows (a transformer's at batch 1) on a GPU: every GPU sketch's default
candidate against cuBLAS, in one run.

    python benchmarks/gpu_small_m.py [--only bert,vit] [--out FILE]
    python benchmarks/gpu_small_m.py --emulate [--only ...]   # no GPU: checks the candidates

BERT-base's four dense layers at sequence 128 (128 rows: 768 -> 2304, 768 -> 768, 768 -> 3072,
3072 -> 768) and ViT-B/16's two MLP layers at 197 tokens (padded to 208 rows, as a model pads
them: ``graph/half.py``), float32. Their outputs are too few for 128 x 64 tiles to fill the
SMs, so the tiled sketch's default halves a thread's outputs (to 2 x 2 for 128 x 768) and
split-K's keeps whole tiles and splits the sum into parts that fill them
(docs/experiments/split-k-whole-tiles.md). Each sketch's default candidate (``default_row``)
is built, checked against ``torch.nn.functional.linear`` and timed with CUDA events after an
L2 flush, beside cuBLAS (TF32 off) timed the same way; the untuned default (the sketch
``default_choice`` takes) is starred. Which sketch an untuned product of few rows should take
is read from this table. With ``--emulate``, each candidate runs emulated on the CPU against
NumPy instead (``tc.emulate_gpu``), with its launch: this script's check where there is no
GPU. Writes ``benchmarks/results/gpu_small_m.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.codegen.gpu_verify import verify_gpu
from tilecraft.errors import GpuLimitError
from tilecraft.ir.lower import lower
from tilecraft.search.default import default_choice, default_row
from tilecraft.search.space import generate_sketches

sys.path.insert(0, str(Path(__file__).parent))
from gpu_ops import named, time_torch  # noqa: E402  (--only's workloads; each call after an L2 flush, as ours)
from tables import numeric_table, print_table  # noqa: E402  (benchmarks/tables.py)

# name -> dense's arguments (rows, in, out, dtype, rows' multiple)
WORKLOADS = {
    "bert_qkv": (128, 768, 2304, "float32", 1), "bert_out": (128, 768, 768, "float32", 1),
    "bert_up": (128, 768, 3072, "float32", 1), "bert_down": (128, 3072, 768, "float32", 1),
    "vit_up": (197, 768, 3072, "float32", 16), "vit_down": (197, 3072, 768, "float32", 16),
}


def candidates(task: tc.SearchTask) -> list[tuple[str, tc.Schedule, tuple]]:
    """Each sketch's default candidate the verifier accepts: its name (starred where it is
    the untuned default), schedule and launches (grid, block)."""
    _, chosen = default_choice(task.compute_dag, task.target)
    found = []
    for sketch in generate_sketches(task.compute_dag, target=task.target):
        sch = sketch.trace_of(default_row(sketch, 1)).replay(task.compute_dag)
        try:
            launches = verify_gpu(lower(sch), task.target)
        except GpuLimitError as error:
            print(f"{task.desc}: {sketch.name} refused by the verifier: {error}")
            continue
        name = sketch.name + (" *" if sketch.name == chosen else "")
        found.append((name, sch, tuple((launch.grid, launch.block) for launch in launches)))
    return found


def measured(task: tc.SearchTask, target, emulate: bool) -> list[dict]:
    """Each candidate's launches, largest error and, on a GPU, milliseconds beside cuBLAS's."""
    inputs = task.compute_dag.random_inputs(np.random.default_rng(0))
    rows = []
    if emulate:
        expected = task.compute_dag.evaluate_numpy(inputs)[0]
        for name, sch, launches in candidates(task):
            got = tc.emulate_gpu(sch, target)(*inputs)
            rows.append({"sketch": name, "launches": launches,
                         "max_relative_error": float(np.abs(got - expected).max() / np.abs(expected).max())})
        return rows
    import torch
    import torch.nn.functional as F

    x, w = (torch.from_numpy(a).cuda() for a in inputs)
    expected = F.linear(x, w)
    vendor = time_torch(F.linear, (x, w), 20, 5)
    for name, sch, launches in candidates(task):
        kernel = tc.build(sch, target)
        error = float((kernel(x, w) - expected).abs().max() / expected.abs().max())
        ms = kernel.time_evaluator(number=20, repeat=5, flush_l2=True)(x, w).median * 1e3
        rows.append({"sketch": name, "launches": launches, "max_relative_error": error, "ms": ms,
                     "cublas_ms": vendor * 1e3, "cublas_over_ours": vendor * 1e3 / ms})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="bert,vit", help="comma-separated workloads (or prefixes)")
    parser.add_argument("--emulate", action="store_true", help="no GPU: emulate each candidate against NumPy")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_small_m.json"))
    options = parser.parse_args()
    names = named(options.only, WORKLOADS)
    if options.emulate:
        target, device = tc.Target("cuda -arch=sm_90"), "emulated for sm_90"
    else:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        target, device = tc.CudaTarget.device(), torch.cuda.get_device_name(0)
    table = numeric_table("workload", "sketch (*: untuned default)", "blocks x threads", "max rel. error", "ms",
                          "cuBLAS ms", "cuBLAS/ours", text_columns=3, title=f"{device}: few rows, float32")
    results = {}
    for name in names:
        rows_in, width, out, dtype, multiple = WORKLOADS[name]
        task = tc.SearchTask(func="dense", args=(rows_in, width, out, dtype, multiple), target=target)
        results[name] = measured(task, target, options.emulate)
        for row in results[name]:
            shape = " + ".join(f"{math.prod(grid)} x {math.prod(block)}" for grid, block in row["launches"])
            table.add_row(name, row["sketch"], shape, f"{row['max_relative_error']:.1e}",
                          *(f"{row[key]:.4f}" if key in row else "-" for key in ("ms", "cublas_ms")),
                          f"{row['cublas_over_ours']:.2f}" if "ms" in row else "-")
    print_table(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"device": device, "target": str(target), "workloads": results}, indent=1))
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
