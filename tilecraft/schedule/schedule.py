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
from ..te.expr import (Binary, Compare, Const, Expr, Logical, Reduce, Select, TensorRead, Var, binary, children, const,
                       free_vars, map_children, substitute, walk)
from ..te.tensor import ComputeOp, IterVar, PlaceholderOp, Tensor
from . import sampling
from .index_expr import index_expr_to_json
from .rfactor import check_rfactor, factor_stages
from .state import (Attach, Fuse, Loop, PackedInput, Split, Stage, State, ceil_div, common_prefix,
                    initial_stage, root_loops_of)
from .trace import IndexMap, RVRef, Step, Trace

ROOT = -1
INLINE = -2
# on a loop: unrolling; software_pipeline 2: double-buffer the shared tiles its steps fill (ir/pipeline.py)
LOOP_PRAGMAS = ("pragma_auto_unroll_max_step", "pragma_unroll_explicit", "software_pipeline", "tensor_core")
# parallel: fuse up to this many outer loops and run them in parallel; vectorize: the
# innermost spatial loop; the unroll pragma: on the block's outermost loop
BLOCK_ANNOTATIONS = ("meta_schedule.parallel", "meta_schedule.vectorize", "pragma_auto_unroll_max_step",
                     "meta_schedule.cooperative_fetch")
THREAD_AXES = tuple(f"{kind}.{axis}" for kind in ("blockIdx", "threadIdx", "vthread") for axis in "xyz")
# local: registers or a small array at the loop the block ends up under; shared: a GPU
# block's shared memory, filled by its threads together; global: a whole tensor
STORAGE_SCOPES = ("local", "shared", "global")
_REDUCTION_BINDING = {"vthread": "virtual threads keep separate accumulators",
                      "threadIdx": "threads combine a reduction's partials along threadIdx.x only; bind it to x"}


class BlockRV:
    """A handle to a block (one compute op, named as its output tensor) of a schedule.

    Attributes:
        name: The block's name, as ``get_block`` takes it.
        symbol: The name the trace gives the handle (``b0``, ``b1``, ...).
    """

    __slots__ = ("name", "symbol")

    def __init__(self, name: str, symbol: str):
        self.name, self.symbol = name, symbol

    def __repr__(self) -> str:
        return f"BlockRV({self.name})"


