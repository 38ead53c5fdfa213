"""ComputeDAG: the analysed form of a computation, shared by every later component.

It holds the argument tensors in call order (placeholders and outputs), every operation
in topological order, the FLOP count and a stable ``workload_key``, and evaluates itself
with NumPy: that evaluation is the oracle every generated kernel is checked against.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Mapping, Sequence

import numpy as np

from ..errors import TeError
from .expr import Binary, Call, Compare, Const, Expr, Logical, Reduce, Select, Var
from .printer import expr_to_str
from .tensor import ComputeOp, PlaceholderOp, Tensor


class ComputeDAG:
    """The computation given by ``tensors``: its inputs and outputs in the kernel's argument order.

    Every operation the outputs depend on is found and kept in topological order; a
    compute among ``tensors`` is an output, one left out is an intermediate stage.

    Args:
        tensors: Every input placeholder the outputs read and the output tensors, in the
            order the built kernel takes them as arguments.

    Attributes:
        tensors: The arguments, in order.
        ops: Every tensor of the computation, producers before consumers.

    Raises:
        TeError: If ``tensors`` is empty or holds something else, an input the outputs read
            is missing from it, or two tensors share a name.

    Example:
        ::

            dag = tc.ComputeDAG([A, B, C])
            print(dag)                   # C(i, j) += (A[i, k]*B[k, j])
            a, b = dag.random_inputs()
            (c,) = dag.evaluate_numpy([a, b])
    """

    def __init__(self, tensors: Sequence[Tensor]):
        tensors = list(tensors)
        if not tensors or not all(isinstance(t, Tensor) for t in tensors):
            raise TeError("ComputeDAG needs a list of tensors (placeholders and outputs), e.g. [A, B, C]")
        self.tensors: tuple[Tensor, ...] = tuple(tensors)
        self.ops: tuple[Tensor, ...] = _topological_order([t for t in tensors if isinstance(t.op, ComputeOp)])
        given = set(self.tensors)
        missing = [t.name for t in self.ops if isinstance(t.op, PlaceholderOp) and t not in given]
        if missing:
            raise TeError(
                f"the computation reads placeholder(s) {', '.join(missing)} that are not among the tensors "
                "given to ComputeDAG; list every input placeholder in the argument list"
            )
        names = [t.name for t in self.ops]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise TeError(f"two tensors are named {duplicates[0]!r}; give each placeholder and compute a unique name")

    @property
    def placeholders(self) -> tuple[Tensor, ...]:
        """The inputs, in argument order."""
        return tuple(t for t in self.tensors if isinstance(t.op, PlaceholderOp))

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """The outputs, in argument order."""
        return tuple(t for t in self.tensors if isinstance(t.op, ComputeOp))

    @property
    def compute_ops(self) -> tuple[Tensor, ...]:
        """Every computed tensor (a block of a schedule), producers before consumers."""
        return tuple(t for t in self.ops if isinstance(t.op, ComputeOp))

    def consumers(self, tensor: Tensor) -> list[Tensor]:
        """The computed tensors that read ``tensor``."""
        return [t for t in self.compute_ops if tensor in t.op.input_tensors]

    def flop_count(self) -> float:
        """Floating-point (and integer arithmetic) operations, counted as Ansor's FlopEstimator does."""
        total = 0.0
        for tensor in self.compute_ops:
            op = tensor.op
            points = math.prod(op.shape) * math.prod(iv.extent for iv in op.reduce_axis)
            total += points * _count_ops(op.body)
        return total

    @property
    def workload_key(self) -> str:
        """A stable JSON string identifying this computation, independent of variable identities."""
        digest = hashlib.sha256(self.canonical_text().encode()).hexdigest()[:32]
        return json.dumps(["dag", digest])

    def canonical_text(self) -> str:
        """The computation as text with axes renamed by position, so that two DAGs built
        alike give the same text; ``workload_key`` hashes it."""
        lines = []
        for tensor in self.ops:
            if isinstance(tensor.op, PlaceholderOp):
                lines.append(f"{tensor.name} = PLACEHOLDER {list(tensor.shape)} {tensor.dtype}")
            else:
                lines.append(_stage_line(tensor.op, canonical=True) + f" {list(tensor.shape)} {tensor.dtype}")
        lines.append("args: " + ", ".join(t.name for t in self.tensors))
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = []
        for tensor in self.ops:
            if isinstance(tensor.op, PlaceholderOp):
                lines.append(f"{tensor.name} = PLACEHOLDER {list(tensor.shape)}")
            else:
                lines.append(_stage_line(tensor.op, canonical=False))
        return "\n".join(lines) + "\n"

    __repr__ = __str__

    def evaluate_numpy(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs computed with NumPy, in argument order; the reference for every test.

        Args:
            inputs: One array per placeholder, in argument order, or a dict by name.

        Raises:
            TeError: If a name is not a placeholder's or the number of inputs is wrong.
        """
        from .reference import evaluate

        if isinstance(inputs, Mapping):
            by_name = {t.name: t for t in self.placeholders}
            unknown = [name for name in inputs if name not in by_name]
            if unknown:
                raise TeError(f"no placeholder named {unknown[0]!r}; the inputs are {', '.join(by_name)}")
            feed = {by_name[name]: np.asarray(value) for name, value in inputs.items()}
        else:
            inputs = list(inputs)
            if len(inputs) != len(self.placeholders):
                raise TeError(
                    f"evaluate_numpy got {len(inputs)} inputs but the computation has "
                    f"{len(self.placeholders)}: {', '.join(t.name for t in self.placeholders)}"
                )
            feed = {t: np.asarray(value) for t, value in zip(self.placeholders, inputs)}
        values = evaluate(self.outputs, feed)
        return [values[t] for t in self.outputs]

    def random_inputs(self, rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """Inputs of the right shapes and dtypes, drawn from ``rng`` (for tests and timing)."""
        rng = rng or np.random.default_rng(0)
        arrays = []
        for tensor in self.placeholders:
            if tensor.dtype == "bool":
                arrays.append(rng.random(tensor.shape) < 0.5)
            elif tensor.dtype.startswith(("int", "uint")):
                arrays.append(rng.integers(0, 8, size=tensor.shape).astype(tensor.dtype))
            else:
                arrays.append(rng.uniform(-1, 1, size=tensor.shape).astype(tensor.dtype))
        return arrays


def _topological_order(outputs: list[Tensor]) -> tuple[Tensor, ...]:
    order: list[Tensor] = []
    state: dict[Tensor, str] = {}
    for root in outputs:
        stack: list[tuple[Tensor, bool]] = [(root, False)]
        while stack:
            tensor, expanded = stack.pop()
            if expanded:
                if state.get(tensor) != "done":
                    state[tensor] = "done"
                    order.append(tensor)
                continue
            if state.get(tensor) == "done":
                continue
            state[tensor] = "visiting"
            stack.append((tensor, True))
            if isinstance(tensor.op, ComputeOp):
                for producer in reversed(tensor.op.input_tensors):
                    if state.get(producer) != "done":
                        stack.append((producer, False))
    return tuple(order)


def _count_ops(expr: Expr) -> int:
    count = 0

    def visit(node: Expr) -> None:
        nonlocal count
        if isinstance(node, (Binary, Compare, Logical, Call, Select)):
            count += 1
        elif isinstance(node, Reduce):
            count += 1  # the combiner

    _walk_values(expr, visit)
    return max(count, 1) if isinstance(expr, Reduce) else count


def _walk_values(expr: Expr, visit) -> None:
    """Pre-order walk that skips tensor indices: index arithmetic is not counted as FLOPs."""
    from .expr import TensorRead, children

    visit(expr)
    if not isinstance(expr, TensorRead):
        for child in children(expr):
            _walk_values(child, visit)


def _stage_line(op: ComputeOp, canonical: bool) -> str:
    body = op.body
    names = {}
    if canonical:
        for n, iv in enumerate(op.axis + op.reduce_axis):
            names[iv.var] = f"v{n}"
    axes = ", ".join(names.get(iv.var, iv.name) for iv in op.axis)

    def text(expr: Expr) -> str:
        if not canonical:
            return expr_to_str(expr)
        from .expr import substitute

        return expr_to_str(substitute(expr, {v: Var(name) for v, name in names.items()}))

    if isinstance(body, Reduce):
        symbol = {"sum": "+=", "max": "max=", "min": "min="}[body.combiner]
        where = "" if isinstance(body.where, Const) and body.where.value else f" where {text(body.where)}"
        extents = ""
        if canonical:
            extents = " over " + ",".join(str(iv.extent) for iv in body.axes)
        return f"{op.name}({axes}) {symbol} {text(body.source)}{where}{extents}"
    return f"{op.name}({axes}) = {text(body)}"
