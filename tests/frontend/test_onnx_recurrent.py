"""RNN, GRU and LSTM, unrolled over time at import, match onnxruntime: every direction and layout, biases, initial
states, peepholes, clip, activations with their parameters, and sequences of different lengths; one model
compiled; and the clear refusals (lengths known only at run time, an activation the standard does not allow)."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx_ops import build_model, compiled_outputs, feeds_for, onnxruntime_outputs  # noqa: E402

from tilecraft.frontend import RuntimeInputError, UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
RNG = np.random.default_rng(3)
STEPS, BATCH, WIDTH, HIDDEN = 4, 3, 5, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def weights(op, directions=1, bias=True, peepholes=False):
    """The constant W, R (and B, P) of a layer, named as the node's inputs."""
    gates = GATES[op] * HIDDEN
    consts = {"W": RNG.standard_normal((directions, gates, WIDTH)).astype("float32") * 0.5,
              "R": RNG.standard_normal((directions, gates, HIDDEN)).astype("float32") * 0.5}
    if bias:
        consts["B"] = RNG.standard_normal((directions, 2 * gates)).astype("float32")
    if peepholes:
        consts["P"] = RNG.standard_normal((directions, 3 * HIDDEN)).astype("float32")
    return consts


def layer(op, inputs, outputs=("y", "y_h"), **attrs):
    return N(op, list(inputs), list(outputs), hidden_size=HIDDEN, **attrs)


LENGTHS = {"lengths": np.array([4, 2, 1], "int32")}
STATE = (2, BATCH, HIDDEN)  # the initial states of a bidirectional layer, layout 0

CASES = {
    "rnn_bidirectional_layout1_activations_with_parameters": (
        layer("RNN", ["x", "W", "R", "B", "", "h0"], direction="bidirectional", layout=1,
              activations=["LeakyRelu", "ScaledTanh"], activation_alpha=[0.2, 0.7], activation_beta=[1.3]),
        {"x": (BATCH, STEPS, WIDTH), "h0": (BATCH, 2, HIDDEN)}, weights("RNN", 2)),
    "rnn_reverse_without_bias_affine": (
        layer("RNN", ["x", "W", "R"], direction="reverse", activations=["Affine"], activation_alpha=[0.5],
              activation_beta=[0.1]),
        {"x": (STEPS, BATCH, WIDTH)}, weights("RNN", bias=False)),
    "gru_linear_before_reset_bidirectional_clip": (
        layer("GRU", ["x", "W", "R", "B", "", "h0"], direction="bidirectional", linear_before_reset=1, clip=0.8),
        {"x": (STEPS, BATCH, WIDTH), "h0": STATE}, weights("GRU", 2)),
    "gru_reset_before_product_reverse_lengths": (
        layer("GRU", ["x", "W", "R", "B", "lengths"], direction="reverse"),
        {"x": (STEPS, BATCH, WIDTH)}, {**weights("GRU"), **LENGTHS}),
    "gru_activations_layout1_lengths": (
        layer("GRU", ["x", "W", "R", "B", "lengths"], layout=1, activations=["HardSigmoid", "Softsign"],
              activation_alpha=[0.3], activation_beta=[0.4]),
        {"x": (BATCH, STEPS, WIDTH)}, {**weights("GRU"), **LENGTHS}),
    "lstm_bidirectional_peepholes_states_lengths": (
        layer("LSTM", ["x", "W", "R", "B", "lengths", "h0", "c0", "P"], ["y", "y_h", "y_c"],
              direction="bidirectional"),
        {"x": (STEPS, BATCH, WIDTH), "h0": STATE, "c0": STATE}, {**weights("LSTM", 2, peepholes=True), **LENGTHS}),
    "lstm_input_forget_layout1_runtime_weights": (
        layer("LSTM", ["x", "W", "R"], ["", "y_h", "y_c"], layout=1, input_forget=1),
        {"x": (BATCH, STEPS, WIDTH), "W": (1, 4 * HIDDEN, WIDTH), "R": (1, 4 * HIDDEN, HIDDEN)}, {}),
    "lstm_activations_clip_reverse": (
        layer("LSTM", ["x", "W", "R", "B"], ["y", "", "y_c"], direction="reverse", clip=1.5,
              activations=["Sigmoid", "Elu", "Softplus"], activation_alpha=[0.5]),
        {"x": (STEPS, BATCH, WIDTH)}, weights("LSTM")),
    "lstm_relu_thresholded_relu_opset7": (
        layer("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], activations=["Sigmoid", "ThresholdedRelu", "Relu"],
              activation_alpha=[0.1]),
        {"x": (STEPS, BATCH, WIDTH)}, weights("LSTM")),
}


