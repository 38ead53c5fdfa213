"""``Schedule``: the primitives that say *how* to compute, with TVM ``tir.Schedule``'s names.

Each public method validates its arguments, builds a new immutable ``State`` (so a
failing primitive leaves the schedule unchanged) and appends a ``Step`` to the trace.
Blocks, loops and sampled values are returned as random-variable handles (``BlockRV``,
``LoopRV``, ``ExprRV``) whose symbols the trace refers to.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LoweringError, ScheduleError
from ..te.dag import ComputeDAG
from ..te.expr import Expr, TensorRead, Var, children, map_children, substitute
from ..te.tensor import ComputeOp, IterVar, PlaceholderOp, Tensor
from . import sampling
from .index_expr import index_expr_to_json
from .rfactor import check_rfactor, factor_stages
from .state import Attach, Fuse, Loop, PackedInput, Split, Stage, State, ceil_div, common_prefix, initial_stage
from .trace import IndexMap, RVRef, Step, Trace

ROOT = -1
INLINE = -2
UNROLL_PRAGMAS = ("pragma_auto_unroll_max_step", "pragma_unroll_explicit")
# parallel: fuse up to this many outer loops and run them in parallel; vectorize: the
# innermost spatial loop; the unroll pragma: on the block's outermost loop
BLOCK_ANNOTATIONS = ("meta_schedule.parallel", "meta_schedule.vectorize", "pragma_auto_unroll_max_step")


class BlockRV:
    __slots__ = ("name", "symbol")

    def __init__(self, name: str, symbol: str):
        self.name, self.symbol = name, symbol

    def __repr__(self) -> str:
        return f"BlockRV({self.name})"


class LoopRV:
    __slots__ = ("id", "symbol")

    def __init__(self, loop_id: int, symbol: str):
        self.id, self.symbol = loop_id, symbol

    def __repr__(self) -> str:
        return f"LoopRV({self.symbol})"


class ExprRV(int):
    """A sampled integer: usable as a plain int, and traced by its symbol."""

    symbol: str

    def __new__(cls, value: int, symbol: str):
        obj = super().__new__(cls, value)
        obj.symbol = symbol
        return obj


class Schedule:
    """A mutable schedule of a ``ComputeDAG``; ``sch.trace`` records how it was made."""

    def __init__(self, dag: ComputeDAG | Sequence[Tensor], seed: int | None = None):
        self.dag = dag if isinstance(dag, ComputeDAG) else ComputeDAG(dag)
        self.rng = np.random.default_rng(seed)
        outputs = set(self.dag.outputs)
        stages, next_id = [], 0
        for tensor in self.dag.compute_ops:
            stages.append(initial_stage(tensor.op, tensor, next_id, tensor in outputs))
            next_id += len(stages[-1].loops)
        self.state = State(tuple(stages), (), next_id)
        self._steps: list[Step] = []
        self._counter = 0

    # ----------------------------------------------------------------- bookkeeping
    @property
    def trace(self) -> Trace:
        return Trace(tuple(self._steps))

    def copy(self) -> Schedule:
        other = object.__new__(Schedule)
        other.dag, other.state, other._steps, other._counter = self.dag, self.state, list(self._steps), self._counter
        other.rng = np.random.default_rng(self.rng.integers(2**63))
        return other

    def _symbol(self, prefix: str) -> str:
        symbol = f"{prefix}{self._counter}"
        self._counter += 1
        return symbol

    def _record(self, kind: str, args: dict[str, Any], outputs: Sequence[Any] = (), decision: Any = None) -> None:
        encoded = tuple((k, _as_ref(v)) for k, v in args.items())
        symbols = tuple(o.symbol for o in outputs)
        self._steps.append(Step(kind, encoded, symbols, decision))

    def _stage(self, block: BlockRV | str) -> Stage:
        name = block.name if isinstance(block, BlockRV) else block
        try:
            return self.state.stage(name)
        except KeyError:
            names = ", ".join(s.name for s in self.state.stages)
            raise ScheduleError(f"no block named {name!r} in this schedule; the blocks are: {names}") from None

    def _loop(self, loop: LoopRV) -> tuple[Stage, Loop]:
        if not isinstance(loop, LoopRV):
            raise ScheduleError(f"expected a loop (from sch.get_loops or sch.split), got {loop!r}")
        try:
            stage = self.state.stage_of_loop(loop.id)
        except KeyError:
            raise ScheduleError(f"loop {loop.symbol} no longer exists: it was split, fused or inlined away") from None
        if loop.id not in stage.leaves:
            raise ScheduleError(
                f"loop {stage.loop(loop.id).name} of block {stage.name} no longer exists: it was split or fused; "
                "use the loops returned by that primitive"
            )
        return stage, stage.loop(loop.id)

    # ----------------------------------------------------------------- queries
    def get_block(self, name: str, func_name: str = "main") -> BlockRV:
        self._stage(name)
        rv = BlockRV(name, self._symbol("b"))
        self._record("get_block", {"name": name}, [rv])
        return rv

    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        ids = self.loop_path(self._stage(block).name)
        rvs = [LoopRV(i, self._symbol("l")) for i in ids]
        self._record("get_loops", {"block": block}, rvs)
        return rvs

    def loop_path(self, name: str) -> list[int]:
        """Ids of all loops around the body of block ``name``, outermost first."""
        from .bound import loop_path

        return loop_path(self.state, name)

    def loop_extent(self, loop: LoopRV) -> int:
        return self._loop(loop)[1].extent

    # ----------------------------------------------------------------- loop transformations
    def split(self, loop: LoopRV, factors: Sequence[int | None]) -> list[LoopRV]:
        stage, target = self._loop(loop)
        factors = list(factors)
        if len(factors) < 2:
            raise ScheduleError(f"split of loop {target.name} needs at least 2 factors, got {factors}")
        if sum(f is None for f in factors) > 1:
            raise ScheduleError(f"split of loop {target.name}: at most one factor may be None, got {factors}")
        for f in factors:
            if f is not None and (isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 1):
                raise ScheduleError(f"split of loop {target.name}: factors must be positive ints or None, got {factors}")
        known = math.prod(int(f) for f in factors if f is not None)
        extents = [int(f) if f is not None else ceil_div(target.extent, known) for f in factors]
        if None not in factors and math.prod(extents) < target.extent:
            raise ScheduleError(
                f"split of loop {target.name} (extent {target.extent}) by {extents}: the factors multiply to "
                f"{math.prod(extents)} < {target.extent}; use None for one factor to infer it"
            )
        state, ids = self.state.new_ids(len(factors))
        children = [Loop(i, f"{target.name}_{n}", target.kind, e) for n, (i, e) in enumerate(zip(ids, extents))]
        position = stage.leaves.index(target.id)
        new_stage = replace(
            stage,
            loops=stage.loops + tuple(children),
            relations=stage.relations + (Split(target.id, tuple(ids), tuple(extents[1:])),),
            leaves=stage.leaves[:position] + tuple(ids) + stage.leaves[position + 1:],
        )
        self.state = _move_attachments(state.with_stage(new_stage), stage.name, target.id, ids[-1])
        rvs = [LoopRV(i, self._symbol("l")) for i in ids]
        self._record("split", {"loop": loop, "factors": factors}, rvs)
        return rvs

    def fuse(self, *loops: LoopRV) -> LoopRV:
        if len(loops) == 1 and isinstance(loops[0], (list, tuple)):
            loops = tuple(loops[0])
        if len(loops) < 2:
            raise ScheduleError("fuse needs at least two loops")
        found = [self._loop(l) for l in loops]
        stage = found[0][0]
        if any(s.name != stage.name for s, _ in found):
            raise ScheduleError("fuse: all loops must belong to the same block")
        positions = [stage.leaves.index(l.id) for _, l in found]
        if positions != list(range(positions[0], positions[0] + len(loops))):
            names = ", ".join(l.name for _, l in found)
            raise ScheduleError(f"fuse of block {stage.name}: loops {names} are not adjacent and in order; reorder first")
        kinds = {l.kind for _, l in found}
        if len(kinds) > 1:
            raise ScheduleError(f"fuse of block {stage.name}: cannot fuse spatial and reduction loops together")
        for other in self.state.stages:
            if other.attach and other.attach.stage == stage.name and other.attach.loop in [l.id for _, l in found[:-1]]:
                raise ScheduleError(
                    f"fuse of block {stage.name}: block {other.name} is computed at loop "
                    f"{stage.loop(other.attach.loop).name}, which is not the innermost of the fused loops"
                )
        state, (new_id,) = self.state.new_ids(1)
        fused = Loop(new_id, "_".join(l.name for _, l in found) + "_fused", kinds.pop(),
                     math.prod(l.extent for _, l in found), pragmas=found[0][1].pragmas)
        new_stage = replace(
            stage,
            loops=stage.loops + (fused,),
            relations=stage.relations + (Fuse(tuple(l.id for _, l in found), new_id),),
            leaves=stage.leaves[: positions[0]] + (new_id,) + stage.leaves[positions[-1] + 1:],
        )
        self.state = _move_attachments(state.with_stage(new_stage), stage.name, found[-1][1].id, new_id)
        rv = LoopRV(new_id, self._symbol("l"))
        self._record("fuse", {"loops": list(loops)}, [rv])
        return rv

    def reorder(self, *loops: LoopRV) -> None:
        if len(loops) == 1 and isinstance(loops[0], (list, tuple)):
            loops = tuple(loops[0])
        found = [self._loop(l) for l in loops]
        stage = found[0][0]
        if any(s.name != stage.name for s, _ in found):
            raise ScheduleError("reorder: all loops must belong to the same block; loops of an enclosing block "
                                "cannot be reordered with the block's own loops")
        ids = [l.id for _, l in found]
        if len(set(ids)) != len(ids):
            raise ScheduleError("reorder: a loop appears twice")
        positions = sorted(stage.leaves.index(i) for i in ids)
        leaves = list(stage.leaves)
        for position, loop_id in zip(positions, ids):
            leaves[position] = loop_id
        self.state = self.state.with_stage(replace(stage, leaves=tuple(leaves)))
        self._record("reorder", {"loops": list(loops)})

    def _annotate_loop(self, kind: str, loop: LoopRV) -> None:
        stage, target = self._loop(loop)
        if kind in ("parallel", "vectorize") and target.kind != "spatial":
            raise ScheduleError(
                f"cannot {kind} loop {target.name} of block {stage.name}: it is a reduction loop, whose "
                f"iterations depend on each other; {kind} a spatial loop instead"
            )
        self.state = self.state.with_stage(stage.with_loop(replace(target, annotation=kind)))
        self._record(kind, {"loop": loop})

    def parallel(self, loop: LoopRV) -> None:
        self._annotate_loop("parallel", loop)

    def vectorize(self, loop: LoopRV) -> None:
        self._annotate_loop("vectorize", loop)

    def unroll(self, loop: LoopRV) -> None:
        self._annotate_loop("unroll", loop)

    def annotate(self, block_or_loop: BlockRV | LoopRV, ann_key: str, ann_val: int) -> None:
        """A loop pragma, or on a block an intent that lowering realizes once the block's
        final place is known (see ``postproc.py``), as MetaSchedule's annotations."""
        if isinstance(block_or_loop, BlockRV):
            if ann_key not in BLOCK_ANNOTATIONS:
                raise ScheduleError(f"annotate: unknown block annotation {ann_key!r}; known: "
                                    f"{', '.join(BLOCK_ANNOTATIONS)}")
            stage = self._stage(block_or_loop)
            annotations = tuple(a for a in stage.annotations if a[0] != ann_key) + ((ann_key, int(ann_val)),)
            self.state = self.state.with_stage(replace(stage, annotations=annotations))
            self._record("annotate", {"block_or_loop": block_or_loop, "ann_key": ann_key, "ann_val": ann_val})
            return
        if not isinstance(block_or_loop, LoopRV):
            raise ScheduleError(f"annotate: expected a block or a loop, got {block_or_loop!r}")
        if ann_key not in UNROLL_PRAGMAS:
            raise ScheduleError(f"annotate: unknown annotation {ann_key!r}; known: {', '.join(UNROLL_PRAGMAS)}")
        stage, target = self._loop(block_or_loop)
        pragmas = tuple(p for p in target.pragmas if p[0] != ann_key) + ((ann_key, int(ann_val)),)
        self.state = self.state.with_stage(stage.with_loop(replace(target, pragmas=pragmas)))
        self._record("annotate", {"block_or_loop": block_or_loop, "ann_key": ann_key, "ann_val": ann_val})

    # ----------------------------------------------------------------- compute location
    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        stage = self._stage(block)
        if isinstance(loop, LoopRV) and loop.id == ROOT:
            self.state = self.state.with_stage(replace(stage, attach=None))
        elif isinstance(loop, LoopRV) and loop.id == INLINE:
            self._inline(stage)
        else:
            self.state = self._attach(stage, loop, reverse=False)
        self._record("compute_at", {"block": block, "loop": loop})

    def reverse_compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        self.state = self._attach(self._stage(block), loop, reverse=True)
        self._record("reverse_compute_at", {"block": block, "loop": loop})

    def _attach(self, stage: Stage, loop: LoopRV, reverse: bool) -> State:
        owner, target = self._loop(loop)
        primitive = "reverse_compute_at" if reverse else "compute_at"
        if owner.name == stage.name:
            raise ScheduleError(f"{primitive}: block {stage.name} cannot be moved under its own loop {target.name}")
        chain = owner
        while chain.attach is not None:
            if chain.attach.stage == stage.name:
                raise ScheduleError(f"{primitive}: loop {target.name} belongs to block {owner.name}, which is itself "
                                    f"computed inside block {stage.name}; that would be a cycle, so first move "
                                    f"{owner.name} back to the root (compute_at with the root location)")
            chain = self.state.stage(chain.attach.stage)
        if reverse:
            producers = self.state.producers_of(stage)
            if not producers:
                raise ScheduleError(f"reverse_compute_at: block {stage.name} reads no other block's output")
            anchor = producers[-1]
            _check_identity_reads(stage, anchor)
            path = self.loop_path(anchor.name)
            if target.id not in path:
                raise ScheduleError(f"reverse_compute_at: loop {target.name} does not enclose block {anchor.name}, "
                                    f"the producer of {stage.name}")
            # The consumer runs after the whole body of ``target``: reduction loops below it finish
            # first, but a reduction loop enclosing it (or ``target`` itself) would expose partial sums.
            outer = path[: path.index(target.id) + 1]
            reduce_inside = [i for i in outer if anchor.has_loop(i) and anchor.loop(i).kind != "spatial"]
            if reduce_inside:
                raise ScheduleError(
                    f"reverse_compute_at: loop {target.name} is inside reduction loop "
                    f"{anchor.loop(reduce_inside[0]).name} of block {anchor.name}, so block {stage.name} would read "
                    "unfinished partial sums; choose a loop outside all reduction loops"
                )
        else:
            if stage.is_output:
                raise ScheduleError(f"compute_at: block {stage.name} writes an output; use reverse_compute_at "
                                    "to move a consumer into its producer instead")
            consumers = self.state.consumers_of(stage.name)
            outside = [c.name for c in consumers if target.id not in self.loop_path(c.name)]
            if outside:
                raise ScheduleError(
                    f"compute_at: loop {target.name} does not enclose block {', '.join(outside)}, which reads "
                    f"{stage.name}, so the values would not be there when read; choose a loop that encloses "
                    f"every consumer ({', '.join(c.name for c in consumers)})"
                )
        state = self.state.with_stage(replace(stage, attach=Attach(owner.name, target.id, reverse)))
        from .bound import refresh_extents

        try:
            return refresh_extents(state, stage.name)
        except LoweringError as error:  # the new location has no region the block can compute
            raise ScheduleError(f"{primitive} of block {stage.name} at loop {target.name}: {error}") from None

    def _holds_others(self, stage: Stage) -> bool:
        """Whether other blocks are computed at loops of ``stage``."""
        return any(s.attach and s.attach.stage == stage.name for s in self.state.stages)

    def compute_inline(self, block: BlockRV) -> None:
        self._inline(self._stage(block))
        self._record("compute_inline", {"block": block})

    def _inline(self, stage: Stage) -> None:
        if stage.is_output:
            raise ScheduleError(f"compute_inline: block {stage.name} writes an output of the computation; "
                                "only intermediate blocks can be inlined")
        if stage.is_reduction:
            raise ScheduleError(f"compute_inline: block {stage.name} is a reduction; only element-wise blocks "
                                "can be inlined (use compute_at instead)")
        if self._holds_others(stage):
            raise ScheduleError(f"compute_inline: other blocks are computed at loops of {stage.name}; move them first")
        consumers = self.state.consumers_of(stage.name)
        for producer in self.state.stages:
            if producer.attach and any(t is producer.tensor for t in stage.op.input_tensors) and (
                    len(consumers) > 1 or (consumers and producer.attach.reverse is False
                                           and producer.attach.stage != consumers[0].name
                                           and producer.attach.loop not in self.loop_path(consumers[0].name))):
                raise ScheduleError(
                    f"compute_inline: block {stage.name} reads {producer.name}, which is computed at a loop; inlining "
                    f"would make {producer.name} read where it is not computed; move {producer.name} to the root first"
                )
        params = [iv.var for iv in stage.op.axis]

        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and node.tensor is stage.tensor:
                indices = [rewrite(i) for i in node.indices]
                return substitute(stage.op.body, dict(zip(params, indices)))
            return map_children(node, rewrite)

        stages = []
        for other in self.state.stages:
            if other.name == stage.name:
                continue
            if any(t is stage.tensor for t in other.op.input_tensors):
                other = replace(other, op=_with_body(other.op, rewrite(other.op.body)))
            stages.append(other)
        self.state = replace(self.state, stages=tuple(stages))

    def reverse_compute_inline(self, block: BlockRV) -> None:
        consumer = self._stage(block)
        producers = self.state.producers_of(consumer)
        if len(producers) != 1 or consumer.is_reduction:
            raise ScheduleError(f"reverse_compute_inline: block {consumer.name} must be element-wise and read "
                                f"exactly one other block's output (it reads {len(producers)})")
        producer = producers[0]
        if producer.is_reduction or len(self.state.consumers_of(producer.name)) != 1:
            raise ScheduleError(f"reverse_compute_inline: producer {producer.name} must be element-wise with "
                                f"{consumer.name} as its only consumer")
        _check_identity_reads(consumer, producer)
        axis_map = {c.var: p.var for c, p in zip(consumer.op.axis, producer.op.axis)}

        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and node.tensor is producer.tensor:
                return producer.op.body
            return map_children(node, rewrite)

        body = rewrite(substitute(consumer.op.body, axis_map))
        merged = replace(producer, op=ComputeOp(producer.op.name, producer.op.axis, body, consumer.op.dtype,
                                                producer.op.attrs),
                         tensor=consumer.tensor, is_output=consumer.is_output)
        stages = tuple(merged if s.name == producer.name else s for s in self.state.stages if s.name != consumer.name)
        self.state = replace(self.state, stages=stages)
        self._record("reverse_compute_inline", {"block": block})

    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        stage = self._stage(block)
        owner, target = self._loop(loop)
        if not stage.is_reduction:
            raise ScheduleError(f"decompose_reduction: block {stage.name} is not a reduction")
        if owner.name != stage.name:
            raise ScheduleError(f"decompose_reduction: loop {target.name} is not a loop of block {stage.name}")
        first_reduce = next(i for i, l in enumerate(stage.leaves) if stage.loop(l).kind != "spatial")
        if stage.leaves.index(target.id) > first_reduce:
            raise ScheduleError(
                f"decompose_reduction: loop {target.name} is inside reduction loop "
                f"{stage.loop(stage.leaves[first_reduce]).name}; the init must be placed at or above it"
            )
        self.state = self.state.with_stage(replace(stage, init_loop=target.id))
        rv = BlockRV(f"{stage.name}_init", self._symbol("b"))
        self._record("decompose_reduction", {"block": block, "loop": loop}, [rv])
        return rv

    def rfactor(self, loop: LoopRV, factor_axis: int = 0) -> BlockRV:
        """Factor the reduction over ``loop`` into a new block ``<name>_rf`` whose output has
        that loop as an extra axis at ``factor_axis``; the block then reduces over that axis
        (see ``rfactor.py``). The rf block keeps the block's loops, ``loop`` now spatial."""
        stage, target = self._loop(loop)
        attached = [s for s in self.state.stages if s.attach and s.attach.stage == stage.name]
        check_rfactor(stage, target, attached, factor_axis)
        self._check_new_name(f"{stage.name}_rf")
        state, ids = self.state.new_ids(len(stage.op.axis) + 1)  # the block's new loops
        rf_stage, reduced = factor_stages(stage, target, int(factor_axis), ids[0])
        stages = []
        for s in state.stages:
            stages += [rf_stage, reduced] if s.name == stage.name else [s]
        self.state = replace(state, stages=tuple(stages))
        rv = BlockRV(rf_stage.name, self._symbol("b"))
        self._record("rfactor", {"loop": loop, "factor_axis": factor_axis}, [rv])
        return rv

    # ----------------------------------------------------------------- caches and layout
    def cache_write(self, block: BlockRV, write_buffer_index: int = 0, storage_scope: str = "local") -> BlockRV:
        stage = self._stage(block)
        if write_buffer_index != 0:
            raise ScheduleError(f"cache_write: block {stage.name} writes one buffer; write_buffer_index must be 0")
        if storage_scope not in ("local", "global"):
            raise ScheduleError(f"cache_write: storage_scope {storage_scope!r} is not supported on CPU; use 'local'")
        name = f"{stage.name}_{storage_scope}"
        self._check_new_name(name)
        cache = Tensor(ComputeOp(name, stage.op.axis, stage.op.body, stage.op.dtype, stage.op.attrs))
        axes = tuple(IterVar(Var(iv.name), iv.extent, "spatial") for iv in stage.op.axis)
        copy_op = ComputeOp(name, axes, TensorRead(cache, tuple(iv.var for iv in axes)), stage.op.dtype)
        state, first = self.state.new_ids(len(axes))
        copy = replace(initial_stage(copy_op, stage.tensor, first[0], stage.is_output), name=name)
        computing = replace(stage, tensor=cache, scope=storage_scope, is_output=False)
        stages = []
        for s in state.stages:
            if s.name == stage.name:
                stages += [computing, copy]
            else:
                stages.append(s)
        self.state = replace(state, stages=tuple(stages))
        rv = BlockRV(name, self._symbol("b"))
        self._record("cache_write", {"block": block, "write_buffer_index": write_buffer_index,
                                     "storage_scope": storage_scope}, [rv])
        return rv

    def cache_read(self, block: BlockRV, read_buffer_index: int, storage_scope: str = "local") -> BlockRV:
        stage = self._stage(block)
        reads = stage.op.input_tensors
        if not 0 <= read_buffer_index < len(reads):
            raise ScheduleError(f"cache_read: block {stage.name} reads {len(reads)} buffers "
                                f"({', '.join(t.name for t in reads)}); index {read_buffer_index} is out of range")
        source = reads[read_buffer_index]
        name = f"{source.name}_{storage_scope}"
        self._check_new_name(name)
        axes = tuple(IterVar(Var(f"ax{d}"), n, "spatial") for d, n in enumerate(source.shape))
        cached = Tensor(ComputeOp(name, axes, TensorRead(source, tuple(iv.var for iv in axes)), source.dtype))
        state, first = self.state.new_ids(len(axes))
        new_stage = replace(initial_stage(cached.op, cached, first[0], False), scope=storage_scope)

        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and node.tensor is source:
                return TensorRead(cached, tuple(rewrite(i) for i in node.indices))
            return map_children(node, rewrite)

        reader = replace(stage, op=_with_body(stage.op, rewrite(stage.op.body)))
        stages = []
        for s in state.stages:
            if s.name == stage.name:
                stages += [new_stage, reader]
            else:
                stages.append(s)
        self.state = replace(state, stages=tuple(stages))
        rv = BlockRV(name, self._symbol("b"))
        self._record("cache_read", {"block": block, "read_buffer_index": read_buffer_index,
                                    "storage_scope": storage_scope}, [rv])
        return rv

    def transform_layout(self, block: BlockRV, buffer: Sequence, index_map: Callable | IndexMap) -> None:
        stage = self._stage(block)
        source = self._layout_free_read(stage, buffer, "transform_layout")
        index_map = _as_index_map(index_map, source)
        self._pack(source, index_map)
        self._record("transform_layout", {"block": block, "buffer": list(buffer), "index_map": index_map})

    def rewrite_layout(self, block: BlockRV, buffer: Sequence) -> None:
        """Pack a layout-free input in the order the block's loops read it (see ``layout.py``);
        replayed with other tile sizes, the layout follows them."""
        from .layout import tiled_layout

        stage = self._stage(block)
        source = self._layout_free_read(stage, buffer, "rewrite_layout")
        self._pack(source, tiled_layout(stage, source))
        self._record("rewrite_layout", {"block": block, "buffer": list(buffer)})

    def _layout_free_read(self, stage: Stage, buffer: Sequence, primitive: str) -> Tensor:
        kind, index = buffer
        reads = stage.op.input_tensors
        if kind != "read" or not 0 <= index < len(reads):
            raise ScheduleError(f"{primitive}: buffer must be ('read', i) with i < {len(reads)} for block "
                                f"{stage.name}, got {tuple(buffer)}")
        source = reads[index]
        layout_free = [t for s in self.dag.compute_ops for t in s.op.attrs.get("layout_free_placeholders", [])]
        if not isinstance(source.op, PlaceholderOp) or not any(t is source for t in layout_free):
            raise ScheduleError(
                f"{primitive}: {source.name} is not a layout-free placeholder, so its layout belongs to the "
                f"caller; mark it with attrs={{'layout_free_placeholders': [{source.name}]}} in te.compute"
            )
        if any(p.source is source for p in self.state.packed):
            raise ScheduleError(f"{primitive}: {source.name} was already transformed")
        return source

    def _pack(self, source: Tensor, index_map: IndexMap) -> None:
        variables = tuple(Var(name) for name in index_map.params)
        targets = index_map(*variables)
        from ..te.arith import bounds as index_bounds

        ranges = dict(zip(variables, source.shape))
        bounds = [index_bounds(t, ranges) for t in targets]
        if any(b is None or b[0] < 0 for b in bounds):
            raise ScheduleError(f"transform_layout of {source.name}: the map {index_map.to_python()} must give "
                                "non-negative indices built from + - * // %")
        packed_shape = tuple(b[1] + 1 for b in bounds)
        packed = Tensor(PlaceholderOp(f"{source.name}_packed", packed_shape, source.dtype))

        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and node.tensor is source:
                indices = tuple(rewrite(i) for i in node.indices)
                return TensorRead(packed, tuple(substitute(t, dict(zip(variables, indices))) for t in targets))
            return map_children(node, rewrite)

        stages = tuple(replace(s, op=_with_body(s.op, rewrite(s.op.body))) if any(t is source for t in s.op.input_tensors)
                       else s for s in self.state.stages)
        entry = PackedInput(source, packed, variables, targets)
        self.state = replace(self.state, stages=stages, packed=self.state.packed + (entry,))

    def _check_new_name(self, name: str) -> None:
        if any(s.name == name for s in self.state.stages):
            raise ScheduleError(f"a block named {name} already exists; a block can be cached or factored only once")

    # ----------------------------------------------------------------- sampling
    def sample_perfect_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16,
                            decision: Sequence[int] | None = None) -> list[ExprRV]:
        stage, target = self._loop(loop)
        if decision is None:
            decision = sampling.sample_perfect_tile(self.rng, target.extent, n, max_innermost_factor)
        decision = tuple(int(d) for d in decision)
        if len(decision) != n or math.prod(decision) != target.extent or decision[-1] > max_innermost_factor:
            raise ScheduleError(
                f"sample_perfect_tile of loop {target.name} (extent {target.extent}): decision {list(decision)} must "
                f"be {n} factors multiplying to {target.extent} with the innermost at most {max_innermost_factor}"
            )
        rvs = [ExprRV(d, self._symbol("v")) for d in decision]
        self._record("sample_perfect_tile", {"loop": loop, "n": n, "max_innermost_factor": max_innermost_factor},
                     rvs, decision)
        return rvs

    def sample_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16,
                    decision: Sequence[int] | None = None) -> list[ExprRV]:
        """Like ``sample_perfect_tile``, but the innermost factor may also not divide the
        extent: the factors then multiply to the extent rounded up to a multiple of it,
        and the split guards the partial last tile (``sampling.padded_factorizations``)."""
        stage, target = self._loop(loop)
        if decision is None:
            decision = sampling.sample_tile(self.rng, target.extent, n, max_innermost_factor)
        decision = tuple(int(d) for d in decision)
        if decision not in sampling.tile_factorizations(target.extent, n, max_innermost_factor):
            raise ScheduleError(
                f"sample_tile of loop {target.name} (extent {target.extent}): decision {list(decision)} must be "
                f"{n} factors, the innermost at most {max_innermost_factor}, multiplying to {target.extent} or "
                f"to {target.extent} rounded up to a multiple of the innermost"
            )
        rvs = [ExprRV(d, self._symbol("v")) for d in decision]
        self._record("sample_tile", {"loop": loop, "n": n, "max_innermost_factor": max_innermost_factor},
                     rvs, decision)
        return rvs

    def sample_categorical(self, candidates: Sequence[int], probs: Sequence[float],
                           decision: int | None = None) -> ExprRV:
        candidates, probs = [int(c) for c in candidates], [float(p) for p in probs]
        if len(candidates) != len(probs) or not candidates:
            raise ScheduleError("sample_categorical: candidates and probs must be non-empty and of equal length")
        if decision is None:
            weights = np.asarray(probs) / sum(probs)
            decision = int(self.rng.choice(len(candidates), p=weights))
        if not 0 <= decision < len(candidates):
            raise ScheduleError(f"sample_categorical: decision {decision} is not an index into {candidates}")
        rv = ExprRV(candidates[decision], self._symbol("v"))
        self._record("sample_categorical", {"candidates": candidates, "probs": probs}, [rv], int(decision))
        return rv

    def compute_location_candidates(self, block: BlockRV) -> list[int]:
        """Decisions ``sample_compute_location`` may take: root, inline (unless it is a
        reduction, an output or holds blocks computed at its loops), or the id of a loop that
        encloses all the block's consumers."""
        stage = self._stage(block)
        candidates = [ROOT]
        if not stage.is_reduction and not stage.is_output and not self._holds_others(stage):
            candidates.append(INLINE)
        if not stage.is_output:
            candidates += common_prefix([self.loop_path(c.name) for c in self.state.consumers_of(stage.name)])
        return candidates

    def sample_compute_location(self, block: BlockRV, decision: int | None = None) -> LoopRV:
        """A loop of the block's consumer to compute it at, or root (``decision`` -1) or inline (-2)."""
        stage = self._stage(block)
        candidates = self.compute_location_candidates(block)
        if decision is None:
            decision = candidates[int(self.rng.integers(len(candidates)))]
        if decision not in candidates:
            raise ScheduleError(f"sample_compute_location of {stage.name}: {decision} is not a candidate location")
        rv = LoopRV(int(decision), self._symbol("l"))
        self._record("sample_compute_location", {"block": block}, [rv], int(decision))
        return rv

    # ----------------------------------------------------------------- display
    def __str__(self) -> str:
        """The steps that made this schedule, as Python; ``tc.lower(sch)`` shows its loop nest."""
        return str(self.trace)


