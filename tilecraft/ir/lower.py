"""Lowering: a schedule's loop state becomes one loop-nest function.

Passes, in order:
  1. infer bounds        (``bound.BoundInference``): the region every stage computes;
  2. place buffers       each intermediate lives at the deepest loop enclosing its
                         producer and all its consumers, sized to the region used there;
  3. build loop nests    every stage's loops, with the stages attached at each loop
                         nested inside it and a reduction's init placed before its
                         outermost reduction loop (or where decompose_reduction says);
                         on a GPU, a stage filling shared memory fenced by barriers, a
                         reduction bound to threadIdx.x ending in a ThreadAllReduce, and one
                         bound to blockIdx (split-K) adding into a zeroed output atomically;
  4. simplify            index arithmetic in canonical form, proven guards dropped; a loop
                         cut where a select on its own variable changes side (a
                         concatenation's channels), the selects its pieces decide folded;
  5. GPU passes          nests marked tensor_core made warps' operations (``tensor_core.py``),
                         shared tiles double-buffered (``pipeline.py``), virtual threads
                         moved inside each thread's statements (``vthread.py``).
"""

from __future__ import annotations

import math

from ..errors import LoweringError
from ..schedule.bound import BoundInference, StageBounds, loop_path
from ..schedule.state import Stage, common_prefix
from ..te.arith import bounds, simplify
from ..te.dtype import accumulates_in
from ..te.expr import (Cast, Compare, Const, Expr, Logical, Select, TensorRead, Var, binary, const, map_children,
                       reduction_identity, substitute, walk)
from ..te.tensor import Tensor
from .nodes import (Allocate, AtomicAdd, Barrier, Buffer, For, IfThenElse, LoweredFunc, PackFunc, Seq, Stmt, Store,
                    ThreadAllReduce, seq, substitute_stmt, walk_stmts)
from .pipeline import software_pipeline
from .tensor_core import tensorize
from .vthread import inject_virtual_threads

ATOMIC_DTYPES = ("float32", "float64", "int32")  # what CUDA's atomicAdd adds
_KIND = {"": "serial", "parallel": "parallel", "vectorize": "vectorize", "unroll": "unroll"}


