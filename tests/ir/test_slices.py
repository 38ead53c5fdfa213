"""into_view: a kernel writes its output as a strided view of a larger array (a slice of a
concatenation, a transpose), and nothing else of it; from_view: a kernel reads an input as a
strided view of a larger array (a slice, a transpose)."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import ops, te
from tilecraft.build import build_lowered
from tilecraft.errors import LoweringError
from tilecraft.ir.slices import from_view, into_view
from tilecraft.ops.transform import row_major
from tilecraft.search.default import default_schedule

HOST = tc.Target.host()


def relu_conv():
    data, weight = te.placeholder((1, 6, 6, 8), name="data"), te.placeholder((3, 3, 8, 16), name="weight")
    out = ops.relu(ops.conv2d_nhwc(data, weight, padding=1))
    return tc.ComputeDAG([data, weight, out]), out


@pytest.mark.parametrize("offset", [(0, 3, 0, 0), pytest.param((0, 0, 0, 24), marks=pytest.mark.slow)],
                         ids=["rows", "channels"])
def test_a_tuned_kernel_writes_only_its_slice_and_equals_numpy(offset, kernel_cache):
    """A convolution with relu, by its default schedule (packed weights, a register tile
    stored back from a local accumulator, a padded input), lands at ``offset`` of a
    1x9x6x40 array, as a concatenation's part over rows or channels; the rest stays."""
    dag, out = relu_conv()
    strides = row_major((1, 9, 6, 40))
    func = into_view(tc.lower(default_schedule(dag, HOST)), out.name, (1, 9, 6, 40),
                     sum(o * s for o, s in zip(offset, strides)), strides)
    kernel = build_lowered(func, HOST, kernel_cache)
    inputs = dag.random_inputs(np.random.default_rng(0))
    whole = np.full((1, 9, 6, 40), -7.0, dtype="float32")
    kernel(*inputs, whole)
    expected = np.full_like(whole, -7.0)
    rows, channels = offset[1], offset[3]
    expected[:, rows:rows + 6, :, channels:channels + 16] = dag.evaluate_numpy(inputs)[0]
    np.testing.assert_allclose(whole, expected, rtol=1e-5, atol=1e-5)


def test_a_tuned_kernel_writes_its_output_transposed_and_equals_numpy(kernel_cache):
    """The same convolution writes its rows and columns swapped: element (0, y, x, c) at (x, y, c)."""
    dag, out = relu_conv()
    func = into_view(tc.lower(default_schedule(dag, HOST)), out.name, (6, 6, 16), 0, (0, 16, 96, 1))
    kernel = build_lowered(func, HOST, kernel_cache)
    inputs = dag.random_inputs(np.random.default_rng(0))
    swapped = np.zeros((6, 6, 16), dtype="float32")
    kernel(*inputs, swapped)
    np.testing.assert_allclose(swapped, dag.evaluate_numpy(inputs)[0][0].transpose(1, 0, 2), rtol=1e-5, atol=1e-5)


def test_a_view_that_does_not_fit_or_names_no_output_is_refused():
    a = te.placeholder((4, 8), name="a")
    out = ops.relu(a)
    func = tc.lower(tc.Schedule(tc.ComputeDAG([a, out])))
    with pytest.raises(LoweringError, match=r"at element 4 with strides \[10, 1\] does not fit in an array of "
                                            r"\[4, 10\]"):
        into_view(func, out.name, (4, 10), 4, (10, 1))
    with pytest.raises(LoweringError, match="has no output 'a'"):
        into_view(func, "a", (4, 16), 0, (16, 1))


@pytest.mark.parametrize("start", [0, 16], ids=["first", "last"])
def test_a_kernel_reads_its_slices_of_larger_arrays_packed_or_not_and_equals_numpy(start, kernel_cache):
    """A dense layer by its default schedule (its weight copied by a pack function, its rows
    read in place) reads both operands as rows ``start`` to ``start + 8`` of 24-row arrays:
    it computes the layer of those rows."""
    x, w = te.placeholder((8, 16), name="x"), te.placeholder((8, 16), name="w")
    dag = tc.ComputeDAG([x, w, ops.dense(x, w)])
    func = tc.lower(default_schedule(dag, HOST))
    assert [p.source.name for p in func.packs] == ["w"]
    for name in ("x", "w"):
        func = from_view(func, name, (24, 16), start * 16, (16, 1))
    kernel = build_lowered(func, HOST, kernel_cache)
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((24, 16)).astype("float32"), rng.standard_normal((24, 16)).astype("float32")
    rows = slice(start, start + 8)
    np.testing.assert_allclose(kernel(xs, ws), xs[rows] @ ws[rows].T, rtol=1e-5, atol=1e-5)


def test_a_kernel_reads_an_input_transposed_and_equals_numpy(kernel_cache):
    """The dense layer reads x from a 16 x 8 array's columns: its vector loads along the rows become strided."""
    x, w = te.placeholder((8, 16), name="x"), te.placeholder((8, 16), name="w")
    dag = tc.ComputeDAG([x, w, ops.dense(x, w)])
    func = from_view(tc.lower(default_schedule(dag, HOST)), "x", (16, 8), 0, (1, 8))
    kernel = build_lowered(func, HOST, kernel_cache)
    rng = np.random.default_rng(0)
    xt, ws = rng.standard_normal((16, 8)).astype("float32"), rng.standard_normal((8, 16)).astype("float32")
    np.testing.assert_allclose(kernel(xt, ws), xt.T @ ws.T, rtol=1e-5, atol=1e-5)


def test_a_view_read_that_does_not_fit_or_names_no_input_is_refused():
    a = te.placeholder((4, 8), name="a")
    out = ops.relu(a)
    func = tc.lower(tc.Schedule(tc.ComputeDAG([a, out])))
    with pytest.raises(LoweringError, match=r"a\[4, 8\] at element 8 with strides \[8, 1\] does not fit in an "
                                            r"array of \[4, 8\]"):
        from_view(func, "a", (4, 8), 8, (8, 1))
    with pytest.raises(LoweringError, match=f"has no input {out.name!r}"):
        from_view(func, out.name, (8, 8), 0, (8, 1))

