"""storage_align: a cache's rows padded in memory (TVM's primitive), the values unchanged."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.errors import ScheduleError
from tilecraft.ir.lower import aligned_strides
from tilecraft.ir.nodes import Allocate, walk_stmts

from small_dags import matmul_relu  # tests/schedule/small_dags.py


def test_strides_are_padded_innermost_first_as_tvm_pads_them():
    assert aligned_strides((128, 32), ((0, 32, 8),)) == (40, 1)
    assert aligned_strides((32, 128), ((0, 32, 8),)) == (136, 1)
    assert aligned_strides((4, 6, 10), ((0, 8, 0), (1, 4, 1))) == (80, 13, 1)  # 13 ≡ 1 mod 4; 6 * 13 = 78 -> 80
    assert aligned_strides((4, 6, 10), ()) == ()


def test_a_padded_cache_on_the_cpu_computes_the_same_values():
    """B read through a cache whose rows are 16 floats apart where they hold 12."""
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    cached = sch.cache_read(sch.get_block("C"), 1, "global")
    sch.storage_align(cached, 0, 0, 16, 0)
    buffers = {n.buffer.name: n.buffer for n in walk_stmts(tc.lower(sch).body) if isinstance(n, Allocate)}
    assert (buffers["B_global"].strides, buffers["B_global"].elements) == ((16, 1), 8 * 16)
    a, b = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.build(sch)(a, b), dag.evaluate_numpy([a, b])[0], rtol=1e-5, atol=1e-5)


def test_the_trace_keeps_it_through_json_and_python():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    sch.storage_align(sch.cache_read(sch.get_block("C"), 0, "global"), 0, 0, 32, 8)
    again = tc.Trace.from_json(sch.trace.to_json()).replay(dag)
    assert again.state.stage("A_global").align == ((0, 32, 8),)
    assert "sch.storage_align(block=b1, buffer_index=0, axis=0, factor=32, offset=8)" in sch.trace.to_python()


@pytest.mark.parametrize("block, args, message", [
    ("D", (0, 0, 32, 8), "writes D, a tensor of the computation whose layout the caller chose"),
    ("A_global", (0, 1, 32, 8), "axis 1 of A_global's 2-dimensional buffer must be one of 0 to 0"),
    ("A_global", (0, 0, 8, 8), "offset 8 between 0 and factor - 1"),
    ("A_global", (1, 0, 8, 0), "writes one buffer; buffer_index must be 0"),
])
def test_bad_arguments_are_refused_with_the_fix(block, args, message):
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    sch.cache_read(sch.get_block("C"), 0, "global")
    with pytest.raises(ScheduleError, match=message):
        sch.storage_align(sch.get_block(block), *args)
