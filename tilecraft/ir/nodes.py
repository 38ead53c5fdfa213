"""The loop-nest IR that lowering produces and code generation consumes.

Statements are frozen dataclasses; expressions are the te expressions, where a load is a
``TensorRead`` whose ``tensor`` is a ``Buffer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from ..te.expr import Expr, TensorRead, Var, map_children, substitute


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """Memory: a kernel argument, a heap intermediate, or a small local array."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str  # arg | global | shared | local | fragment (a warp's tensor-core registers, ``WarpMatrix``)
    padded: tuple[int, ...] = ()  # elements between consecutive indices of each dimension; () for row major
    offset: int = 0  # elements of its memory before its first: a view into a larger argument (``slices.py``)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Elements between consecutive indices of each dimension: row major unless a
        schedule padded its rows (``Schedule.storage_align``) or reordered its dimensions
        (``Schedule.transform_layout`` on a write), or it views a larger array (``slices.py``)."""
        return self.padded or tuple(math.prod(self.shape[d + 1:]) for d in range(self.ndim))

    @property
    def elements(self) -> int:
        """The elements its memory holds, padding included; a view at an offset, up to its last
        element (past it may lie past the array it views)."""
        if self.offset:
            return self.offset + sum((n - 1) * stride for n, stride in zip(self.shape, self.strides)) + 1
        return max((n * stride for n, stride in zip(self.shape, self.strides)), default=1)

    def in_scope(self, scope: str) -> Buffer:
        """The same memory layout in another scope."""
        return Buffer(self.name, self.shape, self.dtype, scope, self.padded)

    def stacked(self, count: int, scope: str) -> Buffer:
        """``count`` copies of this buffer, one after another along a new first dimension."""
        return Buffer(self.name, (count, *self.shape), self.dtype, scope, self.padded and (self.elements, *self.padded))


@dataclass(frozen=True, slots=True)
class For:
    var: Var
    extent: int
    kind: str  # serial | parallel | vectorize | unroll | a GPU axis (blockIdx.x, threadIdx.y, vthread.x, ...)
    body: Stmt
    unroll_max_step: int = 0  # unroll the loops inside whose iteration count is at most this


@dataclass(frozen=True, slots=True)
class Store:
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class IfThenElse:
    cond: Expr
    then: Stmt


@dataclass(frozen=True, slots=True)
class Seq:
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Allocate:
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True)
class Barrier:
    """All threads of a GPU block wait here until each has arrived (``__syncthreads()``):
    what they stored to shared memory before it is visible to all after it."""


@dataclass(frozen=True, slots=True)
class ThreadAllReduce:
    """``buffer[indices]`` = ``value`` combined over every thread of this thread's row of
    ``threadIdx.x`` (the threads sharing its ``threadIdx.y`` and ``.z``), in each of them:
    the end of a reduction whose loop is bound to ``threadIdx.x``, each thread holding a
    partial. Every thread of the block must reach it, as a barrier."""

    combiner: str  # sum | max | min
    value: Expr
    buffer: Buffer
    indices: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class AtomicAdd:
    """``buffer[indices] += value``, atomically: the end of a reduction whose loop is bound to
    ``blockIdx`` (split-K), each block adding its partial into an output that is zeroed
    before the kernel (``LoweredFunc.zeroed``)."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class AsyncCopies:
    """The copies from global into shared memory in ``body`` may complete later, until the
    next ``AsyncWait`` (``cp.async`` on sm_80 and newer; plain copies elsewhere)."""

    body: Stmt


@dataclass(frozen=True, slots=True)
class AsyncWait:
    """The asynchronous copies issued so far become one group; wait until at most
    ``pending`` groups are unfinished (``cp.async.commit_group`` and ``wait_group``)."""

    pending: int


