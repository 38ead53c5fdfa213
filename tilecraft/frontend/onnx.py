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
from typing import Any, Mapping

import numpy as np
from rich.table import Table

from ..errors import TeError
from ..graph.ir import Graph
from ..graph.passes import simplify
from ..tables import table_text
from ..te.dtype import DTYPES
from .onnx_importer import Importer, OnnxImportError, OnnxNode, UnsupportedOperatorError, checked_array
from .onnx_ops import CONVERTERS


def from_onnx(model_or_path: Any, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Graph:
    """The tilecraft graph of an ONNX model (a ``ModelProto`` or a path); ``input_shapes`` fixes dynamic sizes.

    Every operator the model uses is checked first, so one error lists all the unsupported
    ones. Nodes are converted one by one (a node whose inputs are constants folds to a
    constant), then the graph is simplified: BatchNorm folded into convolutions, the erf
    form of GELU recognised, dead code removed. Needs ``pip install tilecraft[onnx]``.

    Args:
        model_or_path: An ``onnx.ModelProto`` or the path of a ``.onnx`` file.
        input_shapes: A shape for each input by name; required for an input with a dynamic
            dimension, and must agree with the fixed ones.

    Returns:
        The model as a ``Graph``, its inputs with fixed shapes.

    Raises:
        ImportError: If the onnx package is not installed.
        UnsupportedOperatorError: If the model uses operators, dtypes or features tilecraft
            does not implement (``RuntimeInputError`` when a shape, axes or pads input is
            computed at run time).
        OnnxImportError: If an input's shape is dynamic and not given, ``input_shapes``
            names an unknown input or disagrees with the model, or a node is malformed.

    Example:
        ::

            graph = tc.frontend.from_onnx("resnet50.onnx", input_shapes={"data": (1, 3, 224, 224)})
            outputs = run_reference(graph, {"data": image})   # tilecraft.graph.reference
    """
    onnx = _require_onnx()
    model = model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load(os.fspath(model_or_path))
    opsets = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    _check_operators(model.graph, opsets, CONVERTERS)
    importer = Importer(frozenset(name for node in model.graph.node for name in node.input) |
                        {output.name for output in model.graph.output})
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
        table = Table("node", "op type", "domain", "opset", box=None, padding=(0, 0, 0, 2))
        for row in missing:
            table.add_row(*row)
        raise UnsupportedOperatorError(
            f"the model uses {len(missing)} node(s) whose operator tilecraft does not support:\n{table_text(table)}\n"
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
