"""CUDA C code generation: a GPU loop nest becomes one ``__global__`` kernel and its launch.

The loop-nest IR is the CPU's with a few more words (``docs/architecture.md``): loops
bound to ``blockIdx``/``threadIdx`` are not loops in the kernel but the indices of the
block and thread running it (guarded where a loop covers fewer than the launch does);
virtual threads are unrolled loops inside one thread; buffers in ``shared`` scope are the
block's shared memory, ``local`` ones per-thread arrays that nvcc keeps in registers once
the loops over them unroll; barriers are ``__syncthreads()``. Expressions are the C
backend's, so a kernel computes what its CPU twin computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import LoweringError
from ..ir.nodes import Allocate, Barrier, For, IfThenElse, LoweredFunc, Seq, Stmt, Store
from ..te.arith import simplify, to_linear
from ..te.dtype import C_TYPES, bytes_of
from ..te.expr import TensorRead, const, substitute
from .c import _Emitter, _nest_size, _stride
from .writer import CodeWriter

_PRELUDE = """\
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ int64_t tc_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return q - ((a % b != 0) && ((a < 0) != (b < 0))); }
__device__ __forceinline__ int64_t tc_floormod(int64_t a, int64_t b) { int64_t r = a % b; return r + ((r != 0) && ((r < 0) != (b < 0))) * b; }
#define TC_MINMAX(T, S) \\
  __device__ __forceinline__ T tc_max_##S(T a, T b) { return a > b ? a : b; } \\
  __device__ __forceinline__ T tc_min_##S(T a, T b) { return a < b ? a : b; }
TC_MINMAX(float, f32) TC_MINMAX(double, f64) TC_MINMAX(int32_t, i32) TC_MINMAX(int64_t, i64)
TC_MINMAX(int8_t, i8) TC_MINMAX(uint8_t, u8) TC_MINMAX(bool, b)
"""

GPU_AXES = ("blockIdx", "threadIdx", "vthread")
# nvcc may give a thread up to 255 registers; asking it for at most 128 (through the minimum
# number of blocks an SM must hold) let two 256-thread blocks of the example matmul share an
# SM and ran it 1.35x faster on an H100 (docs/experiments/cuda-register-cap.md)
REGISTERS_PER_THREAD = 128
_VECTOR_TYPES = {("float32", 2): "float2", ("float32", 4): "float4", ("int32", 2): "int2", ("int32", 4): "int4",
                 ("float64", 2): "double2"}


@dataclass(frozen=True)
class Launch:
    """The grid and block a kernel runs on (x, y, z), read off its bound loops."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads(self) -> int:
        return math.prod(self.block)


