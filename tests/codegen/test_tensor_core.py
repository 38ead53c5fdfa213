"""Tensor cores: nests marked ``tensor_core`` become warps' wmma operations (``ir/tensor_core.py``),
on the schedule of ``examples/tensor_core_matmul.py``.

Each schedule is emulated on the CPU against NumPy (a warp's operation runs its scalar nest
in the warp's first lane); with nvcc the CUDA source compiles for sm_90, and on a GPU
machine the kernel runs there too (``benchmarks/gpu_check.py`` runs this file on a GPU).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.build import emulate_lowered
from tilecraft.codegen.gpu_verify import _local_buffers, local_words
from tilecraft.errors import GpuLimitError, LoweringError
from tilecraft.ir.slices import from_view

TARGET = "cuda -arch=sm_90"
_spec = importlib.util.spec_from_file_location(
    "tensor_core_matmul", Path(__file__).resolve().parents[2] / "examples" / "tensor_core_matmul.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
half_matmul = example.half_matmul


def tensor_core_matmul(dag: tc.ComputeDAG, warps=(2, 2), tiles=(2, 2), k_tiles=2, shared=True, vector=1,
                       pipelined=False):
    """The example's schedule (``examples/tensor_core_matmul.py``), smaller, fetching one element
    a copy, not double-buffered."""
    return example.schedule(dag, warps, tiles, k_tiles, shared, vector, pipelined)


def check(sch: tc.Schedule, seed: int = 0) -> str:
    """The emulated kernel against float32 NumPy, to a 16-bit float's precision where C is one
    (an ulp of the sum's rounding), and so its CUDA C run on the CPU (the wmma operands' layouts
    and alignment checked); with nvcc the kernel's CUDA source, built for sm_90 (on a GPU
    machine it runs there too)."""
    a, b = sch.dag.random_inputs(np.random.default_rng(seed))
    want = sch.dag.evaluate_numpy([a, b])[0].astype(np.float32)
    tolerance = {"float16": dict(rtol=2e-3, atol=2e-2), "bfloat16": dict(rtol=8e-3, atol=8e-2)}.get(
        sch.dag.tensors[-1].dtype, dict(rtol=1e-4, atol=1e-4))
    for cuda_source in [False] + [True] * bool(shutil.which("g++")):
        got = tc.emulate_gpu(sch, TARGET, cuda_source=cuda_source)(a, b)
        np.testing.assert_allclose(got.astype(np.float32), want, **tolerance,
                                   err_msg=f"emulated (cuda_source={cuda_source}); trace:\n{sch}")
    if not shutil.which("nvcc"):
        return ""
    kernel = tc.build(sch, "cuda" if tc.cuda_available() else TARGET)
    if tc.cuda_available():
        got = kernel(a, b)
        np.testing.assert_allclose(got.astype(np.float32), want, **tolerance, err_msg=f"on the GPU; trace:\n{sch}")
    return kernel.source


@pytest.mark.parametrize("out, b_transposed", [("float32", False), ("float16", False), ("float32", True)])
def test_a_half_matmul_on_tensor_cores_matches_numpy(out, b_transposed):
    source = check(tensor_core_matmul(half_matmul(128, 96, 64, out, b_transposed), k_tiles=3))
    if source:
        layout = "col" if b_transposed else "row"
        assert f"tc_wmma_mma_row_{layout}(" in source and f"tc_wmma_store_f{out[-2:]}_row(" in source
        assert "float C_local[4][8];" in source  # 4 tiles, 8 floats a lane each


@pytest.mark.parametrize("out, b_transposed", [("float32", False), ("float32", True), ("bfloat16", False)])
def test_a_bfloat16_matmul_on_tensor_cores_matches_numpy(out, b_transposed):
    """bfloat16 A and B (4 registers a lane a tile, where float16's are 8) into float32, or
    into bfloat16, which wmma does not store: rounded in registers, stored as float16's bits."""
    source = check(tensor_core_matmul(half_matmul(128, 96, 64, out, b_transposed, dtype="bfloat16"), k_tiles=3))
    if source:
        layout = "col" if b_transposed else "row"
        assert f"tc_wmma_mma_bf16_row_{layout}(" in source and "tc_wmma_load_shared_bf16_a_row(" in source
        assert f"tc_wmma_store_{'bf16' if out == 'bfloat16' else 'f32'}_row(" in source
    mixed = half_matmul(64, 64, 64, "float32")
    A, B = mixed.tensors[:2]
    k = te.reduce_axis((0, 64), name="k")
    B16 = te.placeholder(B.shape, name="B16", dtype="bfloat16")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k].astype("float32") * B16[k, j].astype("float32"), axis=k),
                   name="C")
    with pytest.raises(LoweringError, match=r"the product of two float16 \(or two bfloat16\) tiles"):
        tc.lower(tensor_core_matmul(tc.ComputeDAG([A, B16, C])))


