"""Integer index expressions as JSON trees, for layout maps stored in traces.

A tree is an int, ``["var", name]`` or ``[op, a, b]`` with op in add sub mul floordiv
floormod min max.
"""

from __future__ import annotations

from typing import Any

from ..errors import ScheduleError
from ..te.expr import Binary, Const, Expr, Var, binary, convert

_PYTHON = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%"}


def index_expr_to_json(expr: Expr, names: dict[Var, str]) -> Any:
    if isinstance(expr, Const) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, Var) and expr in names:
        return ("var", names[expr])
    if isinstance(expr, Binary) and expr.op in ("add", "sub", "mul", "floordiv", "floormod", "min", "max"):
        return (expr.op, index_expr_to_json(expr.a, names), index_expr_to_json(expr.b, names))
    raise ScheduleError(
        f"a layout map may use only its arguments, integers and + - * // % min max; got {expr}"
    )


def index_expr_from_json(tree: Any, variables: dict[str, Any]) -> Expr:
    if isinstance(tree, int):
        return convert(tree)
    if tree[0] == "var":
        return convert(variables[tree[1]])
    return binary(tree[0], index_expr_from_json(tree[1], variables), index_expr_from_json(tree[2], variables))


def index_expr_to_python(tree: Any) -> str:
    if isinstance(tree, int):
        return str(tree)
    if tree[0] == "var":
        return tree[1]
    a, b = index_expr_to_python(tree[1]), index_expr_to_python(tree[2])
    if tree[0] in _PYTHON:
        return f"({a} {_PYTHON[tree[0]]} {b})"
    return f"{tree[0]}({a}, {b})"
