"""Readable text for expressions, in the style of Ansor's ComputeDAG printout."""

from __future__ import annotations

from .expr import Binary, Call, Cast, Compare, Const, Expr, Logical, Not, Reduce, Select, TensorRead, Var

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": " && ", "or": " || "}


def expr_to_str(expr: Expr) -> str:
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, Const):
        if expr.dtype == "bool":
            return "True" if expr.value else "False"
        if expr.dtype.startswith("float"):
            return f"{expr.value!r}f" if expr.dtype == "float32" else repr(expr.value)
        return str(expr.value)
    if isinstance(expr, Binary):
        if expr.op in _INFIX:
            return f"({expr_to_str(expr.a)}{_INFIX[expr.op]}{expr_to_str(expr.b)})"
        return f"{expr.op}({expr_to_str(expr.a)}, {expr_to_str(expr.b)})"
    if isinstance(expr, (Compare, Logical)):
        return f"({expr_to_str(expr.a)} {_INFIX[expr.op].strip()} {expr_to_str(expr.b)})"
    if isinstance(expr, Not):
        return f"!{expr_to_str(expr.a)}"
    if isinstance(expr, Select):
        return (f"select({expr_to_str(expr.cond)}, {expr_to_str(expr.true_value)}, "
                f"{expr_to_str(expr.false_value)})")
    if isinstance(expr, Cast):
        return f"{expr.to}({expr_to_str(expr.value)})"
    if isinstance(expr, Call):
        return f"{expr.name}({', '.join(expr_to_str(a) for a in expr.args)})"
    if isinstance(expr, TensorRead):
        return f"{expr.tensor.name}[{', '.join(expr_to_str(i) for i in expr.indices)}]"
    if isinstance(expr, Reduce):
        axes = ", ".join(a.name for a in expr.axes)
        where = "" if isinstance(expr.where, Const) and expr.where.value else f", where={expr_to_str(expr.where)}"
        return f"{expr.combiner}({expr_to_str(expr.source)}, axis=[{axes}]{where})"
    return repr(expr)
