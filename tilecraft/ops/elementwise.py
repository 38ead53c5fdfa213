"""Element-wise operators: activations, clipping, casts and broadcasting arithmetic.

Each is one compute of the input's shape (for the binary operators, the NumPy broadcast
shape of both operands), so the scheduler can inline it into its consumer or producer.
"""

from __future__ import annotations

import math
from typing import Callable, Union

from .. import te
from ..errors import TeError
from ..te.dtype import is_float
from ..te.dtype import bytes_of
from ..te.expr import Expr, binary as _te_binary, call
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


def _broadcast(lhs: Operand, rhs: Operand, fn: Callable[..., Expr], name: str, op: str, *more: Operand) -> Tensor:
    operands = (lhs, rhs, *more)
    for operand in operands:
        if isinstance(operand, bool) or not isinstance(operand, (Tensor, int, float)):
            raise TeError(f"{op}: operands must be te tensors or Python numbers, got {operand!r}")
    if not any(isinstance(o, Tensor) for o in operands):
        raise TeError(f"{op}: at least one operand must be a te tensor; got {lhs!r} and {rhs!r}")
    shape: tuple[int, ...] = ()
    for operand in operands:
        shape = broadcast_shape(shape, operand.shape if isinstance(operand, Tensor) else (), op)

    def body(idx: tuple[Expr, ...]) -> Expr:
        return fn(*(broadcast_read(o, idx, shape) if isinstance(o, Tensor) else o for o in operands))

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


def _floor_mod(a: Expr, b: Expr) -> Expr:
    if not is_float(a.dtype):
        return a % b
    kept = te.equal(a, 0) | te.equal(a < 0, b < 0)  # a % inf is a, or inf when a has the other sign
    return te.if_then_else(te.equal(te.abs(b), math.inf), te.if_then_else(kept, a, b), a % b)


def _fmod(a: Expr, b: Expr) -> Expr:
    remainder = a % b  # te's is floored: the sign of b; C's fmod takes the sign of a
    return te.if_then_else(te.not_equal(remainder, 0) & te.not_equal(a < 0, b < 0), remainder - b, remainder)


def _in_width(a: Expr, count: Expr) -> Expr:
    """Whether shifting ``a`` by ``count`` bits is defined (in C, and so in ONNX's sense of a plain shift)."""
    return (count >= 0) & (count < bytes_of(a.dtype) * 8)


BINARY_FUNCTIONS: dict[str, Callable[[Expr, Expr], Expr]] = {
    "maximum": te.max, "minimum": te.min, "floor_mod": _floor_mod, "fmod": _fmod,
    "equal": te.equal, "less": lambda a, b: a < b, "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b,
    "logical_and": lambda a, b: a & b, "logical_or": lambda a, b: a | b, "logical_xor": te.not_equal,
    "prelu": lambda a, b: te.if_then_else(a < 0, a * b, a),
    **{op: lambda a, b, op=op: _te_binary(op, a, b) for op in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    "left_shift": lambda a, b: te.if_then_else(_in_width(a, b), _te_binary("left_shift", a, b), 0),
    "right_shift": lambda a, b: te.if_then_else(_in_width(a, b), _te_binary("right_shift", a, b),
                                                -(a < 0).astype(a.dtype)),
}
"""The broadcasting functions of ``binary``, as in NumPy: comparisons and logic give bool; ``floor_mod`` takes
the sign of the divisor (Python's ``%``), ``fmod`` the sign of the dividend (C's); ``prelu`` scales the negative
values of ``lhs`` by ``rhs``; the bitwise ones are of integers, and a shift by a negative count or by the width
or more gives 0 (-1 for a negative value shifted right), as in ONNX."""


def binary(lhs: Operand, rhs: Operand, function: str, name: str = "binary") -> Tensor:
    """``BINARY_FUNCTIONS[function](lhs, rhs)`` with NumPy broadcasting; either side may be a Python number."""
    if function not in BINARY_FUNCTIONS:
        raise TeError(f"binary: unknown function {function!r}; use one of {', '.join(BINARY_FUNCTIONS)}")
    return _broadcast(lhs, rhs, BINARY_FUNCTIONS[function], name, function)


def where(condition: Tensor, lhs: Operand, rhs: Operand, name: str = "where") -> Tensor:
    """``numpy.where``: ``lhs`` where the bool ``condition`` holds, else ``rhs``, all three broadcast."""
    return _broadcast(condition, lhs, te.if_then_else, name, "where", rhs)


def _softplus(v: Expr) -> Expr:
    return te.max(v, 0.0) + te.log(1.0 + te.exp(-te.abs(v)))  # finite for large |v|


def _hard_sigmoid(v: Expr, alpha: float = 0.2, beta: float = 0.5) -> Expr:
    return te.max(te.min(v * alpha + beta, 1.0), 0.0)


UNARY_FUNCTIONS: dict[str, Callable[..., Expr]] = {
    "floor": lambda v: v // 1.0, "ceil": lambda v: -(-v // 1.0), "logical_not": lambda v: ~v,
    "sign": lambda v: (v > 0).astype(v.dtype) - (v < 0).astype(v.dtype),
    "elu": lambda v, alpha=1.0: te.if_then_else(v < 0, (te.exp(v) - 1.0) * alpha, v),
    "selu": lambda v, alpha=1.6732632, gamma=1.0507010: te.if_then_else(v <= 0, (te.exp(v) - 1.0) * alpha, v) * gamma,
    "celu": lambda v, alpha=1.0: te.max(v, 0.0) + te.min((te.exp(v / alpha) - 1.0) * alpha, 0.0),
    "leaky_relu": lambda v, alpha=0.01: te.if_then_else(v < 0, v * alpha, v),
    "thresholded_relu": lambda v, alpha=1.0: te.if_then_else(v > alpha, v, 0.0),
    "hard_sigmoid": _hard_sigmoid, "hard_swish": lambda v: v * _hard_sigmoid(v, 1 / 6, 0.5),
    "softplus": _softplus, "softsign": lambda v: v / (te.abs(v) + 1.0), "mish": lambda v: v * te.tanh(_softplus(v)),
    "shrink": lambda v, lambd=0.5, bias=0.0: te.if_then_else(
        v < -lambd, v + bias, te.if_then_else(v > lambd, v - bias, 0.0)),
    **{name: lambda v, name=name: call(name, v) for name in (
        "rint", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")},
    "isnan": lambda v: te.not_equal(v, v), "bitwise_not": lambda v: -v - 1,  # two's complement, wrapping when unsigned
    "isinf": lambda v, detect_negative=1, detect_positive=1: (
        (te.equal(v, math.inf) & bool(detect_positive)) | (te.equal(v, -math.inf) & bool(detect_negative))),
}
"""Element-wise functions of one tensor, by name, with their parameters as keywords (ONNX's attributes and
defaults): rounding, sign, logical not, the activations of ONNX beyond relu, sigmoid, tanh and gelu, the
trigonometric and hyperbolic functions, and the tests for NaN and infinity."""


def unary(x: Tensor, function: str, name: str = "unary", **params: float) -> Tensor:
    """``UNARY_FUNCTIONS[function](x, **params)``, element by element; any layout."""
    if function not in UNARY_FUNCTIONS:
        raise TeError(f"unary: unknown function {function!r}; use one of {', '.join(UNARY_FUNCTIONS)}")
    return _unary(x, lambda v: UNARY_FUNCTIONS[function](v, **params), name, function)
