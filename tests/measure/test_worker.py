"""The worker's output check, in this process: tolerances by dtype, and what a mismatch message says."""

from collections import OrderedDict

import numpy as np
import pytest

from tilecraft.measure.worker import OutputCheck, _load_reference, poisoned
from tilecraft.te.dtype import NUMPY_DTYPES


def compare(name, got, expected):
    """One output checked as the worker checks it: ``got`` against the reference ``expected``."""
    return OutputCheck(name, expected)(got)


def test_float32_within_reassociation_error_passes():
    expected = np.random.default_rng(0).uniform(-50, 50, (16, 16)).astype(np.float32)
    got = expected * np.float32(1 + 5e-4)
    got[3, 3] = 1e-3  # near zero, a reassociated sum errs on the scale of the whole output
    expected[3, 3] = 0.0
    assert compare("C", got, expected) is None


def test_float32_mismatch_names_output_error_index_and_values():
    expected = np.zeros((8, 8), np.float32)
    expected[4, 7] = 1.5
    got = expected.copy()
    got[4, 7] = -1.7
    assert compare("C", got, expected) == (
        "output 'C' differs from the NumPy reference: max abs error 3.2 at index (4, 7) (expected 1.5, got -1.7); "
        "1 of 64 elements are outside the tolerance (|got - expected| <= 0.00015 + 0.001*|expected|)")


def test_nan_must_appear_exactly_where_the_reference_has_it():
    expected = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare("y", expected.copy(), expected) is None
    message = compare("y", np.array([1.0, 0.0, np.inf], np.float32), expected)
    assert "at index (1,) (expected nan, got 0)" in message


def test_float16_tolerance_is_looser_than_float32():
    expected = np.linspace(1, 2, 10).astype(np.float16)
    assert compare("h", (expected * np.float16(1.005)).astype(np.float16), expected) is None
    assert compare("f", (expected * 1.005).astype(np.float32), expected.astype(np.float32)) is not None


def test_bfloat16_passes_a_rounding_apart_and_a_saved_reference_keeps_its_type(tmp_path):
    """bfloat16 keeps 8 bits (an ulp of 1.0 is 0.8%): a result two roundings from the
    reference (a sum reassociated in float32, then rounded) passes, a lost term does not;
    a reference saved as .npz, as the runner saves it, is read back as bfloat16."""
    bfloat16 = NUMPY_DTYPES["bfloat16"]
    expected = np.linspace(-60, 60, 16).astype(bfloat16)
    nudged = (expected.astype(np.float32) * np.float32(1.015)).astype(bfloat16)
    assert compare("b", nudged, expected) is None
    assert "(expected -60, got -56); 16 of 16 elements" in compare("b", expected + np.asarray(4, bfloat16), expected)
    np.savez(tmp_path / "reference.npz", b=expected)
    loaded = _load_reference(str(tmp_path / "reference.npz"), OrderedDict())["b"]
    assert loaded.dtype == bfloat16 and loaded.tobytes() == expected.tobytes()


def test_a_float32_output_of_16_bit_stages_is_judged_to_their_precision(tmp_path):
    """A bfloat16 product, a bias and a residual added and cast to float32 (a BERT layer's
    task): the reference rounds each stage to bfloat16, a fused kernel only its output, so
    they differ by ulps of bfloat16 (0.65 at 85, which float32's tolerance refused in every
    candidate). The runner names the workload's least precise type in the reference."""
    from tilecraft import te
    from tilecraft.measure.runner import LocalRunner
    from tilecraft.measure.worker import PRECISION, least_precise
    from tilecraft.ops.linalg import dense
    from tilecraft.te.dag import ComputeDAG

    expected = np.linspace(-85, 85, 32).astype(np.float32)
    fused = expected * np.float32(1.0075)
    assert compare("out", fused, expected) is not None
    assert OutputCheck("out", expected, "bfloat16")(fused) is None
    assert least_precise(["float32", "bfloat16", "int32"]) == "bfloat16" and least_precise(["int32"]) == ""
    X, W = te.placeholder((4, 8), name="X", dtype="bfloat16"), te.placeholder((4, 8), name="W", dtype="bfloat16")
    out = dense(X, W)
    dag = ComputeDAG([X, W, te.compute(out.shape, lambda i, j: out[i, j].astype("float32"), name="wide")])
    with LocalRunner() as runner:
        reference = _load_reference(str(runner._reference(dag)), OrderedDict())
    assert reference.precision == "bfloat16" and PRECISION not in reference.arrays
    assert reference.check("wide").rtol == 2e-2


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "bool"])
def test_integers_and_bools_must_match_exactly(dtype):
    expected = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    assert compare("q", expected.copy(), expected) is None
    got = expected.copy()
    got[2, 1] = not got[2, 1] if dtype == "bool" else got[2, 1] + 1
    assert "at index (2, 1)" in compare("q", got, expected) and "exact, for " + dtype in compare("q", got, expected)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8", "bool"])
def test_poisoned_buffers_differ_from_the_reference_everywhere(dtype):
    expected = np.random.default_rng(1).integers(0, 3, 50).astype(dtype)
    if "float" in dtype:
        expected[7] = np.nan
    assert not np.any(poisoned(expected) == expected)
    assert "50 of 50 elements" in compare("x", poisoned(expected), expected)
    assert poisoned(expected).dtype == expected.dtype


def test_a_prepared_check_judges_each_candidate_on_its_own_as_isclose_does():
    """One OutputCheck serves every candidate of a workload; its verdicts are isclose's,
    also where the reference is infinite or NaN (no finite value is close to inf)."""
    rng = np.random.default_rng(2)
    expected = rng.uniform(-3, 3, 1000).astype(np.float32)
    expected[[10, 20, 30]] = [np.inf, -np.inf, np.nan]
    check = OutputCheck("y", expected)
    assert check(expected.copy()) is None
    for index, value in ((10, 5.0), (20, np.inf), (30, 1.0), (40, np.nan), (50, expected[50] + 0.01)):
        got = expected.copy()
        got[index] = value
        assert f"at index ({index},)" in check(got) and "1 of 1000 elements" in check(got)
    assert check(expected.copy()) is None  # nothing of an earlier candidate stays behind
    noisy = expected * np.float32(1 + 9e-4)
    assert (check(noisy) is None) == bool(np.isclose(noisy, expected, rtol=1e-3, atol=check.atol,
                                                     equal_nan=True).all())
