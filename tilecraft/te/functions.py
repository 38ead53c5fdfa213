"""Reductions, selection, casts and math functions of the tensor-expression language."""

from __future__ import annotations

import builtins
from typing import Sequence

from ..errors import TeError
from .expr import Expr, ExprLike, Reduce, Select, binary, call, compare, const, convert, cast
from .tensor import IterVar


def _reduce(combiner: str, source: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None) -> Expr:
    axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
    if not axes or not builtins.all(isinstance(a, IterVar) and a.kind == "reduce" for a in axes):
        raise TeError(f"te.{combiner} needs axis= one or more te.reduce_axis(...), got {axis!r}")
    condition = const(True) if where is None else convert(where)
    if condition.dtype != "bool":
        raise TeError(f"te.{combiner}: where= must be a condition (bool), got {condition} of dtype {condition.dtype}")
    return Reduce(combiner, convert(source), axes, condition)


def sum(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:  # noqa: A001
    """Sum of ``expr`` over the reduction ``axis``, optionally only ``where`` a condition holds."""
    return _reduce("sum", expr, axis, where)


def max(a: ExprLike, b: ExprLike | None = None, axis=None, where=None) -> Expr:  # noqa: A001
    """``te.max(x, axis=k)`` reduces; ``te.max(a, b)`` is the element-wise maximum."""
    if axis is not None:
        return _reduce("max", a, axis, where)
    if b is None:
        raise TeError("te.max needs either axis= (a reduction) or two operands (element-wise)")
    return binary("max", a, b)


def min(a: ExprLike, b: ExprLike | None = None, axis=None, where=None) -> Expr:  # noqa: A001
    """``te.min(x, axis=k)`` reduces; ``te.min(a, b)`` is the element-wise minimum."""
    if axis is not None:
        return _reduce("min", a, axis, where)
    if b is None:
        raise TeError("te.min needs either axis= (a reduction) or two operands (element-wise)")
    return binary("min", a, b)


def if_then_else(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> Expr:
    condition = convert(cond)
    if condition.dtype != "bool":
        raise TeError(f"te.if_then_else: the condition {condition} has dtype {condition.dtype}; it must be bool")
    a, b = convert(true_value), convert(false_value)
    if not isinstance(true_value, Expr):
        a = cast(b.dtype, a) if isinstance(false_value, Expr) else a
    if not isinstance(false_value, Expr):
        b = cast(a.dtype, b)
    if a.dtype != b.dtype:
        raise TeError(
            f"te.if_then_else: the branches have dtypes {a.dtype} and {b.dtype}; cast one with .astype(...)"
        )
    return Select(condition, a, b)


def equal(a: ExprLike, b: ExprLike) -> Expr:
    """``a == b`` as an expression (Python ``==`` on expressions compares structure)."""
    return compare("eq", a, b)


def not_equal(a: ExprLike, b: ExprLike) -> Expr:
    return compare("ne", a, b)


def all(*conditions: ExprLike) -> Expr:  # noqa: A001
    if not conditions:
        return const(True)
    result = convert(conditions[0])
    for c in conditions[1:]:
        result = result & convert(c)
    return result


def exp(x: ExprLike) -> Expr:
    return call("exp", x)


def log(x: ExprLike) -> Expr:
    return call("log", x)


def sqrt(x: ExprLike) -> Expr:
    return call("sqrt", x)


def rsqrt(x: ExprLike) -> Expr:
    return call("rsqrt", x)


def tanh(x: ExprLike) -> Expr:
    return call("tanh", x)


def erf(x: ExprLike) -> Expr:
    return call("erf", x)


def sigmoid(x: ExprLike) -> Expr:
    return call("sigmoid", x)


def abs(x: ExprLike) -> Expr:  # noqa: A001
    return call("abs", x)


def pow(x: ExprLike, y: ExprLike) -> Expr:  # noqa: A001
    return binary("pow", x, y)
