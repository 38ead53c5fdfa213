"""The NumPy reference evaluator: the oracle every generated kernel is compared against.

It is vectorised, so that it stays usable at the sizes kernels are tuned for: each
expression is evaluated once over a whole rectangular chunk of a compute's iteration
space. Every axis variable is an ``np.arange`` laid along its own dimension, so
arithmetic on indices broadcasts, a ``TensorRead`` is fancy indexing with those index
arrays, and a ``Reduce`` puts its axes after the spatial ones and reduces over them.
Chunks are sized so that no array exceeds ``CHUNK_ELEMENTS`` elements; a sum of a
product (matmul, conv) is contracted with ``np.einsum``, which never materialises the
full iteration space.

The semantics are those of the generated C: floor division and modulo on integers,
float32 math in float32, float16 and bfloat16 computed in float32 (constants and casts included) and
rounded only when stored, float-to-int casts truncating, no warnings for what C does silently (inf, nan, overflow).
Reads under a condition (a ``Select`` branch, the right side of ``&``/``|``, the source
of a ``Reduce`` with ``where``) are clipped into bounds, because C never performs them
where the condition fails; an out-of-bounds read under no condition is an error.
Float sums accumulate in float64, a more accurate reference than any kernel.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import TeError
from .dtype import NUMPY_DTYPES, computes_in, is_float
from .expr import Binary, Call, Cast, Compare, Const, Expr, Logical, Not, Reduce, Select, TensorRead, Var, free_vars
from .tensor import ComputeOp, PlaceholderOp, Tensor

CHUNK_ELEMENTS = 1 << 24
"""The most elements any intermediate array of the evaluation holds."""


def evaluate(outputs: Tensor | Sequence[Tensor], inputs: Mapping[Tensor, np.ndarray]) -> dict[Tensor, np.ndarray]:
    """Evaluate ``outputs`` with NumPy, given an array for every placeholder they read.

    Returns a dict from every compute tensor reachable from ``outputs`` (the outputs
    included, placeholders not) to its value, an array of its shape and dtype. Each
    input array must have exactly its placeholder's shape and dtype.
    """
    roots = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if not all(isinstance(t, Tensor) for t in roots):
        raise TeError(f"evaluate: outputs must be tensors, got {outputs!r}; pass e.g. [C]")
    values: dict[Tensor, np.ndarray] = {}
    for tensor in _topological_order(roots, inputs):
        if isinstance(tensor.op, PlaceholderOp):
            values[tensor] = _checked_input(tensor, inputs)
        else:
            with np.errstate(all="ignore"):
                values[tensor] = _evaluate_op(tensor.op, values)
    return {t: v for t, v in values.items() if isinstance(t.op, ComputeOp)}


def _topological_order(roots: list[Tensor], inputs: Mapping[Tensor, np.ndarray]) -> list[Tensor]:
    for key in inputs:
        if not isinstance(key, Tensor) or not isinstance(key.op, PlaceholderOp):
            raise TeError(f"evaluate: the inputs are keyed by placeholders, got {key!r}; pass {{placeholder: array}}")
    order: list[Tensor] = []
    done: set[Tensor] = set()
    stack = [(t, False) for t in reversed(roots)]
    while stack:
        tensor, expanded = stack.pop()
        if tensor in done:
            continue
        if expanded or isinstance(tensor.op, PlaceholderOp):
            done.add(tensor)
            order.append(tensor)
            continue
        stack.append((tensor, True))
        stack.extend((p, False) for p in reversed(tensor.op.input_tensors) if p not in done)
    return order


def _checked_input(tensor: Tensor, inputs: Mapping[Tensor, np.ndarray]) -> np.ndarray:
    if tensor not in inputs:
        raise TeError(f"evaluate: no array given for placeholder {tensor.name}; add it to the inputs")
    array = np.asarray(inputs[tensor])
    if array.shape != tensor.shape or array.dtype != NUMPY_DTYPES[tensor.dtype]:
        raise TeError(
            f"evaluate: placeholder {tensor.name} expects shape {tensor.shape} and dtype {tensor.dtype}, "
            f"but was given shape {array.shape} and dtype {array.dtype}; pass an array of that shape, "
            f"converted with .astype({tensor.dtype!r})"
        )
    return array


def _compute_dtype(dtype: str) -> np.dtype:
    """A 16-bit float is computed in float32, as the generated C does, and rounded only when stored."""
    return NUMPY_DTYPES[computes_in(dtype)]


@dataclass(frozen=True)
class _Grid:
    """One rectangular chunk of a compute's iteration space: axis d covers ``starts[d] + range(sizes[d])``."""

    position: dict[Var, int]
    starts: tuple[int, ...]
    sizes: tuple[int, ...]

    def index(self, var: Var) -> np.ndarray:
        d = self.position[var]
        shape = [1] * len(self.sizes)
        shape[d] = self.sizes[d]
        return np.arange(self.starts[d], self.starts[d] + self.sizes[d], dtype=NUMPY_DTYPES[var.dtype]).reshape(shape)


