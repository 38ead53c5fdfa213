"""Scalar expressions of the tensor-expression language.

Every node is an immutable frozen dataclass. Equality and hashing are structural
(two separately built ``A[i, k] * 2`` are equal), so expressions can be dict keys and
compared in tests. Because ``==`` is structural, equality *inside* an expression is
spelled ``te.equal(a, b)`` / ``te.not_equal(a, b)``; the ordering operators
``< <= > >=`` build expressions as in TVM.

A variable has a unique id, so two loop variables both named ``i`` stay distinct.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np

from ..errors import TeError
from .dtype import DTYPES, is_float, is_int, result_dtype, supported

if TYPE_CHECKING:
    from .tensor import IterVar, Tensor

ExprLike = Union["Expr", int, float, bool]

_uids = itertools.count()


class Expr:
    """Base of every scalar expression; Python operators build new expressions.

    ``+ - * / // % -x`` build arithmetic (``/`` on integers is floor division, ``%`` is
    floor modulo), ``< <= > >=`` build comparisons and ``& | ~`` logic; a Python number on
    one side takes the other side's dtype (a float beside an integer makes both float).
    ``==`` compares structure: write
    ``te.equal(a, b)`` for an equality inside a computation. An expression has no truth
    value, so Python ``if``, ``and`` and ``or`` on one raise ``TeError``.
    """

    __slots__ = ()

    @property
    def dtype(self) -> str:
        """The type of the expression's value, e.g. ``"float32"`` or ``"bool"``."""
        raise NotImplementedError

    def __add__(self, other: ExprLike) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("sub", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("sub", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("mul", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("div", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("div", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binary("floordiv", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return binary("floordiv", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("floormod", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return binary("floormod", other, self)

    def __neg__(self) -> Expr:
        return binary("sub", const(0, self.dtype), self)

    def __lt__(self, other: ExprLike) -> Expr:
        return compare("lt", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return compare("le", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return compare("gt", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return compare("ge", self, other)

    def __and__(self, other: ExprLike) -> Expr:
        return Logical("and", convert(self), convert(other))

    def __or__(self, other: ExprLike) -> Expr:
        return Logical("or", convert(self), convert(other))

    def __invert__(self) -> Expr:
        return Not(self)

    def __bool__(self) -> bool:
        raise TeError(
            f"the truth value of the expression {self} is not known while defining a computation; "
            "use te.if_then_else(cond, a, b) instead of Python `if`, and `&`/`|` instead of `and`/`or`"
        )

    def astype(self, dtype: str) -> Expr:
        """The expression converted to ``dtype`` (C's conversion; a float to an int truncates).

        Raises:
            TeError: If ``dtype`` is not one of tilecraft's dtypes.
        """
        return cast(dtype, self)

    def __str__(self) -> str:
        from .printer import expr_to_str

        return expr_to_str(self)


@dataclass(frozen=True, slots=True, eq=False)
class Var(Expr):
    """A scalar variable: a loop index or an axis. Identity by ``uid``."""

    name: str
    var_dtype: str = "int32"
    uid: int = field(default_factory=lambda: next(_uids))

    @property
    def dtype(self) -> str:
        return self.var_dtype

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Var) and other.uid == self.uid

    def __hash__(self) -> int:
        return hash(("Var", self.uid))


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: Any
    const_dtype: str

    @property
    def dtype(self) -> str:
        return self.const_dtype


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    """Arithmetic: add sub mul div floordiv floormod min max pow."""

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


class Boolean(Expr):
    """A comparison or a logical operation: always bool."""

    __slots__ = ()

    @property
    def dtype(self) -> str:
        return "bool"


@dataclass(frozen=True, slots=True)
class Compare(Boolean):
    op: str  # lt le gt ge eq ne
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True)
class Logical(Boolean):
    op: str  # "and" | "or"
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True)
class Not(Boolean):
    a: Expr


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """``cond ? true_value : false_value``; only the chosen side is evaluated."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    @property
    def dtype(self) -> str:
        return self.true_value.dtype


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    to: str
    value: Expr

    @property
    def dtype(self) -> str:
        return self.to


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A math intrinsic, one of ``MATH_FUNCTIONS``."""

    name: str
    args: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.args[0].dtype


@dataclass(frozen=True, slots=True)
class TensorRead(Expr):
    """``tensor[indices]``: a read of a placeholder or of another compute's output."""

    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype


@dataclass(frozen=True, slots=True)
class Reduce(Expr):
    """A commutative reduction (sum max min) of ``source`` over ``axes``, where ``where``.

    Allowed only as the whole body of a compute, as in TVM.
    """

    combiner: str
    source: Expr
    axes: tuple[IterVar, ...]
    where: Expr

    @property
    def dtype(self) -> str:
        return self.source.dtype


MATH_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "rint", "sin", "cos", "tan", "asin",
                  "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
"""The intrinsics a ``Call`` may name; ``rint`` rounds half to even, as C's ``rint`` and NumPy's ``round`` do."""


def const(value: Any, dtype: str | None = None) -> Const:
    """A constant; its dtype is inferred from the Python value when not given.

    Args:
        value: A Python bool, int or float.
        dtype: The constant's dtype; by default ``bool``, ``int32`` (``int64`` past 32
            bits) or ``float32`` by the value's type.

    Raises:
        TeError: If the value is of another type, the dtype is unknown, or a non-integral
            float is given an integer dtype.
    """
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int32" if -(2**31) <= value < 2**31 else "int64"
        elif isinstance(value, float):
            dtype = "float32"
        else:
            raise TeError(f"te.const got {value!r} of type {type(value).__name__}; pass an int, float or bool")
    if not supported(dtype):
        raise TeError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "bool":
        value = bool(value)
    elif is_float(dtype):
        value = float(value)
    else:
        if isinstance(value, float) and not value.is_integer():
            raise TeError(f"constant {value} is not an integer but dtype {dtype} is")
        value = int(value)
    return Const(value, dtype)


def reduction_identity(combiner: str, dtype: str) -> Const:
    """The value ``combiner`` leaves unchanged, what a reduction starts from: 0 for sum, the
    lowest value for max, the highest for min (for bool: max is "any", min is "all")."""
    if combiner == "sum":
        return const(0, dtype) if dtype != "bool" else const(False)
    if dtype == "bool":
        return const(combiner != "max")
    if is_float(dtype):
        return const(float("-inf") if combiner == "max" else float("inf"), dtype)
    info = np.iinfo(np.dtype(dtype))
    return const(int(info.min if combiner == "max" else info.max), dtype)


def convert(value: ExprLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(getattr(value, "var", None), Var):  # an IterVar stands for its variable
        return value.var
    if isinstance(value, (bool, int, float)):
        return const(value)
    raise TeError(
        f"cannot use {value!r} of type {type(value).__name__} in a tensor expression; "
        "use a te expression, an int or a float"
    )


def _unify(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    """Convert both sides, giving a bare Python number the dtype of the other side."""
    a = a.var if isinstance(getattr(a, "var", None), Var) else a
    b = b.var if isinstance(getattr(b, "var", None), Var) else b
    if not isinstance(a, Expr) and isinstance(b, Expr):
        a = _literal_like(a, b.dtype)
    if not isinstance(b, Expr) and isinstance(a, Expr):
        b = _literal_like(b, a.dtype)
    a, b = convert(a), convert(b)
    if a.dtype != b.dtype:
        target = result_dtype(a.dtype, b.dtype)
        a = a if a.dtype == target else cast(target, a)
        b = b if b.dtype == target else cast(target, b)
    return a, b


def _literal_like(value: ExprLike, dtype: str) -> Expr:
    if isinstance(value, float) and not is_float(dtype):
        return const(value)  # 2.5 * int_expr promotes to float
    if dtype == "bool":
        return const(value)
    return const(value, dtype)


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    a, b = _unify(a, b)
    if op == "div" and is_int(a.dtype):
        op = "floordiv"
    if op in ("floordiv", "floormod") and isinstance(b, Const) and b.value == 0:
        raise TeError(f"division by constant zero in {a} {'//' if op == 'floordiv' else '%'} 0")
    return Binary(op, a, b)


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    a, b = _unify(a, b)
    return Compare(op, a, b)


def cast(dtype: str, value: ExprLike) -> Expr:
    if not supported(dtype):
        raise TeError(f"cannot cast to unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    value = convert(value)
    if value.dtype == dtype:
        return value
    if isinstance(value, Const):
        return const(value.value if dtype != "bool" else bool(value.value), dtype) if not (
            is_int(dtype) and isinstance(value.value, float)
        ) else const(math.trunc(value.value), dtype)
    return Cast(dtype, value)


def call(name: str, *args: ExprLike) -> Expr:
    converted = [convert(a) for a in args]
    if any(is_int(a.dtype) or a.dtype == "bool" for a in converted) and name != "abs":
        converted = [cast("float32", a) for a in converted]
    return Call(name, tuple(converted))


def walk(expr: Expr, visit: Callable[[Expr], None]) -> None:
    """Call ``visit`` on every node of ``expr`` in pre-order."""
    stack = [expr]
    while stack:
        node = stack.pop()
        visit(node)
        stack.extend(reversed(children(node)))


def children(node: Expr) -> tuple[Expr, ...]:
    if isinstance(node, (Binary, Compare, Logical)):
        return (node.a, node.b)
    if isinstance(node, Not):
        return (node.a,)
    if isinstance(node, Select):
        return (node.cond, node.true_value, node.false_value)
    if isinstance(node, Cast):
        return (node.value,)
    if isinstance(node, Call):
        return node.args
    if isinstance(node, TensorRead):
        return node.indices
    if isinstance(node, Reduce):
        return (node.source, node.where)
    return ()


def map_children(node: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rebuild ``node`` with ``fn`` applied to each child (shallow)."""
    if isinstance(node, Binary):
        return Binary(node.op, fn(node.a), fn(node.b))
    if isinstance(node, Compare):
        return Compare(node.op, fn(node.a), fn(node.b))
    if isinstance(node, Logical):
        return Logical(node.op, fn(node.a), fn(node.b))
    if isinstance(node, Not):
        return Not(fn(node.a))
    if isinstance(node, Select):
        return Select(fn(node.cond), fn(node.true_value), fn(node.false_value))
    if isinstance(node, Cast):
        return Cast(node.to, fn(node.value))
    if isinstance(node, Call):
        return Call(node.name, tuple(fn(a) for a in node.args))
    if isinstance(node, TensorRead):
        return TensorRead(node.tensor, tuple(fn(i) for i in node.indices))
    if isinstance(node, Reduce):
        return Reduce(node.combiner, fn(node.source), node.axes, fn(node.where))
    return node


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables by expressions."""
    if not mapping:
        return expr

    def rewrite(node: Expr) -> Expr:
        if isinstance(node, Var):
            return mapping.get(node, node)
        return map_children(node, rewrite)

    return rewrite(expr)


def free_vars(expr: Expr) -> set[Var]:
    found: set[Var] = set()
    walk(expr, lambda n: found.add(n) if isinstance(n, Var) else None)
    return found
