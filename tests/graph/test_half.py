"""half_products: a float16 model's products read float16 on a GPU, computing what they computed
between casts; tensor cores are then among their sketches, and the model's outputs stay onnxruntime's."""

import shutil
import warnings

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.half import PRODUCTS, gemm_convolutions, half_products
from tilecraft.graph.layout import convert_layout
from tilecraft.graph.reference import run_reference
from tilecraft.model.compiled import DefaultScheduleWarning
from tilecraft.model.tasks import prepare_graph
from tilecraft.search.space import generate_sketches
from tilecraft.te.dtype import NUMPY_DTYPES

GPU = tc.Target("cuda -arch=sm_90")


def half_layer(rows=32, dtype="float16"):
    """As the importer builds a float16 (or bfloat16) model: a dense layer with a bias and a ReLU,
    the product of its output with its own transpose (two activations), and a 3x3 convolution,
    each product in float32 between casts, its 16-bit weights folded into float32 constants."""
    rng = np.random.default_rng(0)
    half = NUMPY_DTYPES[dtype]
    b = GraphBuilder()
    x = b.add_input("x", (rows, 64), dtype)
    w = b.add_constant("w", (rng.standard_normal((48, 64)) / 8).astype(half))
    bias = b.add_constant("bias", rng.standard_normal(48).astype(half))
    h = b.emit("relu", [b.emit("add", [b.emit("dense", [x, w], {}, "fc"), bias], {}, "bias")], {}, "relu")
    scores = b.emit("matmul", [h, b.emit("transpose", [h], {"axes": (1, 0)}, "t")], {}, "scores")
    image = b.add_input("image", (1, 16, 8, 8), dtype)
    kernel = b.add_constant("kernel", (rng.standard_normal((32, 16, 3, 3)) / 12).astype(half))
    return b.finish([scores, b.emit("conv2d", [image, kernel], {"stride": 1, "padding": 1}, "conv")])


def feeds(graph):
    rng = np.random.default_rng(1)
    return {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}


def emulated_on_gpu(graph, cache_dir):
    """``graph`` compiled for the GPU (untuned), its outputs emulated on the CPU, and the reference's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        gpu = tc.compile_model(graph, GPU, cache_dir=cache_dir)
    return gpu, gpu.emulate(feeds(graph)), run_reference(graph, feeds(graph))


def test_float16_products_read_their_float16_operands_and_compute_the_same():
    graph = half_layer()
    assert sum(n.op == "cast" for n in graph.nodes) == 7  # a cast of each activation a product reads, its rounding
    assert {graph.values[w].dtype for n in graph.nodes if n.op in PRODUCTS for w in n.inputs} == {"float32"}
    halved = half_products(graph)
    assert not any(n.op == "cast" for n in halved.nodes)
    assert {halved.values[w].dtype for n in halved.nodes if n.op in PRODUCTS for w in n.inputs} == {"float16"}
    assert all(halved.values[n.output].dtype == "float16" for n in halved.nodes if n.op in PRODUCTS)
    before, after = run_reference(graph, feeds(graph)), run_reference(halved, feeds(graph))
    for name in graph.outputs:  # the same sums in float32, each rounded once
        np.testing.assert_array_equal(after[name], before[name])


def test_bfloat16_products_read_their_bfloat16_operands_and_compute_the_same():
    """As float16's: each sum kept in float32 and rounded once, by the product itself; no cast
    stays, and the convolution becomes a matrix product for tensor cores too."""
    graph = half_layer(dtype="bfloat16")
    halved = half_products(graph)
    assert not any(n.op == "cast" for n in halved.nodes)
    products = [n for n in halved.nodes if n.op in PRODUCTS]
    assert {halved.values[w].dtype for n in products for w in n.inputs} == {"bfloat16"}
    assert all(halved.values[n.output].dtype == "bfloat16" for n in products)
    before, after = run_reference(graph, feeds(graph)), run_reference(halved, feeds(graph))
    for name in graph.outputs:
        np.testing.assert_array_equal(after[name], before[name])
    prepared = prepare_graph(half_layer(dtype="bfloat16"), None, GPU)
    assert [prepared.values[n.output].dtype for n in prepared.nodes if n.op in (*PRODUCTS, "conv2d_nhwc_gemm")] == \
        ["bfloat16"] * 3 and any(n.op == "conv2d_nhwc_gemm" for n in prepared.nodes)


def test_casts_move_through_the_reshapes_around_a_product_and_no_further():
    """A 3-D MatMul as imported: reshape to 2-D between its input's cast and the dense layer, and
    back between the dense layer and its rounding; the casts meet the product through them and go.
    A cast before a reshape that a softmax reads stays where it fuses (with the node before it)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("x", (1, 32, 64), "float16")
    flat = b.emit("reshape", [b.emit("cast", [x], {"dtype": "float32"}, "wide")], {"newshape": (32, 64)}, "flat")
    weight = b.add_constant("w", rng.standard_normal((48, 64)).astype("float16").astype("float32"))
    product = b.emit("reshape", [b.emit("dense", [flat, weight], {}, "fc")], {"newshape": (1, 32, 48)}, "unflat")
    rounded = b.emit("cast", [product], {"dtype": "float16"}, "rounded")
    scores = b.emit("reshape", [b.emit("cast", [rounded], {"dtype": "float32"}, "wide2")], {"newshape": (32, 48)},
                    "rows")
    graph = b.finish([b.emit("softmax", [scores], {"axis": -1}, "softmax")])
    halved = half_products(graph)
    assert [n.op for n in halved.nodes] == ["reshape", "dense", "reshape", "cast", "reshape", "softmax"]
    assert halved.values[halved.nodes[1].output].dtype == "float16"
    np.testing.assert_array_equal(run_reference(halved, feeds(graph))[graph.outputs[0]],
                                  run_reference(graph, feeds(graph))[graph.outputs[0]])


