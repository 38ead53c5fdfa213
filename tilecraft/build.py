"""``build``: a schedule becomes a native kernel callable with NumPy arrays."""

from __future__ import annotations

from pathlib import Path

from .codegen.c import generate_c
from .ir.lower import lower
from .ir.nodes import LoweredFunc
from .runtime.compiler import compile_c
from .runtime.module import ArgSpec, Module, PackSpec
from .target import Target


def build(sch, target: Target | str | None = None, name: str = "default_function",
          cache_dir: Path | None = None) -> Module:
    """Lower, generate C, compile (cached by content) and load the kernel of ``sch``."""
    target = target if isinstance(target, Target) else Target(target)
    func = lower(sch, name)
    source = generate_c(func, target)
    lib = compile_c(source, target, cache_dir)
    args, packs = entry_signature(func)
    return Module(lib, source, name, args, packs)


def entry_signature(func: LoweredFunc) -> tuple[tuple[ArgSpec, ...], tuple[PackSpec, ...]]:
    """The arguments of ``func``'s C entry as its caller sees them, and its pack functions."""
    written = {buffer.name for buffer, out in zip(func.args, func.outputs) if out}
    args = tuple(ArgSpec(b.name, b.shape, b.dtype, b.name in written) for b in func.user_args)
    packs = tuple(PackSpec(p.arg_index, p.name, p.packed.shape) for p in func.packs)
    return args, packs
