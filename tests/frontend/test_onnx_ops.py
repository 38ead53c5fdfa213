"""Every supported ONNX operator, in a small model built with onnx.helper, matches onnxruntime."""

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tilecraft.frontend import from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402
from tilecraft.model.compiled import DefaultScheduleWarning, compile_model  # noqa: E402

N = helper.make_node
R = np.random.default_rng(7)


def w(*shape):
    return R.standard_normal(shape).astype("float32")


def ints(*values):
    return np.array(values, "int64")


def case(nodes, inputs, consts=None, opset=17, positive=False, out_dtype=TensorProto.FLOAT):
    """A model of ``nodes``: ``inputs`` maps names to shapes (or (shape, dtype)), outputs are the values named y*."""
    return nodes, inputs, consts or {}, opset, positive, out_dtype


CASES = {
    "conv_bias_pads_strides": case([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 2, 1], strides=[2, 1])],
                                   {"x": (1, 3, 9, 8)}, {"w": w(4, 3, 3, 3), "b": w(4)}),
    "conv_same_upper": case([N("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
                            {"x": (2, 2, 7, 6)}, {"w": w(3, 2, 3, 2)}),
    "conv_dilated": case([N("Conv", ["x", "w"], ["y"], dilations=[2, 1], pads=[2, 0, 1, 1])],
                         {"x": (1, 2, 7, 6)}, {"w": w(3, 2, 3, 2)}),
    "conv_grouped": case([N("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])],
                         {"x": (1, 4, 5, 5)}, {"w": w(6, 2, 3, 3)}),
    "conv_depthwise": case([N("Conv", ["x", "w", "b"], ["y"], group=3, pads=[1, 1, 1, 1])],
                           {"x": (1, 3, 6, 6)}, {"w": w(6, 1, 3, 3), "b": w(6)}),
    "conv_runtime_weight": case([N("Conv", ["x", "k"], ["y"])], {"x": (1, 2, 5, 5), "k": (3, 2, 2, 2)}),
    "conv_transpose": case([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 1, 1],
                              output_padding=[1, 0])], {"x": (1, 3, 4, 5)}, {"w": w(3, 2, 3, 3), "b": w(2)}),
    "conv_transpose_output_shape": case([N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                                           output_shape=[9, 10])], {"x": (1, 2, 4, 4)}, {"w": w(2, 3, 3, 3)}),
    "gemm_alpha_beta_transA": case([N("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=1)],
                                   {"a": (4, 3)}, {"b": w(4, 5), "c": w(5)}),
    "gemm_runtime_b": case([N("Gemm", ["a", "b", "c"], ["y"], transB=1)], {"a": (3, 4), "b": (5, 4), "c": (3, 5)}),
    "matmul_weight": case([N("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 4)}, {"b": w(4, 5)}),
    "matmul_batched_broadcast": case([N("MatMul", ["a", "b"], ["y"])], {"a": (2, 1, 3, 4), "b": (1, 3, 4, 5)}),
    "matmul_vector": case([N("MatMul", ["a", "b"], ["y"])], {"a": (4,), "b": (2, 4, 3)}),
    "matmul_matrix_vector": case([N("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 4), "b": (4,)}),
    "batch_norm": case([N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
                       {"x": (2, 3, 4)}, {"s": w(3), "b": w(3), "m": w(3), "v": np.abs(w(3)) + 0.5}),
    "relu_sigmoid_tanh": case([N("Relu", ["x"], ["r"]), N("Sigmoid", ["x"], ["s"]), N("Tanh", ["x"], ["t"]),
                               N("Add", ["r", "s"], ["u"]), N("Add", ["u", "t"], ["y"])],
                              {"x": (3, 5)}),
    "clip_inputs": case([N("Clip", ["x", "lo", "hi"], ["y"])], {"x": (4, 5)},
                        {"lo": np.array(-0.3, "float32"), "hi": np.array(0.4, "float32")}),
    "clip_max_only": case([N("Clip", ["x", "", "hi"], ["y"])], {"x": (4, 5)}, {"hi": np.array(0.1, "float32")}),
    "clip_attributes": case([N("Clip", ["x"], ["y"], min=-0.2, max=0.5)], {"x": (6,)}, opset=10),
    "gelu": case([N("Gelu", ["x"], ["y"])], {"x": (3, 7)}, opset=20),
    "gelu_tanh": case([N("Gelu", ["x"], ["y"], approximate="tanh")], {"x": (3, 7)}, opset=20),
    "erf_exp_log_abs_neg": case([N("Erf", ["x"], ["e"]), N("Abs", ["e"], ["a"]), N("Log", ["a"], ["l"]),
                                 N("Exp", ["l"], ["p"]), N("Neg", ["p"], ["y"])], {"x": (2, 6)}),
    "softmax": case([N("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 4)}),
    "softmax_opset11_coerces_to_2d": case([N("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 4)}, opset=11),
    "log_softmax": case([N("LogSoftmax", ["x"], ["y"])], {"x": (2, 5)}),
    "layer_norm": case([N("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-3)], {"x": (2, 3, 8)},
                       {"g": w(8), "b": w(8)}),
    "layer_norm_two_axes_no_bias": case([N("LayerNormalization", ["x", "g"], ["y"], axis=1)], {"x": (2, 3, 4)},
                                        {"g": w(3, 4)}),
    "arithmetic_broadcast": case([N("Add", ["a", "b"], ["s"]), N("Sub", ["s", "c"], ["d"]), N("Mul", ["d", "b"], ["m"]),
                                  N("Div", ["m", "c"], ["y"])], {"a": (2, 3, 4), "b": (4,), "c": (3, 1)},
                                 positive=True),
    "pow_sqrt_reciprocal": case([N("Pow", ["x", "e"], ["p"]), N("Sqrt", ["p"], ["s"]), N("Reciprocal", ["s"], ["y"])],
                                {"x": (3, 4)}, {"e": np.array(3.0, "float32")}, positive=True),
    "reshape": case([N("Reshape", ["x", "s"], ["y"])], {"x": (2, 3, 4)}, {"s": ints(0, -1, 2)}),
    "flatten": case([N("Flatten", ["x"], ["y"], axis=2)], {"x": (2, 3, 4, 5)}),
    "transpose": case([N("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": (2, 3, 4)}),
    "concat": case([N("Concat", ["a", "b", "c"], ["y"], axis=-1)], {"a": (2, 3), "b": (2, 1), "c": (2, 4)}),
    "split_input_sizes": case([N("Split", ["x", "s"], ["y1", "y2"], axis=1)], {"x": (2, 5)}, {"s": ints(2, 3)}),
    "split_attribute_opset11": case([N("Split", ["x"], ["y1", "y2", "y3"], axis=0)], {"x": (6, 2)}, opset=11),
    "split_num_outputs_opset18": case([N("Split", ["x"], ["y1", "y2", "y3"], axis=1, num_outputs=3)], {"x": (2, 7)},
                                      opset=18),
    "slice_negative_steps": case([N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": (4, 6, 5)},
                                 {"st": ints(-1, 0), "en": ints(-100, 5), "ax": ints(1, 2), "sp": ints(-2, 2)}),
    "slice_attributes_opset9": case([N("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, 1000], axes=[0, 1])],
                                    {"x": (4, 6)}, opset=9),
    "gather_embedding": case([N("Gather", ["table", "ids"], ["y"])], {"ids": ((2, 3), TensorProto.INT64)},
                             {"table": w(10, 4)}),
    "gather_negative_axis1": case([N("Gather", ["x", "i"], ["y"], axis=1)], {"x": (3, 5, 2)}, {"i": ints(-1, 0, 3)}),
    "gather_scalar_index": case([N("Gather", ["x", "i"], ["y"])], {"x": (3, 4, 5)}, {"i": np.array(1, "int64")}),
    "gather_run_axis1": case([N("Gather", ["x", "i"], ["y"], axis=1)], {"x": (2, 5, 3)}, {"i": ints(-3, -2)}),
    "squeeze_unsqueeze": case([N("Squeeze", ["x", "a"], ["s"]), N("Unsqueeze", ["s", "b"], ["y"])],
                              {"x": (2, 1, 3, 1)}, {"a": ints(1, -1), "b": ints(0, 3)}),
    "squeeze_unsqueeze_attributes_opset11": case([N("Squeeze", ["x"], ["s"], axes=[1]),
                                                  N("Unsqueeze", ["s"], ["y"], axes=[-1])], {"x": (2, 1, 3)},
                                                 opset=11),
    "max_pool_ceil_mode": case([N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                  ceil_mode=1)], {"x": (1, 2, 8, 7)}),
    "avg_pool_count_include_pad": case([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 1, 1, 0],
                                          count_include_pad=1)], {"x": (1, 2, 5, 5)}),
    "avg_pool_same_lower": case([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                   auto_pad="SAME_LOWER")], {"x": (1, 2, 6, 7)}),
    "global_pools": case([N("GlobalAveragePool", ["x"], ["a"]), N("GlobalMaxPool", ["x"], ["m"]),
                          N("Add", ["a", "m"], ["y"])], {"x": (2, 3, 4, 5)}),
    "reduce_mean_max_opset18": case([N("ReduceMean", ["x", "a"], ["m"]), N("ReduceMax", ["x", "a"], ["y2"],
                                                                             keepdims=0),
                                     N("Add", ["m", "m"], ["y1"])], {"x": (2, 3, 4)}, {"a": ints(-1, 0)}, opset=18),
    "reduce_sum_opset13_all_axes": case([N("ReduceSum", ["x"], ["y"], keepdims=0)], {"x": (2, 3, 4)}, opset=13),
    "reduce_mean_attribute_opset13": case([N("ReduceMean", ["x"], ["y"], axes=[1])], {"x": (2, 3, 4)}, opset=13),
    "pad": case([N("Pad", ["x", "p", "v"], ["y"])], {"x": (2, 3)},
                {"p": ints(1, 0, 2, 3), "v": np.array(1.5, "float32")}),
    "pad_attributes_opset10": case([N("Pad", ["x"], ["y"], pads=[0, 1, 1, 0], value=-1.0)], {"x": (2, 3)}, opset=10),
    "cast": case([N("Mul", ["x", "k"], ["m"]), N("Cast", ["m"], ["y"], to=TensorProto.INT32)], {"x": (3, 4)},
                 {"k": np.array(10.0, "float32")}, out_dtype=TensorProto.INT32),
    "shape_constant_of_shape_expand": case([N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["c"],
                                                                        value=numpy_helper.from_array(
                                                                            np.array([2.0], "float32"))),
                                            N("Mul", ["x", "c"], ["m"]), N("Expand", ["m", "e"], ["y"])],
                                           {"x": (3, 1)}, {"e": ints(2, 1, 4)}),
    "constant_identity_dropout": case([N("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
                                       N("Identity", ["x"], ["i"]), N("Dropout", ["i"], ["d"]),
                                       N("Add", ["d", "c"], ["y"])], {"x": (2, 3)}),
}


def build_model(nodes, inputs, consts, opset, out_dtype):
    infos = []
    for name, spec in inputs.items():
        shape, dtype = spec if isinstance(spec[0], tuple) else (spec, TensorProto.FLOAT)
        infos.append(helper.make_tensor_value_info(name, dtype, shape))
    outputs = [o for node in nodes for o in node.output if o.startswith("y")]
    graph = helper.make_graph(nodes, "model", infos, [helper.make_tensor_value_info(o, out_dtype, None)
                                                       for o in outputs],
                              [numpy_helper.from_array(value, name) for name, value in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, outputs


def feeds_for(model, positive):
    rng = np.random.default_rng(0)
    feeds = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[info.name] = rng.integers(0, 10, shape).astype("int64")
        else:
            low = 0.5 if positive else -2.0
            feeds[info.name] = rng.uniform(low, 2.0, shape).astype("float32")
    return feeds


def onnxruntime_outputs(model, outputs, feeds):
    """onnxruntime's ``outputs`` of ``model`` on ``feeds``."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(outputs, feeds)


def compiled_outputs(model, feeds, cache_dir):
    """``model`` compiled to native kernels on default schedules (their warning silenced), run on ``feeds``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return compile_model(from_onnx(model), cache_dir=cache_dir).run(feeds)


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_onnxruntime(name):
    nodes, inputs, consts, opset, positive, out_dtype = CASES[name]
    model, outputs = build_model(nodes, inputs, consts, opset, out_dtype)
    feeds = feeds_for(model, positive)
    expected = onnxruntime_outputs(model, outputs, feeds)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, expected):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype
        np.testing.assert_allclose(got[output], want, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name, slices", [("gather_scalar_index", True), ("gather_run_axis1", True),
                                          ("gather_negative_axis1", False), ("gather_embedding", False)])
def test_a_gather_of_one_run_of_constant_positions_is_a_slice(name, slices):
    """A slice reads no indices, and the kernels after it read it where it lies."""
    nodes, inputs, consts, opset, _, out_dtype = CASES[name]
    ops = {node.op for node in from_onnx(build_model(nodes, inputs, consts, opset, out_dtype)[0]).nodes}
    assert ("strided_slice" in ops, "take" in ops) == (slices, not slices), ops
