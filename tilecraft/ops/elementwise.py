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
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


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


def gelu(x: Tensor, approximate: str = "none", name: str = "gelu") -> Tensor:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``, the exact (erf) form, or with ``approximate="tanh"``
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``; any layout."""
    if approximate == "tanh":
        return _unary(x, lambda v: 0.5 * v * (1.0 + te.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v))), name,
                      "gelu")
    if approximate != "none":
        raise TeError(f"gelu: approximate={approximate!r} is unknown; use 'none' (erf) or 'tanh'")
    return _unary(x, lambda v: 0.5 * v * (1.0 + te.erf(v * _INV_SQRT2)), name, "gelu")


def sqrt(x: Tensor, name: str = "sqrt") -> Tensor:
    return _unary(x, te.sqrt, name, "sqrt")


def exp(x: Tensor, name: str = "exp") -> Tensor:
    return _unary(x, te.exp, name, "exp")


def log(x: Tensor, name: str = "log") -> Tensor:
    return _unary(x, te.log, name, "log")


def erf(x: Tensor, name: str = "erf") -> Tensor:
    return _unary(x, te.erf, name, "erf")


def abs(x: Tensor, name: str = "abs") -> Tensor:  # noqa: A001
    return _unary(x, te.abs, name, "abs")


def negative(x: Tensor, name: str = "negative") -> Tensor:
    return _unary(x, lambda v: -v, name, "negative")


def clip(x: Tensor, a_min: int | float | None, a_max: int | float | None, name: str = "clip") -> Tensor:
    """``min(max(x, a_min), a_max)``; a bound of None is left open; any layout."""
    if a_min is not None and a_max is not None and a_min > a_max:
        raise TeError(f"clip: a_min {a_min} is above a_max {a_max}; pass a_min <= a_max")

    def fn(v: Expr) -> Expr:
        low = v if a_min is None else te.max(v, a_min)
        return low if a_max is None else te.min(low, a_max)

    return _unary(x, fn, name, "clip")


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
        a, b = (broadcast_read(o, idx, shape) if isinstance(o, Tensor) else o for o in operands)
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


def truncate_divide(lhs: Operand, rhs: Operand, name: str = "truncate_divide") -> Tensor:
    """Integer ``lhs / rhs`` rounded toward zero (as in C and ONNX), with NumPy broadcasting."""

    def fn(a: Expr, b: Expr) -> Expr:
        inexact = te.not_equal(a % b, 0) & te.not_equal(a < 0, b < 0)
        return te.if_then_else(inexact, a // b + 1, a // b)

    return _broadcast(lhs, rhs, fn, name, "truncate_divide")


def power(lhs: Operand, rhs: Operand, name: str = "power") -> Tensor:
    """``lhs ** rhs`` with NumPy broadcasting; either side may be a Python number."""
    return _broadcast(lhs, rhs, te.pow, name, "power")