def test_shared_tiles_fetched_sixteen_bytes_a_copy():
    source = check(tensor_core_matmul(half_matmul(128, 128, 128, "float16"), warps=(2, 2), tiles=(2, 2), vector=8))
    if source:
        assert source.count("*(uint4*)&") == 2, source  # A's tile and B's


def test_the_example_double_buffers_its_tiles_with_asynchronous_copies():
    source = check(example.schedule(example.half_matmul(256, 128, 256)))
    if source:
        assert source.count("TC_CP_ASYNC(cg, 16,") == 4 and "tc_wmma_mma_row_row(" in source


@pytest.mark.parametrize("shared, b_transposed", [(True, False), (False, False), (True, True)])
def test_a_warps_tiles_of_a_and_b_loaded_once_a_step_into_fragments(shared, b_transposed):
    """B stored (j, k), a dense layer's weight, is held so in its fragment and loaded column major."""
    sch = example.schedule(example.half_matmul(128, 64, 128, b_transposed=b_transposed), warps=(2, 2), tiles=(2, 2),
                           shared=shared, fragments=True, b_transposed=b_transposed)
    text = str(tc.lower(sch))
    assert "allocate A_shared_local: float16[32, 16] (fragment)" in text if shared else "A_local" in text
    assert "allocate B_shared_local: float16[32, 16] (fragment)" in text if b_transposed else True
    assert text.count("# wmma.load") == 2
    source = check(sch)
    if source:
        assert "unsigned A_shared_local[2][8];" in source if shared else "unsigned A_local[2][8];" in source
        assert "unsigned tc_a[8]" not in source  # the mma take their operands from the fragments
        layout = "col" if b_transposed else "row"
        assert f"_b_{layout}(B" in source and f"tc_wmma_mma_row_{layout}(" in source


def test_a_shared_tile_laid_out_column_major_is_loaded_column_major():
    """A's tile stored (k, i) by transform_layout: its wmma loads read it column major, the
    elements between its columns (k) the leading dimension."""
    sch = tensor_core_matmul(half_matmul(64, 64, 64), warps=(2, 2), tiles=(1, 1), k_tiles=2)
    sch.transform_layout(sch.get_block("A_shared"), ("write", 0), lambda i, k: (k, i))
    source = check(sch)
    if source:
        assert "tc_wmma_load_shared_a_col(" in source and "tc_wmma_mma_col_row(" in source
        assert ", 40);" in source  # A_shared (k, i): 32 rows of the block's 32 i, padded to 40


def test_tiles_read_straight_from_global_memory():
    check(tensor_core_matmul(half_matmul(64, 64, 64), warps=(1, 2), tiles=(1, 1), k_tiles=1, shared=False))


def test_tensor_core_tiles_read_from_a_view_only_where_it_keeps_them_aligned():
    """Tiles of A loaded by wmma straight from global memory: rows 64 on of a 128-row array are
    read there (and compute A's product); a view starting 8 halves (16 bytes) in is refused."""
    sch = tensor_core_matmul(half_matmul(64, 64, 64), warps=(1, 2), tiles=(1, 1), k_tiles=1, shared=False)
    func = tc.lower(sch)
    with pytest.raises(LoweringError, match=r"tensor-core tiles of A need .* a 32-byte start; the view at element 8"):
        from_view(func, "A", (128, 64), 8, (64, 1))
    kernel = emulate_lowered(from_view(func, "A", (128, 64), 64 * 64, (64, 1)), tc.CudaTarget(TARGET))
    a, b = sch.dag.random_inputs(np.random.default_rng(0))
    whole = np.concatenate([np.zeros_like(a), a])
    want = sch.dag.evaluate_numpy([a, b])[0].astype(np.float32)
    np.testing.assert_allclose(kernel(whole, b).astype(np.float32), want, rtol=2e-3, atol=2e-2)


