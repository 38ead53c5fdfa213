"""A matrix product reads an operand made by a transpose of the last axis transposed itself
(``transpose_a``, ``transpose_b``), so that the transpose needs no copy: attention's keys."""

import numpy as np
import pytest

from tilecraft.graph import run_reference
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.transposed_operands import read_transposed


def queries_by_keys(axes, keys_shape, extra_reader=False):
    """q (2, 3, 4, 8) by the keys transposed by ``axes`` to (2, 3, 8, 4), each viewed as 6 matrices."""
    g = GraphBuilder()
    q = g.add_input("q", (2, 3, 4, 8), "float32")
    k = g.add_input("k", keys_shape, "float32")
    keys = g.emit("transpose", [k], {"axes": axes}, "keys")
    product = g.emit("batch_matmul", [g.emit("reshape", [q], {"newshape": (6, 4, 8)}, "q_3d"),
                                      g.emit("reshape", [keys], {"newshape": (6, 8, 4)}, "k_3d")], {}, "scores")
    outputs = [product, g.emit("relu", [keys], {}, "other")] if extra_reader else [product]
    return g.finish(outputs)


def computes_the_same(graph, rewritten):
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}
    expected, got = run_reference(graph, feeds), run_reference(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6)


@pytest.mark.parametrize("axes, keys_shape, left", [
    ((0, 1, 3, 2), (2, 3, 4, 8), []),  # the last two swapped: the product reads k itself
    ((0, 2, 3, 1), (2, 4, 3, 8), [(0, 2, 1, 3)]),  # the heads moved too: that transpose keeps the last axis last
    ((-4, -2, -1, -3), (2, 4, 3, 8), [(0, 2, 1, 3)]),  # the same, counted from the end
])
def test_keys_transposed_for_their_product_are_read_transposed_by_it(axes, keys_shape, left):
    graph = queries_by_keys(axes, keys_shape)
    rewritten = read_transposed(graph)
    product = next(n for n in rewritten.nodes if n.op == "batch_matmul")
    assert product.attrs == {"transpose_b": True}
    assert [n.attrs["axes"] for n in rewritten.nodes if n.op == "transpose"] == left
    assert rewritten.values[product.inputs[1]].shape == (6, 4, 8)
    computes_the_same(graph, rewritten)


@pytest.mark.parametrize("axes, keys_shape, extra_reader", [
    ((0, 1, 3, 2), (2, 3, 4, 8), True),  # the transpose is read by another node too: it is made anyway
    ((1, 0, 2, 3), (3, 2, 8, 4), False),  # the last axis stays last: a view already
])
def test_a_transpose_stays_where_reading_it_transposed_saves_nothing(axes, keys_shape, extra_reader):
    graph = queries_by_keys(axes, keys_shape, extra_reader)
    assert read_transposed(graph).nodes == graph.nodes


def test_a_reshape_that_mixes_the_matrix_axes_with_the_batch_is_left_alone():
    g = GraphBuilder()
    a = g.add_input("a", (4, 6), "float32")
    k = g.add_input("k", (2, 4, 3), "float32")
    flat = g.emit("reshape", [g.emit("transpose", [k], {"axes": (0, 2, 1)}, "kt")], {"newshape": (6, 4)}, "rows")
    graph = g.finish([g.emit("matmul", [a, flat], {}, "product")])
    assert read_transposed(graph).nodes == graph.nodes


def test_both_operands_and_a_flag_already_set_are_flipped():
    """(xᵀ)ᵀ-style: a 2-D matmul whose A is a transpose and whose B is read transposed already."""
    g = GraphBuilder()
    x = g.add_input("x", (8, 5), "float32")
    y = g.add_input("y", (8, 3), "float32")
    a = g.emit("transpose", [x], {"axes": (1, 0)}, "xt")
    b = g.emit("transpose", [y], {}, "yt")  # no axes: reversed, as numpy.transpose
    graph = g.finish([g.emit("matmul", [a, b], {"transpose_b": True}, "product")])
    rewritten = read_transposed(graph)
    assert [(n.op, n.inputs, n.attrs) for n in rewritten.nodes] == [
        ("matmul", (x, y), {"transpose_a": True, "transpose_b": False})]
    computes_the_same(graph, rewritten)
