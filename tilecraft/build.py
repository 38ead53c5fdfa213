"""``build``: a schedule becomes a native kernel callable with NumPy arrays (or, for a CUDA
target, with device arrays too); ``emulate_gpu`` runs a GPU schedule on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .codegen.c import generate_c
from .ir.lower import lower
from .ir.nodes import LoweredFunc
from .runtime.compiler import compile_c
from .runtime.module import ArgSpec, Module, PackSpec
from .target import CudaTarget, Target

if TYPE_CHECKING:
    from .runtime.cuda import CudaModule


def build(sch, target: Target | CudaTarget | str | None = None, name: str = "default_function",
          cache_dir: Path | None = None):
    """Lower, generate C, compile (cached by content) and load the kernel of ``sch``.

    The schedule is lowered to a loop nest (``lower``), emitted as C with OpenMP and SIMD
    for the target, compiled by gcc into a shared library kept in a cache keyed by the
    source, the flags and the compiler version (building the same kernel again costs no
    compilation), and loaded. The kernel takes the DAG's tensors in argument order.

    For a CUDA target (``"cuda"``, ``"cuda -arch=sm_90"``) the loop nest is checked
    against the target's limits (``GpuLimitError``), emitted as one CUDA C kernel and
    compiled by nvcc into a cubin; no GPU is needed until the kernel is called.

    Args:
        sch: The schedule to build.
        target: The target to compile for: a ``Target``, a target string, or None for the host.
        name: The name of the kernel's C function.
        cache_dir: The kernel cache directory; None for ``~/.cache/tilecraft/kernels``.

    Returns:
        The kernel as a ``Module`` callable with NumPy arrays, or for a CUDA target a
        ``CudaModule`` callable with NumPy arrays or device arrays (PyTorch, CuPy).

    Raises:
        TargetError: If ``target`` cannot be understood.
        LoweringError: If the schedule cannot be lowered to a loop nest.
        GpuLimitError: If a GPU schedule exceeds its target's limits.
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
    target = target if isinstance(target, (Target, CudaTarget)) else Target(target)
    return build_lowered(lower(sch, name), target, cache_dir)


def build_lowered(func: LoweredFunc, target: Target | CudaTarget, cache_dir: Path | None = None):
    """``build``'s steps after lowering, for a loop nest a pass has changed (``ir/slices.py``)."""
    if isinstance(target, CudaTarget):
        return _build_cuda(func, target, cache_dir)
    source = generate_c(func, target)
    lib = compile_c(source, target, cache_dir)
    args, packs = entry_signature(func)
    return Module(lib, source, func.name, args, packs)


def _build_cuda(func: LoweredFunc, target: CudaTarget, cache_dir: Path | None) -> CudaModule:
    # imported here: the CUDA backend costs nothing to a CPU program or a measuring worker's start
    from .codegen.cuda import generate_cuda
    from .codegen.gpu_verify import verify_gpu
    from .runtime.cuda import CudaModule
    from .runtime.cuda_compiler import compile_cuda

    verify_gpu(func, target)
    source, launches = generate_cuda(func, target)
    cubin = compile_cuda(source, target.nvcc_arch, cache_dir)
    args, _ = entry_signature(func)
    return CudaModule(cubin, source, func.name, args, *kernel_launches(func, args, launches))


def kernel_launches(func: LoweredFunc, args: tuple[ArgSpec, ...], launches) -> tuple[tuple, tuple[ArgSpec, ...]]:
    """The ``LaunchSpec`` of each of ``func``'s kernels (``launches``, the code generator's),
    each zeroing the outputs that its blocks add into (split-K), and the workspace the
    kernels pass between them (``ir/kernels.py``)."""
    from .ir.kernels import split_kernels
    from .runtime.cuda import LaunchSpec

    kernels, workspace = split_kernels(func)
    specs = []
    for kernel, launch in zip(kernels, launches):
        names = {buffer.name for buffer, zeroed in zip(kernel.args, kernel.zeroed) if zeroed}
        zeroed = tuple(n for n, arg in enumerate(args) if arg.name in names)
        specs.append(LaunchSpec(launch.grid, launch.block, launch.shared_bytes, zeroed))
    return tuple(specs), tuple(ArgSpec(b.name, b.shape, b.dtype, True) for b in workspace)


