"""Element-wise operators: activations, clipping, casts and broadcasting arithmetic.

Each is one compute of the input's shape (for the binary operators, the NumPy broadcast
shape of both operands), so the scheduler can inline it into its consumer or producer.
"""

from __future__ import annotations

import math
from typing import Callable, Union

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import broadcast_read, broadcast_shape, check_tensor, compute_nd

Operand = Union[Tensor, int, float]

_INV_SQRT2 = 1 / math.sqrt(2)


def _unary(x: Tensor, fn: Callable[[Expr], Expr], name: str, op: str) -> Tensor:
    check_tensor(x, op)
    return compute_nd(x.shape, lambda idx: fn(x[idx]), name)


def relu(x: Tensor, name: str = "relu") -> Tensor:
    """``max(x, 0)``; any layout."""
    return _unary(x, lambda v: te.max(v, 0), name, "relu")


def sigmoid(x: Tensor, name: str = "sigmoid") -> Tensor:
    """``1 / (1 + exp(-x))``; any layout."""
    return _unary(x, te.sigmoid, name, "sigmoid")


def tanh(x: Tensor, name: str = "tanh") -> Tensor:
    """Hyperbolic tangent; any layout."""
    return _unary(x, te.tanh, name, "tanh")


def silu(x: Tensor, name: str = "silu") -> Tensor:
    """``x * sigmoid(x)`` (swish); any layout."""
    return _unary(x, lambda v: v * te.sigmoid(v), name, "silu")


def gelu(x: Tensor, name: str = "gelu") -> Tensor:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``, the exact (erf) form; any layout."""
    return _unary(x, lambda v: 0.5 * v * (1.0 + te.erf(v * _INV_SQRT2)), name, "gelu")


def clip(x: Tensor, a_min: int | float, a_max: int | float, name: str = "clip") -> Tensor:
    """``min(max(x, a_min), a_max)``; any layout."""
    if a_min > a_max:
        raise TeError(f"clip: a_min {a_min} is above a_max {a_max}; pass a_min <= a_max")
    return _unary(x, lambda v: te.min(te.max(v, a_min), a_max), name, "clip")


def cast(x: Tensor, dtype: str, name: str = "cast") -> Tensor:
    """``x`` converted to ``dtype`` (float to int truncates toward zero); any layout."""
    return _unary(x, lambda v: v.astype(dtype), name, "cast")


def _broadcast(lhs: Operand, rhs: Operand, fn: Callable[[Expr, Expr], Expr], name: str, op: str) -> Tensor:
    operands = (lhs, rhs)
    for operand in operands:
        if isinstance(operand, bool) or not isinstance(operand, (Tensor, int, float)):
            raise TeError(f"{op}: operands must be te tensors or Python numbers, got {operand!r}")
    if not any(isinstance(o, Tensor) for o in operands):
        raise TeError(f"{op}: at least one operand must be a te tensor; got {lhs!r} and {rhs!r}")
    shapes = [o.shape if isinstance(o, Tensor) else () for o in operands]
    shape = broadcast_shape(shapes[0], shapes[1], op)

    def body(idx: tuple[Expr, ...]) -> Expr:
        a, b = (broadcast_read(o, idx) if isinstance(o, Tensor) else o for o in operands)
        return fn(a, b)

    return compute_nd(shape, body, name)


def add(lhs: Operand, rhs: Operand, name: str = "add") -> Tensor:
    """``lhs + rhs`` with NumPy broadcasting; either side may be a Python number."""
    return _broadcast(lhs, rhs, lambda a, b: a + b, name, "add")


def subtract(lhs: Operand, rhs: Operand, name: str = "subtract") -> Tensor:
    """``lhs - rhs`` with NumPy broadcasting; either side may be a Python number."""
    return _broadcast(lhs, rhs, lambda a, b: a - b, name, "subtract")


def multiply(lhs: Operand, rhs: Operand, name: str = "multiply") -> Tensor:
    """``lhs * rhs`` with NumPy broadcasting; either side may be a Python number."""
    return _broadcast(lhs, rhs, lambda a, b: a * b, name, "multiply")


def divide(lhs: Operand, rhs: Operand, name: str = "divide") -> Tensor:
    """``lhs / rhs`` with NumPy broadcasting (floor division for integers, as in te)."""
    return _broadcast(lhs, rhs, lambda a, b: a / b, name, "divide")
