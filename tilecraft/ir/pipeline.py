"""Software pipelining of a GPU block's shared-memory tiles: double buffering.

A reduction loop whose every step fills shared tiles between two barriers, then computes
from them, has each thread wait for global memory at every step. Pipelined (a loop of kind
``pipeline``, from ``Schedule.annotate(loop, "software_pipeline", 2)``), the tiles get two
slots: before the loop, the first step's tiles are filled into slot 0; each step then fills
the next step's tiles into the other slot while it computes from its own, the copies
asynchronous where the GPU has them (``AsyncCopies``: ``cp.async``, sm_80 and newer; each
step's copies a group of their own), so global memory's latency hides behind the
arithmetic. A barrier at the end of a step keeps a slot from being refilled while another
thread still reads it. A loop without that shape, or whose doubled tiles would outgrow the
227 KB a block may have on sm_90, stays serial (past 48 KB the kernel takes dynamic shared
memory; the verifier holds a smaller GPU to its limit).
"""

from __future__ import annotations

from dataclasses import replace

from ..te.dtype import bytes_of
from ..te.expr import Expr, binary, const
from .nodes import (Allocate, AsyncCopies, AsyncWait, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store,
                    ThreadAllReduce, rebuffer, seq, substitute_stmt, walk_stmts)

SHARED_BYTES = 227 << 10  # the most shared memory a block may opt in to (sm_90)


def software_pipeline(body: Stmt) -> Stmt:
    """``body`` with each loop of kind ``pipeline`` double-buffered where it can be, else serial."""
    if not any(isinstance(n, For) and n.kind == "pipeline" for n in walk_stmts(body)):
        return body
    spare = SHARED_BYTES - sum(_bytes(n.buffer) for n in walk_stmts(body)
                               if isinstance(n, Allocate) and n.buffer.scope == "shared")

    def visit(s: Stmt) -> Stmt:
        if isinstance(s, For):
            loop = replace(s, body=visit(s.body))
            if s.kind != "pipeline":
                return loop
            return _double_buffered(loop, spare) or replace(loop, kind="serial")
        if isinstance(s, Seq):
            return Seq(tuple(visit(c) for c in s.stmts))
        if isinstance(s, IfThenElse):
            return replace(s, then=visit(s.then))
        if isinstance(s, (Allocate, AsyncCopies)):
            return replace(s, body=visit(s.body))
        return s

    return visit(body)


def synchronous(s: Stmt) -> Stmt:
    """``s`` with its asynchronous copies plain ones and no waits: what the CPU emulation runs."""
    if isinstance(s, AsyncCopies):
        return synchronous(s.body)
    if isinstance(s, Seq):
        return seq([None if isinstance(c, AsyncWait) else synchronous(c) for c in s.stmts])
    if isinstance(s, (For, Allocate)):
        return replace(s, body=synchronous(s.body))
    if isinstance(s, IfThenElse):
        return replace(s, then=synchronous(s.then))
    return s


def _double_buffered(loop: For, spare: int) -> Stmt | None:
    """``loop`` pipelined, or None where its step is not [barrier, fills of its shared tiles,
    barrier, the rest] or the tiles do not fit twice."""
    tiles, local, body = [], [], loop.body
    while isinstance(body, Allocate):
        (tiles if body.buffer.scope == "shared" else local).append(body.buffer)
        body = body.body
    steps = list(body.stmts) if isinstance(body, Seq) else [body]
    ends = [n for n, step in enumerate(steps) if isinstance(step, Barrier)]
    if loop.extent < 2 or not tiles or len(ends) < 2 or ends[0] != 0 or sum(map(_bytes, tiles)) > spare:
        return None
    fills, rest = steps[1:ends[1]], steps[ends[1] + 1:]
    ids = {id(b) for b in tiles}
    if not fills or not _written(fills) <= ids or _written(rest) & ids or any(
            isinstance(n, Barrier) for step in rest for n in walk_stmts(step)):
        return None
    doubled = {b: b.stacked(2, "shared") for b in tiles}

    def in_slot(stmt: Stmt, slot: Expr) -> Stmt:
        return rebuffer(stmt, doubled, lambda buffer, indices: (slot,) + indices)

    k = loop.var
    after = binary("add", k, const(1, k.dtype))

    def fill(step: Expr) -> Stmt:
        return AsyncCopies(in_slot(substitute_stmt(seq(fills), {k: step}), binary("floormod", step, const(2, k.dtype))))

    step: Stmt = seq([IfThenElse(k < loop.extent - 1, fill(after)), AsyncWait(1), Barrier(),
                      in_slot(seq(rest), binary("floormod", k, const(2, k.dtype))), Barrier()])
    for buffer in reversed(local):
        step = Allocate(buffer, step)
    # the first step's copies a group of their own, waited for in the first step: committed with
    # the next step's, a wait leaving the latest group in flight would not wait for them
    pipelined: Stmt = seq([fill(const(0, k.dtype)), AsyncWait(1), replace(loop, kind="serial", body=step)])
    for buffer in reversed(tiles):
        pipelined = Allocate(doubled[buffer], pipelined)
    return pipelined


def _written(stmts) -> set[int]:
    return {id(n.buffer) for s in stmts for n in walk_stmts(s) if isinstance(n, (Store, ThreadAllReduce))}


def _bytes(buffer: Buffer) -> int:
    return buffer.elements * bytes_of(buffer.dtype)
