"""Model importers: ONNX to a tilecraft Graph (``from_onnx``); needs ``pip install tilecraft[onnx]``."""

from .onnx import OnnxImportError, RuntimeInputError, UnsupportedOperatorError, from_onnx

__all__ = ["from_onnx", "OnnxImportError", "RuntimeInputError", "UnsupportedOperatorError"]
