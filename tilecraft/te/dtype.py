"""Data types: their names, NumPy and C spellings, and promotion."""

import numpy as np

DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")

NUMPY_DTYPES = {name: np.dtype(name) for name in DTYPES}

C_TYPES = {
    "bool": "bool",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "float16": "_Float16",
    "float32": "float",
    "float64": "double",
}

_RANK = {name: rank for rank, name in enumerate(DTYPES)}


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


def bytes_of(dtype: str) -> int:
    return NUMPY_DTYPES[dtype].itemsize


def accumulates_in(dtype: str) -> str:
    """The type a sum of ``dtype`` is kept in while it is summed: float16's in float32 (as
    NumPy's and cuBLAS's are; a long float16 sum rounded at every step loses two digits)."""
    return "float32" if dtype == "float16" else dtype


def result_dtype(a: str, b: str) -> str:
    """The dtype of a binary operation: floats win over ints, wider wins over narrower."""
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    return a if _RANK[a] >= _RANK[b] else b