@dataclass(frozen=True, slots=True)
class MatrixTile:
    """A 16x16 tile of ``buffer`` that a warp's tensor-core operation reads or writes: the
    element at its corner, and the buffer dimensions along which the tile's rows and its
    columns run (one of them the last, contiguous one)."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    row_dim: int
    col_dim: int


@dataclass(frozen=True, slots=True)
class WarpMatrix:
    """One warp's tensor-core operation on 16x16 tiles (PTX ``wmma``, m16n16k16): ``fill``
    zeroes an accumulator tile; ``mma`` adds to it the product of a float16 (or bfloat16) tile
    of A (rows by k) and one of B (k by columns); ``store`` writes it into a float32, float16 or
    bfloat16 tile; ``load``
    reads a tile of A or B into registers that several mma then use. The accumulator (and
    such registers of A or B) is held spread over the warp's 32 lanes (``lane``, bound to
    ``threadIdx.x``) in an order the hardware keeps to itself, so only these operations touch
    it: its buffer's scope is ``fragment``. ``nest`` is the scalar loop nest the operation
    replaces, what it computes: the CPU emulation runs it in one lane of the warp."""

    op: str  # fill | mma | store | load
    tiles: tuple[MatrixTile, ...]  # fill: (accumulator,); mma: (accumulator, a, b); store: (destination, accumulator);
    # load: (fragment, source); an mma's a and b are fragments that loads filled, or tiles loaded by address
    nest: Stmt
    lane: Var


Stmt = Union[For, Store, IfThenElse, Seq, Allocate, Barrier, ThreadAllReduce, AtomicAdd, AsyncCopies, AsyncWait,
             WarpMatrix]


@dataclass(frozen=True, slots=True)
class PackFunc:
    """Copies a layout-free input into its packed layout, once, outside the kernel."""

    name: str
    source: Buffer
    packed: Buffer
    body: Stmt
    arg_index: int


@dataclass(frozen=True, slots=True)
class LoweredFunc:
    name: str
    args: tuple[Buffer, ...]  # in the kernel's argument order
    body: Stmt
    outputs: tuple[bool, ...]  # per argument: written by the kernel
    packs: tuple[PackFunc, ...] = ()
    user_args: tuple[Buffer, ...] = ()  # as the caller sees them (unpacked layouts)
    zeroed: tuple[bool, ...] = ()  # per argument: zeroed before the body, which adds into it (AtomicAdd)

    def __str__(self) -> str:
        from .printer import print_func

        return print_func(self)


def seq(stmts) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        for t in s.stmts if isinstance(s, Seq) else () if s is None else (s,):
            if not (isinstance(t, Barrier) and flat and isinstance(flat[-1], Barrier)):  # one wait is enough
                flat.append(t)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def walk_stmts(s: Stmt):
    """Every statement of ``s``, ``s`` first, then its children in order, depth first."""
    yield s
    if isinstance(s, Seq):
        for child in s.stmts:
            yield from walk_stmts(child)
    elif isinstance(s, (For, Allocate, AsyncCopies)):
        yield from walk_stmts(s.body)
    elif isinstance(s, WarpMatrix):
        yield from walk_stmts(s.nest)
    elif isinstance(s, IfThenElse):
        yield from walk_stmts(s.then)


def map_stmt(s: Stmt, expr_fn, buffer_fn=lambda b: b, indices_fn=lambda buffer, indices: indices) -> Stmt:
    """``s`` with every expression passed through ``expr_fn``, every stored buffer through
    ``buffer_fn`` and every store's indices (after ``expr_fn``) through ``indices_fn(buffer, indices)``."""
    def again(child: Stmt) -> Stmt:
        return map_stmt(child, expr_fn, buffer_fn, indices_fn)

    if isinstance(s, Store):
        return Store(buffer_fn(s.buffer), indices_fn(s.buffer, tuple(expr_fn(i) for i in s.indices)), expr_fn(s.value))
    if isinstance(s, For):
        return For(s.var, s.extent, s.kind, again(s.body), s.unroll_max_step)
    if isinstance(s, Seq):
        return Seq(tuple(again(c) for c in s.stmts))
    if isinstance(s, IfThenElse):
        return IfThenElse(expr_fn(s.cond), again(s.then))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, again(s.body))
    if isinstance(s, AsyncCopies):
        return AsyncCopies(again(s.body))
    if isinstance(s, ThreadAllReduce):
        return ThreadAllReduce(s.combiner, expr_fn(s.value), buffer_fn(s.buffer),
                               indices_fn(s.buffer, tuple(expr_fn(i) for i in s.indices)))
    if isinstance(s, AtomicAdd):
        return AtomicAdd(buffer_fn(s.buffer), indices_fn(s.buffer, tuple(expr_fn(i) for i in s.indices)),
                         expr_fn(s.value))
    if isinstance(s, WarpMatrix):
        return WarpMatrix(s.op, tuple(_map_tile(t, expr_fn, buffer_fn, indices_fn) for t in s.tiles), again(s.nest),
                          s.lane)
    return s


def _map_tile(tile: MatrixTile, expr_fn, buffer_fn, indices_fn) -> MatrixTile:
    """``tile`` through ``map_stmt``'s functions; dimensions put in front of its indices (a
    thread's row, a pipeline stage) move its row and column dimensions along."""
    indices = indices_fn(tile.buffer, tuple(expr_fn(i) for i in tile.indices))
    shift = len(indices) - len(tile.indices)
    return MatrixTile(buffer_fn(tile.buffer), indices, tile.row_dim + shift, tile.col_dim + shift)


def rebuffer(s: Stmt, new: dict[Buffer, Buffer], indices=lambda buffer, indices: indices) -> Stmt:
    """``s`` using ``new[b]`` wherever it read or stored buffer ``b``, those accesses' indices
    passed through ``indices(b, indices)`` (a slot, a thread's row, a slice's offset)."""
    images = {id(old): image for old, image in new.items()}

    def rewrite(e: Expr) -> Expr:
        if isinstance(e, TensorRead) and id(e.tensor) in images:
            return TensorRead(images[id(e.tensor)], indices(e.tensor, tuple(rewrite(i) for i in e.indices)))
        return map_children(e, rewrite)

    return map_stmt(s, rewrite, lambda b: images.get(id(b), b),
                    lambda b, index: indices(b, index) if id(b) in images else index)


def substitute_stmt(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    return map_stmt(s, lambda e: substitute(e, mapping))
