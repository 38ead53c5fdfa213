"""into_slice: a kernel writes its output into a slice of a larger array, and nothing else of it;
from_slice: a kernel reads an input from its slice of a larger array."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import ops, te
from tilecraft.build import build_lowered
from tilecraft.errors import LoweringError
from tilecraft.ir.slices import from_slice, into_slice
from tilecraft.search.default import default_schedule

HOST = tc.Target.host()


@pytest.mark.parametrize("offset", [(0, 3, 0, 0), pytest.param((0, 0, 0, 24), marks=pytest.mark.slow)],
                         ids=["rows", "channels"])
def test_a_tuned_kernel_writes_only_its_slice_and_equals_numpy(offset, kernel_cache):
    """A convolution with relu, by its default schedule (packed weights, a register tile
    stored back from a local accumulator, a padded input), lands at ``offset`` of a
    1x9x6x40 array, as a concatenation's part over rows or channels; the rest stays."""
    data, weight = te.placeholder((1, 6, 6, 8), name="data"), te.placeholder((3, 3, 8, 16), name="weight")
    out = ops.relu(ops.conv2d_nhwc(data, weight, padding=1))
    dag = tc.ComputeDAG([data, weight, out])
    func = into_slice(tc.lower(default_schedule(dag, HOST)), out.name, (1, 9, 6, 40), offset)
    kernel = build_lowered(func, HOST, kernel_cache)
    inputs = dag.random_inputs(np.random.default_rng(0))
    whole = np.full((1, 9, 6, 40), -7.0, dtype="float32")
    kernel(*inputs, whole)
    expected = np.full_like(whole, -7.0)
    rows, channels = offset[1], offset[3]
    expected[:, rows:rows + 6, :, channels:channels + 16] = dag.evaluate_numpy(inputs)[0]
    np.testing.assert_allclose(whole, expected, rtol=1e-5, atol=1e-5)


def test_a_slice_that_does_not_fit_or_names_no_output_is_refused():
    a = te.placeholder((4, 8), name="a")
    out = ops.relu(a)
    func = tc.lower(tc.Schedule(tc.ComputeDAG([a, out])))
    with pytest.raises(LoweringError, match=r"at offset \[0, 4\] does not fit in \[4, 10\]"):
        into_slice(func, out.name, (4, 10), (0, 4))
    with pytest.raises(LoweringError, match="has no output 'a'"):
        into_slice(func, "a", (4, 16), (0, 0))


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
        func = from_slice(func, name, (24, 16), (start, 0))
    kernel = build_lowered(func, HOST, kernel_cache)
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((24, 16)).astype("float32"), rng.standard_normal((24, 16)).astype("float32")
    rows = slice(start, start + 8)
    np.testing.assert_allclose(kernel(xs, ws), xs[rows] @ ws[rows].T, rtol=1e-5, atol=1e-5)


def test_a_slice_read_that_does_not_fit_or_names_no_input_is_refused():
    a = te.placeholder((4, 8), name="a")
    out = ops.relu(a)
    func = tc.lower(tc.Schedule(tc.ComputeDAG([a, out])))
    with pytest.raises(LoweringError, match=r"a\[4, 8\] at offset \[1, 0\] does not fit in \[4, 8\]"):
        from_slice(func, "a", (4, 8), (1, 0))
    with pytest.raises(LoweringError, match=f"has no input {out.name!r}"):
        from_slice(func, out.name, (8, 8), (0, 0))
