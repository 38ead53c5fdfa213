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
    """Sum of ``expr`` over the reduction ``axis``, optionally only ``where`` a condition holds.

    A reduction must be the whole body of a ``te.compute``.

    Args:
        expr: The summed expression, of the reduction axes and the compute's indices.
        axis: One ``te.reduce_axis`` or a sequence of them.
        where: A bool expression; iterations where it is false add nothing.

    Raises:
        TeError: If ``axis`` is not reduction axes or ``where`` is not a bool expression.
    """
    return _reduce("sum", expr, axis, where)


def max(a: ExprLike, b: ExprLike | None = None, axis=None, where=None) -> Expr:  # noqa: A001
    """``te.max(x, axis=k)`` reduces; ``te.max(a, b)`` is the element-wise maximum.

    Args:
        a: The reduced expression, or the first operand.
        b: The second operand, for the element-wise form.
        axis: Reduction axes, for the reduction form (as ``te.sum``).
        where: For the reduction form: a bool expression; iterations where it is false
            are skipped.

    Raises:
        TeError: If neither ``axis`` nor ``b`` is given, or as ``te.sum`` for a reduction.
    """
    if axis is not None:
        return _reduce("max", a, axis, where)
    if b is None:
        raise TeError("te.max needs either axis= (a reduction) or two operands (element-wise)")
    return binary("max", a, b)


def min(a: ExprLike, b: ExprLike | None = None, axis=None, where=None) -> Expr:  # noqa: A001
    """``te.min(x, axis=k)`` reduces; ``te.min(a, b)`` is the element-wise minimum.

    Takes the same arguments, and raises the same errors, as ``te.max``.
    """
    if axis is not None:
        return _reduce("min", a, axis, where)
    if b is None:
        raise TeError("te.min needs either axis= (a reduction) or two operands (element-wise)")
    return binary("min", a, b)


def if_then_else(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> Expr:
    """``true_value`` where ``cond`` holds, else ``false_value``; only the chosen side is
    evaluated, so a guarded read may lie out of bounds where the guard is false (padding).

    A Python number on one side takes the dtype of the expression on the other.

    Raises:
        TeError: If ``cond`` is not a bool expression or the branches' dtypes differ.
    """
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
    """``a != b`` as an expression (Python ``!=`` on expressions compares structure)."""
    return compare("ne", a, b)


def all(*conditions: ExprLike) -> Expr:  # noqa: A001
    """The conjunction of bool expressions (true when none is given)."""
    if not conditions:
        return const(True)
    result = convert(conditions[0])
    for c in conditions[1:]:
        result = result & convert(c)
    return result


def exp(x: ExprLike) -> Expr:
    """``e ** x``. Like every math function but ``abs``, it casts an integer or bool ``x``
    to float32 first."""
    return call("exp", x)


def log(x: ExprLike) -> Expr:
    """The natural logarithm of ``x`` (an integer ``x`` is cast to float32)."""
    return call("log", x)


def sqrt(x: ExprLike) -> Expr:
    """The square root of ``x`` (an integer ``x`` is cast to float32)."""
    return call("sqrt", x)


def rsqrt(x: ExprLike) -> Expr:
    """``1 / sqrt(x)`` (an integer ``x`` is cast to float32)."""
    return call("rsqrt", x)


def tanh(x: ExprLike) -> Expr:
    """The hyperbolic tangent of ``x`` (an integer ``x`` is cast to float32)."""
    return call("tanh", x)


def erf(x: ExprLike) -> Expr:
    """The Gauss error function of ``x``, as in GELU (an integer ``x`` is cast to float32)."""
    return call("erf", x)


def sigmoid(x: ExprLike) -> Expr:
    """``1 / (1 + exp(-x))`` (an integer ``x`` is cast to float32)."""
    return call("sigmoid", x)


def abs(x: ExprLike) -> Expr:  # noqa: A001
    """The absolute value of ``x``, in ``x``'s own dtype."""
    return call("abs", x)


def pow(x: ExprLike, y: ExprLike) -> Expr:  # noqa: A001
    """``x ** y``, in the dtype both operands promote to."""
    return binary("pow", x, y)
