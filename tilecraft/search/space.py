"""Sketches and their decision spaces: a candidate is a row of integers.

A ``Sketch`` is a trace whose sampling steps are free. Each sampling step is a ``Slot``
with a finite domain (every perfect tiling of a loop, the candidates of a categorical,
the loops a block may be computed at); a candidate is one index per slot, so a whole
population is an integer matrix that can be sampled, mutated, deduplicated and turned
into features with NumPy, without replaying or lowering anything (docs/architecture.md, "Rules the layers keep").
Only the candidates chosen for measurement become traces again.

Loop extents follow from tile sizes, so the analysis also records every interesting
loop's extent as a linear form in the log2 tile factors: the parallel extent or the
vector length of any candidate is then one matrix product.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..codegen.cuda import registers_a_thread
from ..codegen.gpu_verify import fragment_registers, register_budget
from ..ir.pipeline import SHARED_BYTES
from ..ir.tensor_core import WARP
from ..schedule.sampling import PADDED_SHARE, factorizations, tile_factorizations
from ..schedule.schedule import INLINE, BlockRV, Schedule
from ..schedule.state import Fuse, Split
from ..schedule.trace import SAMPLING_STEPS, Trace
from ..target import Target
from ..te.dag import ComputeDAG
from ..te.arith import to_linear
from ..te.dtype import accumulates_in, bytes_of
from ..te.expr import Var
from .access import reads_of, reused_only_in_a_window
from .register_tile import apply_register_tiles, find_register_tiles


GPU_REDRAWS = 1024  # draws a GPU candidate may take to keep the target's limits
GPU_REDRAW_BATCH = 32  # of them drawn at once for every candidate still over a limit


@dataclass(frozen=True)
class Slot:
    step: int  # index of the sampling step in the sketch's trace
    role: str  # tile | unroll | parallel | location | categorical
    name: str  # what it decides, e.g. "matmul.i" or "matmul.unroll"
    domain: tuple  # the decisions the step may record, in a fixed order
    values: tuple = ()  # categorical: the value each decision stands for
    spatial: bool = True  # tile: of a spatial loop
    perfect: int = 0  # tile: how many decisions, first in the domain, divide the loop exactly
    inline_first: bool = False  # location: the default inlines the block (``reused_only_in_a_window``)


@dataclass(frozen=True)
class LogForm:
    """log2(extent of a loop) = coef . log2(tile factors) + const."""

    coef: tuple[tuple[int, float], ...]  # (factor column, coefficient)
    const: float

    def __add__(self, other: LogForm) -> LogForm:
        merged: dict[int, float] = dict(self.coef)
        for column, c in other.coef:
            merged[column] = merged.get(column, 0.0) + c
        return LogForm(tuple(sorted((k, v) for k, v in merged.items() if v)), self.const + other.const)

    def scaled(self, factor: float) -> LogForm:
        return LogForm(tuple((k, v * factor) for k, v in self.coef), self.const * factor)

    def evaluate(self, log_factors: np.ndarray) -> np.ndarray:
        out = np.full(len(log_factors), self.const)
        for column, c in self.coef:
            out += c * log_factors[:, column]
        return out


class Footprint(NamedTuple):
    """A shared or local tile as the decisions size it: element bytes, and per dimension
    the (|coefficient|, extent form) of each variable its index steps with."""

    element_bytes: float
    dimensions: tuple[tuple[tuple[int, LogForm], ...], ...]
    order: tuple[int, ...] = ()  # its dimensions in memory, outermost first (transform_layout on a write)
    align: tuple[tuple[int, int, int], ...] = ()  # storage_align's (axis of that order, factor, offset)
    pipelined: LogForm | None = None  # the steps of the loop that fills it, where a software pipeline may double it


@dataclass
class Sketch:
    name: str
    trace: Trace
    slots: tuple[Slot, ...]
    factor_columns: tuple[tuple[int, int], ...]  # (slot index, position) per log-factor column
    parallel_loops: dict[int, tuple[LogForm, ...]]  # parallel slot -> leading loops' extents
    vector_loops: dict[str, LogForm]  # block -> its innermost loop's extent
    register_tiles: tuple = ()  # RegisterTile per block that accumulates in registers (needs a target)
    gpu_axes: dict[str, tuple[LogForm, ...]] = field(default_factory=dict)  # GPU axis -> the loops bound to it
    gpu_limits: dict[str, int] = field(default_factory=dict)  # GPU axis -> the most the target allows; SMs, registers
    shared_tiles: tuple[Footprint, ...] = ()  # per tile cached in shared memory, inside the level it is fetched at
    local_tiles: tuple[Footprint, ...] = ()  # per buffer a thread keeps (its accumulator)
    # every limit that the decisions change is a form above (threads, vthreads, each shared
    # and local tile): what else the GPU verifier checks is the trace's structure, the same for all rows
    limits_in_decisions: bool = False
    _index: list[dict] = field(default_factory=list, repr=False)
    _log_tables: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = [{d: n for n, d in enumerate(slot.domain)} for slot in self.slots]
        self._log_tables = {n: np.log2(np.asarray(slot.domain if slot.role == "tile" else slot.values, dtype=float))
                            .reshape(len(slot.domain), -1) for n, slot in enumerate(self.slots)
                            if any(column_slot == n for column_slot, _ in self.factor_columns)}

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(slot.domain) for slot in self.slots], dtype=np.int64)

    def index_of(self, slot: int, decision) -> int | None:
        """Position of ``decision`` in the domain of ``slot``; None if it is not there."""
        return self._index[slot].get(decision)

    def decisions(self, row: Sequence[int]) -> dict[int, object]:
        return {slot.step: slot.domain[int(i)] for slot, i in zip(self.slots, row)}

    def trace_of(self, row: Sequence[int]) -> Trace:
        return self.trace.with_decisions(self.decisions(row))

    def row_of(self, trace: Trace, dumped: str | None = None) -> np.ndarray | None:
        """The candidate a (recorded) trace stands for, or None if it is not of this sketch.
        ``dumped``: the trace as compact JSON where it is at hand (a record's), which spares
        making it again when it matches."""
        if len(trace.steps) != len(self.trace.steps):
            return None
        row = []
        for slot in self.slots:
            index = self.index_of(len(row), trace.steps[slot.step].decision)
            if index is None:
                return None
            row.append(index)
        mine = self.trace_of(row).dumps()
        if mine != dumped and mine != trace.dumps():
            return None
        return np.array(row, dtype=np.int64)

    def row_by_decisions(self, trace: Trace) -> np.ndarray | None:
        """The candidate whose decisions a trace of an earlier form of this sketch took, where
        both forms make the same program: the same sampling steps in the same order, the
        steps between them free to differ, and every tile one whose outer counts give back
        its inner lengths. (The consumers of fused tiles were once split by the tiles' outer
        counts: 16 columns padded over 56 gave 4 consumer tiles of 14, not of 16.) A record
        kept from then still teaches the model and counts as measured. Weights packed otherwise
        (before bfloat16 ones were packed in pairs) make another program: no candidate."""
        sampled = [step for step in trace.steps if step.kind in SAMPLING_STEPS]
        if len(sampled) != len(self.slots) or _packings(trace) != _packings(self.trace):
            return None
        row = []
        for slot, step in zip(self.slots, sampled):
            mine = self.trace.steps[slot.step]
            index = self.index_of(len(row), step.decision)
            if (step.kind != mine.kind or len(step.outputs) != len(mine.outputs) or index is None
                    or (slot.role == "tile" and not _follows_either_way(step.decision, math.prod(slot.domain[0])))):
                return None
            row.append(index)
        return np.array(row, dtype=np.int64)

    def log_factors(self, rows: np.ndarray) -> np.ndarray:
        """log2 of every tile factor of every candidate, one column per (slot, position)."""
        out = np.zeros((len(rows), len(self.factor_columns)))
        for column, (slot, position) in enumerate(self.factor_columns):
            out[:, column] = self._log_tables[slot][rows[:, slot], position]
        return out

    def sample(self, rng: np.random.Generator, count: int, min_parallel: int) -> np.ndarray:
        """Random candidates: tiles, unroll steps and locations uniform, but for a share
        of register tiles that fit the registers; the parallel depth as Ansor's
        InitParallel picks it (the fewest outer loops with more than ``min_parallel``
        iterations); on a GPU, drawn again where they break its limits, up to
        ``GPU_REDRAWS`` draws a candidate (a 4096³ matmul's tiles fit in 7 of 1,000 draws), so
        that what is left over a limit is rare; and so are blocks short of a warp (``full_warps``)."""
        rows = self.fix_parallel(apply_register_tiles(self, self.sample_uniform(rng, count), rng), min_parallel)
        for _ in range(GPU_REDRAWS // GPU_REDRAW_BATCH if self.gpu_limits else 0):
            broken = np.flatnonzero(~(self.within_gpu_limits(rows) & self.full_warps(rows)))
            if not len(broken):
                break
            drawn = self.sample_uniform(rng, len(broken) * GPU_REDRAW_BATCH)
            fitting = drawn[self.within_gpu_limits(drawn) & self.full_warps(drawn)][:len(broken)]
            rows[broken[:len(fitting)]] = fitting
        return rows

    def full_warps(self, rows: np.ndarray) -> np.ndarray:
        """Whether each candidate's blocks have a warp's threads at least, where the sketch's
        blocks can (a row of 10 bound to threads cannot). A block of fewer leaves lanes of its
        warp idle at every instruction: in the kept H100 logs none came within 4.8x of the
        best (matmuls, a convolution, a dense layer), yet they took 5% to 88% of the trials
        and 53% to 98% of the time spent running kernels. The search neither samples nor
        proposes them."""
        return self._fills_a_warp(rows) | (not self._warps_possible)

    def _fills_a_warp(self, rows: np.ndarray) -> np.ndarray:
        return _threads_log(self.gpu_extents(rows), len(rows)) >= math.log2(WARP) - 1e-9

    @functools.cached_property
    def _warps_possible(self) -> bool:
        """Whether blocks of a warp are among 4,096 fixed draws that keep the limits."""
        rows = self.sample_uniform(np.random.default_rng(0), 4096)
        return bool(self._fills_a_warp(rows[self.within_gpu_limits(rows)]).any())

    def gpu_extents(self, rows: np.ndarray, logs: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per GPU axis, log2 of the size of the launch along it for each candidate: the
        largest extent bound to it (a block's threads are as many as its widest thread loop).
        ``logs``: the rows' ``log_factors``, where the caller has them."""
        logs = self.log_factors(rows) if logs is None else logs
        return {axis: np.max([form.evaluate(logs) for form in forms], axis=0) for axis, forms in self.gpu_axes.items()}

    def shared_bytes(self, rows: np.ndarray, logs: np.ndarray | None = None) -> np.ndarray:
        """Bytes of shared memory each candidate's block uses: per cached tile, the product
        over its dimensions of ``sum(|c| * (extent - 1)) + 1`` over the variables indexing it
        (a convolution's window, ``y + ry``, spans ``Ty + Try - 1`` rows), its rows padded as
        laid out, twice where a software pipeline doubles it. ``logs`` as for ``gpu_extents``."""
        logs = self.log_factors(rows) if logs is None else logs
        once = sum((_tile_bytes(tile, logs) for tile in self.shared_tiles), np.zeros(len(rows)))
        piped = [tile for tile in self.shared_tiles if tile.pipelined is not None]
        if piped:  # a second slot each, where the loop has two steps and they fit (ir/pipeline.py)
            twice = sum(_tile_bytes(tile, logs) for tile in piped)
            doubled = (piped[0].pipelined.evaluate(logs) > 0.5) & (once + twice <= SHARED_BYTES)
            once = once + np.where(doubled, twice, 0.0)
        return np.rint(once)

    def local_words(self, rows: np.ndarray, logs: np.ndarray | None = None) -> np.ndarray:
        """4-byte registers each candidate's thread keeps in its own buffers (the
        accumulator), each buffer rounded up to whole words. ``logs`` as for ``gpu_extents``."""
        logs = self.log_factors(rows) if logs is None else logs
        return sum((np.ceil(np.rint(_tile_bytes(tile, logs)) / 4) for tile in self.local_tiles), np.zeros(len(rows)))

    def within_gpu_limits(self, rows: np.ndarray) -> np.ndarray:
        """Whether each candidate keeps the target's threads per block, virtual threads,
        shared memory and registers for its accumulator, read from the decisions alone, as
        the CPU path checks its choices: a candidate that breaks them is never built (the
        verifier checks the lowered loops too)."""
        logs = self.log_factors(rows)
        fits = self.shared_bytes(rows, logs) <= self.gpu_limits.get("shared_bytes", np.inf)
        extents = self.gpu_extents(rows, logs)
        for axis, log_extent in extents.items():
            limit = self.gpu_limits.get(axis.split(".")[0])
            if limit is not None:
                fits &= log_extent <= np.log2(limit) + 1e-9
        threads_log = _threads_log(extents, len(rows))
        fits &= threads_log <= np.log2(self.gpu_limits.get("threadIdx", np.inf)) + 1e-9  # a block's, over its axes
        if self.local_tiles and "registers_per_block" in self.gpu_limits:
            threads = np.rint(np.exp2(threads_log))
            registers = registers_a_thread(threads.astype(int), self.gpu_limits["registers_per_block"],
                                           self.gpu_limits["registers_a_thread"])
            fits &= self.local_words(rows, logs) <= register_budget(registers)
        return fits

    def sample_uniform(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Random candidates, each decision uniform over its domain (as ``sample_perfect_tile``
        draws it; a categorical's probabilities are not used), a tiling padded with
        probability ``PADDED_SHARE`` where it can be (as ``sample_tile`` draws it)."""
        rows = (rng.random((count, len(self.slots))) * self.sizes).astype(np.int64)
        for n, slot in enumerate(self.slots):
            if slot.role == "tile" and slot.perfect < len(slot.domain):  # as sampling.sample_tile
                padded = rng.random(count) < PADDED_SHARE
                low = np.where(padded, slot.perfect, 0)
                high = np.where(padded, len(slot.domain), slot.perfect)
                rows[:, n] = low + (rng.random(count) * (high - low)).astype(np.int64)
        return rows

    def fix_parallel(self, rows: np.ndarray, min_parallel: int) -> np.ndarray:
        if not self.parallel_loops:
            return rows
        logs = self.log_factors(rows)
        for slot, forms in self.parallel_loops.items():
            cumulative = np.cumsum(np.stack([f.evaluate(logs) for f in forms], axis=1), axis=1)
            enough = cumulative > math.log2(min_parallel)
            rows[:, slot] = np.where(enough.any(axis=1), enough.argmax(axis=1), len(forms) - 1)
        return rows


def _threads_log(extents: dict[str, np.ndarray], count: int) -> np.ndarray:
    """log2 of a block's threads, over its thread axes, from ``Sketch.gpu_extents``."""
    return sum((e for axis, e in extents.items() if axis.startswith("threadIdx")), np.zeros(count))


def _tile_bytes(tile: Footprint, logs: np.ndarray) -> np.ndarray:
    """Bytes of a shared or local tile for each row of ``logs``: per dimension,
    ``sum(|c| * (extent - 1)) + 1`` over the variables indexing it, laid out in its
    ``order``, strides padded as its ``align`` says (``lower.laid_out``)."""
    wanted = {axis: (factor, offset) for axis, factor, offset in tile.align}
    order = tile.order or range(len(tile.dimensions))
    size = np.ones(len(logs))
    for position in reversed(range(len(tile.dimensions))):
        if position in wanted:
            factor, offset = wanted[position]
            size += np.mod(offset - size, factor)
        size *= 1 + sum(c * (np.rint(np.exp2(form.evaluate(logs))) - 1) for c, form in tile.dimensions[order[position]])
    return size * tile.element_bytes


def _packings(trace: Trace) -> list[dict]:
    """How a trace packs its weights: each ``rewrite_layout``'s arguments but the block."""
    return [{name: value for name, value in step.args if name != "block"} for step in trace.steps
            if step.kind == "rewrite_layout"]


def _follows_either_way(tiles: Sequence[int], extent: int) -> bool:
    """Whether a loop split by the outer counts of ``tiles`` at any level gets pieces as long as
    the inner lengths, as it does for every tiling that divides the loop."""
    return all(-(-extent // math.prod(tiles[:level])) == math.prod(tiles[level:]) for level in range(1, len(tiles)))


def analyze(dag: ComputeDAG, trace: Trace, name: str, target=None) -> Sketch:
    """Replay ``trace`` once and describe its sampling steps as slots (and, given the
    target, its register tiles)."""
    slots: list[Slot] = []
    columns: list[tuple[int, int]] = []
    forms: dict[int, LogForm] = {}  # loop id -> extent form
    factor_of: dict[str, LogForm] = {}  # symbol of a sampled tile factor -> its form
    block_names: dict[str, str] = {}
    parallel: dict[int, tuple[LogForm, ...]] = {}
    vector: dict[str, LogForm] = {}
    slot_of_symbol: dict[str, int] = {}
    gpu_axes: dict[str, list[LogForm]] = {}
    shared_reads: dict[str, tuple] = {}  # cached block -> (its consumer, the reads of it there)
    shared_tiles: list[tuple[str, int, Footprint]] = []  # the block, the loop it is fetched at, its footprint
    written: list[tuple[str, int]] = []  # shared tiles that blocks computed at a loop store: the block, the loop
    local_tiles: list = []
    local_owners: list[str] = []  # the stage whose buffer each local tile is
    fragments: set[str] = set()  # stages computed on tensor cores: their buffers spread over a warp's lanes
    unformed = 0  # shared or local tiles whose footprint no form says
    gpu = getattr(target, "kind", None) == "cuda"

    def form_of(sch: Schedule, loop_id: int) -> LogForm:
        if loop_id not in forms:
            forms[loop_id] = LogForm((), math.log2(max(sch.state.stage_of_loop(loop_id).loop(loop_id).extent, 1)))
        return forms[loop_id]

    def observe(sch: Schedule, index: int, step, kwargs: dict, result) -> None:
        nonlocal unformed
        kind = step.kind
        if kind in ("get_block", "cache_write", "cache_read"):
            block_names[step.outputs[0]] = result.name
            if kind == "cache_read" and kwargs["storage_scope"] == "shared":
                consumer = sch.state.stage(kwargs["block"].name)
                cache = sch.state.stage(result.name).tensor
                shared_reads[result.name] = (consumer, [r for r in reads_of(consumer.op) if r.tensor is cache])
        elif kind in ("sample_perfect_tile", "sample_tile"):
            stage = sch.state.stage_of_loop(kwargs["loop"].id)
            loop = stage.loop(kwargs["loop"].id)
            perfect = factorizations(loop.extent, kwargs["n"], kwargs["max_innermost_factor"])
            domain = perfect if kind == "sample_perfect_tile" else tile_factorizations(
                loop.extent, kwargs["n"], kwargs["max_innermost_factor"])
            slots.append(Slot(index, "tile", f"{stage.name}.{loop.name}", domain, spatial=loop.kind == "spatial",
                              perfect=len(perfect)))
            for position, symbol in enumerate(step.outputs):
                factor_of[symbol] = LogForm(((len(columns), 1.0),), 0.0)
                columns.append((len(slots) - 1, position))
        elif kind == "sample_categorical":
            slot_of_symbol[step.outputs[0]] = len(slots)
            slots.append(Slot(index, "categorical", f"categorical{index}", tuple(range(len(kwargs["candidates"]))),
                              tuple(kwargs["candidates"])))
        elif kind == "sample_compute_location":
            block = kwargs["block"].name
            domain = tuple(sch.compute_location_candidates(kwargs["block"]))
            consumers = [c.op for c in sch.state.consumers_of(block)]
            window = INLINE in domain and reused_only_in_a_window(sch.state.stage(block).tensor, consumers)
            slots.append(Slot(index, "location", f"{block}.location", domain, inline_first=window))
        elif kind == "split":
            parent = form_of(sch, kwargs["loop"].id)
            for f in kwargs["factors"]:  # a sampled thread count: its value's log2 becomes a column
                symbol = getattr(f, "symbol", None)
                if symbol in slot_of_symbol and symbol not in factor_of:
                    factor_of[symbol] = LogForm(((len(columns), 1.0),), 0.0)
                    columns.append((slot_of_symbol[symbol], 0))
            known = [factor_of.get(getattr(f, "symbol", None)) if f is not None else None for f in kwargs["factors"]]
            known = [k if k is not None or f is None else LogForm((), math.log2(int(f)))
                     for k, f in zip(known, kwargs["factors"])]
            rest = parent
            for k in known:
                if k is not None:
                    rest = rest + k.scaled(-1.0)
            for child, k in zip(result, known):
                forms[child.id] = k if k is not None else rest
        elif kind == "fuse":
            total = LogForm((), 0.0)
            for loop in kwargs["loops"]:
                total = total + form_of(sch, loop.id)
            forms[result.id] = total
        elif kind == "annotate" and kwargs["ann_key"] in ("meta_schedule.parallel", "pragma_auto_unroll_max_step"):
            symbol = getattr(dict(step.args).get("ann_val"), "symbol", None)
            if symbol in slot_of_symbol:
                slot_index = slot_of_symbol[symbol]
                target = kwargs["block_or_loop"]
                block = target.name if isinstance(target, BlockRV) else sch.state.stage_of_loop(target.id).name
                role = "parallel" if kwargs["ann_key"] == "meta_schedule.parallel" else "unroll"
                old = slots[slot_index]
                slots[slot_index] = Slot(old.step, role, f"{block}.{role}", old.domain, old.values)
                if role == "parallel":
                    stage = sch.state.stage(block)
                    count = len(old.values)
                    parallel[slot_index] = tuple(form_of(sch, leaf) for leaf in stage.leaves[:count])
        elif kind == "rfactor":  # the block now reduces the partials over a loop as long as the factored one
            forms[sch.state.consumers_of(result.name)[0].roots[-1]] = form_of(sch, kwargs["loop"].id)
        elif kind == "bind":
            gpu_axes.setdefault(kwargs["thread_axis"], []).append(form_of(sch, kwargs["loop"].id))
            stage = sch.state.stage_of_loop(kwargs["loop"].id)
            if kwargs["thread_axis"].startswith("threadIdx") and stage.loop(kwargs["loop"].id).kind != "spatial":
                local_tiles.extend([Footprint(bytes_of(accumulates_in(stage.op.dtype)), ())] * 2)  # partial, result
                local_owners.extend([stage.name] * 2)
        elif kind == "compute_at" and kwargs["block"].name in shared_reads:
            tile = _shared_tile(*shared_reads.pop(kwargs["block"].name), kwargs["loop"].id,
                                lambda loop_id: form_of(sch, loop_id))
            if tile is not None:
                shared_tiles.append((kwargs["block"].name, kwargs["loop"].id, tile))
            unformed += tile is None
        elif kind == "compute_at" and gpu and sch.state.stage(kwargs["block"].name).scope == "shared":
            written.append((kwargs["block"].name, kwargs["loop"].id))  # a tile the block's threads store together
        elif kind == "compute_at" and gpu:  # the block's buffer is a thread's, at the loop it is computed at
            at = kwargs["loop"].id
            consumer = sch.state.stage_of_loop(at)
            tensor = sch.state.stage(kwargs["block"].name).tensor
            tile = _local_tile(consumer, [r for r in reads_of(consumer.op) if r.tensor is tensor], at,
                               lambda loop_id: form_of(sch, loop_id))
            if tile is not None:
                local_tiles.append(tile)
                local_owners.append(kwargs["block"].name)
            unformed += tile is None
        elif kind == "annotate" and kwargs["ann_key"] == "tensor_core":
            fragments.add(sch.state.stage_of_loop(kwargs["block_or_loop"].id).name)
        elif kind == "annotate" and kwargs["ann_key"] == "meta_schedule.vectorize":
            block = kwargs["block_or_loop"].name
            vector[block] = form_of(sch, sch.state.stage(block).leaves[-1])

    final = trace.replay(dag, observe=observe)
    for block, at in written:  # sized by the block's own loops, split once it was computed there
        tile = _written_tile(final.state.stage(block), lambda loop_id: form_of(final, loop_id))
        shared_tiles += [(block, at, tile)] if tile is not None else []
        unformed += tile is None
    for n, (block, at, tile) in enumerate(shared_tiles):  # rows padded; a second slot where a pipeline may add it
        piped = dict(final.state.stage_of_loop(at).loop(at).pragmas).get("software_pipeline", 0) >= 2
        stage = final.state.stage(block)
        shared_tiles[n] = (block, at, tile._replace(align=stage.align, order=stage.order,
                                                    pipelined=form_of(final, at) if piped else None))
    if fragments:  # registers a lane for each 16x16 tile, on the 32 lanes of threadIdx.x (ir/tensor_core.py)
        local_tiles = [tile._replace(element_bytes=4 * fragment_registers(final.state.stage(owner).tensor.dtype) / 256)
                       if owner in fragments else tile for tile, owner in zip(local_tiles, local_owners)]
        gpu_axes.setdefault("threadIdx.x", []).append(LogForm((), math.log2(WARP)))
    sketch = Sketch(name, trace, tuple(slots), tuple(columns), parallel, vector,
                    gpu_axes={axis: tuple(forms_) for axis, forms_ in gpu_axes.items()},
                    shared_tiles=tuple(tile for _, _, tile in shared_tiles), local_tiles=tuple(local_tiles))
    if gpu:
        sketch.gpu_limits = {"threadIdx": target.max_threads_per_block, "vthread": target.max_vthread,
                             "shared_bytes": target.max_shared_memory_per_block_optin, "sm_count": target.sm_count,
                             "registers_per_block": target.registers_per_block,
                             "registers_a_thread": target.max_registers_per_thread}
        sketch.limits_in_decisions = not (unformed or shared_reads or vector
                                          or any(slot.role == "location" for slot in slots))
    elif target is not None:
        sketch.register_tiles = find_register_tiles(sketch, {t.op.name: t.op for t in dag.compute_ops}, target)
    return sketch


def _shared_tile(consumer, reads, at: int, form_of: Callable[[int], LogForm]):
    """A shared tile's footprint as ``Sketch.shared_tiles`` holds it, where it is fetched at
    loop ``at``, the outermost piece of one of the consumer's reduction loops (the GPU
    tilings', ``gpu_rules.py``): every piece but the outermost of each split loop of the
    consumer (split once or again) lies inside it (the outer spatial levels are bound to the
    block's threads, over which the tile is shared), and a loop left whole counts one value
    where it lies outside the fetch (split-K's part), all of itself where inside. None where
    it is fetched elsewhere, a loop is fused, or it is read in ways the forms do not say."""
    if len(reads) != 1 or any(not isinstance(r, Split) for r in consumer.relations):
        return None
    root_of = {root: root for root in consumer.roots}
    for relation in consumer.relations:
        root_of.update((child, root_of[relation.parent]) for child in relation.children)
    leaves = list(consumer.leaves)
    pieces = {root: [leaf for leaf in leaves if root_of[leaf] == root] for root in consumer.roots}
    if not any(len(pieces[root]) > 1 and pieces[root][0] == at for root in consumer.roots[len(consumer.op.axis):]):
        return None
    extents = {}
    for iv, root in zip((*consumer.op.axis, *consumer.op.reduce_axis), consumer.roots):
        mine = pieces[root]
        inside = mine[1:] if len(mine) > 1 else mine if leaves.index(root) > leaves.index(at) else ()
        extents[iv.var] = sum((form_of(piece) for piece in inside), LogForm((), 0.0))
    dimensions = _read_dimensions(consumer, reads[0], extents)
    return None if dimensions is None else Footprint(bytes_of(reads[0].tensor.dtype), dimensions)


def _written_tile(stage, form_of: Callable[[int], LogForm]):
    """The tile that ``stage`` (a copy, computed at a loop of another, its buffer indexed by its
    axes) writes, as ``Sketch.shared_tiles`` holds it: per axis, the sum of its pieces' extents,
    a fused loop's parents each. None where a fused loop is split again."""
    root_of = {root: root for root in stage.roots}
    fused_of: dict[int, tuple[int, ...]] = {}
    for relation in stage.relations:
        if isinstance(relation, Fuse):
            fused_of[relation.child] = relation.parents
        elif relation.parent in root_of:
            root_of.update((child, root_of[relation.parent]) for child in relation.children)
        else:
            return None

    def pieces(loop: int) -> list[int]:
        return [p for parent in fused_of[loop] for p in pieces(parent)] if loop in fused_of else [loop]

    extents = {root: LogForm((), 0.0) for root in stage.roots}
    for piece in (p for leaf in stage.leaves for p in pieces(leaf)):
        extents[root_of[piece]] = extents[root_of[piece]] + form_of(piece)
    return Footprint(bytes_of(stage.op.dtype), tuple(((1, extents[root]),) for root in stage.roots))


def _local_tile(consumer, reads, at: int, form_of: Callable[[int], LogForm]):
    """The footprint of a block computed at loop ``at`` of ``consumer``, as
    ``Sketch.local_tiles`` holds it: what one thread reads of it inside ``at``, so every
    loop of the consumer after ``at`` counts but those bound to threads or blocks (each thread
    keeps its own buffer), times the virtual threads outside ``at`` (each keeps a copy). None
    where a loop inside mixes axes (a fusion), or the block is read in ways the forms do not say."""
    roots_of = {root: {root} for root in consumer.roots}
    for relation in consumer.relations:
        if isinstance(relation, Split):
            for child in relation.children:
                roots_of[child] = roots_of[relation.parent]
        else:
            roots_of[relation.child] = set().union(*(roots_of[p] for p in relation.parents))
    leaves = list(consumer.leaves)
    reads = list({tuple(map(str, r.indices)): r for r in reads}.values())  # a GELU reads its input twice
    if len(reads) != 1 or at not in leaves:
        return None
    extents = {root: LogForm((), 0.0) for root in consumer.roots}
    outside = LogForm((), 0.0)  # the virtual threads around it, each with a copy (ir/vthread.py)
    for n, leaf in enumerate(leaves):
        annotation = consumer.loop(leaf).annotation
        if n <= leaves.index(at):
            outside = outside + form_of(leaf) if annotation.startswith("vthread") else outside
            continue
        if annotation.startswith(("threadIdx", "blockIdx")):
            continue
        if len(roots_of[leaf]) != 1:
            return None
        root, = roots_of[leaf]
        extents[root] = extents[root] + form_of(leaf)
    of_var = {iv.var: extents[root] for iv, root in zip((*consumer.op.axis, *consumer.op.reduce_axis), consumer.roots)}
    dimensions = _read_dimensions(consumer, reads[0], of_var)
    held = accumulates_in(reads[0].tensor.dtype) if reads[0].tensor.op.reduce_axis else reads[0].tensor.dtype
    return None if dimensions is None else Footprint(bytes_of(held), (((1, outside),), *dimensions))


def _read_dimensions(consumer, read, extents: dict) -> tuple | None:
    """Per dimension of ``read`` (a read in ``consumer``), the (|coefficient|, extent form) of
    each variable its index steps with, from ``extents`` (variable -> form); None where an
    index is not linear in variables that ``extents`` has."""
    ranges = {iv.var: iv.extent for iv in (*consumer.op.axis, *consumer.op.reduce_axis)}
    dimensions = []
    for index in read.indices:
        terms = to_linear(index, ranges).terms
        if not all(isinstance(v, Var) and v in extents for v in terms):
            return None
        dimensions.append(tuple((abs(c), extents[v]) for v, c in terms.items()))
    return tuple(dimensions)


class ScheduleFn:
    """A user's stochastic schedule function as the search space, MetaSchedule style:
    ``fn(sch)`` applies primitives and sampling steps (``sch.sample_perfect_tile(...)``);
    it runs once, and its trace, replayed with other decisions, gives every candidate.
    So the steps must not depend on the sampled values (no Python ``if`` on them).

    Args:
        fn: The schedule function.
        name: The space's name in logs and records; the function's name by default.

    Example:
        ::

            def schedule_mm(sch):
                i, j, k = sch.get_loops(sch.get_block("C"))
                j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
                sch.reorder(i, j0, k, j1)

            database = tc.tune_tir(dag, "llvm", "./tune_tmp", max_trials_global=64, space=tc.ScheduleFn(schedule_mm))
    """

    def __init__(self, fn: Callable[[Schedule], None], name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "schedule_fn")

    def generate(self, dag: ComputeDAG, target=None) -> list[Sketch]:
        """Run the function once on a schedule of ``dag`` and return its trace as the one
        sketch of the space.

        Raises:
            ScheduleError: If the function's primitives fail on ``dag``.
        """
        sch = Schedule(dag, seed=0)
        self.fn(sch)
        return [analyze(dag, sch.trace, self.name, target)]


def generate_sketches(dag: ComputeDAG, rules: list | None = None, target=None) -> list[Sketch]:
    """The sketches of ``dag``: every draft of the sketch rules, annotated; deterministic
    for a given target (without one, the rules see the host's cores)."""
    from .annotation import annotate
    from .gpu_rules import GPU_SKETCH_RULES, annotate_gpu
    from .sketch_rules import derive_drafts

    sketches: dict[str, Sketch] = {}
    gpu = getattr(target, "kind", "llvm") == "cuda"
    if gpu:  # parallelism is counted in SMs, rules and annotation are the GPU's
        num_cores, rules, annotate = target.sm_count, GPU_SKETCH_RULES if rules is None else rules, annotate_gpu
    else:
        num_cores = (target or Target.host()).num_cores
    for draft in derive_drafts(Schedule(dag, seed=0), num_cores, rules, target):
        trace = annotate(draft).trace
        name = " ".join(draft.steps) or "default"
        if trace.dumps() not in {s.trace.dumps() for s in sketches.values()}:
            while name in sketches:
                name += "'"
            sketches[name] = analyze(dag, trace, name, target)
    return list(sketches.values())