class _Lowering:
    def __init__(self, sch, name: str):
        self.sch, self.state, self.name = sch, sch.state, name
        self.inference = BoundInference(self.state, lambda n: loop_path(self.state, n))
        for stage in self.state.stages:
            self.inference.of(stage.name)
        self.ranges = self.inference.ranges()
        self.args: dict[Tensor, Buffer] = {}
        self.buffers: dict[Tensor, Buffer] = {}
        self.offsets: dict[Tensor, tuple[Expr, ...]] = {}
        self.alloc_at: dict[int | None, list[Buffer]] = {}
        self.zeroed: set[Tensor] = set()  # outputs that blocks add into (reductions across blocks)
        packed_of = {p.source: p.packed for p in self.state.packed}
        for tensor in sch.dag.tensors:
            shown = packed_of.get(tensor, tensor)
            self.args[shown] = Buffer(tensor.name, shown.shape, shown.dtype, "arg")
        for stage in self.state.stages:
            self._place_buffer(stage)

    # ---------------------------------------------------------------- buffers
    def _place_buffer(self, stage: Stage) -> None:
        tensor = stage.tensor
        if tensor in self.args:
            self.buffers[tensor] = self.args[tensor]
            self.offsets[tensor] = tuple(const(0) for _ in tensor.shape)
            return
        b = self.inference.of(stage.name)
        ndim = len(stage.op.axis)
        # The deepest loop enclosing the producer and every consumer: a block reverse-computed
        # inside its producer but read by blocks outside it needs its buffer outside too.
        common = common_prefix([loop_path(self.state, s.name) for s in [stage] + self.state.consumers_of(stage.name)])
        loop = common[-1] if common else None
        if loop is None:
            mins, shape = tuple(const(0) for _ in range(ndim)), tensor.shape
        elif stage.attach is not None and not stage.attach.reverse and loop == stage.attach.loop:
            mins, shape = b.root_min[:ndim], b.root_extent[:ndim]
        else:
            mins, shape = self.inference.region_written_inside(stage.name, loop)
        scope = "shared" if stage.scope == "shared" else "local" if loop is not None else "global"
        # A thread's accumulator of a float16 sum (a register tile) holds float32; its copy-out rounds once.
        dtype = accumulates_in(tensor.dtype) if scope == "local" and stage.op.reduce_axis else tensor.dtype
        buffer = Buffer(tensor.name, tuple(shape), dtype, scope, laid_out(tuple(shape), stage.align, stage.order))
        self.buffers[tensor] = buffer
        self.offsets[tensor] = tuple(mins)
        self.alloc_at.setdefault(loop, []).append(buffer)

    # ---------------------------------------------------------------- expressions
    def load(self, tensor: Tensor, indices: tuple[Expr, ...]) -> Expr:
        if tensor in self.args and tensor not in self.buffers:
            return TensorRead(self.args[tensor], indices)
        buffer = self.buffers[tensor]
        offset = self.offsets[tensor]
        return TensorRead(buffer, tuple(binary("sub", i, o) for i, o in zip(indices, offset)))

    def rewrite_reads(self, expr: Expr) -> Expr:
        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and not isinstance(node.tensor, Buffer):
                return self.load(node.tensor, tuple(rewrite(i) for i in node.indices))
            return map_children(node, rewrite)

        return rewrite(expr)

    # ---------------------------------------------------------------- loop nests
    def stage_nest(self, stage: Stage) -> Stmt:
        b = self.inference.of(stage.name)
        op = stage.op
        axis_index = self.inference.root_index(stage, b)
        out_index = tuple(axis_index[iv.var] for iv in op.axis)
        target = self.load(stage.tensor, out_index)
        guards = self._guards(stage, b)
        spatial_guards = [g for g, kind in guards if kind == "spatial"]
        all_guards = [g for g, _ in guards]
        body = op.body
        if hasattr(body, "combiner"):
            source = self.rewrite_reads(substitute(body.source, axis_index))
            where = self.rewrite_reads(substitute(body.where, axis_index))
            combined = _combine(body.combiner, target, source)
            update: Stmt = Store(target.tensor, target.indices, combined)
            if not (isinstance(where, Const) and where.value):
                all_guards.append(where)
            init = Store(target.tensor, target.indices, reduction_identity(body.combiner, target.dtype))
            bound = {stage.loop(l).annotation for l in stage.leaves if stage.loop(l).kind != "spatial"}
            kinds = [stage.loop(l).kind != "spatial" for l in stage.leaves]  # reduction loops innermost: 0..0 1..1
            if "threadIdx.x" in bound or (target.dtype != accumulates_in(target.dtype) and stage.init_loop is None
                                          and any(kinds) and kinds == sorted(kinds)):
                return self._register_sum_nest(stage, b, target, body.combiner, source, all_guards, spatial_guards,
                                               across_threads="threadIdx.x" in bound)
            if any(axis.startswith("blockIdx") for axis in bound):
                return self._cross_block_nest(stage, b, target, body.combiner, source, all_guards)
            return self._reduction_nest(stage, b, _guard(update, all_guards), _guard(init, spatial_guards))
        value = self.rewrite_reads(substitute(body, axis_index))
        store = Store(target.tensor, target.indices, _cast_to(value, op.dtype))
        return self._nest(stage, b, stage.leaves, _guard(store, all_guards))

    def _guards(self, stage: Stage, b: StageBounds) -> list[tuple[Expr, str]]:
        guards = []
        axes = stage.op.axis + stage.op.reduce_axis
        for n, (iv, root) in enumerate(zip(axes, stage.roots)):
            value = b.root_value[root]
            span = bounds(value, self.ranges)
            if span is None or span[1] >= b.root_extent[n]:
                guards.append((value < b.root_extent[n], iv.kind))
            index = binary("add", b.root_min[n], value)
            span = bounds(simplify(index, self.ranges), self.ranges)
            if (span is None or span[1] >= iv.extent) and n not in b.padded:
                guards.append((index < iv.extent, iv.kind))
        for loop_id, (value, extent) in b.inner_split.items():
            span = bounds(value, self.ranges)
            if span is None or span[1] >= extent:
                guards.append((value < extent, "spatial" if stage.loop(loop_id).kind == "spatial" else "reduce"))
        return guards

    def _reduction_nest(self, stage: Stage, b: StageBounds, update: Stmt, init: Stmt) -> Stmt:
        leaves = list(stage.leaves)
        first_reduce = next((n for n, l in enumerate(leaves) if stage.loop(l).kind != "spatial"), len(leaves))
        split_at = leaves.index(stage.init_loop) if stage.init_loop is not None else first_reduce
        # The init must stay inside the loop the stage's buffer is allocated at (a consumer
        # reverse-computed at one of this stage's loops puts it there).
        buffer = self.buffers[stage.tensor]
        alloc = [n for n, leaf in enumerate(leaves) if buffer in self.alloc_at.get(leaf, [])]
        if alloc and alloc[0] >= split_at:
            split_at = min(alloc[0] + 1, first_reduce)
        init_leaves = [l for l in leaves[split_at:] if stage.loop(l).kind == "spatial"]
        init_nest = self._plain_nest(stage, b, init_leaves, init)
        update_nest = self._nest(stage, b, leaves[split_at:], update)
        return self._nest(stage, b, leaves[:split_at], seq([init_nest, update_nest]))

    def _register_sum_nest(self, stage: Stage, b: StageBounds, target: TensorRead, combiner: str, source: Expr,
                           all_guards: list[Expr], spatial_guards: list[Expr], across_threads: bool) -> Stmt:
        """A reduction summed in a register, then stored once: one whose loop is bound to
        ``threadIdx.x`` (each thread accumulates a partial over its share of the reduction
        loops, the row of threads combines the partials, ``ThreadAllReduce``, and every thread
        alike stores the result), or a float16 one whose reduction loops are innermost, summed
        in float32 where its buffer would round every step."""
        leaves = list(stage.leaves)
        first_reduce = next(n for n, l in enumerate(leaves) if stage.loop(l).kind != "spatial")
        inner_spatial = [stage.loop(l).name for l in leaves[first_reduce:] if stage.loop(l).kind == "spatial"]
        if inner_spatial or stage.init_loop is not None:
            raise LoweringError(
                f"block {stage.name} reduces across threads (a reduction loop bound to threadIdx.x), so its "
                f"spatial loops must all be outside its reduction loops and its init not decomposed; "
                f"{'loops ' + ', '.join(inner_spatial) + ' are' if inner_spatial else 'the init is'} inside: "
                "reorder the spatial loops outward")
        dtype = accumulates_in(stage.op.dtype)
        partial = Buffer(f"{stage.name}_partial", (1,), dtype, "local")
        result = Buffer(f"{stage.name}_reduced", (1,), dtype, "local") if across_threads else partial
        here = (const(0),)
        accumulate = Store(partial, here, _combine(combiner, TensorRead(partial, here), source))
        body = seq([Store(partial, here, reduction_identity(combiner, dtype)),
                    self._nest(stage, b, leaves[first_reduce:], _guard(accumulate, all_guards)),
                    ThreadAllReduce(combiner, TensorRead(partial, here), result, here) if across_threads else None,
                    _guard(Store(target.tensor, target.indices, TensorRead(result, here)), spatial_guards)])
        body = Allocate(result, body) if across_threads else body
        return self._nest(stage, b, leaves[:first_reduce], Allocate(partial, body))

    def _cross_block_nest(self, stage: Stage, b: StageBounds, target: TensorRead, combiner: str, source: Expr,
                          all_guards: list[Expr]) -> Stmt:
        """A reduction whose loop is bound to ``blockIdx`` (split-K): each block adds its partial
        into the output atomically, and the output is zeroed before the kernel, since no
        block can wait for the others to initialize it."""
        where = f"block {stage.name} reduces across GPU blocks (a reduction loop bound to blockIdx)"
        dtype = stage.op.dtype
        if combiner != "sum" or dtype not in ATOMIC_DTYPES:
            raise LoweringError(f"{where}, which needs a sum of {', '.join(ATOMIC_DTYPES)} (what GPU atomics add); "
                                f"it is a {combiner} of {dtype}: bind only spatial loops to blockIdx")
        readers = self.state.consumers_of(stage.name)
        if target.tensor.scope != "arg" or readers or stage.init_loop is not None:
            why = (f"block {readers[0].name} reads it in the same kernel" if readers else
                   "its init is decomposed" if stage.init_loop is not None else "it is not an output of the kernel")
            raise LoweringError(f"{where}, so its result is whole only when the kernel ends; but {why}: bind only "
                                "spatial loops to blockIdx, or make this block the kernel's last")
        self.zeroed.add(stage.tensor)
        return self._nest(stage, b, list(stage.leaves),
                          _guard(AtomicAdd(target.tensor, target.indices, _cast_to(source, dtype)), all_guards))

    def _plain_nest(self, stage: Stage, b: StageBounds, leaves: list[int], body: Stmt) -> Stmt:
        for leaf in reversed(leaves):
            kind = _for_kind(stage.loop(leaf).annotation)
            kind = "tensor_core" if dict(stage.loop(leaf).pragmas).get("tensor_core") else kind
            body = For(b.loop_var[leaf], b.loop_extent[leaf], "serial" if kind == "parallel" else kind, body)
        return body

    def _nest(self, stage: Stage, b: StageBounds, leaves: list[int], body: Stmt) -> Stmt:
        for leaf in reversed(leaves):
            loop = stage.loop(leaf)
            before = self._attached_nests(self._attached(stage, leaf, reverse=False))
            consumers = self._attached(stage, leaf, reverse=True)
            after = self._attached_nests(consumers)
            if stage.scope == "shared" and any(stage.tensor in s.op.input_tensors for s in consumers):
                # consumers of the tile this block's threads stored together wait for all of them; where the
                # loop repeats within a block, the next step's stores wait for the reads too
                again = [] if loop.annotation.startswith("blockIdx") else [Barrier()]
                after = [Barrier(), *after, *again]
            inner = self._allocate(leaf, seq(before + [body] + after))
            pragmas, kind = dict(loop.pragmas), _for_kind(loop.annotation)
            if kind == "serial" and pragmas.get("software_pipeline", 0) >= 2:
                kind = "pipeline"  # double-buffered by software_pipeline once the loop nest is whole
            if pragmas.get("tensor_core"):
                kind = "tensor_core"  # a warp's tensor-core operation, made by tensorize
            unroll = pragmas.get("pragma_auto_unroll_max_step", 0)
            body = For(b.loop_var[leaf], b.loop_extent[leaf], kind, inner, unroll)
        return body

    def _attached_nests(self, stages: list[Stage]) -> list[Stmt]:
        """The nests of stages attached at one loop. Those that fill shared memory run between
        barriers, so that no thread overwrites what another still reads, nor reads before all
        have written; fills in a row that read nothing another of them writes (a matmul's two
        tiles) share one pair, where a pair each gave a block three barriers a step."""
        groups: list[list[Stage]] = []  # a run of fills, or one other stage
        for stage in stages:
            last = groups[-1] if groups else None
            if last and stage.scope == last[0].scope == "shared" \
                    and not {f.tensor for f in last} & set(stage.op.input_tensors):
                last.append(stage)
            else:
                groups.append([stage])
        return [seq([Barrier(), *map(self.stage_nest, group), Barrier()]) if group[0].scope == "shared"
                else self.stage_nest(group[0]) for group in groups]

    def _attached(self, stage: Stage, leaf: int, reverse: bool) -> list[Stage]:
        return [s for s in self.state.stages
                if s.attach and s.attach.stage == stage.name and s.attach.loop == leaf and s.attach.reverse == reverse]

    def _allocate(self, loop: int | None, body: Stmt) -> Stmt:
        for buffer in reversed(self.alloc_at.get(loop, [])):
            body = Allocate(buffer, body)
        return body

    def run(self) -> LoweredFunc:
        roots = [self.stage_nest(s) for s in self.state.stages if s.attach is None]
        body = self._allocate(None, seq(roots))
        body = inject_virtual_threads(software_pipeline(tensorize(_simplify_stmt(body, self.ranges))))
        arg_buffers = tuple(self.args.values())
        written = {self.buffers[s.tensor] for s in self.state.stages}
        user_args = tuple(Buffer(t.name, t.shape, t.dtype, "arg") for t in self.sch.dag.tensors)
        packs = tuple(self._pack_func(p, user_args) for p in self.state.packed)
        zeroed = {self.buffers[t] for t in self.zeroed}
        return LoweredFunc(self.name, arg_buffers, body, tuple(b in written for b in arg_buffers), packs, user_args,
                           tuple(b in zeroed for b in arg_buffers) if zeroed else ())

    def _pack_func(self, packed, user_args) -> PackFunc:
        index = [t for t in self.sch.dag.tensors].index(packed.source)
        source = user_args[index]
        target = self.args[packed.packed]
        variables = [Var(v.name) for v in packed.source_vars]
        mapping = dict(zip(packed.source_vars, variables))
        dst = tuple(substitute(t, mapping) for t in packed.index_map)
        body: Stmt = Store(target, dst, TensorRead(source, tuple(variables)))
        ranges = dict(zip(variables, source.shape))
        for n, (var, extent) in enumerate(reversed(list(zip(variables, source.shape)))):
            body = For(var, extent, "parallel" if n == len(variables) - 1 else "serial", body)
        if math.prod(target.shape) > math.prod(source.shape):  # the packed layout has holes: zero them
            fill_vars = tuple(Var(f"p{d}") for d in range(len(target.shape)))
            fill: Stmt = Store(target, fill_vars, const(0, target.dtype) if target.dtype != "bool" else const(False))
            for var, extent in reversed(list(zip(fill_vars, target.shape))):
                fill = For(var, extent, "serial", fill)
            ranges.update(zip(fill_vars, target.shape))
            body = seq([fill, body])
        return PackFunc(f"pack_{source.name}", source, target, _simplify_stmt(body, ranges), index)


