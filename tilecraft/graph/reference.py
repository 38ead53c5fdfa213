"""Run a graph with NumPy, node by node, through each node's own te compute.

Every node is built alone from placeholders and evaluated by the te reference evaluator,
so a graph run here checks every operator builder that a compiled model will use; it is
the oracle that imported models are compared with onnxruntime through.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import TeError
from ..te.dag import ComputeDAG
from ..te.dtype import NUMPY_DTYPES
from .ir import Graph, Node, Value
from .operators import build_alone


def evaluate_node(node: Node, values: dict[str, Value], arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """The output of ``node`` given an array for each of its inputs."""
    placeholders, out = build_alone(node, values)
    dag = ComputeDAG([*placeholders.values(), out])
    return dag.evaluate_numpy([arrays[name] for name in placeholders])[0]


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs, by name, for ``inputs`` given by input name."""
    expected = {v.name: v for v in graph.inputs}
    if set(inputs) != set(expected):
        raise TeError(f"run_reference: the graph's inputs are {sorted(expected)} but got {sorted(inputs)}; "
                      "pass exactly one array for each")
    arrays: dict[str, np.ndarray] = dict(graph.constants)
    for name, array in inputs.items():
        array, value = np.asarray(array), expected[name]
        if array.shape != value.shape or array.dtype != NUMPY_DTYPES[value.dtype]:
            raise TeError(f"run_reference: input {name} must be {value} but got {array.dtype}{list(array.shape)}; "
                          f"pass an array of that shape, converted with .astype({value.dtype!r})")
        arrays[name] = array
    for node in graph.nodes:
        arrays[node.output] = evaluate_node(node, graph.values, arrays)
    return {name: arrays[name] for name in graph.outputs}
