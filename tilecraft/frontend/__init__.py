"""Model importers: ONNX to a tilecraft Graph (``from_onnx``); needs ``pip install tilecraft[onnx]``."""

from .onnx import from_onnx
from .onnx_importer import OnnxImportError, RuntimeInputError, UnsupportedOperatorError

__all__ = ["from_onnx", "OnnxImportError", "RuntimeInputError", "UnsupportedOperatorError"]
