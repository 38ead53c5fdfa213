"""The scatters and indexed gathers (ScatterElements, Scatter, ScatterND, GatherND, MaxUnpool, ReverseSequence,
TensorScatter, GlobalLpPool), each in a small model built with onnx.helper, match onnxruntime (ONNX's reference
evaluator where onnxruntime lacks the opset) through the reference runner: indices known at import (the layered
gathers) and computed at run time (the search of ops.scatter_elements), repeated and negative indices, indices
smaller than the data; one model of them also compiled; the clear refusals."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from test_onnx_ops import build_model, compiled_outputs, ints  # noqa: E402

from tilecraft.frontend import RuntimeInputError, UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
R = np.random.default_rng(3)
TYPES = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64}


def floats(*shape):
    return R.standard_normal(shape).astype("float32")


def case(nodes, feeds, consts=None, opset=18):
    """A model of ``nodes`` fed ``feeds`` (arrays of its graph inputs), with initializers ``consts``."""
    return nodes, feeds, consts or {}, opset


ELEMENT_INDICES = ints(1, 1, -4, 0, 4, 4).reshape(2, 3)  # repeated and negative, fewer rows than the data
ND_INDICES = ints(1, -3, 1, 2).reshape(4, 1)

CASES = {
    **{f"scatter_elements_{where}_{reduction}": case(
        [N("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)],
        {"x": floats(3, 5), "u": floats(2, 3), **({"i": ELEMENT_INDICES} if where == "runtime" else {})},
        {"i": ELEMENT_INDICES} if where == "constant" else {})
       for where in ("constant", "runtime") for reduction in ("none", "add", "mul", "max", "min")
       if (where, reduction) != ("runtime", "mul")},
    "scatter_opset10": case([N("Scatter", ["x", "i", "u"], ["y"])], {"x": floats(4, 2), "u": floats(2, 2)},
                            {"i": ints(3, 0, 1, 3).reshape(2, 2)}, opset=10),
    **{f"scatter_nd_{where}_{reduction}": case(
        [N("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
        {"x": floats(3, 2, 4), "u": floats(4, 2, 4), **({"i": ND_INDICES} if where == "runtime" else {})},
        {"i": ND_INDICES} if where == "constant" else {})
       for where, reduction in (("constant", "none"), ("constant", "add"), ("constant", "mul"), ("runtime", "none"),
                                ("runtime", "max"))},
    "scatter_nd_elements": case([N("ScatterND", ["x", "i", "u"], ["y"])], {"x": floats(3, 4), "u": floats(2)},
                                {"i": ints(2, -1, 0, 1).reshape(2, 2)}),
    "gather_nd_batch_runtime": case([N("GatherND", ["x", "i"], ["y"], batch_dims=1)],
                                    {"x": floats(2, 3, 4), "i": ints(2, -1, 0, 1).reshape(2, 2, 1)}),
    "gather_nd_tuples_constant": case([N("GatherND", ["x", "i"], ["y"])], {"x": floats(2, 3, 4)},
                                      {"i": ints(1, 2, 0, -1, 1, 0).reshape(3, 2)}),
    "max_unpool_constant": case([N("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                                {"x": floats(1, 2, 2, 2)}, {"i": ints(5, 2, 8, 15, 16, 19, 29, 26).reshape(1, 2, 2, 2),
                                                            "s": ints(1, 2, 4, 4)}, opset=11),
    "reverse_sequence_runtime": case([N("ReverseSequence", ["x", "n"], ["y"], batch_axis=0, time_axis=1)],
                                     {"x": floats(3, 4, 2), "n": ints(4, 1, 3)}),
    "reverse_sequence_constant": case([N("ReverseSequence", ["x", "n"], ["y"])], {"x": floats(4, 2, 3)},
                                      {"n": ints(2, 4)}),
    "tensor_scatter_circular": case([N("TensorScatter", ["x", "u", "w"], ["y"], mode="circular")],
                                    {"x": floats(2, 3, 5, 4), "u": floats(2, 3, 2, 4), "w": ints(1, 4)}, opset=24),
    "tensor_scatter_linear_axis1": case([N("TensorScatter", ["x", "u", "w"], ["y"], axis=1)],
                                        {"x": floats(2, 6, 3), "u": floats(2, 3, 3)}, {"w": ints(0, 3)}, opset=24),
    "global_lp_pool": case([N("GlobalLpPool", ["x"], ["y"], p=3)], {"x": floats(2, 3, 4, 5)}),
}


def model_of(nodes, feeds, consts, opset):
    inputs = {name: (value.shape, TYPES[value.dtype]) for name, value in feeds.items()}
    return build_model(nodes, inputs, consts, opset, TensorProto.FLOAT)


def expected_outputs(model, outputs, feeds):
    """onnxruntime's outputs, or the reference evaluator's for an opset onnxruntime does not run yet."""
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - a newer opset than this onnxruntime knows
        return ReferenceEvaluator(model).run(outputs, feeds)
    return session.run(outputs, feeds)


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_onnxruntime(name):
    nodes, feeds, consts, opset = CASES[name]
    model, outputs = model_of(nodes, feeds, consts, opset)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, expected_outputs(model, outputs, feeds)):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype, output
        np.testing.assert_allclose(got[output], want, rtol=1e-5, atol=1e-6, err_msg=output)


def test_scatters_and_gathers_compile_and_match_onnxruntime(kernel_cache):
    nodes = [N("ScatterElements", ["x", "i", "u"], ["s"], axis=1, reduction="add"),
             N("ScatterND", ["s", "j", "v"], ["t"], reduction="mul"),
             N("ScatterElements", ["t", "i", "u"], ["y"], axis=1),
             N("GatherND", ["y", "k"], ["z"])]
    feeds = {"x": floats(3, 5), "u": floats(2, 3), "v": floats(2, 5), "i": ELEMENT_INDICES,
             "k": ints(2, 0, 1).reshape(3, 1)}
    model, _ = model_of(nodes, feeds, {"j": ints(2, -1).reshape(2, 1)}, 18)
    outputs = ["y", "z"]
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    got = compiled_outputs(model, feeds, kernel_cache)
    for output, want in zip(outputs, expected_outputs(model, outputs, feeds)):
        np.testing.assert_allclose(got[output], want, rtol=1e-5, atol=1e-6, err_msg=output)


@pytest.mark.parametrize("node, feeds, consts, opset, error, refusal", [
    (N("ScatterElements", ["x", "i", "u"], ["y"], reduction="mul"), {"x": floats(3, 5), "u": floats(2, 3),
     "i": ELEMENT_INDICES}, {}, 18, RuntimeInputError, r"needs its indices \(a multiplying scatter\) \(input i\)"),
    (N("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), {"x": floats(1, 1, 2, 2)},
     {"i": ints(0, 3, 9, 14).reshape(1, 1, 2, 2), "s": ints(1, 1, 5, 5)}, 11, UnsupportedOperatorError,
     r"\(MaxUnpool, opset 11\): an output_shape \[1, 1, 5, 5\] other than the unpooled shape \[1, 1, 4, 4\]"),
    (N("TensorScatter", ["x", "u"], ["y"], axis=0), {"x": floats(4, 3), "u": floats(2, 3)}, {}, 24,
     UnsupportedOperatorError, r"\(TensorScatter, opset 24\): the sequence on axis 0, the batch axis"),
])
def test_what_cannot_be_imported_is_refused_naming_node_and_feature(node, feeds, consts, opset, error, refusal):
    model, _ = model_of([node], feeds, consts, opset)
    with pytest.raises(error, match=refusal):
        from_onnx(model)
