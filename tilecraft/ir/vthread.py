"""Virtual threads interleaved inside a thread's statements, as TVM's ``InjectVirtualThread``.

A loop bound to ``vthread.x`` splits a thread's work into parts it does one after another,
so that a thread's outputs lie apart (a stride of a tile) rather than side by side. Lowered
as it stands, the loop wraps the thread's whole body: each virtual thread fetches the
block's shared tiles again, with its own barriers, although the tiles (computed for all of
the block's threads and virtual threads, ``schedule/bound.py``) are the same. In the kept
H100 logs the fastest candidate with virtual threads took 1.37x its workload's best time.

``inject_virtual_threads`` moves each such loop inward, as far as the statements that use
its variable. What does not use it runs once: copies into shared memory, barriers, the
reduction loops around the arithmetic. What does is repeated, in a small unrolled loop of
the same kind. Each local buffer allocated inside gets a copy per virtual thread, indexed
by it, so a thread's virtual threads keep their accumulators at once. Reordering is sound
because virtual threads share nothing but what they read: each writes its own outputs and
buffers.
"""

from __future__ import annotations

from dataclasses import replace

from ..te.expr import Var, free_vars
from .nodes import (Allocate, AsyncCopies, AsyncWait, AtomicAdd, Barrier, For, IfThenElse, Seq, Stmt, Store,
                    ThreadAllReduce, rebuffer, seq, walk_stmts)


def inject_virtual_threads(body: Stmt) -> Stmt:
    """``body`` with every loop bound to a virtual thread axis moved inward."""
    if not any(isinstance(n, For) and n.kind.startswith("vthread") and n.extent > 1 for n in walk_stmts(body)):
        return body  # a CPU nest, or no virtual threads: nothing to rebuild
    return _inject(body)


def _inject(body: Stmt) -> Stmt:
    if isinstance(body, For):
        inner = replace(body, body=_inject(body.body))
        return _interleave(inner.body, inner) if body.kind.startswith("vthread") and body.extent > 1 else inner
    if isinstance(body, Seq):
        return Seq(tuple(_inject(s) for s in body.stmts))
    if isinstance(body, IfThenElse):
        return IfThenElse(body.cond, _inject(body.then))
    if isinstance(body, (Allocate, AsyncCopies)):
        return replace(body, body=_inject(body.body))
    return body


def _interleave(s: Stmt, loop: For) -> Stmt:
    """``s``, the body of virtual thread loop ``loop``, with the loop around only what uses it."""
    if isinstance(s, Allocate) and s.buffer.scope == "local":  # a copy per virtual thread
        own = s.buffer.stacked(loop.extent, "local")
        return Allocate(own, _interleave(rebuffer(s.body, {s.buffer: own}, lambda b, index: (loop.var, *index)), loop))
    if not _uses(s, loop.var) and _same_when_repeated(s):
        return s
    if isinstance(s, Seq):
        return seq([_interleave(child, loop) for child in s.stmts])
    if isinstance(s, (For, Allocate, AsyncCopies)):
        return replace(s, body=_interleave(s.body, loop))
    if isinstance(s, IfThenElse) and loop.var not in free_vars(s.cond):
        return IfThenElse(s.cond, _interleave(s.then, loop))
    return For(loop.var, loop.extent, loop.kind, s, loop.unroll_max_step)


def _uses(s: Stmt, var: Var) -> bool:
    return any(var in free_vars(e) for node in walk_stmts(s) for e in _expressions(node))


def _same_when_repeated(s: Stmt) -> bool:
    """Whether running ``s`` twice leaves what running it once does: copies into shared
    memory and barriers (an accumulation, an atomic add or a store to a buffer of the
    thread's would not be)."""
    return all(isinstance(node, (For, Seq, IfThenElse, Allocate, AsyncCopies, AsyncWait, Barrier))
               or (isinstance(node, Store) and node.buffer.scope == "shared")
               for node in walk_stmts(s))


def _expressions(s: Stmt):
    if isinstance(s, (Store, AtomicAdd, ThreadAllReduce)):
        return (*s.indices, s.value)
    return (s.cond,) if isinstance(s, IfThenElse) else ()
