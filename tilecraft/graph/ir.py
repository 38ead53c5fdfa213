"""The graph of a whole model: tilecraft operators connected by named values, as in Relay.

A ``Node`` names one operator of ``graph.operators.OPERATORS`` and the values it reads;
it has exactly one output. Weights are ``constants``: NumPy arrays that the operators
read as placeholders, so a weight can be packed ahead of time like any layout-free input.
Nodes stay separate here; later passes group them into fused subgraphs, each built into
one ``ComputeDAG`` by calling its nodes' builders in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Value:
    """A tensor flowing between nodes: a model input, a constant or a node's output."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True)
class Node:
    """``output = op(*inputs, **attrs)``; ``name`` is unique in the graph and names the node's te stages."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""


@dataclass(slots=True)
class Graph:
    """A model: ``nodes`` in topological order, ``values`` describing every input, constant and node output.

    An output may name an input or a constant (a model that folds to a constant).
    """

    inputs: list[Value]
    outputs: list[str]
    nodes: list[Node]
    constants: dict[str, np.ndarray]
    values: dict[str, Value]

    def producer(self, name: str) -> Node | None:
        """The node computing ``name``; None for inputs and constants."""
        return next((n for n in self.nodes if n.output == name), None)

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.nodes if name in n.inputs]

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def __str__(self) -> str:
        lines = [f"graph({', '.join(f'{v.name}: {v}' for v in self.inputs)}) -> ({', '.join(self.outputs)})"]
        for node in self.nodes:
            args = ", ".join(f"{i}*" if i in self.constants else i for i in node.inputs)
            attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs.items())
            lines.append(f"  {node.output}: {self.values[node.output]} = {node.op}({args}"
                         f"{'; ' + attrs if attrs else ''})  # {node.name}")
        if self.constants:
            lines.append(f"  * constants: {len(self.constants)} tensors, "
                         f"{sum(a.size for a in self.constants.values())} elements")
        return "\n".join(lines)
