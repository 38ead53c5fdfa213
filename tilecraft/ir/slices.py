"""A kernel that writes an output into its slice of a larger array.

A concatenation copies its inputs into one array. Where each input is the only output of a
kernel that nothing else reads, that kernel can store straight into its slice of the
concatenation instead (``CompiledModel`` does so), and the copy is gone: the output argument
takes the whole array's shape, and every index into it moves by the slice's offset.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import LoweringError
from ..te.expr import Expr, binary, const
from .nodes import Buffer, LoweredFunc, rebuffer


def into_slice(func: LoweredFunc, output: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> LoweredFunc:
    """``func`` with its output ``output`` written at ``offset`` of an array of ``shape``,
    which the caller passes in its place."""
    old = next((b for b, written in zip(func.args, func.outputs) if written and b.name == output), None)
    if old is None:
        raise LoweringError(f"{func.name} has no output {output!r}; name one of its written arguments")
    if func.zeroed and func.zeroed[func.args.index(old)]:
        raise LoweringError(f"{func.name} adds into {output} across GPU blocks (split-K), zeroing the whole argument "
                            "first, so it cannot write a slice of a larger array; build it to an array of its own")
    if len(shape) != old.ndim or len(offset) != old.ndim or any(
            o < 0 or o + n > whole for n, whole, o in zip(old.shape, shape, offset)):
        raise LoweringError(f"{output}{list(old.shape)} at offset {list(offset)} does not fit in {list(shape)}")
    new = Buffer(old.name, tuple(shape), old.dtype, old.scope)

    def moved(indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(binary("add", i, const(o, i.dtype)) if o else i for i, o in zip(indices, offset))

    body = rebuffer(func.body, {old: new}, lambda buffer, indices: moved(indices))
    user_args = tuple(Buffer(b.name, new.shape, b.dtype, b.scope) if b.name == output else b for b in func.user_args)
    return replace(func, args=tuple(new if b is old else b for b in func.args), body=body, user_args=user_args)
