"""Tensor algebra: ``einsum``, the general contraction of several tensors over labelled dims.

``einsum`` is one compute over the output's labels whose body multiplies one element of each
operand and sums over the labels the output drops, in one reduction. A matmul, a batched
matmul, an outer product, a trace, a diagonal, a transpose or a plain sum are all cases of it,
so one op covers every equation, and the scheduler sees the same reduction over products that
it tiles for a matmul. A label read twice by one operand (``ii``) reads its diagonal; a dim of
size 1 broadcasts against the label's size in the other operands, as NumPy's ``...`` dims do.
"""

from __future__ import annotations

import functools
import operator

from .. import te
from ..errors import TeError
from ..te.expr import Expr
from ..te.tensor import Tensor
from .common import check_tensor, compute_nd, same_dtype


def _label_sizes(operands: tuple[Tensor, ...], subscripts: list[str], equation: str) -> dict[str, int]:
    """The size of each label: the one its operands agree on, a size 1 broadcasting."""
    sizes: dict[str, int] = {}
    for x, labels in zip(operands, subscripts):
        if len(labels) != x.ndim:
            raise TeError(f"einsum {equation!r}: {x.name} {x.shape} has {x.ndim} dims but {labels!r} names "
                          f"{len(labels)}")
        for label, n in zip(labels, x.shape):
            if sizes.get(label, 1) not in (1, n) and n != 1:
                raise TeError(f"einsum {equation!r}: label {label!r} is {sizes[label]} long in one operand and {n} "
                              f"in {x.name} {x.shape}")
            sizes[label] = max(sizes.get(label, 1), n)
    return sizes


def einsum(*operands: Tensor, equation: str, name: str = "einsum") -> Tensor:
    """``numpy.einsum`` of an explicit ``equation`` (``"bij,bjk->bik"``): one character per dim, no ``...``
    (spell its dims with labels of their own) and an output after ``->``."""
    for x in operands:
        check_tensor(x, "einsum", what="operand")
        same_dtype(operands[0], x, "einsum")
    inputs, arrow, output = equation.partition("->")
    subscripts = inputs.split(",")
    if not arrow or len(subscripts) != len(operands) or len(set(output)) != len(output):
        raise TeError(f"einsum {equation!r}: give one subscript per operand ({len(operands)}), '->' and an output "
                      "of distinct labels")
    sizes = _label_sizes(operands, subscripts, equation)
    if missing := set(output) - set(sizes):
        raise TeError(f"einsum {equation!r}: the output labels {sorted(missing)} name no operand dim")
    dropped = dict.fromkeys(label for label in inputs if label in sizes and label not in output)
    summed = {label: te.reduce_axis((0, sizes[label]), name=f"k{k}") for k, label in enumerate(dropped)}

    def body(idx: tuple[Expr, ...]) -> Expr:
        at = {**dict(zip(output, idx)), **summed}
        reads = (x[tuple(0 if n == 1 else at[label] for label, n in zip(labels, x.shape))]
                 for x, labels in zip(operands, subscripts))
        product = functools.reduce(operator.mul, reads)
        return te.sum(product, axis=list(summed.values())) if summed else product

    return compute_nd([sizes[label] for label in output], body, name)