def test_a_max_pool_reads_float16_as_the_element_it_picks_is_one():
    b = GraphBuilder()
    x = b.add_input("x", (1, 16, 8, 8), "float16")
    graph = b.finish([b.emit("max_pool2d", [b.emit("relu", [x], {}, "relu")], {"kernel": 2, "stride": 2}, "pool")])
    assert any(n.op == "cast" for n in graph.nodes)  # computed in float32 between casts, as imported
    halved = half_products(graph)
    assert [n.op for n in halved.nodes] == ["relu", "max_pool2d"]
    np.testing.assert_array_equal(run_reference(halved, feeds(graph))[graph.outputs[0]],
                                  run_reference(graph, feeds(graph))[graph.outputs[0]])


def test_a_product_with_a_weight_that_float16_cannot_hold_stays_in_float32():
    b = GraphBuilder()
    x = b.add_input("x", (16, 16), "float16")
    wide = b.emit("cast", [x], {"dtype": "float32"}, "widened")
    weight = b.add_constant("w", np.full((16, 16), 0.1, "float32"))  # 0.1 is not a float16
    product = b.emit("dense", [wide, weight], {}, "fc")
    graph = b.finish([b.emit("cast", [product], {"dtype": "float16"}, "rounded")])
    assert half_products(graph).nodes == graph.nodes


def test_only_a_gpu_model_is_prepared_with_float16_products():
    """On a CPU the casts stay: it computes in float32 whatever the type stored."""
    products = {target: [n for n in prepare_graph(half_layer(), None, tc.Target(target)).nodes if n.op in PRODUCTS]
                for target in ("llvm -isa=avx2", str(GPU))}
    cpu_graph = prepare_graph(half_layer(), None, tc.Target("llvm -isa=avx2"))
    assert all(cpu_graph.values[w].dtype == "float32" for n in products["llvm -isa=avx2"] for w in n.inputs)
    gpu_graph = prepare_graph(half_layer(), None, GPU)
    assert all(gpu_graph.values[w].dtype == "float16" for n in products[str(GPU)] for w in n.inputs)


