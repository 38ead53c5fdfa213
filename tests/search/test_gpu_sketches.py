"""GPU sketches: the structures the GPU rules give each kind of operator, and random candidates
of every sketch either refused by the GPU verifier or equal to NumPy in the CPU emulation
(and compiled by nvcc for sm_90 where it is installed)."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen.gpu_verify import _local_buffers, _shared_buffers, local_words, verify_gpu
from tilecraft.errors import GpuLimitError
from tilecraft.ir.kernels import split_kernels
from tilecraft.ir.lower import lower
from tilecraft.ir.nodes import For, walk_stmts
from tilecraft.ops import relu
from tilecraft.ops.conv import conv2d_nchw
from tilecraft.ops.linalg import batch_matmul, dense
from tilecraft.ops.nn import global_avg_pool2d, layer_norm, softmax
from tilecraft.search.default import default_row, default_schedule
from tilecraft.search.features import FeatureSpace
from tilecraft.search.gpu_rules import GPU_SKETCH_RULES, GpuMultiLevelTiling
from tilecraft.search.space import generate_sketches
from tilecraft.te.dtype import bytes_of

TARGET = tc.Target("cuda -arch=sm_90")


def matmul(n, l, m):
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    k = te.reduce_axis((0, l), name="k")
    return tc.ComputeDAG([A, B, te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])


def row_sum(n, m):
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), name="k")
    return tc.ComputeDAG([A, te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")])


def add_relu(n, m):
    A = te.placeholder((n, m), name="A")
    B = te.placeholder((m,), name="B")
    S = te.compute((n, m), lambda i, j: A[i, j] + B[j], name="S")
    return tc.ComputeDAG([A, B, te.compute((n, m), lambda i, j: te.max(S[i, j], te.const(0.0)), name="R")])


def conv():
    X = te.placeholder((1, 8, 10, 10), name="X")
    W = te.placeholder((16, 8, 3, 3), name="W")
    return tc.ComputeDAG([X, W, conv2d_nchw(X, W, padding=1)])


def softmax_rows():
    X = te.placeholder((5, 40), name="X")
    return tc.ComputeDAG([X, softmax(X)])


def layer_norm_rows():
    X = te.placeholder((5, 40), name="X")
    G = te.placeholder((40,), name="G")
    B = te.placeholder((40,), name="Bias")
    return tc.ComputeDAG([X, G, B, layer_norm(X, G, B)])


def dense_gelu():
    """A transformer's FFN: its epilogue reads the product twice."""
    X, W = te.placeholder((16, 64), name="X"), te.placeholder((96, 64), name="W")
    projected = dense(X, W)
    return tc.ComputeDAG([X, W, te.compute(projected.shape, lambda i, j: projected[i, j] * 0.5 * (
        1.0 + te.erf(projected[i, j] * 0.7071)), name="gelu")])


def global_pool():
    X = te.placeholder((1, 5, 5, 300), name="X")
    return tc.ComputeDAG([X, global_avg_pool2d(X, layout="NHWC")])


def dense_layer():
    X = te.placeholder((4, 64), name="X")
    W = te.placeholder((24, 64), name="W")
    return tc.ComputeDAG([X, W, dense(X, W)])


def conv_bias_relu():
    X = te.placeholder((1, 8, 10, 10), name="X")
    W = te.placeholder((16, 8, 3, 3), name="W")
    Bias = te.placeholder((16,), name="Bias")
    conv = conv2d_nchw(X, W, padding=1)
    biased = te.compute(conv.shape, lambda n, f, y, x: conv[n, f, y, x] + Bias[f], name="bias_add")
    relu = te.compute(conv.shape, lambda *i: te.max(biased[i], te.const(0.0)), name="relu")
    return tc.ComputeDAG([X, W, Bias, relu])


def dense_bias_residual(n=8, k=256, m=24):
    """A transformer's projection: a long reduction, few outputs, an epilogue that only adds."""
    X, W = te.placeholder((n, k), name="X"), te.placeholder((m, k), name="W")
    bias, residual = te.placeholder((m,), name="bias"), te.placeholder((n, m), name="residual")
    projected = dense(X, W)
    biased = te.compute((n, m), lambda i, j: projected[i, j] + bias[j], name="biased")
    return tc.ComputeDAG([X, W, bias, residual,
                          te.compute((n, m), lambda i, j: residual[i, j] + biased[i, j], name="out")])


def dense_bias_relu():
    """A classifier at batch 1: a matrix-vector product, a bias and a ReLU."""
    X, W, bias = te.placeholder((1, 96), name="X"), te.placeholder((40, 96), name="W"), te.placeholder((40,), name="b")
    projected = dense(X, W)
    return tc.ComputeDAG([X, W, bias, te.compute(projected.shape,
                                                 lambda i, j: te.max(projected[i, j] + bias[j], 0.0), name="out")])


def conv_relu_long_k():
    """ResNet-50's last stage at batch 1 in small: few outputs, a long sum, a ReLU after."""
    X = te.placeholder((1, 64, 4, 4), name="X")
    W = te.placeholder((8, 64, 3, 3), name="W")
    conv = conv2d_nchw(X, W, padding=1)
    return tc.ComputeDAG([X, W, te.compute(conv.shape, lambda *i: te.max(conv[i], te.const(0.0)), name="relu")])


def half_matmul(n, l, m, cast=False, bias_relu=False, dtype="float16"):
    """float16 (or bfloat16) A @ B summed in float32 (each product cast), into float32, or
    rounded to their type by a block after it (as ONNX's float16 MatMul imports), or plus a
    bias, through a ReLU."""
    A = te.placeholder((n, l), name="A", dtype=dtype)
    B = te.placeholder((l, m), name="B", dtype=dtype)
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
                   name="C")
    if bias_relu:
        bias = te.placeholder((m,), name="bias")
        return tc.ComputeDAG([A, B, bias, te.compute((n, m), lambda i, j: te.max(C[i, j] + bias[j], te.const(0.0)),
                                                     name="D")])
    out = te.compute((n, m), lambda i, j: C[i, j].astype(dtype), name="D") if cast else C
    return tc.ComputeDAG([A, B, out])