def test_the_lowered_nest_shows_each_warp_operation():
    text = str(tc.lower(tensor_core_matmul(half_matmul(64, 64, 64), warps=(1, 1), tiles=(1, 1), k_tiles=1)))
    assert "allocate C_local: float32[16, 16] (fragment)" in text
    assert "# wmma.fill" in text and "# wmma.mma" in text and "# wmma.store" in text
    assert "for tc_lane in range(32) threadIdx.x:" in text


def test_a_nest_of_the_wrong_shape_or_computation_is_refused_with_the_fix():
    sch = tensor_core_matmul(half_matmul(64, 64, 64))
    copy_out = sch.get_loops(sch.get_block("C_local"))[-2]
    sch.annotate(copy_out, "tensor_core", 0)  # the copy-out element by element
    with pytest.raises(LoweringError, match="mark the 16x16 nests of its init, update and copy-out"):
        tc.lower(sch)
    odd = tc.Schedule(half_matmul(64, 64, 64))
    block = odd.get_block("C")
    _, j, _ = odd.get_loops(block)
    odd.annotate(odd.split(j, [None, 8])[1], "tensor_core", 1)
    with pytest.raises(LoweringError, match="must be 2 or 3 loops of 16 around one store"):
        tc.lower(odd)
    relu = half_matmul(64, 64, 64)
    C = relu.tensors[-1]
    D = te.compute(C.shape, lambda i, j: te.max(C[i, j], te.const(0.0)), name="D")
    fused = tc.Schedule(tc.ComputeDAG([*relu.tensors[:2], D]))
    with pytest.raises(LoweringError, match="the accumulator as it is into float32, float16 or bfloat16; apply"):
        tc.lower(tensor_core_matmul_with_epilogue(fused))


def tensor_core_matmul_with_epilogue(sch: tc.Schedule) -> tc.Schedule:
    """The accumulator's copy-out applies a ReLU (reverse_compute_inline): not a copy."""
    c = sch.get_block("C")
    out = sch.cache_write(c, 0, "local")
    sch.reverse_compute_inline(sch.get_block("D"))
    i, j = sch.get_loops(out)
    io, ii = sch.split(i, [None, 16])
    jo, jj = sch.split(j, [None, 16])
    sch.reorder(io, jo, ii, jj)
    sch.annotate(ii, "tensor_core", 1)
    return sch


def test_a_block_on_tensor_cores_is_one_warp_wide():
    """A fetch spread over 64 threads along threadIdx.x would make two warps of each row."""
    wide = tc.Schedule(example.half_matmul(64, 64, 64))
    c = wide.get_block("C")
    out = wide.cache_write(c, 0, "local")
    i, j = wide.get_loops(out)
    io, ii = wide.split(i, [None, 16])
    jo, jj = wide.split(j, [None, 16])
    wide.reorder(io, jo, ii, jj)
    wide.bind(io, "blockIdx.x")
    wide.bind(jo, "threadIdx.y")
    wide.annotate(ii, "tensor_core", 1)
    wide.compute_at(c, jo)
    ci, cj, k = wide.get_loops(c)[-3:]
    ko, ki = wide.split(k, [None, 16])
    wide.reorder(ko, ci, cj, ki)
    wide.annotate(ci, "tensor_core", 1)
    cached = wide.cache_read(c, 0, "shared")
    wide.compute_at(cached, ko)
    _, tx = wide.split(wide.fuse(*wide.get_loops(cached)[-2:]), [None, 64])
    wide.bind(tx, "threadIdx.x")
    with pytest.raises(GpuLimitError, match="one warp \\(32 threads\\) wide along threadIdx.x"):
        tc.emulate_gpu(wide, TARGET)


def test_the_verifier_counts_a_fragment_as_spread_over_the_warp():
    """4x4 tiles a warp: 4,096 floats, 128 a lane, past the register budget of a 128-thread block.
    A lane holds 8 registers of a tile of a float16 operand (wmma holds it twice over), 4 of a
    bfloat16 one's."""
    with pytest.raises(GpuLimitError, match="C_local"):
        tc.emulate_gpu(tensor_core_matmul(half_matmul(256, 64, 256), warps=(2, 2), tiles=(4, 4)), TARGET)
    for dtype, words in (("float16", 8), ("bfloat16", 4)):
        sch = example.schedule(half_matmul(128, 64, 128, "float32", dtype=dtype), warps=(2, 2), tiles=(2, 2),
                               fragments=True)
        fragments = [b for b in _local_buffers(tc.lower(sch).body) if b.scope == "fragment"]
        assert {b.name: local_words([b]) for b in fragments} == {"A_shared_local": 2 * words,
                                                                 "B_shared_local": 2 * words, "C_local": 4 * 8}


