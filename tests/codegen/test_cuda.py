"""GPU schedules without a GPU: their values in the CPU emulation, their CUDA C through nvcc.

Every schedule here is checked against the NumPy evaluation of its DAG by running the
lowered GPU loop nest on the CPU the way the GPU distributes it (``tc.emulate_gpu``), and
its CUDA source is compiled for sm_90 by nvcc where nvcc is installed (CI has it). A
property test draws random GPU schedules (tilings, bindings, register and shared-memory
caches, virtual threads, vector copies, cross-thread reductions) of a matmul, a row
reduction and an element-wise chain. On a GPU
machine the same schedules also run as kernels and are compared with NumPy too.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.errors import GpuLimitError, LoweringError, ScheduleError
from tilecraft.ir.kernels import split_kernels
from tilecraft.ir.nodes import Allocate, walk_stmts
from tilecraft.ir.slices import into_view
from tilecraft.te.dtype import NUMPY_DTYPES
from tilecraft.ops.nn import softmax

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def matmul(n: int, l: int, m: int, dtype: str = "float32") -> tc.ComputeDAG:
    A = te.placeholder((n, l), name="A", dtype=dtype)
    B = te.placeholder((l, m), name="B", dtype=dtype)
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


def add_relu(n: int, m: int) -> tc.ComputeDAG:
    A = te.placeholder((n, m), name="A")
    B = te.placeholder((m,), name="B")
    S = te.compute((n, m), lambda i, j: A[i, j] + B[j], name="S")
    R = te.compute((n, m), lambda i, j: te.max(S[i, j], te.const(0.0)), name="R")
    return tc.ComputeDAG([A, B, R])


def check(sch: tc.Schedule, seed: int = 0, cuda_source: bool = False) -> None:
    """The emulated kernel equals NumPy (and so does its CUDA C run on the CPU, with
    ``cuda_source``, under AddressSanitizer then ThreadSanitizer); with nvcc, the CUDA source
    compiles for sm_90."""
    inputs = sch.dag.random_inputs(np.random.default_rng(seed))
    expected = sch.dag.evaluate_numpy(inputs)
    runs = [{}] + [dict(cuda_source=True), dict(cuda_source=True, racecheck=True)] * bool(
        cuda_source and shutil.which("g++"))
    for run in runs:
        got = tc.emulate_gpu(sch, "cuda -arch=sm_90", **run)(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"{run}; trace:\n{sch}")
    if shutil.which("nvcc"):
        kernel = tc.build(sch, "cuda" if tc.cuda_available() else "cuda -arch=sm_90")
        if tc.cuda_available():  # on a GPU machine the kernel itself runs too
            got = kernel(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"on the GPU; trace:\n{sch}")


def tiled_matmul(n: int, l: int, m: int, threads=(8, 8), tile=(2, 2), k_step=4, shared=True, vthread=1):
    sch = tc.Schedule(matmul(n, l, m))
    c = sch.get_block("C")
    acc = sch.cache_write(c, 0, "local")
    i, j = sch.get_loops(acc)
    bi, ti, ii = sch.split(i, [None, threads[0], tile[0]])
    bj, vj, tj, jj = sch.split(j, [None, vthread, threads[1], tile[1]])
    sch.reorder(bi, bj, vj, ti, tj, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(vj, "vthread.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    sch.compute_at(c, tj)
    ci, cj, k = sch.get_loops(c)[-3:]
    ko, ki = sch.split(k, [None, k_step])
    sch.reorder(ko, ki, ci, cj)
    if shared:  # the fetch spreads over exactly the consumer's threads (a small shape may use fewer)
        block = (min(threads[0], -(-n // tile[0])), min(threads[1], -(-m // (tile[1] * vthread))))
        for index in (0, 1):
            cached = sch.cache_read(c, index, "shared")
            sch.compute_at(cached, ko)
            fused = sch.fuse(*sch.get_loops(cached)[-2:])
            _, ty, tx = sch.split(fused, [None, *block])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
    return sch


def test_elementwise_bound_to_blocks_and_threads():
    sch = tc.Schedule(add_relu(37, 50))
    sch.compute_inline(sch.get_block("S"))
    i, j = sch.get_loops(sch.get_block("R"))
    fused = sch.fuse(i, j)
    bx, tx = sch.split(fused, [None, 128])  # 1850 = 14 x 128 + 58: the last block is guarded
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    check(sch)
    source = tc.build(sch, "cuda").source if shutil.which("nvcc") else ""
    assert not source or ("blockIdx.x" in source and "__launch_bounds__(128, 4)" in source)


@pytest.mark.parametrize("shape", [(64, 32, 64), (40, 24, 36)])
def test_tiled_matmul_with_shared_memory(shape):
    check(tiled_matmul(*shape))


@pytest.mark.parametrize("pipelined", [False, True])
def test_shared_tiles_with_padded_rows_match_numpy(pipelined):
    """``storage_align`` pads the rows of both shared tiles (A's 8 wide to 12 apart, B's 16
    wide to 20): the kernel indexes and sizes them by the padded strides, double-buffered too."""
    sch = tiled_matmul(64, 32, 64, threads=(4, 4), tile=(2, 4), k_step=8)
    for name, offset in (("A_shared", 4), ("B_shared", 4)):
        sch.storage_align(sch.get_block(name), 0, 0, 8, offset)
    if pipelined:
        sch.annotate(sch.get_loops(sch.get_block("C"))[-4], "software_pipeline", 2)  # ko
    shared = {n.buffer.name: n.buffer for n in walk_stmts(tc.lower(sch).body) if isinstance(n, Allocate)}
    slots = 2 if pipelined else 1
    assert (shared["A_shared"].shape[-2:], shared["A_shared"].strides[-2:]) == ((8, 8), (12, 1))
    assert (shared["B_shared"].shape[-2:], shared["B_shared"].strides[-2:]) == ((8, 16), (20, 1))
    assert [shared[n].elements for n in ("A_shared", "B_shared")] == [slots * 8 * 12, slots * 8 * 20]
    check(sch)
    if shutil.which("nvcc"):
        source = tc.build(sch, "cuda -arch=sm_90").source
        assert f"B_shared[{slots * 160}]" in source and " * 20)" in source and " * 12)" in source


def test_a_shared_tile_laid_out_column_major_is_filled_by_wide_loads_and_read_as_vectors():
    """A's tile stored (k, i), its rows padded: the fetch loads 4 floats along k at once and
    stores them a lane at a time; a thread's 4 rows of A lie side by side."""
    sch = tiled_matmul(64, 32, 64, threads=(4, 4), tile=(4, 4), k_step=8, shared=False)
    c = sch.get_block("C")
    cached = sch.cache_read(c, 0, "shared")
    sch.compute_at(cached, sch.get_loops(c)[-4])  # ko
    sch.annotate(cached, "meta_schedule.cooperative_fetch", 4)
    sch.transform_layout(cached, ("write", 0), lambda i, k: (k, i))
    sch.storage_align(cached, 0, 0, 16, 4)
    (a_shared,) = [n.buffer for n in walk_stmts(tc.lower(sch).body) if isinstance(n, Allocate)
                   and n.buffer.scope == "shared"]
    assert (a_shared.shape, a_shared.strides) == ((16, 8), (1, 20))
    check(sch)
    if shutil.which("nvcc"):
        source = tc.build(sch, "cuda -arch=sm_90").source
        assert "const float4 tc_v = *(const float4*)&A[" in source and "] = tc_v.w;" in source