def _as_ref(value: Any) -> Any:
    if isinstance(value, (BlockRV, LoopRV, ExprRV)):
        return RVRef(value.symbol)
    if isinstance(value, (list, tuple)):
        return tuple(_as_ref(v) for v in value)
    return value


def _with_body(op: ComputeOp, body: Expr) -> ComputeOp:
    return ComputeOp(op.name, op.axis, body, op.dtype, op.attrs)


def _as_index_map(index_map: Callable | IndexMap, source: Tensor) -> IndexMap:
    if isinstance(index_map, IndexMap):
        return index_map
    import inspect

    params = tuple(inspect.signature(index_map).parameters)
    if len(params) != source.ndim:
        raise ScheduleError(f"transform_layout: the map takes {len(params)} indices but {source.name} has "
                            f"{source.ndim} dimensions")
    variables = [Var(p) for p in params]
    targets = index_map(*variables)
    targets = targets if isinstance(targets, (tuple, list)) else (targets,)
    from ..te.expr import convert

    names = {v: v.name for v in variables}
    return IndexMap(params, tuple(index_expr_to_json(convert(t), names) for t in targets))


def _check_identity_reads(consumer: Stage, producer: Stage) -> None:
    axes = [iv.var for iv in consumer.op.axis]
    bad = []

    def visit(node: Expr) -> None:
        if isinstance(node, TensorRead) and node.tensor is producer.tensor:
            if list(node.indices) != axes:
                bad.append(node)
        for child in children(node):
            visit(child)

    visit(consumer.op.body)
    if bad:
        raise ScheduleError(
            f"block {consumer.name} reads {producer.tensor.name} at {bad[0]}, not element-wise at its own indices; "
            "only element-wise consumers can be moved into or inlined into their producer"
        )


def _move_attachments(state: State, stage_name: str, old_loop: int, new_loop: int) -> State:
    """Blocks computed at a loop that was split or fused move to the innermost new loop."""
    for other in state.stages:
        if other.attach and other.attach.stage == stage_name and other.attach.loop == old_loop:
            state = state.with_stage(replace(other, attach=replace(other.attach, loop=new_loop)))
    return state
