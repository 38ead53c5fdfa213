"""C code generation: loop-nest IR to readable C with OpenMP and explicit SIMD.

Choices per loop, as Inductor's C++ backend makes them: parallel loops become one
``#pragma omp parallel for`` (``collapse(n)`` over directly nested parallel loops) on as
many threads as the target has cores;
vectorized loops whose body is one store become GCC vector-extension code (contiguous
accesses as vector loads and stores, loop-invariant values broadcast, reads of every other
element as two loads and a shuffle, other accesses gathered lane by lane) with a scalar
tail, in narrower vectors for a loop shorter than the target's unless it would gather. The
vector value may use arithmetic, min/max, comparisons as lane masks, selects as blends, casts between types of
one width and the math functions of ``vector_math``; 16-bit floats are float32 lanes, widened
as loaded and rounded as stored. Any other vectorized loop is emitted scalar for the
compiler to vectorize. Unrolled loops get ``#pragma GCC unroll``. Small
local buffers are stack arrays, which gcc keeps in registers once the loops over them unroll.
"""

from __future__ import annotations

import math
import re

from ..errors import LoweringError
from ..target import Target
from ..te.dtype import C_TYPES, HALVES, bytes_of, computes_in, is_float
from ..te.expr import (Binary, Call, Cast, Compare, Const, Expr, Logical, Not, Select, TensorRead, Var, binary, const,
                       substitute, walk)
from ..te.arith import bounds, simplify, to_linear
from ..ir.nodes import (Allocate, AtomicAdd, Barrier, Buffer, For, IfThenElse, LoweredFunc, Seq, Stmt, Store,
                        ThreadAllReduce)
from . import vector_math
from .dot_pairs import DotPairs, dot_pairs
from .prefetch import flat_index, prefetches
from .vector_math import MASK_DTYPES, VECTOR_DTYPES, half_vector_type, vector_type
from .writer import CodeWriter

STACK_LIMIT_BYTES = 256 * 1024

_PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int64_t tc_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b; return q - ((a % b != 0) && ((a < 0) != (b < 0))); }
static inline int64_t tc_floormod(int64_t a, int64_t b) {
  int64_t r = a % b; return r + ((r != 0) && ((r < 0) != (b < 0))) * b; }
#define TC_MINMAX(T, S) \\
  static inline T tc_max_##S(T a, T b) { return a > b ? a : b; } \\
  static inline T tc_min_##S(T a, T b) { return a < b ? a : b; }
