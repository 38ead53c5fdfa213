"""Integer index arithmetic: canonical linear forms, simplification and bounds.

Index expressions produced by split and fuse are sums of loop variables times
constants, wrapped in ``//`` and ``%``. Writing each as ``sum(coeff * atom) + const``
(an atom is a variable or an irreducible term) lets us cancel ``(o*16 + i) // 16`` to
``o`` when ``0 <= i < 16``, and bound an index over the loops that vary inside a tile.
``ranges`` maps each loop variable to its extent: the variable lies in ``[0, extent)``.
"""

from __future__ import annotations

from typing import Mapping

from .dtype import is_int
from .expr import Binary, Const, Expr, Var, binary, const, map_children

Ranges = Mapping[Var, int]


class Linear:
    """``sum(coeff * atom) + const`` over integer atoms."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict[Expr, int] | None = None, constant: int = 0):
        self.terms = {a: c for a, c in (terms or {}).items() if c != 0}
        self.const = constant

    def add(self, other: Linear, sign: int = 1) -> Linear:
        terms = dict(self.terms)
        for atom, coeff in other.terms.items():
            terms[atom] = terms.get(atom, 0) + sign * coeff
        return Linear(terms, self.const + sign * other.const)

    def scale(self, factor: int) -> Linear:
        return Linear({a: c * factor for a, c in self.terms.items()}, self.const * factor)

    def to_expr(self, dtype: str = "int32") -> Expr:
        result: Expr | None = None
        for atom, coeff in sorted(self.terms.items(), key=lambda item: _order(item[0])):
            term = atom if coeff == 1 else binary("mul", atom, const(coeff, dtype))
            result = term if result is None else binary("add", result, term)
        if result is None:
            return const(self.const, dtype)
        if self.const:
            result = binary("add", result, const(self.const, dtype))
        return result


def _order(atom: Expr) -> tuple:
    return (0, atom.uid) if isinstance(atom, Var) else (1, str(atom))


def to_linear(expr: Expr, ranges: Ranges) -> Linear:
    if isinstance(expr, Const):
        return Linear({}, int(expr.value))
    if isinstance(expr, Var):
        return Linear({expr: 1})
    if isinstance(expr, Binary) and is_int(expr.dtype):
        if expr.op in ("add", "sub"):
            return to_linear(expr.a, ranges).add(to_linear(expr.b, ranges), 1 if expr.op == "add" else -1)
        if expr.op == "mul":
            a, b = to_linear(expr.a, ranges), to_linear(expr.b, ranges)
            if not b.terms:
                return a.scale(b.const)
            if not a.terms:
                return b.scale(a.const)
            return Linear({binary("mul", a.to_expr(expr.dtype), b.to_expr(expr.dtype)): 1})
        if expr.op in ("floordiv", "floormod"):
            divisor = to_linear(expr.b, ranges)
            if not divisor.terms and divisor.const > 0:
                return _div_mod(expr.op, to_linear(expr.a, ranges), divisor.const, ranges, expr.dtype)
        if expr.op in ("min", "max"):
            a, b = to_linear(expr.a, ranges), to_linear(expr.b, ranges)
            diff = bounds(a.add(b, -1).to_expr(expr.dtype), ranges)
            if diff is not None:
                if diff[1] <= 0:
                    return a if expr.op == "min" else b
                if diff[0] >= 0:
                    return b if expr.op == "min" else a
            return Linear({binary(expr.op, a.to_expr(expr.dtype), b.to_expr(expr.dtype)): 1})
    return Linear({simplify(expr, ranges) if not isinstance(expr, Binary) else expr: 1})


def _div_mod(op: str, value: Linear, divisor: int, ranges: Ranges, dtype: str) -> Linear:
    """``(q*d + r) // d == q + r // d`` and ``(q*d + r) % d == r % d``; fold ``r`` when its range allows."""
    quotient = Linear({a: c // divisor for a, c in value.terms.items() if c % divisor == 0},
                      value.const // divisor)
    rest = Linear({a: c for a, c in value.terms.items() if c % divisor != 0}, value.const % divisor)
    span = bounds(rest.to_expr(dtype), ranges) if rest.terms else (rest.const, rest.const)
    if span is not None and span[0] // divisor == span[1] // divisor:
        period = span[0] // divisor
        if op == "floordiv":
            return quotient.add(Linear({}, period))
        return rest.add(Linear({}, period * divisor), -1)
    split = _split_by_step(rest, divisor, ranges, dtype)
    if split is not None:  # rest = g*steps + small, 0 <= small < g, g | divisor
        step, steps, small = split
        if op == "floordiv":
            return quotient.add(_div_mod(op, steps, divisor // step, ranges, dtype))
        return _div_mod(op, steps, divisor // step, ranges, dtype).scale(step).add(small)
    atom = binary(op, rest.to_expr(dtype), const(divisor, dtype))
    if op == "floordiv":
        return quotient.add(Linear({atom: 1}))
    return Linear({atom: 1})


def _split_by_step(value: Linear, divisor: int, ranges: Ranges, dtype: str):
    """``value`` as ``step * steps + small`` with ``step`` a divisor of ``divisor`` above 1
    and ``small`` in ``[0, step)``, the largest such step; None if there is none. Then
    ``(4x + v) % 8`` with ``v < 4`` is ``4 * (x % 2) + v``: a vector of four lanes stays
    contiguous in a fused index that wraps every eight elements."""
    for step in range(divisor - 1, 1, -1):
        if divisor % step:
            continue
        steps = Linear({a: c // step for a, c in value.terms.items() if c % step == 0})
        small = Linear({a: c for a, c in value.terms.items() if c % step}, value.const)
        span = bounds(small.to_expr(dtype), ranges) if small.terms else (small.const, small.const)
        if steps.terms and span is not None and 0 <= span[0] and span[1] < step:
            return step, steps, small
    return None


def simplify(expr: Expr, ranges: Ranges) -> Expr:
    """A simpler equal expression; integer parts are put in canonical linear form."""
    if isinstance(expr, (Var, Const)):
        return expr
    if isinstance(expr, Binary) and is_int(expr.dtype):
        return to_linear(expr, ranges).to_expr(expr.dtype)
    return map_children(expr, lambda e: simplify(e, ranges))


def bounds(expr: Expr, ranges: Ranges) -> tuple[int, int] | None:
    """Inclusive integer bounds of ``expr`` with every variable in ``[0, extent)``; None if unknown."""
    if isinstance(expr, Const):
        return (int(expr.value), int(expr.value))
    if isinstance(expr, Var):
        return (0, ranges[expr] - 1) if expr in ranges else None
    if not isinstance(expr, Binary):
        return None
    a, b = bounds(expr.a, ranges), bounds(expr.b, ranges)
    if a is None or b is None:
        if expr.op == "floormod" and b is not None and b[0] == b[1] and b[0] > 0:
            return (0, b[0] - 1)
        return None
    if expr.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if expr.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if expr.op == "mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if expr.op in ("floordiv", "floormod") and b[0] == b[1] and b[0] > 0:
        if expr.op == "floordiv":
            return (a[0] // b[0], a[1] // b[0])
        if a[0] // b[0] == a[1] // b[0]:
            return (a[0] % b[0], a[1] % b[0])
        return (0, b[0] - 1)
    if expr.op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if expr.op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    return None


def interval(expr: Expr, varying: Ranges, ranges: Ranges) -> tuple[Expr, int] | None:
    """Symbolic ``(min, extent)`` of ``expr`` as the ``varying`` variables sweep their ranges.

    Other variables stay symbolic in ``min``. Returns None when the extent is not a
    constant that can be proven (the caller then falls back to the whole tensor).
    """
    linear = to_linear(simplify(expr, ranges), ranges)
    fixed = Linear({}, linear.const)
    low, high = 0, 0
    for atom, coeff in linear.terms.items():
        atom_vars = _vars_of(atom)
        if not atom_vars & set(varying):
            fixed = fixed.add(Linear({atom: coeff}))
            continue
        if isinstance(atom, Var):
            span = (0, varying[atom] - 1)
        else:
            span = bounds(atom, ranges)
            if span is None or atom_vars - set(varying):
                return None
        low += min(coeff * span[0], coeff * span[1])
        high += max(coeff * span[0], coeff * span[1])
    return fixed.add(Linear({}, low)).to_expr(), high - low + 1


def _vars_of(expr: Expr) -> set[Var]:
    from .expr import free_vars

    return free_vars(expr)