def half_attention_scores(transpose_a=False, dtype="float16"):
    """An attention's scores in float16: a batch of 3 matrices times one broadcast (``batch_matmul``,
    B transposed: the keys as they lie), scaled by 1/8; A transposed too where asked."""
    A = te.placeholder((3, 32, 64) if transpose_a else (3, 64, 32), name="A", dtype=dtype)
    B = te.placeholder((1, 48, 32), name="B", dtype=dtype)
    C = batch_matmul(A, B, transpose_a=transpose_a, transpose_b=True)
    return tc.ComputeDAG([A, B, te.compute(C.shape, lambda b, i, j: C[b, i, j] * te.const(0.125, dtype),
                                           name="S")])


def half_conv_as_matmul():
    """A float16 3x3 convolution with a bias and a ReLU as one matrix product (implicit GEMM):
    64 pixels by 32 channels, a reduction of 144."""
    return tc.SearchTask(func="conv2d_nhwc_gemm", args=(1, 8, 8, 16, 32, 3, 3, 1, 1, "float16")).compute_dag


def half_dense_padded(rows=40, dtype="float16"):
    """A float16 dense layer of 40 rows, 56 inputs and 24 outputs, with a bias and a ReLU, padded
    to a product of 48 x 64 x 32 (its operands grown with zeros); of 61 rows, a prime, to 64."""
    X = te.placeholder((rows, 56), name="X", dtype=dtype)
    W = te.placeholder((24, 56), name="W", dtype=dtype)
    bias = te.placeholder((24,), name="bias", dtype=dtype)
    return tc.ComputeDAG([X, W, bias, relu(dense(X, W, bias, multiple=16))])


def half_conv_padded():
    """``half_conv_as_matmul`` at 7x7 pixels, 40 channels into 24: each size of the product
    padded to a multiple of 16 (49 pixels to 64 rows, a reduction of 360 to 368, 24 columns to
    32), its bias and ReLU over the pixels and channels alone."""
    return tc.SearchTask(func="conv2d_nhwc_gemm", args=(1, 7, 7, 40, 24, 3, 3, 1, 1, "float16", 16)).compute_dag


WORKLOADS = {"matmul": lambda: matmul(64, 48, 64), "matmul_odd": lambda: matmul(33, 20, 45),
             "half_matmul": lambda: half_matmul(64, 48, 64),
             "bfloat16_matmul": lambda: half_matmul(64, 48, 64, cast=True, dtype="bfloat16"),
             "half_matmul_bias_relu": lambda: half_matmul(64, 32, 48, bias_relu=True),
             "half_attention_scores": half_attention_scores,
             "attention_scores": lambda: half_attention_scores(dtype="float32"),
             "half_conv_as_matmul": half_conv_as_matmul,
             "half_conv_padded": half_conv_padded, "half_dense_padded": half_dense_padded,
             "dense_padded": lambda: half_dense_padded(61, "float32"),
             "matmul_long_k": lambda: matmul(24, 192, 40), "row_sum": lambda: row_sum(6, 150),
             "add_relu": lambda: add_relu(33, 70), "conv2d": conv, "softmax": softmax_rows,
             "layer_norm": layer_norm_rows, "dense": dense_layer, "conv_bias_relu": conv_bias_relu,
             "dense_bias_residual": dense_bias_residual, "dense_gelu": dense_gelu, "global_pool": global_pool,
             "conv_relu_long_k": conv_relu_long_k, "dense_bias_relu": dense_bias_relu}
# Each of these takes a second or more a test; the quick subset keeps one of a kind (a float16
# matmul, a matmul, a dense layer, the reductions), the full suite runs them all (a bfloat16 one too).
HEAVY = {"bfloat16_matmul", "half_matmul_bias_relu", "half_attention_scores", "attention_scores",
         "half_conv_as_matmul", "half_conv_padded", "half_dense_padded", "dense_padded", "matmul_long_k",
         "matmul_odd", "dense", "conv2d", "conv_bias_relu", "dense_bias_residual", "dense_gelu", "conv_relu_long_k",
         "dense_bias_relu"}
EVERY_WORKLOAD = [pytest.param(name, marks=pytest.mark.slow) if name in HEAVY else name for name in sorted(WORKLOADS)]


def test_a_matmul_is_tiled_for_blocks_vthreads_and_threads_with_shared_tiles():
    sketches = {sketch.name: sketch for sketch in generate_sketches(matmul(64, 48, 64), target=TARGET)}
    # 64 x 64 outputs fill no H100: also across threads; the tiles double-buffered, or A's laid out along i
    assert set(sketches) == {"gpu_tile", "gpu_tile_pipelined", "gpu_tile_transposed", "gpu_tile_transposed_pipelined",
                             "cross_thread(C)"}
    assert [s.name for s in generate_sketches(matmul(256, 64, 256), target=TARGET)] == [
        "gpu_tile", "gpu_tile_pipelined", "gpu_tile_transposed", "gpu_tile_transposed_pipelined"]
    laid = [(dict(step.args)["block"].symbol, dict(step.args)["index_map"].to_python())
            for step in sketches["gpu_tile_transposed"].trace.steps if step.kind == "transform_layout"]
    assert [m for _, m in laid] == ["lambda d0, d1: (d1, d0)"]  # A's tile only: B's j is last already
    sketch = sketches["gpu_tile"]
    steps = [(step.kind, dict(step.args)) for step in sketch.trace.steps]
    axes = [args["thread_axis"] for kind, args in steps if kind == "bind"]
    assert axes == ["blockIdx.x", "vthread.x", "threadIdx.x"]
    scopes = [args["storage_scope"] for kind, args in steps if kind in ("cache_read", "cache_write")]
    assert scopes == ["local", "shared", "shared"]
    assert sum(kind == "annotate" and args["ann_key"] == "meta_schedule.cooperative_fetch" for kind, args in steps) == 2