@pytest.mark.slow  # the quick subset pairs bfloat16 products in codegen/test_dot_pairs.py
def test_a_cpu_with_avx512_bf16_computes_bfloat16_products_on_bfloat16_operands(tmp_path):
    """Their pairs summed by AVX-512 BF16 (codegen/dot_pairs.py), their weights half the bytes;
    the convolution too, direct (Winograd's rewrite is float32's). A CPU without it computes
    them in float32 between casts, which widening each element would slow down."""
    graph = half_layer(dtype="bfloat16")
    for target, operands in (("llvm -mcpu=znver4", "bfloat16"), ("llvm -mcpu=skylake-avx512", "float32")):
        prepared = prepare_graph(graph, None, tc.Target(target))
        types = {n.op: {prepared.values[w].dtype for w in n.inputs} for n in prepared.nodes if n.op in PRODUCTS}
        assert types == {"dense": {operands}, "matmul": {operands}, "conv2d_nhwc": {operands}}, (target, types)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        model = tc.compile_model(graph, "llvm", cache_dir=tmp_path)
    got, want = model.run(feeds(graph)), run_reference(graph, feeds(graph))
    for name in graph.outputs:  # the same sums, in float32 and rounded once, up to their order
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_a_16_bit_models_matrix_products_have_tensor_core_sketches_and_no_cast_kernels(dtype):
    tasks, _ = tc.extract_tasks(half_layer(dtype=dtype), GPU)
    sketches = {task.desc: [s.name for s in generate_sketches(task.compute_dag, target=GPU)] for task in tasks}
    assert not any(desc.startswith("cast") for desc in sketches), sketches  # a bfloat16 rounding fuses after
    products = [names for desc, names in sketches.items() if desc.startswith(("dense", "matmul"))]
    assert len(products) == 2 and all(any("gpu_tensor_core" in name for name in names) for names in products)


def test_float16_matrix_products_are_padded_to_whole_tiles_where_that_at_most_doubles_them():
    """40 rows: the dense layer 40 x 64 x 48 and the scores 40 x 48 x 40 padded to 48 rows (and
    columns), both on tensor cores; 24 rows (the scores 24 x 48 x 24 would be 32 x 48 x 32,
    1.8 times the products, and the dense layer 1.3) both; 8 rows, short of a tile, neither."""
    multiples = {rows: {n.op: n.attrs.get("multiple") for n in prepare_graph(half_layer(rows), None, GPU).nodes
                        if n.op in ("dense", "matmul")} for rows in (40, 24, 8, 32)}
    assert multiples == {40: {"dense": 16, "matmul": 16}, 24: {"dense": 16, "matmul": 16},
                         8: {"dense": None, "matmul": None}, 32: {"dense": None, "matmul": None}}
    tasks, _ = tc.extract_tasks(half_layer(40), GPU)
    products = [task for task in tasks if task.desc.startswith(("dense", "matmul"))]
    assert len(products) == 2 and all(any("gpu_tensor_core" in s.name for s in generate_sketches(
        task.compute_dag, target=GPU)) for task in products)


def test_float32_products_are_padded_where_a_size_has_too_few_divisors_for_the_threads():
    """61 rows, a prime: the dense layer 61 x 64 x 48 and the scores 61 x 48 x 61 padded to 64
    rows (and columns), 1.05 and 1.1 times the products; 37 rows would be 1.3 and 1.7 times, 50
    rows have 10 as a divisor and 32 rows 16: none of them padded."""
    prepared = {rows: prepare_graph(half_layer(rows, "float32"), None, GPU) for rows in (61, 37, 50, 32)}
    multiples = {rows: {n.op: n.attrs.get("multiple") for n in graph.nodes if n.op in ("dense", "matmul")}
                 for rows, graph in prepared.items()}
    assert multiples == {61: {"dense": 16, "matmul": 16}, 37: {"dense": None, "matmul": None},
                         50: {"dense": None, "matmul": None}, 32: {"dense": None, "matmul": None}}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_a_float32_product_of_a_prime_size_runs_whole_warps_and_computes_the_same(tmp_path):
    """Padded to 64 rows, the untuned kernels of 61 rows launch blocks of whole warps (the
    divisors of 61 gave one thread a block along its rows)."""
    graph = half_layer(61, "float32")
    gpu, got, expected = emulated_on_gpu(graph, tmp_path)
    products = [k for k in gpu.kernels if k.desc.startswith(("dense", "matmul"))]
    assert len(products) == 2 and all(launch.block[0] % 32 == 0 for k in products for launch in k.module.launches)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("rows, dtype", [(32, "float16"), (40, "float16"), (40, "bfloat16")])
