"""GridSample, RoiAlign and MaxRoiPool, in small models built with onnx.helper, match onnxruntime through the
reference runner (every mode, padding mode and alignment of GridSample, in 2-D and 3-D; RoiAlign's modes,
coordinate transformations and adaptive sampling); one model of all three also compiled; adaptive RoiAlign
with boxes computed at run time is refused naming the boxes."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from test_onnx_ops import build_model, compiled_outputs, onnxruntime_outputs  # noqa: E402

from tilecraft.frontend import RuntimeInputError, UnsupportedOperatorError, from_onnx  # noqa: E402
from tilecraft.graph import run_reference  # noqa: E402

N = helper.make_node
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(3)

X = RNG.uniform(-2, 2, (2, 3, 5, 6)).astype("float32")
GRID = RNG.uniform(-1.4, 1.4, (2, 4, 3, 2)).astype("float32")  # beyond [-1, 1]: every padding mode matters
ROIS = np.array([[0.5, 1.0, 4.2, 3.9], [-1.5, 0.3, 2.0, 6.5], [2.0, 2.0, 2.3, 2.1]], "float32")  # x1 y1 x2 y2
BATCH = np.array([1, 0, 1], "int64")


def onnx_reference(model, outputs, feeds):
    return ReferenceEvaluator(model).run(outputs, feeds)


def check(nodes, feeds, consts=None, opset=20, oracle=onnxruntime_outputs):
    """The model of ``nodes`` (outputs y*) matches ``oracle`` (onnxruntime) through the reference runner."""
    inputs = {name: (value.shape, INT64 if value.dtype == np.int64 else FLOAT) for name, value in feeds.items()}
    model, outputs = build_model(nodes, inputs, consts or {}, opset, FLOAT)
    got = run_reference(from_onnx(model), feeds)
    for output, want in zip(outputs, oracle(model, outputs, feeds)):
        assert got[output].shape == want.shape, output
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("mode, padding", [(mode, padding) for mode in ("linear", "nearest", "cubic")
                                           for padding in ("zeros", "border", "reflection")
                                           if (mode, padding) != ("cubic", "border")])
def test_grid_sample_matches_onnxruntime(mode, padding, align_corners):
    check([N("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align_corners)],
          {"x": X, "grid": GRID})


@pytest.mark.parametrize("align_corners", [0, 1])
def test_cubic_grid_sample_with_border_clamps_the_coordinate_as_onnx_reference_does(align_corners):
    """ONNX's reference clamps a coordinate outside the border before taking its 4 taps; onnxruntime (as PyTorch)
    clamps only the taps, so the two differ near the border. The node tests' reference is the yardstick."""
    check([N("GridSample", ["x", "grid"], ["y"], mode="cubic", padding_mode="border", align_corners=align_corners)],
          {"x": X, "grid": GRID}, oracle=onnx_reference)


def test_grid_sample_16_names_its_modes_bilinear_and_bicubic():
    check([N("GridSample", ["x", "grid"], [f"y_{mode}"], mode=mode, padding_mode="reflection")
           for mode in ("bilinear", "bicubic", "nearest")], {"x": X, "grid": GRID}, opset=16)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.slow
def test_volumetric_grid_sample_matches_onnxruntime(mode):
    """onnxruntime has no cubic mode in 3-D: ONNX's reference, which samples any number of dims, judges it."""
    rng = np.random.default_rng(5)
    x, grid = rng.uniform(-2, 2, (1, 2, 3, 4, 5)), rng.uniform(-1.3, 1.3, (1, 2, 3, 2, 3))
    check([N("GridSample", ["x", "grid"], [f"y_{padding}"], mode=mode, padding_mode=padding)
           for padding in ("zeros", "border", "reflection")],
          {"x": x.astype("float32"), "grid": grid.astype("float32")},
          oracle=onnx_reference if mode == "cubic" else onnxruntime_outputs)


@pytest.mark.parametrize("transformation", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_with_boxes_at_run_time_matches_onnxruntime(mode, transformation):
    check([N("RoiAlign", ["x", "rois", "batch"], ["y"], mode=mode, output_height=3, output_width=2, sampling_ratio=2,
             spatial_scale=0.8, coordinate_transformation_mode=transformation)],
          {"x": X, "rois": ROIS, "batch": BATCH}, opset=16)


@pytest.mark.parametrize("opset, mode", [(10, "avg"), (16, "avg"), (16, "max")])
def test_adaptive_roi_align_with_constant_boxes_matches_onnxruntime(opset, mode):
    check([N("RoiAlign", ["x", "rois", "batch"], ["y"], mode=mode, output_height=2, output_width=3,
             spatial_scale=1.3)], {"x": X, "batch": BATCH}, {"rois": ROIS}, opset=opset)


def test_max_roi_pool_matches_onnxruntime():
    """Non-negative data: onnxruntime starts each bin's max at FLT_MIN, not at the lowest float."""
    rois = np.array([[1, 0.4, 1.2, 4.6, 3.3], [0, -2.0, 1.0, 3.0, 9.0], [1, 5.5, 4.5, 5.5, 4.5]], "float32")
    check([N("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[2, 3], spatial_scale=0.9)],
          {"x": np.abs(X), "rois": rois}, opset=16)


@pytest.mark.slow
def test_sampling_kernels_compile_and_match_onnxruntime(kernel_cache):
    nodes = [N("GridSample", ["x", "grid"], ["y1"], mode="cubic", padding_mode="reflection"),
             N("RoiAlign", ["x", "rois", "batch"], ["y2"], output_height=2, output_width=2),
             N("MaxRoiPool", ["x", "boxes"], ["y3"], pooled_shape=[2, 2])]
    boxes = np.concatenate([BATCH[:, None].astype("float32"), ROIS], axis=1)
    feeds = {"x": np.abs(X), "grid": GRID, "batch": BATCH, "boxes": boxes}
    model, outputs = build_model(nodes, {"x": X.shape, "grid": GRID.shape, "batch": (BATCH.shape, INT64),
                                         "boxes": boxes.shape}, {"rois": ROIS}, 20, FLOAT)
    got = compiled_outputs(model, feeds, kernel_cache)
    for output, want in zip(outputs, onnxruntime_outputs(model, outputs, feeds)):
        np.testing.assert_allclose(got[output], want, rtol=1e-4, atol=1e-5, err_msg=output)


def test_adaptive_roi_align_of_boxes_computed_at_run_time_is_refused_naming_them():
    model, _ = build_model([N("RoiAlign", ["x", "rois", "batch"], ["y"])],
                           {"x": X.shape, "rois": ROIS.shape, "batch": (BATCH.shape, INT64)}, {}, 16, FLOAT)
    with pytest.raises(RuntimeInputError, match=r"needs its rois \(sampling_ratio 0 sizes each box's sample grid"):
        from_onnx(model)


def test_interpolating_integers_is_refused():
    model, _ = build_model([N("GridSample", ["x", "grid"], ["y"])], {"x": (X.shape, INT64), "grid": GRID.shape},
                           {}, 20, INT64)
    with pytest.raises(UnsupportedOperatorError, match=r"linear interpolation of int64 values is not supported"):
        from_onnx(model)