def lower(sch, name: str = "default_function") -> LoweredFunc:
    """The loop nest of a schedule, after bound inference and index simplification.

    The passes are those of this module's docstring: infer the region every block
    computes, place each intermediate buffer at the deepest loop enclosing its producer
    and consumers, build the loop nests, and simplify indices and guards. Block
    annotations (``Schedule.annotate`` on a block) are realized first, on a copy.
    ``print(tc.lower(sch))`` shows the result as readable pseudo-code.

    Args:
        sch: The schedule.
        name: The name of the function.

    Returns:
        The lowered function: its arguments (the DAG's tensors), buffers and loop nest.

    Raises:
        LoweringError: If the schedule cannot be turned into a loop nest.

    Example:
        ::

            print(tc.lower(sch))   # ...  for i_0 in range(8) parallel:  ...
    """
    from ..schedule.postproc import apply_block_annotations

    return _Lowering(apply_block_annotations(sch), name).run()


def _for_kind(annotation: str) -> str:
    return _KIND.get(annotation, annotation)  # a GPU axis names itself


def _combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    value = _cast_to(value, acc.dtype)
    if combiner == "sum":
        return binary("add", acc, value)
    return binary(combiner, acc, value)


def _cast_to(value: Expr, dtype: str) -> Expr:
    return value if value.dtype == dtype else Cast(dtype, value)


