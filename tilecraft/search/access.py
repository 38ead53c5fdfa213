"""What a stage's reads say about how to schedule it (Ansor's access analysis)."""

from __future__ import annotations

import math

from ..te.arith import to_linear
from ..te.dtype import bytes_of
from ..te.expr import Call, Const, Expr, Select, TensorRead, Var, free_vars, walk
from ..te.tensor import ComputeOp, PlaceholderOp, Tensor

# Math calls that cost far more than a load; recomputing them per use is not free.
EXPENSIVE_CALLS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "pow")


def reads_of(op: ComputeOp) -> list[TensorRead]:
    found: list[TensorRead] = []
    walk(op.body, lambda n: found.append(n) if isinstance(n, TensorRead) else None)
    return found


def read_vars(read: TensorRead) -> set:
    """The variables that index ``read``: the axes along which it reads different elements."""
    return set().union(*(free_vars(i) for i in read.indices))


def is_strictly_inlineable(op: ComputeOp) -> bool:
    """Element-wise, branch-free, no expensive math, every read in the axes' order (a
    broadcast read pins a unit dimension to the constant 0, which is still in order)."""
    if op.reduce_axis:
        return False
    awkward: list[object] = []
    walk(op.body, lambda n: awkward.append(n) if isinstance(n, Select) or (
        isinstance(n, Call) and n.name in EXPENSIVE_CALLS) else None)
    if awkward:
        return False
    axes = [iv.var for iv in op.axis]
    for read in reads_of(op):
        indices = [i for i in read.indices if not isinstance(i, Const)]
        if not all(isinstance(i, Var) and i in axes for i in indices):
            return False
        positions = [axes.index(i) for i in indices]
        if positions != sorted(set(positions)):
            return False
    return True


def reduces_outside_lanes(op: ComputeOp) -> bool:
    """A reduction that needs no tiling (a pool over NHWC) whose every read moves along its
    innermost output axis as that axis does: its window can run outside vector lanes over
    that axis (``sketch_rules.WindowOutsideLanes``)."""
    if not op.reduce_axis or not op.axis or needs_multi_level_tiling(op):
        return False
    reads = reads_of(op)
    return bool(reads) and all(read.indices and read.indices[-1] == op.axis[-1].var for read in reads)


def needs_multi_level_tiling(op: ComputeOp) -> bool:
    """A reduction some input of which misses an output axis: the same input element is
    reused across iterations, so tiling pays. As in MetaSchedule, element-wise ops are
    never tiled (Ansor also tiles one that misses two axes, which a broadcast bias does)."""
    if not op.reduce_axis:
        return False
    axes = [iv.var for iv in op.axis if iv.extent > 1]
    for read in reads_of(op):
        used = read_vars(read)
        if any(axis not in used for axis in axes):
            return True
    return False


def reused_only_in_a_window(producer: Tensor, consumers: list[ComputeOp]) -> bool:
    """``producer`` is cheap (no reduction, no costly math: a padding) and every consumer is
    a reduction over weights that indexes it with all of its non-unit spatial axes, so an
    element is read again only within one output's window (a depthwise convolution), never
    across an output axis (a convolution's output channels). Then computing it apart saves
    no work and costs a pass over memory: inlined, MobileNetV2's depthwise layers ran
    1.1-2.7x faster in the model. A pool reads no weights: its loop reduced channel by channel
    ran 6x slower with the bounds check inside, so it qualifies only where it reduces its
    window outside its vector lanes (``reduces_outside_lanes``) and the padding's bounds do not
    depend on the lanes: one check a vector (GoogLeNet's 3x3 max pool of 56x56x192 down to
    28x28, padding apart: 0.143 ms; inlined: 0.059)."""
    op = producer.op
    if not isinstance(op, ComputeOp) or op.reduce_axis or not consumers:
        return False
    costly: list[object] = []
    walk(op.body, lambda n: costly.append(n) if isinstance(n, Call) and n.name in EXPENSIVE_CALLS else None)
    if costly:
        return False
    lanes = op.axis[-1].var if op.axis else None
    conditions: list[Expr] = []
    walk(op.body, lambda n: conditions.append(n.cond) if isinstance(n, Select) else None)
    for consumer in consumers:
        every = reads_of(consumer)
        reads = [r for r in every if r.tensor is producer]
        if not consumer.reduce_axis or not reads:
            return False
        if len(reads) == len(every):  # no weights read: a pool
            if not reduces_outside_lanes(consumer) or any(lanes in free_vars(c) for c in conditions):
                return False
            continue
        axes = {iv.var for iv in consumer.axis if iv.extent > 1}
        if any(not axes <= read_vars(r) for r in reads):
            return False
    return True


def _axis_var(op: ComputeOp, axis_name: str):
    """The variable of ``op``'s spatial axis named ``axis_name`` (None if it has none)."""
    return next((iv.var for iv in op.axis if iv.var.name == axis_name), None)


