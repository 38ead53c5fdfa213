"""Helpers shared by the operators: computes of any rank, broadcasting and argument checks.

Operators work for tensors of any rank, so their compute functions take the whole index
tuple; ``compute_nd`` gives ``te.compute`` a function with one named parameter per axis,
since ``te.compute`` counts named parameters and refuses ``lambda *indices``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

from .. import te
from ..errors import TeError
from ..te.dtype import DTYPES, finfo, is_float, supported
from ..te.expr import Expr
from ..te.tensor import PlaceholderOp, Tensor

Index = tuple[Expr, ...]


def compute_nd(shape: Sequence[int], fcompute: Callable[[Index], Any], name: str) -> Tensor:
    """``te.compute`` where ``fcompute`` takes the tuple of all output indices (axes ``ax0, ax1...``)."""
    names = [f"ax{d}" for d in range(len(shape))]

    def body(*indices: Expr) -> Any:
        return fcompute(tuple(indices))

    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]
    )
    return te.compute(tuple(shape), body, name=name)


def check_tensor(x: Any, op: str, ndim: int | None = None, what: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TeError(f"{op}: the {what} must be a te tensor, got {x!r}; build it with te.placeholder or te.compute")
    if ndim is not None and x.ndim != ndim:
        raise TeError(f"{op}: the {what} {x.name} has shape {x.shape} but must have {ndim} dimensions")
    return x


def require_float(x: Tensor, op: str) -> None:
    if not is_float(x.dtype):
        raise TeError(f"{op}: {x.name} has dtype {x.dtype} but must be a float; cast it first with ops.cast")


def same_dtype(a: Tensor, b: Tensor, op: str) -> None:
    if a.dtype != b.dtype:
        raise TeError(f"{op}: {a.name} is {a.dtype} but {b.name} is {b.dtype}; cast one with ops.cast")


def product_of(a: Expr, b: Expr, out_dtype: str | None) -> Expr:
    """``a * b``, each cast to ``out_dtype`` first where one is given (TVM's ``out_dtype``: a
    product of 16-bit floats summed into float32, as tensor cores sum a bfloat16 product)."""
    if out_dtype is None:
        return a * b
    if not supported(out_dtype):
        raise TeError(f"out_dtype {out_dtype!r} is not a dtype; use one of {', '.join(DTYPES)}")
    return a.astype(out_dtype) * b.astype(out_dtype)


def layout_free(weight: Tensor) -> dict[str, Any]:
    """Marks a weight placeholder as free to be re-laid out ahead of time (Ansor's layout rewrite)."""
    return {"layout_free_placeholders": [weight]} if isinstance(weight.op, PlaceholderOp) else {}


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise TeError(f"{op}: axis {axis!r} is out of range for {ndim} dimensions; use an int in [{-ndim}, {ndim})")
    return axis % ndim


def normalize_axes(axis: int | Sequence[int] | None, ndim: int, op: str) -> tuple[int, ...]:
    """Sorted non-negative axes; ``None`` means all of them."""
    if axis is None:
        axes = tuple(range(ndim))
    else:
        raw = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(sorted(normalize_axis(a, ndim, op) for a in raw))
    if not axes or len(set(axes)) != len(axes):
        raise TeError(f"{op}: axis {axis!r} must name distinct axes, at least one; pass axis=None for all")
    return axes


def merge_index(ndim: int, axes: Sequence[int], kept: Sequence[Any], reduced: Sequence[Any]) -> tuple[Any, ...]:
    """The index of an ``ndim`` tensor from the indices of its other dims and of its ``axes``."""
    kept_it, reduced_it = iter(kept), iter(reduced)
    return tuple(next(reduced_it) if d in axes else next(kept_it) for d in range(ndim))


def broadcast_shape(a: Sequence[int], b: Sequence[int], op: str) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes."""
    ndim = max(len(a), len(b))
    padded_a = (1,) * (ndim - len(a)) + tuple(a)
    padded_b = (1,) * (ndim - len(b)) + tuple(b)
    for x, y in zip(padded_a, padded_b):
        if x != y and 1 not in (x, y):
            raise TeError(
                f"{op}: shapes {tuple(a)} and {tuple(b)} cannot be broadcast together ({x} against {y}); "
                "make each pair of trailing dimensions equal, or 1"
            )
    return tuple(y if x == 1 else x for x, y in zip(padded_a, padded_b))


def broadcast_read(x: Tensor, index: Index, shape: Sequence[int]) -> Expr:
    """Read ``x`` at the trailing part of ``index`` (into ``shape``), pinning to 0 the dims
    it broadcasts. A size-1 dim that is size 1 in ``shape`` too keeps its axis, so that
    the read stays element-wise (what lets the scheduler fuse the op into a producer)."""
    lead = len(index) - x.ndim
    return x[tuple(0 if x.shape[d] == 1 and shape[lead + d] != 1 else index[lead + d] for d in range(x.ndim))]


def pair(value: int | Sequence[int], op: str, what: str, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints, each at least ``minimum`` (strides, dilations, kernel sizes)."""
    values = (value, value) if isinstance(value, int) else tuple(value)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values):
        raise TeError(f"{op}: {what} must be an int or a pair of ints, each >= {minimum}; got {value!r}")
    return values  # type: ignore[return-value]


