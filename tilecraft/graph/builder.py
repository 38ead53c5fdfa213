"""GraphBuilder: a graph made node by node, with shapes inferred and constants folded as it grows.

Each emitted node is built alone from placeholders of its inputs' shapes; its te output
gives the node's shape and dtype, so the operators' own shape rules are the only ones. A
node whose inputs are all constants is evaluated at once with the te reference evaluator
and becomes a constant (shape arithmetic, transposed or reshaped weights), never a node.
A float16 or bfloat16 node that accumulates (a heavy or a reduction pattern: products, sums,
softmax) computes in float32 between casts, so that its sums are rounded to its type once, as
the reference rounds them, and not at every step of a compiled loop.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ..errors import TeError
from ..te.dtype import DTYPES, HALVES, supported
from .ir import Graph, Node, Value
from .operators import HEAVY, OPERATORS, REDUCTION, build_alone
from .reference import evaluate_node

_INDEX_VALUED = ("argmax", "argmin")


def identifier(text: str) -> str:
    """``text`` as a C-safe identifier: te stage names become names in generated code."""
    name = re.sub(r"\W+", "_", text).strip("_") or "node"
    return name if name[0].isalpha() else f"n{name}"


def unique_name(hint: str, taken) -> str:
    """``hint``, or ``hint_1``, ``hint_2``... the first not in ``taken``."""
    name, k = hint, 0
    while name in taken:
        k += 1
        name = f"{hint}_{k}"
    return name


class GraphBuilder:
    """Collects inputs, constants and nodes; ``finish`` gives the Graph. Node names are made unique identifiers."""

    def __init__(self) -> None:
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}
        self._node_names: set[str] = set()

    def add_input(self, name: str, shape: Sequence[int], dtype: str) -> str:
        self.inputs.append(self._define(name, tuple(shape), dtype))
        return name

    def add_constant(self, name: str, array: np.ndarray) -> str:
        array = np.asarray(array)
        self._define(name, array.shape, array.dtype.name)
        self.constants[name] = array
        return name

    def fresh_value(self, hint: str) -> str:
        return unique_name(hint, self.values)

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any], name: str,
             output: str | None = None) -> str:
        """Add ``output = op(*inputs, **attrs)`` (a fresh output name when None), or fold it to a constant."""
        accumulates = op in OPERATORS and OPERATORS[op].pattern in (HEAVY, REDUCTION) and op not in _INDEX_VALUED
        half = next((self.values[i].dtype for i in inputs if self.values[i].dtype in HALVES), None)
        if accumulates and half is not None:
            wide = [self.emit("cast", [i], {"dtype": "float32"}, f"{name}_float32")
                    if self.values[i].dtype in HALVES else i for i in inputs]
            return self.emit("cast", [self.emit(op, wide, attrs, name)], {"dtype": half}, f"{name}_{half}", output)
        node = Node(op, tuple(inputs), output or self.fresh_value(f"{name}_{op}"), dict(attrs),
                    unique_name(identifier(name), self._node_names))
        if all(i in self.constants for i in node.inputs):
            return self.add_constant(node.output, evaluate_node(node, self.values, self.constants))
        _, out = build_alone(node, self.values)
        self._node_names.add(node.name)
        self._define(node.output, out.shape, out.dtype)
        self.nodes.append(node)
        return node.output

    def finish(self, outputs: Sequence[str]) -> Graph:
        return Graph(list(self.inputs), list(outputs), list(self.nodes), dict(self.constants), dict(self.values))

    def _define(self, name: str, shape: tuple[int, ...], dtype: str) -> Value:
        if name in self.values:
            raise TeError(f"the graph already has a value named {name!r}; every value must be defined once")
        if not supported(dtype):
            raise TeError(f"value {name} has dtype {dtype}; tilecraft supports {', '.join(DTYPES)}")
        value = self.values[name] = Value(name, tuple(int(n) for n in shape), dtype)
        return value
