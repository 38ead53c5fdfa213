"""A kernel that writes an output into, or reads an input from, a strided view of a larger array.

A concatenation copies its inputs into one array; where each input is the only output of a
kernel that nothing else reads, that kernel can store straight into its slice of the
concatenation instead (``into_view``), and the copy is gone. A transpose of a kernel's only
output that keeps the last axis last (attention's heads moved back after the tokens) is such
a view too. Symmetrically, a slice or a transpose that kernels read (queries, keys and values
split from one projection, their heads moved before the tokens) need not be copied out: the
kernels can read the array where its elements lie (``from_view``). Either way the argument
takes the whole array's shape, and the kernel's body reads or writes it as a buffer of the
value's own shape whose strides and offset are the view's (``Buffer.padded``, ``Buffer.offset``),
so its indices, vector accesses and tensor-core tiles stay as they were.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import LoweringError
from ..te.dtype import bytes_of
from .nodes import Buffer, LoweredFunc, MatrixTile, WarpMatrix, rebuffer, walk_stmts


def into_view(func: LoweredFunc, output: str, shape: tuple[int, ...], offset: int,
              strides: tuple[int, ...]) -> LoweredFunc:
    """``func`` with its output ``output`` written as the view (``offset``, ``strides``) of an
    array of ``shape``, which the caller passes in its place."""
    old = next((b for b, written in zip(func.args, func.outputs) if written and b.name == output), None)
    if old is None:
        raise LoweringError(f"{func.name} has no output {output!r}; name one of its written arguments")
    if func.zeroed and func.zeroed[func.args.index(old)]:
        raise LoweringError(f"{func.name} adds into {output} across GPU blocks (split-K), zeroing the whole argument "
                            "first, so it cannot write a view of a larger array; build it to an array of its own")
    new = _viewing(func, old, shape, offset, strides)
    user_args = tuple(Buffer(b.name, tuple(shape), b.dtype, b.scope) if b.name == output else b
                      for b in func.user_args)
    return replace(func, args=tuple(new if b is old else b for b in func.args), body=rebuffer(func.body, {old: new}),
                   user_args=user_args)


def from_view(func: LoweredFunc, name: str, shape: tuple[int, ...], offset: int,
              strides: tuple[int, ...]) -> LoweredFunc:
    """``func`` with its input ``name`` read as the view (``offset``, ``strides``) of an array of
    ``shape``, which the caller passes in its place; a packed input's pack reads it there too."""
    written = {b.name for b, out in zip(func.args, func.outputs) if out}
    user = next((b for b in func.user_args if b.name == name), None)
    if user is None or name in written:
        raise LoweringError(f"{func.name} has no input {name!r}; name one of its arguments that it only reads")
    whole = Buffer(user.name, tuple(shape), user.dtype, user.scope)
    copies = {id(p.packed) for p in func.packs if p.source is user}  # a packed input's argument: its copy, so named
    old = next((b for b in func.args if b.name == name and id(b) not in copies), None)
    args, body = func.args, func.body
    if old is not None:  # read in place, not through a packed copy
        new = _viewing(func, old, shape, offset, strides)
        args, body = tuple(new if b is old else b for b in args), rebuffer(body, {old: new})
    viewed = _viewing(func, user, shape, offset, strides)
    packs = tuple(replace(p, source=viewed, body=rebuffer(p.body, {p.source: viewed})) if p.source is user else p
                  for p in func.packs)
    user_args = tuple(whole if b is user else b for b in func.user_args)
    return replace(func, args=args, body=body, packs=packs, user_args=user_args)


def _viewing(func: LoweredFunc, old: Buffer, shape: tuple[int, ...], offset: int,
             strides: tuple[int, ...]) -> Buffer:
    """``old``'s elements as the view (``offset``, ``strides``) of an array of ``shape``, checked
    to lie inside it and, where a warp's tensor-core tiles load or store it, aligned as they need."""
    new = Buffer(old.name, old.shape, old.dtype, old.scope, tuple(strides), offset)
    if len(strides) != old.ndim or offset < 0 or min(strides, default=1) < 0 or new.elements > math.prod(shape):
        raise LoweringError(f"{old.name}{list(old.shape)} at element {offset} with strides {list(strides)} does not "
                            f"fit in an array of {list(shape)}")
    for tile in _tiles(func, old):
        lead = tile.row_dim if strides[tile.col_dim] == 1 else tile.col_dim
        size = bytes_of(old.dtype)
        if 1 not in (strides[tile.row_dim], strides[tile.col_dim]) or strides[lead] * size % 16 or offset * size % 32:
            raise LoweringError(f"{func.name}'s tensor-core tiles of {old.name} need its rows or columns contiguous, "
                                f"16-byte strides and a 32-byte start; the view at element {offset} with strides "
                                f"{list(strides)} has not: build it to an array of its own")
    return new


def _tiles(func: LoweredFunc, buffer: Buffer) -> list[MatrixTile]:
    return [tile for s in walk_stmts(func.body) if isinstance(s, WarpMatrix) for tile in s.tiles
            if tile.buffer is buffer]
