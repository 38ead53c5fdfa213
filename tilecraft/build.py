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
    """Lower, generate C, compile (cached by content) and load the kernel of ``sch``.

    The schedule is lowered to a loop nest (``lower``), emitted as C with OpenMP and SIMD
    for the target, compiled by gcc into a shared library kept in a cache keyed by the
    source, the flags and the compiler version (building the same kernel again costs no
    compilation), and loaded. The kernel takes the DAG's tensors in argument order.

    Args:
        sch: The schedule to build.
        target: The target to compile for: a ``Target``, a target string, or None for the host.
        name: The name of the kernel's C function.
        cache_dir: The kernel cache directory; None for ``~/.cache/tilecraft/kernels``.

    Returns:
        The kernel as a ``Module``, callable with NumPy arrays.

    Raises:
        TargetError: If ``target`` cannot be understood.
        LoweringError: If the schedule cannot be lowered to a loop nest.
        BuildError: If no C compiler is found or it rejects the source (the message keeps
            the compiler's output and the path of the source); ``BuildTimeoutError`` if it
            runs past 60 seconds.

    Example:
        ::

            func = tc.build(sch, "llvm -num-cores=4")
            c = func(a, b)                  # outputs are allocated and returned
            func(a, b, out=c)               # or written into given arrays
            print(func.source)              # the C source
    """
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
