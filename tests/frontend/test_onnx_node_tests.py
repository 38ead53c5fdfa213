"""The ONNX backend node tests of every supported operator: each passes, or is refused as unsupported
(a skip), through the NumPy reference runner and through compiled native kernels."""

import warnings

import pytest

pytest.importorskip("onnx")
from node_cases import PASS, UNSUPPORTED, collect_cases, run_case  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the generators overflow casts on purpose
    CASES = collect_cases(supported_only=True)


@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "compiled"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_node_case(case, compiled, kernel_cache):
    status, message = run_case(case, compiled=compiled, cache_dir=kernel_cache)
    if status == UNSUPPORTED:
        pytest.skip(message)
    assert status == PASS, message
