"""The ONNX backend node tests of every supported operator: each passes, or is refused as unsupported
(a skip), through the NumPy reference runner and through compiled native kernels."""

import warnings

import pytest

pytest.importorskip("onnx")
from node_cases import PASS, UNSUPPORTED, collect_cases, run_case  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the generators overflow casts on purpose
    CASES = collect_cases(supported_only=True)

# One case an operator (the first of its cases).
_FIRST = {}
for _case in CASES:
    if _case.model.graph.node:
        _FIRST.setdefault(_case.model.graph.node[0].op_type, _case)
FIRST_OF_EACH_OPERATOR = list(_FIRST.values())

# Compiling ~1,400 cases takes two minutes; the `not slow` subset compiles one case of
# each kind of kernel (element-wise, broadcast, matmul, pooling, reduction, softmax, data
# movement, a resize's axis product; convolutions compile in tests/model/test_compiled.py's
# quick model, float16 products in tests/graph/test_half.py's) and runs the first case of
# every operator through the reference.
FAST_COMPILED = {"test_abs", "test_add_bcast", "test_gemm_default_no_bias", "test_maxpool_2d_pads",
                 "test_reduce_mean_default_axes_keepdims_example", "test_softmax_example",
                 "test_transpose_all_permutations_3", "test_concat_2d_axis_1", "test_resize_upsample_scales_linear"}
FAST_REFERENCE = {case.name for case in FIRST_OF_EACH_OPERATOR}


@pytest.mark.parametrize("case, compiled", [
    pytest.param(case, compiled, id=f"{case.name}-{'compiled' if compiled else 'reference'}",
                 marks=() if case.name in (FAST_COMPILED if compiled else FAST_REFERENCE) else pytest.mark.slow)
    for compiled in (False, True) for case in CASES])
def test_node_case(case, compiled, kernel_cache):
    status, message = run_case(case, compiled=compiled, cache_dir=kernel_cache)
    if status == UNSUPPORTED:
        pytest.skip(message)
    assert status == PASS, message


# One case an operator, compiled for a GPU (its CUDA C built) and emulated: every supported
# operator runs there, float16 ones too.
@pytest.mark.slow
@pytest.mark.parametrize("case", FIRST_OF_EACH_OPERATOR, ids=[case.name for case in FIRST_OF_EACH_OPERATOR])
def test_node_case_on_a_gpu(case, kernel_cache):
    status, message = run_case(case, compiled=True, cache_dir=kernel_cache, target="cuda -arch=sm_90")
    if status == UNSUPPORTED:
        pytest.skip(message)
    assert status == PASS, message


def test_the_cases_compiled_in_the_fast_subset_are_supported_cases():
    assert FAST_COMPILED <= {case.name for case in CASES}
