"""3x3 convolutions rewritten into Winograd's three kernels (``ops/winograd.py``), on CPUs.

A stride-1 3x3 convolution with constant weights becomes an input transform, one matrix
product a point of the transformed tile (its weights transformed here, once, as a
constant) and an output transform, which the nodes after the convolution (bias, residual,
ReLU) fuse into as they fused into the convolution. The products do 2.25x fewer multiplies
with 2x2 output tiles and 4x fewer with 4x4; their weights are 16/9 or 4x the convolution's,
so a layer whose weights outweigh its pixels (ResNet-50's 7x7 layers: 9.4 MB of weights for
49 pixels) stays direct.
See docs/experiments/winograd.md for the figures that chose these rules.
"""

from __future__ import annotations

from typing import Collection

import numpy as np

from ..ops.common import pair, padding4
from ..ops.winograd import KERNEL, input_transform, output_transform, tiles, winograd_weights
from .builder import unique_name
from .ir import Graph, Node, Value
from .passes import add_constant, add_value, eliminate_dead_code

WIDE_TILE = 4  # F(4x4, 3x3): 4x fewer multiplies, where 4 divides the output (no tile computed past its edge)
TILE = 2  # F(2x2, 3x3) elsewhere: 2.25x fewer, transforms of 0 and +-1
MIN_OUTPUT = 8  # output rows and columns: below, the transformed weights cost more than the products save
MIN_CHANNELS = 64  # channels in and out, each at least this, and their product at least MIN_PRODUCT:
MIN_PRODUCT = {TILE: 8192, WIDE_TILE: 4096}  # with fewer, moving the transformed tiles costs more than the
# products save (64 x 64 with 2x2 tiles lost: its tiles are 4x the pixels, 2.25x with 4x4)


def winograd_convolutions(graph: Graph, direct: Collection[str] = ()) -> Graph:
    """``graph`` with each convolution that ``_eligible`` accepts computed by Winograd's
    algorithm, but for the nodes named in ``direct``."""
    rewritten = Graph(graph.inputs, graph.outputs, [], dict(graph.constants), dict(graph.values))
    names = {node.name for node in graph.nodes}
    for node in graph.nodes:
        if node.name in direct or not _eligible(node, graph.values, graph.constants):
            rewritten.nodes.append(node)
            continue
        data, kernel, out = graph.values[node.inputs[0]], graph.values[node.inputs[1]], graph.values[node.output]
        batch, out_h, out_w, filters = out.shape
        m = _tile(out)
        points, count = (m + KERNEL - 1) ** 2, batch * tiles(out_h, m) * tiles(out_w, m)
        into = add_constant(rewritten, f"{node.name}_winograd_in", input_transform(m))
        back = add_constant(rewritten, f"{node.name}_winograd_out", output_transform(m))
        weights = add_constant(rewritten, f"{kernel.name}_winograd", winograd_weights(graph.constants[kernel.name], m))
        transformed = add_value(rewritten, f"{node.output}_tiles", (points, count, data.shape[3]), data.dtype)
        product = add_value(rewritten, f"{node.output}_products", (points, count, filters), data.dtype)
        padding = padding4(node.attrs.get("padding", 0), node.op)
        for op, inputs, output, attrs, name in (
                ("winograd_input", (data.name, into), transformed, {"m": m, "padding": padding}, "input"),
                ("winograd_matmul", (transformed, weights), product, {}, "matmul"),
                ("winograd_output", (product, back), node.output, {"m": m, "shape": (batch, out_h, out_w)}, "")):
            unique = unique_name(f"{node.name}_{name}", names) if name else node.name
            names.add(unique)
            rewritten.nodes.append(Node(op, inputs, output, attrs, unique))
    return eliminate_dead_code(rewritten)


def stages_of(rewritten: Graph) -> dict[str, tuple[str, str, str]]:
    """For each convolution rewritten, by its node's name (its output transform's), the outputs
    of its input transform, products and output transform."""
    producers = {node.output: node for node in rewritten.nodes}
    stages = {}
    for node in rewritten.nodes:
        if node.op == "winograd_output":
            products = node.inputs[0]
            stages[node.name] = (producers[products].inputs[0], products, node.output)
    return stages


def _eligible(node: Node, values: dict[str, Value], constants: dict[str, np.ndarray]) -> bool:
    """A float32 stride-1, undilated, ungrouped NHWC 3x3 convolution of constant weights whose
    output is at least ``MIN_OUTPUT`` square, with enough channels in and out for the products
    to outweigh the transforms: a tile's transforms cost about 16/F + 4/C of its products
    (C channels in, F out), and its transformed tiles are 4x the pixels they come from with
    2x2 tiles, 2.25x with 4x4 (``MIN_PRODUCT``)."""
    if node.op != "conv2d_nhwc" or len(node.inputs) != 2 or node.inputs[1] not in constants:
        return False
    kernel, out = values[node.inputs[1]], values[node.output]
    channels_in, channels_out = kernel.shape[2:]
    return (kernel.dtype == "float32" and kernel.shape[:2] == (KERNEL, KERNEL) and min(channels_in, channels_out)
            >= MIN_CHANNELS and channels_in * channels_out >= MIN_PRODUCT[_tile(out)]
            and pair(node.attrs.get("stride", 1), node.op, "stride") == (1, 1)
            and pair(node.attrs.get("dilation", 1), node.op, "dilation") == (1, 1)
            and node.attrs.get("groups", 1) == 1 and min(out.shape[1:3]) >= MIN_OUTPUT)


def _tile(out: Value) -> int:
    """The output tile of a convolution's NHWC output: 4x4 where 4 divides it, else 2x2."""
    return WIDE_TILE if out.shape[1] % WIDE_TILE == 0 and out.shape[2] % WIDE_TILE == 0 else TILE
