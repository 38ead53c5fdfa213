"""Readable text of a lowered function: one statement a line, loop kinds marked."""

from __future__ import annotations

from ..te.printer import expr_to_str
from .nodes import (Allocate, AsyncCopies, AsyncWait, AtomicAdd, Barrier, For, IfThenElse, LoweredFunc, MatrixTile,
                    Seq, Stmt, Store, ThreadAllReduce, WarpMatrix)


def print_func(func: LoweredFunc) -> str:
    lines = [f"{func.name}({', '.join(map(_argument, func.args))}) {{"]
    lines += [f"  // {pack.packed.name}{list(pack.packed.shape)} is {pack.source.name} packed once by {pack.name}"
              for pack in func.packs]
    for buffer, zeroed in zip(func.args, func.zeroed):
        if zeroed:
            lines.append(f"  // {buffer.name} is zeroed before the kernel, which adds into it")
    _print(func.body, 1, lines)
    lines.append("}")
    return "\n".join(lines)


def _argument(b) -> str:
    start = f", from element {b.offset}" if b.offset else ""
    layout = f" (strides {list(b.strides)}{start})" if b.padded or b.offset else ""
    return f"{b.name}: {b.dtype}{list(b.shape)}{layout}"


def _print(s: Stmt, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    if isinstance(s, Seq):
        for child in s.stmts:
            _print(child, depth, lines)
    elif isinstance(s, For):
        kind = "" if s.kind == "serial" else f" {s.kind}"
        pragma = f" (auto_unroll_max_step={s.unroll_max_step})" if s.unroll_max_step else ""
        lines.append(f"{pad}for {s.var.name} in range({s.extent}){kind}:{pragma}")
        _print(s.body, depth + 1, lines)
    elif isinstance(s, Store):
        index = ", ".join(expr_to_str(i) for i in s.indices)
        lines.append(f"{pad}{s.buffer.name}[{index}] = {expr_to_str(s.value)}")
    elif isinstance(s, AtomicAdd):
        index = ", ".join(expr_to_str(i) for i in s.indices)
        lines.append(f"{pad}{s.buffer.name}[{index}] += {expr_to_str(s.value)}  # atomic, across blocks")
    elif isinstance(s, IfThenElse):
        lines.append(f"{pad}if {expr_to_str(s.cond)}:")
        _print(s.then, depth + 1, lines)
    elif isinstance(s, Allocate):
        b = s.buffer
        padded = f", strides {list(b.strides)}" if b.padded else ""
        lines.append(f"{pad}allocate {b.name}: {b.dtype}{list(b.shape)} ({b.scope}{padded})")
        _print(s.body, depth, lines)
    elif isinstance(s, Barrier):
        lines.append(f"{pad}barrier()  # every thread of the block waits here")
    elif isinstance(s, AsyncCopies):
        lines.append(f"{pad}async copies:  # complete by a later wait")
        _print(s.body, depth + 1, lines)
    elif isinstance(s, AsyncWait):
        lines.append(f"{pad}async wait({s.pending})  # the copies so far, one group; at most {s.pending} unfinished")
    elif isinstance(s, ThreadAllReduce):
        index = ", ".join(expr_to_str(i) for i in s.indices)
        lines.append(f"{pad}{s.buffer.name}[{index}] = allreduce_{s.combiner}({expr_to_str(s.value)}) over threadIdx.x")
    elif isinstance(s, WarpMatrix):
        tiles = [_tile(t) for t in (s.tiles if s.op != "store" else s.tiles[::-1])]  # the fragment's first
        line = {"fill": "{0} = 0", "mma": "{0} += {1} @ {2}", "store": "{1} = {0}", "load": "{0} = {1}"}[s.op]
        lines.append(f"{pad}{line.format(*tiles)}  # wmma.{s.op}, one warp, 16x16 tiles")


def _tile(tile: MatrixTile) -> str:
    return f"{tile.buffer.name}[{', '.join(expr_to_str(i) for i in tile.indices)} :16x16]"
