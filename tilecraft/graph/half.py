"""16-bit products on a GPU: a float16 or bfloat16 model's matrix products and convolutions
read their 16-bit operands.

The ONNX importer computes a float16 product in float32 between casts (``builder.py``), so
that its sum is rounded to float16 once; its float16 weights, cast by a constant node,
become float32 constants. On a CPU that is the fast form, since the CPU computes in float32
anyway. On a GPU it doubles the bytes every product reads, adds a kernel for each cast of an
activation, and leaves tensor cores out: their sketch takes float16 operands
(``GpuTensorCoreTiling``). A float16 sum is kept in float32 by every kernel and by the
reference (``te.dtype.accumulates_in``, ``te/reference.py``), and rounded once when stored,
so the product on the float16 values themselves computes the same numbers: the casts go.
A bfloat16 product alike (tensor cores round its float32 accumulator as they store it).
A cast and a reshape commute, and the importer puts reshapes between a product and its casts
(a 3-D MatMul is a reshape, a 2-D product and a reshape back), so the casts are first moved
through them to the product. Products whose sizes tile badly are padded to whole tiles
(``padded_products``), float32 ones too.
"""

from __future__ import annotations

import math

import numpy as np

from ..target.cuda import TENSOR_CORE_TILE as TILE  # the products padded to its multiples
from ..te.dtype import HALVES, NUMPY_DTYPES
from .builder import unique_name
from .ir import Graph, Node
from .passes import add_constant, add_value, eliminate_dead_code, sink_reshapes

PRODUCTS = ("conv2d", "conv2d_nhwc", "conv2d_nhwc_gemm", "depthwise_conv2d", "depthwise_conv2d_nhwc",
            "conv2d_transpose", "dense", "matmul", "batch_matmul", "axis_matmul")
"""Operators that sum products of their inputs' elements, each element read as it is stored."""
EXACT = ("max_pool2d", "max", "min")
"""Reductions whose result is one of their inputs' elements: a 16-bit type holds it exactly."""


CPU_PRODUCTS = ("conv2d", "conv2d_nhwc", "dense", "matmul", "batch_matmul")
"""The products a CPU with AVX-512 BF16 computes on bfloat16 operands: it sums their pairs at
twice the float32 rate (``codegen/dot_pairs.py``), and their weights are half the bytes. Such
a convolution stays direct (Winograd's rewrite takes float32 ones, whose transforms would
round in bfloat16): untuned, bfloat16 ResNet-50 ran in 31 ms where its float32 products
between casts, Winograd's among them, took 38. Without the instruction, widening each element
made ResNet-50 9% and the BERT layer 6% slower than in float32 (``Target.has_bfloat16_dot``)."""


def half_products(graph: Graph, dtypes: tuple[str, ...] = HALVES, operators: tuple[str, ...] = (*PRODUCTS, *EXACT)
                  ) -> Graph:
    """``cast16(product(cast32(a), W))`` -> ``product(a, W16)`` wherever every operand is a float16
    value cast to float32 or a float32 constant that float16 holds exactly (a float16 weight the
    importer cast), and of bfloat16 alike; a product with any other operand, or read before
    its cast, stays as it is. So do the reductions that pick an element (``EXACT``: a max pool).
    Only for the 16-bit ``dtypes`` and the ``operators`` given (a CPU's: bfloat16's
    ``CPU_PRODUCTS``)."""
    graph = _casts_beside_products(graph, dtypes)
    halves: dict[tuple[str, str], str] = {}  # (a float32 constant, a 16-bit type) -> its copy, made once
    replaced: dict[str, Node] = {}  # a product's output -> the product on 16-bit operands
    rounded: set[str] = set()  # the casts that such a product computes the output of
    for node in graph.nodes:
        readers = graph.consumers(node.output)
        half = _rounds_to(readers[0]) if len(readers) == 1 else None
        if node.op not in operators or node.output in graph.outputs or half not in dtypes:
            continue
        operands = [_half_operand(graph, name, halves, half) for name in node.inputs]
        if None in operands:
            continue
        replaced[node.output] = Node(node.op, tuple(operands), readers[0].output, node.attrs, node.name)
        rounded.add(readers[0].output)
    graph.nodes = [replaced.get(node.output, node) for node in graph.nodes if node.output not in rounded]
    return eliminate_dead_code(graph)