def _warp_fill(func, buffer: str) -> list[tuple[list[int], list[int]]]:
    """The first warp's copy into shared ``buffer``: for each store a thread makes (each lane
    of a vector stored a lane at a time), the 32 threads' shared-memory word addresses and the
    global words they read, every other loop at 0."""
    from tilecraft.codegen.prefetch import flat_index
    from tilecraft.ir.nodes import Allocate, AsyncCopies, Seq, Store
    from tilecraft.te.arith import simplify
    from tilecraft.te.expr import const, substitute

    def fills(s, loops):
        if isinstance(s, Store) and s.buffer.name == buffer:
            yield s, loops
        children = s.stmts if isinstance(s, Seq) else (s.body,) if isinstance(s, (For, Allocate, AsyncCopies)) else ()
        for child in children:
            yield from fills(child, loops + [s] * isinstance(s, For))

    store, loops = next(fills(func.body, []))
    lanes = [loop for loop in loops if loop.kind == "vectorize"] or [None]
    stores = []
    for lane in range(lanes[0].extent if lanes[0] else 1):
        words = ([], [])
        for thread in range(32):
            values = {loop.var: const(thread if loop.kind == "threadIdx.x" else lane if loop is lanes[0] else 0)
                      for loop in loops}
            for found, (tensor, indices) in zip(words, ((store.buffer, store.indices),
                                                        (store.value.tensor, store.value.indices))):
                found.append(simplify(substitute(flat_index(tensor, indices, {}), values), {}).value)
        stores.append(words)
    return stores


def test_a_tile_laid_out_across_its_rows_is_filled_a_sector_of_each_of_many_rows_a_warp():
    """A's tile laid out along i (rows of k 132 floats apart): a warp copies 32 bytes of each
    of 16 rows of A, so that each lane of its float4s, stored a float at a time, falls in 32
    banks (copying 128 bytes of each of 4 rows, 8 banks took 4 stores each); A is still read
    a whole 32-byte sector at a time, 16 of them."""
    dag = matmul(2048, 2048, 2048)
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_tile_transposed")
    stores = _warp_fill(lower(sketch.trace_of(default_row(sketch, 1)).replay(dag)), "A_shared")
    assert len(stores) == 4 and all(len({word % 32 for word in shared}) == 32 for shared, _ in stores)
    read = {word for _, source in stores for word in source}
    assert len(read) == 128 and len({word // 8 for word in read}) == 16


def test_a_matrix_vector_product_with_an_epilogue_reduces_each_output_across_a_blocks_threads():
    """A classifier's dense layer at batch 1 (a bias, a ReLU): each output a block, its sum
    across the block's threads, the epilogue applied to it there; the untuned default."""
    dag = dense_bias_relu()
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "cross_thread(dense)")
    assert sketch.limits_in_decisions
    sch = default_schedule(dag, TARGET)
    (launch,) = verify_gpu(lower(sch), TARGET)
    assert (launch.grid, launch.block) == ((40, 1, 1), (96, 1, 1))  # an output a block, the whole row its threads
    inputs = dag.random_inputs(np.random.default_rng(0))
    for sch in [sch] + [sketch.trace_of(row).replay(dag) for row in sketch.sample(np.random.default_rng(1), 3, 1)]:
        np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                                   rtol=1e-4, atol=1e-4)


def test_a_reduction_that_two_outputs_read_is_a_kernel_of_its_own_before_theirs():
    """Its rows cannot be computed inside one reader's blocks for the other's: it runs first,
    its sums in the workspace; both outputs are right whichever the DAG names first."""
    A = te.placeholder((8, 64), name="A")
    k = te.reduce_axis((0, 64), name="k")
    total = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="total")
    centered = te.compute((8, 64), lambda i, j: A[i, j] - total[i], name="centered")
    scaled = te.compute((8, 64), lambda i, j: A[i, j] * total[i], name="scaled")
    for outputs in ([centered, scaled], [scaled, centered]):
        dag = tc.ComputeDAG([A, *outputs])
        inputs = dag.random_inputs(np.random.default_rng(0))
        sketches = generate_sketches(dag, target=TARGET)
        assert {s.name.split()[-1] for s in sketches} == {"auto_bind(total)", "cross_thread(total)"}
        for sketch in sketches:
            func = lower(sketch.trace_of(default_row(sketch, 1)).replay(dag))
            kernels, workspace = split_kernels(func)
            assert len(kernels) == 3 and [b.name for b in workspace] == ["total"]
            for got, want in zip(tc.emulate_gpu(sketch.trace_of(default_row(sketch, 1)).replay(dag), TARGET)(*inputs),
                                 dag.evaluate_numpy(inputs)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_scalars_and_float64_tiles_get_kernels_the_verifier_accepts():
    """A quantization's scale (a sum over everything, then scalar arithmetic) and a float64
    matmul, whose shared tiles are fetched two lanes a copy (16 bytes), not four."""
    X = te.placeholder((300,), name="X")
    k = te.reduce_axis((0, 300), name="k")
    total = te.compute((), lambda: te.sum(X[k], axis=k), name="total")
    scale = te.compute((), lambda: total[()] / 255.0, name="scale")
    A, B = te.placeholder((64, 64), name="A", dtype="float64"), te.placeholder((64, 64), name="B", dtype="float64")
    k2 = te.reduce_axis((0, 64), name="k2")
    product = te.compute((64, 64), lambda i, j: te.sum(A[i, k2] * B[k2, j], axis=k2), name="product")
    for dag in (tc.ComputeDAG([X, scale]), tc.ComputeDAG([A, B, product])):
        inputs = dag.random_inputs(np.random.default_rng(0))
        for sketch in generate_sketches(dag, target=TARGET):
            sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
            np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                                       rtol=1e-4, atol=1e-4)
    tiled = generate_sketches(dag, target=TARGET)[0]
    func = lower(tiled.trace_of(default_row(tiled, 1)).replay(dag))
    copies = [loop for loop in walk_stmts(func.body) if isinstance(loop, For) and loop.kind == "vectorize"]
    assert copies and all(loop.extent == 2 for loop in copies)


