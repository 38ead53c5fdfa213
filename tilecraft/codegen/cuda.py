"""CUDA C code generation: a GPU loop nest becomes one ``__global__`` kernel and its launch.

The loop-nest IR is the CPU's with a few more words (``docs/architecture.md``): loops
bound to ``blockIdx``/``threadIdx`` are not loops in the kernel but the indices of the
block and thread running it (guarded where a loop covers fewer than the launch does; a
store to global memory outside the loops bound to an axis of the block, which every thread
would make alike, is the first thread's alone); virtual threads are unrolled loops inside
one thread; buffers in ``shared`` scope are the block's shared memory (static arrays, or
past 48 KB slices of the dynamic shared memory that the launch asks for), ``local`` ones
per-thread arrays that nvcc keeps in registers once the loops over them unroll; barriers are
``__syncthreads()``. Expressions are the C backend's, so a kernel computes what its CPU twin
computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import LoweringError
from ..ir.kernels import split_kernels
from ..ir.nodes import (Allocate, AsyncCopies, AsyncWait, AtomicAdd, Barrier, Buffer, For, IfThenElse, LoweredFunc,
                        MatrixTile, Stmt, Store, ThreadAllReduce, WarpMatrix, walk_stmts)
from ..te.arith import simplify, to_linear
from ..te.dtype import C_TYPES, HALVES, bytes_of
from ..te.expr import Const, Select, TensorRead, Var, binary, const, free_vars, substitute, walk
from .c import _PRELUDE as C_PRELUDE
from .c import _SUFFIX, _Emitter, _nest_size, _stride
from .writer import CodeWriter

# NVRTC has no C library headers: the few names of them that kernels use, where nvcc includes them
_INCLUDES, _HELPERS = C_PRELUDE.split("\n\n", 1)
_RTC_NAMES = """\
#ifdef __CUDACC_RTC__
typedef signed char int8_t; typedef unsigned char uint8_t; typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t; typedef long long int64_t; typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#else
"""
# The C backend's helpers, as device functions; float16 held as its bits and computed in float32
_HALF = """
__device__ __forceinline__ float tc_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tc_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
"""
# cp.async of BYTES (4, 8 or 16) into shared memory, through L1 (ca) or L2 alone (cg); of READ
# bytes (BYTES, or 0: zeros); a commit of the copies issued, and a wait until at most PENDING groups fly
_COPY_ASYNC = """
#define TC_CP_ASYNC(LEVEL, BYTES, dst, src) asm volatile(                                                    \\
  "cp.async." #LEVEL ".shared.global [%0], [%1], " #BYTES ";\\n"                                              \\
  :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src) : "memory")
#define TC_CP_ASYNC_ZFILL(LEVEL, BYTES, dst, src, read) asm volatile(                                        \\
  "cp.async." #LEVEL ".shared.global [%0], [%1], " #BYTES ", %2;\\n"                                          \\
  :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(read) : "memory")