def emulate_gpu(sch, target: CudaTarget | str = "cuda", name: str = "default_function",
                cache_dir: Path | None = None, cuda_source: bool = False, thread_order: int = 2,
                racecheck: bool = False):
    """A GPU schedule's kernel run on this CPU, serially, as the GPU would distribute it.

    The loop nest is verified against ``target`` as ``build`` does, then blocks run one
    after another and each block's threads in turn, phase by phase between barriers, with
    per-thread local buffers (``tilecraft/ir/emulate.py``). It checks a GPU schedule's
    values against NumPy where there is no GPU; races and missing barriers it cannot see.
    With ``cuda_source``, the kernels' CUDA C itself runs instead, each thread a fiber
    (``runtime/cuda_on_cpu.py``): slower to build and run, it checks the code generator too,
    and what a GPU leaves undefined (shared memory not yet written, a copy not waited for)
    reads as NaN, so a missing barrier shows.

    Args:
        sch: A schedule with loops bound to GPU axes.
        target: The CUDA target whose limits apply.
        name: The kernel's name.
        cache_dir: The kernel cache directory.
        cuda_source: Run the CUDA C the code generator writes, not the loop nest.
        thread_order: With ``cuda_source``, the order a block's threads run in: 0 in order,
            1 reversed, larger a shuffle of that seed (a thread reading its neighbour's
            element before a barrier reads NaN whichever neighbour).
        racecheck: With ``cuda_source``, run under ThreadSanitizer instead: two threads of a
            block touching one address (shared or global) with no barrier between, or of two
            blocks one global address without atomics, one of them writing, raise
            ``TilecraftError`` naming the statements, whatever the order.

    Returns:
        A CPU ``Module`` computing what the GPU kernel computes (a ``CudaOnCpuModule`` with
        ``cuda_source``, called alike).

    Raises:
        GpuLimitError: If the schedule exceeds the target's limits.
        LoweringError: If the schedule cannot be lowered (a barrier under a condition).
        ValueError: If ``racecheck`` is asked without ``cuda_source`` (the loop nests run
            thread after thread, where no race can show).

    Example:
        ::

            c = tc.emulate_gpu(sch)(a, b)
            np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    """
    if racecheck and not cuda_source:
        raise ValueError("emulate_gpu: racecheck runs the kernels' CUDA C under ThreadSanitizer; pass cuda_source=True "
                         "too")
    target = target if isinstance(target, CudaTarget) else CudaTarget(target)
    if cuda_source:
        return cuda_on_cpu(lower(sch, name), target, cache_dir, thread_order, racecheck)
    return emulate_lowered(lower(sch, name), target, cache_dir)


def emulate_lowered(func: LoweredFunc, target: CudaTarget, cache_dir: Path | None = None) -> Module:
    """``emulate_gpu``'s steps after lowering, for a loop nest a pass has changed."""
    from .codegen.gpu_verify import verify_gpu
    from .ir.emulate import emulate_on_cpu

    cpu = emulate_on_cpu(func, tuple(launch.block for launch in verify_gpu(func, target)))
    host = Target.host()
    source = generate_c(cpu, host)
    args, packs = entry_signature(cpu)
    return Module(compile_c(source, host, cache_dir), source, func.name, args, packs)


def cuda_on_cpu(func: LoweredFunc, target: CudaTarget, cache_dir: Path | None = None, thread_order: int = 2,
                racecheck: bool = False):
    """``emulate_gpu``'s steps with ``cuda_source`` after lowering: verified, its CUDA C
    generated and compiled for this CPU."""
    from .codegen.cuda import DEVICE_HELPERS, cuda_kernels
    from .codegen.gpu_verify import verify_gpu
    from .runtime.cuda import kernel_entries
    from .runtime.cuda_on_cpu import CudaOnCpuModule, compile_program, cuda_program

    verify_gpu(func, target)
    kernels, launches, _ = cuda_kernels(func, target)
    args, _ = entry_signature(func)
    specs, workspace = kernel_launches(func, args, launches)
    source = cuda_program(DEVICE_HELPERS + kernels, kernel_entries(func.name, len(specs)), args, specs, workspace)
    return CudaOnCpuModule(compile_program(source, cache_dir, racecheck), source, func.name, args, specs, thread_order)


def entry_signature(func: LoweredFunc) -> tuple[tuple[ArgSpec, ...], tuple[PackSpec, ...]]:
    """The arguments of ``func``'s C entry as its caller sees them, and its pack functions."""
    written = {buffer.name for buffer, out in zip(func.args, func.outputs) if out}
    args = tuple(ArgSpec(b.name, b.shape, b.dtype, b.name in written) for b in func.user_args)
    packs = tuple(PackSpec(p.arg_index, p.name, p.packed.shape) for p in func.packs)
    return args, packs
