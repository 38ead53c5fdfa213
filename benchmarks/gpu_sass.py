"""What the default GPU candidates compile to, instruction by instruction (no GPU needed).

    python benchmarks/gpu_sass.py [--sizes 1024,2048,4096] [--out FILE]

Each sketch of an fp32 matmul gets its default candidate (``default_row``: the tiles an untuned
task takes), compiled for sm_90 by the CUDA compiler tilecraft uses (NVRTC or nvcc) and
disassembled by ``cuobjdump`` (the CUDA toolkit's; ``pip install nvidia-cuda-cuobjdump`` puts
one under ``nvidia/cu13/bin`` of site-packages). Prints, per kernel, the instructions that
move data (global loads and stores, asynchronous copies, shared loads and stores, atomic
reductions) and the FFMAs beside them, with the registers, shared and local (spilled) bytes
ptxas reports, and writes ``benchmarks/results/gpu_sass.json``. The figures a change to the
code generator or the GPU rules quotes come from here (docs/experiments/gpu-stores-and-fills.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen.cuda import generate_cuda
from tilecraft.runtime.cuda_compiler import compile_cuda_file
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

TARGET = tc.Target("cuda -arch=sm_90")
OPCODES = ("FFMA", "LDG", "STG", "LDGSTS", "LDS", "STS", "REDG")  # an instruction counts under its first word
RESOURCES = ("REG", "SHARED", "LOCAL")


def matmul(n: int) -> tc.ComputeDAG:
    A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    return tc.ComputeDAG([A, B, te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])


def disassembled(cuobjdump: str, source: str) -> tuple[Counter, dict]:
    """The instructions of ``source``'s cubin by opcode with its width (``STG.E.128``), and its resources."""
    cubin = str(compile_cuda_file(source, "sm_90"))
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    opcodes = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]+)", sass))
    return opcodes, {name: int(re.search(rf"\b{name}:(\d+)", usage).group(1)) for name in RESOURCES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096", help="comma-separated n of the n x n x n matmuls")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_sass.json")
    args = parser.parse_args()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        raise SystemExit("cuobjdump is not on PATH: install the CUDA toolkit's binary utilities "
                         "(pip install nvidia-cuda-cuobjdump, then its nvidia/cu13/bin on PATH)")
    table = numeric_table("matmul", "sketch", *OPCODES, *RESOURCES, text_columns=2,
                          title="sm_90 SASS of each sketch's default candidate (n/w: n instructions, w of them 16 bytes wide)")
    results = {}
    for n in (int(size) for size in args.sizes.split(",")):
        dag = matmul(n)
        for sketch in generate_sketches(dag, target=TARGET):
            source, _ = generate_cuda(tc.lower(sketch.trace_of(default_row(sketch, 1)).replay(dag)), TARGET)
            opcodes, resources = disassembled(cuobjdump, source)
            results[f"{n}/{sketch.name}"] = {"instructions": dict(sorted(opcodes.items())), **resources}
            counts, wide = Counter(), Counter()
            for opcode, count in opcodes.items():
                counts[opcode.split(".")[0]] += count
                wide[opcode.split(".")[0]] += count * ("128" in opcode.split(".") or "F32x4" in opcode.split("."))
            table.add_row(f"{n}³", sketch.name, *(f"{counts[op]}/{wide[op]}" if op != "FFMA" else str(counts[op])
                                                   for op in OPCODES), *(str(resources[name]) for name in RESOURCES))
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
