"""bfloat16 products summed two steps at a time with AVX-512 BF16 (``codegen/dot_pairs.py``):
the register tile's reduction loop taken in pairs where the compiler targets it, the usual
loop elsewhere, both equal to NumPy's float32 sum rounded once."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen import vector_math
from tilecraft.ops.common import product_of
from tilecraft.search.default import default_schedule

HOST = tc.Target.host()  # the pairs where this machine has AVX-512 BF16, else the usual loop


def bfloat16_matmul(n, l, m, a_transposed=False, out_dtype=None):
    A = te.placeholder((l, n) if a_transposed else (n, l), name="A", dtype="bfloat16")
    B = te.placeholder((l, m), name="B", dtype="bfloat16")
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(product_of(A[k, i] if a_transposed else A[i, k], B[k, j], out_dtype),
                                               axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


@pytest.mark.parametrize("a_transposed, out_dtype", [(False, None), pytest.param(True, None, marks=pytest.mark.slow),
                                                     pytest.param(False, "float32", marks=pytest.mark.slow)])
def test_a_bfloat16_register_tile_sums_pairs_where_the_cpu_has_avx512_bf16(a_transposed, out_dtype, kernel_cache,
                                                                          monkeypatch):
    """A's pair one 4-byte load where its elements are neighbours (two where A is transposed);
    summed into bfloat16 or, each operand cast, into float32. Then the usual loop alone (the
    pairs' guard made false), as a CPU without AVX-512 BF16 compiles it."""
    dag = bfloat16_matmul(48, 96, 64, a_transposed, out_dtype)
    inputs = dag.random_inputs(np.random.default_rng(0))
    want = dag.evaluate_numpy(inputs)[0].astype(np.float32)
    tolerance = dict(rtol=1e-5, atol=1e-4) if out_dtype else dict(rtol=8e-3, atol=8e-2)
    kernel = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache)
    assert "#if defined(__AVX512BF16__)" in kernel.source and "tc_dot_bf16x" in kernel.source
    assert ("*(tc_bf16_pair*)&A[" in kernel.source) != a_transposed
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, **tolerance)
    monkeypatch.setattr(vector_math, "bfloat16_dot_guard", lambda lanes: "#if 0\n")
    kernel = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache)
    assert "#if 0" in kernel.source
    np.testing.assert_allclose(kernel(*inputs).astype(np.float32), want, **tolerance)


@pytest.mark.slow  # its siblings above stay quick
def test_only_a_bfloat16_sum_of_an_even_reduction_is_paired(kernel_cache):
    """float16 and float32 products have no such instruction; a reduction loop of odd length
    none to pair."""
    for dag in (bfloat16_matmul(48, 95, 64), tc.SearchTask(func="matmul", args=(48, 96, 64, "float16")).compute_dag,
                tc.SearchTask(func="matmul", args=(48, 96, 64)).compute_dag):
        source = tc.build(default_schedule(dag, HOST), HOST, cache_dir=kernel_cache).source
        assert "tc_dot_bf16" not in source and "__AVX512BF16__" not in source