def broadcasts(op: ComputeOp, axis_name: str) -> bool:
    """Some operand of ``op`` misses its axis ``axis_name``, so one load of it feeds a row of
    a register tile (a matmul's A across j, a convolution's input across output channels).
    Without one (a depthwise convolution: every read indexes the channel), each FMA loads
    its own operand and more accumulators reuse nothing."""
    axis = _axis_var(op, axis_name)
    return axis is None or any(axis not in read_vars(read) for read in reads_of(op))


def row_kinds(op: ComputeOp, axis_name: str, row_axes: list[str]) -> tuple[list[bool], list[bool]]:
    """For each axis of ``row_axes``: whether it indexes an operand that misses the vector
    axis ``axis_name`` (a broadcast, loaded once a row), and whether it indexes one that
    does not (loaded as vectors, again for each of its rows)."""
    axis = _axis_var(op, axis_name)
    reads = [(read_vars(read), axis is None or axis not in read_vars(read)) for read in reads_of(op)]
    kinds = ([], [])
    for name in row_axes:
        var = _axis_var(op, name)
        kinds[0].append(any(var in used for used, missing in reads if missing))
        kinds[1].append(any(var in used for used, missing in reads if not missing))
    return kinds


def vector_read_step(op: ComputeOp, axis_name: str) -> int:
    """The largest step that a read moves along its innermost dimension as axis
    ``axis_name`` steps by one (2 for a stride-2 convolution's input over NCHW columns; 0
    where no read's innermost index moves with it)."""
    axis = _axis_var(op, axis_name)
    steps = [abs(to_linear(read.indices[-1], {}).terms.get(axis, 0)) for read in reads_of(op)
             if read.indices and axis in free_vars(read.indices[-1])]
    return max(steps, default=0)


def weights_outweigh_rows(op: ComputeOp, axis_name: str, cache_bytes: int | None = None) -> bool:
    """The operands that index axis ``axis_name`` (a convolution's weights across output
    channels) hold more elements than those that miss it (its input rows), or outgrow
    ``cache_bytes`` (a core's L2), so a tile of that axis should stay in cache while the
    rows pass, not be read again for each row: a 1024³ matmul's B (4 MB) read once per
    6-row tile ran at half the speed of B's panels read once each (AVX-512), while a 512³
    one (1 MB) lost 14% by it."""
    axis = _axis_var(op, axis_name)
    if axis is None:
        return False
    sizes = {True: 0, False: 0}
    for tensor, along in {read.tensor: axis in read_vars(read) for read in reads_of(op)}.items():
        sizes[along] += math.prod(tensor.shape)
    outgrows = cache_bytes is not None and sizes[True] * bytes_of(op.dtype) > cache_bytes
    return (sizes[True] > sizes[False] or outgrows) and sizes[False] > 0


def is_elementwise_reader(consumer: ComputeOp, producer: Tensor, crops: bool = False) -> bool:
    """``consumer`` reads ``producer`` only at its own indices, in order, without reducing;
    where ``crops``, also over a part of it (each axis no longer than the producer's: a
    product padded to whole tiles, cropped, ``ops.conv2d_nhwc_gemm``)."""
    same = len(consumer.shape) == len(producer.shape) and all(
        c <= p if crops else c == p for c, p in zip(consumer.shape, producer.shape))
    if consumer.reduce_axis or not same:
        return False
    axes = tuple(iv.var for iv in consumer.axis)
    reads = [r for r in reads_of(consumer) if r.tensor is producer]
    return bool(reads) and all(r.indices == axes for r in reads)


def layout_free_reads(op: ComputeOp) -> list[int]:
    """Indices (into ``op.input_tensors``) of the layout-free weights the op reads."""
    free = op.attrs.get("layout_free_placeholders", [])
    return [n for n, t in enumerate(op.input_tensors)
            if isinstance(t.op, PlaceholderOp) and any(t is f for f in free)]


def transposed_axis(op: ComputeOp) -> int | None:
    """The axis along which a pure transpose reads its input contiguously, when loops other
    than its vector loop lie between that axis and the vector loop (NHWC back to NCHW):
    every index of the read a distinct axis, the last of them before the last two axes.
    None for every other block."""
    if op.reduce_axis:
        return None
    axes = [iv.var for iv in op.axis]
    for read in reads_of(op):
        if (not read.indices or not all(isinstance(i, Var) and i in axes for i in read.indices)
                or len(set(read.indices)) != len(axes)):
            continue  # a scalar read (a 0-d tensor) moves along no axis
        last = axes.index(read.indices[-1])
        if last < len(axes) - 2:
            return last
    return None


def reduces_contiguously(op: ComputeOp) -> bool:
    """Whether every read that moves with the innermost reduction axis moves along its last
    index, so vector lanes over that axis load whole vectors (a softmax's or layer norm's
    row), not gathers (a sum over H of NHWC)."""
    if not op.reduce_axis:
        return False
    inner = op.reduce_axis[-1].var
    reads = [read for read in reads_of(op) if inner in read_vars(read)]
    return bool(reads) and all(read.indices[-1] == inner for read in reads)