def model_of(name):
    node, inputs, consts = CASES[name]
    opset = 7 if name.endswith("opset7") else 14
    return build_model([node], inputs, consts, opset, TensorProto.FLOAT)


SEQUENCE_FIRST = ("x", "h0", "c0")  # the inputs whose first two axes layout 1 swaps


def expected_outputs(name, feeds):
    """onnxruntime's outputs; it refuses layout 1 (batch first), so that case is the same layer run on the inputs
    swapped to layout 0, its outputs swapped back (the layout as the ONNX reference defines it)."""
    node, inputs, consts = CASES[name]
    model, outputs = model_of(name)
    if not any(a.name == "layout" and a.i == 1 for a in node.attribute):
        return onnxruntime_outputs(model, outputs, feeds)
    sequence_first = N(node.op_type, node.input, node.output, **{
        a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "layout"})
    swapped = {k: (shape[1], shape[0], *shape[2:]) if k in SEQUENCE_FIRST else shape for k, shape in inputs.items()}
    model, _ = build_model([sequence_first], swapped, consts, 14, TensorProto.FLOAT)
    got = onnxruntime_outputs(model, outputs, {k: np.swapaxes(v, 0, 1) if k in SEQUENCE_FIRST else v
                                               for k, v in feeds.items()})
    return [np.transpose(v, (2, 0, 1, 3)) if o == "y" else np.swapaxes(v, 0, 1) for o, v in zip(outputs, got)]


@pytest.mark.parametrize("name", list(CASES))
def test_layer_matches_onnxruntime(name):
    model, outputs = model_of(name)
    feeds = feeds_for(model, positive=False)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, expected_outputs(name, feeds)):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype, output
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


@pytest.mark.slow
def test_bidirectional_lstm_of_different_lengths_compiles_and_matches_onnxruntime(kernel_cache):
    model, outputs = model_of("lstm_bidirectional_peepholes_states_lengths")
    feeds = feeds_for(model, positive=False)
    got = compiled_outputs(model, feeds, kernel_cache)
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, feeds)):
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


def test_sequence_lengths_given_at_run_time_are_refused_naming_them():
    node, inputs, _ = CASES["gru_reset_before_product_reverse_lengths"]
    lengths = {"lengths": ((BATCH,), TensorProto.INT32)}
    model, _ = build_model([node], {**inputs, **lengths}, weights("GRU"), 14, TensorProto.FLOAT)
    with pytest.raises(RuntimeInputError, match=r"needs its sequence lengths \(input lengths\) at import") as error:
        from_onnx(model)
    assert error.value.input == "lengths"


@pytest.mark.parametrize("attrs, consts, refusal", [
    ({"activations": ["Gelu"]}, {}, r"node RNN_0 \(RNN, opset 14\): the activation Gelu is not supported"),
    ({"activations": ["Tanh", "Tanh", "Tanh"]}, {}, r"3 activations \(1 per direction expected\)"),
    ({}, {"lengths": np.array([4, 0, 1], "int32")}, r"sequence_lens \[4, 0, 1\] \(each from 1 to the sequence"),
])
def test_what_the_standard_or_tilecraft_does_not_allow_is_refused(attrs, consts, refusal):
    node = layer("RNN", ["x", "W", "R", "", "lengths" if consts else ""], **attrs)
    model, _ = build_model([node], {"x": (STEPS, BATCH, WIDTH)}, {**weights("RNN"), **consts}, 14, TensorProto.FLOAT)
    with pytest.raises(UnsupportedOperatorError, match=refusal):
        from_onnx(model)