def test_a_16_bit_model_compiled_for_a_gpu_computes_what_it_computes_on_a_cpu(tmp_path, rows, dtype):
    graph = half_layer(rows, dtype)
    _, got, expected = emulated_on_gpu(graph, tmp_path)
    tolerance = 2e-3 if dtype == "float16" else 1.6e-2
    for name in graph.outputs:
        assert got[name].dtype == NUMPY_DTYPES[dtype]
        np.testing.assert_allclose(got[name].astype("float32"), expected[name].astype("float32"), rtol=tolerance,
                                   atol=tolerance)


def residual_block(size=8, channels=32, dtype="float16"):
    """A float16 (or bfloat16) stem and residual block as imported (NCHW): conv, bias, ReLU; then
    twice conv, bias, the second time the stem's output added, ReLU. Its output pixels (size x
    size), channels and windows are multiples of 16 where ``size`` is a multiple of 4."""
    rng = np.random.default_rng(0)
    half = NUMPY_DTYPES[dtype]
    b = GraphBuilder()
    h = stem = b.add_input("x", (1, channels, size, size), dtype)
    for n in (0, 1, 2):
        kernel = b.add_constant(f"k{n}", (rng.standard_normal((channels, channels, 3, 3)) / 16).astype(half))
        bias = b.add_constant(f"b{n}", rng.standard_normal((channels, 1, 1)).astype(half))
        h = b.emit("add", [b.emit("conv2d", [h, kernel], {"stride": 1, "padding": 1}, f"conv{n}"), bias], {},
                   f"bias{n}")
        h = b.emit("relu", [b.emit("add", [h, stem], {}, "residual") if n == 2 else h], {}, f"relu{n}")
        stem = h if n == 0 else stem
    return b.finish([h])


def test_float16_convolutions_become_matrix_products_whose_epilogues_still_fuse():
    graph = residual_block()
    nhwc = convert_layout(half_products(graph))
    rewritten = gemm_convolutions(nhwc)
    ops = [n.op for n in rewritten.nodes]
    assert ops.count("conv2d_nhwc_gemm") == 3 and "conv2d_nhwc" not in ops
    assert all(rewritten.values[n.output].shape == (64, 32) for n in rewritten.nodes if n.op == "conv2d_nhwc_gemm")
    before, after = run_reference(nhwc, feeds(graph)), run_reference(rewritten, feeds(graph))
    np.testing.assert_allclose(after[graph.outputs[0]].astype("float32"), before[graph.outputs[0]].astype("float32"),
                               rtol=2e-3, atol=2e-3)  # the same sums in another order, rounded once
    tasks, weights = tc.extract_tasks(graph, GPU)
    products = [(task.desc.split(" ")[0], weight) for task, weight in zip(tasks, weights) if "conv2d" in task.desc]
    assert products == [("conv2d_nhwc_gemm+add+relu", 2), ("conv2d_nhwc_gemm+add+add+relu", 1)]  # the residual too
    assert all(any("gpu_tensor_core" in s.name for s in generate_sketches(task.compute_dag, target=GPU))
               for task in tasks if "conv2d" in task.desc)


