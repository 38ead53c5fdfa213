"""Tiny ONNX models built with onnx.helper for the whole-model tests: a CNN and a transformer block."""

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

N = helper.make_node


def _model(nodes, inputs, outputs, weights):
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"), name)
                    for name, (shape, scale) in weights.items()]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def tiny_cnn():
    """conv+bias+bn+relu, maxpool, a residual block (its input read twice), global pool, flatten, gemm."""
    nodes = [
        N("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["bn"]),
        N("Relu", ["bn"], ["r1"]),
        N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        N("Relu", ["c2"], ["r2"]),
        N("Add", ["r2", "p1"], ["res"]),
        N("Relu", ["res"], ["r3"]),
        N("GlobalAveragePool", ["r3"], ["g"]),
        N("Flatten", ["g"], ["f"]),
        N("Gemm", ["f", "wfc", "bfc"], ["output"], transB=1),
    ]
    weights = {"w1": ((8, 3, 3, 3), 0.3), "b1": ((8,), 0.1), "gamma": ((8,), 0.2), "beta": ((8,), 0.1),
               "mean": ((8,), 0.1), "var": ((8,), 0.0), "w2": ((8, 8, 3, 3), 0.2), "wfc": ((10, 8), 0.3),
               "bfc": ((10,), 0.1)}
    model = _model(nodes, [("input", [1, 3, 8, 8])], ["output"], weights)
    var = next(t for t in model.graph.initializer if t.name == "var")
    var.CopyFrom(numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype("float32"), "var"))
    return model


def tiny_transformer(seq=4, dim=16, heads=2):
    """A pre-norm encoder layer: layernorm, attention (reshape/transpose, batched matmuls, softmax), GELU MLP."""
    hd = dim // heads
    nodes = [N("LayerNormalization", ["input", "ln1_g", "ln1_b"], ["ln1"], axis=-1)]
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [N("MatMul", ["ln1", f"w{name}"], [f"{name}0"]), N("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                  N("Reshape", [f"{name}1", "heads_shape"], [f"{name}2"]),
                  N("Transpose", [f"{name}2"], [f"{name}3"], perm=perm)]
    nodes += [
        N("MatMul", ["q3", "k3"], ["s0"]), N("Div", ["s0", "scale"], ["s1"]), N("Softmax", ["s1"], ["s2"], axis=-1),
        N("MatMul", ["s2", "v3"], ["a0"]), N("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["a1", "model_shape"], ["a2"]), N("MatMul", ["a2", "wo"], ["o0"]), N("Add", ["o0", "bo"], ["o1"]),
        N("Add", ["input", "o1"], ["h"]),
        N("LayerNormalization", ["h", "ln2_g", "ln2_b"], ["ln2"], axis=-1),
        N("MatMul", ["ln2", "w1"], ["m0"]), N("Add", ["m0", "b1"], ["m1"]),
        N("Div", ["m1", "sqrt2"], ["g0"]), N("Erf", ["g0"], ["g1"]), N("Add", ["g1", "one"], ["g2"]),
        N("Mul", ["m1", "g2"], ["g3"]), N("Mul", ["g3", "half"], ["g4"]),
        N("MatMul", ["g4", "w2"], ["m2"]), N("Add", ["m2", "b2"], ["m3"]), N("Add", ["h", "m3"], ["output"]),
    ]
    weights = {**{f"w{n}": ((dim, dim), 0.3) for n in "qkvo"}, **{f"b{n}": ((dim,), 0.1) for n in "qkvo"},
               "ln1_g": ((dim,), 0.5), "ln1_b": ((dim,), 0.1), "ln2_g": ((dim,), 0.5), "ln2_b": ((dim,), 0.1),
               "w1": ((dim, 2 * dim), 0.3), "b1": ((2 * dim,), 0.1), "w2": ((2 * dim, dim), 0.3), "b2": ((dim,), 0.1)}
    model = _model(nodes, [("input", [1, seq, dim])], ["output"], weights)
    for name, value in (("heads_shape", np.array([1, seq, heads, hd], "int64")),
                        ("model_shape", np.array([1, seq, dim], "int64")), ("scale", np.float32(math.sqrt(hd))),
                        ("sqrt2", np.float32(math.sqrt(2))), ("one", np.float32(1)), ("half", np.float32(0.5))):
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return model