def test_reductions_get_a_sketch_across_threads_and_rows_reduce_in_their_block():
    names = {sketch.name for sketch in generate_sketches(row_sum(6, 150), target=TARGET)}
    assert names == {"auto_bind(B)", "cross_thread(B)"}
    names = {sketch.name for sketch in generate_sketches(softmax_rows(), target=TARGET)}
    assert "auto_bind(softmax) cross_thread_at_block(softmax_sum) inline(softmax_exp) " \
           "cross_thread_at_block(softmax_max)" in names


def test_a_global_pool_sums_each_channel_in_the_thread_that_divides_it():
    """Its sums have all the division's axes: computed at the block loop, each thread would
    sum every channel of its block (and keep them all in registers, which the verifier
    refuses); at the thread loop, its own channel."""
    dag = global_pool()
    (sketch,) = generate_sketches(dag, target=TARGET)
    assert sketch.name == "auto_bind(global_avg_pool2d) compute_at_thread(global_avg_pool2d_sum)"
    sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
    body = lower(sch).body
    assert [b.shape for b in _local_buffers(body)] == [(1, 1, 1, 1)]
    verify_gpu(lower(sch), TARGET)
    inputs = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                               rtol=1e-4, atol=1e-4)


def test_an_element_wise_epilogue_is_folded_into_the_tiled_block_copy_out():
    """A convolution's bias and ReLU: one kernel whose register tile is written out finished,
    not a second block at the root (which the verifier refuses)."""
    dag = conv_bias_relu()
    sketch, pipelined, _, _, across = generate_sketches(dag, target=TARGET)  # 1,600 outputs: also across threads
    assert across.name == "inline(bias_add) cross_thread(conv2d) inline(conv2d_pad)"
    assert default_schedule(dag, TARGET).trace.steps == sketch.trace_of(default_row(sketch, 1)).steps  # a product
    assert sketch.name == "inline(bias_add) gpu_tile inline(conv2d_pad)"
    assert pipelined.name == "inline(bias_add) gpu_tile_pipelined inline(conv2d_pad)"
    assert any(step.kind == "reverse_compute_inline" for step in sketch.trace.steps)
    inputs = dag.random_inputs(np.random.default_rng(0))
    sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                               rtol=1e-4, atol=1e-4)


def test_a_softmax_binds_its_rows_to_blocks_so_each_block_reduces_one_row():
    for sketch in generate_sketches(softmax_rows(), target=TARGET):
        row = sketch.sample_uniform(np.random.default_rng(0), 1)[0]
        (launch,) = verify_gpu(lower(sketch.trace_of(row).replay(softmax_rows())), TARGET)
        assert launch.grid == (5, 1, 1), sketch.name  # one block a row of the 5


def test_a_half_matmul_gets_sketches_on_tensor_cores_that_a_float32_does_not():
    """Besides the other tilings, single- and double-buffered: float16 A and B summed in
    float32, sizes multiples of 16; the copy-out rounding to float16 where a cast follows,
    storing the block's tile into shared memory (rows padded) where a bias and a ReLU follow,
    which read it after a barrier; batched products too, A and B stored either way. Not for
    float32 or odd sizes."""
    def names(dag):
        return [s.name for s in generate_sketches(dag, target=TARGET)]

    assert {"gpu_tensor_core", "gpu_tensor_core_pipelined", "gpu_tile"} <= set(names(half_matmul(64, 48, 64)))
    dag = half_matmul(64, 48, 64, cast=True)
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_tensor_core")
    text = str(lower(sketch.trace_of(sketch.sample(np.random.default_rng(0), 1, 1)[0]).replay(dag)))
    assert "# wmma.mma" in text and "D[" in text and "# wmma.store" in text  # rounded in the copy-out
    assert "A_shared_local: float16" in text and "B_shared_local: float16" in text  # fragments loaded once a step
    assert "gpu_tensor_core" not in names(matmul(64, 48, 64))
    assert "gpu_tensor_core" not in names(half_matmul(40, 48, 64))
    dag = half_matmul(64, 32, 48, bias_relu=True)
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_tensor_core")
    text = str(lower(sketch.trace_of(sketch.sample(np.random.default_rng(0), 1, 1)[0]).replay(dag)))
    stored, read = text.index("C_shared[("), text.index("D[(")
    assert "(shared, strides [" in text and "# wmma.store" in text[stored:read] and "barrier()" in text[stored:read]
    assert "gpu_tensor_core" in names(half_attention_scores())  # batched, one operand broadcast


