"""What the ONNX converters build with: the node as they see it, the graph builder they emit into, and the errors.

``onnx.from_onnx`` drives the import and ``onnx_ops``/``onnx_nn`` hold the converters; both
import this module, so the converter table and the driver do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ..errors import TilecraftError
from ..graph.builder import GraphBuilder
from ..graph.ir import Node
from ..graph.operators import BROADCAST, ELEMENTWISE, OPERATORS, build_alone
from ..te.dtype import DTYPES, is_float


class OnnxImportError(TilecraftError, ValueError):
    """The model cannot be imported as given (a dynamic input size, a malformed node)."""


class UnsupportedOperatorError(OnnxImportError):
    """The model uses an operator, or a feature of one, that tilecraft does not implement."""


class RuntimeInputError(UnsupportedOperatorError):
    """A node input that tilecraft needs at import (a shape, axes, pads) is computed at run time: ``input``."""

    def __init__(self, message: str, input: str):  # noqa: A002
        super().__init__(message)
        self.input = input


@dataclass(frozen=True, slots=True)
class OnnxNode:
    """An ONNX node with its attributes decoded and its inputs resolved ('' for an absent optional input)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    opset: int

    def input(self, index: int) -> str:
        return self.inputs[index] if index < len(self.inputs) else ""

    def unsupported(self, feature: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(f"node {self.name} ({self.op_type}, opset {self.opset}): {feature} is not "
                                        "supported; change the model, or extend tilecraft.frontend.onnx_ops")


_IDENTITIES = {  # what a reduction of nothing gives
    "sum": lambda dtype: 0,
    "max": lambda dtype: False if dtype == bool else -np.inf if is_float(dtype.name) else np.iinfo(dtype).min,
    "min": lambda dtype: True if dtype == bool else np.inf if is_float(dtype.name) else np.iinfo(dtype).max,
}


class Importer(GraphBuilder):
    """A GraphBuilder that also knows ONNX names: aliases (Identity, Dropout), constant inputs, and ``read``, the
    names that a node or the graph's outputs read (an optional output outside it is no reason to refuse a node)."""

    def __init__(self, read: frozenset[str]) -> None:
        super().__init__()
        self.read = read
        self.aliases: dict[str, str] = {}
        self._fresh: set[str] = set()

    def fresh_value(self, hint: str) -> str:
        name = super().fresh_value(hint)
        self._fresh.add(name)
        return name

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any], name: str, output: str | None = None) -> str:
        """``GraphBuilder.emit``. An empty tensor, which te cannot hold, holds no data either, so it is a constant:
        a concatenation leaves it out, and an element-wise node or a reduction of one folds with NumPy (to an
        empty result, or to the reduction's identity)."""
        empty = [i for i in inputs if 0 in self.values[i].shape]
        if not empty:
            return super().emit(op, inputs, attrs, name, output)
        if op == "concat" and len(empty) < len(inputs):
            return super().emit(op, [i for i in inputs if i not in empty], attrs, name, output)
        arrays = [np.zeros(self.values[i].shape, self.values[i].dtype) for i in inputs]
        if op in _IDENTITIES:
            initial = _IDENTITIES[op](arrays[0].dtype)
            result = getattr(np, op)(arrays[0], axis=attrs.get("axis"), keepdims=attrs.get("keepdims", False),
                                     initial=initial)
        elif op in OPERATORS and OPERATORS[op].pattern in (ELEMENTWISE, BROADCAST) or op in ("trilu", "identity"):
            probe = {i: replace(self.values[i], shape=tuple(max(n, 1) for n in self.values[i].shape)) for i in inputs}
            dtype = build_alone(Node(op, tuple(inputs), "probe", dict(attrs), "probe"), probe)[1].dtype
            result = np.zeros(np.broadcast_shapes(*(a.shape for a in arrays)), dtype)
        else:
            raise UnsupportedOperatorError(f"node {name}: {op} of the empty tensor {empty[0]} "
                                           f"{list(self.values[empty[0]].shape)} is not supported")
        return self.add_constant(output or self.fresh_value(f"{name}_{op}"), result)

    def resolve(self, name: str) -> str:
        return self.aliases.get(name, name)

    def alias(self, name: str, source: str) -> None:
        """``name`` stands for ``source``; a value just made by a converter simply takes the ONNX name."""
        source = self.resolve(source)
        last_output = bool(self.nodes) and self.nodes[-1].output == source
        unread_constant = source in self.constants and not any(source in n.inputs for n in self.nodes)
        if source not in self._fresh or not (last_output or unread_constant):
            self.aliases[name] = source
            return
        self._fresh.discard(source)
        self.values[name] = replace(self.values.pop(source), name=name)
        if source in self.constants:
            self.constants[name] = self.constants.pop(source)
        else:
            self.nodes[-1] = replace(self.nodes[-1], output=name)

    def constant(self, node: OnnxNode, index: int, what: str) -> np.ndarray | None:
        """The value of the constant input ``index`` of ``node``; None when absent; an error when computed."""
        name = node.input(index)
        if not name:
            return None
        if name not in self.constants:
            raise RuntimeInputError(
                f"node {node.name} ({node.op_type}, opset {node.opset}) needs its {what} (input {name}) at import, "
                "but it is computed at run time; make it a constant (an initializer) of the model", name)
        return self.constants[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name].shape

    def emit_for(self, node: OnnxNode, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None) -> None:
        """Emit ``node`` as the one tilecraft node ``op``, under the node's ONNX output name."""
        self.emit(op, inputs, attrs or {}, node.name, output=node.outputs[0])

    def reshape(self, x: str, shape: Sequence[int], name: str) -> str:
        """``x`` reshaped (``x`` itself when it has the shape already)."""
        return x if tuple(shape) == self.shape(x) else self.emit("reshape", [x], {"newshape": tuple(shape)}, name)

    def scalar(self, value: float, like: str) -> str:
        """A new 0-d constant of the dtype of ``like``."""
        return self.add_constant(self.fresh_value(f"{like}_scalar"), np.array(value, self.values[like].dtype))

    def output(self, name: str) -> str:
        """A graph output under its ONNX name, copied when it aliases another value."""
        source = self.resolve(name)
        return name if source == name else self.emit("identity", [source], {}, name, output=name)


def checked_array(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype.name not in DTYPES:
        raise UnsupportedOperatorError(f"constant {name} has dtype {array.dtype.name}; tilecraft supports "
                                       f"{', '.join(DTYPES)}")
    return array
