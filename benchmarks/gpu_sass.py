"""What GPU candidates compile to, instruction by instruction, and how long they take to build (no GPU needed).

    python benchmarks/gpu_sass.py [--sizes 1024,2048,4096] [--dtype float16] [--sampled 8] [--out FILE]

Each sketch of an n x n x n matmul (float32, or float16 / bfloat16 operands summed in float32,
which adds the tensor-core sketches) gets its default candidate (``default_row``: the tiles an
untuned task takes; skipped where the verifier refuses it) and, with ``--sampled N``, N
random candidates the verifier accepts (seeded), each compiled for sm_90 by the CUDA
compiler tilecraft uses (NVRTC or nvcc, timed) and disassembled by ``cuobjdump`` (the CUDA
toolkit's; ``pip install nvidia-cuda-cuobjdump`` puts one under ``nvidia/cu13/bin`` of
site-packages). Prints, per candidate, the instructions that move data (global loads and
stores, asynchronous copies, shared loads and stores, atomic reductions) beside the FFMAs
and HMMAs, all its instructions, the registers, shared and local (spilled) bytes ptxas
reports and the build's seconds, and writes ``benchmarks/results/gpu_sass.json``. The figures
a change to the code generator or the GPU rules quotes come from here
(docs/experiments/gpu-stores-and-fills.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen.cuda import generate_cuda
from tilecraft.codegen.gpu_verify import verify_gpu
from tilecraft.errors import GpuLimitError
from tilecraft.runtime.cuda_compiler import compile_cuda_file
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

TARGET = tc.Target("cuda -arch=sm_90")
OPCODES = ("FFMA", "HMMA", "LDG", "STG", "LDGSTS", "LDS", "STS", "REDG")  # counted under an instruction's first word
RESOURCES = ("REG", "SHARED", "LOCAL")


def matmul(n: int, dtype: str) -> tc.ComputeDAG:
    A, B = te.placeholder((n, n), name="A", dtype=dtype), te.placeholder((n, n), name="B", dtype=dtype)
    k = te.reduce_axis((0, n), name="k")
    return tc.ComputeDAG([A, B, te.compute((n, n), lambda i, j: te.sum(
        A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), name="C")])


def candidates(sketch, dag: tc.ComputeDAG, sampled: int) -> list[tuple[str, tc.Schedule]]:
    """The default candidate (where the verifier takes it) and ``sampled`` random ones it takes."""
    rows = [("default", default_row(sketch, 1))]
    rows += [(f"sampled {n}", row) for n, row in enumerate(sketch.sample(np.random.default_rng(0), sampled, 1))]
    found = []
    for name, row in rows:
        func = tc.lower(sketch.trace_of(row).replay(dag))
        try:
            verify_gpu(func, TARGET)
        except GpuLimitError:
            continue
        found.append((name, func))
    return found


def disassembled(cuobjdump: str, source: str) -> tuple[Counter, dict, float]:
    """The instructions of ``source``'s cubin by opcode with its width (``STG.E.128``), its
    resources and the seconds its build took."""
    start = time.perf_counter()
    cubin = str(compile_cuda_file(source, "sm_90"))
    seconds = time.perf_counter() - start
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    opcodes = Counter(opcode for predicate, opcode in re.findall(
        r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]+)", sass) if predicate.strip() != "@!PT")  # never run
    return opcodes, {name: int(re.search(rf"\b{name}:(\d+)", usage).group(1)) for name in RESOURCES}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096", help="comma-separated n of the n x n x n matmuls")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="A's and B's type (summed in float32); 16-bit ones add the tensor-core sketches")
    parser.add_argument("--sampled", type=int, default=0, help="random candidates a sketch, besides the default")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_sass.json")
    args = parser.parse_args()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        raise SystemExit("cuobjdump is not on PATH: install the CUDA toolkit's binary utilities "
                         "(pip install nvidia-cuda-cuobjdump, then its nvidia/cu13/bin on PATH)")
    table = numeric_table("matmul", "sketch", "candidate", *OPCODES, "all", *RESOURCES, "build s", text_columns=3,
                          title=f"sm_90 SASS of {args.dtype} matmuls' candidates (n/w: n instructions, w of them "
                                "16 bytes wide)")
    results = {}
    for n in (int(size) for size in args.sizes.split(",")):
        dag = matmul(n, args.dtype)
        for sketch in generate_sketches(dag, target=TARGET):
            for name, func in candidates(sketch, dag, args.sampled):
                opcodes, resources, seconds = disassembled(cuobjdump, generate_cuda(func, TARGET)[0])
                results[f"{n}/{sketch.name}/{name}"] = {"instructions": dict(sorted(opcodes.items())), **resources,
                                                        "build_seconds": seconds}
                counts, wide = Counter(), Counter()
                for opcode, count in opcodes.items():
                    first, *widths = opcode.split(".")
                    counts[first] += count
                    wide[first] += count * ("128" in widths or "F32x4" in widths)
                table.add_row(f"{n}³", sketch.name, name,
                              *(f"{counts[op]}/{wide[op]}" if op not in ("FFMA", "HMMA") else str(counts[op])
                                for op in OPCODES), str(sum(opcodes.values())),
                              *(str(resources[key]) for key in RESOURCES), f"{seconds:.2f}")
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
