"""A cache's layout in memory: its rows padded (storage_align) or its dimensions reordered
(transform_layout on a write), as TVM's primitives; the values unchanged."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.errors import ScheduleError
from tilecraft.ir.lower import laid_out
from tilecraft.ir.nodes import Allocate, walk_stmts

from small_dags import matmul_relu  # tests/schedule/small_dags.py


def test_strides_are_padded_innermost_first_as_tvm_pads_them():
    assert laid_out((128, 32), ((0, 32, 8),)) == (40, 1)
    assert laid_out((32, 128), ((0, 32, 8),)) == (136, 1)
    assert laid_out((4, 6, 10), ((0, 8, 0), (1, 4, 1))) == (80, 13, 1)  # 13 ≡ 1 mod 4; 6 * 13 = 78 -> 80
    assert laid_out((4, 6, 10), ()) == () == laid_out((4, 6, 10), (), (0, 1, 2))


def test_dimensions_reordered_in_memory_take_their_padding_in_that_order():
    assert laid_out((128, 32), (), (1, 0)) == (1, 128)  # column major
    assert laid_out((128, 32), ((0, 32, 4),), (1, 0)) == (1, 132)  # axis 0 of the layout: k
    assert laid_out((2, 3, 4), (), (2, 0, 1)) == (3, 1, 6)


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


def test_a_cache_laid_out_column_major_on_the_cpu_computes_the_same_values():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    cached = sch.cache_read(sch.get_block("C"), 0, "global")
    sch.transform_layout(cached, ("write", 0), lambda i, k: (k, i))
    sch.storage_align(cached, 0, 0, 32, 4)  # the layout's rows, along i: 16 -> 36 apart
    buffers = {n.buffer.name: n.buffer for n in walk_stmts(tc.lower(sch).body) if isinstance(n, Allocate)}
    assert (buffers["A_global"].shape, buffers["A_global"].strides) == ((16, 8), (1, 36))
    a, b = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.build(sch)(a, b), dag.evaluate_numpy([a, b])[0], rtol=1e-5, atol=1e-5)
    again = tc.Trace.from_json(sch.trace.to_json()).replay(dag)
    assert again.state.stage("A_global").order == (1, 0)
    assert "buffer=['write', 0], index_map=lambda i, k: (k, i))" in sch.trace.to_python()


@pytest.mark.parametrize("index_map, message", [
    (lambda i, k: (k, k), "must reorder its indices, each once"),
    (lambda i, k: (k, i // 2), "must reorder its indices, each once"),
    (lambda i: (i,), "the map takes 1 indices but A_global has 2 dimensions"),
])
def test_a_write_layout_that_is_no_permutation_is_refused(index_map, message):
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    cached = sch.cache_read(sch.get_block("C"), 0, "global")
    with pytest.raises(ScheduleError, match=message):
        sch.transform_layout(cached, ("write", 0), index_map)
    with pytest.raises(ScheduleError, match="a tensor of the computation"):
        sch.transform_layout(sch.get_block("D"), ("write", 0), lambda i, j: (j, i))