TC_MINMAX(float, f32) TC_MINMAX(double, f64) TC_MINMAX(int32_t, i32) TC_MINMAX(int64_t, i64)
TC_MINMAX(int8_t, i8) TC_MINMAX(uint8_t, u8) TC_MINMAX(bool, b) TC_MINMAX(int16_t, i16) TC_MINMAX(uint16_t, u16)
TC_MINMAX(uint32_t, u32) TC_MINMAX(uint64_t, u64)
static inline float tc_bf2f(uint16_t h) { union { uint32_t u; float f; } v = {(uint32_t)h << 16}; return v.f; }
static inline uint16_t tc_f2bf(float f) {  /* to nearest, ties to even; a NaN stays one */
  union { float f; uint32_t u; } v = {f};
  return (v.u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((v.u >> 16) | 0x40u)
                                            : (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
"""

_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "int8": "i8", "uint8": "u8",
           "int16": "i16", "uint16": "u16", "uint32": "u32", "uint64": "u64",
           "bool": "b", "float16": "f32", "bfloat16": "f32"}
_C_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and": "&&", "or": "||", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
          "left_shift": "<<", "right_shift": ">>"}
_MATH = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "abs": "fabs", "rint": "rint",
         **{name: name for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                                    "atanh")}}


class _Emitter:
    # A 16-bit float element read, as the float32 it is computed in; a float32 value stored to
    # one, rounded to nearest even (bfloat16 held as its bits)
    WIDENED = {"float16": "((float){})", "bfloat16": "tc_bf2f({})"}
    ROUNDED = {"float16": "(_Float16)({})", "bfloat16": "tc_f2bf({})"}

    def __init__(self, func: LoweredFunc, target: Target):
        self.func, self.target = func, target
        self.out = CodeWriter()
        self.names: dict[object, str] = {}
        self.used: set[str] = set()
        self.ranges: dict[Var, int] = {}
        self.vector_types: set[tuple[str, int]] = set()
        self.vector_helpers: set[tuple[str, str, int]] = set()  # (name, dtype, lanes)
        self.half_vectors: set[tuple[str, int]] = set()  # 16-bit float vectors read or stored (dtype, lanes)
        self.dots: set[int] = set()  # the lanes of bfloat16 dot products of pairs emitted (dot_pairs.py)
        self.pairing: DotPairs | None = None  # the loop being emitted two steps at a time, if any
        self.in_parallel = False
        self.region_open = False
        self.prefetches = prefetches(func, target.l2_bytes)

    @property
    def threads(self) -> str:
        """OpenMP's clause for the target's cores, not OMP_NUM_THREADS or every CPU the process
        may use: a kernel tuned for a 2-core target runs on a 16-core host as it was measured."""
        return f" num_threads({self.target.num_cores})"

    # ------------------------------------------------------------ names
    def name(self, key: object, hint: str) -> str:
        if key not in self.names:
            base = re.sub(r"\W", "_", hint) or "v"
            if base[0].isdigit():
                base = "_" + base
            candidate, n = base, 0
            while candidate in self.used:
                n += 1
                candidate = f"{base}_{n}"
            self.used.add(candidate)
            self.names[key] = candidate
        return self.names[key]

    def buffer_name(self, buffer: Buffer) -> str:
        return self.name(buffer, buffer.name)

    # ------------------------------------------------------------ expressions
    def flat_index(self, buffer: Buffer, indices) -> Expr:
        return flat_index(buffer, indices, self.ranges)

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.name(e, e.name)
        if isinstance(e, Const):
            return _literal(e)
        if isinstance(e, TensorRead):
            text = f"{self.buffer_name(e.tensor)}[{self.expr(self.flat_index(e.tensor, e.indices))}]"
            return self.WIDENED[e.tensor.dtype].format(text) if e.tensor.dtype in HALVES else text
        if isinstance(e, Binary):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in _C_OPS:
                return f"({a} {_C_OPS[e.op]} {b})"
            if e.op in ("floordiv", "floormod") and is_float(e.dtype):
                f = _fsuffix(e.dtype)
                floor = f"floor{f}({a} / {b})"
                return floor if e.op == "floordiv" else f"({a} - {floor} * {b})"
            if e.op in ("floordiv", "floormod"):
                span = bounds(e.a, self.ranges)
                divisor = bounds(e.b, self.ranges)
                if span is not None and span[0] >= 0 and divisor is not None and divisor[0] > 0:
                    return f"({a} {'/' if e.op == 'floordiv' else '%'} {b})"
                return f"(({C_TYPES[e.dtype]})tc_{e.op}({a}, {b}))"
            if e.op in ("min", "max"):
                return f"tc_{e.op}_{_SUFFIX[e.dtype]}({a}, {b})"
            if e.op == "pow":
                if not is_float(e.dtype):  # exact for int results up to 2**53
                    return f"(({C_TYPES[e.dtype]})pow((double){a}, (double){b}))"
                return f"pow{_fsuffix(e.dtype)}({a}, {b})"
        if isinstance(e, (Compare, Logical)):
            return f"({self.expr(e.a)} {_C_OPS[e.op]} {self.expr(e.b)})"
        if isinstance(e, Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"
        if isinstance(e, Cast):
            return f"(({C_TYPES[computes_in(e.to)]}){self.expr(e.value)})"
        if isinstance(e, Call):
            x = self.expr(e.args[0])
            f = _fsuffix(e.dtype)
            if e.name == "sigmoid":
                one = "1.0f" if f else "1.0"
                return f"({one} / ({one} + exp{f}(-{x})))"
            if e.name == "rsqrt":
                return f"({'1.0f' if f else '1.0'} / sqrt{f}({x}))"
            if e.name == "abs" and not is_float(e.dtype):
                return f"(({x}) < 0 ? -({x}) : ({x}))"
            return f"{_MATH[e.name]}{f}({x})"
        raise LoweringError(f"C code generation has no rule for the expression {e} ({type(e).__name__}); "
                            "this is a tilecraft bug: please report it with the schedule's trace")

    # ------------------------------------------------------------ statements
    def stmt(self, s: Stmt, unroll_budget: int = 0) -> None:
        if isinstance(s, Seq):
            for child in s.stmts:
                self.stmt(child, unroll_budget)
        elif isinstance(s, Store):
            value = self.expr(s.value)
            if s.buffer.dtype in HALVES:
                value = self.ROUNDED[s.buffer.dtype].format(value)
            self.out.line(f"{self.buffer_name(s.buffer)}[{self.expr(self.flat_index(s.buffer, s.indices))}] = {value};")
        elif isinstance(s, AtomicAdd):  # only in a GPU kernel's emulation, whose blocks run one after another
            target = f"{self.buffer_name(s.buffer)}[{self.expr(self.flat_index(s.buffer, s.indices))}]"
            self.out.line(f"{target} += {self.expr(s.value)};")
        elif isinstance(s, IfThenElse):
            with self.out.block(f"if ({self.expr(s.cond)})"):
                self.stmt(s.then, unroll_budget)
        elif isinstance(s, Allocate):
            self.allocate(s, unroll_budget)
        elif isinstance(s, For):
            self.loop(s, unroll_budget)
        elif isinstance(s, (Barrier, ThreadAllReduce)):
            raise LoweringError("the schedule caches a block in shared memory or reduces across GPU threads: build "
                                "it for a CUDA target, or use the 'local' scope on a CPU")
        else:
            raise LoweringError(f"C code generation has no rule for the statement {type(s).__name__}; "
                                "this is a tilecraft bug: please report it with the schedule's trace")

    def allocate(self, s: Allocate, unroll_budget: int) -> None:
        b = s.buffer
        ctype = C_TYPES[b.dtype]
        size = b.elements
        name = self.buffer_name(b)
        if size * bytes_of(b.dtype) <= STACK_LIMIT_BYTES and b.scope == "local":
            self.out.line(f"{ctype} {name}[{size}] __attribute__((aligned(64)));")
            self.stmt(s.body, unroll_budget)
        else:
            self._with_heap([b], lambda: self.stmt(s.body, unroll_budget))

    def loop(self, s: For, unroll_budget: int) -> None:
        self.ranges[s.var] = s.extent
        var = self.name(s.var, s.var.name)
        budget = max(unroll_budget, s.unroll_max_step)
        if s.kind not in ("serial", "parallel", "vectorize", "unroll"):
            raise LoweringError(f"loop {s.var.name} is bound to {s.kind}, a GPU axis: build the schedule for a "
                                "CUDA target (tc.build(sch, 'cuda')), or run it here with tc.emulate_gpu(sch)")
        if s.kind == "parallel" and not self.in_parallel:
            depth, inner = 1, s.body
            while isinstance(inner, For) and inner.kind == "parallel":
                self.ranges[inner.var] = inner.extent
                depth, inner = depth + 1, inner.body
            collapse = f" collapse({depth})" if depth > 1 else ""
            worksharing = "for" if self.region_open else f"parallel for{self.threads}"
            self.out.line(f"#pragma omp {worksharing}{collapse} schedule(static)")
            self.in_parallel = True
            self._serial_loops(s, depth, budget)
            self.in_parallel = False
            return
        if s.kind == "vectorize" and self.vector_loop(s):
            return
        if self.pairing is not None and self.pairing.vector is s:
            raise LoweringError(f"the vector loop {s.var.name} of a bfloat16 register tile could not be emitted as "
                                "vectors; this is a tilecraft bug: please report it with the schedule's trace")
        pairs = dot_pairs(s, self._read_stride, self._pair_step) if self.pairing is None else None
        lanes = pairs and self.target.vector_lanes("float32", pairs.vector.extent)
        if pairs is None or lanes not in (4, 8, 16) or pairs.vector.extent % lanes:
            self._serial_loop(s, var, budget)
            return
        self.out.line(vector_math.bfloat16_dot_guard(lanes).rstrip())  # bfloat16 pairs, or the usual loop
        self.pairing = pairs
        self._serial_loop(s, var, budget, step=2)
        self.pairing = None
        self.out.line("#else")
        self._serial_loop(s, var, budget)
        self.out.line("#endif")

    def _serial_loop(self, s: For, var: str, budget: int, step: int = 1) -> None:
        if s.kind == "unroll" or (budget and _nest_size(s) <= budget):
            self.out.line(f"#pragma GCC unroll {min(s.extent // step, 1024)}")
        elif s.kind == "vectorize":
            self.out.line("#pragma GCC ivdep")
        advance = f"{var} += {step}" if step > 1 else f"++{var}"
        with self.out.block(f"for (int32_t {var} = 0; {var} < {s.extent}; {advance})"):
            self.prefetch(s)
            self.stmt(s.body, budget)

    def _serial_loops(self, s: For, depth: int, budget: int) -> None:
        var = self.name(s.var, s.var.name)
        with self.out.block(f"for (int32_t {var} = 0; {var} < {s.extent}; ++{var})"):
            if depth > 1:
                self._serial_loops(s.body, depth - 1, budget)
            else:
                self.prefetch(s)
                self.stmt(s.body, budget)

    def prefetch(self, s: For) -> None:
        """The share of the next weight chunk that each iteration of ``s`` asks for (``prefetch``)."""
        line = self.target.cache_line_bytes
        for site in self.prefetches.get(id(s), ()):
            with self.out.block(f"if ({self.name(site.chunk_var, site.chunk_var.name)} < {site.chunk_last})"):
                start = f"(const char*)&{self.buffer_name(site.buffer)}[{self.expr(site.index)}]"
                with self.out.block(f"for (int32_t tc_line = 0; tc_line < {site.nbytes}; tc_line += {line})"):
                    self.out.line(f"__builtin_prefetch({start} + tc_line, 0, 3);")

    # ------------------------------------------------------------ SIMD
    def vector_loop(self, s: For) -> bool:
        body, guard = s.body, None
        if isinstance(body, IfThenElse) and s.var not in _vars(body.cond):
            guard, body = body.cond, body.then
        if not isinstance(body, Store):
            return False
        dtype = body.buffer.dtype
        lane_dtype = computes_in(dtype)  # a 16-bit float's lanes are float32's, rounded when stored
        lanes = self.target.vector_lanes(lane_dtype, s.extent)
        if lane_dtype not in VECTOR_DTYPES or lanes <= 1 or s.extent < lanes:
            return False
        if lanes < self.target.vector_lanes(lane_dtype) and self._gathers(body.value, s.var):
            return False  # a short loop of gathers: scalar, its accumulators kept in registers (6x faster)
        if not self._vectorizable(body.value, s.var, bytes_of(lane_dtype)):
            return False
        store_index = self.flat_index(body.buffer, body.indices)
        if _stride(store_index, s.var, self.ranges) != 1:
            return False
        var = self.name(s.var, s.var.name)
        main = s.extent - s.extent % lanes
        if guard is not None:
            self.out.open(f"if ({self.expr(guard)})")
        self.out.line(f"#pragma GCC unroll {min(main // lanes, 16)}")
        with self.out.block(f"for (int32_t {var} = 0; {var} < {main}; {var} += {lanes})"):
            target = f"{self.buffer_name(body.buffer)}[{self.expr(store_index)}]"
            value = (self._dot(self.pairing, target, lanes) if self.pairing is not None and self.pairing.vector is s
                     else self.vector(body.value, s.var, lanes))
            if dtype in HALVES:  # rounded as stored
                self.half_vectors.add((dtype, lanes))
                stored = half_vector_type(dtype, lanes)
                value = f"tc_round_{stored}({value})"
            else:
                stored = vector_type(dtype, lanes)
            self.out.line(f"*({stored}*)&{target} = {value};")
        if main < s.extent:
            with self.out.block(f"for (int32_t {var} = {main}; {var} < {s.extent}; ++{var})"):
                self.stmt(body)
        if guard is not None:
            self.out.close()
        return True

    def _dot(self, pairs: DotPairs, target: str, lanes: int) -> str:
        """The store's value two steps of ``pairs.k`` at a time: its lanes plus the products of
        A's pair and each lane's pair of B (their elements at k and k + 1, as their bits)."""
        self.dots.add(lanes)
        self.half_vectors.add(("bfloat16", lanes))
        half = half_vector_type("bfloat16", lanes)

        def at(read: TensorRead, step: int) -> str:
            index = simplify(substitute(self.flat_index(read.tensor, read.indices),
                                        {pairs.k: binary("add", pairs.k, const(step))}), self.ranges)
            return f"{self.buffer_name(read.tensor)}[{self.expr(index)}]"

        a = f"*(tc_bf16_pair*)&{at(pairs.a, 0)}" if pairs.a_adjacent else \
            f"({at(pairs.a, 0)} | (uint32_t){at(pairs.a, 1)} << 16)"
        acc = f"*({vector_type('float32', lanes)}*)&{target}"
        if pairs.b_paired:
            return f"tc_dot_pairs_{half}({acc}, {a}, *(tc_bf16_pairs{lanes}*)&{at(pairs.b, 0)})"
        return f"tc_dot_{half}({acc}, {a}, *({half}*)&{at(pairs.b, 0)}, *({half}*)&{at(pairs.b, 1)})"

    def _read_stride(self, read: TensorRead, var: Var) -> int | None:
        return _stride(self.flat_index(read.tensor, read.indices), var, self.ranges)

    def _pair_step(self, read: TensorRead, loop: For) -> int | None:
        """The elements from ``read`` at an even step of ``loop`` to the next step's: the same at
        every even step where a weight is packed in pairs (``k // 2`` and ``k % 2`` in its index)."""
        half = Var(f"{loop.var.name}_pair")
        ranges = {**self.ranges, half: loop.extent // 2}
        index = self.flat_index(read.tensor, read.indices)
        even, odd = (simplify(substitute(index, {loop.var: binary("add", binary("mul", half, const(2)), const(bit))}),
                              ranges) for bit in (0, 1))
        step = to_linear(odd, ranges).add(to_linear(even, ranges), -1)
        return None if step.terms else step.const

    def _vectorizable(self, e: Expr, var: Var, width: int) -> bool:
        """Whether ``vexpr`` has a rule for ``e``: every part that varies with ``var`` is a
        ``width``-byte vector (or a lane mask; a 16-bit float's lanes are float32's), and
        nothing is evaluated that the scalar code might skip (the other side of a select, the
        right side of && and ||) unless it is safe."""
        if var not in _vars(e):
            return True
        if e.dtype == "bool":  # a lane mask, from a comparison or a cast
            if not isinstance(e, (Compare, Logical, Not, Cast)):
                return False
        elif computes_in(e.dtype) not in VECTOR_DTYPES or bytes_of(computes_in(e.dtype)) != width:
            return False
        if isinstance(e, (TensorRead, Var)):
            return True
        parts: tuple[Expr, ...]
        if isinstance(e, Binary):
            parts = (e.a, e.b)
            if e.op not in ("add", "sub", "mul", "div", "min", "max"):
                return False
        elif isinstance(e, Compare):
            parts = (e.a, e.b)
            if e.a.dtype == "bool":
                return False
        elif isinstance(e, Logical):
            parts = (e.a, e.b)
            if not self._is_safe(e.b):
                return False
        elif isinstance(e, Not):
            parts = (e.a,)
        elif isinstance(e, Select):
            parts = (e.cond, e.true_value, e.false_value)
            if var in _vars(e.cond) and not (self._is_safe(e.true_value) and self._is_safe(e.false_value)):
                return False
        elif isinstance(e, Cast):
            parts = (e.value,)
            if e.value.dtype != "bool" and e.dtype != "bool" and bytes_of(computes_in(e.value.dtype)) != width:
                return False
        elif isinstance(e, Call):
            parts = e.args
            if not vector_math.has_helper(e.name, computes_in(e.dtype)):
                return False
        else:
            return False
        return all(self._vectorizable(part, var, width) for part in parts)

    def _gathers(self, e: Expr, var: Var) -> bool:
        """Whether ``e`` reads some tensor lane by lane along ``var`` (not contiguously, nor
        every other element, nor the same element in every lane)."""
        strides = []
        walk(e, lambda n: strides.append(_stride(self.flat_index(n.tensor, n.indices), var, self.ranges))
             if isinstance(n, TensorRead) else None)
        return any(stride not in (0, 1, 2) for stride in strides)

    def _is_safe(self, e: Expr) -> bool:
        """Whether evaluating ``e`` in every iteration cannot fault: each read is provably in
        bounds and no integer division has a divisor that might be zero."""
        safe = True

        def visit(node: Expr) -> None:
            nonlocal safe
            if isinstance(node, TensorRead):
                span = bounds(self.flat_index(node.tensor, node.indices), self.ranges)
                safe = safe and span is not None and span[0] >= 0 and span[1] < node.tensor.elements
            elif isinstance(node, Binary) and node.op in ("floordiv", "floormod") and not is_float(node.dtype):
                safe = safe and isinstance(node.b, Const)

        walk(e, visit)
        return safe

    def vector(self, e: Expr, var: Var, lanes: int) -> str:
        """``e`` as a vector of ``lanes``; a loop-invariant value is broadcast."""
        if var in _vars(e):
            return self.vexpr(e, var, lanes)
        return f"{self.helper('broadcast', computes_in(e.dtype), lanes)}({self.expr(e)})"

    def helper(self, name: str, dtype: str, lanes: int) -> str:
        self.vector_helpers.add((name, dtype, lanes))
        return f"tc_{name}_{vector_type(dtype, lanes)}"

    def vexpr(self, e: Expr, var: Var, lanes: int) -> str:
        """``e`` as a vector (a lane mask for a condition) where it varies with ``var``; a
        loop-invariant operand stays scalar, as C's vector operators broadcast it."""
        if var not in _vars(e):
            return self.expr(e)
        dtype = computes_in(e.dtype)  # a 16-bit float's lanes are float32's
        if e.dtype != "bool":
            self.vector_types.add((dtype, lanes))
        if isinstance(e, TensorRead):
            index = self.flat_index(e.tensor, e.indices)
            name = self.buffer_name(e.tensor)
            vtype = vector_type(dtype, lanes)
            stride = _stride(index, var, self.ranges)
            if stride == 1 and e.dtype in HALVES:  # widened as loaded
                self.half_vectors.add((e.dtype, lanes))
                half = half_vector_type(e.dtype, lanes)
                return f"tc_widen_{half}(*({half}*)&{name}[{self.expr(index)}])"
            if stride == 1:
                return f"(*({vtype}*)&{name}[{self.expr(index)}])"
            if stride == 2 and e.dtype not in HALVES:  # every other element (a stride-2 window): 2 loads, a shuffle
                start, half = self.expr(index), range(lanes // 2)
                mask = ", ".join([str(2 * n) for n in half] + [str(lanes + 2 * n + 1) for n in half])
                return (f"__builtin_shuffle(*({vtype}*)&{name}[{start}], *({vtype}*)&{name}[{start} + {lanes - 1}], "
                        f"({vector_type(MASK_DTYPES[e.dtype], lanes)}){{{mask}}})")
            lane_values = [self.expr(simplify(substitute(index, {var: binary("add", var, const(n))}), self.ranges))
                           for n in range(lanes)]
            element = self.WIDENED.get(e.dtype, "{}")  # a 16-bit float widened lane by lane
            return f"(({vtype}){{{', '.join(element.format(f'{name}[{i}]') for i in lane_values)}}})"
        if isinstance(e, Var):  # the loop variable itself: lane n holds var + n
            return f"({self.expr(e)} + ({vector_type(dtype, lanes)}){{{', '.join(map(str, range(lanes)))}}})"
        if isinstance(e, Binary) and e.op in ("min", "max"):
            a, b = self.vector(e.a, var, lanes), self.vector(e.b, var, lanes)
            return f"{self.helper(e.op, dtype, lanes)}({a}, {b})"
        if isinstance(e, (Binary, Compare)):
            return f"({self.vexpr(e.a, var, lanes)} {_C_OPS[e.op]} {self.vexpr(e.b, var, lanes)})"
        if isinstance(e, Logical):  # on masks of -1/0; a scalar condition becomes -1/0 too
            mask_ctype = "int32_t" if self.target.vector_bytes // lanes == 4 else "int64_t"
            a, b = (self.vexpr(x, var, lanes) if var in _vars(x) else f"-({mask_ctype})({self.expr(x)})"
                    for x in (e.a, e.b))
            return f"({a} {'&' if e.op == 'and' else '|'} {b})"
        if isinstance(e, Not):
            return f"(~{self.vexpr(e.a, var, lanes)})"
        if isinstance(e, Select):
            t, f = self.vector(e.true_value, var, lanes), self.vector(e.false_value, var, lanes)
            if var not in _vars(e.cond):  # one branch for all lanes, evaluated only when chosen
                return f"({self.expr(e.cond)} ? {t} : {f})"
            return f"{self.helper('select', dtype, lanes)}({self.vexpr(e.cond, var, lanes)}, {t}, {f})"
        if isinstance(e, Cast):
            value = self.vexpr(e.value, var, lanes)
            if e.dtype == "bool":
                return f"({value} != 0)"
            if e.value.dtype == "bool":  # a mask of -1/0 to 1/0
                value = f"(-{value})"
            elif computes_in(e.value.dtype) == dtype:  # to or from a 16-bit float: rounded only when stored
                return value
            return f"__builtin_convertvector({value}, {vector_type(dtype, lanes)})"
        assert isinstance(e, Call)
        return f"{self.helper(e.name, dtype, lanes)}({self.vexpr(e.args[0], var, lanes)})"

    # ------------------------------------------------------------ function
    def function(self) -> str:
        f = self.func
        params = []
        for buffer, written in zip(f.args, f.outputs):
            const_qual = "" if written else "const "
            params.append(f"{const_qual}{C_TYPES[buffer.dtype]}* restrict {self.buffer_name(buffer)}")
        body = CodeWriter()
        saved, self.out = self.out, body
        with self.out.block(f"void {f.name}({', '.join(params)})"):
            self.body(f.body)
        self.out = saved
        pack_sources = [self.pack_function(p) for p in f.packs]
        floats = {("float32", lanes) for _, lanes in self.half_vectors}  # what 16-bit floats widen to
        head = (_PRELUDE + vector_math.helpers(self.vector_types | floats, self.vector_helpers)
                + vector_math.half_helpers(self.half_vectors, self.dots))
        return head + "\n" + "\n".join(pack_sources + [body.text()])

    def body(self, s: Stmt) -> None:
        """The function body; with several parallel stages, one parallel region holds them all."""
        heap = []
        while isinstance(s, Allocate) and s.buffer.scope != "local":
            heap.append(s.buffer)
            s = s.body
        stages = list(s.stmts) if isinstance(s, Seq) else [s]
        if sum(isinstance(t, For) and t.kind == "parallel" for t in stages) < 2:
            self._with_heap(heap, lambda: self.stmt(s))
            return

        def region() -> None:
            self.out.line(f"#pragma omp parallel{self.threads}")
            with self.out.block(""):
                self.region_open = True
                for stage in stages:
                    if isinstance(stage, For) and stage.kind == "parallel":
                        self.stmt(stage)
                        continue
                    self.out.line("#pragma omp single")
                    with self.out.block(""):
                        self.in_parallel = True  # parallel loops nested in a serial stage run serially here
                        self.stmt(stage)
                        self.in_parallel = False
                self.region_open = False

        self._with_heap(heap, region)

    def _with_heap(self, buffers, emit) -> None:
        for b in buffers:
            ctype = C_TYPES[b.dtype]
            nbytes = -(-b.elements * bytes_of(b.dtype) // 64) * 64
            self.out.line(f"{ctype}* restrict {self.buffer_name(b)} = ({ctype}*)aligned_alloc(64, {nbytes});")
        emit()
        for b in reversed(buffers):
            self.out.line(f"free({self.buffer_name(b)});")

    def pack_function(self, pack) -> str:
        writer = CodeWriter()
        saved, self.out = self.out, writer
        src, dst = self.buffer_name(pack.source), self.buffer_name(pack.packed)
        ctype = C_TYPES[pack.source.dtype]
        with self.out.block(f"void {pack.name}(const {ctype}* restrict {src}, {ctype}* restrict {dst})"):
            self.stmt(pack.body)
        self.out = saved
        return writer.text()


def generate_c(func: LoweredFunc, target: Target) -> str:
    """The C source of a lowered function (and of its weight-packing functions)."""
    return _Emitter(func, target).function()


def _literal(c: Const) -> str:
    if c.dtype == "bool":
        return "true" if c.value else "false"
    if is_float(c.dtype):
        value = float(c.value)
        f = "f" if c.dtype != "float64" else ""
        if math.isinf(value):
            return f"({'-' if value < 0 else ''}INFINITY)"
        if math.isnan(value):
            return "NAN"
        return f"{value!r}{f}"
    return f"{c.value}LL" if c.dtype == "int64" else str(c.value)


def _fsuffix(dtype: str) -> str:
    return "" if dtype == "float64" else "f"


def _vars(e: Expr) -> set[Var]:
    from ..te.expr import free_vars

    return free_vars(e)


def _stride(index: Expr, var: Var, ranges) -> int | None:
    linear = to_linear(index, ranges)
    if any(var in _vars(atom) for atom in linear.terms if not isinstance(atom, Var)):
        return None
    return linear.terms.get(var, 0)


def _nest_size(s: For) -> int:
    """Iterations of ``s`` times those of its deepest inner loop nest (for auto_unroll_max_step)."""
    stack = [s.body]
    sizes = [1]
    while stack:
        node = stack.pop()
        if isinstance(node, For):
            sizes.append(_nest_size(node))
        elif isinstance(node, Seq):
            stack.extend(node.stmts)
        elif isinstance(node, (IfThenElse,)):
            stack.append(node.then)
        elif isinstance(node, Allocate):
            stack.append(node.body)
    return s.extent * max(sizes)
