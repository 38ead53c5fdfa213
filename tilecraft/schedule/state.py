"""The loop state of a schedule: one ``Stage`` per block, each an immutable value.

A stage keeps the loops of its computation the way TE and Ansor do: the *root* loops
are the compute's axes; ``Split`` and ``Fuse`` relations derive new loops from them;
``leaves`` is the current loop order. Extents are nominal here (used for sampling and
printing); lowering infers the real ranges from where the stage is attached.

Every primitive builds a new ``State`` from the old one, so a primitive that fails
leaves the schedule untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..te.tensor import ComputeOp, Tensor


@dataclass(frozen=True, slots=True)
class Loop:
    """One loop variable of a stage. ``kind`` is spatial, reduce or mixed (a fused loop of both)."""

    id: int
    name: str
    kind: str
    extent: int
    annotation: str = ""  # "" | parallel | vectorize | unroll
    pragmas: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Split:
    """``parent = ((c0 * f1 + c1) * f2 + c2) ...``; ``factors`` are the extents of ``children[1:]``."""

    parent: int
    children: tuple[int, ...]
    factors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Fuse:
    """``child`` iterates over the product of ``parents`` (outermost first)."""

    parents: tuple[int, ...]
    child: int


@dataclass(frozen=True, slots=True)
class Attach:
    """Where a stage's loop nest lives: inside ``loop`` of ``stage``.

    ``reverse`` is False for compute_at (this stage produces for the stage it is attached
    to) and True for reverse_compute_at (this stage consumes what that stage produced).
    """

    stage: str
    loop: int
    reverse: bool


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    op: ComputeOp
    tensor: Tensor  # the buffer this stage writes; consumers read it
    loops: tuple[Loop, ...]
    roots: tuple[int, ...]  # ids of op.axis + op.reduce_axis, in that order
    relations: tuple[Split | Fuse, ...] = ()
    leaves: tuple[int, ...] = ()
    attach: Attach | None = None
    scope: str = "global"  # global | local
    init_loop: int | None = None  # decompose_reduction: the loop the init is placed before
    is_output: bool = False
    annotations: tuple[tuple[str, int], ...] = ()  # block intents realized at lowering (postproc.py)
    order: tuple[int, ...] = ()  # transform_layout on its write: its buffer's dimensions in memory, outermost first
    align: tuple[tuple[int, int, int], ...] = ()  # storage_align: (axis of that order, factor, offset) of its strides

    def loop(self, loop_id: int) -> Loop:
        for loop in self.loops:
            if loop.id == loop_id:
                return loop
        raise KeyError(loop_id)

    def has_loop(self, loop_id: int) -> bool:
        return any(loop.id == loop_id for loop in self.loops)

    @property
    def is_reduction(self) -> bool:
        return bool(self.op.reduce_axis)

    def with_loop(self, loop: Loop) -> Stage:
        return replace(self, loops=tuple(loop if l.id == loop.id else l for l in self.loops))


@dataclass(frozen=True, slots=True)
class PackedInput:
    """A layout-free placeholder stored in another layout, packed once outside the kernel.

    ``packed`` is the tensor the kernel reads; ``index_map`` maps the original indices
    (as variables ``source_vars``) to the packed ones.
    """

    source: Tensor
    packed: Tensor
    source_vars: tuple
    index_map: tuple


@dataclass(frozen=True, slots=True)
class State:
    stages: tuple[Stage, ...]
    packed: tuple[PackedInput, ...] = ()
    next_id: int = 0

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def stage_of_loop(self, loop_id: int) -> Stage:
        for stage in self.stages:
            if stage.has_loop(loop_id):
                return stage
        raise KeyError(loop_id)

    def producers_of(self, stage: Stage) -> list[Stage]:
        """The stages whose output ``stage`` reads, in state (topological) order."""
        return [s for s in self.stages if any(t is s.tensor for t in stage.op.input_tensors)]

    def consumers_of(self, name: str) -> list[Stage]:
        tensor = self.stage(name).tensor
        return [s for s in self.stages if any(t is tensor for t in s.op.input_tensors)]

    def with_stage(self, stage: Stage) -> State:
        return replace(self, stages=tuple(stage if s.name == stage.name else s for s in self.stages))

    def new_ids(self, count: int) -> tuple[State, list[int]]:
        return replace(self, next_id=self.next_id + count), list(range(self.next_id, self.next_id + count))


def initial_stage(op: ComputeOp, tensor: Tensor, first_id: int, is_output: bool) -> Stage:
    axes = op.axis + op.reduce_axis
    loops = tuple(
        Loop(first_id + n, iv.name, iv.kind, iv.extent) for n, iv in enumerate(axes)
    )
    ids = tuple(loop.id for loop in loops)
    return Stage(op.name, op, tensor, loops, ids, (), ids, is_output=is_output)


def root_loops_of(stage: Stage, loop_id: int) -> set[int]:
    """The root loops (the compute's axes) that loop ``loop_id`` of ``stage`` steps through,
    following splits back to their parent and fuses back to every fused loop."""
    found, pending = set(), [loop_id]
    while pending:
        current = pending.pop()
        if current in stage.roots:
            found.add(current)
        for relation in stage.relations:
            if isinstance(relation, Split) and current in relation.children:
                pending.append(relation.parent)
            elif isinstance(relation, Fuse) and relation.child == current:
                pending.extend(relation.parents)
    return found


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def common_prefix(paths: list[list[int]]) -> list[int]:
    """The loops that lead to every one of ``paths`` (loop ids, outermost first)."""
    if not paths:
        return []
    common = 0
    while all(len(p) > common and p[common] == paths[0][common] for p in paths):
        common += 1
    return paths[0][:common]