def launch_of(func: LoweredFunc) -> Launch:
    """Each axis's size: the largest extent of a loop bound to it (1 where none is)."""
    sizes: dict[str, int] = {}
    for loop in bound_loops(func.body):
        sizes[loop.kind] = max(sizes.get(loop.kind, 1), loop.extent)
    grid = tuple(sizes.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(sizes.get(f"threadIdx.{a}", 1) for a in "xyz")
    return Launch(grid, block)  # type: ignore[arg-type]


def bound_loops(s: Stmt) -> list[For]:
    """Every loop bound to a GPU axis, outermost first."""
    found: list[For] = []
    stack = [s]
    while stack:
        node = stack.pop()
        if isinstance(node, For):
            if node.kind.startswith(GPU_AXES):
                found.append(node)
            stack.append(node.body)
        elif isinstance(node, Seq):
            stack.extend(reversed(node.stmts))
        elif isinstance(node, IfThenElse):
            stack.append(node.then)
        elif isinstance(node, Allocate):
            stack.append(node.body)
    return found


class _CudaEmitter(_Emitter):
    def __init__(self, func: LoweredFunc, target):
        super().__init__(func, target)
        self.launch = launch_of(func)
        self.partial_threads: list[For] = []  # thread loops narrower than the block, guarding what is inside

    def stmt(self, s: Stmt, unroll_budget: int = 0) -> None:
        if isinstance(s, Barrier):
            if self.partial_threads:
                loop = self.partial_threads[-1]
                raise LoweringError(
                    f"a barrier lies inside loop {loop.var.name} bound to {loop.kind} with extent {loop.extent}, "
                    f"fewer than the block's {self._axis_size(loop.kind)} threads on that axis: the other threads "
                    "would never reach it; bind loops of one extent to each thread axis around shared-memory stages")
            self.out.line("__syncthreads();")
            return
        super().stmt(s, unroll_budget)

    def allocate(self, s: Allocate, unroll_budget: int) -> None:
        b = s.buffer
        size = math.prod(b.shape)
        name = self.buffer_name(b)
        if b.scope == "shared":
            self.out.line(f"__shared__ __align__(16) {C_TYPES[b.dtype]} {name}[{size}];")
        elif b.scope == "local":
            self.out.line(f"{C_TYPES[b.dtype]} {name}[{size}];")
        else:
            raise LoweringError(
                f"buffer {b.name} ({list(b.shape)}) would be a whole intermediate tensor in global memory, which a "
                "CUDA kernel cannot allocate: inline its block (compute_inline), compute it at a loop of its "
                "consumer (compute_at), or cache it in shared or local memory")
        self.stmt(s.body, unroll_budget)

    def _axis_size(self, kind: str) -> int:
        axis = "xyz".index(kind[-1])
        return self.launch.grid[axis] if kind.startswith("blockIdx") else self.launch.block[axis]

    def loop(self, s: For, unroll_budget: int) -> None:
        self.ranges[s.var] = s.extent
        var = self.name(s.var, s.var.name)
        budget = max(unroll_budget, s.unroll_max_step)
        if s.kind.startswith(("blockIdx", "threadIdx")):
            self.out.line(f"const int32_t {var} = {s.kind};")
            if s.extent < self._axis_size(s.kind):
                with self.out.block(f"if ({var} < {s.extent})"):
                    self.partial_threads.append(s)
                    self.stmt(s.body, budget)
                    self.partial_threads.pop()
            else:
                self.stmt(s.body, budget)
            return
        if s.kind == "parallel":
            raise LoweringError(f"loop {s.var.name} is parallel, a CPU annotation: on a GPU bind it to blockIdx or "
                                "threadIdx instead")
        if s.kind == "vectorize" and self.vector_access(s):
            return
        if s.kind in ("unroll", "vectorize") or s.kind.startswith("vthread") or (budget and _nest_size(s) <= budget):
            self.out.line("#pragma unroll")
        with self.out.block(f"for (int32_t {var} = 0; {var} < {s.extent}; ++{var})"):
            self.stmt(s.body, budget)

    def vector_access(self, s: For) -> bool:
        """A vectorized copy of 2 or 4 contiguous, aligned elements as one wide load and store."""
        body = s.body
        if not (isinstance(body, Store) and isinstance(body.value, TensorRead)):
            return False
        vtype = _VECTOR_TYPES.get((body.buffer.dtype, s.extent))
        source = body.value
        if vtype is None or source.tensor.dtype != body.buffer.dtype:
            return False
        store_index = self.flat_index(body.buffer, body.indices)
        load_index = self.flat_index(source.tensor, source.indices)
        if body.buffer.scope == "local" or not all(
                _stride(i, s.var, self.ranges) == 1 and self._aligned(i, s.var, s.extent)
                for i in (store_index, load_index)):
            return False
        def at(index, lane: int) -> str:
            return self.expr(simplify(substitute(index, {s.var: const(lane)}), self.ranges))

        dst = f"{self.buffer_name(body.buffer)}[{at(store_index, 0)}]"
        src = self.buffer_name(source.tensor)
        if source.tensor.scope == "local":  # registers have no address: gather the lanes
            value = f"make_{vtype}({', '.join(f'{src}[{at(load_index, n)}]' for n in range(s.extent))})"
        else:
            value = f"*(const {vtype}*)&{src}[{at(load_index, 0)}]"
        self.out.line(f"*({vtype}*)&{dst} = {value};")
        return True

    def _aligned(self, index, var, lanes: int) -> bool:
        """Whether ``index`` at ``var = 0`` is provably a multiple of ``lanes``."""
        linear = to_linear(index, self.ranges)
        return linear.const % lanes == 0 and all(
            atom is var or coeff % lanes == 0 for atom, coeff in linear.terms.items())

    def function(self) -> str:
        f = self.func
        if f.packs:
            raise LoweringError("transform_layout packs a weight on the host before the kernel runs; the CUDA "
                                "backend does not pack yet: leave the layout as it is")
        params = []
        for buffer, written in zip(f.args, f.outputs):
            if buffer.dtype == "float16":
                raise LoweringError(f"argument {buffer.name} is float16, which the CUDA backend does not compute "
                                    "in yet; use float32")
            const_qual = "" if written else "const "
            params.append(f"{const_qual}{C_TYPES[buffer.dtype]}* __restrict__ {self.buffer_name(buffer)}")
        body = CodeWriter()
        self.out = body
        threads = self.launch.threads
        min_blocks = self.target.registers_per_block // (threads * REGISTERS_PER_THREAD)
        bounds = f"{threads}, {min_blocks}" if min_blocks > 1 else f"{threads}"
        head = f'extern "C" __global__ void __launch_bounds__({bounds}) {f.name}'
        with self.out.block(f"{head}({', '.join(params)})"):
            self.stmt(f.body)
        return _PRELUDE + "\n" + body.text()


def generate_cuda(func: LoweredFunc, target) -> tuple[str, Launch]:
    """The CUDA C source of a lowered GPU function, and the grid and block to launch it on."""
    emitter = _CudaEmitter(func, target)
    return emitter.function(), emitter.launch


def vector_bytes(loop: For) -> int:
    """Bytes a vectorized loop moves at once (its extent times its store's element size)."""
    body = loop.body.then if isinstance(loop.body, IfThenElse) else loop.body
    return loop.extent * bytes_of(body.buffer.dtype) if isinstance(body, Store) else 0
