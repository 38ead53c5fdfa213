"""from_onnx as a whole: clear errors, input shapes, constant folding, graph passes on imported models."""

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tilecraft.errors import TilecraftError  # noqa: E402
from tilecraft.frontend import OnnxImportError, RuntimeInputError, UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node


def model_of(nodes, inputs, outputs, initializers=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "model", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                       for o in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


def float_input(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def assert_matches_onnxruntime(model, graph, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    got = run_reference(graph, feeds)
    for name, want in zip(names, session.run(names, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-3, atol=1e-5)


def test_unsupported_operators_are_all_listed_in_one_error():
    model = model_of([N("Relu", ["x"], ["r"], name="relu"), N("Unique", ["r"], ["v"], name="unique"),
                      N("NonZero", ["r"], ["nz"], name="nonzero"),
                      N("Fancy", ["r"], ["y"], name="custom", domain="com.example")],
                     [float_input("x", (4,)), helper.make_tensor_value_info("k", TensorProto.INT64, (1,))], ["y"],
                     opsets=(("", 17), ("com.example", 3)))
    with pytest.raises(UnsupportedOperatorError) as info:
        from_onnx(model)
    assert isinstance(info.value, TilecraftError)
    message = str(info.value)
    assert "3 node(s)" in message and "relu" not in message.split("supported (domain")[0]
    for row in (("unique", "Unique", "ai.onnx", "17"), ("nonzero", "NonZero", "ai.onnx", "17"),
                ("custom", "Fancy", "com.example", "3")):
        assert any(line.split() == list(row) for line in message.splitlines()), row


def test_a_dynamic_dimension_must_be_given():
    model = model_of([N("Relu", ["x"], ["y"])], [float_input("x", ("batch", 3))], ["y"])
    with pytest.raises(OnnxImportError, match=r"input x has a dynamic dimension 0 \(batch\).*input_shapes"):
        from_onnx(model)
    graph = from_onnx(model, input_shapes={"x": (2, 3)})
    assert graph.values["y"].shape == (2, 3)
    with pytest.raises(OnnxImportError, match=r"names \['z'\], which are not inputs of the model"):
        from_onnx(model, input_shapes={"z": (2, 3)})
    with pytest.raises(OnnxImportError, match=r"gives x the shape \(2, 4\).*agree with the fixed ones"):
        from_onnx(model, input_shapes={"x": (2, 4)})


def test_an_attribute_input_computed_at_run_time_is_named():
    model = model_of([N("Reshape", ["x", "s"], ["y"], name="reshape")],
                     [float_input("x", (2, 3)), helper.make_tensor_value_info("s", TensorProto.INT64, (2,))], ["y"])
    expected = r"node reshape \(Reshape, opset 17\) needs its shape \(input s\) at import"
    with pytest.raises(RuntimeInputError, match=expected) as info:
        from_onnx(model)
    assert info.value.input == "s"


def test_unsupported_feature_of_a_supported_operator_names_node_and_opset():
    model = model_of([N("Pad", ["x", "p"], ["y"], name="pad", mode="reflect")], [float_input("x", (2, 3))], ["y"],
                     [numpy_helper.from_array(np.array([-1, 1, 1, 1], "int64"), "p")])
    with pytest.raises(UnsupportedOperatorError, match=r"node pad \(Pad, opset 17\): negative pads \(cropping\)"):
        from_onnx(model)


def test_shape_arithmetic_folds_away(tmp_path):
    """x.view(x.shape[0], -1) as exporters write it: only the reshape is left."""
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "zero"], ["n"]), N("Unsqueeze", ["n", "axes"], ["n1"]),
             N("Concat", ["n1", "minus_one"], ["shape"], axis=0), N("Reshape", ["x", "shape"], ["y"])]
    consts = [numpy_helper.from_array(np.array(0, "int64"), "zero"),
              numpy_helper.from_array(np.array([0], "int64"), "axes"),
              numpy_helper.from_array(np.array([-1], "int64"), "minus_one")]
    model = model_of(nodes, [float_input("x", (2, 3, 4))], ["y"], consts)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    graph = from_onnx(path)
    assert [(n.op, n.attrs) for n in graph.nodes] == [("reshape", {"newshape": (2, 12)})] and not graph.constants
    assert_matches_onnxruntime(model, graph, {"x": np.ones((2, 3, 4), "float32")})


def test_outputs_keep_their_names_when_they_alias_or_fold():
    model = model_of([N("Identity", ["x"], ["y"]), N("Shape", ["x"], ["s"]), N("Cast", ["s"], ["z"], to=1)],
                     [float_input("x", (2, 5))], ["y", "z"])
    graph = from_onnx(model)
    assert graph.outputs == ["y", "z"] and graph.is_constant("z")
    out = run_reference(graph, {"x": np.full((2, 5), 3, "float32")})
    np.testing.assert_array_equal(out["y"], np.full((2, 5), 3))
    np.testing.assert_array_equal(out["z"], [2, 5])


def test_batch_norm_after_conv_is_folded_and_gelu_recognised():
    rng = np.random.default_rng(1)
    consts = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4), "g": rng.random(4) + 0.5,
              "beta": rng.standard_normal(4), "m": rng.standard_normal(4), "v": rng.random(4) + 0.5,
              "sqrt2": np.sqrt(2), "one": 1.0, "half": 0.5}
    nodes = [N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), N("BatchNormalization", ["c", "g", "beta", "m", "v"],
                                                                       ["bn"]),
             N("Div", ["bn", "sqrt2"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["e", "one"], ["a"]),
             N("Mul", ["bn", "a"], ["p"]), N("Mul", ["p", "half"], ["y"])]
    model = model_of(nodes, [float_input("x", (1, 3, 6, 6))], ["y"],
                     [numpy_helper.from_array(np.asarray(v, "float32"), k) for k, v in consts.items()])
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["conv2d", "add", "gelu"]
    assert_matches_onnxruntime(model, graph, {"x": rng.standard_normal((1, 3, 6, 6)).astype("float32")})


def test_missing_onnx_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match=r"pip install tilecraft\[onnx\]"):
        from_onnx("model.onnx")


def test_tilecraft_imports_without_onnx():
    code = "import sys; sys.modules['onnx'] = None; import tilecraft; print(tilecraft.frontend.from_onnx.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "from_onnx"