def _guard(stmt: Stmt, conditions: list[Expr]) -> Stmt:
    conditions = list(dict.fromkeys(conditions))  # drop repeats, keep order
    if not conditions:
        return stmt
    cond = conditions[0]
    for c in conditions[1:]:
        cond = Logical("and", cond, c)
    return IfThenElse(cond, stmt)


def _simplify_stmt(stmt: Stmt, ranges: dict) -> Stmt:
    ranges = dict(ranges)
    # only a loop whose variable some select compares with a constant can be cut: the other
    # loops' bodies are not searched (a padding's selects compare too, but in conjunctions)
    in_selects = {cond.a for cond in (simplify(s.cond, ranges) for s in _selects(stmt)) if _is_cut(cond)}

    def visit(node: Stmt) -> Stmt | None:
        if isinstance(node, For) and node.var in in_selects and (points := _partition_points(node, ranges)):
            ends = [0, *points, node.extent]
            pieces = [For(node.var, end - start, node.kind, substitute_stmt(node.body, {
                node.var: binary("add", node.var, const(start))}) if start else node.body, node.unroll_max_step)
                for start, end in zip(ends, ends[1:])]
            return seq([piece for piece in map(visit, pieces) if piece is not None])
        if isinstance(node, For):
            ranges[node.var] = node.extent
            body = visit(node.body)
            return None if body is None else For(node.var, node.extent, node.kind, body, node.unroll_max_step)
        if isinstance(node, (Store, AtomicAdd)):
            return type(node)(node.buffer, tuple(simplify(i, ranges) for i in node.indices),
                              _fold_selects(simplify(node.value, ranges), ranges))
        if isinstance(node, IfThenElse):
            cond = _simplify_condition(node.cond, ranges)
            then = visit(node.then)
            if isinstance(cond, Const):
                return then if cond.value else None
            return None if then is None else IfThenElse(cond, then)
        if isinstance(node, Seq):
            return seq([s for s in (visit(s) for s in node.stmts) if s is not None]) if node.stmts else None
        if isinstance(node, Allocate):
            body = visit(node.body)
            return None if body is None else Allocate(node.buffer, body)
        return node

    return visit(stmt)


