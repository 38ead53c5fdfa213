"""Tensors and the operations that define them: placeholders and computes.

A ``Tensor`` is the output of an operation. A ``PlaceholderOp`` is an input; a
``ComputeOp`` defines each element by an expression of its axes (``IterVar``s), with
an optional reduction as the whole body. Tensors compare by identity: two
placeholders both named ``A`` are different inputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import TeError
from .dtype import DTYPES, supported
from .expr import Const, Expr, ExprLike, Reduce, Select, TensorRead, Var, convert, walk


@dataclass(frozen=True, slots=True)
class IterVar:
    """An axis of a compute: ``var`` ranges over ``[0, extent)``; ``kind`` is spatial or reduce."""

    var: Var
    extent: int
    kind: str  # "spatial" | "reduce"

    @property
    def name(self) -> str:
        """The name of the axis variable."""
        return self.var.name

    def __str__(self) -> str:
        return self.name


def _delegate_to_var(method: str):
    return lambda self, *args: getattr(self.var, method)(*args)


for _method in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
                "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(IterVar, _method, _delegate_to_var(_method))  # axis arithmetic, as with TVM's IterVar


@dataclass(frozen=True, slots=True, eq=False)
class PlaceholderOp:
    """The operation of an input tensor: it has a name, a shape and a dtype, and no body."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class ComputeOp:
    """``output[axis...] = body``; ``body`` is a ``Reduce`` for reductions."""

    name: str
    axis: tuple[IterVar, ...]
    body: Expr
    dtype: str
    attrs: dict[str, Any] = field(default_factory=dict)
    # input_tensors, found once: the body never changes, and the scheduler asks for every stage's
    # readers many times a candidate
    _inputs: tuple[Tensor, ...] | None = field(default=None, init=False, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """The output's shape, the extents of ``axis``."""
        return tuple(iv.extent for iv in self.axis)

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        """The reduction axes of the body; empty when it is not a reduction."""
        return self.body.axes if isinstance(self.body, Reduce) else ()

    @property
    def input_tensors(self) -> list[Tensor]:
        """The tensors this op reads, each once, in order of first read."""
        if self._inputs is None:
            seen: dict[int, Tensor] = {}
            walk(self.body, lambda n: seen.setdefault(id(n.tensor), n.tensor) if isinstance(n, TensorRead) else None)
            object.__setattr__(self, "_inputs", tuple(seen.values()))
        return list(self._inputs)


@dataclass(frozen=True, slots=True, eq=False)
class Tensor:
    """The output of an operation: an input (``placeholder``) or a computed tensor (``compute``).

    Indexing a tensor with one integer expression per dimension, ``A[i, k]``, reads an
    element inside a compute's body. Tensors compare by identity: two placeholders both
    named ``A`` are different inputs.

    Attributes:
        op: The ``PlaceholderOp`` or ``ComputeOp`` that defines the tensor.
    """

    op: PlaceholderOp | ComputeOp

    @property
    def name(self) -> str:
        """The name of the defining operation (and of the block that computes it)."""
        return self.op.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The extent of each dimension."""
        return self.op.shape

    @property
    def dtype(self) -> str:
        """The element type, e.g. ``"float32"``."""
        return self.op.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def __getitem__(self, indices: ExprLike | Sequence[ExprLike]) -> Expr:
        """A read of the element at ``indices``, one integer expression per dimension.

        Raises:
            TeError: If the number of indices is not ``ndim`` or an index is not an integer.
        """
        if not isinstance(indices, tuple):
            indices = tuple(indices) if isinstance(indices, list) else (indices,)
        if len(indices) != self.ndim:
            raise TeError(
                f"tensor {self.name} has {self.ndim} dimensions {self.shape} but was indexed with "
                f"{len(indices)} indices; give one index per dimension"
            )
        converted = []
        for dim, index in enumerate(indices):
            index = convert(index.var if isinstance(index, IterVar) else index)
            if index.dtype not in ("int32", "int64"):
                raise TeError(f"index {dim} of {self.name} is {index} of dtype {index.dtype}; indices must be integers")
            converted.append(index)
        return TensorRead(self, tuple(converted))

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"


def _check_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    for extent in shape:
        if isinstance(extent, bool) or not isinstance(extent, int) or extent <= 0:
            raise TeError(f"{what} has shape {shape}; every dimension must be a positive int")
    return shape


def placeholder(shape: Sequence[int], name: str = "placeholder", dtype: str = "float32") -> Tensor:
    """Declare an input tensor of a computation.

    Args:
        shape: The extent of each dimension (positive ints); an int for one dimension.
        name: The input's name, unique in the computation; also the kernel argument's name.
        dtype: The element type, one of tilecraft's dtypes (``float32``, ``int32``, ...).

    Returns:
        The input tensor.

    Raises:
        TeError: If an extent is not a positive int or the dtype is unknown.
    """
    shape = _check_shape(shape, f"placeholder {name}")
    if not supported(dtype):
        raise TeError(f"placeholder {name} has unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return Tensor(PlaceholderOp(name, shape, dtype))


def reduce_axis(dom: tuple[int, int], name: str = "rv") -> IterVar:
    """Declare a reduction axis over ``range(lo, hi)``, for ``te.sum``, ``te.max`` and ``te.min``.

    Args:
        dom: ``(lo, hi)``; ``lo`` must be 0 (shift the index where it is used instead).
        name: The axis variable's name, as loops and printed code show it.

    Returns:
        The axis, usable in index expressions.

    Raises:
        TeError: If ``lo`` is not 0 or ``hi`` is not a positive int.
    """
    lo, hi = dom
    if lo != 0:
        raise TeError(f"reduce_axis {name} starts at {lo}; use (0, {hi - lo}) and add {lo} where it is indexed")
    if not isinstance(hi, int) or hi <= 0:
        raise TeError(f"reduce_axis {name} has extent {hi}; it must be a positive int")
    return IterVar(Var(name), hi, "reduce")


def compute(
    shape: Sequence[int],
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    attrs: dict[str, Any] | None = None,
) -> Tensor:
    """Define a tensor whose element at ``(i, j, ...)`` is ``fcompute(i, j, ...)``.

    ``fcompute`` is called once, with one axis variable per dimension (named after its
    parameters), and returns an expression: element-wise arithmetic of tensor reads, or a
    reduction (``te.sum``, ``te.max``, ``te.min``) as the whole body.

    Args:
        shape: The extent of each output dimension (positive ints).
        fcompute: A function of one index per output dimension.
        name: The tensor's name, unique in the computation; also its block's name.
        attrs: Optional attributes. ``{"layout_free_placeholders": [B]}`` lets a schedule
            store the listed inputs (weights) in another layout (``transform_layout``).

    Returns:
        The computed tensor; its dtype is the body's.

    Raises:
        TeError: If the shape is invalid, ``fcompute`` takes the wrong number of indices or
            returns several values, a reduction is nested inside a larger expression, a
            layout-free entry is not a placeholder, or a read is provably out of bounds.

    Example:
        A matmul over a reduction axis ``k``::

            k = te.reduce_axis((0, L), name="k")
            C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    """
    shape = _check_shape(shape, f"compute {name}")
    signature = inspect.signature(fcompute).parameters
    params = list(signature)
    variadic = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in signature.values())
    if len(params) != len(shape) and not variadic:
        raise TeError(
            f"compute {name} has {len(shape)} dimensions but its function takes {len(params)} arguments; "
            "give the function one argument per output dimension"
        )
    names = params if len(params) == len(shape) else [f"ax{d}" for d in range(len(shape))]
    axis = tuple(IterVar(Var(n), extent, "spatial") for n, extent in zip(names, shape))
    body = fcompute(*[iv.var for iv in axis])
    if isinstance(body, (tuple, list)):
        raise TeError(f"compute {name} returned {len(body)} values; a compute has exactly one output")
    body = convert(body)
    _check_reduce_is_top_level(body, name)
    attrs = dict(attrs or {})
    layout_free = attrs.get("layout_free_placeholders", [])
    for tensor in layout_free:
        if not isinstance(tensor, Tensor) or not isinstance(tensor.op, PlaceholderOp):
            raise TeError(f"compute {name}: layout_free_placeholders must list placeholders, got {tensor!r}")
    op = ComputeOp(name, axis, body, body.dtype, attrs)
    _check_reads_in_bounds(op)
    return Tensor(op)


def _check_reduce_is_top_level(body: Expr, name: str) -> None:
    inner = [body.source, body.where] if isinstance(body, Reduce) else [body]
    for expr in inner:

        def visit(node: Expr) -> None:
            if isinstance(node, Reduce):
                raise TeError(
                    f"compute {name} uses a reduction inside a larger expression; a reduction must be the whole "
                    "body: compute the reduction in its own te.compute and combine it in a second one"
                )

        walk(expr, visit)


def _check_reads_in_bounds(op: ComputeOp) -> None:
    """Reject a read that is provably out of its tensor's bounds (reads under a condition are skipped)."""
    from .arith import bounds  # index bounds are one piece of arithmetic, shared with lowering

    ranges = {iv.var: iv.extent for iv in op.axis + op.reduce_axis}
    guarded: set[int] = set()

    def mark_guarded(node: Expr) -> None:
        if isinstance(node, Select):
            walk(node.true_value, lambda n: guarded.add(id(n)))
            walk(node.false_value, lambda n: guarded.add(id(n)))

    walk(op.body, mark_guarded)
    if isinstance(op.body, Reduce) and not (isinstance(op.body.where, Const) and op.body.where.value):
        walk(op.body.source, lambda n: guarded.add(id(n)))

    def check(node: Expr) -> None:
        if not isinstance(node, TensorRead) or id(node) in guarded:
            return
        for dim, index in enumerate(node.indices):
            interval = bounds(index, ranges)
            extent = node.tensor.shape[dim]
            if interval is not None and (interval[0] < 0 or interval[1] >= extent):
                raise TeError(
                    f"compute {op.name} reads {node.tensor.name} at index {dim} = {index}, which ranges over "
                    f"[{interval[0]}, {interval[1]}] but {node.tensor.name} has extent {extent} there; fix the "
                    "index or guard the read with te.if_then_else"
                )

    walk(op.body, check)
