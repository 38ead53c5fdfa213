"""The graph IR, its builder (shape inference, constant folding), the passes and the NumPy runner; no ONNX needed."""

import math

import numpy as np
import pytest

from tilecraft.errors import TeError
from tilecraft.graph import OPERATORS, eliminate_dead_code, fold_batch_norm, fuse_gelu, run_reference, sink_reshapes
from tilecraft.graph.fuse import partition
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.operators import build_alone


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_every_operator_has_a_fusion_pattern():
    assert {op.pattern for op in OPERATORS.values()} <= {
        "heavy", "elementwise", "broadcast", "injective", "reduction", "opaque"}
    assert OPERATORS["conv2d"].pattern == "heavy" and OPERATORS["reshape"].pattern == "injective"


def test_builder_infers_shapes_from_the_operators_and_folds_constant_nodes(rng):
    g = GraphBuilder()
    x = g.add_input("x", (2, 6), "float32")
    w = g.add_constant("w", rng.standard_normal((6, 4)).astype("float32"))
    wt = g.emit("transpose", [w], {"axes": (1, 0)}, "w_t")           # constant in, constant out: folded
    y = g.emit("dense", [x, wt], {}, "fc", output="y")
    graph = g.finish([y])
    assert [n.op for n in graph.nodes] == ["dense"] and graph.is_constant(wt)
    assert graph.values["y"].shape == (2, 4) and graph.values["y"].dtype == "float32"
    np.testing.assert_array_equal(graph.constants[wt], graph.constants["w"].T)
    text = str(graph)
    assert "graph(x: float32[2, 6]) -> (y)" in text and "y: float32[2, 4] = dense(x, w_t_transpose*)" in text


def test_weights_are_layout_free_placeholders(rng):
    g = GraphBuilder()
    x = g.add_input("x", (1, 3, 8, 8), "float32")
    k = g.add_constant("k", rng.standard_normal((4, 3, 3, 3)).astype("float32"))
    y = g.emit("conv2d", [x, k], {"padding": 1}, "conv", output="y")
    graph = g.finish([y])
    placeholders, out = build_alone(graph.nodes[0], graph.values)
    assert out.op.attrs["layout_free_placeholders"] == [placeholders["k"]]


def test_run_reference_names_a_wrong_input():
    g = GraphBuilder()
    y = g.emit("relu", [g.add_input("x", (3,), "float32")], {}, "relu", output="y")
    graph = g.finish([y])
    with pytest.raises(TeError, match=r"inputs are \['x'\] but got \['z'\]"):
        run_reference(graph, {"z": np.zeros(3, "float32")})
    with pytest.raises(TeError, match=r"input x must be float32\[3\] but got float64\[3\]"):
        run_reference(graph, {"x": np.zeros(3)})


def conv_bn_graph(rng, conv_op, with_bias, extra_consumer=False):
    g = GraphBuilder()
    x = g.add_input("x", (1, 4, 6, 6), "float32")
    kernel_shape = {"conv2d": (8, 4, 3, 3), "depthwise_conv2d": (4, 2, 3, 3), "conv2d_transpose": (4, 8, 3, 3)}
    k = g.add_constant("k", rng.standard_normal(kernel_shape[conv_op]).astype("float32"))
    out = g.emit(conv_op, [x, k], {}, "conv")
    if with_bias:
        out = g.emit("add", [out, g.add_constant("b", rng.standard_normal((8, 1, 1)).astype("float32"))], {}, "bias")
    params = [g.add_constant(n, (rng.random(8) + 0.5).astype("float32")) for n in ("gamma", "beta", "mean", "var")]
    y = g.emit("batch_norm", [out, *params], {"epsilon": 1e-3}, "bn", output="y")
    outputs = [y, g.emit("relu", [out], {}, "other", output="y2")] if extra_consumer else [y]
    return g.finish(outputs)


@pytest.mark.parametrize("conv_op, with_bias", [("conv2d", True), ("conv2d", False), ("depthwise_conv2d", True),
                                                ("conv2d_transpose", False)])
def test_fold_batch_norm_into_the_convolution(rng, conv_op, with_bias):
    graph = conv_bn_graph(rng, conv_op, with_bias)
    x = {"x": rng.standard_normal((1, 4, 6, 6)).astype("float32")}
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert [n.op for n in folded.nodes] == [conv_op, "add"]
    assert set(folded.constants) == {"conv_folded_weight", "conv_folded_bias"}
    np.testing.assert_allclose(run_reference(folded, x)["y"], run_reference(graph, x)["y"], rtol=1e-4, atol=1e-5)


