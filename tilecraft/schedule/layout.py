"""The packed layout of a weight that follows the loop nest reading it (Ansor's layout rewrite).

A layout-free weight read as ``W[k, j]`` by a block whose loops split ``j`` into
``j0 j1 j2 j3`` and ``k`` into ``k0 k1`` is stored in the order those loops visit it, so
the innermost loops walk contiguous memory: ``W_packed[j0, j1, k0, j2, k1, j3]``, with
unit dimensions dropped and neighbouring pieces of one axis merged. The map is derived
from the split factors, so a candidate with other tile sizes gets its own layout.

With ``pairs`` (a bfloat16 weight on a CPU with AVX-512 BF16), the innermost reduction piece
is also split in two and its last bit moved after the vector lanes: ``W_packed[..., k1 // 2,
j3, k1 % 2]``. ``vdpbf16ps`` takes each lane's elements at ``k`` and ``k + 1`` as one 32-bit
pair, which rows of ``W[k, j]`` make by two loads and an interleave each step and vector
(``codegen/dot_pairs.py``); packed in pairs, one load. In a kernel loop of 8 x 2 vectors, one
core of a Zen 4: 226 GFLOPS against 166.
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..te.expr import Const, Expr, TensorRead, Var, walk
from ..te.tensor import Tensor
from .index_expr import index_expr_to_json
from .state import Fuse, Stage
from .trace import IndexMap


def tiled_layout(stage: Stage, source: Tensor, pairs: bool = False) -> IndexMap:
    """The map from ``source``'s indices to its packed indices in ``stage``'s loop order;
    ``pairs``: neighbours of the innermost reduction piece next to each other, where they are
    read as a vector's pairs (``_paired``), else as without."""
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
    dims: list[list[int]] = []  # [source dim, stride, extent, innermost piece's extent], in loop order
    for leaf in stage.leaves:
        root, stride, extent = placement[leaf]
        if root not in dim_of_root or extent == 1:
            continue
        dim = dim_of_root[root]
        if dims and dims[-1][0] == dim and dims[-1][1] == stride * extent:
            dims[-1][1:] = stride, dims[-1][2] * extent, extent
        else:
            dims.append([dim, stride, extent, extent])
    paired = pairs and _paired(stage, dims, placement, dim_of_root)
    params = tuple(f"i{d}" for d in range(source.ndim))
    variables = [Var(p) for p in params]
    targets: list[Expr] = []
    for n, (dim, stride, extent, _) in enumerate(dims):
        value: Expr = variables[dim]
        if paired and n == len(dims) - 2:  # stride 1, an even innermost piece: k // 2, then k % 2 last
            stride, extent = 2, extent // 2
        if stride > 1:
            value = value // stride
        if stride * extent < source.shape[dim]:
            value = value % extent
        targets.append(value)
    if paired:
        targets.append(variables[dims[-2][0]] % 2)
    if not targets:  # every dimension has extent 1
        targets.append(variables[0])
    names = {v: v.name for v in variables}
    return IndexMap(params, tuple(index_expr_to_json(t, names) for t in targets))


def _paired(stage: Stage, dims: list[list[int]], placement: dict, dim_of_root: dict[int, int]) -> bool:
    """Whether the nest reads ``dims`` as the pairs of a bfloat16 dot product: the last entry
    is the stage's innermost loop, spatial (the vector lanes), and the one before the
    innermost pieces of a reduction, unit-strided and even (the loop taken two steps at a time)."""
    if len(dims) < 2 or not stage.leaves or stage.loop(stage.leaves[-1]).kind != "spatial":
        return False
    root, _, extent = placement[stage.leaves[-1]]
    reductions = set(stage.roots[len(stage.op.axis):])
    k_dim, k_stride, _, k_innermost = dims[-2]
    return dim_of_root.get(root) == dims[-1][0] and extent > 1 and k_stride == 1 and k_innermost % 2 == 0 \
        and any(dim_of_root.get(r) == k_dim for r in reductions)


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