class LoopRV:
    """A handle to a loop of a schedule. It stays valid until the loop is split, fused or
    inlined away; a primitive given a stale handle raises ``ScheduleError``.

    Attributes:
        id: The loop's id in the loop state.
        symbol: The name the trace gives the handle (``l0``, ``l1``, ...).
    """

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
    """A mutable schedule of a ``ComputeDAG``, changed by TVM ``tir.Schedule``'s primitives.

    Every compute op of the DAG is a block, named as its output tensor; a block's loops
    start as the op's axes, spatial ones first, then reduction ones. Each primitive checks
    its arguments and builds a new immutable loop state, so one that raises
    ``ScheduleError`` leaves the schedule as it was. Every primitive and sampling decision
    is appended to ``trace``, which replays on a fresh schedule, with other decisions if
    asked. ``str(sch)`` prints the trace as Python; ``tc.lower(sch)`` shows the loop nest.

    Args:
        dag: The computation to schedule, or its tensors (placeholders and outputs, in the
            kernel's argument order), from which a ``ComputeDAG`` is made.
        seed: Seed of the generator the sampling primitives draw from when given no
            decision; None draws a fresh one.

    Attributes:
        dag: The ``ComputeDAG`` being scheduled.
        state: The current loop state (immutable; each primitive replaces it).
        rng: The ``numpy.random.Generator`` of the sampling primitives.

    Raises:
        TeError: If ``dag`` is a list of tensors that does not make a ``ComputeDAG``.

    Example:
        Tile a matmul's output, run its outer tiles in parallel and vectorize the inner
        loop, then build and call it::

            A = te.placeholder((512, 512), name="A")
            B = te.placeholder((512, 512), name="B")
            k = te.reduce_axis((0, 512), name="k")
            C = te.compute((512, 512), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
            sch = tc.Schedule([A, B, C])
            i, j, k = sch.get_loops(sch.get_block("C"))
            i0, i1 = sch.split(i, [None, 8])
            j0, j1 = sch.split(j, [None, 16])
            sch.reorder(i0, j0, k, i1, j1)
            sch.parallel(sch.fuse(i0, j0))
            sch.vectorize(j1)
            func = tc.build(sch)
            a, b = sch.dag.random_inputs()
            c = func(a, b)
    """

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
        """The steps applied so far, with their sampling decisions, as an immutable ``Trace``."""
        return Trace(tuple(self._steps))

    def copy(self) -> Schedule:
        """An independent schedule in the same state with the same trace, whose generator is
        seeded from this one's (so the copy samples differently from the original)."""
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
        """Look up a block by name.

        Args:
            name: The block's name: the name of the compute op (its output tensor), or of a
                block a primitive made (``"C_local"`` from ``cache_write``, ``"C_rf"`` from
                ``rfactor``).
            func_name: Accepted for TVM's signature and ignored: a schedule has one function.

        Returns:
            A handle to the block.

        Raises:
            ScheduleError: If there is no block of that name; the message lists the blocks.
        """
        self._stage(name)
        rv = BlockRV(name, self._symbol("b"))
        self._record("get_block", {"name": name}, [rv])
        return rv

    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        """The loops around a block's body, outermost first.

        For a block moved by ``compute_at`` or ``reverse_compute_at`` this includes the
        enclosing loops of the block it was moved under, down to the loop it was moved to,
        then the block's own loops.

        Args:
            block: The block.

        Returns:
            New handles to the loops, outermost first.

        Raises:
            ScheduleError: If the block does not exist (any more).
        """
        ids = self.loop_path(self._stage(block).name)
        rvs = [LoopRV(i, self._symbol("l")) for i in ids]
        self._record("get_loops", {"block": block}, rvs)
        return rvs

    def loop_path(self, name: str) -> list[int]:
        """Ids of all loops around the body of block ``name``, outermost first: what
        ``get_loops`` returns handles to, without recording a step.

        Raises:
            KeyError: If there is no block named ``name``.
        """
        from .bound import loop_path

        return loop_path(self.state, name)

    def loop_extent(self, loop: LoopRV) -> int:
        """The number of iterations of ``loop``, as the current loop state infers it.

        Raises:
            ScheduleError: If ``loop`` is not a loop handle or the loop no longer exists.
        """
        return self._loop(loop)[1].extent

    # ----------------------------------------------------------------- loop transformations
    def split(self, loop: LoopRV, factors: Sequence[int | None]) -> list[LoopRV]:
        """Split a loop into ``len(factors)`` nested loops, outermost first.

        The new loops have the factors as extents; one factor may be None and is inferred
        as the extent divided by the product of the others, rounded up. Factors whose
        product exceeds the extent (a factor that does not divide it) give a guarded tail:
        iterations past the extent are skipped. Blocks computed at ``loop`` move to the
        innermost new loop. Factors may be sampled values (``sample_perfect_tile``).

        Args:
            loop: The loop to split.
            factors: At least two positive ints, at most one of them None.

        Returns:
            Handles to the new loops, outermost first.

        Raises:
            ScheduleError: If ``loop`` no longer exists, there are fewer than two factors,
                more than one is None, a factor is not a positive int, or the factors
                multiply to less than the extent.
        """
        stage, target = self._loop(loop)
        factors = list(factors)
        if len(factors) < 2:
            raise ScheduleError(f"split of loop {target.name} needs at least 2 factors, got {factors}")
        if sum(f is None for f in factors) > 1:
            raise ScheduleError(f"split of loop {target.name}: at most one factor may be None, got {factors}")
        if any(f is not None and (isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 1)
               for f in factors):
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
        """Fuse adjacent loops of one block into a single loop over the product of their extents.

        The loops must be consecutive in the block's loop order, outermost first, and all
        spatial or all reduction. Blocks computed at the innermost of them move to the
        fused loop. Also accepts one list of loops.

        Args:
            *loops: Two or more loops of the same block, outermost first.

        Returns:
            A handle to the fused loop.

        Raises:
            ScheduleError: If fewer than two loops are given, they belong to different
                blocks, are not adjacent and in order, mix spatial and reduction loops, or
                a block is computed at one of them other than the innermost.
        """
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
            raise ScheduleError(f"fuse of block {stage.name}: loops {names} are not adjacent and in order; "
                                "reorder first")
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
        """Reorder loops of one block: the given loops take the positions they held, in the
        order given; the block's other loops stay where they are. Also accepts one list.

        Args:
            *loops: Loops of the same block, in their new order, outermost first.

        Raises:
            ScheduleError: If a loop no longer exists, the loops belong to different blocks
                (a block's loops cannot be reordered with those of the block it is computed
                at), or a loop appears twice.
        """
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
        if target.annotation in THREAD_AXES:
            raise ScheduleError(f"cannot {kind} loop {target.name} of block {stage.name}: it is bound to "
                                f"{target.annotation}; a loop is bound or annotated once")
        if kind in ("parallel", "vectorize") and target.kind != "spatial":
            raise ScheduleError(
                f"cannot {kind} loop {target.name} of block {stage.name}: it is a reduction loop, whose "
                f"iterations depend on each other; {kind} a spatial loop instead"
            )
        self.state = self.state.with_stage(stage.with_loop(replace(target, annotation=kind)))
        self._record(kind, {"loop": loop})

    def parallel(self, loop: LoopRV) -> None:
        """Run a loop's iterations in parallel on the target's cores (an OpenMP ``parallel
        for``; directly nested parallel loops are collapsed into one).

        Args:
            loop: A spatial loop.

        Raises:
            ScheduleError: If ``loop`` no longer exists or is a reduction loop.
        """
        self._annotate_loop("parallel", loop)

    def vectorize(self, loop: LoopRV) -> None:
        """Run a loop's iterations as SIMD lanes. A loop whose body is one store becomes
        vector code; any other is left for the C compiler to vectorize.

        Args:
            loop: A spatial loop, usually the innermost, over contiguous elements.

        Raises:
            ScheduleError: If ``loop`` no longer exists or is a reduction loop.
        """
        self._annotate_loop("vectorize", loop)

    def unroll(self, loop: LoopRV) -> None:
        """Unroll a loop fully (``#pragma GCC unroll``, at most 1024 copies).

        Args:
            loop: Any loop.

        Raises:
            ScheduleError: If ``loop`` no longer exists.
        """
        self._annotate_loop("unroll", loop)

    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        """Run a loop's iterations on a GPU axis: blocks of the grid (``blockIdx.x/y/z``),
        threads of a block (``threadIdx.x/y/z``), or virtual threads (``vthread.x/y/z``:
        a thread's tile spread apart, its pieces run one after another by each thread, an
        unrolled loop; TVM interleaves them statement by statement, tilecraft does not yet).

        As in TVM, loops of different blocks bound to the same ``threadIdx`` axis are the
        same hardware threads: a producer computed inside a consumer's thread loops and
        cached in shared memory (``cache_read(..., "shared")``) is fetched by the block's
        threads together when its own loops are bound to the same axes. The block's size on
        an axis is the largest extent bound to it; loops bound with a smaller extent are
        guarded.

        Args:
            loop: A spatial loop, or a reduction loop bound to ``threadIdx.x``: a
                cross-thread reduction, where each thread of a row accumulates a partial
                over the other reduction loops and the row combines them (warp shuffles);
                or a reduction loop bound to ``blockIdx``: a cross-block reduction
                (split-K), where each block adds its partial into the output atomically,
                zeroed before the kernel (a sum into an output that nothing in the
                kernel reads).
            thread_axis: One of ``THREAD_AXES``.

        Raises:
            ScheduleError: If the axis is unknown, the loop is bound or annotated already,
                another loop of the block is bound to the same axis, or a reduction loop
                is bound to another axis than ``threadIdx.x`` or ``blockIdx``.

        Example:
            ::

                i0, i1 = sch.split(i, [None, 128])
                sch.bind(i0, "blockIdx.x")
                sch.bind(i1, "threadIdx.x")
        """
        if thread_axis not in THREAD_AXES:
            raise ScheduleError(f"bind: unknown thread axis {thread_axis!r}; use one of {', '.join(THREAD_AXES)}")
        stage, target = self._loop(loop)
        if target.annotation:
            raise ScheduleError(f"bind: loop {target.name} of block {stage.name} is already "
                                f"{_describe_annotation(target.annotation)}; a loop is bound or annotated once")
        taken = next((l for l in stage.loops if l.id in stage.leaves and l.annotation == thread_axis), None)
        if taken is not None:
            raise ScheduleError(f"bind: block {stage.name} already binds {thread_axis} to loop {taken.name}; "
                                "fuse the loops first to run them on one axis")
        if target.kind != "spatial" and thread_axis != "threadIdx.x" and not thread_axis.startswith("blockIdx"):
            why = _REDUCTION_BINDING[thread_axis.split(".")[0]]
            raise ScheduleError(f"bind: loop {target.name} of block {stage.name} is a reduction loop and cannot be "
                                f"bound to {thread_axis}: {why}; bind a spatial loop, or rfactor the reduction and "
                                "bind the factored block's spatial loop")
        self.state = self.state.with_stage(stage.with_loop(replace(target, annotation=thread_axis)))
        self._record("bind", {"loop": loop, "thread_axis": thread_axis})

    def annotate(self, block_or_loop: BlockRV | LoopRV, ann_key: str, ann_val: int) -> None:
        """Attach an annotation to a loop or a block, as MetaSchedule's annotations.

        On a loop the annotation is a pragma: ``pragma_auto_unroll_max_step`` unrolls every
        loop nest inside it of at most ``ann_val`` iterations (``pragma_unroll_explicit`` is
        recorded but does not change the code); ``software_pipeline`` 2 double-buffers the
        GPU shared-memory tiles that each of its steps fills (``ir/pipeline.py``); ``tensor_core``
        1 makes the nest of 16x16(x16) loops it heads one warp's tensor-core operation, a
        reduction's init, update (float16 A times B into float32) or copy-out (``ir/tensor_core.py``). On a block
        it is an intent that lowering realizes once the block's final place is known (see
        ``postproc.py``):
        ``meta_schedule.parallel`` fuses up to ``ann_val`` outer loops and runs them in
        parallel (at the root only), ``meta_schedule.vectorize`` vectorizes the innermost
        spatial loop, ``pragma_auto_unroll_max_step`` goes on the block's outermost loop,
        and ``meta_schedule.cooperative_fetch`` spreads a block copied into GPU shared
        memory over the threads bound around it, ``ann_val`` elements a vector.
        Annotating the same key again replaces the value.

        Args:
            block_or_loop: The block or loop to annotate.
            ann_key: One of the keys above.
            ann_val: The annotation's value (an int).

        Raises:
            ScheduleError: If ``ann_key`` is not a known key for a block or for a loop,
                ``block_or_loop`` is neither, or it no longer exists.
        """
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
        if ann_key not in LOOP_PRAGMAS:
            raise ScheduleError(f"annotate: unknown annotation {ann_key!r}; known: {', '.join(LOOP_PRAGMAS)}")
        stage, target = self._loop(block_or_loop)
        pragmas = tuple(p for p in target.pragmas if p[0] != ann_key) + ((ann_key, int(ann_val)),)
        self.state = self.state.with_stage(stage.with_loop(replace(target, pragmas=pragmas)))
        self._record("annotate", {"block_or_loop": block_or_loop, "ann_key": ann_key, "ann_val": ann_val})

    # ----------------------------------------------------------------- compute location
    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        """Move a producer block under a loop of its consumer, to compute there only the
        region that one iteration of the loop reads.

        The block's loop extents are inferred again for the new place (a tile of the
        consumer needs a tile of the producer). ``loop`` may also be a location sampled by
        ``sample_compute_location``: root (decision -1) moves the block back to the root,
        inline (-2) inlines it as ``compute_inline`` does.

        Args:
            block: The producer block; not an output of the computation.
            loop: A loop that encloses every consumer of the block.
            preserve_unit_loops: Accepted for TVM's signature and ignored.

        Raises:
            ScheduleError: If the block writes an output (use ``reverse_compute_at``),
                ``loop`` is a loop of the block itself, does not enclose every consumer of
                the block, or belongs to a block computed inside this one (a cycle), or no
                region of the block can be computed there.
        """
        stage = self._stage(block)
        if isinstance(loop, LoopRV) and loop.id == ROOT:
            self.state = self.state.with_stage(replace(stage, attach=None))
        elif isinstance(loop, LoopRV) and loop.id == INLINE:
            self._inline(stage)
        else:
            self.state = self._attach(stage, loop, reverse=False)
        self._record("compute_at", {"block": block, "loop": loop})

    def reverse_compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False) -> None:
        """Move a consumer block under a loop of its producer, to consume there the region
        that one iteration of the loop has just produced (an element-wise epilogue fused
        into a tiled producer, or the copy-out of a ``cache_write``).

        Args:
            block: The consumer block; it must read its producer element-wise, at its own
                indices.
            loop: A loop that encloses the producer (the last block the consumer reads)
                and lies outside all of the producer's reduction loops.
            preserve_unit_loops: Accepted for TVM's signature and ignored.

        Raises:
            ScheduleError: If the block reads no other block, reads its producer other than
                element-wise, ``loop`` does not enclose the producer or is inside one of its
                reduction loops (the consumer would read partial sums), or ``loop`` belongs
                to the block itself or to a block computed inside it.
        """
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
        """Inline an element-wise block into its consumers: each read of its output is
        replaced by the expression that computes it, and the block and its buffer vanish.

        Args:
            block: An element-wise (not reduction) block that writes no output of the
                computation and has no other block computed at its loops.

        Raises:
            ScheduleError: If the block is an output or a reduction, other blocks are
                computed at its loops, or it reads a block computed at a loop where the
                inlined reads would not find it.
        """
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
        """Inline an element-wise consumer into its producer: the producer's block computes
        the consumer's expression of its value and writes the consumer's buffer; the
        consumer block vanishes and the merged block keeps the producer's name and loops.
        A consumer that adds a value to a sum (a bias, a residual) folds into the sum itself:
        the value joins the sum's first term, so a sum split over GPU blocks (split-K) adds
        it once.

        Args:
            block: An element-wise block that reads exactly one other block's output, at its
                own indices; that producer must be element-wise, or a sum the block adds a
                value to, with no other consumer.

        Raises:
            ScheduleError: If the block is a reduction or reads other than one block, the
                producer is a reduction the block does more to than add a value, or has other
                consumers, or the reads are not element-wise.
        """
        consumer = self._stage(block)
        producers = self.state.producers_of(consumer)
        if len(producers) != 1 or consumer.is_reduction:
            raise ScheduleError(f"reverse_compute_inline: block {consumer.name} must be element-wise and read "
                                f"exactly one other block's output (it reads {len(producers)})")
        producer = producers[0]
        if len(self.state.consumers_of(producer.name)) != 1:
            raise ScheduleError(f"reverse_compute_inline: producer {producer.name} must have {consumer.name} as "
                                "its only consumer")
        _check_identity_reads(consumer, producer)
        axis_map = {c.var: p.var for c, p in zip(consumer.op.axis, producer.op.axis)}

        def rewrite(node: Expr) -> Expr:
            if isinstance(node, TensorRead) and node.tensor is producer.tensor:
                return producer.op.body
            return map_children(node, rewrite)

        body = substitute(consumer.op.body, axis_map)
        body = _added_to_sum(body, producer) if producer.is_reduction else rewrite(body)
        merged = replace(producer, op=ComputeOp(producer.op.name, producer.op.axis, body, consumer.op.dtype,
                                                producer.op.attrs),
                         tensor=consumer.tensor, is_output=consumer.is_output)
        stages = tuple(merged if s.name == producer.name else s for s in self.state.stages if s.name != consumer.name)
        self.state = replace(self.state, stages=stages)
        self._record("reverse_compute_inline", {"block": block})

    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        """Place a reduction's initialisation (its output set to the combiner's identity)
        just before ``loop`` instead of before the outermost reduction loop.

        Args:
            block: A reduction block.
            loop: A loop of the block at or above its outermost reduction loop.

        Returns:
            A handle named ``<block>_init`` standing for the initialisation.

        Raises:
            ScheduleError: If the block is not a reduction, ``loop`` is not one of its
                loops, or it is inside a reduction loop.
        """
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
        """Factor a reduction over one of its loops, to run that loop in parallel or as
        vector lanes.

        The reduction over ``loop`` moves into a new block ``<name>_rf`` whose output has
        that loop as an extra axis at ``factor_axis``; the block then reduces over that
        axis (see ``rfactor.py``). The rf block keeps the block's loops, ``loop`` now
        spatial, so existing loop handles stay valid; the block keeps its name and
        buffer and gets a fresh loop nest.

        Args:
            loop: A reduction loop of a reduction block (a reduce axis or a piece of one).
            factor_axis: Where the new axis goes among the rf block's output axes
                (negative counts from the end).

        Returns:
            A handle to the rf block.

        Raises:
            ScheduleError: If the block is not a reduction, ``loop`` is spatial, the block
                is computed at another block or holds blocks computed at its loops, its
                reduction was decomposed, ``factor_axis`` is out of range, or a block
                ``<name>_rf`` exists already.
        """
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
        """Make a block compute into a cache buffer, copied to its output by a new block.

        The block keeps its name and loops but writes ``<block>_<scope>``; a new block of
        that name, placed right after it, copies the cache into the block's original
        buffer. Move the block under a loop of the copy (``compute_at``) to accumulate a
        tile in a small local buffer that stays in registers or L1.

        Args:
            block: The block whose output to cache.
            write_buffer_index: Which buffer the block writes; must be 0 (a block writes one).
            storage_scope: ``"local"`` (a buffer placed at the loop the block ends up under:
                registers on a GPU), ``"shared"`` (a GPU block's shared memory) or ``"global"``.

        Returns:
            A handle to the new copy block.

        Raises:
            ScheduleError: If ``write_buffer_index`` is not 0, ``storage_scope`` is not
                supported, or a block of the new name exists already.
        """
        stage = self._stage(block)
        if write_buffer_index != 0:
            raise ScheduleError(f"cache_write: block {stage.name} writes one buffer; write_buffer_index must be 0")
        if storage_scope not in STORAGE_SCOPES:
            raise ScheduleError(f"cache_write: storage_scope {storage_scope!r} is unknown; use one of "
                                f"{', '.join(STORAGE_SCOPES)}")
        name = f"{stage.name}_{storage_scope}"
        self._check_new_name(name)
        cache = Tensor(ComputeOp(name, stage.op.axis, stage.op.body, stage.op.dtype, stage.op.attrs))
        axes = tuple(IterVar(Var(iv.name), iv.extent, "spatial") for iv in stage.op.axis)
        copy_op = ComputeOp(name, axes, TensorRead(cache, tuple(iv.var for iv in axes)), stage.op.dtype)
        state, first = self.state.new_ids(len(axes))
        copy = replace(initial_stage(copy_op, stage.tensor, first[0], stage.is_output), name=name,
                       scope=stage.scope)  # the buffer it writes keeps its scope (a second cache_write)
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
        """Make a block read one of its inputs through a copy made by a new block.

        A new block ``<input>_<scope>``, placed before the block, copies the input; only
        this block's reads are redirected to the copy. Move the copy under a loop of the
        block (``compute_at``) to copy just the tile that loop reads.

        Args:
            block: The reading block.
            read_buffer_index: Which of the block's inputs, counted in the order the block
                first reads them.
            storage_scope: The copy's scope: ``"local"``, ``"shared"`` (a GPU block's shared
                memory, holding what all the block's threads read at the copy's place) or
                ``"global"``.

        Returns:
            A handle to the new copy block.

        Raises:
            ScheduleError: If ``read_buffer_index`` is out of range, ``storage_scope`` is
                unknown, or a block of the new name exists already.
        """
        stage = self._stage(block)
        if storage_scope not in STORAGE_SCOPES:
            raise ScheduleError(f"cache_read: storage_scope {storage_scope!r} is unknown; use one of "
                                f"{', '.join(STORAGE_SCOPES)}")
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

    def storage_align(self, block: BlockRV, buffer_index: int, axis: int, factor: int, offset: int) -> None:
        """Pad the rows of the buffer a block writes: the elements between consecutive
        indices of dimension ``axis`` become a number that leaves ``offset`` over a multiple
        of ``factor``, as TVM's ``storage_align``. A GPU tile in shared memory whose rows are
        a multiple of 128 bytes apart puts a column's elements in one bank, so threads (or an
        ``ldmatrix``) reading down a column wait on each other; rows 16 bytes past such a
        multiple spread them over the banks. Only the memory's layout changes, not what is
        computed; the padding counts towards the block's shared memory.

        Args:
            block: The block, typically a copy into shared memory (``cache_read``).
            buffer_index: Which buffer the block writes; must be 0 (a block writes one).
            axis: The dimension whose stride to pad, of the buffer as laid out (after
                ``transform_layout``); not the last (its stride is 1).
            factor: The stride is a multiple of this, plus ``offset``; positive.
            offset: What the stride leaves over the multiple of ``factor``; 0 to ``factor - 1``.

        Raises:
            ScheduleError: If the block writes a tensor of the computation (its layout is the
                caller's), or an argument is out of range.
        """
        stage = self._stage(block)
        if buffer_index != 0:
            raise ScheduleError(f"storage_align: block {stage.name} writes one buffer; buffer_index must be 0")
        self._check_own_buffer(stage, "storage_align")
        ndim = len(stage.op.axis)
        if not 0 <= axis < ndim - 1:
            raise ScheduleError(f"storage_align: axis {axis} of {stage.name}'s {ndim}-dimensional buffer must be one "
                                f"of 0 to {ndim - 2}; the last dimension's elements are always adjacent")
        if factor < 1 or not 0 <= offset < factor:
            raise ScheduleError(f"storage_align: factor {factor} must be positive and offset {offset} between 0 and "
                                f"factor - 1")
        align = tuple(a for a in stage.align if a[0] != axis) + ((axis, factor, offset),)
        self.state = self.state.with_stage(replace(stage, align=tuple(sorted(align))))
        self._record("storage_align", {"block": block, "buffer_index": buffer_index, "axis": axis, "factor": factor,
                                       "offset": offset})

    def transform_layout(self, block: BlockRV, buffer: Sequence, index_map: Callable | IndexMap) -> None:
        """Store a layout-free input in another layout, packed once outside the kernel; or
        lay out the buffer a block writes with its dimensions in another order.

        On a read, the kernel reads a packed buffer whose element ``index_map(*indices)``
        holds the input's element ``indices``. ``build`` emits a pack function beside the
        kernel; ``Module`` packs the input at every call, or once with ``bind_weights``, and
        ``time_evaluator`` packs it before timing. Only an input its compute marks as
        layout-free (``attrs={"layout_free_placeholders": [B]}``: a weight) may be packed.
        On a write (a cache's buffer, ``("write", 0)``), the map permutes the dimensions:
        ``lambda i, k: (k, i)`` stores a GPU block's shared tile of A column major, so that a
        thread's rows of it are adjacent and read as vectors. Only where it lies in memory
        changes; its indices stay the same.

        Args:
            block: A block that reads the input, or writes the buffer.
            buffer: ``("read", i)``: the block's ``i``-th input, in order of first read;
                ``("write", 0)``: the buffer the block writes.
            index_map: A function of one index per input dimension returning the packed
                indices, built from ``+ - * // %`` and never negative, e.g.
                ``lambda k, j: (j // 16, k, j % 16)``; or an ``IndexMap``. On a write, the
                indices themselves, reordered.

        Raises:
            ScheduleError: If ``buffer`` is not such a read or write, the input is not a
                layout-free placeholder or was transformed already, the block writes a tensor
                of the computation, the map takes the wrong number of indices, its indices
                can be negative, or a write's map is no permutation.
        """
        stage = self._stage(block)
        if tuple(buffer[:1]) == ("write",):
            index_map = self._permute_layout(stage, buffer, index_map)
            self._record("transform_layout", {"block": block, "buffer": list(buffer), "index_map": index_map})
            return
        source = self._layout_free_read(stage, buffer, "transform_layout")
        index_map = _as_index_map(index_map, source)
        self._pack(source, index_map)
        self._record("transform_layout", {"block": block, "buffer": list(buffer), "index_map": index_map})

    def _permute_layout(self, stage: Stage, buffer: Sequence, index_map: Callable | IndexMap) -> IndexMap:
        """``transform_layout`` on a write: the order of the written buffer's dimensions in memory."""
        if tuple(buffer) != ("write", 0):
            raise ScheduleError(f"transform_layout: block {stage.name} writes one buffer; use ('write', 0), got "
                                f"{tuple(buffer)}")
        self._check_own_buffer(stage, "transform_layout")
        index_map = _as_index_map(index_map, stage.tensor)
        variables = [Var(name) for name in index_map.params]
        targets = index_map(*variables)
        order = tuple(next((n for n, v in enumerate(variables) if v is t), -1) for t in targets)
        if sorted(order) != list(range(len(variables))):
            raise ScheduleError(f"transform_layout: the map {index_map.to_python()} of {stage.tensor.name}, a buffer "
                                "the block computes, must reorder its indices, each once (lambda i, k: (k, i))")
        self.state = self.state.with_stage(replace(stage, order=order))
        return index_map

    def _check_own_buffer(self, stage: Stage, primitive: str) -> None:
        """Refuse to lay out a tensor of the computation, whose layout is the caller's."""
        if stage.is_output or stage.tensor in self.dag.tensors:
            raise ScheduleError(f"{primitive}: block {stage.name} writes {stage.tensor.name}, a tensor of the "
                                "computation whose layout the caller chose; lay out a cache of it instead "
                                "(cache_read or cache_write)")

    def rewrite_layout(self, block: BlockRV, buffer: Sequence, pairs: bool = False) -> None:
        """Pack a layout-free input in the order the block's loops read it (see ``layout.py``);
        replayed with other tile sizes, the layout follows them. Call it after the block's
        splits and before any fuse of its loops.

        Args:
            block: A block that reads the input.
            buffer: ``("read", i)``: the block's ``i``-th input, in order of first read.
            pairs: Store neighbours along the innermost reduction piece next to each other,
                after the vector lanes, where the loops read them as a bfloat16 dot
                product's pairs (AVX-512 BF16); elsewhere the same layout as without.

        Raises:
            ScheduleError: As ``transform_layout``; also if the block reads the input in
                more than one way, at indices that are not distinct axes of the block, or
                has fused loops.
        """
        from .layout import tiled_layout

        stage = self._stage(block)
        source = self._layout_free_read(stage, buffer, "rewrite_layout")
        self._pack(source, tiled_layout(stage, source, pairs))
        self._record("rewrite_layout", {"block": block, "buffer": list(buffer), **({"pairs": True} if pairs else {})})

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

        stages = tuple(replace(s, op=_with_body(s.op, rewrite(s.op.body)))
                       if any(t is source for t in s.op.input_tensors) else s for s in self.state.stages)
        entry = PackedInput(source, packed, variables, targets)
        self.state = replace(self.state, stages=stages, packed=self.state.packed + (entry,))

    def _check_new_name(self, name: str) -> None:
        if any(s.name == name for s in self.state.stages):
            raise ScheduleError(f"a block named {name} already exists; a block can be cached or factored only once")

    # ----------------------------------------------------------------- sampling
    def sample_perfect_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16,
                            decision: Sequence[int] | None = None) -> list[ExprRV]:
        """Sample tile sizes for a loop: ``n`` factors that multiply exactly to its extent.

        Without a decision the factors are drawn uniformly among all such factorizations
        whose innermost factor is at most ``max_innermost_factor``. The result goes to
        ``split``; the trace records the decision, and a replay may give another.

        Args:
            loop: The loop to tile.
            n: How many factors.
            max_innermost_factor: The largest innermost factor allowed.
            decision: The factors to take instead of sampling (as a trace replays them).

        Returns:
            The ``n`` factors, outermost first, as ints that the trace knows by symbol.

        Raises:
            ScheduleError: If ``loop`` no longer exists, or ``decision`` is not ``n`` factors
                multiplying to the extent with the innermost within the limit.
        """
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
        and the split guards the partial last tile (``sampling.padded_factorizations``).
        Without a decision, a padded tiling is drawn as often as a perfect one when the
        extent has any.

        Raises:
            ScheduleError: If ``loop`` no longer exists, or ``decision`` is not one of the
                perfect or padded tilings.
        """
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
        self._record("sample_tile", {"loop": loop, "n": n, "max_innermost_factor": max_innermost_factor}, rvs, decision)
        return rvs

    def sample_categorical(self, candidates: Sequence[int], probs: Sequence[float],
                           decision: int | None = None) -> ExprRV:
        """Sample one of ``candidates`` with the given probabilities (normalised to sum to 1),
        e.g. an ``auto_unroll_max_step`` for ``annotate``.

        Args:
            candidates: The values to choose from (ints).
            probs: One weight per candidate.
            decision: The index of the candidate to take instead of sampling.

        Returns:
            The chosen value, as an int that the trace knows by symbol; the trace records
            its index.

        Raises:
            ScheduleError: If ``candidates`` is empty or ``probs`` has another length, or
                ``decision`` is not an index into ``candidates``.
        """
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

    def compute_location_candidates(self, block: BlockRV, recomputing: bool = False) -> list[int]:
        """Decisions ``sample_compute_location`` may take: root, inline (unless it is a
        reduction, an output or holds blocks computed at its loops), or the id of a loop that
        encloses all the block's consumers and is not one where computing it repeats work
        for nothing (``recomputing`` adds those, which a recorded trace may hold).

        Returns:
            -1 for the root, -2 for inline, then loop ids, outermost first.

        Raises:
            ScheduleError: If the block does not exist.
        """
        stage = self._stage(block)
        candidates = [ROOT]
        if not stage.is_reduction and not stage.is_output and not self._holds_others(stage):
            candidates.append(INLINE)
        if not stage.is_output:
            consumers = self.state.consumers_of(stage.name)
            paths = [self.loop_path(c.name) for c in consumers]
            loops = common_prefix(paths)
            candidates += loops if recomputing else self._without_recomputation(stage, consumers, paths, loops)
        return candidates

    def _without_recomputation(self, stage: Stage, consumers: list[Stage], paths: list[list[int]],
                               loops: list[int]) -> list[int]:
        """``loops`` less those where ``stage`` would be computed again for nothing.

        At a loop of a consumer that does not index the consumer's reads of ``stage``, every
        iteration needs the same region: computing it there repeats the work of computing
        it once at the loop above (a softmax's row sum computed inside the loop over the
        row's elements ran 1,000 times slower). A reduction must also not sit below such a
        loop, which would repeat whole reductions; an element-wise block may, trading
        recomputation for locality. A loop that another consumer is nested in is kept: its
        reads reach ``stage`` through that consumer's bounds.
        """
        kept, repeats = [], False
        for loop_id in loops:
            owner = self.state.stage_of_loop(loop_id)
            nested = any(loop_id in path for c, path in zip(consumers, paths) if c.name != owner.name)
            if owner.name in {c.name for c in consumers} and not nested:
                reads: set = set()
                walk(owner.op.body, lambda n: reads.update(set().union(*map(free_vars, n.indices)))
                     if isinstance(n, TensorRead) and n.tensor is stage.tensor else None)
                axes = dict(zip(owner.roots, owner.op.axis + owner.op.reduce_axis))
                if not any(axes[root].var in reads for root in root_loops_of(owner, loop_id) if root in axes):
                    repeats = True
                    continue
            if not (repeats and stage.is_reduction):
                kept.append(loop_id)
        return kept

    def sample_compute_location(self, block: BlockRV, decision: int | None = None) -> LoopRV:
        """Sample where to compute a block: a loop that encloses all its consumers, the root,
        or inline, uniformly among ``compute_location_candidates``. Pass the result to
        ``compute_at``, which understands all three.

        Args:
            block: The block to place.
            decision: The location to take instead of sampling: a loop id (also one where
                the block would be computed again for nothing, as a recorded trace may
                hold), -1 for the root or -2 for inline.

        Returns:
            A handle to the chosen loop, or the root or inline location.

        Raises:
            ScheduleError: If the block does not exist or ``decision`` is not a candidate.
        """
        stage = self._stage(block)
        if decision is None:
            candidates = self.compute_location_candidates(block)
            decision = candidates[int(self.rng.integers(len(candidates)))]
        if decision not in self.compute_location_candidates(block, recomputing=True):
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


def adds_to_sum(body: Expr, producer: Stage) -> list[Expr] | None:
    """What ``body`` adds to ``producer``'s sum (the terms of its additions but the read of
    the sum), where that is all it does: the sum read once, nowhere else; None otherwise."""
    reduce = producer.op.body
    if not producer.is_reduction or reduce.combiner != "sum" or not (isinstance(reduce.where, Const)
                                                                   and reduce.where.value):
        return None
    terms, pending = [], [body]
    while pending:
        node = pending.pop()
        if isinstance(node, Binary) and node.op == "add" and node.dtype == reduce.dtype:
            pending += [node.b, node.a]
        else:
            terms.append(node)
    rest = [t for t in terms if not (isinstance(t, TensorRead) and t.tensor is producer.tensor)]
    return rest if len(rest) == len(terms) - 1 and rest and not any(_reads(t, producer.tensor) for t in rest) \
        else None


def _added_to_sum(body: Expr, producer: Stage) -> Expr:
    """``body``, which adds a value to ``producer``'s sum, as one sum: the value added to the
    sum's first term (every reduction variable at 0)."""
    rest = adds_to_sum(body, producer)
    if rest is None:
        raise ScheduleError(f"reverse_compute_inline: producer {producer.name} is a reduction; only a block that adds "
                            f"a value to a sum (a bias, a residual) folds into it, and {producer.name}'s consumer "
                            "does more: inline the consumer into a copy of the result instead (cache_write)")
    reduce = producer.op.body
    condition: Expr = Compare("eq", reduce.axes[0].var, const(0))
    for iv in reduce.axes[1:]:
        condition = Logical("and", condition, Compare("eq", iv.var, const(0)))
    value = rest[0]
    for term in rest[1:]:
        value = binary("add", value, term)
    return Reduce("sum", binary("add", reduce.source, Select(condition, value, const(0, reduce.dtype))),
                  reduce.axes, reduce.where)


def _reads(expr: Expr, tensor) -> bool:
    found = []
    walk(expr, lambda node: found.append(node) if isinstance(node, TensorRead) and node.tensor is tensor else None)
    return bool(found)


def _check_identity_reads(consumer: Stage, producer: Stage) -> None:
    if consumer.tensor.shape != producer.tensor.shape:
        raise ScheduleError(f"block {consumer.name} {list(consumer.tensor.shape)} reads part of "
                            f"{producer.tensor.name} {list(producer.tensor.shape)}; only a consumer of the same "
                            "shape can be moved into or inlined into its producer")
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


def _describe_annotation(annotation: str) -> str:
    return f"bound to {annotation}" if annotation in THREAD_AXES else f"annotated {annotation}"