def on_2x2_warps(sch: tc.Schedule, c, rows, columns) -> None:
    """``rows`` and ``columns`` (the copy-out's loops of a 64x64 tile) over 2x2 warps along
    threadIdx.y, 2x2 tiles each, a store a tile; ``c`` (the accumulator's block) summing each
    warp's tiles in its fragment, an mma a tile and 16-step."""
    wi, ti, ii = sch.split(rows, [2, 2, 16])
    wj, tj, jj = sch.split(columns, [2, 2, 16])
    sch.reorder(wi, wj, ti, tj, ii, jj)
    warp = sch.fuse(wi, wj)
    sch.bind(warp, "threadIdx.y")
    sch.annotate(ii, "tensor_core", 1)
    sch.compute_at(c, warp)
    ci, cj, ck = sch.get_loops(c)[-3:]
    cti, cii = sch.split(ci, [None, 16])
    ctj, cjj = sch.split(cj, [None, 16])
    ko, ki = sch.split(ck, [None, 16])
    sch.reorder(ko, cti, ctj, cii, cjj, ki)
    sch.annotate(cii, "tensor_core", 1)


def test_a_batched_matmul_keeps_a_fragment_of_three_dimensions():
    """One block a batch, its tiles read from global memory: the accumulator (1, 32, 32) per warp."""
    A = te.placeholder((3, 64, 64), name="A", dtype="float16")
    B = te.placeholder((3, 64, 64), name="B", dtype="float16")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((3, 64, 64), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name="C")
    sch = tc.Schedule(tc.ComputeDAG([A, B, C]))
    c = sch.get_block("C")
    out = sch.cache_write(c, 0, "local")
    b, i, j = sch.get_loops(out)
    sch.bind(b, "blockIdx.x")
    on_2x2_warps(sch, c, i, j)
    assert "allocate C_local: float32[1, 32, 32] (fragment)" in str(tc.lower(sch))
    check(sch)


def test_an_epilogue_reads_the_tiles_stored_into_shared_memory():
    """relu(A @ B + bias): the warps store their fragments into the block's shared tile (two
    cache_writes: local, then shared; the buffer keeps its scope), which the epilogue reads
    after a barrier, every thread of the block an element."""
    A = te.placeholder((128, 128), name="A", dtype="float16")
    B = te.placeholder((128, 128), name="B", dtype="float16")
    bias = te.placeholder((128,), name="bias")
    k = te.reduce_axis((0, 128), name="k")
    C = te.compute((128, 128), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
                   name="C")
    D = te.compute((128, 128), lambda i, j: te.max(C[i, j] + bias[j], te.const(0.0)), name="D")
    sch = tc.Schedule(tc.ComputeDAG([A, B, bias, D]))
    c = sch.get_block("C")
    sch.compute_inline(sch.cache_write(c, 0, "shared"))  # D reads C_shared
    stored = sch.cache_write(c, 0, "local")  # the fragments' copy into C_shared
    bi, di = sch.split(sch.get_loops(sch.get_block("D"))[0], [None, 64])
    bj, dj = sch.split(sch.get_loops(sch.get_block("D"))[-1], [None, 64])
    sch.reorder(bi, bj, di, dj)
    block = sch.fuse(bi, bj)
    sch.bind(block, "blockIdx.x")
    _, ty, tx = sch.split(sch.fuse(di, dj), [None, 4, 32])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(stored, block)
    on_2x2_warps(sch, c, *sch.get_loops(stored)[-2:])
    assert "allocate C_shared: float32[64, 64] (shared)" in str(tc.lower(sch))
    a, b, bias_value = sch.dag.random_inputs(np.random.default_rng(0))
    want = np.maximum(a.astype(np.float32) @ b.astype(np.float32) + bias_value, 0)
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(a, b, bias_value), want, rtol=1e-4, atol=1e-4)
    if shutil.which("nvcc"):
        kernel = tc.build(sch, "cuda" if tc.cuda_available() else TARGET)
        assert "tc_wmma_store_f32_row(&C_shared[" in kernel.source
        if tc.cuda_available():
            np.testing.assert_allclose(kernel(a, b, bias_value), want, rtol=1e-4, atol=1e-4)
