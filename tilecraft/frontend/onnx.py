"""Import an ONNX model as a tilecraft Graph.

``from_onnx`` fixes every input's shape, converts node by node through the table
``onnx_ops.CONVERTERS`` (an ONNX node may become several tilecraft nodes, or fold to a
constant when its inputs are constants), then simplifies the graph (``passes.simplify``:
BatchNorm folded into convolutions, the erf form of GELU recognised, dead code removed).
Every operator the model uses is checked before conversion starts, so one error lists
all the unsupported ones. ``onnx`` is imported only here: ``pip install tilecraft[onnx]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import TeError, TilecraftError
from ..graph.builder import GraphBuilder
from ..graph.ir import Graph
from ..graph.passes import simplify
from ..te.dtype import DTYPES


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


class Importer(GraphBuilder):
    """A GraphBuilder that also knows ONNX names: aliases (Identity, Dropout) and constant inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.aliases: dict[str, str] = {}
        self._fresh: set[str] = set()

    def fresh_value(self, hint: str) -> str:
        name = super().fresh_value(hint)
        self._fresh.add(name)
        return name

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any], name: str, output: str | None = None) -> str:
        """``GraphBuilder.emit``, refusing empty tensors, which te cannot hold."""
        empty = [i for i in inputs if 0 in self.values[i].shape]
        if empty:
            raise UnsupportedOperatorError(f"node {name}: {op} of the empty tensor {empty[0]} "
                                           f"{list(self.values[empty[0]].shape)}; tilecraft tensors are never empty")
        return super().emit(op, inputs, attrs, name, output)

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


def from_onnx(model_or_path: Any, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Graph:
    """The tilecraft graph of an ONNX model (a ``ModelProto`` or a path); ``input_shapes`` fixes dynamic sizes.

        graph = tc.frontend.from_onnx("resnet50.onnx", input_shapes={"data": (1, 3, 224, 224)})
        outputs = run_reference(graph, {"data": image})
    """
    from .onnx_ops import CONVERTERS

    onnx = _require_onnx()
    model = model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load(os.fspath(model_or_path))
    opsets = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    _check_operators(model.graph, opsets, CONVERTERS)
    importer = Importer()
    for tensor in model.graph.initializer:
        importer.add_constant(tensor.name, checked_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    shapes = dict(input_shapes or {})
    declared = [i for i in model.graph.input if i.name not in importer.constants]
    unknown = sorted(set(shapes) - {i.name for i in declared})
    if unknown:
        raise OnnxImportError(f"input_shapes names {unknown}, which are not inputs of the model; its inputs are "
                              f"{[i.name for i in declared]}")
    for info in declared:
        dtype = _input_dtype(onnx, info)
        importer.add_input(info.name, _input_shape(info, shapes.get(info.name)), dtype)
    for index, proto in enumerate(model.graph.node):
        node = _decode(onnx, proto, index, importer, opsets)
        try:
            CONVERTERS[node.op_type](importer, node)
        except TeError as error:
            raise OnnxImportError(f"node {node.name} ({node.op_type}, opset {node.opset}): {error}") from error
    return simplify(importer.finish([importer.output(o.name) for o in model.graph.output]))


def _require_onnx():
    try:
        import onnx
        import onnx.numpy_helper
    except ImportError as error:
        raise ImportError("tilecraft.frontend.from_onnx needs the onnx package: pip install tilecraft[onnx]") from error
    return onnx


def _check_operators(graph, opsets: dict[str, int], converters: Mapping[str, Any]) -> None:
    missing = []
    for index, node in enumerate(graph.node):
        domain = node.domain or "ai.onnx"
        if domain != "ai.onnx" or node.op_type not in converters:
            missing.append((node.name or f"#{index}", node.op_type, domain, str(opsets.get(domain, "?"))))
    if missing:
        widths = [max(len(row[c]) for row in missing + [("node", "op type", "domain", "opset")]) for c in range(4)]
        rows = [("node", "op type", "domain", "opset")] + missing
        table = "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)
        raise UnsupportedOperatorError(
            f"the model uses {len(missing)} node(s) whose operator tilecraft does not support:\n{table}\n"
            f"supported (domain ai.onnx): {', '.join(sorted(converters))}")


def _decode(onnx, proto, index: int, importer: Importer, opsets: dict[str, int]) -> OnnxNode:
    attrs = {}
    for attribute in proto.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode()
        attrs[attribute.name] = value
    name = proto.name or f"{proto.op_type}_{index}"
    return OnnxNode(name, proto.op_type, tuple(importer.resolve(i) for i in proto.input), tuple(proto.output),
                    attrs, opsets.get(proto.domain or "ai.onnx", 1))


def _input_shape(info, given: tuple[int, ...] | None) -> tuple[int, ...]:
    dims = list(info.type.tensor_type.shape.dim) if info.type.tensor_type.HasField("shape") else None
    if given is not None:
        given = tuple(int(n) for n in given)
        mismatch = dims is not None and (len(dims) != len(given) or any(
            d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, given)))
        if mismatch or any(n <= 0 for n in given):
            raise OnnxImportError(f"input_shapes gives {info.name} the shape {given}, but the model declares "
                                  f"{[d.dim_value or d.dim_param or '?' for d in dims or []]}; give positive sizes "
                                  "that agree with the fixed ones")
        return given
    if dims is None:
        raise OnnxImportError(f"input {info.name} has no declared shape; give it with "
                              f"from_onnx(model, input_shapes={{{info.name!r}: (...)}})")
    if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
        raise UnsupportedOperatorError(f"input {info.name} is empty {[d.dim_value for d in dims]}; tilecraft "
                                       "tensors have at least one element")
    for axis, dim in enumerate(dims):
        if not dim.HasField("dim_value"):
            raise OnnxImportError(
                f"input {info.name} has a dynamic dimension {axis} ({dim.dim_param or 'unnamed'}); give its size "
                f"with from_onnx(model, input_shapes={{{info.name!r}: (...)}}), one int per dimension")
    return tuple(d.dim_value for d in dims)


def _input_dtype(onnx, info) -> str:
    if not info.type.HasField("tensor_type"):
        raise UnsupportedOperatorError(f"input {info.name} is not a tensor; tilecraft imports tensor inputs only")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)).name
    if dtype not in DTYPES:
        raise UnsupportedOperatorError(f"input {info.name} has dtype {dtype}; tilecraft supports {', '.join(DTYPES)}")
    return dtype


def checked_array(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype.name not in DTYPES:
        raise UnsupportedOperatorError(f"constant {name} has dtype {array.dtype.name}; tilecraft supports "
                                       f"{', '.join(DTYPES)}")
    return array
