"""bfloat16 products summed two steps at a time: AVX-512 BF16's dot product of pairs.

``vdpbf16ps`` adds to each float32 lane the products of two pairs of bfloat16 (exact in
float32) in one instruction, where widening each element and an FMA take three: PyTorch's
bfloat16 matmul on such a CPU (oneDNN) ran at twice tilecraft's float32 rate. The register
tile the search already makes has that shape: a reduction loop ``k`` around the tile's rows
around a vectorized loop of columns, whose store adds ``A[i, k] * B[k, j]`` into a float32
accumulator. Taking ``k`` two steps at a time, each lane's pair of B is its column's elements
at ``k`` and ``k + 1`` (two rows loaded and interleaved, once for all the tile's rows) and
A's pair is the two elements of its row, broadcast. A weight packed in pairs
(``schedule/layout.py``) holds each lane's pair side by side already: one load. The C
emitter writes that form where ``__AVX512BF16__`` is defined and the usual loop otherwise,
so a kernel compiles anywhere.
The sum is the same up to its order (and to denormals, which the instruction flushes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir.nodes import For, Store
from ..te.expr import Binary, Cast, Expr, TensorRead, Var, free_vars


@dataclass(frozen=True)
class DotPairs:
    """A reduction loop ``k`` (of even extent) whose nest of the tile's rows ends in
    ``vector``, a vectorized loop storing ``acc + a * b``: ``a`` is the same in every lane,
    ``b`` contiguous along it, or ``b_paired``: its elements at k and k + 1 side by side, a
    lane's pair after the previous lane's (one vector load); ``a_adjacent`` where a's elements
    at k and k + 1 are neighbours (one 4-byte load, broadcast)."""

    k: Var
    vector: For
    a: TensorRead
    b: TensorRead
    a_adjacent: bool
    b_paired: bool = False


def dot_pairs(loop: For, stride: Callable[[TensorRead, Var], int | None],
              pair_step: Callable[[TensorRead, For], int | None]) -> DotPairs | None:
    """The pairs ``loop`` sums, where it is such a loop (``stride``: the elements a read moves
    along a loop's variable; ``pair_step``: from a read at an even step of a loop to the next
    step's read, where the elements between are the same at every even step); else None."""
    if loop.kind not in ("serial", "unroll") or loop.extent % 2:
        return None
    inner, between = loop.body, []
    while isinstance(inner, For) and inner.kind in ("serial", "unroll"):
        between.append(inner.var)
        inner = inner.body
    if not (isinstance(inner, For) and inner.kind == "vectorize" and isinstance(inner.body, Store)):
        return None
    store, lanes = inner.body, inner.var
    if not all(any(v in free_vars(i) for i in store.indices) for v in between):
        return None  # a reduction loop nearer the lanes: that one is paired
    value = store.value
    if store.buffer.dtype != "float32" or any(loop.var in free_vars(i) for i in store.indices) \
            or not (isinstance(value, Binary) and value.op == "add" and isinstance(value.a, TensorRead)
                    and value.a.tensor is store.buffer and tuple(value.a.indices) == tuple(store.indices)):
        return None
    product = _uncast(value.b)
    if not (isinstance(product, Binary) and product.op == "mul"):
        return None
    reads = [_uncast(product.a), _uncast(product.b)]
    if not all(isinstance(r, TensorRead) and r.tensor.dtype == "bfloat16"
               and any(loop.var in free_vars(i) for i in r.indices) for r in reads):
        return None
    a, b = sorted(reads, key=lambda r: any(lanes in free_vars(i) for i in r.indices))
    paired = stride(b, lanes) == 2 and pair_step(b, loop) == 1
    if any(lanes in free_vars(i) for i in a.indices) or not (stride(b, lanes) == 1 or paired) \
            or stride(TensorRead(store.buffer, store.indices), lanes) != 1:
        return None
    return DotPairs(loop.var, inner, a, b, stride(a, loop.var) == 1, paired)


def _uncast(e: Expr) -> Expr:
    """``e`` without a widening to float32 (a bfloat16 read or product is computed in it anyway)."""
    return e.value if isinstance(e, Cast) and e.to == "float32" else e
