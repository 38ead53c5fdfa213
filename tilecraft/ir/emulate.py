"""A GPU loop nest run on the CPU, one thread after another, as MCUDA runs CUDA on CPUs.

On machines without a GPU this is how GPU schedules are checked against the NumPy oracle.
The emulation keeps the kernel's distribution of work rather than reading its bound loops
as plain loops: each block runs its threads in turn, every loop bound to ``threadIdx``
takes the index of the thread running it (skipping threads beyond its extent), the kernel
body is cut into phases at its barriers (each phase runs for all threads before the next
begins), and a thread's local buffers live across phases as one copy per thread. So a
shared-memory tile that the threads fill together is filled only where the real threads
would fill it. An output that blocks add into (split-K) is zeroed first, as the runtime
zeroes it before the kernel, and the blocks' atomic adds are plain ones. A warp's tensor-core
operation runs its scalar loop nest in the warp's first lane. A function of several
kernels runs them one after another, their workspace on the heap. What it cannot see
is what serial execution hides: races, a missing barrier, misaligned vector accesses; the
GPU tests run under compute-sanitizer for those.
"""

from __future__ import annotations

import math

from ..errors import LoweringError
from ..te.expr import Expr, TensorRead, Var, binary, const, reduction_identity, substitute
from .kernels import split_kernels
from .pipeline import synchronous
from .tensor_core import in_one_lane
from .nodes import (Allocate, Barrier, Buffer, For, IfThenElse, LoweredFunc, Seq, Stmt, Store, ThreadAllReduce,
                    rebuffer, seq, substitute_stmt, walk_stmts)

_THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


def emulate_on_cpu(func: LoweredFunc, blocks: tuple[tuple[int, int, int], ...]) -> LoweredFunc:
    """The CPU loop nest that computes what ``func`` computes when each of its kernels
    (``kernels.py``) is launched with its ``blocks`` threads a block (x, y, z), in order:
    block loops serial, threads serialized phase by phase, the workspace on the heap."""
    threads = {axis: Var(f"tc_{axis.replace('.', '_')}") for axis in _THREAD_AXES}
    kernels, workspace = split_kernels(func)
    body = seq([seq([_zero(buffer) for buffer, zeroed in zip(kernel.args, kernel.zeroed) if zeroed]
                    + [_Emulation(threads, block).block_level(synchronous(in_one_lane(kernel.body)))])
                for kernel, block in zip(kernels, blocks)])
    for buffer in reversed(workspace):
        body = Allocate(buffer, body)
    return LoweredFunc(func.name, func.args, body, func.outputs, func.packs, func.user_args)


