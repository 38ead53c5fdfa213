"""A float16 matmul on an NVIDIA GPU's tensor cores, scheduled by hand through the public API.

    python examples/tensor_core_matmul.py [N]

C = A @ B of float16 A and B, summed in float32 and rounded to float16 once. Each block's
warps (along ``threadIdx.y``) compute 16x16 tiles of C with wmma: the accumulator's init,
update and copy-out are nests of 16-iteration loops marked ``tensor_core``, which lowering
turns into one warp's operations, the accumulator into registers spread over the warp.
At each reduction step of ``16 * k_tiles`` the block's threads copy the slices of A and B
into shared memory together, eight halves (16 bytes) a copy, the next stage's while the
warps compute on this one's (double-buffered, ``cp.async``); the tiles' rows are padded
(``storage_align``) so that the rows a warp's ``ldmatrix`` reads at once lie in different
banks of shared memory. With a GPU it runs the kernel and checks it against NumPy; without
one it checks the schedule in the CPU emulation and prints the CUDA source.
``design_space`` is the same structure with its sizes sampled, for ``tc.tune_tir`` to search.
"""

from __future__ import annotations

import sys

import numpy as np

import tilecraft as tc
from tilecraft import te


def half_matmul(n: int, l: int, m: int, out: str = "float16", b_transposed: bool = False,
                dtype: str = "float16") -> tc.ComputeDAG:
    """C = A @ B of float16 A and B (or bfloat16), summed in float32: C of their type (the sum
    rounded once) or float32 (each product cast); B stored (m, l), as a dense layer's weight,
    where transposed."""
    A = te.placeholder((n, l), name="A", dtype=dtype)
    B = te.placeholder((m, l) if b_transposed else (l, m), name="B", dtype=dtype)
    k = te.reduce_axis((0, l), name="k")

    def b(kk, j):
        return B[j, kk] if b_transposed else B[kk, j]

    if out == "float32":
        C = te.compute((n, m), lambda i, j: te.sum(A[i, k].astype("float32") * b(k, j).astype("float32"), axis=k),
                       name="C")
    else:
        C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * b(k, j), axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


def schedule(dag: tc.ComputeDAG, warps=(2, 4), tiles=(4, 2), k_tiles: int = 2, shared: bool = True,
             vector: int = 8, pipelined: bool = True, fragments: bool = False, padded: bool = True,
             b_transposed: bool = False) -> tc.Schedule:
    """Blocks of ``warps`` warps, each summing ``tiles`` 16x16 tiles of C in its fragment (the
    default: a 128x128 block tile, 8 warps of 64x32); ``k_tiles`` steps of 16 a stage of A's
    and B's shared tiles, ``vector`` elements a copy (or the tiles read from global memory),
    double-buffered where ``pipelined``: the next stage's tiles copied (``cp.async``) while
    the warps compute on this one's. With ``fragments``, each step of 16 loads a warp's tiles
    of A and B into registers once (``cache_read(..., "local")``), which all its mma share,
    where each mma loaded its own (B's held as stored, (j, k) where ``b_transposed``: loaded
    column major). ``padded`` puts the shared tiles' rows an odd number of 16 bytes apart
    (strides 8 halves past a multiple of 32), so an ``ldmatrix`` reads them without bank
    conflicts."""
    sch = tc.Schedule(dag)
    c, ko, kt = _on_warps(sch, lambda _: [None, warps[0], tiles[0]], lambda _: [None, warps[1], tiles[1]],
                          lambda _: [None, k_tiles])
    if shared:
        for index in (0, 1):                          # A's and B's tiles in shared memory
            cached = sch.cache_read(c, index, "shared")
            sch.compute_at(cached, ko)
            fused = sch.fuse(*sch.get_loops(cached)[-2:])
            _, ty, tx, lanes = sch.split(fused, [None, warps[0] * warps[1], 32, vector])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(lanes)
            if padded:
                sch.storage_align(cached, 0, 0, 32, 8)  # rows an odd number of 16 bytes apart: no bank conflicts
        if pipelined:
            sch.annotate(ko, "software_pipeline", 2)
    if fragments:
        for index in (0, 1):                          # A's rows (i, k) and B's (k, j) or (j, k), a 16x16 tile a load
            loaded = sch.cache_read(c, index, "local")
            sch.compute_at(loaded, kt)
            rows, cols = sch.get_loops(loaded)[-2:]
            if index == 0 or b_transposed:            # its tiles down the rows
                outer, inner = sch.split(rows, [None, 16])
                sch.reorder(outer, inner, cols)
            else:
                outer, inner = sch.split(cols, [None, 16])
                sch.reorder(outer, rows, inner)
            sch.annotate(inner if index == 0 or b_transposed else rows, "tensor_core", 1)
    return sch