@pytest.mark.slow  # the quick subset lowers and builds bfloat16 tensor cores in codegen/test_tensor_core.py
def test_a_bfloat16_matmul_gets_tensor_cores_from_sm_80_on():
    """Summed in float32, its cast to bfloat16 folded into the copy-out, which rounds in
    registers, or summed into bfloat16 alike; a float16 sum cast to bfloat16 (two roundings)
    goes through shared memory. Before sm_80, wmma has no bfloat16, and a bfloat16 sum has
    no tensor cores."""
    dag = half_matmul(64, 48, 64, cast=True, dtype="bfloat16")
    sketches = {s.name: s for s in generate_sketches(dag, target=TARGET)}
    assert {"gpu_tensor_core", "gpu_tensor_core_pipelined", "gpu_tile"} <= set(sketches)
    text = str(lower(sketches["gpu_tensor_core"].trace_of(default_row(sketches["gpu_tensor_core"], 1)).replay(dag)))
    assert "A_shared_local: bfloat16" in text and "C_shared" not in text and "# wmma.store" in text
    older = [s.name for s in generate_sketches(dag, target=tc.Target("cuda -arch=sm_75"))]
    assert "gpu_tile" in older and not any("tensor_core" in name for name in older)
    workload = tc.SearchTask(func="matmul", args=(64, 48, 64, "bfloat16", "float32"), target=TARGET)  # out_dtype
    assert "gpu_tensor_core" in {s.name for s in generate_sketches(workload.compute_dag, target=TARGET)}
    X, W = te.placeholder((64, 48), name="X", dtype="bfloat16"), te.placeholder((64, 48), name="W", dtype="bfloat16")
    bias = te.placeholder((64,), name="bias", dtype="bfloat16")
    summed_into_bfloat16 = tc.ComputeDAG([X, W, bias, relu(dense(X, W, bias))])
    for sketch in (s for s in generate_sketches(summed_into_bfloat16, target=TARGET) if "tensor_core" in s.name):
        for row in sketch.sample(np.random.default_rng(0), 2, 1):
            sch = sketch.trace_of(row).replay(summed_into_bfloat16)
            inputs = summed_into_bfloat16.random_inputs(np.random.default_rng(0))
            np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs).astype(np.float32),
                                       summed_into_bfloat16.evaluate_numpy(inputs)[0].astype(np.float32),
                                       rtol=8e-3, atol=8e-2)
            assert "dense_shared: bfloat16" in str(lower(sch))  # the warps' tiles rounded as they are stored
    A, B = (te.placeholder((64, 64), name=name, dtype="float16") for name in "AB")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    rounded_twice = tc.ComputeDAG([A, B, te.compute(C.shape, lambda i, j: C[i, j].astype("bfloat16"), name="D")])
    sketch = next(s for s in generate_sketches(rounded_twice, target=TARGET) if s.name == "gpu_tensor_core")
    assert "C_shared: float16" in str(lower(sketch.trace_of(default_row(sketch, 1)).replay(rounded_twice)))
    dag = half_conv_as_matmul()  # its windows inlined into A's tile, fetched 8 channels a copy, zeros in the padding
    for sketch in (s for s in generate_sketches(dag, target=TARGET) if "gpu_tensor_core" in s.name):
        sch = sketch.trace_of(sketch.sample(np.random.default_rng(0), 1, 1)[0]).replay(dag)
        source = tc.build(sch, TARGET).source if shutil.which("nvcc") else ""
        assert not source or ("TC_CP_ASYNC_ZFILL(cg, 16," in source if "pipelined" in sketch.name
                              else "uint4 tc_zero = {};" in source)
    dag = half_attention_scores(transpose_a=True)  # A's tiles column major
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_tensor_core")
    sch = sketch.trace_of(sketch.sample(np.random.default_rng(0), 1, 1)[0]).replay(dag)
    inputs = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs).astype(np.float32),
                               dag.evaluate_numpy(inputs)[0].astype(np.float32), rtol=2e-3, atol=2e-2)
    if shutil.which("nvcc"):  # A held (k, i) and B (j, k) in their fragments: both loaded column major
        source = tc.build(sch, TARGET).source
        assert "tc_wmma_load_shared_a_col(" in source and "tc_wmma_load_shared_b_col(" in source
        assert "tc_wmma_mma_col_col(" in source and not re.search(r"_(load_shared_[ab]|mma)_row", source)


def test_a_product_padded_to_whole_tiles_is_cropped_by_its_epilogue_in_the_same_kernel():
    """A convolution of 49 pixels, 360 window elements and 24 channels, padded to a product of
    64 x 368 x 32 (zeros past its ends): on tensor cores the warps store their whole tiles into
    shared memory, and the bias and ReLU store only the pixels and channels there are; tiled
    on CUDA cores, the epilogue copies out each thread's registers, as many blocks as its
    tiles fill, storing only what lies inside. A crop shorter than a tile is left to CUDA cores."""
    dag = half_conv_padded()
    sketches = {next(w for w in s.name.split() if w.startswith("gpu_")): s
                for s in generate_sketches(dag, target=TARGET) if "gpu_" in s.name}
    assert {"gpu_tensor_core", "gpu_tensor_core_pipelined", "gpu_tile", "gpu_tile_pipelined"} <= set(sketches)
    for name in ("gpu_tensor_core", "gpu_tensor_core_pipelined", "gpu_tile", "gpu_tile_pipelined"):
        func = lower(sketches[name].trace_of(default_row(sketches[name], 1)).replay(dag))
        assert len(split_kernels(func)[0]) == 1 and "< 49)" in str(func) and "conv2d_padded[" not in str(func), name
    func = lower(sketches["gpu_tensor_core"].trace_of(default_row(sketches["gpu_tensor_core"], 1)).replay(dag))
    assert "conv2d_padded_shared" in str(func)
    X, W = te.placeholder((40, 56), name="X", dtype="float16"), te.placeholder((8, 56), name="W", dtype="float16")
    narrow = tc.ComputeDAG([X, W, dense(X, W, multiple=16)])  # 8 outputs: the warps would store part tiles
    assert not any("gpu_tensor_core" in s.name for s in generate_sketches(narrow, target=TARGET))