@dataclass(frozen=True)
class _Context:
    op_name: str
    grid: _Grid
    values: dict[Tensor, np.ndarray]


def _evaluate_op(op: ComputeOp, values: dict[Tensor, np.ndarray]) -> np.ndarray:
    body = op.body
    reduce = body if isinstance(body, Reduce) else None
    axes = op.axis + (reduce.axes if reduce is not None else ())
    position = {iv.var: d for d, iv in enumerate(axes)}
    n_spatial = len(op.axis)
    product = _as_product(reduce)
    if product is None:
        dim_sets = [tuple(range(len(axes)))]
    else:
        dim_sets = [tuple(range(n_spatial))] + [
            tuple(sorted(position[v] for v in free_vars(e) if v in position)) for e in (product.a, product.b)
        ]
    chunk = _plan_chunks(tuple(iv.extent for iv in axes), dim_sets, n_spatial)
    out = np.empty(op.shape, NUMPY_DTYPES[op.dtype])
    for spatial_starts in _chunk_starts(op.shape, chunk[:n_spatial]):
        spatial_sizes = tuple(min(c, e - s) for c, e, s in zip(chunk, op.shape, spatial_starts))
        region = tuple(slice(s, s + n) for s, n in zip(spatial_starts, spatial_sizes))
        if reduce is None:
            ctx = _Context(op.name, _Grid(position, spatial_starts, spatial_sizes), values)
            out[region] = _eval(body, ctx, guarded=False).astype(out.dtype)
            continue
        accumulated = None
        extents = tuple(iv.extent for iv in reduce.axes)
        for reduce_starts in _chunk_starts(extents, chunk[n_spatial:]):
            sizes = spatial_sizes + tuple(min(c, e - s) for c, e, s in zip(chunk[n_spatial:], extents, reduce_starts))
            ctx = _Context(op.name, _Grid(position, spatial_starts + reduce_starts, sizes), values)
            part = _reduce_chunk(reduce, ctx, n_spatial, product)
            accumulated = part if accumulated is None else _COMBINE[reduce.combiner](accumulated, part)
        out[region] = accumulated.astype(out.dtype)
    return out


def _chunk_starts(extents: tuple[int, ...], chunk: tuple[int, ...]):
    return itertools.product(*(range(0, e, c) for e, c in zip(extents, chunk)))


