"""The convolution family beyond a plain Conv (Col2Im, DeformConv, grouped, dilated and 3-D ConvTranspose, 3-D
Conv, MaxPool's Indices, AveragePool's ceil_mode with count_include_pad), each in a small model built with
onnx.helper, match onnxruntime through the reference runner; one model of them also compiled."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx_ops import build_model, case, compiled_outputs, feeds_for, ints, onnxruntime_outputs, w  # noqa: E402

from tilecraft.frontend import UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
INT64, UINT8 = TensorProto.INT64, TensorProto.UINT8


def offsets(*shape):
    """Offsets of a few pixels, so that some taps land between pixels and some outside the image."""
    return (3 * w(*shape)).astype("float32")


CASES = {
    "conv_transpose_grouped_dilated_strided": case([N(
        "ConvTranspose", ["x", "w", "b"], ["y"], group=2, dilations=[2, 1], strides=[3, 2], pads=[1, 0, 2, 1],
        output_padding=[1, 0])], {"x": (2, 4, 4, 5)}, {"w": w(4, 3, 3, 2), "b": w(6)}),
    "conv_transpose_depthwise_pads_beyond_the_kernel": case([N(
        "ConvTranspose", ["x", "w"], ["y"], group=3, strides=[2, 2], pads=[3, 2, 2, 3])],
        {"x": (1, 3, 5, 6)}, {"w": w(3, 1, 2, 3)}),
    "conv_transpose_dilated_same_upper_and_output_shape": case([
        N("ConvTranspose", ["x", "w"], ["y1"], dilations=[2, 2], strides=[2, 1], auto_pad="SAME_UPPER"),
        N("ConvTranspose", ["x", "w"], ["y2"], dilations=[1, 2], strides=[2, 2], output_shape=[10, 11])],
        {"x": (1, 2, 4, 5)}, {"w": w(2, 3, 3, 3)}),
    "conv_transpose_3d_grouped_strided_with_bias": case([N(
        "ConvTranspose", ["x", "w", "b"], ["y"], group=2, strides=[2, 1, 2], dilations=[1, 2, 1],
        pads=[1, 0, 1, 0, 1, 2])], {"x": (1, 4, 3, 4, 3)}, {"w": w(4, 2, 2, 3, 3), "b": w(4)}),
    "conv_transpose_1d_dilated_with_the_weight_an_input": case([N(
        "ConvTranspose", ["x", "w"], ["y"], dilations=[3], strides=[2], pads=[2, 1])],
        {"x": (2, 3, 7), "w": (3, 2, 3)}),
    "conv_3d_strided_dilated_grouped": case([N(
        "Conv", ["x", "w", "b"], ["y"], group=2, strides=[2, 1, 1], dilations=[1, 2, 1], pads=[1, 2, 0, 2, 1, 1])],
        {"x": (2, 4, 5, 6, 4)}, {"w": w(6, 2, 3, 2, 2), "b": w(6)}),
    "conv_3d_same_lower": case([N("Conv", ["x", "w"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2, 1])],
                               {"x": (1, 2, 5, 4, 3)}, {"w": w(3, 2, 2, 3, 2)}),
    "max_pool_indices_pads_strides_ceil": case([N(
        "MaxPool", ["x"], ["y1", "y2"], kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)],
        {"x": (2, 3, 7, 6)}),
    "max_pool_indices_column_major_dilated": case([N(
        "MaxPool", ["x"], ["y1", "y2"], kernel_shape=[2, 2], dilations=[2, 1], pads=[1, 1, 1, 1], storage_order=1)],
        {"x": (1, 2, 6, 5)}),
    "max_pool_indices_1d_and_3d": case([
        N("MaxPool", ["x"], ["y0", "y1"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        N("MaxPool", ["v"], ["y2", "y3"], kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[0, 1, 1, 1, 0, 1])],
        {"x": (2, 3, 9), "v": (1, 2, 4, 5, 5)}),
    "average_pool_ceil_mode_count_include_pad": case([
        N("AveragePool", ["x"], ["y1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0], ceil_mode=1,
          count_include_pad=1),
        N("AveragePool", ["x"], ["y2"], kernel_shape=[2, 3], strides=[2, 3], ceil_mode=1, count_include_pad=1)],
        {"x": (1, 2, 6, 7)}, opset=19),
    "col2im_strided_padded_dilated": case([N(
        "Col2Im", ["x", "image", "block"], ["y"], strides=[2, 1], pads=[1, 0, 0, 2], dilations=[1, 2])],
        {"x": (2, 12, 9)}, {"image": ints(6, 5), "block": ints(2, 3)}, opset=18),
    "col2im_3d": case([N("Col2Im", ["x", "image", "block"], ["y"], strides=[1, 2, 1])],
                      {"x": (1, 16, 12)}, {"image": ints(3, 5, 4), "block": ints(2, 2, 2)}, opset=18),
    "deform_conv_groups_mask_bias_strides": case([N(
        "DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], group=2, offset_group=2, strides=[2, 1],
        pads=[1, 1, 0, 1], dilations=[1, 2])], {"x": (2, 4, 6, 5), "mask": (2, 12, 3, 3)},
        {"w": w(6, 2, 2, 3), "offset": offsets(2, 24, 3, 3), "b": w(6)}, opset=19),
    "deform_conv_plain_offsets_an_input": case([N("DeformConv", ["x", "w", "offset"], ["y"], kernel_shape=[3, 3])],
                                               {"x": (1, 3, 5, 5), "offset": (1, 18, 3, 3)}, {"w": w(2, 3, 3, 3)},
                                               opset=19),
}


def split_outputs(model, outputs):
    """Declare the outputs' types: a MaxPool's second output (its Indices) is int64, the others float."""
    indices = {n.output[1] for n in model.graph.node if n.op_type == "MaxPool" and len(n.output) > 1}
    for info in model.graph.output:
        info.type.tensor_type.elem_type = INT64 if info.name in indices else TensorProto.FLOAT
    return model, outputs


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_onnxruntime(name):
    nodes, inputs, consts, opset, positive, out_dtype = CASES[name]
    model, outputs = split_outputs(*build_model(nodes, inputs, consts, opset, out_dtype))
    feeds = feeds_for(model, positive)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, feeds)):
        assert got[output].shape == want.shape and got[output].dtype == want.dtype, output
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


def test_max_pool_indices_of_ties_and_of_uint8_point_at_the_first_real_maximum():
    """Padding holds the lowest value, which a uint8 image of zeros also holds: the first real tap must win."""
    nodes = [N("MaxPool", ["x"], ["y1", "y2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])]
    model, outputs = split_outputs(*build_model(nodes, {"x": ((1, 2, 5, 5), UINT8)}, {}, 17, TensorProto.FLOAT))
    model.graph.output[0].type.tensor_type.elem_type = UINT8
    x = np.random.default_rng(1).integers(0, 2, (1, 2, 5, 5)).astype("uint8")
    got = run_reference(from_onnx(model), {"x": x})
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, {"x": x})):
        np.testing.assert_array_equal(got[output], want, err_msg=output)


@pytest.mark.slow
def test_conv_family_compiles_and_matches_onnxruntime(kernel_cache):
    nodes = [N("DeformConv", ["x", "w", "offset", "b", "mask"], ["d"], kernel_shape=[2, 2], offset_group=2),
             N("ConvTranspose", ["d", "wt"], ["t"], group=3, dilations=[2, 2], strides=[2, 2]),
             N("MaxPool", ["t"], ["y1", "y2"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0]),
             N("AveragePool", ["t"], ["y3"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
               count_include_pad=1),
             N("Col2Im", ["c", "image", "block"], ["y4"], strides=[2, 2], pads=[1, 1, 1, 1])]
    consts = {"w": w(6, 2, 2, 2), "b": w(6), "offset": offsets(1, 16, 4, 4), "wt": w(6, 1, 3, 3),
              "image": ints(5, 5), "block": ints(3, 3)}
    model, outputs = split_outputs(*build_model(nodes, {"x": (1, 2, 5, 5), "mask": (1, 8, 4, 4), "c": (2, 18, 9)},
                                                consts, 19, TensorProto.FLOAT))
    feeds = feeds_for(model, False)
    got = compiled_outputs(model, feeds, kernel_cache)
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, feeds)):
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-4, err_msg=output)


@pytest.mark.parametrize("nodes, inputs, consts, refusal", [
    ([N("DeformConv", ["x", "w", "offset"], ["y"])], {"x": (1, 2, 6), "offset": (1, 6, 4)}, {"w": w(3, 2, 3)},
     r"node DeformConv_0 \(DeformConv, opset 19\): a 1-D deformable convolution \(only 2-D, NCHW\)"),
    ([N("ConvTranspose", ["x", "w"], ["y"])], {"x": (1, 2, 3, 3, 3, 3)}, {"w": w(2, 2, 2, 2, 2, 2)},
     r"\(ConvTranspose, opset 19\): a 4-D transposed convolution \(only 1-D, 2-D and 3-D\)"),
])
def test_unsupported_shapes_are_refused_naming_the_node(nodes, inputs, consts, refusal):
    for node in nodes:
        node.name = f"{node.op_type}_0"
    model, _ = build_model(nodes, inputs, consts, 19, TensorProto.FLOAT)
    with pytest.raises(UnsupportedOperatorError, match=refusal):
        from_onnx(model)