def test_outputs_too_few_for_the_sms_get_a_split_k_sketch_whose_parts_are_blocks_that_add_atomically():
    """Split-K: the reduction's first axis cut into parts (the outermost factor of its tile),
    each part's sum a block's along blockIdx.y, added into the zeroed output atomically;
    only for a sum into the kernel's output (or into an epilogue that only adds to it) that
    the SMs cannot fill, with a long reduction."""
    dag = matmul(64, 1024, 64)
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_split_k")
    steps = [(step.kind, dict(step.args)) for step in sketch.trace.steps]
    assert [args["thread_axis"] for kind, args in steps if kind == "bind"] == ["blockIdx.y", "blockIdx.x", "vthread.x",
                                                                                "threadIdx.x"]
    assert [kind for kind, _ in steps].count("rfactor") == 1 and sketch.limits_in_decisions
    parts_slot = next(slot for slot in sketch.slots if slot.role == "tile" and not slot.spatial)
    row = default_row(sketch, 1)
    # by default, as many parts as leave each 64 of the sum (16, short of filling the SMs), each two
    # steps of 32 (4 inside a thread's tile); only then are a thread's outputs cut: 16 blocks of 1 x 2
    assert parts_slot.domain[row[sketch.slots.index(parts_slot)]] == (16, 2, 8, 4)
    func = lower(sketch.trace_of(row).replay(dag))
    assert func.zeroed == (False, False, True)
    assert [launch.grid for launch in verify_gpu(func, TARGET)] == [(16, 16, 1)]
    space = FeatureSpace([sketch])
    rows = sketch.sample(np.random.default_rng(0), 8, 1)  # within the limits
    features = dict(zip(space.names, space.features(0, rows).T))
    for row, blocks_y in zip(rows, features["gpu.blockIdx.y"]):  # the parts, as sampled
        assert 2 ** blocks_y == pytest.approx(verify_gpu(lower(sketch.trace_of(row).replay(dag)), TARGET)[0].grid[1])
    no_split = [GpuMultiLevelTiling(split_k=False) if isinstance(rule, GpuMultiLevelTiling) else rule
                for rule in GPU_SKETCH_RULES]
    assert "gpu_split_k" not in {s.name for s in generate_sketches(dag, rules=no_split, target=TARGET)}
    assert "inline(biased) gpu_split_k" in {s.name for s in generate_sketches(dense_bias_residual(), target=TARGET)}
    for name, dag in {"many outputs": matmul(2048, 256, 2048), "short reduction": matmul(64, 96, 64)}.items():
        assert not any("gpu_split_k" in s.name for s in generate_sketches(dag, target=TARGET)), name


def test_split_ks_default_keeps_whole_tiles_and_fills_the_sms_with_parts_where_the_tiled_default_halves_them():
    """BERT's projection back to 768 at batch 1 (128 x 3072 -> 768, and its bias and residual):
    the tiled default halves a thread's 16 x 4 outputs to 2 x 2 to fill the 132 SMs (192
    blocks); split-K's keeps them, 12 tiles of 128 x 64, and takes 12 parts of 256 (144 blocks),
    four times the multiply-adds a shared load. Where even the most parts (each 64 of the sum)
    leave SMs idle, a thread's outputs are then halved: 64 x 4096 -> 128, 2 tiles of 64 parts,
    then 4 of 32 x 64 (8 x 16 threads of 4 x 4); its sum is the reference's."""
    dag = dense_bias_residual(128, 3072, 768)
    sketches = {s.name.split()[-1]: s for s in generate_sketches(dag, target=TARGET)}
    for name, grid, outputs in (("gpu_tile", (192, 1, 1), 4), ("gpu_split_k", (12, 12, 1), 64)):
        func = lower(sketches[name].trace_of(default_row(sketches[name], 1)).replay(dag))
        (launch,) = verify_gpu(func, TARGET)
        assert (launch.grid, launch.block) == (grid, (128, 1, 1)), name
        assert [b.elements for b in _local_buffers(func.body)] == [outputs], name
    dag = dense_bias_residual(64, 4096, 128)
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name.endswith("gpu_split_k"))
    sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
    func = lower(sch)
    assert [launch.grid for launch in verify_gpu(func, TARGET)] == [(4, 64, 1)]
    assert [b.elements for b in _local_buffers(func.body)] == [16]
    inputs = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_relu_after_a_long_sum_splits_k_through_a_workspace_that_a_second_kernel_adds_up():
    """Atomic adds cannot apply a ReLU to the whole sum: the parts' sums go to a workspace, each
    a block's along blockIdx.y, and a second kernel adds them up in order and applies it. A
    rule that must repeat its sums' bits asks for this form for every split-K."""
    dag = conv_relu_long_k()
    sketches = {s.name.split()[0]: s for s in generate_sketches(dag, target=TARGET)}  # the padding inlined after
    assert "gpu_split_k" not in sketches and sketches["gpu_split_k_workspace"].limits_in_decisions
    sketch = sketches["gpu_split_k_workspace"]
    func = lower(sketch.trace_of(default_row(sketch, 1)).replay(dag))
    kernels, workspace = split_kernels(func)
    assert len(kernels) == 2 and not func.zeroed
    # by default the most parts that leave each 64 of the sum's 576 (its steps: 32 of 2 channels)
    assert [(b.name, b.shape) for b in workspace] == [("conv2d_rf", (8, 1, 8, 4, 4))]
    first, second = verify_gpu(func, TARGET)
    assert first.grid[1] == 8 and (second.grid, second.block) == ((1, 1, 1), (128, 1, 1))  # a thread an output
    inputs = dag.random_inputs(np.random.default_rng(0))
    for row in sketch.sample(np.random.default_rng(1), 4, 1):
        sch = sketch.trace_of(row).replay(dag)
        np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET)(*inputs), dag.evaluate_numpy(inputs)[0],
                                   rtol=1e-4, atol=1e-4)
    in_order = [GpuMultiLevelTiling(atomic_split_k=False) if isinstance(rule, GpuMultiLevelTiling) else rule
                for rule in GPU_SKETCH_RULES]
    names = {s.name for s in generate_sketches(matmul(64, 1024, 64), rules=in_order, target=TARGET)}
    assert "gpu_split_k_workspace" in names and "gpu_split_k" not in names