def _selects(stmt: Stmt) -> list[Select]:
    """Every select of the values ``stmt`` stores."""
    found: list[Select] = []
    for node in walk_stmts(stmt):
        if isinstance(node, Store):
            walk(node.value, lambda e: found.append(e) if isinstance(e, Select) else None)
    return found


def _partition_points(loop: For, ranges: dict) -> list[int]:
    """Where a loop's selects change side: the ``c`` of each ``select(i < c, ...)`` on the loop's
    own variable inside it (0 < c < extent), for the serial, unrolled and vector loops. Cut
    there (TVM's LoopPartition), each piece reads one source and its selects fold away: a
    concatenation's vector loop over its channels copies each input with whole vectors."""
    if loop.kind not in ("serial", "unroll", "vectorize"):
        return []
    conds = (simplify(select.cond, ranges) for select in _selects(loop.body))
    return sorted({int(c.b.value) for c in conds if _is_cut(c) and c.a == loop.var and 0 < c.b.value < loop.extent})


def _is_cut(cond: Expr) -> bool:
    """Whether ``cond`` is ``variable < constant``, where a loop over the variable may be cut."""
    return isinstance(cond, Compare) and cond.op == "lt" and isinstance(cond.a, Var) and isinstance(cond.b, Const)


def _fold_selects(expr: Expr, ranges: dict) -> Expr:
    """``expr`` with every select whose condition the loop ranges decide replaced by its side."""
    def fold(e: Expr) -> Expr:
        if isinstance(e, Select):
            cond = _simplify_condition(e.cond, ranges)
            if isinstance(cond, Const):
                return fold(e.true_value if cond.value else e.false_value)
        return map_children(e, fold)

    return fold(expr)