def test_a_convolution_padded_to_whole_tiles_is_a_product_cropped_in_its_own_kernel():
    """7x7 pixels: 49 rows of the product padded to 64, its padding cropped before the bias,
    the residual and the ReLU, which fuse with it as before."""
    graph = residual_block(size=7)
    nhwc = convert_layout(half_products(graph))
    rewritten = gemm_convolutions(nhwc)
    assert [n.op for n in rewritten.nodes].count("conv2d_nhwc_gemm") == 3
    assert all(rewritten.values[n.output].shape == (49, 32) for n in rewritten.nodes if n.op == "conv2d_nhwc_gemm")
    before, after = run_reference(nhwc, feeds(graph)), run_reference(rewritten, feeds(graph))
    np.testing.assert_allclose(after[graph.outputs[0]].astype("float32"), before[graph.outputs[0]].astype("float32"),
                               rtol=2e-3, atol=2e-3)
    tasks, _ = tc.extract_tasks(graph, GPU)
    assert [task.desc.split(" ")[0] for task in tasks if "conv2d" in task.desc] == [
        "conv2d_nhwc_gemm+add+relu", "conv2d_nhwc_gemm+add+add+relu"]
    assert all(any("gpu_tensor_core" in s.name for s in generate_sketches(task.compute_dag, target=GPU))
               for task in tasks if "conv2d" in task.desc)


@pytest.mark.parametrize("size, channels", [(5, 17), (6, 4)])
def test_a_convolution_that_padding_would_more_than_double_or_that_is_short_of_a_tile_stays_direct(size, channels):
    """5x5 pixels, 17 channels: 25 x 153 x 17 would be 32 x 160 x 32, 2.5 times the products;
    4 channels are short of a tile."""
    rewritten = gemm_convolutions(convert_layout(half_products(residual_block(size=size, channels=channels))))
    assert [n.op for n in rewritten.nodes].count("conv2d_nhwc") == 3


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("size, dtype", [(8, "float16"), (7, "float16"), (8, "bfloat16")])
def test_a_16_bit_residual_block_compiled_for_a_gpu_computes_what_the_reference_does(tmp_path, size, dtype):
    graph = residual_block(size, dtype=dtype)
    gpu, got, expected = emulated_on_gpu(graph, tmp_path)
    assert any("conv2d_nhwc_gemm" in kernel.desc for kernel in gpu.kernels)
    tolerance = 4e-3 if dtype == "float16" else 3e-2  # a sum rounded once, to 11 bits or to 8
    np.testing.assert_allclose(got[graph.outputs[0]].astype("float32"),
                               expected[graph.outputs[0]].astype("float32"), rtol=tolerance, atol=tolerance)


@pytest.mark.slow  # its float16 siblings stay quick
def test_a_bfloat16_product_and_softmax_compute_in_float32_between_casts(tmp_path):
    """As a float16 node does: the sums rounded to bfloat16 once, where a softmax computed in
    bfloat16 would round its maximum, its exponentials and their sum; compiled for a CPU, it
    computes what the reference does."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("x", (4, 32), "bfloat16")
    w = b.add_constant("w", rng.standard_normal((8, 32)).astype(NUMPY_DTYPES["bfloat16"]))
    out = b.emit("softmax", [b.emit("dense", [x, w], {}, "fc")], {"axis": 1}, "probabilities")
    graph = b.finish([out])
    assert graph.values[out].dtype == "bfloat16"
    assert sorted(n.attrs["dtype"] for n in graph.nodes if n.op == "cast") == ["bfloat16", "bfloat16", "float32",
                                                                                "float32"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        model = tc.compile_model(graph, "llvm", cache_dir=tmp_path)
    got, want = model.run(feeds(graph))[out], run_reference(graph, feeds(graph))[out]
    assert got.dtype == want.dtype == NUMPY_DTYPES["bfloat16"]
    # fused, the logits reach the softmax unrounded; the reference rounds them to bfloat16 (a
    # logit of 8 by up to 0.03, its exponential by 3%)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=5e-2, atol=1e-3)