@pytest.mark.slow
@pytest.mark.parametrize("dag,kind", [
    (lambda: matmul(512, 512, 512), "gpu_tile"), (conv_bias_relu, "gpu_tile"),
    (lambda: tc.ComputeDAG([*(X := (te.placeholder((1, 8, 17, 17), name="X"), te.placeholder((8, 8, 3, 3), name="W"))),
                            conv2d_nchw(*X, stride=2, padding=1)]), "gpu_tile"),
    (lambda: matmul(512, 512, 512), "gpu_tile_pipelined"), (conv_bias_relu, "gpu_tile_transposed"),
    (lambda: matmul(512, 512, 512), "gpu_tile_transposed_pipelined"),
    (lambda: matmul(512, 512, 512), "gpu_split_k"), (lambda: half_matmul(512, 256, 512), "gpu_tensor_core"),
    (lambda: half_matmul(512, 256, 256, bias_relu=True), "gpu_tensor_core_pipelined"),
    (half_attention_scores, "gpu_tensor_core"),
    (lambda: half_matmul(512, 256, 256, cast=True, dtype="bfloat16"), "gpu_tensor_core"),
    (lambda: tc.ComputeDAG([*(X := (te.placeholder((1, 32, 10, 10), name="X"),
                                    te.placeholder((16, 32, 3, 3), name="W"))), conv2d_nchw(*X, padding=1)]),
     "gpu_split_k"), (conv_relu_long_k, "gpu_split_k_workspace")],
    ids=["matmul", "conv", "conv_strided", "matmul_pipelined", "conv_transposed_tiles", "matmul_transposed_pipelined",
         "matmul_split_k",
         "half_matmul_tensor_cores", "half_matmul_bias_relu_pipelined", "half_attention_scores",
         "bfloat16_matmul_tensor_cores", "conv_split_k", "conv_split_k_workspace"])
def test_the_decisions_alone_tell_threads_vthreads_shared_memory_and_registers_as_the_verifier_does(dag, kind):
    """The decision-matrix check agrees with the lowered loops, and sampling draws only
    candidates that pass it."""
    dag = dag()
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if kind in s.name)
    rows = sketch.sample_uniform(np.random.default_rng(0), 60)
    fits, shared, registers = sketch.within_gpu_limits(rows), sketch.shared_bytes(rows), sketch.local_words(rows)
    for row, fit, shared_bytes, words in zip(rows, fits, shared, registers):
        func = lower(sketch.trace_of(row).replay(dag))
        assert shared_bytes == sum(b.elements * bytes_of(b.dtype) for b in _shared_buffers(func.body))
        assert words == local_words(_local_buffers(func.body))
        launch_or_error = _verify(sketch.trace_of(row).replay(dag))
        assert fit != isinstance(launch_or_error, GpuLimitError), launch_or_error
        if fit:  # a launch's threads on an axis are its widest thread loop's, over all kernels
            extents = sketch.gpu_extents(row[None])
            threads = 2 ** sum(extents[axis][0] for axis in extents if axis.startswith("threadIdx"))
            assert max(math.prod(launch.block) for launch in launch_or_error) == round(threads)
    assert sketch.within_gpu_limits(sketch.sample(np.random.default_rng(1), 200, 1)).mean() > 0.95


@pytest.mark.parametrize("workload", EVERY_WORKLOAD)
@pytest.mark.slow
def test_the_decisions_alone_tell_the_registers_a_thread_keeps_as_the_lowered_kernel_does(workload):
    """Accumulators, a cross-thread reduction's partial and result, a softmax's row values:
    the words the decision matrix counts are the local buffers of the lowered kernel; a
    padded product's tiles that its crop cuts short (its rows past the end never computed)
    at least."""
    dag = WORKLOADS[workload]()
    for sketch in generate_sketches(dag, target=TARGET):
        rows = sketch.sample_uniform(np.random.default_rng(0), 8)
        for row, words in zip(rows, sketch.local_words(rows)):
            kept = local_words(_local_buffers(lower(sketch.trace_of(row).replay(dag)).body))
            assert words >= kept if workload.endswith("_padded") else words == kept, f"{sketch.name}: {row}"


@pytest.mark.slow
def test_a_register_tile_past_the_threads_registers_is_never_drawn():
    """A 2048³ matmul's tiles allow 16,384 accumulators a thread; the verifier refuses more
    than three quarters of the registers a thread gets (96 of 128 in blocks of up to 256
    threads), and so does the decision matrix, so sampling draws none."""
    dag = matmul(2048, 2048, 2048)
    sketch = generate_sketches(dag, target=TARGET)[0]
    rows = sketch.sample_uniform(np.random.default_rng(0), 400)
    verdicts = []
    for row in rows[:60]:
        try:
            verify_gpu(lower(sketch.trace_of(row).replay(dag)), TARGET)
            verdicts.append("fits")
        except GpuLimitError as error:
            verdicts.append("registers" if "registers a thread" in str(error) else "other")
    assert verdicts.count("registers") > 10
    assert [v == "fits" for v in verdicts] == list(sketch.within_gpu_limits(rows[:60]))
    assert sketch.within_gpu_limits(sketch.sample(np.random.default_rng(1), 400, 1)).all()


@pytest.mark.slow
def test_the_default_gpu_candidate_has_the_kept_logs_fastest_tiles_and_passes_the_verifier():
    """8 x 16 threads of 16 x 4 outputs, the shape of the kept H100 logs' fastest matmuls
    (docs/experiments/gpu-default-tile.md); at 1024³ 8 x 4, where 128 blocks would not fill
    the 132 SMs; a step of 32 through shared memory, 4 of it in registers."""
    for n, tiles, grid in ((2048, [(16, 1, 8, 1, 16), (32, 1, 16, 1, 4), (64, 8, 4)], 512),
                           (1024, [(16, 1, 8, 1, 8), (16, 1, 16, 1, 4), (32, 8, 4)], 256)):
        dag = matmul(n, n, n)
        sketch = generate_sketches(dag, target=TARGET)[0]
        row = default_row(sketch, 1)
        assert [sketch.slots[i].domain[index] for i, index in enumerate(row) if sketch.slots[i].role == "tile"] == tiles
        (launch,) = verify_gpu(lower(sketch.trace_of(row).replay(dag)), TARGET)
        assert (launch.grid, launch.block) == ((grid, 1, 1), (128, 1, 1))
    small = matmul(256, 64, 512)  # halved to 2 x 2 outputs a thread, 256 blocks
    inputs = small.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(default_schedule(small, TARGET), TARGET)(*inputs),
                               small.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)
    for name, dag in WORKLOADS.items():  # every sketch's default is a kernel
        for sketch in generate_sketches(dag(), target=TARGET):
            assert not isinstance(_verify(sketch.trace_of(default_row(sketch, 1)).replay(dag())), GpuLimitError), \
                f"{name}: {sketch.name}"