def _simplify_condition(cond: Expr, ranges: dict) -> Expr:
    if isinstance(cond, Logical) and cond.op == "and":
        a, b = _simplify_condition(cond.a, ranges), _simplify_condition(cond.b, ranges)
        if a == b:
            return a
        if isinstance(a, Const):
            return b if a.value else a
        if isinstance(b, Const):
            return a if b.value else b
        return Logical("and", a, b)
    if isinstance(cond, Compare) and cond.op == "lt":
        span = bounds(simplify(binary("sub", cond.a, cond.b), ranges), ranges)
        if span is not None and span[1] < 0:
            return const(True)
        if span is not None and span[0] >= 0:
            return const(False)
    return simplify(cond, ranges)


def laid_out(shape: tuple[int, ...], align=(), order=()) -> tuple[int, ...]:
    """The strides of a buffer of ``shape`` whose dimensions lie in memory in ``order``
    (outermost first; ``Schedule.transform_layout`` on a write) and whose strides ``align``
    pads (``Schedule.storage_align``: (axis, factor, offset) each, an axis of that order),
    innermost first as TVM pads them; () for row major."""
    order = tuple(order) or tuple(range(len(shape)))
    if not align and order == tuple(range(len(shape))):
        return ()
    wanted = {axis: (factor, offset) for axis, factor, offset in align}
    strides, stride = [0] * len(shape), 1
    for position in reversed(range(len(shape))):
        if position in wanted:
            factor, offset = wanted[position]
            stride += (offset - stride) % factor
        strides[order[position]] = stride
        stride *= shape[order[position]]
    return tuple(strides)
