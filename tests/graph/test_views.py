"""Strided views: which slices, transposes and reshapes kernels read or write where the elements lie
in another array, instead of through a copy, and where in that array they lie."""

import math

import numpy as np
import pytest

from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.fuse import partition
from tilecraft.graph.views import View, place, reshaped
from tilecraft.ops.transform import row_major


@pytest.mark.parametrize("shape, axes, new", [
    ((2, 3, 4), (0, 1, 2), (6, 4)), ((2, 3, 4), (1, 0, 2), (6, 4)), ((2, 3, 4), (1, 0, 2), (3, 2, 2, 2)),
    ((1, 4, 1, 6), (2, 1, 0, 3), (4, 6)), ((4, 6), (1, 0), (24,)), ((3, 4, 5), (0, 2, 1), (3, 20)),
    ((3, 4, 5), (0, 2, 1), (3, 5, 2, 2)), ((2, 1, 3), (1, 0, 2), (1, 1, 6)),
])
def test_a_reshape_is_a_view_exactly_where_numpys_is_and_lies_where_numpys_does(shape, axes, new):
    """The array's elements are their own flat positions, so a view's elements are its addresses."""
    flat = np.arange(math.prod(shape))
    transposed = flat.reshape(shape).transpose(axes)
    strides = reshaped(transposed.shape, tuple(row_major(shape)[a] for a in axes), new)
    numpy_view = transposed.reshape(new)
    assert (strides is not None) == np.shares_memory(numpy_view, flat)
    if strides is not None:
        addresses = sum(np.arange(n).reshape([-1 if d == k else 1 for d in range(len(new))]) * s
                        for k, (n, s) in enumerate(zip(new, strides)))
        np.testing.assert_array_equal(addresses, numpy_view)


def views(graph):
    placement = place(graph, partition(graph))
    return placement.written, placement.read


@pytest.mark.parametrize("attrs, part, flat", [
    ({"begin": (1,), "end": (2,)}, (48, (48, 8, 1)), (48, (8, 1))),  # one of three along the first axis
    ({"begin": (0, 2), "end": (1, 4), "axes": (0, 1)}, (16, (48, 8, 1)), (16, (8, 1))),  # rows 2-3 of the first
    ({"begin": (0,), "end": (3,), "axes": (1,)}, None, None),  # three rows of each: no view as rows of 8
    ({"begin": (0,), "end": (6,), "strides": (2,), "axes": (1,)}, (0, (48, 16, 1)), (0, (16, 1))),  # every other row
    ({"begin": (0, -1), "end": (1, -7), "strides": (1, -1), "axes": (0, 1)}, None, None),  # rows backwards
    ({"begin": (0, 0), "end": (1, 6), "axes": (0, 2)}, (0, (48, 8, 1)), (0, (8, 1))),  # six of each row's eight
    ({"begin": (0,), "end": (8,), "strides": (2,), "axes": (2,)}, None, None),  # every other element: no vectors
])
def test_a_slice_and_its_reshape_are_read_where_they_lie_in_the_array_they_slice(attrs, part, flat):
    g = GraphBuilder()
    x = g.add_input("x", (3, 6, 8), "float32")
    sliced = g.emit("strided_slice", [x], attrs, "part")
    shape = g.values[sliced].shape
    rows = g.emit("reshape", [sliced], {"newshape": (math.prod(shape) // shape[-1], shape[-1])}, "flat")
    written, read = views(g.finish([g.emit("sigmoid", [rows], {}, "reader")]))
    assert not written
    assert read == ({} if part is None else {sliced: View(x, *part), rows: View(x, *flat)})


def test_a_slice_the_model_returns_is_its_own_array():
    g = GraphBuilder()
    x = g.add_input("x", (3, 6, 8), "float32")
    returned = g.emit("strided_slice", [x], {"begin": (0,), "end": (1,)}, "returned")
    read = g.emit("strided_slice", [x], {"begin": (1,), "end": (2,)}, "read")
    reshaped_read = g.emit("reshape", [read], {"newshape": (6, 8)}, "reshaped")
    graph = g.finish([returned, g.emit("sigmoid", [reshaped_read], {}, "reader"), reshaped_read])
    assert views(graph) == ({}, {})


def test_a_run_of_a_run_is_read_where_it_lies_in_the_first_array():
    """A split of a split (a recurrent layer's gates from one of its directions' weights)."""
    g = GraphBuilder()
    x = g.add_input("x", (3, 6, 8), "float32")
    rows = g.emit("reshape", [g.emit("strided_slice", [x], {"begin": (1,), "end": (2,)}, "direction")],
                  {"newshape": (6, 8)}, "rows")
    gate = g.emit("strided_slice", [rows], {"begin": (2,), "end": (4,)}, "gate")
    graph = g.finish([g.emit(op, [gate], {}, op) for op in ("sigmoid", "tanh")] + [g.emit("relu", [rows], {}, "other")])
    assert views(graph)[1][gate] == View(x, 64, (8, 1))  # element 64 of x


def test_heads_split_from_one_projection_are_read_in_it_and_the_keys_transposed_for_their_product_are_copied():
    """As attention's: the projection's columns reshaped into (token, q/k/v, head, channel), the
    heads moved before the tokens, q, k and v split off; the keys' tokens moved last."""
    g = GraphBuilder()
    x = g.add_input("x", (4, 2 * 3 * 8), "float32")
    split = g.emit("reshape", [x], {"newshape": (4, 3, 2, 8)}, "split")
    heads = g.emit("transpose", [split], {"axes": (1, 2, 0, 3)}, "heads")
    q, k, v = (g.emit("reshape", [g.emit("strided_slice", [heads], {"begin": (n,), "end": (n + 1,)}, f"{name}3")],
                      {"newshape": (2, 4, 8)}, name) for n, name in enumerate("qkv"))
    keys = g.emit("transpose", [k], {"axes": (0, 2, 1)}, "keys")
    graph = g.finish([g.emit("batch_matmul", [g.emit("batch_matmul", [q, keys], {}, "scores"), v], {}, "out")])
    written, read = views(graph)
    assert not written and keys not in read
    assert read[q] == View(split, 0, (8, 48, 1)) and read[k] == View(split, 16, (8, 48, 1))
    assert read[v] == View(split, 32, (8, 48, 1))


def transposed_product(axes, also_read=False):
    g = GraphBuilder()
    x = g.add_input("x", (2, 3, 8), "float32")
    heads = g.emit("relu", [x], {}, "heads")
    moved = g.emit("transpose", [g.emit("reshape", [heads], {"newshape": (1, 2, 3, 8)}, "shaped")], {"axes": axes},
                   "moved")
    return g.finish([moved, g.emit("tanh", [heads], {}, "other")] if also_read else [moved]), heads, moved


def test_a_kernels_only_output_is_written_transposed_where_the_last_axis_stays_last():
    """Attention's heads moved back after the tokens: the product writes rows of the transposed array
    (here the model's output; a transpose that an element-wise reader's kernel computes is no copy)."""
    graph, heads, moved = transposed_product((0, 2, 1, 3))
    assert views(graph) == ({heads: View(moved, 0, (8, 16, 1))}, {})
    assert views(transposed_product((0, 2, 1, 3), also_read=True)[0]) == ({}, {})  # its own array: read elsewhere
    assert views(transposed_product((0, 1, 3, 2))[0]) == ({}, {})  # the last axis moves: a copy
