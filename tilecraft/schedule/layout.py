"""The packed layout of a weight that follows the loop nest reading it (Ansor's layout rewrite).

A layout-free weight read as ``W[k, j]`` by a block whose loops split ``j`` into
``j0 j1 j2 j3`` and ``k`` into ``k0 k1`` is stored in the order those loops visit it, so
the innermost loops walk contiguous memory: ``W_packed[j0, j1, k0, j2, k1, j3]``, with
unit dimensions dropped and neighbouring pieces of one axis merged. The map is derived
from the split factors, so a candidate with other tile sizes gets its own layout.
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..te.expr import Const, Expr, TensorRead, Var, walk
from ..te.tensor import Tensor
from .index_expr import index_expr_to_json
from .state import Fuse, Stage
from .trace import IndexMap


def tiled_layout(stage: Stage, source: Tensor) -> IndexMap:
    """The map from ``source``'s indices to its packed indices in ``stage``'s loop order."""
    axes = list(stage.op.axis) + list(stage.op.reduce_axis)
    root_of_var = {iv.var: root for iv, root in zip(axes, stage.roots)}
    reads: list[TensorRead] = []
    walk(stage.op.body, lambda n: reads.append(n) if isinstance(n, TensorRead) and n.tensor is source else None)
    if not reads or any(r.indices != reads[0].indices for r in reads):
        raise ScheduleError(f"rewrite_layout: block {stage.name} must read {source.name} exactly one way")
    dim_of_root: dict[int, int] = {}
    for dim, index in enumerate(reads[0].indices):
        if isinstance(index, Const) and source.shape[dim] == 1:  # a unit dimension (a depthwise multiplier of 1)
            continue
        if not isinstance(index, Var) or index not in root_of_var or root_of_var[index] in dim_of_root:
            raise ScheduleError(f"rewrite_layout: block {stage.name} reads {source.name} at {reads[0]}; each "
                                "index must be a distinct loop axis of the block")
        dim_of_root[root_of_var[index]] = dim
    placement = _leaf_strides(stage, {root: iv.extent for iv, root in zip(axes, stage.roots)})
    dims: list[list[int]] = []  # [source dim, stride, extent], in loop order
    for leaf in stage.leaves:
        root, stride, extent = placement[leaf]
        if root not in dim_of_root or extent == 1:
            continue
        dim = dim_of_root[root]
        if dims and dims[-1][0] == dim and dims[-1][1] == stride * extent:
            dims[-1][1], dims[-1][2] = stride, dims[-1][2] * extent
        else:
            dims.append([dim, stride, extent])
    params = tuple(f"i{d}" for d in range(source.ndim))
    variables = [Var(p) for p in params]
    targets: list[Expr] = []
    for dim, stride, extent in dims:
        value: Expr = variables[dim]
        if stride > 1:
            value = value // stride
        if stride * extent < source.shape[dim]:
            value = value % extent
        targets.append(value)
    if not targets:  # every dimension has extent 1
        targets.append(variables[0])
    names = {v: v.name for v in variables}
    return IndexMap(params, tuple(index_expr_to_json(t, names) for t in targets))


def _leaf_strides(stage: Stage, root_extents: dict[int, int]) -> dict[int, tuple[int, int, int]]:
    """For each loop: (root loop it comes from, its stride in that root's index, its extent)."""
    placement = {root: (root, 1, extent) for root, extent in root_extents.items()}
    for relation in stage.relations:
        if isinstance(relation, Fuse):
            raise ScheduleError(f"rewrite_layout: block {stage.name} fuses loops; rewrite the layout before fusing")
        root, stride, extent = placement[relation.parent]
        # A split that does not divide pads the outer piece; the packed buffer is then a
        # little larger than the weight, and the padding is never read.
        extents = (-(-extent // math.prod(relation.factors)),) + relation.factors
        for position, (child, child_extent) in enumerate(zip(relation.children, extents)):
            placement[child] = (root, stride * math.prod(extents[position + 1:]), child_extent)
    return placement
