"""``rfactor``: split one reduction into a partial reduction and a reduction of the partials.

``B[i] = sum(A[i, k])`` with ``k`` split into ``ko, ki`` and factored over ``ki`` becomes

    B_rf[i, ki] = sum over ko of A[i, ko * 16 + ki]      (where ko * 16 + ki < K)
    B[i]        = sum over ki_v of B_rf[i, ki_v]

so the loop ``ki`` is no longer a reduction: it can run in parallel or as vector lanes.
The reduction axes become expressions of the block's reduction *leaf* loops through their
splits and fuses, so the factored loop may be a piece of several fused reduction axes.
Where a split does not divide, the predicate keeps the partial tile from combining twice
(or from reading past the end): an element with no valid iteration keeps the combiner's
identity, which the second reduction absorbs.

The rf block keeps the original block's loops (same ids, so loop handles stay valid, with
the factored loop now spatial); the original block keeps its name and buffer and gets a
fresh loop nest over its axes and the new reduction axis.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..errors import ScheduleError
from ..te.arith import bounds, simplify
from ..te.dtype import accumulates_in
from ..te.expr import (Const, Expr, Logical, Reduce, Select, TensorRead, Var, binary, const, reduction_identity,
                       substitute)
from ..te.tensor import ComputeOp, IterVar, Tensor
from .state import Fuse, Loop, Split, Stage, initial_stage


def check_rfactor(stage: Stage, loop: Loop, attached: list[Stage], factor_axis: int) -> None:
    """Raise a ``ScheduleError`` naming the problem if ``stage`` cannot be factored over ``loop``."""
    where = f"rfactor of loop {loop.name} of block {stage.name}"
    if not isinstance(stage.op.body, Reduce):
        raise ScheduleError(f"{where}: the block is not a reduction; rfactor applies to a block whose body "
                            "is te.sum/te.max/te.min")
    if loop.kind != "reduce":
        raise ScheduleError(f"{where}: it is a spatial loop; pass a reduction loop (one over a reduce axis, "
                            "or a piece of it from split)")
    if stage.attach is not None:
        raise ScheduleError(f"{where}: the block is computed at a loop of block {stage.attach.stage}; "
                            "apply rfactor before compute_at")
    if attached:
        raise ScheduleError(f"{where}: block {attached[0].name} is computed at a loop of {stage.name}; "
                            "apply rfactor before moving blocks into it")
    if stage.init_loop is not None:
        raise ScheduleError(f"{where}: the reduction was decomposed; apply rfactor before decompose_reduction")
    ndim = len(stage.op.axis)
    if isinstance(factor_axis, bool) or not isinstance(factor_axis, (int, np.integer)) \
            or not -ndim - 1 <= factor_axis <= ndim:
        raise ScheduleError(f"{where}: factor_axis must be an int in [{-ndim - 1}, {ndim}] (the position of the "
                            f"new axis among the {ndim} output axes), got {factor_axis!r}")


def factor_stages(stage: Stage, loop: Loop, factor_axis: int, first_id: int) -> tuple[Stage, Stage]:
    """The rf stage and the rewritten original stage (whose loops take ids from ``first_id``)."""
    op, body = stage.op, stage.op.body
    position = factor_axis % (len(op.axis) + 1)
    reduce_leaves = [stage.loop(l) for l in stage.leaves if stage.loop(l).kind == "reduce"]
    leaf_vars = {leaf.id: Var(leaf.name) for leaf in reduce_leaves}
    value, predicate = _reduce_axes_in_leaves(stage, leaf_vars)

    axes = tuple(IterVar(Var(iv.name), iv.extent, "spatial") for iv in op.axis)
    factored = IterVar(leaf_vars[loop.id], loop.extent, "spatial")
    rf_axes = axes[:position] + (factored,) + axes[position:]
    rf_reduce = tuple(IterVar(leaf_vars[l.id], l.extent, "reduce") for l in reduce_leaves if l.id != loop.id)
    mapping = {old.var: new.var for old, new in zip(op.axis, axes)}
    mapping.update({iv.var: value[root] for iv, root in zip(op.reduce_axis, stage.roots[len(op.axis):])})
    source = substitute(body.source, mapping)
    where = _conjunction([substitute(body.where, mapping)] + predicate)
    rf_dtype = accumulates_in(op.dtype)  # the partial sums of a float16 sum are float32, rounded once at the end
    if rf_reduce:
        rf_body: Expr = Reduce(body.combiner, source, rf_reduce, where)
    else:  # the factored loop was the only reduction loop: every rf element is one term
        rf_body = source if _is_true(where) else Select(where, source, reduction_identity(body.combiner, rf_dtype))
    rf_op = ComputeOp(f"{stage.name}_rf", rf_axes, rf_body, rf_dtype, op.attrs)

    spatial = [l for l in stage.loops if l.kind == "spatial"]
    spatial_roots = list(stage.roots[: len(op.axis)])
    rf_stage = replace(
        stage, name=rf_op.name, op=rf_op, tensor=Tensor(rf_op),
        loops=tuple(spatial) + tuple(replace(l, kind="spatial") if l.id == loop.id else l for l in reduce_leaves),
        roots=tuple(spatial_roots[:position] + [loop.id] + spatial_roots[position:]
                    + [l.id for l in reduce_leaves if l.id != loop.id]),
        relations=tuple(r for r in stage.relations if stage.loop(_child_of(r)).kind == "spatial"),
        scope="global", is_output=False,
    )

    out_axes = tuple(IterVar(Var(iv.name), iv.extent, "spatial") for iv in op.axis)
    partial = IterVar(Var(f"{loop.name}_v"), loop.extent, "reduce")
    indices = [iv.var for iv in out_axes]
    read = TensorRead(rf_stage.tensor, tuple(indices[:position] + [partial.var] + indices[position:]))
    out_op = ComputeOp(op.name, out_axes, Reduce(body.combiner, read, (partial,), const(True)), op.dtype)
    fresh = initial_stage(out_op, stage.tensor, first_id, stage.is_output)
    return rf_stage, replace(fresh, scope=stage.scope)


def _reduce_axes_in_leaves(stage: Stage, leaf_vars: dict[int, Var]) -> tuple[dict[int, Expr], list[Expr]]:
    """Each reduction loop of ``stage`` as an expression of its reduction leaves, and the
    conditions that keep a non-dividing split's extra iterations out."""
    value: dict[int, Expr] = dict(leaf_vars)
    ranges = {leaf_vars[l]: stage.loop(l).extent for l in leaf_vars}
    for rel in reversed(stage.relations):
        if stage.loop(_child_of(rel)).kind != "reduce":
            continue
        if isinstance(rel, Split):
            expr = value[rel.children[0]]
            for child, factor in zip(rel.children[1:], rel.factors):
                expr = binary("add", binary("mul", expr, const(factor)), value[child])
            value[rel.parent] = simplify(expr, ranges)
        else:
            fused = value[rel.child]
            for n, parent in enumerate(rel.parents):
                inner = math.prod(stage.loop(p).extent for p in rel.parents[n + 1:])
                part = binary("floordiv", fused, const(inner)) if inner > 1 else fused
                part = binary("floormod", part, const(stage.loop(parent).extent)) if n > 0 else part
                value[parent] = simplify(part, ranges)
    predicate = []
    for loop_id, expr in value.items():
        extent = stage.loop(loop_id).extent
        span = bounds(expr, ranges)
        if loop_id not in leaf_vars and (span is None or span[1] >= extent):
            predicate.append(expr < extent)
    return value, predicate


def _child_of(relation: Split | Fuse) -> int:
    return relation.children[0] if isinstance(relation, Split) else relation.child


def _conjunction(conditions: list[Expr]) -> Expr:
    conditions = [c for c in conditions if not _is_true(c)]
    if not conditions:
        return const(True)
    result = conditions[0]
    for condition in conditions[1:]:
        result = Logical("and", result, condition)
    return result


def _is_true(condition: Expr) -> bool:
    return isinstance(condition, Const) and bool(condition.value)
