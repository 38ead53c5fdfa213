"""Software prefetch of the next chunk of packed weights, spread over the loop that reuses a chunk.

Timed alone, a layer's weights sit in the caches; inside a model each call reads them from
memory, and a register-tiled convolution whose rows reuse each chunk of its weights (the
reduction split outside the rows) waits for every new chunk. So where the outermost
reduction loop inside the parallel loop moves a packed weight read by a contiguous chunk of
at least ``MIN_CHUNK_BYTES``, and the next loop with more than one iteration reuses that
chunk (its variable is not in the read), each of its iterations asks for its share of the
next chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..te.arith import simplify, to_linear
from ..ir.nodes import Allocate, Buffer, For, IfThenElse, LoweredFunc, Seq, Stmt, Store
from ..te.dtype import bytes_of
from ..te.expr import Expr, TensorRead, Var, binary, cast, const, substitute, walk

MIN_CHUNK_BYTES = 4096


@dataclass(frozen=True)
class Prefetch:
    """At the start of each iteration of a loop: ``nbytes`` of ``buffer`` from element
    ``index`` on, while ``chunk_var`` is below ``chunk_last``."""

    buffer: Buffer
    index: Expr
    nbytes: int
    chunk_var: Var
    chunk_last: int


def prefetches(func: LoweredFunc, cache_bytes: int) -> dict[int, list[Prefetch]]:
    """The prefetches of ``func``, by the ``id`` of the loop whose body starts with them: for
    the packed weights that outgrow ``cache_bytes`` (a core's L2; smaller ones stay there
    between a call's rows, and prefetching them cost ResNet-50's 56x56 layers 3-4%)."""
    packed = {id(p.packed) for p in func.packs
              if math.prod(p.packed.shape) * bytes_of(p.packed.dtype) > cache_bytes}
    found: dict[int, dict[str, Prefetch]] = {}

    def visit(s: Stmt, loops: tuple[For, ...]) -> None:
        if isinstance(s, For):
            if s.kind == "vectorize" and isinstance(s.body, Store):
                for read in _weight_reads(s.body, packed):
                    site = _site(read, s, loops)
                    if site is not None:
                        found.setdefault(id(site[0]), {})[f"{site[1].buffer.name}[{site[1].index}]"] = site[1]
            else:
                visit(s.body, loops + (s,))
        elif isinstance(s, Seq):
            for child in s.stmts:
                visit(child, loops)
        elif isinstance(s, (IfThenElse, Allocate)):
            visit(s.then if isinstance(s, IfThenElse) else s.body, loops)

    visit(func.body, ())
    return {loop: list(sites.values()) for loop, sites in found.items()}


def _weight_reads(store: Store, packed: set[int]) -> list[TensorRead]:
    """The packed weights a register tile's accumulation reads (none for any other store)."""
    reads: list[TensorRead] = []
    walk(store.value, lambda e: reads.append(e) if isinstance(e, TensorRead) else None)
    if store.buffer.scope != "local" or not any(r.tensor is store.buffer for r in reads):
        return []
    return [r for r in reads if id(r.tensor) in packed]


def _site(read: TensorRead, vector: For, loops: tuple[For, ...]) -> tuple[For, Prefetch] | None:
    """The loop that reuses ``read``'s chunk and what to prefetch there, or None."""
    ranges = {loop.var: loop.extent for loop in loops + (vector,)}
    index = flat_index(read.tensor, read.indices, ranges)
    strides = to_linear(index, ranges).terms
    if strides.get(vector.var) != 1 or not all(isinstance(v, Var) and isinstance(c, int) for v, c in strides.items()):
        return None
    serial = [n for n, loop in enumerate(loops) if loop.kind != "parallel" and loop.extent > 1]
    moving = [n for n in serial if strides.get(loops[n].var, 0) > 0]
    if not moving:
        return None
    outer = moving[0]
    inside = loops[outer + 1:] + (vector,)
    chunk = strides[loops[outer].var]
    span = 1 + sum(strides.get(loop.var, 0) * (loop.extent - 1) for loop in inside)
    itemsize = bytes_of(read.tensor.dtype)
    reuser = next((loop for loop in loops[outer + 1:] if loop.extent > 1), None)
    if (span != chunk or chunk * itemsize < MIN_CHUNK_BYTES or reuser is None
            or reuser.var in strides or any(strides.get(loop.var, 0) < 0 for loop in inside)):
        return None
    zero = {loop.var: const(0, index.dtype) for loop in inside}
    next_chunk = binary("add", loops[outer].var, const(1, index.dtype))
    start = simplify(substitute(index, {**zero, loops[outer].var: next_chunk}), ranges)
    share = -(-chunk * itemsize // reuser.extent)
    mine = binary("add", start, binary("mul", reuser.var, const(share // itemsize, index.dtype)))
    return reuser, Prefetch(read.tensor, mine, share, loops[outer].var, loops[outer].extent - 1)


def flat_index(buffer: Buffer, indices, ranges) -> Expr:
    """The element offset of ``buffer[indices]``: row-major, or along its padded rows, from its offset."""
    dtype = "int32" if buffer.elements < 2**31 else "int64"
    flat: Expr = const(buffer.offset, dtype)
    for index, stride in zip(indices, buffer.strides):
        flat = binary("add", flat, binary("mul", cast(dtype, index), const(stride, dtype)))
    return simplify(flat, ranges)