def _plan_chunks(extents: tuple[int, ...], dim_sets: list[tuple[int, ...]], n_spatial: int) -> tuple[int, ...]:
    """Chunk sizes per axis so that no array spanning one of ``dim_sets`` exceeds CHUNK_ELEMENTS.

    Greedily halves the axis that shrinks the largest array most; on ties reduce axes
    first (measured faster than splitting spatial axes), outermost first.
    """
    sizes = list(extents)

    def cost(trial: list[int]) -> int:
        return max(math.prod(trial[d] for d in dims) for dims in dim_sets)

    order = list(range(n_spatial, len(sizes))) + list(range(n_spatial))
    while cost(sizes) > CHUNK_ELEMENTS:
        def halved(d: int) -> int:
            return cost(sizes[:d] + [(sizes[d] + 1) // 2] + sizes[d + 1:])

        axis = min((d for d in order if sizes[d] > 1), key=halved)
        sizes[axis] = (sizes[axis] + 1) // 2
    return tuple(sizes)


@dataclass(frozen=True)
class _Product:
    """A sum of ``a * b`` (matmul, conv), which einsum contracts without the full grid.

    A ``where`` mask zeroes each factor that varies over all of the mask's axes (at least one
    does). A factor left unmasked is read clipped, so only a non-finite input there could
    make a masked term nan where the generated C skips it.
    """

    a: Expr
    b: Expr
    mask_a: bool
    mask_b: bool


def _as_product(reduce: Reduce | None) -> _Product | None:
    if reduce is None or reduce.combiner != "sum" or not isinstance(reduce.source, Binary):
        return None
    if reduce.source.op != "mul" or reduce.dtype == "bool":
        return None
    a, b = reduce.source.a, reduce.source.b
    if _is_true(reduce.where):
        return _Product(a, b, False, False)
    mask_vars = free_vars(reduce.where)
    mask_a, mask_b = mask_vars <= free_vars(a), mask_vars <= free_vars(b)
    return _Product(a, b, mask_a, mask_b) if mask_a or mask_b else None


def _is_true(expr: Expr) -> bool:
    return isinstance(expr, Const) and bool(expr.value)


def _accumulator_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float64) if is_float(dtype) else _compute_dtype(dtype)


def _identity(combiner: str, dtype: np.dtype):
    if combiner == "sum":
        return dtype.type(0)
    if dtype == np.bool_:
        return np.bool_(combiner == "min")
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return dtype.type(info.min if combiner == "max" else info.max)
    return dtype.type(-np.inf if combiner == "max" else np.inf)


_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _reduce_chunk(reduce: Reduce, ctx: _Context, n_spatial: int, product: _Product | None) -> np.ndarray:
    """The reduction over this chunk's reduce axes: an array of the chunk's spatial shape."""
    accumulator = _accumulator_dtype(reduce.dtype)
    masked = not _is_true(reduce.where)
    mask = _eval(reduce.where, ctx, guarded=False) if masked else None
    if product is not None:
        factors = []
        for expr, apply_mask in ((product.a, product.mask_a), (product.b, product.mask_b)):
            value = _eval(expr, ctx, guarded=masked).astype(accumulator)
            factors.append(np.where(mask, value, accumulator.type(0)) if apply_mask else value)
        return _contract(factors[0], factors[1], ctx.grid.sizes, n_spatial)
    source = _eval(reduce.source, ctx, guarded=masked)
    if masked:
        source = np.where(mask, source, _identity(reduce.combiner, _compute_dtype(reduce.dtype)))
    source = np.broadcast_to(source, ctx.grid.sizes)
    reduce_dims = tuple(range(n_spatial, len(ctx.grid.sizes)))
    if reduce.combiner == "sum":
        return source.sum(axis=reduce_dims, dtype=accumulator)
    return source.max(axis=reduce_dims) if reduce.combiner == "max" else source.min(axis=reduce_dims)


def _contract(a: np.ndarray, b: np.ndarray, sizes: tuple[int, ...], n_spatial: int) -> np.ndarray:
    """``sum(a * b)`` over the dims after ``n_spatial``, where a and b broadcast to ``sizes``."""
    labels = []
    squeezed = []
    for array in (a, b):
        full = array.reshape(array.shape if array.ndim else (1,) * len(sizes))
        dims = [d for d in range(len(sizes)) if full.shape[d] != 1]
        labels.append(dims)
        squeezed.append(full.reshape([full.shape[d] for d in dims]))
    present = set(labels[0]) | set(labels[1])
    out_dims = [d for d in range(n_spatial) if d in present]
    result = np.einsum(squeezed[0], labels[0], squeezed[1], labels[1], out_dims, optimize=True)
    repeats = math.prod(sizes[d] for d in range(n_spatial, len(sizes)) if d not in present)
    if repeats != 1:
        result = result * repeats
    shape = [sizes[d] if d in present else 1 for d in range(n_spatial)]
    return np.broadcast_to(np.reshape(result, shape), sizes[:n_spatial])


def _eval(node: Expr, ctx: _Context, guarded: bool) -> np.ndarray:
    """The value of ``node`` over the chunk: an array broadcastable to the chunk, in its compute dtype."""
    dtype = _compute_dtype(node.dtype)
    if isinstance(node, Var):
        if node not in ctx.grid.position:
            raise TeError(f"compute {ctx.op_name} uses variable {node.name}, which is not one of its axes; "
                          "index only with the compute's own axes and reduce axes")
        return ctx.grid.index(node)
    if isinstance(node, Const):
        return np.asarray(node.value, dtype)
    if isinstance(node, TensorRead):
        return _read(node, ctx, guarded).astype(dtype, copy=False)
    if isinstance(node, Select):
        cond = _eval(node.cond, ctx, guarded)
        return np.where(cond, _eval(node.true_value, ctx, True), _eval(node.false_value, ctx, True)).astype(dtype)
    if isinstance(node, Logical):
        combine = np.logical_and if node.op == "and" else np.logical_or
        return np.asarray(combine(_eval(node.a, ctx, guarded), _eval(node.b, ctx, True)))
    if isinstance(node, Not):
        return np.asarray(np.logical_not(_eval(node.a, ctx, guarded)))
    if isinstance(node, Cast):
        return _eval(node.value, ctx, guarded).astype(dtype)
    if isinstance(node, Compare):
        return np.asarray(_COMPARE[node.op](_eval(node.a, ctx, guarded), _eval(node.b, ctx, guarded)))
    if isinstance(node, Binary):
        a, b = _eval(node.a, ctx, guarded), _eval(node.b, ctx, guarded)
        return np.asarray(_binary(node.op, a, b, node.a.dtype)).astype(dtype, copy=False)
    if isinstance(node, Call):
        return np.asarray(_MATH[node.name](_eval(node.args[0], ctx, guarded))).astype(dtype, copy=False)
    raise TeError(f"compute {ctx.op_name}: cannot evaluate {node}; a reduction must be the whole body of a compute")


_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
            "eq": np.equal, "ne": np.not_equal}


