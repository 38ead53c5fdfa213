"""The tensor-expression language: say *what* to compute, never how.

    A = te.placeholder((N, L), name="A")
    k = te.reduce_axis((0, L), name="k")
    C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
"""

from .expr import Expr, Var, const
from .functions import (
    abs, all, equal, erf, exp, if_then_else, log, max, min, not_equal, pow, rsqrt, sigmoid, sqrt, sum, tanh,
)
from .tensor import ComputeOp, IterVar, PlaceholderOp, Tensor, compute, placeholder, reduce_axis

__all__ = [
    "Expr", "Var", "const", "abs", "all", "equal", "erf", "exp", "if_then_else", "log", "max", "min",
    "not_equal", "pow", "rsqrt", "sigmoid", "sqrt", "sum", "tanh", "ComputeOp", "IterVar", "PlaceholderOp",
    "Tensor", "compute", "placeholder", "reduce_axis",
]
