"""A shared-memory tiled matmul for an NVIDIA GPU, scheduled by hand through the public API.

    python examples/cuda_matmul.py [N]

Each block of 16 x 16 threads computes a 128 x 128 tile of C; each thread an 8 x 8 tile
held in registers (``cache_write(..., "local")``). The reduction runs in steps of 32: at
each step the block's threads copy the 128 x 32 slice of A and the 32 x 128 slice of B into
shared memory together, four floats a thread at once (``cache_read(..., "shared")``, the
copy split into vectors of four, its other loops fused and spread over the
threads), then every thread reads its
operands from there. With a GPU it runs the kernel and checks it against NumPy; without
one it checks the same schedule in the CPU emulation and prints the CUDA source.
"""

from __future__ import annotations

import sys

import numpy as np

import tilecraft as tc
from tilecraft import te

TILE, THREADS, K_STEP = 8, 16, 32  # per-thread tile, threads per block side, reduction step


def matmul(n: int):
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return [A, B, C]


def schedule(n: int, k_step: int = K_STEP, vthreads: int = 1) -> tc.Schedule:
    """The schedule; ``vthreads`` > 1 interleaves each thread's columns in that many groups
    (``vthread.x``), so that neighbouring threads read neighbouring columns of B."""
    sch = tc.Schedule(matmul(n))
    c = sch.get_block("C")
    acc = sch.cache_write(c, 0, "local")            # the copy-out block ("C_local") writes C
    i, j = sch.get_loops(acc)
    bi, ti, ii = sch.split(i, [None, THREADS, TILE])
    bj, vj, tj, jj = sch.split(j, [None, vthreads, THREADS, TILE // vthreads])
    sch.reorder(bi, bj, vj, ti, tj, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(vj, "vthread.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    jo, jv = sch.split(jj, [None, 4])
    sch.unroll(ii)
    sch.vectorize(jv)                                 # C written four floats at once
    sch.compute_at(c, tj)                             # each thread accumulates its 8 x 8 tile
    ci, cj, k = sch.get_loops(c)[-3:]
    ko, ki = sch.split(k, [None, k_step])
    sch.reorder(ko, ki, ci, cj)
    for loop in (ki, ci, cj):
        sch.unroll(loop)
    for index in (0, 1):                              # A's and B's tiles in shared memory
        cached = sch.cache_read(c, index, "shared")
        sch.compute_at(cached, ko)
        rows, cols = sch.get_loops(cached)[-2:]
        cols, vec = sch.split(cols, [None, 4])
        _, ty, tx = sch.split(sch.fuse(rows, cols), [None, THREADS, THREADS])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
    return sch


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    sch = schedule(n)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    func = tc.build(sch, "cuda")
    if not tc.cuda_available():
        print(func.source)
        small = schedule(256)
        x, y = a[:256, :256].copy(), b[:256, :256].copy()
        np.testing.assert_allclose(tc.emulate_gpu(small)(x, y), x @ y, rtol=1e-4, atol=1e-3)
        print("no GPU here: the schedule (at 256) matches NumPy in the CPU emulation")
        return
    c = func(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2)
    seconds = func.time_evaluator(number=10, repeat=3)(a, b).median
    print(f"matmul {n}^3 on the GPU: {2 * n**3 / seconds / 1e12:.1f} TFLOPS ({seconds * 1e3:.3f} ms), correct")


if __name__ == "__main__":
    main()
