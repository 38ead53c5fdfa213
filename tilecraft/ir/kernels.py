"""A GPU function's kernels: each nest at its root runs as a grid of its own, in order.

The blocks of one grid cannot wait for each other, so a nest at the root that reads what
another writes (split-K's partial sums, added up by the epilogue's nest) must run after
that one has finished: as the next kernel, the way TVM's SplitHostDevice makes a kernel of
each thread-bound nest at the root. What the nests pass between them lives in the
function's workspace, global buffers that the module allocates once and passes to every
kernel after the arguments.
"""

from __future__ import annotations

from dataclasses import replace

from ..te.expr import Expr, TensorRead, walk
from .nodes import Allocate, Buffer, LoweredFunc, Seq, Stmt, map_stmt


def split_kernels(func: LoweredFunc) -> tuple[tuple[LoweredFunc, ...], tuple[Buffer, ...]]:
    """The kernels of ``func``, one a nest at its root, and its workspace (none where one
    nest is the whole function, which is then its only kernel, unchanged). Each kernel takes
    the function's arguments, then the workspace; it is named ``{name}_kernel{n}`` where there
    are several, and zeroes what the function zeroes that it adds into."""
    body, allocated = func.body, []
    while isinstance(body, Allocate):
        allocated.append(body.buffer)
        body = body.body
    roots = body.stmts if isinstance(body, Seq) else (body,)
    if len(roots) == 1:
        return (func,), ()
    workspace = tuple(b for b in allocated if b.scope == "global")
    args = func.args + workspace
    kernels = []
    for n, root in enumerate(roots):
        written, touched = accesses(root)
        for buffer in reversed(allocated):  # an array of another scope at the root: in the kernels using it
            if buffer.scope != "global" and id(buffer) in touched:
                root = Allocate(buffer, root)
        zeroed = tuple(z and id(b) in written for b, z in zip(args, func.zeroed)) if func.zeroed else ()
        kernels.append(replace(func, name=f"{func.name}_kernel{n}", args=args, body=root, zeroed=zeroed,
                               outputs=tuple(id(b) in written for b in args)))
    return tuple(kernels), workspace


def accesses(s: Stmt) -> tuple[set[int], set[int]]:
    """The ``id`` of every buffer that ``s`` writes, and of every one it reads or writes."""
    written, touched = set(), set()

    def note(node: Expr) -> None:
        if isinstance(node, TensorRead) and isinstance(node.tensor, Buffer):
            touched.add(id(node.tensor))

    def stored(buffer: Buffer) -> Buffer:
        written.add(id(buffer))
        return buffer

    map_stmt(s, lambda e: walk(e, note) or e, stored)
    return written, touched | written
