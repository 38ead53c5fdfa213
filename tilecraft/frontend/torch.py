"""PyTorch programs as ONNX models, the form in which tilecraft imports them.

A module, or a graph that ``torch.compile`` captured, is exported in memory by PyTorch's
TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``) at opset 17: it is part
of torch itself (the torch.export-based exporter needs onnxscript besides) and traces the
program with example inputs, so the ONNX model has their shapes, and the weights as
initializers, constant-folded. A program saved by ``torch.export.save`` (a ``.pt2`` file) keeps
its example inputs, so it is exported the same way: ``tilecraft tune-model`` reads it as it
reads an ONNX file. torch is imported only here: ``pip install 'tilecraft[torch]'``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from typing import Any, Iterator, Sequence

from .onnx_importer import OnnxImportError, UnsupportedOperatorError

OPSET = 17


def require_torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError("tilecraft's PyTorch entry needs PyTorch: pip install 'tilecraft[torch]'") from error
    return torch


def to_onnx(module: Any, example_inputs: Sequence[Any], input_names: Sequence[str] | None = None):
    """The ONNX model (an ``onnx.ModelProto``) of ``module`` traced with ``example_inputs``.

    A plain module is exported in inference mode (dropout off, batch norm with its running
    statistics); a graph module (captured or loaded) as it is. Inputs are named ``input_0``,
    ``input_1``, ... unless ``input_names`` names them; an input the program does not read is
    left out of the model, and the outputs keep the names the exporter gives them.

    Raises:
        ImportError: If torch or onnx is not installed.
        UnsupportedOperatorError: If PyTorch cannot export the program (an operator that has no
            ONNX form, Python values the trace cannot follow); the message is PyTorch's.
    """
    torch = require_torch()
    try:
        import onnx
    except ImportError as error:
        raise ImportError("exporting from PyTorch needs the onnx package: pip install 'tilecraft[torch]'") from error
    names = list(input_names or (f"input_{n}" for n in range(len(example_inputs))))
    modes = torch.onnx.TrainingMode
    mode = modes.PRESERVE if isinstance(module, torch.fx.GraphModule) else modes.EVAL
    buffer = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings(), _stdout_silenced():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is deprecated, not gone
            torch.onnx.export(module, tuple(example_inputs), buffer, dynamo=False, opset_version=OPSET,
                              training=mode, input_names=names)
    except (torch.onnx.OnnxExporterError, RuntimeError, TypeError, ValueError) as error:
        reason = str(error).strip().split("\n")[0].split(". Please")[0]
        raise UnsupportedOperatorError(f"PyTorch cannot export the program to ONNX: {reason}") from error
    return onnx.load_from_string(buffer.getvalue())


def from_export_file(path: str | os.PathLike):
    """The ONNX model of a program that ``torch.export.save`` wrote, traced with the example inputs it keeps.

    Raises:
        ImportError: If torch or onnx is not installed.
        OnnxImportError: If the file is not a saved program, or keeps no example inputs.
        UnsupportedOperatorError: As ``to_onnx``.
    """
    torch = require_torch()
    try:
        program = torch.export.load(os.fspath(path))
    except Exception as error:  # a zip file of another kind, or none: the error depends on the file
        raise OnnxImportError(f"{path} is not a program saved by torch.export.save ({type(error).__name__}: "
                              f"{error})") from None
    args, kwargs = program.example_inputs or (None, None)
    if args is None or kwargs:
        raise OnnxImportError(f"{path} keeps no positional example inputs; save "
                              "torch.export.export(module, args) with torch.export.save")
    names = [spec.arg.name for spec in program.graph_signature.input_specs
             if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    return to_onnx(program.module(), args, names if len(names) == len(args) else None)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """The process's standard output closed for a while: PyTorch's TorchScript exporter prints
    its whole graph there at every failure (its log switch is ignored), and the error raised
    already names the operator."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