def padding4(padding: int | Sequence[int], op: str) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)`` from an int, ``(vertical, horizontal)`` or four ints, as in TVM."""
    values = (padding,) if isinstance(padding, int) else tuple(padding)
    if len(values) not in (1, 2, 4) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                               for v in values):
        raise TeError(
            f"{op}: padding must be an int, (vertical, horizontal) or (top, left, bottom, right) of ints >= 0; "
            f"got {padding!r}"
        )
    if len(values) == 1:
        return values * 4
    if len(values) == 2:
        return values * 2
    return values  # type: ignore[return-value]


def window(out: Expr, stride: int, offset: Expr, dilation: int) -> Expr:
    """``out * stride + offset * dilation``, without multiplications by 1."""
    return (out * stride if stride != 1 else out) + (offset * dilation if dilation != 1 else offset)


def lowest(dtype: str) -> int | float:
    """The smallest finite value of ``dtype``: the identity of max over padding, as in TVM."""
    info = finfo(dtype) if is_float(dtype) else np.iinfo(dtype)
    return float(info.min) if is_float(dtype) else int(info.min)


def rounded_up(sizes: Sequence[int], multiple: Any, op: str) -> tuple[int, ...]:
    """Each of ``sizes`` rounded up to a ``multiple`` (a product's sizes padded to whole tiles)."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise TeError(f"{op}: multiple must be a positive int, got {multiple!r}")
    return tuple(-(-size // multiple) * multiple for size in sizes)


def zero_outside(value: Expr, *bounds: tuple[Any, int, int]) -> Expr:
    """``value``, or 0 where an index of ``(index, size, padded size)`` lies in its padding."""
    conditions = [index < size for index, size, padded_size in bounds if padded_size != size]
    return te.if_then_else(te.all(*conditions), value, te.const(0, value.dtype)) if conditions else value


def padded_to(x: Tensor, shape: Sequence[int], name: str) -> Tensor:
    """``x`` grown to ``shape`` with zeros past its ends (``x`` itself where it has that shape)."""
    if tuple(shape) == tuple(x.shape):
        return x
    return compute_nd(shape, lambda idx: zero_outside(x[idx], *zip(idx, x.shape, shape)), name)


def cropped(product: Tensor, shape: Sequence[int], name: str) -> Tensor:
    """``product``'s first ``shape`` elements along each axis: a product padded to whole tiles
    without its padding (the GPU rules take it as the start of the product's epilogue)."""
    return product if tuple(shape) == tuple(product.shape) else compute_nd(shape, lambda idx: product[idx], name)