class _Emulation:
    def __init__(self, threads: dict[str, Var], block: tuple[int, int, int]):
        self.threads, self.block = threads, dict(zip(_THREAD_AXES, block))

    def block_level(self, s: Stmt) -> Stmt:
        """Outside the thread phases: block loops become serial loops."""
        if isinstance(s, For) and s.kind.startswith("blockIdx"):
            return For(s.var, s.extent, "serial", self.block_level(s.body))
        return self.phases(s)

    def phases(self, s: Stmt) -> Stmt:
        """``s`` run by every thread of the block, phase by phase."""
        if not _has_barrier(s):
            return self.all_threads(s)
        if isinstance(s, ThreadAllReduce):  # a phase of its own: each thread folds its row's partials
            return self.all_threads(self.fold(s))
        if isinstance(s, Seq):
            out, run = [], []
            for child in s.stmts:
                if _has_barrier(child):  # a barrier, or a statement holding one, ends a phase
                    out += [self.all_threads(seq(run)) if run else None,
                            None if isinstance(child, Barrier) else self.phases(child)]
                    run = []
                else:
                    run.append(child)
            return seq(out + [self.all_threads(seq(run)) if run else None])
        if isinstance(s, For) and s.kind.startswith("threadIdx"):
            if s.extent != self.block[s.kind]:
                raise LoweringError(f"a barrier lies inside loop {s.var.name} bound to {s.kind} with extent "
                                    f"{s.extent}, fewer than the block's {self.block[s.kind]} threads on that axis")
            return self.phases(substitute_stmt(s.body, {s.var: self.threads[s.kind]}))
        if isinstance(s, For):  # every thread runs this loop alike, so its phases interleave per iteration
            return For(s.var, s.extent, "serial", self.phases(s.body))
        if isinstance(s, Allocate) and s.buffer.scope == "local":  # a per-thread array that lives across phases
            expanded = s.buffer.stacked(self.count, "local")
            return Allocate(expanded, self.phases(_expand(s.body, s.buffer, expanded, self.thread_id())))
        if isinstance(s, Allocate):  # shared memory: one array a block
            local = _as_local(s.buffer)
            return Allocate(local, self.phases(rebuffer(s.body, {s.buffer: local})))
        raise LoweringError("a barrier lies under a condition, which threads may take differently; "
                            "barriers must be reached by every thread of a block")

    def fold(self, s: ThreadAllReduce) -> Stmt:
        lane, x = Var("tc_lane"), self.threads["threadIdx.x"]
        acc = TensorRead(s.buffer, s.indices)
        other = substitute(s.value, {x: lane})  # the partial of the row's thread ``lane``
        combined = binary("add" if s.combiner == "sum" else s.combiner, acc, other)
        return seq([Store(s.buffer, s.indices, reduction_identity(s.combiner, s.buffer.dtype)),
                    For(lane, self.block["threadIdx.x"], "serial", Store(s.buffer, s.indices, combined))])

    @property
    def count(self) -> int:
        return math.prod(self.block.values())

    def thread_id(self) -> Expr:
        x, y, z = (self.threads[a] for a in _THREAD_AXES)
        bx, by = self.block["threadIdx.x"], self.block["threadIdx.y"]
        return binary("add", x, binary("mul", binary("add", y, binary("mul", z, const(by))), const(bx)))

    def all_threads(self, s: Stmt) -> Stmt:
        body = self.one_thread(s)
        for axis in _THREAD_AXES:
            body = For(self.threads[axis], self.block[axis], "serial", body)
        return body

    def one_thread(self, s: Stmt) -> Stmt:
        """What one thread runs of a phase: its own iterations of each thread loop."""
        if isinstance(s, For) and s.kind.startswith("threadIdx"):
            thread = self.threads[s.kind]
            body = self.one_thread(substitute_stmt(s.body, {s.var: thread}))
            return body if s.extent == self.block[s.kind] else IfThenElse(thread < s.extent, body)
        if isinstance(s, For):
            kind = s.kind if s.kind in ("serial", "unroll") else "serial"
            return For(s.var, s.extent, kind, self.one_thread(s.body), s.unroll_max_step)
        if isinstance(s, Seq):
            return seq([self.one_thread(c) for c in s.stmts])
        if isinstance(s, IfThenElse):
            return IfThenElse(s.cond, self.one_thread(s.then))
        if isinstance(s, Allocate):
            local = _as_local(s.buffer)
            return Allocate(local, self.one_thread(rebuffer(s.body, {s.buffer: local})))
        return s


def _zero(buffer: Buffer) -> Stmt:
    """Every element of ``buffer`` set to zero."""
    indices = tuple(Var(f"tc_zeroed{n}") for n in range(buffer.ndim))
    body: Stmt = Store(buffer, indices, const(0, buffer.dtype))
    for index, extent in reversed(list(zip(indices, buffer.shape))):
        body = For(index, extent, "serial", body)
    return body


def _has_barrier(s: Stmt) -> bool:
    return any(isinstance(n, (Barrier, ThreadAllReduce)) for n in walk_stmts(s))


def _as_local(buffer: Buffer) -> Buffer:
    return buffer if buffer.scope == "local" else buffer.in_scope("local")


def _expand(s: Stmt, old: Buffer, new: Buffer, thread: Expr) -> Stmt:
    """``s`` using thread ``thread``'s row of ``new`` wherever it used ``old``."""
    return rebuffer(s, {old: new}, lambda buffer, indices: (thread,) + indices)