def _on_warps(sch: tc.Schedule, row_shares, column_shares, step_shares):
    """The structure of ``schedule`` and ``design_space``: C's 16x16 tiles over blocks (``blockIdx.x``), warps
    (``threadIdx.y``) and each warp's tiles, by the factors ``row_shares`` and
    ``column_shares`` give the loop of 16-tiles along C's rows and columns (three parts); the
    copy-out a store a tile; C's block summing each warp's tiles in its fragment, an mma a tile
    and 16-step, the 16-steps in stages by ``step_shares`` (two parts). Returns C's block, its
    loop over the stages and its loop over a stage's 16-steps."""
    c = sch.get_block("C")
    out = sch.cache_write(c, 0, "local")  # C's block now sums into the local buffer; ``out`` copies it out
    (io, ii), (jo, jj) = (sch.split(loop, [None, 16]) for loop in sch.get_loops(out))
    bi, wi, ti = sch.split(io, row_shares(io))
    bj, wj, tj = sch.split(jo, column_shares(jo))
    sch.reorder(bi, bj, wi, wj, ti, tj, ii, jj)
    sch.bind(sch.fuse(bi, bj), "blockIdx.x")
    warp = sch.fuse(wi, wj)
    sch.bind(warp, "threadIdx.y")
    sch.annotate(ii, "tensor_core", 1)                # the copy-out: a store a tile
    sch.compute_at(c, warp)                           # each warp sums its tiles
    ci, cj, k = sch.get_loops(c)[-3:]
    cti, cii = sch.split(ci, [None, 16])
    ctj, cjj = sch.split(cj, [None, 16])
    steps, ki = sch.split(k, [None, 16])
    ko, kt = sch.split(steps, step_shares(steps))
    sch.reorder(ko, kt, cti, ctj, cii, cjj, ki)
    sch.annotate(cii, "tensor_core", 1)               # the update (an mma a tile and step) and the init (a fill)
    return c, ko, kt


def design_space(sch: tc.Schedule) -> tc.Schedule:
    """The same structure with its sizes left to the search, for ``tc.tune_tir(dag, "cuda",
    work_dir, trials, space=tc.ScheduleFn(design_space))``: the blocks', warps' and tiles'
    shares of C's rows and columns, and the 16-steps of a stage, sampled; the shared tiles
    fetched by the block's threads together (``meta_schedule.cooperative_fetch``)."""
    def sampled(parts):
        return lambda loop: sch.sample_perfect_tile(loop, n=parts, max_innermost_factor=4)

    c, ko, _ = _on_warps(sch, sampled(3), sampled(3), sampled(2))
    for index in (0, 1):
        cached = sch.cache_read(c, index, "shared")
        sch.compute_at(cached, ko)
        sch.annotate(cached, "meta_schedule.cooperative_fetch", 4)
        sch.storage_align(cached, 0, 0, 32, 8)
    return sch


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    func = tc.build(schedule(half_matmul(n, n, n)), "cuda")
    if not tc.cuda_available():
        print(func.source)
        x, y = a[:256, :256].copy(), b[:256, :256].copy()
        got = tc.emulate_gpu(schedule(half_matmul(256, 256, 256)))(x, y).astype(np.float32)
        np.testing.assert_allclose(got, x.astype(np.float32) @ y.astype(np.float32), rtol=2e-3, atol=5e-2)
        print("no GPU here: the schedule (at 256) matches NumPy in the CPU emulation")
        return
    c = func(a, b).astype(np.float32)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=0.5)
    seconds = func.time_evaluator(number=10, repeat=3)(a, b).median
    print(f"float16 matmul {n}^3 on tensor cores: {2 * n**3 / seconds / 1e12:.1f} TFLOPS "
          f"({seconds * 1e3:.3f} ms), correct")


if __name__ == "__main__":
    main()