MAX_PADDING = 2.0
"""The most products, padded to whole tiles, a convolution or matrix product computes on
tensor cores for every one it needs. Tensor cores compute float16 products about 15 times as fast as CUDA
cores compute float32 (H100: 990 against 67 TFLOPS), and the padding loads nothing (its
windows and weights are zeros, not reads): twice the products still leaves them far ahead;
beyond, padding takes most of every tile (a 3x3 convolution of 3 channels into 24 on a 7x7
image: 2.06 times)."""


def gemm_convolutions(graph: Graph) -> Graph:
    """Each float16 (or bfloat16) NHWC convolution computed as one matrix product (``conv2d_nhwc_gemm``,
    implicit GEMM: the product tensor cores take), its output pixels, channels and window
    (kernel rows x columns x input channels) padded to multiples of ``TILE`` where they are
    not, if that adds at most ``MAX_PADDING`` (a 14x14 image's 196 pixels become 208 rows,
    a 7x7's 49 become 64), then viewed as NHWC again; the reshape sinks below the element-wise
    nodes after it (a residual viewed as rows too), which fuse as before."""
    graph = Graph(graph.inputs, graph.outputs, list(graph.nodes), dict(graph.constants), dict(graph.values))
    nodes, views = [], set()
    for node in graph.nodes:
        out = graph.values[node.output]
        kernel = graph.values[node.inputs[1]].shape if node.op == "conv2d_nhwc" else ()
        if node.op != "conv2d_nhwc" or graph.values[node.inputs[0]].dtype not in HALVES \
                or node.attrs.get("groups", 1) != 1 \
                or _padding(math.prod(out.shape[:3]), out.shape[3], math.prod(kernel[:3])) > MAX_PADDING:
            nodes.append(node)
            continue
        rows = add_value(graph, f"{node.output}_rows", (math.prod(out.shape[:3]), out.shape[3]), out.dtype)
        attrs = {name: value for name, value in node.attrs.items() if name != "groups"} | {"multiple": TILE}
        view = unique_name(f"{node.name}_nhwc", {n.name for n in graph.nodes})
        views.add(view)
        nodes += [Node("conv2d_nhwc_gemm", node.inputs, rows, attrs, node.name),
                  Node("reshape", (rows,), node.output, {"newshape": out.shape}, view)]
    graph.nodes = nodes
    return sink_reshapes(graph, only=frozenset(views)) if views else graph


FLOAT32_MAX_PADDING = 1.25
"""The most products a float32 matrix product padded to whole tiles computes for every one it
needs. On CUDA cores the padding costs as much as the rest, so a float32 product is padded
only where a size has no divisor from 8 to 16 (``_few_divisors``): a GPU tiling splits its
loops by divisors, so a prime such as a ViT's 197 tokens left the default candidate one
thread a block along it (the ViT layer's scores 465,708 blocks of one thread each)."""


def padded_products(graph: Graph) -> Graph:
    """Each matrix product (``dense``, ``matmul``, ``batch_matmul``) computed padded to whole
    tiles of ``TILE`` and cropped (``multiple``): a 16-bit one whose rows, columns or reduction
    are no multiple of it, if that adds at most ``MAX_PADDING`` (a ViT's 197 tokens become 208
    rows, and its products take tensor cores); a float32 one where a size has too few divisors
    for the threads, if that adds at most ``FLOAT32_MAX_PADDING``."""
    nodes = []
    for node in graph.nodes:
        shapes = [graph.values[name].shape for name in node.inputs[:2]]
        sizes = _product_sizes(node, shapes) if node.op in ("dense", "matmul", "batch_matmul") else None
        dtype = graph.values[node.inputs[0]].dtype
        if sizes is not None and (dtype in HALVES and any(s % TILE for s in sizes) and _padding(*sizes) <= MAX_PADDING
                                  or dtype == "float32" and any(map(_few_divisors, sizes))
                                  and _padding(*sizes) <= FLOAT32_MAX_PADDING):
            node = Node(node.op, node.inputs, node.output, {**node.attrs, "multiple": TILE}, node.name)
        nodes.append(node)
    return Graph(graph.inputs, graph.outputs, nodes, dict(graph.constants), dict(graph.values))