#define TC_CP_ASYNC_WAIT(PENDING) asm volatile("cp.async.commit_group;\\n" ::: "memory");                 \\
  asm volatile("cp.async.wait_group " #PENDING ";\\n" ::: "memory")
"""
# a block's shared memory past 48 KB, asked for at launch, its tiles slices of it
_DYNAMIC_SHARED = "#define TC_DYNAMIC_SHARED extern __shared__ __align__(32) unsigned char tc_shared[]\n"
DEVICE_HELPERS = _HELPERS  # the C backend's helpers, which runtime/cuda_on_cpu.h's kernels take as they are
_PRELUDE = (f"{_RTC_NAMES}{_INCLUDES}\n#endif\n\n" + _HELPERS.replace("static inline", "__device__ __forceinline__")
            + _HALF + _COPY_ASYNC + _DYNAMIC_SHARED)
_WMMA = (Path(__file__).parent / "wmma.cuh").read_text()  # a warp's tensor-core operations, in PTX

GPU_AXES = ("blockIdx", "threadIdx", "vthread")
# nvcc may give a thread up to 255 registers; asking it for at most 128 (through the minimum
# number of blocks an SM must hold) let two 256-thread blocks of the example matmul share an
# SM and ran it 1.35x faster on an H100 (docs/experiments/cuda-register-cap.md)
REGISTERS_PER_THREAD = 128
_VECTOR_TYPES = {("float32", 2): "float2", ("float32", 4): "float4", ("int32", 2): "int2", ("int32", 4): "int4",
                 ("float64", 2): "double2"}
_BITS_TYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}  # a copy of narrower elements moves their bits
_OPERAND_KINDS = {"float16": "", "bfloat16": "bf16_"}  # the wmma.cuh functions of each type of A and B


STATIC_SHARED_BYTES = 48 << 10  # a block's static __shared__ arrays, on every architecture


@dataclass(frozen=True)
class Launch:
    """The grid and block a kernel runs on (x, y, z), read off its bound loops, and the
    dynamic shared memory a block asks for (0 where its tiles fit in static arrays)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0

    @property
    def threads(self) -> int:
        return math.prod(self.block)


def launch_of(func: LoweredFunc) -> Launch:
    """Each axis's size: the largest extent of a loop bound to it (1 where none is); the
    shared tiles' bytes where they outgrow static arrays."""
    sizes: dict[str, int] = {}
    for loop in bound_loops(func.body):
        sizes[loop.kind] = max(sizes.get(loop.kind, 1), loop.extent)
    grid = tuple(sizes.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(sizes.get(f"threadIdx.{a}", 1) for a in "xyz")
    shared = shared_offsets(func.body)[None]
    return Launch(grid, block, shared if shared > STATIC_SHARED_BYTES else 0)  # type: ignore[arg-type]


def shared_offsets(body: Stmt) -> dict:
    """Where each shared buffer (by ``id``) starts in one block of shared memory, 32-byte
    aligned (where a tensor core loads a tile from), in the order allocated; under ``None``,
    the bytes of them all."""
    offsets, end = {}, 0
    for node in walk_stmts(body):
        if isinstance(node, Allocate) and node.buffer.scope == "shared" and id(node.buffer) not in offsets:
            offsets[id(node.buffer)] = end
            end += -(-node.buffer.elements * bytes_of(node.buffer.dtype) // 32) * 32
    return {**offsets, None: end}


def bound_loops(s: Stmt) -> list[For]:
    """Every loop bound to a GPU axis, outermost first."""
    return [n for n in walk_stmts(s) if isinstance(n, For) and n.kind.startswith(GPU_AXES)]


class _CudaEmitter(_Emitter):
    WIDENED = {"float16": "tc_h2f({})", "bfloat16": "tc_bf2f({})"}  # held as their bits (_ctype)
    ROUNDED = {"float16": "tc_f2h({})", "bfloat16": "tc_f2bf({})"}

    def __init__(self, func: LoweredFunc, target):
        super().__init__(func, target)
        self.launch = launch_of(func)
        self.shared_offsets = shared_offsets(func.body)
        self.partial_threads: list[For] = []  # thread loops narrower than the block, guarding what is inside
        self.bound_threads: list[str] = []  # the thread axes the loops around the statement emitted bind
        self.first_alone = False  # inside a guard that leaves the first thread of the block alone
        self.uses_wmma = False
        # which operand of the mma each fragment of A or B is, and the layout its loads read: the source's,
        # or the other where the mma reads the fragment transposed (a tile of B, (k, j), held as (j, k))
        warp_ops = [n for n in walk_stmts(func.body) if isinstance(n, WarpMatrix)]
        self.operand_fragments = {id(t.buffer): m for n in warp_ops if n.op == "mma" for m, t in zip("ab", n.tiles[1:])}
        transposed = {id(t.buffer) for n in warp_ops if n.op == "mma" for t in n.tiles[1:]
                      if t.buffer.scope == "fragment" and t.row_dim > t.col_dim}
        self.fragment_layouts = {id(n.tiles[0].buffer): _layout(n.tiles[1], id(n.tiles[0].buffer) in transposed)
                                 for n in warp_ops if n.op == "load"}
        self.copying_async = False  # inside AsyncCopies, on a GPU with cp.async

    def stmt(self, s: Stmt, unroll_budget: int = 0) -> None:
        if isinstance(s, Barrier):
            self._check_uniform("a barrier")
            self.out.line("__syncthreads();")
            return
        if isinstance(s, ThreadAllReduce):
            self.all_reduce(s)
            return
        if isinstance(s, WarpMatrix):
            self.warp_matrix(s)
            return
        if isinstance(s, Store) and (first := self._first_thread_alone(s)):
            self._alone(first, lambda: self.stmt(s, unroll_budget))
            return
        if isinstance(s, AtomicAdd):
            target = f"{self.buffer_name(s.buffer)}[{self.expr(self.flat_index(s.buffer, s.indices))}]"
            self.out.line(f"atomicAdd(&{target}, {self.expr(s.value)});")
            return
        if isinstance(s, AsyncCopies):
            self.copying_async, outer = self.target.compute_capability >= (8, 0), self.copying_async
            self.stmt(s.body, unroll_budget)
            self.copying_async = outer
            return
        if isinstance(s, AsyncWait):
            if self.target.compute_capability >= (8, 0):
                self.out.line(f"TC_CP_ASYNC_WAIT({s.pending});")
            return
        if isinstance(s, Store) and self.copying_async and isinstance(s.value, TensorRead) \
                and self._copies_global(s.buffer, s.value, 1):
            self._copy_async(s.buffer, self.flat_index(s.buffer, s.indices), s.value, self.flat_index(
                s.value.tensor, s.value.indices), 1)
            return
        super().stmt(s, unroll_budget)

    def _first_thread_alone(self, s: Store) -> str | None:
        """The condition that only the first thread stores ``s``, where the block's threads would
        all store the same element of global memory (a row's reduced sum, written after the
        threads reduced it together, outside the loops bound to them): one store, as TVM writes
        an all-reduce's result, and no race. None where each thread stores its own."""
        if s.buffer.scope not in ("arg", "global") or self.first_alone:
            return None
        axes = [f"threadIdx.{axis}" for axis, extent in zip("xyz", self.launch.block) if extent > 1]
        return " && ".join(f"{axis} == 0" for axis in axes if axis not in self.bound_threads) or None

    def _alone(self, condition: str, emit) -> None:
        """``emit()`` under ``if (condition)``, the first thread of the block alone."""
        with self.out.block(f"if ({condition})"):
            self.first_alone = True
            emit()
            self.first_alone = False

    def _copies_global(self, buffer: Buffer, source: TensorRead, lanes: int) -> bool:
        """Whether ``source`` is global memory copied into ``buffer`` in shared memory as it is,
        ``lanes`` elements (4, 8 or 16 bytes: what ``cp.async`` moves)."""
        return (buffer.scope == "shared" and source.tensor.scope == "arg" and source.tensor.dtype == buffer.dtype
                and bytes_of(buffer.dtype) * lanes in (4, 8, 16))

    def _copy_async(self, buffer, index, source: TensorRead, source_index, lanes: int, guard=None) -> None:
        """One ``cp.async`` of ``lanes`` elements from ``source`` into ``buffer`` (through L2 alone
        for 16 bytes, as cuBLAS's tiles go); where ``guard`` is false, zeros (it reads no byte)."""
        nbytes = bytes_of(buffer.dtype) * lanes
        dst = f"&{self.buffer_name(buffer)}[{self.expr(index)}]"
        src = f"&{self.buffer_name(source.tensor)}[{self.expr(source_index)}]"
        level = "cg" if nbytes == 16 else "ca"
        if guard is None:
            self.out.line(f"TC_CP_ASYNC({level}, {nbytes}, {dst}, {src});")
        else:
            self.out.line(f"TC_CP_ASYNC_ZFILL({level}, {nbytes}, {dst}, {src}, ({self.expr(guard)}) ? {nbytes} : 0);")

    def all_reduce(self, s: ThreadAllReduce) -> None:
        """Warp shuffles within a warp's share of a row; across warps (a row of 64 to 1024
        threads), through one shared slot a warp; other row lengths through a slot a thread."""
        self._check_uniform("the cross-thread reduction into " + s.buffer.name)
        ctype = _ctype(s.buffer.dtype)
        suffix = _SUFFIX[s.buffer.dtype]
        combine = {"sum": "({a} + {b})", "max": f"tc_max_{suffix}({{a}}, {{b}})",
                   "min": f"tc_min_{suffix}({{a}}, {{b}})"}[s.combiner]
        width, rows = self.launch.block[0], self.launch.block[1] * self.launch.block[2]
        power_of_two = width & (width - 1) == 0
        red, buf = self.name(object(), "tc_red"), self.name(object(), "tc_red_buf")
        target = f"{self.buffer_name(s.buffer)}[{self.expr(self.flat_index(s.buffer, s.indices))}]"
        with self.out.block(""):
            self.out.line(f"{ctype} {red} = {self.expr(s.value)};")
            row = "(threadIdx.y + blockDim.y * threadIdx.z)"
            if power_of_two:
                mask = self.lane_mask()
                for offset in _halvings(min(width, 32)):
                    shuffled = f"__shfl_xor_sync({mask}, {red}, {offset}, {min(width, 32)})"
                    self.out.line(f"{red} = {combine.format(a=red, b=shuffled)};")
            if power_of_two and width <= 32:
                self.out.line(f"{target} = {red};")
                return
            slots, per_row = (width * rows // 32, width // 32) if power_of_two else (width * rows, width)
            self.out.line(f"__shared__ {ctype} {buf}[{slots}];")
            if power_of_two:
                self.out.line(f"if (threadIdx.x % 32 == 0) {buf}[(threadIdx.x + {width} * {row}) / 32] = {red};")
            else:
                self.out.line(f"{buf}[threadIdx.x + {width} * {row}] = {red};")
            self.out.line("__syncthreads();")
            first = f"{per_row} * {row}"
            self.out.line(f"{red} = {buf}[{first}];")
            with self.out.block(f"for (int32_t tc_w = 1; tc_w < {per_row}; ++tc_w)"):
                self.out.line(f"{red} = {combine.format(a=red, b=f'{buf}[{first} + tc_w]')};")
            self.out.line("__syncthreads();")
            self.out.line(f"{target} = {red};")

    def warp_matrix(self, s: WarpMatrix) -> None:
        """A tensor-core operation: a fragment's tile named by its number among the fragment's
        16x16 tiles; A, B and the destination by the address of their corner, row or column major."""
        self._check_uniform("a tensor-core operation")
        self.uses_wmma = True
        if s.op == "fill":
            self.out.line(f"for (int tc_e = 0; tc_e < 8; ++tc_e) {self._fragment_tile(s.tiles[0])}[tc_e] = 0.0f;")
        elif s.op == "store":
            address, ldm = self._tile_address(s.tiles[0])  # a generic address, shared memory's too
            kind = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[s.tiles[0].buffer.dtype]
            self.out.line(f"tc_wmma_store_{kind}_{_layout(s.tiles[0])}({address}, {self._fragment_tile(s.tiles[1])}, "
                          f"{ldm});")
        elif s.op == "load":
            address, ldm = self._tile_address(s.tiles[1])
            fragment = id(s.tiles[0].buffer)
            load = _load(self.operand_fragments[fragment], s.tiles[1], self.fragment_layouts[fragment])
            self.out.line(f"{load}({self._fragment_tile(s.tiles[0])}, {address}, {ldm});")
        else:
            with self.out.block(""):
                operands = []
                for matrix, tile in zip("ab", s.tiles[1:]):
                    if tile.buffer.scope == "fragment":
                        operands.append((self._fragment_tile(tile), self.fragment_layouts[id(tile.buffer)]))
                        continue
                    address, ldm = self._tile_address(tile)
                    self.out.line(f"unsigned tc_{matrix}[8]; {_load(matrix, tile)}(tc_{matrix}, {address}, {ldm});")
                    operands.append((f"tc_{matrix}", _layout(tile)))
                (a, a_layout), (b, b_layout) = operands
                kind = _OPERAND_KINDS[s.tiles[1].buffer.dtype]
                self.out.line(f"tc_wmma_mma_{kind}{a_layout}_{b_layout}({self._fragment_tile(s.tiles[0])}, {a}, {b});")

    def _fragment_tile(self, tile: MatrixTile) -> str:
        """The registers of one 16x16 tile of a fragment: ``name[number]``, 8 a lane."""
        shape, corner = tile.buffer.shape, tile.indices
        tiles = Buffer("tiles", (*shape[:-2], shape[-2] // 16, shape[-1] // 16), "int32", "local")
        number = self.flat_index(tiles, (*corner[:-2], *(binary("floordiv", i, const(16)) for i in corner[-2:])))
        return f"{self.buffer_name(tile.buffer)}[{self.expr(simplify(number, self.ranges))}]"

    def _tile_address(self, tile: MatrixTile) -> tuple[str, int]:
        """Where a tile starts, and the elements between its rows (row major) or its columns."""
        lead = tile.row_dim if _layout(tile) == "row" else tile.col_dim
        index = simplify(self.flat_index(tile.buffer, tile.indices), self.ranges)
        return f"&{self.buffer_name(tile.buffer)}[{self.expr(index)}]", tile.buffer.strides[lead]

    def lane_mask(self) -> str:
        """The lanes of this thread's warp that exist: all 32, but in the last warp of a block
        whose size is no multiple of 32 (a shuffle must name exactly the lanes taking part)."""
        threads = self.launch.threads
        if threads % 32 == 0:
            return "0xffffffffu"
        tid = "(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
        return f"({tid} / 32 == {threads // 32} ? {hex((1 << threads % 32) - 1)}u : 0xffffffffu)"

    def _check_uniform(self, what: str) -> None:
        """Barriers and shuffles must be reached by every thread of the block."""
        if self.partial_threads:
            loop = self.partial_threads[-1]
            raise LoweringError(
                f"{what} lies inside loop {loop.var.name} bound to {loop.kind} with extent {loop.extent}, fewer "
                f"than the block's {self._axis_size(loop.kind)} threads on that axis: the other threads would never "
                "reach it; bind loops of one extent to each thread axis around it")

    def allocate(self, s: Allocate, unroll_budget: int) -> None:
        b = s.buffer
        size = b.elements
        name = self.buffer_name(b)
        if b.scope == "shared" and self.launch.shared_bytes:  # a slice of the block's dynamic shared memory
            ctype = _ctype(b.dtype)
            self.out.line(f"{ctype}* __restrict__ {name} = ({ctype}*)(tc_shared + {self.shared_offsets[id(b)]});")
        elif b.scope == "shared":
            self.out.line(f"__shared__ __align__(32) {_ctype(b.dtype)} {name}[{size}];")
        elif b.scope == "local":
            self.out.line(f"{_ctype(b.dtype)} {name}[{size}];")
        elif b.scope == "fragment":  # 8 floats (an accumulator) or pairs of halves (A's or B's) a lane, a tile
            self.out.line(f"{'float' if b.dtype == 'float32' else 'unsigned'} {name}[{size // 256}][8];")
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
            self.bound_threads.append(s.kind)
            if s.extent < self._axis_size(s.kind):
                with self.out.block(f"if ({var} < {s.extent})"):
                    self.partial_threads.append(s)
                    self.stmt(s.body, budget)
                    self.partial_threads.pop()
            else:
                self.stmt(s.body, budget)
            self.bound_threads.pop()
            return
        if s.kind == "vectorize" and isinstance(s.body, Store) and (first := self._first_thread_alone(s.body)):
            self._alone(first, lambda: self.loop(s, unroll_budget))
            return
        if s.kind == "vectorize" and self.vector_access(s):
            return
        if s.kind in ("serial", "unroll") and self.wide_stores(s):
            return
        if s.kind in ("unroll", "vectorize") or s.kind.startswith("vthread") or (budget and _nest_size(s) <= budget) \
                or _picks_fragment_tiles(s):
            self.out.line("#pragma unroll")
        elif any(isinstance(n, Barrier) for n in walk_stmts(s.body)):  # over shared tiles' steps: rolled, as
            self.out.line("#pragma unroll 1")  # CUTLASS's main loop (nvcc unrolled pipelined tensor-core ones whole)
        with self.out.block(f"for (int32_t {var} = 0; {var} < {s.extent}; ++{var})"):
            self.stmt(s.body, budget)

    def vector_access(self, s: For) -> bool:
        """A vectorized copy of contiguous, aligned elements as one wide load and store: 2 or 4
        of 32 or 64 bits, or 4, 8 or 16 bytes of narrower ones (float16's 8 lanes, a ``uint4``);
        into a shared tile whose layout puts the lanes apart, one wide load and a store a lane. A
        copy of a padded window whose lanes are in or out of the padding together (a channel's
        vector of an NHWC pixel) copies or zeroes them all at once."""
        body = s.body
        if not isinstance(body, Store):
            return False
        source, guard = body.value, None
        if isinstance(source, Select) and isinstance(source.false_value, Const) and source.false_value.value == 0 \
                and isinstance(source.true_value, TensorRead) and s.var not in free_vars(source.cond):
            source, guard = source.true_value, source.cond
        if not isinstance(source, TensorRead):
            return False
        vtype = _VECTOR_TYPES.get((body.buffer.dtype, s.extent))
        if bytes_of(body.buffer.dtype) < 4 and source.tensor.scope != "local":
            vtype = _BITS_TYPES.get(bytes_of(body.buffer.dtype) * s.extent)
        if vtype is None or source.tensor.dtype != body.buffer.dtype:
            return False
        store_index = self.flat_index(body.buffer, body.indices)
        load_index = self.flat_index(source.tensor, source.indices)
        contiguous = [_stride(i, s.var, self.ranges) == 1 and self._aligned(i, s.var, s.extent)
                      for i in (store_index, load_index)]
        across = not contiguous[0]  # into a shared tile laid out across the lanes: a store a lane, unguarded
        by_lane = guard is None and body.buffer.scope == "shared" and (body.buffer.dtype, s.extent) in _VECTOR_TYPES
        if body.buffer.scope == "local" or not contiguous[1] or across and not by_lane:
            return False

        def at(index, lane: int) -> str:
            return self.expr(simplify(substitute(index, {s.var: const(lane)}), self.ranges))

        if across:  # one wide load, a store a lane
            with self.out.block(""):
                self.out.line(f"const {vtype} tc_v = *(const {vtype}*)&{self.buffer_name(source.tensor)}"
                              f"[{at(load_index, 0)}];")
                for lane, field in zip(range(s.extent), "xyzw"):
                    self.out.line(f"{self.buffer_name(body.buffer)}[{at(store_index, lane)}] = tc_v.{field};")
            return True

        if self.copying_async and self._copies_global(body.buffer, source, s.extent):
            self._copy_async(body.buffer, simplify(substitute(store_index, {s.var: const(0)}), self.ranges), source,
                             simplify(substitute(load_index, {s.var: const(0)}), self.ranges), s.extent, guard)
            return True
        dst = f"{self.buffer_name(body.buffer)}[{at(store_index, 0)}]"
        src = self.buffer_name(source.tensor)
        if source.tensor.scope == "local":  # registers have no address: gather the lanes
            if guard is not None:
                return False
            value = f"make_{vtype}({', '.join(f'{src}[{at(load_index, n)}]' for n in range(s.extent))})"
        else:
            value = f"*(const {vtype}*)&{src}[{at(load_index, 0)}]"
        if guard is None:
            self.out.line(f"*({vtype}*)&{dst} = {value};")
            return True
        with self.out.block(f"if ({self.expr(guard)})"):
            self.out.line(f"*({vtype}*)&{dst} = {value};")
        with self.out.block("else"):
            self.out.line(f"{vtype} tc_zero = {{}}; *({vtype}*)&{dst} = tc_zero;")
        return True

    def wide_stores(self, s: For) -> bool:
        """``s``, a loop that stores contiguous elements of global memory one an iteration (a
        thread's register tile copied out, an epilogue applied on the way), as stores of 4 (or
        2) lanes, each lane's value computed as before, where the elements are aligned to the
        vector. A float at a time, a warp's 32 lanes 16 bytes apart write each sector in four
        pieces by four instructions; as a float4, one instruction writes whole sectors. 16-bit
        floats go 8, 4 or 2 at a time, their bits packed in words. Split-K's atomic adds of
        float32 likewise from sm_90 on, which adds float2s and float4s atomically."""
        body, atomic = s.body, isinstance(s.body, AtomicAdd)
        if atomic and (body.buffer.dtype != "float32" or self.target.compute_capability < (9, 0)) \
                or not isinstance(body, (Store, AtomicAdd)) or body.buffer.scope not in ("arg", "global") \
                or not atomic and self._first_thread_alone(body):
            return False
        index = self.flat_index(body.buffer, body.indices)
        # the value's reads of the buffer it stores must each read the lane's own element: as a vector, a lane
        # would read another's before that lane's store
        own, stored = [], str(simplify(index, self.ranges))
        walk(body.value, lambda e: own.append(e) if isinstance(e, TensorRead) and e.tensor == body.buffer else None)
        if any(str(simplify(self.flat_index(e.tensor, e.indices), self.ranges)) != stored for e in own):
            return False
        dtype, half = body.buffer.dtype, body.buffer.dtype in HALVES and not atomic  # 16-bit: lanes packed in words
        lanes = next((n for n in ((8, 4, 2) if half else (4, 2)) if (half or (dtype, n) in _VECTOR_TYPES)
                      and s.extent % n == 0 and _stride(index, s.var, self.ranges) == 1
                      and self._aligned(index, s.var, n)), None)
        if lanes is None:
            return False
        vtype, step = _BITS_TYPES[2 * lanes] if half else _VECTOR_TYPES[dtype, lanes], Var(f"{s.var.name}_step")
        self.ranges[step], first = s.extent // lanes, step * lanes if s.extent > lanes else const(0)

        def at(e, lane: int) -> str:
            return self.expr(simplify(substitute(e, {s.var: first + lane}), self.ranges))

        name = self.name(step, step.name)
        if s.extent > lanes:
            self.out.line("#pragma unroll")
        with self.out.block(f"for (int32_t {name} = 0; {name} < {s.extent // lanes}; ++{name})" if s.extent > lanes
                            else ""):
            values = [at(body.value, lane) for lane in range(lanes)]
            if half:  # two rounded lanes a word, the first in its low bits
                values = [f"((unsigned){self.ROUNDED[dtype].format(values[n])} | ((unsigned)"
                          f"{self.ROUNDED[dtype].format(values[n + 1])} << 16))" for n in range(0, lanes, 2)]
            value = values[0] if len(values) == 1 else f"make_{vtype}({', '.join(values)})"
            target = f"({vtype}*)&{self.buffer_name(body.buffer)}[{at(index, 0)}]"
            self.out.line(f"atomicAdd({target}, {value});" if atomic else f"*{target} = {value};")
        return True

    def _aligned(self, index, var, lanes: int) -> bool:
        """Whether ``index`` at ``var = 0`` is provably a multiple of ``lanes`` (a loop of one
        iteration, whose variable is 0, adds nothing)."""
        linear = to_linear(index, self.ranges)
        return linear.const % lanes == 0 and all(
            atom is var or coeff % lanes == 0 or self.ranges.get(atom) == 1 for atom, coeff in linear.terms.items())

    def function(self) -> str:
        f = self.func
        if f.packs:
            raise LoweringError("transform_layout packs a weight on the host before the kernel runs; the CUDA "
                                "backend does not pack yet: leave the layout as it is")
        params = []
        for buffer, written in zip(f.args, f.outputs):
            const_qual = "" if written else "const "
            params.append(f"{const_qual}{_ctype(buffer.dtype)}* __restrict__ {self.buffer_name(buffer)}")
        body = CodeWriter()
        self.out = body
        threads = self.launch.threads
        min_blocks = int(blocks_an_sm(threads, self.target.registers_per_block))
        bounds = f"{threads}, {min_blocks}" if min_blocks > 1 else f"{threads}"
        head = f'extern "C" __global__ void __launch_bounds__({bounds}) {f.name}'
        with self.out.block(f"{head}({', '.join(params)})"):
            if self.launch.shared_bytes:  # over 48 KB: asked for at launch, the kernel opted in
                self.out.line("TC_DYNAMIC_SHARED;")
            self.stmt(f.body)
        return body.text()


def blocks_an_sm(threads, registers_per_block: int):
    """The blocks an SM must hold at once, as ``__launch_bounds__`` asks (at least 1), for a
    kernel of ``threads`` threads a block: an int, or a NumPy array of them."""
    return np.maximum(registers_per_block // (threads * REGISTERS_PER_THREAD), 1)


def registers_a_thread(threads, registers_per_block: int, max_registers_per_thread: int):
    """The registers nvcc may give each thread of a kernel of ``threads`` threads a block
    (an int, or a NumPy array of them) as this backend emits it: the target's most a thread,
    fewer where ``__launch_bounds__`` asks several blocks an SM or a block is large (1,024
    threads share 64K registers)."""
    blocks = blocks_an_sm(threads, registers_per_block)
    return np.minimum(max_registers_per_thread, registers_per_block // (threads * blocks))


def _ctype(dtype: str) -> str:
    """A buffer element's CUDA type: a 16-bit float as its bits (``unsigned short``), float16
    converted by ``tc_h2f`` and ``tc_f2h`` (PTX's ``cvt``), bfloat16 by the C backend's
    shift and rounding: no header, so NVRTC and nvcc alike."""
    return "unsigned short" if dtype in HALVES else C_TYPES[dtype]


def _picks_fragment_tiles(loop: For) -> bool:
    """Whether ``loop`` walks a fragment's tiles: it must unroll, or the registers, indexed by
    its variable, would be local memory."""
    return any(isinstance(n, WarpMatrix) and any(loop.var in free_vars(i) for t in n.tiles
                                                 if t.buffer.scope == "fragment" for i in t.indices)
               for n in walk_stmts(loop.body))


def _layout(tile: MatrixTile, transposed: bool = False) -> str:
    """``row`` where a tile's rows are contiguous (its columns, ``transposed``), else ``col``."""
    return "row" if (tile.buffer.strides[tile.col_dim] == 1) != transposed else "col"


def _load(matrix: str, tile: MatrixTile, layout: str | None = None) -> str:
    """The wmma load of A's or B's tile, row or column major (the tile's own ``layout`` by
    default): from shared memory in its own state space (ldmatrix)."""
    space = "shared_" if tile.buffer.scope == "shared" else ""
    return f"tc_wmma_load_{space}{_OPERAND_KINDS[tile.buffer.dtype]}{matrix}_{layout or _layout(tile)}"


def _halvings(width: int) -> list[int]:
    """The shuffle distances of a butterfly over ``width`` lanes: width/2, width/4, ..., 1."""
    return [1 << n for n in reversed(range(width.bit_length() - 1))]


def generate_cuda(func: LoweredFunc, target) -> tuple[str, tuple[Launch, ...]]:
    """The CUDA C source of a lowered GPU function, a ``__global__`` function for each of its
    kernels (``ir/kernels.py``), and the grid and block to launch each on, in order."""
    kernels, launches, uses_wmma = cuda_kernels(func, target)
    return _PRELUDE + (_WMMA if uses_wmma else "") + "\n" + kernels, launches


def cuda_kernels(func: LoweredFunc, target) -> tuple[str, tuple[Launch, ...], bool]:
    """``generate_cuda``'s kernels without the prelude they need (its helpers, and wmma.cuh's
    where the third value is true): a CUDA header, or runtime/cuda_on_cpu.h's, completes them."""
    emitters = [_CudaEmitter(kernel, target) for kernel in split_kernels(func)[0]]
    return ("\n".join(e.function() for e in emitters), tuple(e.launch for e in emitters),
            any(e.uses_wmma for e in emitters))


def vector_bytes(loop: For) -> int:
    """Bytes a vectorized loop moves at once (its extent times its store's element size)."""
    body = loop.body.then if isinstance(loop.body, IfThenElse) else loop.body
    return loop.extent * bytes_of(body.buffer.dtype) if isinstance(body, Store) else 0
