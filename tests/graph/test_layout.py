"""convert_layout: convolutions and pools in NHWC, the same outputs, transposes only at the edges."""

import numpy as np

from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.layout import convert_layout
from tilecraft.graph.reference import run_reference


def small_cnn():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("input", (1, 3, 10, 10), "float32")
    w1 = b.add_constant("w1", rng.standard_normal((8, 3, 3, 3)).astype("float32"))
    bias = b.add_constant("bias", rng.standard_normal((8, 1, 1)).astype("float32"))
    dw = b.add_constant("dw", rng.standard_normal((8, 1, 3, 3)).astype("float32"))
    scale = b.add_constant("scale", np.float32(0.5))
    y = b.emit("conv2d", [x, w1], {"stride": 1, "padding": 1}, "conv1")
    y = b.emit("relu", [b.emit("add", [y, bias], {}, "bias1")], {}, "relu1")
    pooled = b.emit("max_pool2d", [y], {"kernel": 3, "stride": 2, "padding": 1}, "pool")
    z = b.emit("depthwise_conv2d", [pooled, dw], {"stride": 1, "padding": 1}, "dw")
    z = b.emit("multiply", [b.emit("add", [z, pooled], {}, "residual"), scale], {}, "scaled")
    z = b.emit("global_avg_pool2d", [z], {}, "gap")
    out = b.emit("reshape", [z], {"newshape": (1, 8)}, "flatten")
    return b.finish([out])


def test_convolutions_and_pools_become_nhwc_with_the_same_outputs():
    graph = small_cnn()
    converted = convert_layout(graph)
    ops = [n.op for n in converted.nodes]
    assert "conv2d" not in ops and "depthwise_conv2d" not in ops
    assert ops.count("conv2d_nhwc") == 1 and ops.count("depthwise_conv2d_nhwc") == 1
    assert all(n.attrs.get("layout") == "NHWC" for n in converted.nodes if "pool" in n.op)
    assert ops.count("transpose") == 2  # the input, and before the layout-dependent reshape
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 10)).astype("float32")
    expected = run_reference(graph, {"input": x})[converted.outputs[0]]
    np.testing.assert_allclose(run_reference(converted, {"input": x})[converted.outputs[0]], expected, rtol=1e-5,
                               atol=1e-5)


def test_graphs_without_convolutions_are_unchanged():
    b = GraphBuilder()
    x = b.add_input("x", (4, 6), "float32")
    graph = b.finish([b.emit("softmax", [b.emit("relu", [x], {}, "r")], {"axis": -1}, "s")])
    assert [n.op for n in convert_layout(graph).nodes] == ["relu", "softmax"]


def branchy_cnn():
    """An inception block (two branches concatenated) whose output is split in two again by
    slices along the channels, each half convolved, and the halves concatenated (a dense block's
    shape), then normalized before the head's convolution (a pre-activation network's)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("input", (1, 4, 8, 8), "float32")

    def conv(name, source, channels_in, channels_out, kernel):
        weights = b.add_constant(f"{name}_w", rng.standard_normal((channels_out, channels_in, kernel, kernel))
                                 .astype("float32"))
        return b.emit("relu", [b.emit("conv2d", [source, weights], {"stride": 1, "padding": kernel // 2}, name)],
                      {}, f"{name}_relu")

    joined = b.emit("concat", [conv("a", x, 4, 6, 1), conv("b", x, 4, 2, 3)], {"axis": 1}, "inception")
    low = b.emit("strided_slice", [joined], {"begin": (0,), "end": (4,), "axes": (1,)}, "low")
    high = b.emit("strided_slice", [joined], {"begin": (4,), "end": (8,), "axes": (-3,)}, "high")
    dense = b.emit("concat", [conv("c", low, 4, 4, 3), high, conv("d", high, 4, 4, 1)], {"axis": -3}, "dense")
    params = [b.add_constant(f"bn_{p}", rng.uniform(0.5, 1.5, 12).astype("float32")) for p in "gbmv"]
    normed = b.emit("batch_norm", [dense, *params], {"epsilon": 1e-5, "axis": 1}, "bn")  # before the head's conv
    return b.finish([conv("head", normed, 12, 5, 1)])


def test_the_layout_goes_through_concatenations_and_slices_so_transposes_stay_at_the_edges():
    graph = branchy_cnn()
    converted = convert_layout(graph)
    transposes = [n for n in converted.nodes if n.op == "transpose"]
    assert all(n.inputs == ("input",) for n in transposes[:-1]) and transposes[-1].output == graph.outputs[0]
    concats = [n for n in converted.nodes if n.op == "concat"]
    assert [n.attrs["axis"] for n in concats] == [3, 3]
    assert [n.attrs["axes"] for n in converted.nodes if n.op == "strided_slice"] == [(3,), (3,)]
    assert [n.attrs["axis"] for n in converted.nodes if n.op == "batch_norm"] == [3]
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")
    expected = run_reference(graph, {"input": x})[graph.outputs[0]]
    np.testing.assert_allclose(run_reference(converted, {"input": x})[graph.outputs[0]], expected, rtol=1e-5,
                               atol=1e-5)