def _few_divisors(size: int) -> bool:
    """Whether ``size`` has no divisor from ``TILE // 2`` to ``TILE``, the threads a GPU tiling
    gives a loop (the default candidate: 8 and 16 threads along a product's rows and columns)."""
    return not any(size % d == 0 for d in range(TILE // 2, TILE + 1))


def _product_sizes(node: Node, shapes: list[tuple[int, ...]]) -> tuple[int, int, int]:
    """(M, K, N) of a ``dense`` (X [M, K], W [N, K]), ``matmul`` or ``batch_matmul``."""
    a, b = (shape[-2:] for shape in shapes)
    if node.op == "dense":
        return a[0], a[1], b[0]
    (m, k), n = (reversed(a) if node.attrs.get("transpose_a") else a), b[0 if node.attrs.get("transpose_b") else 1]
    return m, k, n


def _padding(*sizes: int) -> float:
    """How many products a product of ``sizes`` padded to whole tiles computes for each one it
    needs; infinite where a size is short of a tile (tensor cores do not take its crop)."""
    return math.prod(-(-size // TILE) * TILE / size for size in sizes) if min(sizes) >= TILE else math.inf


def _casts_beside_products(graph: Graph, dtypes: tuple[str, ...]) -> Graph:
    """The same graph, each widening cast of a 16-bit value (of ``dtypes``) moved below the
    reshapes that lead to products, each rounding cast to one above the reshape of a product it
    reads."""
    graph = Graph(graph.inputs, graph.outputs, list(graph.nodes), dict(graph.constants), dict(graph.values))
    moved = True
    while moved:
        moved, nodes = False, []
        producers = {node.output: node for node in graph.nodes}
        for node in graph.nodes:
            source = producers.get(node.inputs[0]) if node.inputs else None
            if node.op == "reshape" and source is not None and _casts_to(source, "float32") \
                    and graph.values[source.inputs[0]].dtype in dtypes \
                    and _toward_products(graph.consumers(node.output)):  # cast32, reshape: reshape, cast32
                nodes += _swapped(graph, node, source.inputs[0], node.attrs)
            elif _rounds_to(node) in dtypes and source is not None and source.op == "reshape" \
                    and source.output not in graph.outputs and len(graph.consumers(source.output)) == 1 \
                    and _toward_products([producers.get(source.inputs[0])]):  # reshape, cast16: cast16, reshape
                nodes += _swapped(graph, node, source.inputs[0], source.attrs)
            else:
                nodes.append(node)
                continue
            moved = True
        graph.nodes = nodes
    return eliminate_dead_code(graph)


def _toward_products(nodes: list[Node | None]) -> bool:
    """Whether ``nodes`` are products or reshapes, through which a cast moves to a product;
    elsewhere it stays, since element-wise nodes fuse with the node before a reshape, not after."""
    return bool(nodes) and all(node is not None and node.op in (*PRODUCTS, "reshape") for node in nodes)


def _swapped(graph: Graph, node: Node, source: str, reshape: dict) -> list[Node]:
    """``node`` (a reshape after a cast, or a cast after a reshape) as the other order, from ``source``."""
    names = {n.name for n in graph.nodes}
    if node.op == "reshape":  # the reshape first, of the 16-bit value; then the cast to float32
        half = graph.values[source].dtype
        middle = add_value(graph, f"{node.output}_{half}", graph.values[node.output].shape, half)
        return [Node("reshape", (source,), middle, reshape, unique_name(f"{node.name}_{half}", names)),
                Node("cast", (middle,), node.output, {"dtype": "float32"}, unique_name(f"{node.name}_cast", names))]
    half = node.attrs["dtype"]
    middle = add_value(graph, f"{source}_{half}", graph.values[source].shape, half)  # the cast first
    return [Node("cast", (source,), middle, {"dtype": half}, node.name),
            Node("reshape", (middle,), node.output, reshape, unique_name(f"{node.name}_reshape", names))]


def _casts_to(node: Node, dtype: str) -> bool:
    return node.op == "cast" and node.attrs.get("dtype") == dtype


def _rounds_to(node: Node) -> str | None:
    """The 16-bit type that ``node`` casts to, if it is such a cast."""
    dtype = node.attrs.get("dtype") if node.op == "cast" else None
    return dtype if dtype in HALVES else None


def _half_operand(graph: Graph, name: str, halves: dict[tuple[str, str], str], half: str) -> str | None:
    """The value of type ``half`` that operand ``name`` holds, or None where it holds more than
    that type can."""
    producer = graph.producer(name)
    if producer is not None and _casts_to(producer, "float32") and graph.values[producer.inputs[0]].dtype == half:
        return producer.inputs[0]
    key = (name, half)
    if key in halves or name not in graph.constants or graph.constants[name].dtype != np.float32:
        return halves.get(key)
    weights = graph.constants[name]
    narrow = weights.astype(NUMPY_DTYPES[half])
    if np.array_equal(narrow.astype(np.float32), weights, equal_nan=True):
        halves[key] = add_constant(graph, f"{name}_{half}", narrow)
    return halves.get(key)
