"""Convolutions and pools in NHWC, the layout in which channels are the contiguous,
vectorizable axis (a tuned 3x3 ResNet-50 convolution: about 120 GFLOPS in NHWC against
90 in NCHW on the development machine).

ONNX models are NCHW. ``convert_layout`` rewrites each convolution, depthwise convolution
and pool into its NHWC form between two transposes (kernels re-laid out once, as
constants), then moves transposes below the element-wise and broadcast nodes that follow,
and below concatenations, slices and batch norms (their axes renamed: channels are NHWC's
axis 3; a pre-activation network normalizes before its convolutions), and
cancels inverse pairs, so that activations stay NHWC from one convolution to the next
through the branches of an inception or dense block, and only the model's edges, and nodes
that care about the layout (a Flatten, a softmax over channels), see a transpose.
"""

from __future__ import annotations

import numpy as np

from .ir import Graph, Node, Value
from .operators import BROADCAST, ELEMENTWISE, OPERATORS
from .passes import eliminate_dead_code

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
_KERNEL_TO_NHWC = {"conv2d": ("conv2d_nhwc", (2, 3, 1, 0)),  # OIHW -> HWIO
                   "depthwise_conv2d": ("depthwise_conv2d_nhwc", (2, 3, 0, 1))}  # [C, M, KH, KW] -> [KH, KW, C, M]
_POOLS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d")
_NHWC_AXIS = {axis: TO_NHWC.index(axis) for axis in range(4)}  # where an NCHW axis is in NHWC


def convert_layout(graph: Graph) -> Graph:
    """The same computation with convolutions and pools in NHWC (see the module doc)."""
    rewriter = _Rewriter(graph)
    for node in graph.nodes:
        rewriter.convert(node)
    return eliminate_dead_code(rewriter.sink_and_cancel())


class _Rewriter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[Node] = []
        self.constants = dict(graph.constants)
        self.values = dict(graph.values)
        self.names = {n.name for n in graph.nodes}

    def convert(self, node: Node) -> None:
        rank4 = len(self.values[node.inputs[0]].shape) == 4 if node.inputs else False
        if node.op in _KERNEL_TO_NHWC and rank4 and node.inputs[1] in self.constants:
            op, kernel_perm = _KERNEL_TO_NHWC[node.op]
            kernel = self.constant(f"{node.inputs[1]}_nhwc", self.constants[node.inputs[1]].transpose(kernel_perm))
            self.wrap(node, op, [self.transpose(node.inputs[0], TO_NHWC, node.name), kernel], node.attrs)
        elif node.op in _POOLS and rank4:
            self.wrap(node, node.op, [self.transpose(node.inputs[0], TO_NHWC, node.name)],
                      {**node.attrs, "layout": "NHWC"})
        else:
            self.nodes.append(node)

    def wrap(self, node: Node, op: str, inputs: list[str], attrs: dict) -> None:
        """``op`` on NHWC inputs, then a transpose back to ``node``'s NCHW output."""
        shape = tuple(self.values[node.output].shape[p] for p in TO_NHWC)
        inner = self.value(f"{node.output}_nhwc", shape, self.values[node.output].dtype)
        self.nodes.append(Node(op, tuple(inputs), inner, dict(attrs), self.node_name(f"{node.name}_nhwc")))
        self.nodes.append(Node("transpose", (inner,), node.output, {"axes": TO_NCHW}, node.name))

    def transpose(self, source: str, perm: tuple, hint: str) -> str:
        shape = tuple(self.values[source].shape[p] for p in perm)
        out = self.value(f"{source}_t", shape, self.values[source].dtype)
        self.nodes.append(Node("transpose", (source,), out, {"axes": perm}, self.node_name(f"{hint}_transpose")))
        return out

    def sink_and_cancel(self) -> Graph:
        """Transposes to NCHW moved below element-wise nodes, then pairs that undo each other removed."""
        producers = {n.output: n for n in self.nodes}
        nodes = []
        for node in self.nodes:
            moved = self.sink(node, producers)
            nodes += moved
            producers.update((n.output, n) for n in moved)
        alias: dict[str, str] = {}
        for node in nodes:
            source = producers.get(node.inputs[0]) if node.op == "transpose" else None
            if (node.attrs.get("axes") == TO_NHWC and source is not None and source.op == "transpose"
                    and source.attrs.get("axes") == TO_NCHW and node.output not in self.graph.outputs):
                alias[node.output] = alias.get(source.inputs[0], source.inputs[0])
        nodes = [Node(n.op, tuple(alias.get(i, i) for i in n.inputs), n.output, n.attrs, n.name)
                 for n in nodes if n.output not in alias]
        return Graph(self.graph.inputs, self.graph.outputs, nodes, self.constants, self.values)

    def sink(self, node: Node, producers: dict[str, Node]) -> list[Node]:
        """``node`` computed in NHWC and transposed after, if all it reads is transposed to
        NCHW or constant; else ``node`` unchanged."""
        attrs = _nhwc_attrs(node)
        if attrs is None or len(self.values[node.output].shape) != 4:
            return [node]
        inputs, moved = [], False
        for position, name in enumerate(node.inputs):
            producer = producers.get(name)
            if node.op == "batch_norm" and position > 0:  # its parameters are indexed by the axis renamed
                inputs.append(name)
            elif producer is not None and producer.op == "transpose" and producer.attrs.get("axes") == TO_NCHW:
                inputs.append(producer.inputs[0])
                moved = True
            elif name in self.constants and self.constants[name].ndim <= 4:
                array = self.constants[name]
                inputs.append(self.constant(f"{name}_nhwc", array.reshape((1,) * (4 - array.ndim) + array.shape)
                                            .transpose(TO_NHWC)))
            else:
                return [node]
        if not moved:
            return [node]
        shape = tuple(self.values[node.output].shape[p] for p in TO_NHWC)
        inner = self.value(f"{node.output}_nhwc", shape, self.values[node.output].dtype)
        return [Node(node.op, tuple(inputs), inner, attrs, self.node_name(f"{node.name}_nhwc")),
                Node("transpose", (inner,), node.output, {"axes": TO_NCHW}, self.node_name(f"{node.name}_nchw"))]

    def constant(self, hint: str, array: np.ndarray) -> str:
        name = self.value(hint, array.shape, array.dtype.name)
        self.constants[name] = np.ascontiguousarray(array)
        return name

    def value(self, hint: str, shape: tuple, dtype: str) -> str:
        name, k = hint, 0
        while name in self.values:
            k += 1
            name = f"{hint}_{k}"
        self.values[name] = Value(name, tuple(shape), dtype)
        return name

    def node_name(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.names:
            k += 1
            name = f"{hint}_{k}"
        self.names.add(name)
        return name


def _nhwc_attrs(node: Node) -> dict | None:
    """``node``'s attributes for the same node on NHWC inputs: an element-wise or broadcast
    node's as they are, a concatenation's, a slice's or a batch norm's with their axes renamed; None for a
    node that layout changes otherwise."""
    if node.op in ("concat", "batch_norm"):
        return {**node.attrs, "axis": _NHWC_AXIS[node.attrs["axis"] % 4]}
    if node.op == "strided_slice":
        axes = node.attrs.get("axes") or range(len(node.attrs["begin"]))
        return {**node.attrs, "axes": tuple(_NHWC_AXIS[axis % 4] for axis in axes)}
    if OPERATORS[node.op].pattern in (ELEMENTWISE, BROADCAST) and "axis" not in node.attrs:
        return node.attrs
    return None
