"""The operators of the wider ONNX coverage (comparisons and logic, Where, Mod, variadic Sum/Mean/Max/Min,
rounding, the activations, CastLike, Range, ArgMax/ArgMin, CumSum, Trilu, GatherElements, the sum-based
reductions, Instance/Group/RMS normalization and LRN), each in a small model built with onnx.helper,
match onnxruntime through the reference runner; one model of them also compiled."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_ops import build_model, case, compiled_outputs, feeds_for, ints, onnxruntime_outputs, w  # noqa: E402

from tilecraft.frontend import UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def scalar(value, dtype="float32"):
    return np.array(value, dtype)


ACTIVATIONS = [("Elu", {"alpha": 0.5}), ("Selu", {}), ("Celu", {"alpha": 2.0}), ("LeakyRelu", {"alpha": 0.2}),
               ("ThresholdedRelu", {"alpha": 0.3}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
               ("Softplus", {}), ("Softsign", {}), ("Mish", {}), ("Shrink", {"lambd": 0.6, "bias": 0.2})]

CASES = {
    "comparisons_logic_where": case([
        N("Less", ["a", "b"], ["l"]), N("GreaterOrEqual", ["a", "c"], ["g"]), N("Xor", ["l", "g"], ["x"]),
        N("Not", ["x"], ["n"]), N("Or", ["n", "l"], ["o"]), N("And", ["o", "g"], ["an"]),
        N("Greater", ["b", "c"], ["gt"]), N("LessOrEqual", ["c", "a"], ["le"]), N("Or", ["gt", "le"], ["either"]),
        N("Where", ["an", "a", "b"], ["y1"]), N("Where", ["either", "c", "a"], ["y2"])],
        {"a": (2, 3, 4), "b": (4,), "c": (3, 1)}),
    "floor_ceil_sign_equal": case([
        N("Floor", ["a"], ["f"]), N("Ceil", ["b"], ["c"]), N("Equal", ["f", "c"], ["e"]), N("Sign", ["a"], ["s"]),
        N("Where", ["e", "s", "f"], ["y"])], {"a": (3, 5), "b": (5,)}),
    "variadic_sum_mean_max_min": case([
        N("Sum", ["a", "b", "c"], ["s"]), N("Mean", ["a", "b", "c"], ["m"]), N("Max", ["a", "b"], ["x"]),
        N("Min", ["a", "b", "c"], ["n"]), N("Sum", ["s", "m", "x", "n"], ["y1"]), N("Max", ["a"], ["y2"])],
        {"a": (2, 3, 4), "b": (4,), "c": (3, 1)}),
    "variadic_max_opset7": case([N("Max", ["a", "b", "c"], ["y"])], {"a": (3, 4), "b": (3, 4), "c": (3, 4)},
                                opset=7),
    "mod_fmod_float": case([N("Mod", ["a", "b"], ["y"], fmod=1)], {"a": (4, 5)}, {"b": scalar([1.5, -2.0, 0.7, 3.0,
                                                                                              -0.4])}),
    "mod_integer_sign_of_divisor": case([N("Mod", ["i", "d"], ["y1"]), N("Mod", ["i", "d"], ["y2"], fmod=1)],
                                        {"i": ((3, 4), INT64)}, {"d": ints(3, -4, 5, -2)}, out_dtype=INT64),
    "activations": case([N(op, ["x"], [f"y_{op}"], **attrs) for op, attrs in ACTIVATIONS]
                        + [N("PRelu", ["x", "slope"], ["y_prelu"])], {"x": (2, 3, 5)}, {"slope": w(3, 1)}, opset=18),
    "cast_like_range": case([N("Range", ["start", "limit", "delta"], ["r"]), N("Add", ["x", "r"], ["a"]),
                             N("CastLike", ["a", "like"], ["y"])], {"x": (2, 4)},
                            {"start": scalar(0.5), "limit": scalar(4.0), "delta": scalar(0.9),
                             "like": np.zeros(1, "int64")}, out_dtype=INT64),
    "argmax_argmin": case([N("ArgMax", ["x"], ["y1"], axis=1, keepdims=0),
                           N("ArgMin", ["x"], ["y2"], axis=-1, select_last_index=1)],
                          {"x": (3, 4, 5)}, out_dtype=INT64),
    "cumsum_trilu_gather_elements": case([
        N("CumSum", ["x", "axis"], ["y1"], exclusive=1, reverse=1), N("CumSum", ["x", "axis"], ["y2"]),
        N("Trilu", ["x", "k"], ["y3"], upper=0), N("Trilu", ["x"], ["y4"]),
        N("GatherElements", ["x", "i"], ["y5"], axis=1)], {"x": (2, 4, 3)},
        {"axis": ints(1), "k": ints(-1), "i": np.array([[[0, -1, 2], [3, 1, 0]]] * 2, "int64")}, opset=17),
    "sum_based_reductions": case([
        N("ReduceL1", ["x", "a"], ["y1"]), N("ReduceL2", ["x", "a"], ["y2"], keepdims=0),
        N("ReduceSumSquare", ["x"], ["y3"]), N("ReduceLogSum", ["x", "a"], ["y4"]),
        N("ReduceLogSumExp", ["x", "a"], ["y5"])], {"x": (2, 3, 4)}, {"a": ints(-1, 0)}, opset=18, positive=True),
    "reductions_with_axes_attributes_opset13": case([
        N("ReduceL2", ["x"], ["y1"], axes=[1]), N("ReduceLogSumExp", ["x"], ["y2"], axes=[0, 2], keepdims=0)],
        {"x": (2, 3, 4)}, opset=13),
    "instance_norm": case([N("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], {"x": (2, 3, 4, 5)},
                          {"s": w(3), "b": w(3)}),
    "group_norm_per_group_scale_opset18": case([N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
                                               {"x": (2, 4, 3, 3)}, {"s": w(2), "b": w(2)}, opset=18),
    "group_norm_per_channel_scale_opset21": case([N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2,
                                                   epsilon=1e-3)], {"x": (2, 4, 5)}, {"s": w(4), "b": w(4)}, opset=21),
    "rms_norm": case([N("RMSNormalization", ["x", "s"], ["y"], axis=-2)], {"x": (2, 3, 4)}, {"s": w(3, 4)},
                     opset=23),
    "lrn": case([N("LRN", ["x"], ["y"], size=3, alpha=0.01, beta=0.6, bias=2.0)], {"x": (2, 6, 4, 3)}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_onnxruntime(name):
    nodes, inputs, consts, opset, positive, out_dtype = CASES[name]
    model, outputs = build_model(nodes, inputs, consts, opset, out_dtype)
    feeds = feeds_for(model, positive)
    expected = onnxruntime_outputs(model, outputs, feeds)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, expected):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype, output
        np.testing.assert_allclose(got[output], want, rtol=1e-3, atol=1e-5, err_msg=output)


def test_new_kernels_compile_and_match_onnxruntime(kernel_cache):
    nodes, inputs, _, opset, positive, out_dtype = CASES["comparisons_logic_where"]
    nodes = nodes + [N("CumSum", ["y1", "axis"], ["cs"]), N("ArgMax", ["y2"], ["am"], axis=2),
                     N("Cast", ["am"], ["amf"], to=FLOAT), N("Elu", ["cs"], ["e"]), N("Add", ["e", "amf"], ["y3"])]
    model, outputs = build_model(nodes, inputs, {"axis": ints(1)}, opset, out_dtype)
    feeds = feeds_for(model, positive)
    got = compiled_outputs(model, feeds, kernel_cache)
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, feeds)):
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


def test_lrn_of_an_even_size_sums_more_channels_after_than_before():
    """onnxruntime refuses an even size; the ONNX spec sums channels c - floor((size-1)/2) to c + ceil((size-1)/2)."""
    x = np.random.default_rng(0).standard_normal((1, 5, 3, 2)).astype("float32")
    model = graph_of([N("LRN", ["x"], ["y"], size=4, alpha=0.1, beta=0.5, bias=1.5)], x.shape, [("y", FLOAT)])
    padded = np.pad(x**2, [(0, 0), (1, 2), (0, 0), (0, 0)])
    square_sum = sum(padded[:, k:k + 5] for k in range(4))
    expected = x / (1.5 + 0.1 / 4 * square_sum) ** 0.5
    np.testing.assert_allclose(run_reference(from_onnx(model), {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def graph_of(nodes, x_shape, outputs, opset=17):
    graph = helper.make_graph(nodes, "model", [helper.make_tensor_value_info("x", FLOAT, x_shape)],
                              [helper.make_tensor_value_info(name, dtype, None) for name, dtype in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_dropout_mask_of_inference_keeps_every_element():
    model = graph_of([N("Dropout", ["x"], ["y", "mask"])], (2, 3), [("y", FLOAT), ("mask", BOOL)])
    x = np.arange(6, dtype="float32").reshape(2, 3)
    got = run_reference(from_onnx(model), {"x": x})
    np.testing.assert_array_equal(got["y"], x)
    assert got["mask"].dtype == np.bool_ and got["mask"].all() and got["mask"].shape == (2, 3)


def test_an_unread_indices_output_of_max_pool_is_no_reason_to_refuse():
    model = graph_of([N("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 2])], (1, 1, 4, 4), [("y", FLOAT)])
    x = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(run_reference(from_onnx(model), {"x": x})["y"], x[:, :, 1:, 1:])


@pytest.mark.parametrize("nodes, outputs, opset, refusal", [
    ([N("BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "mean", "var"], training_mode=1)], [("y", FLOAT)], 17,
     r"\(BatchNormalization, opset 17\): training mode \(the running statistics outputs\) is not supported"),
    ([N("BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "mean", "var"])], [("y", FLOAT), ("mean", FLOAT)], 17,
     r"\(BatchNormalization, opset 17\): training mode"),
    ([N("BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "mean", "var", "saved_mean", "saved_var"])],
     [("y", FLOAT)], 9, r"\(BatchNormalization, opset 9\): training mode"),  # before opset 14 the outputs say so
])
def test_outputs_only_training_gives_are_refused_naming_node_and_operator(nodes, outputs, opset, refusal):
    model = graph_of(nodes, (1, 1, 4, 4), outputs, opset)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(1, "float32"), "s"))
    with pytest.raises(UnsupportedOperatorError, match=refusal):
        from_onnx(model)


def test_an_empty_range_is_refused_naming_the_node():
    model = graph_of([N("Range", ["a", "a", "a"], ["r"], name="steps"), N("Add", ["x", "r"], ["y"])], (2,),
                     [("y", FLOAT)])
    model.graph.initializer.append(numpy_helper.from_array(scalar(1.0), "a"))
    with pytest.raises(UnsupportedOperatorError, match=r"node steps \(Range, opset 17\): an empty range"):
        from_onnx(model)
