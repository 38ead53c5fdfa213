"""Data types: their names, NumPy and C spellings, and promotion.

The two 16-bit floats (``HALVES``) are stored in 16 bits and computed in float32, rounded
when stored: float16 (IEEE half) and bfloat16 (float32's top half: its range, 8 bits of
precision), whose NumPy type is ml_dtypes'. Importing ml_dtypes takes half a second, which
every process would pay (measuring workers, the command line), so it is imported where a
bfloat16 is first named (``supported``, ``NUMPY_DTYPES``); from then on ``np.dtype("bfloat16")``
names it too.
"""

import numpy as np

DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64")
HALVES = ("float16", "bfloat16")


class _NumpyDtypes(dict):
    """NumPy's dtype of each of ours, bfloat16's made at its first use."""

    def __missing__(self, name: str) -> np.dtype:
        if name != "bfloat16":
            raise KeyError(name)
        import ml_dtypes

        self[name] = np.dtype(ml_dtypes.bfloat16)
        return self[name]


NUMPY_DTYPES = _NumpyDtypes({name: np.dtype(name) for name in DTYPES if name != "bfloat16"})


def supported(dtype: str) -> bool:
    """Whether ``dtype`` is one of ours (``DTYPES``); a bfloat16's NumPy type made ready."""
    if dtype == "bfloat16":
        NUMPY_DTYPES[dtype]
    return dtype in DTYPES

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
    "bfloat16": "uint16_t",  # its bits: widened by a shift, rounded by tc_f2bf (no C type computes in it)
    "float32": "float",
    "float64": "double",
}

_RANK = {name: rank for rank, name in enumerate(DTYPES)}


def finfo(dtype: str):
    """NumPy's facts of float ``dtype`` (its eps, min, max); bfloat16's from ml_dtypes."""
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(NUMPY_DTYPES[dtype])
    return np.finfo(dtype)


def from_npy(array: np.ndarray) -> np.ndarray:
    """An array read from a ``.npy`` or ``.npz`` file as it was saved: NumPy's format has no
    name for bfloat16 and writes its elements as raw pairs of bytes (``|V2``), seen as
    bfloat16 again here (no other type of ours is so written)."""
    return array.view(NUMPY_DTYPES["bfloat16"]) if array.dtype == np.dtype("V2") else array


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


def bytes_of(dtype: str) -> int:
    return NUMPY_DTYPES[dtype].itemsize


def accumulates_in(dtype: str) -> str:
    """The type a sum of ``dtype`` is kept in while it is summed: a 16-bit float's in float32
    (as NumPy's and cuBLAS's are; a long float16 sum rounded at every step loses two digits)."""
    return computes_in(dtype)


def computes_in(dtype: str) -> str:
    """The type a value of ``dtype`` is computed in: float32 for the 16-bit floats, rounded
    only when stored (``HALVES``); every other type is its own."""
    return "float32" if dtype in HALVES else dtype


def result_dtype(a: str, b: str) -> str:
    """The dtype of a binary operation: floats win over ints, wider wins over narrower."""
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    if {a, b} == set(HALVES):  # neither holds the other (PyTorch's promotion)
        return "float32"
    return a if _RANK[a] >= _RANK[b] else b