@pytest.mark.parametrize("pipelined", [False, True])
def test_the_loop_over_shared_tiles_steps_is_not_unrolled_as_cutlass_main_loop_is_not(pipelined):
    """The loop whose steps fill the shared tiles between barriers gets ``#pragma unroll 1``
    (nvcc unrolled all 256 steps of double-buffered tensor-core kernels: 3-16 thousand
    instructions, builds of 2-40 s); the loops inside it still unroll."""
    from tilecraft.codegen.cuda import generate_cuda

    sch = tiled_matmul(64, 32, 64)
    if pipelined:
        sch.annotate(sch.get_loops(sch.get_block("C"))[-4], "software_pipeline", 2)  # ko
    source, _ = generate_cuda(tc.lower(sch), tc.Target("cuda -arch=sm_90"))
    assert source.count("#pragma unroll 1\n") == 1
    assert re.search(r"#pragma unroll 1\n\s*for \(int32_t k_0 = 0; k_0 < 8; \+\+k_0\)", source)


def test_a_consumer_inside_the_loop_of_a_shared_tile_waits_for_every_thread_storing_it():
    """B = A + 1 stored into shared memory by 64 threads, a column each, and C = 2B
    reverse-computed in the same block, a row a thread: all but one of a row's elements other
    threads stored, so C's nest runs after a barrier (the emulation, thread by thread, would
    otherwise read them unset)."""
    A = te.placeholder((64, 64), name="A")
    B = te.compute((64, 64), lambda i, j: A[i, j] + 1.0, name="B")
    sch = tc.Schedule(tc.ComputeDAG([A, te.compute((64, 64), lambda i, j: B[i, j] * 2.0, name="C")]))
    b = sch.get_block("B")
    sch.compute_inline(sch.cache_write(b, 0, "shared"))  # C reads B's shared buffer
    i, j = sch.get_loops(b)
    block, _ = sch.split(i, [1, None])
    sch.bind(block, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    c = sch.get_block("C")
    sch.reverse_compute_at(c, block)
    sch.bind(sch.get_loops(c)[-2], "threadIdx.x")
    text = str(tc.lower(sch))
    assert text.count("barrier()") == 1 and text.index("B_shared[") < text.index("barrier()") < text.index("C[")
    check(sch)


def test_matmul_with_virtual_threads_and_registers_only():
    check(tiled_matmul(32, 16, 64, vthread=2, shared=False))
    check(tiled_matmul(32, 16, 64, vthread=2, shared=True))


@pytest.mark.slow
@pytest.mark.parametrize("tile, stores", [(4, "*(float4*)&C["), (2, "*(float2*)&C["), (3, None)])
def test_a_threads_register_tile_is_stored_a_vector_a_row_where_its_rows_are_aligned(tile, stores):
    """A thread's 2 x ``tile`` outputs leave its registers a row at a time: one float4 where
    a row is 4 floats starting at a multiple of 4, a float2 where 2 at a multiple of 2,
    floats where 3 (a vector would be misaligned); the CUDA C, run on the CPU, traps any
    misaligned vector."""
    from tilecraft.codegen.cuda import generate_cuda

    sch = tiled_matmul(16, 8, 12 * tile, threads=(4, 4), tile=(2, tile), shared=False)
    source, _ = generate_cuda(tc.lower(sch), tc.Target("cuda -arch=sm_90"))
    assert source.count("] = make_float") == (1 if stores else 0)  # in the loop over the rows; only C is stored
    assert stores is None or stores in source
    check(sch, cuda_source=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tile, stores", [("float16", 4, "*(uint2*)&D["), ("bfloat16", 2, "*(unsigned int*)&D["),
                                                 ("float16", 8, "*(uint4*)&D[")])
def test_16_bit_outputs_are_stored_as_their_bits_packed_a_vector_at_a_time(dtype, tile, stores):
    """A thread's ``tile`` outputs a row along j, rounded to 16 bits, leave in one store of
    their packed bits (8, 16 bytes or a word), the first in the low half; the CUDA C, run
    on the CPU, equals NumPy to the type's precision."""
    from tilecraft.codegen.cuda import generate_cuda

    A, B = te.placeholder((16, 8), name="A", dtype=dtype), te.placeholder((8, 12 * tile), name="B", dtype=dtype)
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((16, 12 * tile), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"),
                                                        axis=k), name="C")
    sch = tc.Schedule(tc.ComputeDAG([A, B, te.compute(C.shape, lambda i, j: C[i, j].astype(dtype), name="D")]))
    c, d = sch.get_block("C"), sch.get_block("D")
    i, j = sch.get_loops(d)
    bi, ti, ii = sch.split(i, [None, 4, 2])
    tj, jj = sch.split(j, [None, tile])
    sch.reorder(bi, ti, tj, ii, jj)
    sch.bind(bi, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    sch.compute_at(c, tj)
    source, _ = generate_cuda(tc.lower(sch), tc.Target("cuda -arch=sm_90"))
    assert source.count(stores) == 1
    a, b = sch.dag.random_inputs(np.random.default_rng(0))
    want = a.astype(np.float32) @ b.astype(np.float32)
    got = tc.emulate_gpu(sch, "cuda -arch=sm_90", cuda_source=True)(a, b)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_a_store_whose_value_reads_another_lanes_element_stays_a_float_at_a_time():
    """out[j] = out[(j + 3) % 4] + 1, a loop of 4 contiguous, aligned elements: as a float4,
    each lane would read its neighbour before the neighbour's store, so it is no vector;
    out[j] = out[j] + 1 reads only its own and is one."""
    from tilecraft.codegen.cuda import generate_cuda
    from tilecraft.ir.nodes import Buffer, For, LoweredFunc, Store
    from tilecraft.te.expr import TensorRead, Var, binary, const

    out, j, block = Buffer("out", (4,), "float32", "arg"), Var("j"), Var("b")
    for read, vector in (((j + 3) % 4, False), (j, True)):
        store = Store(out, (j,), binary("add", TensorRead(out, (read,)), const(1.0)))
        func = LoweredFunc("f", (out,), For(block, 1, "blockIdx.x", For(j, 4, "serial", store)), (True,))
        assert ("*(float4*)&out[" in generate_cuda(func, tc.Target("cuda -arch=sm_90"))[0]) == vector


@pytest.mark.slow
def test_an_epilogue_folded_into_the_copy_out_is_stored_a_vector_at_a_time():
    """A bias and a ReLU applied to each lane of the float4s a thread stores (the default
    tiles, 16 x 4 outputs a thread, on a GPU of 8 SMs that 8 blocks of them fill)."""
    from tilecraft.codegen.cuda import generate_cuda
    from tilecraft.search.default import default_schedule

    X, W, bias = te.placeholder((256, 32), name="X"), te.placeholder((32, 256), name="W"), te.placeholder(
        (256,), name="b")
    k = te.reduce_axis((0, 32), name="k")
    Y = te.compute((256, 256), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="Y")
    out = te.compute((256, 256), lambda i, j: te.max(Y[i, j] + bias[j], te.const(0.0)), name="out")
    target = tc.Target("cuda -arch=sm_90 -sm-count=8")
    sch = default_schedule(tc.ComputeDAG([X, W, bias, out]), target)
    source, _ = generate_cuda(tc.lower(sch), target)
    assert "*(float4*)&out[" in source and "= make_float4(tc_max_f32((Y_local[" in source
    check(sch, cuda_source=True)


@pytest.mark.slow
def test_example_schedule_matches_numpy():
    """The hand-scheduled matmul of examples/cuda_matmul.py, at a size the emulation runs
    quickly; its CUDA C too, free of races."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "cuda_matmul.py"
    spec = importlib.util.spec_from_file_location("cuda_matmul", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    sch = example.schedule(256)
    check(sch, cuda_source=True)
    if shutil.which("nvcc"):
        source = tc.build(sch, "cuda").source
        assert "__shared__" in source and "__syncthreads();" in source and "float4" in source


def test_a_racecheck_without_the_cuda_source_is_refused_by_name():
    with pytest.raises(ValueError, match="racecheck runs the kernels' CUDA C under ThreadSanitizer; pass "
                                         "cuda_source=True too"):
        tc.emulate_gpu(tiled_matmul(64, 32, 64), "cuda -arch=sm_90", racecheck=True)


def test_a_step_fills_both_shared_tiles_between_one_pair_of_barriers():
    """A matmul's A and B tiles read nothing of each other: one barrier before the two fills (no
    thread overwrites what another still reads) and one after (none reads before all have
    written), not a pair each, and the kernel still equals NumPy."""
    sch = tiled_matmul(64, 32, 64)
    text = str(tc.lower(sch))
    assert text.count("barrier()") == 2 and text.count("(shared)") >= 2, text
    check(sch)


def test_lowered_gpu_nest_shows_bindings_barriers_and_scopes():
    text = str(tc.lower(tiled_matmul(64, 32, 64)))
    assert "threadIdx.x" in text and "blockIdx.y" in text
    assert "(shared)" in text and "barrier()" in text


def row_reduce(n: int, m: int, combiner: str) -> tc.ComputeDAG:
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), name="k")
    reduce = {"sum": te.sum, "max": te.max, "min": te.min}[combiner]
    B = te.compute((n,), lambda i: reduce(A[i, k], axis=k), name="B")
    return tc.ComputeDAG([A, B])


@pytest.mark.parametrize("combiner", ["sum", "max", "min"])
@pytest.mark.parametrize("threads,rows", [(16, 1), (32, 1), (48, 1), (128, 1), (8, 4), (64, 2)])
def test_cross_thread_reduction(combiner, threads, rows):
    """A reduction loop bound to threadIdx.x: partials in registers, combined by warp shuffles
    (and one shared slot a warp past 32 threads, or a slot a thread for other widths)."""
    sch = tc.Schedule(row_reduce(6, 150, combiner))
    i, k = sch.get_loops(sch.get_block("B"))
    bi, ti = sch.split(i, [None, rows])
    ko, kt = sch.split(k, [None, threads])
    sch.bind(bi, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(kt, "threadIdx.x")
    check(sch)
    if shutil.which("nvcc"):
        source = tc.build(sch, "cuda").source
        assert ("__shfl_xor_sync" in source) == (threads & (threads - 1) == 0)


def test_softmax_rows_reduced_across_threads():
    """Softmax with a block a row: the max and the sum reduced across the row's threads, every
    thread keeping both in registers for the division."""
    X = te.placeholder((6, 70), name="X")
    sch = tc.Schedule([X, softmax(X)])
    sch.compute_inline(sch.get_block("softmax_exp"))
    i, j = sch.get_loops(sch.get_block("softmax"))
    jo, jt = sch.split(j, [None, 32])
    sch.bind(i, "blockIdx.x")
    sch.bind(jt, "threadIdx.x")
    for name in ("softmax_sum", "softmax_max"):
        block = sch.get_block(name)
        sch.compute_at(block, i)
        _, kt = sch.split(sch.get_loops(block)[-1], [None, 32])
        sch.bind(kt, "threadIdx.x")
    assert "allreduce_max" in str(tc.lower(sch))
    check(sch)


def test_cross_thread_reduction_needs_its_spatial_loops_outside():
    sch = tc.Schedule(matmul(8, 64, 8))
    i, j, k = sch.get_loops(sch.get_block("C"))
    ko, kt = sch.split(k, [None, 32])
    sch.reorder(i, ko, kt, j)
    sch.bind(kt, "threadIdx.x")
    with pytest.raises(LoweringError, match="spatial loops must all be outside .* loops j are inside"):
        tc.lower(sch)


def split_k_matmul(n: int, l: int, m: int, parts: int) -> tc.Schedule:
    """A matmul's reduction in ``parts`` parts bound to blockIdx.y, each part's sum in a
    thread's register (rfactor), added into the output across the blocks."""
    sch = tc.Schedule(matmul(n, l, m))
    i, j, k = sch.get_loops(sch.get_block("C"))
    ko, _ = sch.split(k, [parts, None])
    partials = sch.rfactor(ko, 0)
    i, j, ko = sch.get_loops(sch.get_block("C"))
    sch.reorder(ko, i, j)
    sch.bind(ko, "blockIdx.y")
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.compute_at(partials, j)
    return sch


def test_a_reduction_bound_to_blocks_adds_into_an_output_zeroed_before_the_kernel():
    """Split-K: each block adds its partial into the output atomically; the launch zeroes the
    output first (the emulation too), so a call on an output full of garbage is right."""
    sch = split_k_matmul(16, 96, 24, parts=3)
    text = str(tc.lower(sch))
    assert "C is zeroed before the kernel" in text and "+= C_rf" in text and "blockIdx.y" in text
    check(sch)
    if shutil.which("nvcc"):
        kernel = tc.build(sch, "cuda -arch=sm_90")
        assert "atomicAdd(&C[" in kernel.source
        assert [(launch.grid, launch.zeroed) for launch in kernel.launches] == [((16, 3, 1), (2,))]
        assert kernel.to_json()["launch"]["zeroed"] == [2]
    a, b = sch.dag.random_inputs(np.random.default_rng(3))
    garbage = np.full((16, 24), np.nan, np.float32)
    tc.emulate_gpu(sch, "cuda -arch=sm_90")(a, b, garbage)
    np.testing.assert_allclose(garbage, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_split_k_parts_are_added_a_float4_at_a_time_from_sm_90_on():
    """The split-K sketch's default, 16 x 4 outputs a thread (on a GPU of 8 SMs): on sm_90 a
    row of a thread's partial sums is added by one atomicAdd of a float4, before it a float a
    call; the CUDA C, run on the CPU, adds them right."""
    from tilecraft.codegen.cuda import generate_cuda
    from tilecraft.search.default import default_row
    from tilecraft.search.space import generate_sketches

    dag = matmul(128, 512, 128)
    for arch, adds in (("sm_90", "atomicAdd((float4*)&C["), ("sm_80", "atomicAdd(&C[")):
        target = tc.Target(f"cuda -arch={arch} -sm-count=8")
        (sketch,) = [s for s in generate_sketches(dag, target=target) if s.name == "gpu_split_k"]
        sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
        source, _ = generate_cuda(tc.lower(sch), target)
        assert source.count("atomicAdd(") == 1 and adds in source
    check(sch, cuda_source=True)


def test_a_reduction_across_blocks_must_be_a_sum_that_nothing_in_the_kernel_reads():
    sch = tc.Schedule(row_reduce(6, 64, "max"))
    i, k = sch.get_loops(sch.get_block("B"))
    sch.bind(i, "threadIdx.x")
    sch.bind(k, "blockIdx.x")
    with pytest.raises(LoweringError, match="needs a sum of float32, float64, int32.*it is a max of float32"):
        tc.lower(sch)
    A = te.placeholder((6, 64), name="A")
    k = te.reduce_axis((0, 64), name="k")
    total = te.compute((6,), lambda i: te.sum(A[i, k], axis=k), name="total")
    scaled = te.compute((6,), lambda i: total[i] * 2.0, name="scaled")
    sch = tc.Schedule(tc.ComputeDAG([A, scaled]))
    i, k = sch.get_loops(sch.get_block("total"))
    sch.bind(k, "blockIdx.x")
    sch.bind(sch.get_loops(sch.get_block("scaled"))[0], "threadIdx.x")
    with pytest.raises(LoweringError, match="whole only when the kernel ends; but block scaled reads it"):
        tc.lower(sch)


def test_an_output_that_blocks_add_into_cannot_be_written_into_a_slice():
    with pytest.raises(LoweringError, match="adds into C across GPU blocks"):
        into_view(tc.lower(split_k_matmul(16, 96, 24, parts=3)), "C", (16, 48), 24, (48, 1))


# ----------------------------------------------------------------------------- errors


def test_binding_mistakes_are_schedule_errors():
    sch = tc.Schedule(matmul(32, 32, 32))
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.bind(i, "blockIdx.x")
    with pytest.raises(ScheduleError, match="already bound to blockIdx.x"):
        sch.bind(i, "threadIdx.x")
    with pytest.raises(ScheduleError, match="already binds blockIdx.x to loop i"):
        sch.bind(j, "blockIdx.x")
    with pytest.raises(ScheduleError, match="reduction loop and cannot be bound to vthread.x: virtual threads"):
        sch.bind(k, "vthread.x")
    with pytest.raises(ScheduleError, match="along threadIdx.x only"):
        sch.bind(k, "threadIdx.y")
    with pytest.raises(ScheduleError, match="unknown thread axis 'threadIdx.w'"):
        sch.bind(j, "threadIdx.w")
    with pytest.raises(ScheduleError, match="bound to blockIdx.x"):
        sch.parallel(i)
    with pytest.raises(ScheduleError, match="storage_scope 'texture' is unknown"):
        sch.cache_read(sch.get_block("C"), 0, "texture")


@pytest.mark.slow
def test_tiles_past_48_kb_take_dynamic_shared_memory_that_the_launch_asks_for(kernel_cache):
    """64 KB of tiles: slices of one ``extern __shared__`` array, the bytes in the launch (the
    runtime opts the kernel in), through tc.build and the tuner's builder alike; its CUDA C
    computes NumPy's product (run on the CPU)."""
    from tilecraft.codegen.cuda import generate_cuda
    from tilecraft.measure import MeasureInput

    sch = tiled_matmul(256, 256, 256, threads=(16, 16), tile=(8, 8), k_step=64)
    source, (launch,) = generate_cuda(tc.lower(sch), tc.Target("cuda -arch=sm_90"))
    assert launch.shared_bytes == 65536 and "TC_DYNAMIC_SHARED;" in source
    assert "float* __restrict__ B_shared = (float*)(tc_shared + 32768);" in source
    inputs = sch.dag.random_inputs(np.random.default_rng(0))
    for cuda_source in [False] + [True] * bool(shutil.which("g++")):
        np.testing.assert_allclose(tc.emulate_gpu(sch, cache_dir=kernel_cache, cuda_source=cuda_source)(*inputs),
                                   sch.dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)
    small, _ = generate_cuda(tc.lower(tiled_matmul(64, 64, 64, tile=(2, 2), k_step=4)), tc.Target("cuda -arch=sm_90"))
    assert "TC_DYNAMIC_SHARED;" not in small and "__shared__ __align__(32) float A_shared[" in small
    if shutil.which("nvcc"):
        assert tc.build(sch, "cuda -arch=sm_90", cache_dir=kernel_cache).launches[0].shared_bytes == 65536
        (built,) = tc.LocalBuilder(cache_dir=kernel_cache).build(
            [MeasureInput(sch.dag, tc.Target("cuda -arch=sm_90"), sch.trace)])
        assert built.launch == {"launch": {"grid": [2, 2, 1], "block": [16, 16, 1], "shared_bytes": 65536,
                                           "zeroed": []}, "workspace": []}


def test_verifier_names_the_limit_the_value_and_the_loop():
    sch = tc.Schedule(add_relu(64, 64))
    sch.compute_inline(sch.get_block("S"))
    i, j = sch.get_loops(sch.get_block("R"))
    sch.bind(i, "threadIdx.y")
    sch.bind(j, "threadIdx.x")
    with pytest.raises(GpuLimitError, match="64 x 64 x 1 = 4096 threads exceeds the target's 1024"):
        tc.emulate_gpu(sch)

    unbound = tc.Schedule(add_relu(8, 8))
    unbound.compute_inline(unbound.get_block("S"))
    with pytest.raises(GpuLimitError, match="no loop of the nest writing R is bound to blockIdx or threadIdx"):
        tc.emulate_gpu(unbound)

    big = tiled_matmul(256, 256, 256, threads=(8, 8), tile=(16, 16), k_step=64)
    with pytest.raises(GpuLimitError, match="bytes of shared memory .*A_shared.*above the target's 49152"):
        tc.emulate_gpu(big, "cuda -arch=sm_90 -max-shared-memory-per-block-optin=49152")

    spilling = tiled_matmul(256, 256, 256, threads=(8, 8), tile=(16, 16), k_step=4)
    with pytest.raises(GpuLimitError, match=r"keeps 256 4-byte words in local buffers \(C_local\[16, 16\]\), above "
                                            r"96, 75% of the 128 registers a thread of a 64-thread block may have"):
        tc.emulate_gpu(spilling)
    check(tiled_matmul(64, 16, 192, threads=(8, 8), tile=(8, 12), k_step=4))  # 96 fit


def test_barrier_under_a_partial_thread_loop_is_refused():
    """Shared-memory stages need every thread at the barrier: a consumer whose thread loop is
    narrower than the block (here 4 of 8 threads on x) cannot hold one. The verifier refuses
    it before anything is compiled or emulated."""
    sch = tc.Schedule(matmul(16, 16, 16))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    ti, ii = sch.split(i, [8, None])
    tj, jj = sch.split(j, [4, None])
    sch.reorder(ti, tj, k, ii, jj)
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    cached = sch.cache_read(c, 0, "shared")
    sch.compute_at(cached, k)
    rows = sch.get_loops(cached)[-2]
    ty, tx = sch.split(rows, [None, 8])
    sch.bind(tx, "threadIdx.x")
    for make in (tc.emulate_gpu, tc.build):
        with pytest.raises(GpuLimitError, match="runs 4 of the block's 8 threads on that axis, and a barrier lies"):
            make(sch, tc.Target("cuda -arch=sm_90"))


def test_cpu_build_refuses_gpu_schedules_with_the_fix():
    sch = tiled_matmul(64, 32, 64)
    with pytest.raises(LoweringError, match="GPU axis: build the schedule for a CUDA target"):
        tc.build(sch)


# ----------------------------------------------------------------------------- property test


def random_gpu_schedule(rng: np.random.Generator) -> tc.Schedule:
    """A valid GPU schedule of a small matmul, row reduction or element-wise chain, of odd or
    even shapes."""
    if rng.random() < 0.2:
        n, m = (int(x) for x in rng.integers(2, 90, size=2))
        sch = tc.Schedule(row_reduce(n, m, str(rng.choice(["sum", "max"]))))
        i, k = sch.get_loops(sch.get_block("B"))
        bi, ti = sch.split(i, [None, int(rng.choice([1, 2, 4]))])
        _, kt = sch.split(k, [None, int(rng.choice([4, 24, 32, 64]))])
        sch.bind(bi, "blockIdx.x")
        sch.bind(ti, "threadIdx.y")
        sch.bind(kt, "threadIdx.x")
        return sch
    if rng.random() < 0.3:
        n, m = (int(x) for x in rng.integers(3, 70, size=2))
        sch = tc.Schedule(add_relu(n, m))
        if rng.random() < 0.5:
            sch.compute_inline(sch.get_block("S"))
        out = sch.get_block("R")
        i, j = sch.get_loops(out)
        threads = int(rng.choice([32, 64, 128]))
        bx, tx = sch.split(sch.fuse(i, j), [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if any(s.name == "S" for s in sch.state.stages):  # not inlined: computed by each thread
            sch.compute_at(sch.get_block("S"), tx)
        return sch
    n, l, m = (int(x) for x in rng.choice([8, 12, 16, 20, 24, 32, 33], size=3))
    threads = (int(rng.choice([2, 4, 8])), int(rng.choice([2, 4, 8])))
    tile = (int(rng.choice([1, 2, 3])), int(rng.choice([1, 2, 4])))
    return tiled_matmul(n, l, m, threads, tile, k_step=int(rng.choice([1, 2, 4, 5])),
                        shared=bool(rng.random() < 0.7), vthread=int(rng.choice([1, 1, 2])))


@pytest.mark.parametrize("seed", range(16))
def test_random_gpu_schedules_match_numpy(seed):
    rng = np.random.default_rng(seed)
    check(random_gpu_schedule(rng), seed)


def test_each_block_at_the_root_runs_as_a_kernel_of_its_own_passing_the_workspace_on():
    """S and R at the root: two kernels in order, S in a workspace the first writes and the
    second reads; each kernel's limits checked apart, each named in the verifier's error."""
    sch = tc.Schedule(add_relu(8, 64))
    for name, threads in (("S", 64), ("R", 32)):
        i, j = sch.get_loops(sch.get_block(name))
        jo, ji = sch.split(j, [None, threads])
        sch.bind(sch.fuse(i, jo), "blockIdx.x")
        sch.bind(ji, "threadIdx.x")
    check(sch)
    kernels, workspace = split_kernels(tc.lower(sch))
    assert [k.name for k in kernels] == ["default_function_kernel0", "default_function_kernel1"]
    assert [(b.name, b.shape) for b in workspace] == [("S", (8, 64))]
    assert [k.outputs for k in kernels] == [(False, False, False, True), (False, False, True, False)]
    if shutil.which("nvcc"):
        module = tc.build(sch, "cuda -arch=sm_90")
        assert module.source.count("__global__") == 2 and module.entries == tuple(k.name for k in kernels)
        assert [(launch.grid, launch.block) for launch in module.launches] == [((8, 1, 1), (64, 1, 1)),
                                                                               ((16, 1, 1), (32, 1, 1))]
        again = tc.CudaModule.from_artifact(module.cubin, json.loads(json.dumps(module.to_json())))
        assert (again.launches, again.workspace) == (module.launches, module.workspace)
    unbound = tc.Schedule(add_relu(8, 8))  # S's nest is not bound: it would run on one GPU thread
    i, j = unbound.get_loops(unbound.get_block("R"))
    unbound.bind(i, "blockIdx.x")
    unbound.bind(j, "threadIdx.x")
    with pytest.raises(GpuLimitError, match="kernel 0 of 2 .*no loop of the nest writing S is bound"):
        tc.emulate_gpu(unbound)


def split_k_then_relu(n: int, l: int, m: int, parts: int) -> tc.Schedule:
    """A matmul's reduction in ``parts`` parts, each part's sums a kernel's blocks along y
    (rfactor), written to a workspace; a second kernel adds the parts up and applies a ReLU,
    which adding into the output atomically could not."""
    A, B = te.placeholder((n, l), name="A"), te.placeholder((l, m), name="B")
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((n, m), lambda i, j: te.max(C[i, j], 0.0), name="D")
    sch = tc.Schedule(tc.ComputeDAG([A, B, D]))
    _, _, k = sch.get_loops(sch.get_block("C"))
    ko, _ = sch.split(k, [parts, None])
    partials = sch.rfactor(ko, 0)
    i, j, part, _ = sch.get_loops(partials)
    sch.reorder(part, i, j)
    sch.bind(part, "blockIdx.y")
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    i, j = sch.get_loops(sch.get_block("D"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.compute_at(sch.get_block("C"), j)
    return sch


def test_split_k_through_a_workspace_finishes_any_epilogue_in_a_second_kernel():
    sch = split_k_then_relu(16, 96, 24, parts=3)
    check(sch)
    a, b = sch.dag.random_inputs(np.random.default_rng(3))
    garbage = np.full((16, 24), np.nan, np.float32)
    tc.emulate_gpu(sch, "cuda -arch=sm_90")(a, b, garbage)
    np.testing.assert_allclose(garbage, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    if shutil.which("nvcc"):
        module = tc.build(sch, "cuda -arch=sm_90")
        assert [launch.grid for launch in module.launches] == [(16, 3, 1), (16, 1, 1)]
        assert [(w.name, w.shape) for w in module.workspace] == [("C_rf", (3, 16, 24))]
        assert "atomicAdd" not in module.source


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("sketch", ["gpu_tile", "gpu_tile_pipelined"])
@pytest.mark.slow
def test_16_bit_float_tiles_are_fetched_sixteen_bytes_a_copy(sketch, dtype):
    """A cooperative fetch copies four 4-byte words a thread (a float4 of float32): of
    float16 or bfloat16, eight lanes as one uint4, or one 16-byte cp.async where the tiles
    are double-buffered; the matmul still matches NumPy's to the type's precision (one
    rounding, of the sum: 2^-11 of float16, 2^-8 of bfloat16)."""
    from tilecraft.search.default import default_row
    from tilecraft.search.space import generate_sketches

    target = tc.Target("cuda -arch=sm_90")
    dag = matmul(128, 64, 128, dtype)
    drafted = {s.name: s for s in generate_sketches(dag, target=target)}[sketch]
    sch = drafted.trace_of(default_row(drafted, 1)).replay(dag)
    a, b = dag.random_inputs()
    want = a.astype(np.float32) @ b.astype(np.float32)
    rtol = 2e-3 if dtype == "float16" else 8e-3
    np.testing.assert_allclose(tc.emulate_gpu(sch, target)(a, b).astype(np.float32), want, rtol=rtol, atol=10 * rtol)
    if shutil.which("nvcc"):
        source = tc.build(sch, "cuda" if tc.cuda_available() else target).source
        copy = "*(uint4*)&" if sketch == "gpu_tile" else "TC_CP_ASYNC(cg, 16,"
        assert source.count(copy) == (2 if sketch == "gpu_tile" else 4), source  # A's tile and B's (and first steps)


@pytest.mark.parametrize("dtype, widen, rounding", [("float16", "tc_h2f", "tc_f2h"),
                                                     ("bfloat16", "tc_bf2f", "tc_f2bf")])
def test_16_bit_floats_are_held_as_their_bits_and_computed_in_float32(dtype, widen, rounding):
    """Element-wise and a sum across threads, of float16 or bfloat16: loads widened (float16
    by PTX's cvt, bfloat16 by a shift), stores rounded, the partial sums in float32; values
    as NumPy's to the type's precision."""
    X = te.placeholder((6, 150), name="X", dtype=dtype)
    k = te.reduce_axis((0, 150), name="k")
    total = te.compute((6,), lambda i: te.sum(X[i, k], axis=k), name="total")
    halved = te.compute((6, 150), lambda i, j: X[i, j] * te.const(0.5, dtype) + total[i], name="halved")
    sch = tc.Schedule(tc.ComputeDAG([X, halved]))
    i, j = sch.get_loops(sch.get_block("halved"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.compute_at(sch.get_block("total"), i)
    _, lanes = sch.split(sch.get_loops(sch.get_block("total"))[-1], [None, 64])
    sch.bind(lanes, "threadIdx.x")
    x = np.random.default_rng(0).standard_normal((6, 150)).astype(NUMPY_DTYPES[dtype])
    want = x.astype(np.float32) * 0.5 + x.astype(np.float32).sum(axis=1, keepdims=True)
    rtol = 2e-3 if dtype == "float16" else 8e-3
    got = tc.emulate_gpu(sch, "cuda -arch=sm_90")(x)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=rtol, atol=10 * rtol)
    if shutil.which("nvcc"):
        module = tc.build(sch, "cuda" if tc.cuda_available() else "cuda -arch=sm_90")
        assert f"{widen}(X[" in module.source and "halved[" in module.source and f"{rounding}(" in module.source
        assert "float total_partial[1];" in module.source
        if tc.cuda_available():
            np.testing.assert_allclose(module(x).astype(np.float32), want, rtol=rtol, atol=10 * rtol)
