"""The signal and algebra operators (DFT, STFT, MelWeightMatrix, Einsum, Det), each in a small model built with
onnx.helper, match onnxruntime, or NumPy (np.fft, np.einsum, np.linalg.det) where onnxruntime lacks the case,
through the reference runner; one model of them also compiled; and the refusals name the node."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_ops import build_model, case, compiled_outputs, feeds_for  # noqa: E402

from tilecraft import ops, te  # noqa: E402
from tilecraft.errors import TeError  # noqa: E402
from tilecraft.frontend import UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(3)


def integer(value):
    return np.array(value, "int64")

CASES = {
    "dft_opset17_axis_attribute_real_padded": case([N("DFT", ["x", "n"], ["y"], axis=1)], {"x": (2, 6, 3, 1)},
                                                   {"n": integer(8)}),
    "dft_opset20_complex_inverse_truncated_middle_axis": case([N("DFT", ["x", "n", "a"], ["y"], inverse=1)],
                                                              {"x": (2, 7, 3, 2)}, {"n": integer(5), "a": integer(-3)},
                                                              opset=20),
    "dft_opset20_onesided_default_axis": case([N("DFT", ["x"], ["y"], onesided=1)], {"x": (3, 9, 1)}, opset=20),
    "stft_window_frame_length": case([N("STFT", ["x", "step", "window", "length"], ["y"])], {"x": (2, 40, 1)},
                                     {"step": integer(6), "window": np.hanning(12).astype("float32"),
                                      "length": integer(12)}),
    "stft_two_sided_no_window": case([N("STFT", ["x", "step", "", "length"], ["y"], onesided=0)],
                                     {"x": (1, 20, 1)}, {"step": integer(4), "length": integer(8)}),
    "mel_weight_matrix_then_matmul": case([
        N("MelWeightMatrix", ["bins", "n", "rate", "low", "high"], ["mel"]), N("MatMul", ["x", "mel"], ["y"])],
        {"x": (3, 33)}, {"bins": np.array(10, "int64"), "n": np.array(64, "int64"), "rate": np.array(16000, "int64"),
                         "low": np.array(100.0, "float32"), "high": np.array(7000.0, "float32")}),
    "einsum_attention_and_implicit_output": case([
        N("Einsum", ["q", "k"], ["y1"], equation="bhqd,bhkd->bhqk"), N("Einsum", ["a", "b"], ["y2"], equation="ij,jk"),
        N("Einsum", ["a"], ["y3"], equation="ij->j")], {"q": (2, 3, 4, 5), "k": (2, 3, 6, 5), "a": (4, 3),
                                                         "b": (3, 5)}),
    "det_batched": case([N("Det", ["x"], ["y"])], {"x": (2, 3, 4, 4)}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_onnxruntime(name):
    nodes, inputs, consts, opset, positive, out_dtype = CASES[name]
    model, outputs = build_model(nodes, inputs, consts, opset, out_dtype)
    feeds = feeds_for(model, positive)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(outputs, feeds)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, expected):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype, output
        np.testing.assert_allclose(got[output], want, rtol=1e-3, atol=1e-4, err_msg=output)


def run_node(node, inputs, consts=None, opset=20):
    """The outputs of the one-node model ``node`` of float32 ``inputs``, through the reference runner."""
    infos = [helper.make_tensor_value_info(name, FLOAT, x.shape) for name, x in inputs.items()]
    graph = helper.make_graph([node], "model", infos, [helper.make_tensor_value_info("y", FLOAT, None)],
                              [numpy_helper.from_array(value, name) for name, value in (consts or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return run_reference(from_onnx(model), inputs)["y"]


def complex_pairs(z):
    return np.stack([z.real, z.imag], axis=-1).astype("float32")


@pytest.mark.parametrize("length, bins", [(7, 4), (8, 5), (10, 4), (6, 6)])
def test_inverse_onesided_dft_is_numpy_irfft(length, bins):
    spectrum = RNG.standard_normal((2, bins)) + 1j * RNG.standard_normal((2, bins))
    got = run_node(N("DFT", ["x", "n", "a"], ["y"], inverse=1, onesided=1), {"x": complex_pairs(spectrum)},
                   {"n": integer(length), "a": integer(1)})
    np.testing.assert_allclose(got[..., 0], np.fft.irfft(spectrum, n=length, axis=1), rtol=1e-4, atol=1e-5)


def test_a_long_dft_keeps_float32_accuracy():
    x = RNG.standard_normal((1, 1024, 2)).astype("float32")
    got = run_node(N("DFT", ["x"], ["y"]), {"x": x})
    want = complex_pairs(np.fft.fft(x[..., 0] + 1j * x[..., 1].astype(float), axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("equation, shapes", [
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("ii->", [(4, 4)]), ("bii->bi", [(2, 3, 3)]),
    ("i,j", [(3,), (4,)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("...i,i", [(2, 3, 4), (4,)]),
    ("ijk->kji", [(2, 3, 4)]), ("ab,ab->", [(3, 4), (3, 4)]), ("iij->ji", [(3, 3, 2)]),
])
def test_einsum_matches_numpy(equation, shapes):
    operands = {f"x{k}": RNG.standard_normal(shape).astype("float32") for k, shape in enumerate(shapes)}
    got = run_node(N("Einsum", list(operands), ["y"], equation=equation), operands, opset=12)
    np.testing.assert_allclose(got, np.einsum(equation, *operands.values()), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("equation, refusal", [
    ("ij,jk->ik", r"einsum 'ij,jk->ik': label 'j' is 3 long in one operand and 4 in b \(4, 5\)"),
    ("ij,jk", r"give one subscript per operand \(2\), '->' and an output of distinct labels"),
    ("ij,kl->iz", r"the output labels \['z'\] name no operand dim"),
])
def test_the_einsum_op_refuses_an_equation_that_does_not_fit(equation, refusal):
    with pytest.raises(TeError, match=refusal):
        ops.einsum(te.placeholder((2, 3), "a"), te.placeholder((4, 5), "b"), equation=equation)


@pytest.mark.parametrize("matrices", [
    np.array([[[0, 1, 2], [1, 0, 3], [4, -3, 8]], [[1, 2, 3], [2, 4, 6], [7, 8, 9]]]),  # a zero pivot; singular
    np.array([[[0, 0], [0, 0]], [[0, 2], [3, 0]]]), np.array([[[-2.5]]]),
    np.random.default_rng(5).standard_normal((3, 6, 6)), np.random.default_rng(6).uniform(-1e3, 1e3, (2, 5, 5)),
])
def test_det_matches_numpy(matrices):
    got = run_node(N("Det", ["x"], ["y"]), {"x": matrices.astype("float32")})
    np.testing.assert_allclose(got, np.linalg.det(matrices), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_signal_and_algebra_kernels_compile_and_match_numpy(kernel_cache):
    nodes = [N("DFT", ["x", "", "a"], ["f"]), N("Einsum", ["f", "f"], ["g"], equation="bjc,bjd->bcd"),
             N("Det", ["g"], ["y"]), N("Einsum", ["g"], ["t"], equation="...ii->..."), N("Add", ["t", "y"], ["y2"])]
    model, _ = build_model(nodes, {"x": (2, 3, 2)}, {"a": integer(1)}, 20, FLOAT)
    x = RNG.standard_normal((2, 3, 2)).astype("float32")
    got = compiled_outputs(model, {"x": x}, kernel_cache)
    spectrum = complex_pairs(np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=1))
    gram = np.einsum("bjc,bjd->bcd", spectrum, spectrum)
    np.testing.assert_allclose(got["y"], np.linalg.det(gram), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got["y2"], np.linalg.det(gram) + np.trace(gram, axis1=1, axis2=2), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("node, shape, refusal", [
    (N("DFT", ["x", "", "a"], ["y"], name="spectrum"), (4, 2), (r"node spectrum \(DFT, opset 20\): a transform "
                                                                 r"along axis -1 of shape \[4, 2\]")),
    (N("DFT", ["x"], ["y"], name="spectrum"), (4, 3), r"along axis -2 of shape \[4, 3\].*size 1 or 2"),
    (N("Det", ["x"], ["y"], name="volume"), (2, 3),
     r"node volume \(Det, opset 20\): the determinant of a float32\[2, 3\] \(square float matrices only\)"),
])
def test_malformed_transforms_and_determinants_are_refused_naming_the_node(node, shape, refusal):
    model = helper.make_model(helper.make_graph(
        [node], "model", [helper.make_tensor_value_info("x", FLOAT, shape)],
        [helper.make_tensor_value_info("y", FLOAT, None)], [numpy_helper.from_array(integer(-1), "a")]),
        opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(UnsupportedOperatorError, match=refusal):
        from_onnx(model)
