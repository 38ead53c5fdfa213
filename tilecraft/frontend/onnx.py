"""Import an ONNX model as a tilecraft Graph.

``from_onnx`` fixes every input's shape, converts node by node through the table
``onnx_ops.CONVERTERS`` (an ONNX node may become several tilecraft nodes, or fold to a
constant when its inputs are constants), then simplifies the graph (``passes.simplify``:
BatchNorm folded into convolutions, the erf form of GELU recognised, dead code removed).
Every operator the model uses is checked before conversion starts, so one error lists
all the unsupported ones. ``onnx`` is imported only here: ``pip install tilecraft[onnx]``.

An operator without a converter whose ONNX schema defines it as a function of other
operators (Attention, RotaryEmbedding, the losses, SwiGLU, the windows...) is imported as
that function's body, made for the node's attributes and input types and at the node's
opset, exactly as onnx's own ``_expanded`` test models are: one definition, the
standard's, and no second one here to drift from it.
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
    _check_operators(onnx, model.graph.node, opsets)
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
        _convert(onnx, proto, proto.name or f"{proto.op_type}_{index}", importer, opsets)
    return simplify(importer.finish([importer.output(o.name) for o in model.graph.output]))


def _convert(onnx, proto, name: str, importer: Importer, opsets: dict[str, int]) -> None:
    """Convert one node, or the nodes of its function body (see the module docstring), or of the branch that
    an If with a constant condition takes."""
    if proto.op_type == "If":
        if importer.resolve(proto.input[0]) not in importer.constants:
            raise UnsupportedOperatorError(f"node {name} (If): a condition computed at run time (control flow) is "
                                           "not supported; only an If whose condition is a constant")
        taken = "then_branch" if importer.constants[importer.resolve(proto.input[0])].item() else "else_branch"
        branch = onnx.helper.get_attribute_value(next(a for a in proto.attribute if a.name == taken))
        for tensor in branch.initializer:
            importer.add_constant(tensor.name, checked_array(onnx.numpy_helper.to_array(tensor), tensor.name))
        _check_operators(onnx, branch.node, opsets)
        for k, inner in enumerate(branch.node):
            _convert(onnx, inner, f"{name}_{inner.name or inner.op_type}_{k}", importer, opsets)
        for output, result in zip(proto.output, branch.output):
            importer.alias(output, result.name)
        return
    if (proto.domain or "ai.onnx") != "ai.onnx" or proto.op_type not in CONVERTERS:
        body, body_opsets = _function_body(onnx, proto, name, importer, opsets)
        _check_operators(onnx, body, body_opsets)
        importer.read |= {i for inner in body for i in inner.input}
        for k, inner in enumerate(body):
            _convert(onnx, inner, f"{name}_{inner.name or inner.op_type}_{k}", importer, body_opsets)
        return
    node = _decode(onnx, proto, name, importer, opsets)
    try:
        CONVERTERS[node.op_type](importer, node)
    except TeError as error:
        raise OnnxImportError(f"node {node.name} ({node.op_type}, opset {node.opset}): {error}") from error


def _function_schema(onnx, op_type: str, domain: str, opset: int):
    """The schema of ``op_type`` at ``opset`` when it is defined as a function, else None."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return None
    versions = [*schema.function_opset_versions, *schema.context_dependent_function_opset_versions]
    return schema if any(v <= opset for v in versions) else None


def _function_body(onnx, proto, name: str, importer: Importer, opsets: dict[str, int]):
    """The nodes of ``proto``'s function body, its names prefixed and its attribute references bound; and the
    opsets of the body."""
    domain = proto.domain or "ai.onnx"
    schema = _function_schema(onnx, proto.op_type, domain, opsets.get(domain, 1))
    version = max(v for v in [*schema.function_opset_versions, *schema.context_dependent_function_opset_versions]
                  if v <= opsets.get(domain, 1))
    function = onnx.FunctionProto()
    if version in schema.context_dependent_function_opset_versions:
        types = [onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(
            importer.values[importer.resolve(i)].dtype)), importer.values[importer.resolve(i)].shape)
            if i else onnx.TypeProto() for i in proto.input]
        function.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            version, proto.SerializeToString(), [t.SerializeToString() for t in types]))
    else:
        function.ParseFromString(schema.get_function_with_opset_version(version))
    attributes = {key: a.default_value for key, a in schema.attributes.items() if a.default_value.name}
    attributes.update({a.name: a for a in proto.attribute})
    prefix = f"{name}_"
    names = {**dict(zip(function.input, proto.input)), **{o: p for o, p in zip(function.output, proto.output) if p}}
    body = [_bound(onnx, inner, attributes, lambda i: names.get(i, prefix + i) if i else "") for inner in function.node]
    return body, {**opsets, **{entry.domain or "ai.onnx": entry.version for entry in function.opset_import}}


def _bound(onnx, inner, attributes: dict, rename):
    """A copy of the function node ``inner`` with its attribute references bound and its names renamed, the
    names in its subgraphs (an If's branches) too."""
    node = onnx.NodeProto()
    node.CopyFrom(inner)
    node.ClearField("attribute")
    for attribute in inner.attribute:
        if attribute.ref_attr_name:
            if attribute.ref_attr_name in attributes:
                node.attribute.append(attributes[attribute.ref_attr_name])
                node.attribute[-1].name = attribute.name
            continue
        node.attribute.append(attribute)
        if attribute.type == onnx.AttributeProto.GRAPH:
            graph = node.attribute[-1].g
            for value in [*graph.input, *graph.output, *graph.initializer]:
                value.name = rename(value.name)
            nodes = [_bound(onnx, n, attributes, rename) for n in graph.node]
            del graph.node[:]
            graph.node.extend(nodes)
    del node.input[:], node.output[:]
    node.input.extend(rename(i) for i in inner.input)
    node.output.extend(rename(o) for o in inner.output)
    return node


def _require_onnx():
    try:
        import onnx
        import onnx.numpy_helper
    except ImportError as error:
        raise ImportError("tilecraft.frontend.from_onnx needs the onnx package: pip install tilecraft[onnx]") from error
    return onnx


def _check_operators(onnx, nodes, opsets: dict[str, int]) -> None:
    missing = []
    for index, node in enumerate(nodes):
        domain = node.domain or "ai.onnx"
        if (domain != "ai.onnx" or node.op_type not in (*CONVERTERS, "If")) and not _function_schema(
                onnx, node.op_type, domain, opsets.get(domain, 1)):
            missing.append((node.name or f"#{index}", node.op_type, domain, str(opsets.get(domain, "?"))))
    if missing:
        table = Table("node", "op type", "domain", "opset", box=None, padding=(0, 0, 0, 2))
        for row in missing:
            table.add_row(*row)
        raise UnsupportedOperatorError(
            f"the model uses {len(missing)} node(s) whose operator tilecraft does not support:\n{table_text(table)}\n"
            f"supported (domain ai.onnx): {', '.join(sorted(CONVERTERS))}, and operators defined as functions of "
            "these")


def _decode(onnx, proto, name: str, importer: Importer, opsets: dict[str, int]) -> OnnxNode:
    attrs = {}
    for attribute in proto.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode()
        attrs[attribute.name] = value
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
