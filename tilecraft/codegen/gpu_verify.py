"""The GPU verifier: a lowered kernel checked against its target's limits before any build.

As MetaSchedule's ``VerifyGPUCode``: a candidate that would fail to launch (too many
threads, too much shared memory) or that the backend cannot emit (a block loop inside a
thread loop, an over-wide vector) never costs a compilation or a launch. Each error names
the limit, the value and the loop or buffer that exceeds it.

Beyond MetaSchedule, the buffers a thread keeps (its accumulator) must fit in three quarters
of the registers the kernel is compiled with (``codegen/cuda.py`` asks for 128 a thread
where a block has at most 256 threads), the rest holding operands and addresses: a larger
tile spills to local memory, runs slowly and, unrolled, compiles for minutes
(docs/experiments/gpu-register-budget.md).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GpuLimitError
from ..ir.kernels import split_kernels
from ..ir.nodes import (Allocate, AsyncCopies, Barrier, For, IfThenElse, LoweredFunc, Seq, Stmt, Store, ThreadAllReduce,
                        WarpMatrix, walk_stmts)
from ..te.dtype import bytes_of
from .cuda import GPU_AXES, Launch, bound_loops, launch_of, registers_a_thread, shared_offsets, vector_bytes

MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
LOCAL_REGISTER_SHARE = 0.75  # of a thread's registers, for its buffers; the rest hold operands and addresses


def verify_gpu(func: LoweredFunc, target) -> tuple[Launch, ...]:
    """The launch of each of ``func``'s kernels (a nest at its root each, ``ir/kernels.py``)
    if every one fits ``target`` (a ``CudaTarget``).

    Raises:
        GpuLimitError: Naming the first limit exceeded.
    """
    kernels, _ = split_kernels(func)
    launches = []
    for n, kernel in enumerate(kernels):
        try:
            launches.append(_verify_kernel(kernel, target))
        except GpuLimitError as error:
            if len(kernels) == 1:
                raise
            raise GpuLimitError(f"kernel {n} of {len(kernels)} (a nest at the root each): {error}") from None
    return tuple(launches)


def _verify_kernel(func: LoweredFunc, target) -> Launch:
    loops = bound_loops(func.body)
    scalars = all(math.prod(b.shape) == 1 for b, written in zip(func.args, func.outputs) if written)
    if not any(loop.kind.startswith(("blockIdx", "threadIdx")) for loop in loops) and not scalars:
        written = ", ".join(sorted({store.buffer.name for store in walk_stmts(func.body) if isinstance(store, Store)}))
        raise GpuLimitError(f"no loop of the nest writing {written} is bound to blockIdx or threadIdx, so it would "
                            "run on one GPU thread: bind its outer loops (sch.bind(loop, 'blockIdx.x'), ...)")
    launch = launch_of(func)
    for axis, size, limit in zip("xyz", launch.block, MAX_BLOCK):
        if size > limit:
            raise GpuLimitError(f"threadIdx.{axis} has {size} threads, above the limit of {limit}: "
                                f"{_loops_on(loops, 'threadIdx.' + axis)}")
    for axis, size, limit in zip("xyz", launch.grid, MAX_GRID):
        if size > limit:
            raise GpuLimitError(f"blockIdx.{axis} has {size} blocks, above the limit of {limit}")
    if launch.threads > target.max_threads_per_block:
        raise GpuLimitError(f"a block of {' x '.join(map(str, launch.block))} = {launch.threads} threads exceeds the "
                            f"target's {target.max_threads_per_block} threads per block: "
                            f"{_loops_on(loops, 'threadIdx')}; split them smaller")
    if launch.block[0] != 32 and any(isinstance(n, WarpMatrix) for n in walk_stmts(func.body)):
        raise GpuLimitError(f"the kernel computes on tensor cores, so its blocks must be one warp (32 threads) wide "
                            f"along threadIdx.x, their warps along threadIdx.y; threadIdx.x has {launch.block[0]}: "
                            f"{_loops_on(loops, 'threadIdx.x')}; bind 32 threads of the other blocks to it")
    for loop in loops:
        if loop.kind.startswith("vthread") and loop.extent > target.max_vthread:
            raise GpuLimitError(f"loop {loop.var.name} bound to {loop.kind} has extent {loop.extent}, above the "
                                f"limit of {target.max_vthread} virtual threads")
    shared = _shared_buffers(func.body)
    used = shared_offsets(func.body)[None]  # as the code generator lays the tiles out, 32-byte aligned
    if used > target.max_shared_memory_per_block_optin:  # past 48 KB, dynamic shared memory the kernel opts in to
        listed = ", ".join(f"{b.name}{list(b.shape)}" for b in shared)
        raise GpuLimitError(f"the block uses {used} bytes of shared memory ({listed}), above the target's "
                            f"{target.max_shared_memory_per_block_optin} bytes per block: make the tiles cached in "
                            "shared memory smaller")
    local = _local_buffers(func.body)
    registers = int(registers_a_thread(launch.threads, target.registers_per_block, target.max_registers_per_thread))
    words, budget = local_words(local), int(register_budget(registers))
    if words > budget:
        listed = ", ".join(f"{b.name}{list(b.shape)}" for b in local)
        raise GpuLimitError(f"each thread keeps {words} 4-byte words in local buffers ({listed}), above {budget}, "
                            f"{LOCAL_REGISTER_SHARE:.0%} of the {registers} registers a thread of a "
                            f"{launch.threads}-thread block may have: they would spill to local memory; make the "
                            "register tile smaller (the tile levels inside threadIdx)")
    for loop in loops:  # a thread past the loop's end would skip a barrier the others wait at (a hang on a GPU)
        axis = "xyz".index(loop.kind[-1]) if loop.kind.startswith("threadIdx") else None
        if axis is not None and loop.extent < launch.block[axis] and any(
                isinstance(n, (Barrier, ThreadAllReduce)) for n in walk_stmts(loop.body)):
            raise GpuLimitError(f"loop {loop.var.name} bound to {loop.kind} runs {loop.extent} of the block's "
                                f"{launch.block[axis]} threads on that axis, and a barrier lies inside it, which the "
                                "others would never reach: bind as many threads to it as to the block's other loops")
    _check_nest(func.body, (), target)
    return launch


def register_budget(registers):
    """The 4-byte words a thread's local buffers may take where it has ``registers`` (an
    int, or a NumPy array of them)."""
    return np.floor(LOCAL_REGISTER_SHARE * registers)


def local_words(buffers) -> int:
    """The 4-byte registers ``buffers`` (a thread's own) take, each rounded up to whole words; a
    tensor-core fragment takes ``fragment_registers`` a lane for each 16x16 tile."""
    return sum(b.elements // 256 * fragment_registers(b.dtype) if b.scope == "fragment"
               else -(-b.elements * bytes_of(b.dtype) // 4) for b in buffers)


def fragment_registers(dtype: str) -> int:
    """A lane's 4-byte registers for a 16x16 tile of a tensor-core fragment: 8 (float32's
    accumulator; float16's operands, which wmma holds twice over), bfloat16's 4 (two a register)."""
    return 4 if dtype == "bfloat16" else 8


def _loops_on(loops: list[For], prefix: str) -> str:
    return "loops " + ", ".join(f"{l.var.name} ({l.kind}, extent {l.extent})" for l in loops
                                if l.kind.startswith(prefix))


def _shared_buffers(s: Stmt) -> list:
    return _buffers_in(s, "shared")


def _local_buffers(s: Stmt) -> list:
    return _buffers_in(s, "local") + _buffers_in(s, "fragment")


def _buffers_in(s: Stmt, scope: str) -> list:
    allocated = (n.buffer for n in walk_stmts(s) if isinstance(n, Allocate))
    return list(dict.fromkeys(b for b in allocated if b.scope == scope))


def _check_nest(s: Stmt, outer: tuple[For, ...], target) -> None:
    """Block loops outermost; vector widths within the target's."""
    if isinstance(s, For):
        if s.kind.startswith("blockIdx"):
            inner = next((l for l in outer if not l.kind.startswith("blockIdx")), None)
            if inner is not None:
                raise GpuLimitError(f"loop {s.var.name} bound to {s.kind} lies inside loop {inner.var.name} "
                                    f"({inner.kind}): loops bound to blockIdx must be the outermost")
        if s.kind == "vectorize" and vector_bytes(s) > target.max_vector_bytes:
            raise GpuLimitError(f"vectorized loop {s.var.name} moves {vector_bytes(s)} bytes at once, above the "
                                f"target's {target.max_vector_bytes}: split it to at most "
                                f"{target.max_vector_bytes} bytes")
        if s.kind not in ("serial", "unroll", "vectorize") and not s.kind.startswith(GPU_AXES):
            raise GpuLimitError(f"loop {s.var.name} is {s.kind}, a CPU annotation: on a GPU bind it to blockIdx or "
                                "threadIdx instead")
        _check_nest(s.body, outer + (s,), target)
    elif isinstance(s, Seq):
        for child in s.stmts:
            _check_nest(child, outer, target)
    elif isinstance(s, IfThenElse):
        _check_nest(s.then, outer, target)
    elif isinstance(s, (Allocate, AsyncCopies)):
        _check_nest(s.body, outer, target)