def test_gpu_features_name_the_launch_and_the_waves_over_the_sms():
    dag = matmul(512, 512, 512)
    sketches = generate_sketches(dag, target=TARGET)
    space = FeatureSpace(sketches)
    assert {"gpu.blockIdx.x", "gpu.vthread.x", "gpu.threadIdx.x", "gpu_waves"} <= set(space.names)
    row = default_row(sketches[0], 1)
    features = dict(zip(space.names, space.features(0, row[None])[0]))
    (launch,) = verify_gpu(lower(sketches[0].trace_of(row).replay(dag)), TARGET)
    assert 2 ** features["gpu.blockIdx.x"] == pytest.approx(launch.grid[0])
    assert 2 ** features["gpu.threadIdx.x"] == pytest.approx(launch.block[0])
    blocks_per_sm = min(2048 // launch.block[0], 32)
    assert 2 ** features["gpu_waves"] == pytest.approx(launch.grid[0] / blocks_per_sm / TARGET.sm_count)


def _verify(sch):
    try:
        return verify_gpu(lower(sch), TARGET)
    except GpuLimitError as error:
        return error


@pytest.mark.parametrize("workload", EVERY_WORKLOAD)
@pytest.mark.slow
def test_random_candidates_of_every_gpu_sketch_match_numpy_or_are_refused(workload):
    dag = WORKLOADS[workload]()
    inputs = dag.random_inputs(np.random.default_rng(1))
    expected = dag.evaluate_numpy(inputs)[0]
    # a 16-bit result summed in another order may round to the next value (float16: a relative
    # 1e-3; bfloat16: 8e-3)
    close = {"float16": dict(rtol=2e-3, atol=2e-3), "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}.get(
        expected.dtype.name, dict(rtol=1e-4, atol=1e-4))
    for sketch in generate_sketches(dag, target=TARGET):
        valid = 0
        for row in sketch.sample_uniform(np.random.default_rng(0), 6):
            sch = sketch.trace_of(row).replay(dag)
            try:
                kernel = tc.emulate_gpu(sch, TARGET)
            except GpuLimitError:  # the verifier's refusals cost no build
                continue
            np.testing.assert_allclose(kernel(*inputs).astype(np.float32), expected.astype(np.float32), **close,
                                       err_msg=f"{sketch.name}:\n{sch}")
            if valid == 0 and shutil.which("nvcc"):
                tc.build(sch, TARGET)
            valid += 1
        assert valid, f"no random candidate of sketch {sketch.name} passed the verifier"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("workload, racecheck", [
    (name, racecheck) if (name, racecheck) == ("half_matmul", False) else
    pytest.param(name, racecheck, marks=pytest.mark.slow) for name in sorted(WORKLOADS) for racecheck in (False, True)])
@pytest.mark.slow
def test_the_cuda_c_of_a_random_candidate_of_every_gpu_sketch_matches_numpy(workload, racecheck, kernel_cache):
    """The kernels' CUDA C itself, run on the CPU (``cuda_source``), the block's threads
    shuffled: shared memory read before a barrier, or a cp.async before its wait, reads NaN;
    a wmma operand loaded in another layout than the mma's, or misaligned, is named; under
    ``racecheck``, two threads touching one address between barriers, one writing, too (the
    threads that reduced a row together all stored its sum, before only the first did)."""
    dag = WORKLOADS[workload]()
    inputs = dag.random_inputs(np.random.default_rng(1))
    expected = dag.evaluate_numpy(inputs)[0].astype(np.float32)
    close = {"float16": dict(rtol=2e-3, atol=2e-3), "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}.get(
        dag.outputs[0].dtype, dict(rtol=1e-4, atol=1e-4))
    for sketch in generate_sketches(dag, target=TARGET):
        for row in sketch.sample(np.random.default_rng(0), 8, 1):  # the first the verifier accepts
            try:
                kernel = tc.emulate_gpu(sketch.trace_of(row).replay(dag), TARGET, cache_dir=kernel_cache,
                                        cuda_source=True, racecheck=racecheck)
            except GpuLimitError:
                continue
            np.testing.assert_allclose(kernel(*inputs).astype(np.float32), expected, **close,
                                       err_msg=f"{sketch.name}:\n{kernel.source[-3000:]}")
            break
        else:
            raise AssertionError(f"no candidate of sketch {sketch.name} passed the verifier")



@pytest.mark.slow
def test_blocks_short_of_a_warp_are_neither_sampled_nor_proposed_where_a_sketch_has_blocks_of_a_warp():
    """A block of fewer than 32 threads idles lanes at every instruction: the sampler and the
    policy keep to blocks of a warp; a sketch whose blocks cannot have one (4 x 4 outputs
    tiled) still samples what it can."""
    dag = matmul(256, 64, 256)
    for sketch in generate_sketches(dag, target=TARGET):
        rows = sketch.sample(np.random.default_rng(0), 200, 1)
        assert sketch._fills_a_warp(rows).all() and sketch.full_warps(rows).all(), sketch.name
        uniform = sketch.sample_uniform(np.random.default_rng(1), 2000)
        assert not sketch._fills_a_warp(uniform).all()  # what the sampler avoids
    task = tc.SearchTask(func="matmul", args=(256, 64, 256), target=TARGET)
    policy = tc.SketchPolicy(task, seed=0)
    batch = policy.next_batch(64)
    threads = [max(launch.threads for launch in verify_gpu(lower(policy.trace_of(c).replay(task.compute_dag)), TARGET))
               for c in batch]
    assert min(threads) >= 32
    tiny = next(s for s in generate_sketches(matmul(4, 8, 4), target=TARGET) if s.name == "gpu_tile")
    rows = tiny.sample(np.random.default_rng(0), 50, 1)
    assert not tiny._fills_a_warp(rows).any() and tiny.full_warps(rows).all() and tiny.within_gpu_limits(rows).all()
