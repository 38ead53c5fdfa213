"""Features of a candidate read from its lowered loop nest, after Ansor's per-store features.

The search's features (``tilecraft/search/features.py``) come from the decision matrix
alone, in one NumPy pass over a population. These come from the ``LoweredFunc`` a
candidate's trace replays and lowers to: a replay and a lowering per candidate, so far
slower, but exact about what the loop nest does. They exist to measure whether that
exactness ranks candidates better (``benchmarks/feature_sets.py``, the only user, so
they live beside it rather than in the core). The design follows Ansor's ``feature.cc`` (Zheng et al.,
OSDI 2020, §5.2), abridged. Below, "level d" is the innermost d loops around a store
(loops of extent 1 not counted), "all" its whole nest, and the "register block" the
innermost loops that are unrolled or vectorized. Per store, its loops outer to inner:

  op.*         float operations by kind (add/sub, mul, div, mul+add pairs that can fuse,
               math calls, compare/select/min/max, casts), times the executed count
  count loops  executions of the store; loops around it; guards (if statements) above it
  vec.* unroll.* par.*   innermost vectorized length, product and number of vectorized
               loops; auto_unroll_max_step, product and number of loops in the register
               block; product and number of parallel loops and how deep they reach
  <slot>.*     per buffer (the written one, then the first three read, in order of
               appearance): access type (1 read, 2 write, 3 both), local scope, stride
               of the innermost loop (0 = reuse; the buffer's size when not affine) and
               Ansor's innermost non-zero stride, unique bytes at levels 1, 2, 4 and all,
               cache lines at level 1 and all, and Ansor's loop reuse (the innermost loop
               the access does not depend on: its extent, the iterations and the working
               set inside it)
  ws.* ai.*    the working set (unique bytes of all accesses) at levels 1, 2, 4 and all,
               and the arithmetic intensity (operations per working-set byte) there
  reg.*        register block: unique bytes of its local buffers (the register tile) and
               non-local elements loaded per operation
  traffic.*    bytes moved into each cache level: the working set of the outermost level
               that fits in the cache times how often that level runs (a box model that
               ignores reuse between consecutive iterations), and operations per byte
  alloc.*      the bytes of the buffer the store writes, when allocated inside the kernel,
               and the product of the loops outside that allocation

A candidate's row: every feature of its heaviest store (most operations, then most
executions), the sums over all stores of the op counts, executions and cache traffic, and
the program's store count and allocated local and global bytes. Every value is
log2(1 + x), as in Ansor; a candidate that fails to replay or lower gets a row of zeros.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.te.arith import bounds, to_linear
from tilecraft.ir.lower import lower
from tilecraft.ir.nodes import Allocate, Buffer, For, IfThenElse, LoweredFunc, Seq, Stmt, Store
from tilecraft.schedule.trace import Trace
from tilecraft.te.dtype import bytes_of
from tilecraft.te.expr import (Binary, Call, Cast, Compare, Expr, Logical, Not, Select, TensorRead, Var, children,
                                free_vars)

__all__ = ["IR_FEATURE_NAMES", "ir_features", "ir_feature_matrix"]

# Cache bytes (L1, L2, L3) and line bytes when no target is given.
DEFAULT_CACHES = (32 << 10, 1 << 20, 32 << 20)
DEFAULT_LINE_BYTES = 64

_OPS = ("addsub", "mul", "div", "fma", "math", "cmp", "cast")
_DEPTHS = {"d1": 1, "d2": 2, "d4": 4, "all": None}
_SLOTS = ("write", "read0", "read1", "read2")
_ACCESS = ("type", "local", "stride", "stride_nz", *(f"bytes.{d}" for d in _DEPTHS), "lines.d1", "lines.all",
           "reuse_ct", "reuse_iters", "reuse_bytes")
_STORE_NAMES = (
    *(f"op.{k}" for k in _OPS), "flops", "count", "loops", "guards",
    "vec.len", "vec.prod", "vec.num", "unroll.step", "unroll.prod", "unroll.num", "par.prod", "par.num", "par.depth",
    *(f"{s}.{a}" for s in _SLOTS for a in _ACCESS), *(f"ws.{d}" for d in _DEPTHS), *(f"ai.{d}" for d in _DEPTHS),
    "reg.tile_bytes", "reg.loads_per_op", *(f"traffic.l{n}" for n in (1, 2, 3)), *(f"ai.l{n}" for n in (1, 2, 3)),
    "alloc.bytes", "alloc.outer_prod",
)
_SUMMED = (*(f"op.{k}" for k in _OPS), "flops", "count", *(f"traffic.l{n}" for n in (1, 2, 3)))
_PROGRAM = ("stores", "alloc.local_bytes", "alloc.global_bytes")
IR_FEATURE_NAMES: tuple[str, ...] = (*_STORE_NAMES, *(f"sum.{n}" for n in _SUMMED), *(f"program.{n}" for n in _PROGRAM))


def ir_features(func: LoweredFunc, target=None) -> np.ndarray:
    """One float32 row in ``IR_FEATURE_NAMES`` order. ``target``: a ``Target`` whose cache
    sizes the traffic features use (``DEFAULT_CACHES`` when None)."""
    caches = (target.l1_bytes, target.l2_bytes, target.l3_bytes) if target is not None else DEFAULT_CACHES
    line = target.cache_line_bytes if target is not None else DEFAULT_LINE_BYTES
    found: list[tuple[Store, tuple[For, ...], dict, int]] = []
    allocated: list[Buffer] = []
    _collect(func.body, (), {}, 0, found, allocated)
    stores = [_store_features(*item, caches, line) for item in found]
    heaviest = max(stores, key=lambda f: (f["flops"], f["count"]), default={})
    row = [heaviest.get(n, 0.0) for n in _STORE_NAMES]
    row += [sum(f[n] for f in stores) for n in _SUMMED]
    row += [len(stores)] + [sum(math.prod(b.shape) * bytes_of(b.dtype) for b in allocated if b.scope == scope)
                            for scope in ("local", "global")]
    return np.log2(1 + np.maximum(np.asarray(row, dtype=np.float64), 0)).astype(np.float32)


def ir_feature_matrix(dag, traces: Sequence, target=None) -> np.ndarray:
    """``ir_features`` of many candidates: each trace (a ``Trace`` or its JSON steps) is
    replayed on ``dag`` and lowered. A trace that does not replay or lower gives zeros."""
    out = np.zeros((len(traces), len(IR_FEATURE_NAMES)), dtype=np.float32)
    for n, trace in enumerate(traces):
        trace = trace if isinstance(trace, Trace) else Trace.from_json(trace)
        try:
            out[n] = ir_features(lower(trace.replay(dag)), target)
        except TilecraftError:
            pass
    return out


def _collect(stmt: Stmt, loops: tuple, allocs: dict, guards: int, found: list, allocated: list) -> None:
    if isinstance(stmt, For):
        _collect(stmt.body, loops + (stmt,), allocs, guards, found, allocated)
    elif isinstance(stmt, Seq):
        for s in stmt.stmts:
            _collect(s, loops, allocs, guards, found, allocated)
    elif isinstance(stmt, IfThenElse):
        _collect(stmt.then, loops, allocs, guards + 1, found, allocated)
    elif isinstance(stmt, Allocate):
        allocated.append(stmt.buffer)
        _collect(stmt.body, loops, {**allocs, stmt.buffer: len(loops)}, guards, found, allocated)
    elif isinstance(stmt, Store):
        found.append((stmt, loops, allocs, guards))


def _op_counts(value: Expr) -> np.ndarray:
    """Operations per execution by kind (``_OPS``); index arithmetic is not counted."""
    counts = dict.fromkeys(_OPS, 0)
    stack = [value]
    while stack:
        e = stack.pop()
        if isinstance(e, TensorRead):
            continue
        if isinstance(e, Binary):
            kind = {"add": "addsub", "sub": "addsub", "mul": "mul", "div": "div", "floordiv": "div",
                    "floormod": "div", "pow": "math"}.get(e.op, "cmp")
            counts[kind] += 1
            if e.op in ("add", "sub") and any(isinstance(x, Binary) and x.op == "mul" for x in (e.a, e.b)):
                counts["fma"] += 1
        elif isinstance(e, Call):
            counts["math"] += 1
        elif isinstance(e, (Compare, Select, Logical, Not)):
            counts["cmp"] += 1
        elif isinstance(e, Cast):
            counts["cast"] += 1
        stack.extend(children(e))
    return np.array([counts[k] for k in _OPS], dtype=float)


def _accesses(store: Store) -> list[tuple[Buffer, tuple[Expr, ...], int]]:
    """(buffer, indices, type) of the written buffer, then the reads in order of appearance."""
    reads: dict[tuple, None] = {}
    stack = [store.value]
    while stack:
        e = stack.pop()
        if isinstance(e, TensorRead):
            reads.setdefault((e.tensor, e.indices))
        stack.extend(reversed(children(e)))
    written = (store.buffer, store.indices)
    first = [(store.buffer, store.indices, 3 if written in reads else 2)]
    return first + [(b, i, 1) for b, i in reads if (b, i) != written]


def _footprint(buffer: Buffer, indices: tuple, loops: tuple[For, ...], ranges: dict, line: int):
    """Per level l (the loops l.. varying, l = 0..n): unique elements and cache lines;
    per loop: the flat stride (NaN where not affine) and whether the access depends on it."""
    n, shape = len(loops), np.array(buffer.shape, dtype=float).reshape(-1)
    position = {loop.var: j for j, loop in enumerate(loops)}
    spans = np.zeros((len(shape), n + 1))  # what dim d gains when loop j varies
    flat, uses = np.zeros(n), np.zeros(n, dtype=bool)
    row_stride = np.r_[np.cumprod(shape[::-1])[::-1][1:], 1.0][:len(shape)]
    for d, index in enumerate(indices):
        for atom, coeff in to_linear(index, ranges).terms.items():
            if isinstance(atom, Var):
                if atom in position:
                    j = position[atom]
                    spans[d, j] += abs(coeff) * (loops[j].extent - 1)
                    flat[j] += coeff * row_stride[d]
                    uses[j] = True
                continue
            inner = [position[v] for v in free_vars(atom) if v in position]
            if inner:
                span = bounds(atom, ranges)
                spans[d, max(inner)] += abs(coeff) * (span[1] - span[0]) if span else shape[d]
                flat[inner], uses[inner] = np.nan, True
    extent = np.minimum(1 + np.cumsum(spans[:, ::-1], axis=1)[:, ::-1], shape[:, None])
    elements = extent.prod(axis=0)
    last = extent[-1] if len(shape) else np.ones(n + 1)
    lines = elements / last * np.ceil(last * bytes_of(buffer.dtype) / line)
    return elements, lines, flat, uses


def _store_features(store: Store, loops: tuple[For, ...], allocs: dict, guards: int, caches, line) -> dict:
    n = len(loops)
    extents = np.array([loop.extent for loop in loops], dtype=float)
    iters = np.r_[np.cumprod(extents[::-1])[::-1], 1.0]  # iterations inside level l
    count = iters[0]
    ops = _op_counts(store.value)
    per_iter = ops[[0, 1, 2, 4, 5]].sum()
    f = {f"op.{k}": v * count for k, v in zip(_OPS, ops)}
    f.update(flops=per_iter * count, count=count, loops=int((extents > 1).sum()), guards=guards)
    kinds = [loop.kind for loop in loops]
    vec = [j for j in range(n) if kinds[j] == "vectorize"]
    f.update({"vec.len": extents[vec[-1]] if vec else 0, "vec.prod": extents[vec].prod(), "vec.num": len(vec)})
    # The register block, as code generation unrolls it: a loop under auto_unroll_max_step
    # unrolls when its whole nest has at most that many iterations.
    budget = np.maximum.accumulate([loop.unroll_max_step for loop in loops]) if n else np.zeros(0)
    block = n
    while block > 0 and (kinds[block - 1] in ("unroll", "vectorize") or 0 < iters[block - 1] <= budget[block - 1]):
        block -= 1
    f.update({"unroll.step": budget[-1] if n else 0, "unroll.prod": iters[block], "unroll.num": n - block})
    par = [j for j in range(n) if kinds[j] == "parallel"]
    f.update({"par.prod": extents[par].prod(), "par.num": len(par), "par.depth": par[-1] + 1 if par else 0})

    ranges = {loop.var: loop.extent for loop in loops}
    accesses = _accesses(store)
    shapes = [_footprint(b, i, loops, ranges, line) for b, i, _ in accesses]
    sizes = [bytes_of(b.dtype) for b, _, _ in accesses]
    ws = sum(e * s for (e, _, _, _), s in zip(shapes, sizes))  # working set per level
    nontrivial = [j for j in range(n) if extents[j] > 1]
    level = {d: nontrivial[-depth] if depth and depth <= len(nontrivial) else 0 for d, depth in _DEPTHS.items()}
    for slot, (buffer, _, kind), (elements, lines, flat, uses), size in zip(_SLOTS, accesses, shapes, sizes):
        p = f"{slot}."
        f.update({p + "type": kind, p + "local": buffer.scope == "local"})
        strides = [math.prod(buffer.shape) if np.isnan(flat[j]) else abs(flat[j]) for j in nontrivial]
        f[p + "stride"] = strides[-1] if strides else 0
        f[p + "stride_nz"] = next((s for s in reversed(strides) if s), 0)
        f.update({f"{p}bytes.{d}": elements[level[d]] * size for d in _DEPTHS})
        f.update({p + "lines.d1": lines[level["d1"]], p + "lines.all": lines[0]})
        reuse = [j for j in nontrivial if not uses[j]]
        if reuse:
            j = reuse[-1]
            f.update({p + "reuse_ct": extents[j], p + "reuse_iters": iters[j + 1], p + "reuse_bytes": ws[j + 1]})
    for d in _DEPTHS:
        f[f"ws.{d}"] = ws[level[d]]
        f[f"ai.{d}"] = per_iter * iters[level[d]] / ws[level[d]]
    local = [a for a, (b, _, _) in enumerate(accesses) if b.scope == "local"]
    f["reg.tile_bytes"] = sum(shapes[a][0][block] * sizes[a] for a in local)
    loaded = sum(shapes[a][0][block] for a in range(len(accesses)) if a not in local and accesses[a][2] == 1)
    f["reg.loads_per_op"] = loaded / max(per_iter * iters[block], 1)
    for c, cache in enumerate(caches, start=1):
        fits = np.flatnonzero(ws <= cache)
        at = fits[0] if len(fits) else n  # the outermost level whose working set fits
        f[f"traffic.l{c}"] = ws[at] * count / iters[at]
        f[f"ai.l{c}"] = f["flops"] / f[f"traffic.l{c}"]
    if store.buffer in allocs:
        f["alloc.bytes"] = math.prod(store.buffer.shape) * bytes_of(store.buffer.dtype)
        f["alloc.outer_prod"] = extents[:allocs[store.buffer]].prod()
    return f