def _binary(op: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    floating = is_float(dtype)
    if op in ("add", "sub", "mul", "min", "max"):
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[op](a, b)
    if op == "div":
        return np.true_divide(a, b) if floating else np.floor_divide(a, b)
    if op == "floordiv":
        return np.floor(a / b) if floating else np.floor_divide(a, b)
    if op == "floormod":
        return a - np.floor(a / b) * b if floating else np.remainder(a, b)
    if op == "pow":
        return np.power(a, b) if floating else np.power(a.astype(np.float64), b)
    if op in _BITWISE:
        return getattr(np, op)(a, b)
    raise TeError(f"unknown binary operation {op!r}; use one of add sub mul div floordiv floormod min max pow "
                  f"{' '.join(_BITWISE)}")


_BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")  # of integers


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-7 relative: a Taylor series below 0.5, else 1 - erfc (Numerical Recipes' erfcc)."""
    x64 = np.asarray(x, np.float64)
    z = np.abs(x64)
    small = np.minimum(z, 0.5)
    term, series = small, small.copy()
    for n in range(1, 12):
        term = -term * small * small / n
        series += term / (2 * n + 1)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    large = 1.0 - t * np.exp(poly)
    return np.sign(x64) * np.where(z < 0.5, series * (2.0 / math.sqrt(math.pi)), large)


_MATH = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh,
    "erf": _erf,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "abs": np.abs,
    "rint": np.rint,
    **{name: getattr(np, name.replace("a", "arc", 1) if name.startswith("a") else name) for name in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")},
}


def _read(node: TensorRead, ctx: _Context, guarded: bool) -> np.ndarray:
    """``tensor[indices]`` over the chunk: a slice when the indices are distinct axes, else fancy indexing."""
    array = ctx.values[node.tensor]
    grid = ctx.grid
    dims = [grid.position.get(i) if isinstance(i, Var) else None for i in node.indices]
    if None not in dims and len(set(dims)) == len(dims) and all(
        grid.starts[d] + grid.sizes[d] <= extent for d, extent in zip(dims, node.tensor.shape)
    ):
        block = np.asarray(array[tuple(slice(grid.starts[d], grid.starts[d] + grid.sizes[d]) for d in dims)])
        block = block.transpose(np.argsort(np.array(dims, dtype=np.int64)))
        return np.expand_dims(block, tuple(d for d in range(len(grid.sizes)) if d not in dims))
    indices = []
    for dim, (index, extent) in enumerate(zip(node.indices, node.tensor.shape)):
        values = _eval(index, ctx, guarded)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= extent:
            if not guarded:
                raise TeError(
                    f"compute {ctx.op_name} reads {node.tensor.name} at index {dim} = {index}, which reaches "
                    f"[{low}, {high}] but the extent there is {extent}; fix the index or guard the read with "
                    "te.if_then_else"
                )
            values = np.clip(values, 0, extent - 1)
        indices.append(values)
    return np.asarray(array[tuple(indices)])
