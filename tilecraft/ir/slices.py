"""A kernel that writes an output into, or reads an input from, its slice of a larger array.

A concatenation copies its inputs into one array. Where each input is the only output of a
kernel that nothing else reads, that kernel can store straight into its slice of the
concatenation instead (``into_slice``), and the copy is gone. Symmetrically, a slice that
is a contiguous run of its source (queries, keys and values split from one projection)
need not be copied out: the kernels that read it can read the source where the run lies
(``from_slice``). Either way the argument takes the whole array's shape, and every index
into it moves by the slice's offset.
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
    new = _whole(old, output, shape, offset)
    body = rebuffer(func.body, {old: new}, lambda buffer, indices: _moved(indices, offset))
    user_args = tuple(Buffer(b.name, new.shape, b.dtype, b.scope) if b.name == output else b for b in func.user_args)
    return replace(func, args=tuple(new if b is old else b for b in func.args), body=body, user_args=user_args)


def from_slice(func: LoweredFunc, name: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> LoweredFunc:
    """``func`` with its input ``name`` read at ``offset`` of an array of ``shape``, which the
    caller passes in its place; a packed input's pack reads it there too."""
    written = {b.name for b, out in zip(func.args, func.outputs) if out}
    user = next((b for b in func.user_args if b.name == name), None)
    if user is None or name in written:
        raise LoweringError(f"{func.name} has no input {name!r}; name one of its arguments that it only reads")
    whole = _whole(user, name, shape, offset)

    def moved(buffer, indices):
        return _moved(indices, offset)

    copies = {id(p.packed) for p in func.packs if p.source is user}  # a packed input's argument: its copy, so named
    old = next((b for b in func.args if b.name == name and id(b) not in copies), None)
    args, body = func.args, func.body
    if old is not None:  # read in place, not through a packed copy
        new = Buffer(old.name, whole.shape, old.dtype, old.scope)
        args, body = tuple(new if b is old else b for b in args), rebuffer(body, {old: new}, moved)
    packs = tuple(replace(p, source=whole, body=rebuffer(p.body, {p.source: whole}, moved))
                  if p.source is user else p for p in func.packs)
    user_args = tuple(whole if b is user else b for b in func.user_args)
    return replace(func, args=args, body=body, packs=packs, user_args=user_args)


def _whole(old: Buffer, name: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> Buffer:
    if len(shape) != len(old.shape) or len(offset) != len(old.shape) or any(
            o < 0 or o + n > whole for n, whole, o in zip(old.shape, shape, offset)):
        raise LoweringError(f"{name}{list(old.shape)} at offset {list(offset)} does not fit in {list(shape)}")
    return Buffer(old.name, tuple(shape), old.dtype, old.scope)


def _moved(indices: tuple[Expr, ...], offset: tuple[int, ...]) -> tuple[Expr, ...]:
    return tuple(binary("add", i, const(o, i.dtype)) if o else i for i, o in zip(indices, offset))