def test_a_norm_whose_convolution_is_read_elsewhere_or_that_follows_no_convolution_is_an_affine_map(rng):
    """The convolution keeps its weights (another node reads its output); the norm becomes
    x * s + t with per-channel constants, as before any node of a pre-activation network."""
    graph = conv_bn_graph(rng, "conv2d", True, extra_consumer=True)
    x = {"x": rng.standard_normal((1, 4, 6, 6)).astype("float32")}
    folded = eliminate_dead_code(fold_batch_norm(graph))
    assert [n.op for n in folded.nodes] == ["conv2d", "add", "multiply", "add", "relu"]
    assert folded.constants["k"] is graph.constants["k"] and folded.values["bn_scale"].shape == (1, 8, 1, 1)
    for name in ("y", "y2"):
        np.testing.assert_allclose(run_reference(folded, x)[name], run_reference(graph, x)[name], rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("form, dtype", [("div_then_half_last", "float32"), ("mul_then_half_first", "float32"),
                                         ("div_then_half_last", "float16"), ("mul_then_half_first", "float16")])
def test_fuse_gelu_recognises_the_erf_form(rng, form, dtype):
    """In float16 too, whose sqrt(2) is 1.4140625."""
    g = GraphBuilder()
    x = g.add_input("x", (3, 5), dtype)

    def scalar(name, value):
        return g.add_constant(name, np.array(value, dtype))

    if form == "div_then_half_last":  # as torch exports F.gelu: x * (1 + erf(x / sqrt 2)) * 0.5
        scaled = g.emit("divide", [x, scalar("sqrt2", math.sqrt(2))], {}, "div")
        plus = g.emit("add", [g.emit("erf", [scaled], {}, "erf"), scalar("one", 1.0)], {}, "add")
        y = g.emit("multiply", [g.emit("multiply", [x, plus], {}, "mul"), scalar("half", 0.5)], {}, "out", "y")
    else:  # as BERT writes it: x * 0.5 * (1 + erf(x * (1 / sqrt 2)))
        half = g.emit("multiply", [x, scalar("half", 0.5)], {}, "half")
        scaled = g.emit("multiply", [scalar("inv", 1 / math.sqrt(2)), x], {}, "scale")
        plus = g.emit("add", [scalar("one", 1.0), g.emit("erf", [scaled], {}, "erf")], {}, "add")
        y = g.emit("multiply", [half, plus], {}, "out", "y")
    graph = g.finish([y])
    fused = eliminate_dead_code(fuse_gelu(graph))
    assert [(n.op, n.inputs, n.output) for n in fused.nodes] == [("gelu", ("x",), "y")] and not fused.constants
    feed = {"x": (rng.standard_normal((3, 5)) * 3).astype(dtype)}
    close = dict(rtol=2e-3, atol=2e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-6)  # a rounding a step
    np.testing.assert_allclose(run_reference(fused, feed)["y"].astype("float32"),
                               run_reference(graph, feed)["y"].astype("float32"), **close)


def linear_3d(g, x, width, name):
    """A 3-D MatMul with bias as the ONNX importer emits it: dense on the rows, reshaped back, then the add."""
    batch, rows, depth = g.values[x].shape
    flat = g.emit("reshape", [x], {"newshape": (batch * rows, depth)}, f"{name}_rows")
    weight = g.add_constant(f"{name}_w", np.full((width, depth), 0.1, "float32"))
    product = g.emit("dense", [flat, weight], {}, f"{name}_dense")
    shaped = g.emit("reshape", [product], {"newshape": (batch, rows, width)}, f"{name}_shaped")
    return g.emit("add", [g.add_constant(f"{name}_b", np.arange(width, dtype="float32")), shaped], {}, f"{name}_bias")


def test_sink_reshapes_fuses_bias_gelu_and_residual_into_the_dense(rng):
    g = GraphBuilder()
    x = g.add_input("x", (1, 4, 6), "float32")
    h = g.emit("gelu", [linear_3d(g, x, 8, "up")], {"approximate": "none"}, "gelu")
    y = g.emit("add", [x, linear_3d(g, h, 6, "down")], {}, "residual", output="y")
    graph = g.finish([y])
    sunk = eliminate_dead_code(sink_reshapes(graph))
    fused = [s.ops for s in partition(sunk)]
    assert fused == ["reshape", "dense+add+gelu", "reshape", "reshape", "reshape", "dense+add+add", "reshape"]
    assert sunk.values["y"].shape == (1, 4, 6)
    feed = {"x": rng.standard_normal((1, 4, 6)).astype("float32")}
    np.testing.assert_allclose(run_reference(sunk, feed)["y"], run_reference(graph, feed)["y"], rtol=1e-6)


def test_a_reshape_stays_where_an_operand_varies_along_an_axis_it_changes_or_another_node_reads_it():
    g = GraphBuilder()
    x = g.add_input("x", (4, 6), "float32")
    shaped = g.emit("reshape", [x], {"newshape": (2, 12)}, "shaped")
    y = g.emit("add", [shaped, g.add_constant("row", np.ones(12, "float32"))], {}, "add", output="y")
    assert sink_reshapes(g.finish([y])).nodes == g.finish([y]).nodes  # 12 spans the rows of 6
    z = g.emit("relu", [shaped], {}, "relu", output="z")
    assert [n.op for n in sink_reshapes(g.finish([y, z])).nodes] == ["reshape", "add", "relu"]  # read twice


def test_eliminate_dead_code_keeps_only_what_the_outputs_need(rng):
    g = GraphBuilder()
    x = g.add_input("x", (4,), "float32")
    unused = g.add_constant("unused", np.ones(4, "float32"))
    dead = g.emit("add", [x, unused], {}, "dead")
    g.emit("relu", [dead], {}, "dead_too")
    y = g.emit("sigmoid", [x], {}, "live", output="y")
    graph = eliminate_dead_code(g.finish([y]))
    assert [n.name for n in graph.nodes] == ["live"] and not graph.constants
    assert set(graph.values) == {"x", "y"} and [v.name for v in graph.inputs] == ["x"]
    assert graph.producer("y").name == "live" and graph.consumers("x") == graph.nodes
