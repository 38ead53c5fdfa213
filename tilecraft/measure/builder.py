"""``LocalBuilder``: candidates become shared libraries (or cubins), in parallel, without ever raising.

Replaying a trace, lowering and generating C are Python and take milliseconds, so they
run in one thread, one candidate after another; compiling takes gcc tens to hundreds of
milliseconds, in a subprocess, so a thread pool runs ``n_parallel`` compilations at
once (threads suffice: the work is outside the interpreter). Whatever a candidate does
wrong becomes a ``BuildResult`` with an error kind, in the candidate's place. For a CUDA
target the lowered nest is first checked by the GPU verifier (a refusal is an
INSTANTIATION error that costs no compilation), then emitted as CUDA C and built by NVRTC
(nvcc where its library is missing), which also runs outside the interpreter's lock.

``build`` returns when every candidate is built; ``start`` returns at once, with a future a
candidate, so that GPU kernels can be timed while the others still compile
(``measure/overlap.py``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Protocol, Sequence

from ..build import entry_signature, kernel_launches
from ..codegen.c import generate_c
from ..codegen.cuda import generate_cuda
from ..codegen.gpu_verify import verify_gpu
from ..errors import BuildError, BuildTimeoutError, GpuLimitError
from ..ir.lower import lower
from ..runtime.compiler import compile_c
from ..runtime.cuda import launch_json
from ..runtime.cuda_compiler import CUDA_COMPILERS, compile_cuda_file
from ..runtime.module import ArgSpec, PackSpec
from .result import BuildResult, MeasureErrorKind, MeasureInput, error_line

ENTRY_NAME = "default_function"


class Builder(Protocol):
    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """One result per input, in input order; a bad candidate gives an error result."""


@dataclass(frozen=True, slots=True)
class _Generated:
    """A candidate whose C source exists and awaits the compiler."""

    source: str
    args: tuple[ArgSpec, ...]
    packs: tuple[PackSpec, ...]
    time_cost: float  # seconds spent on it so far
    launch: dict | None = None  # CUDA: the kernels' launches and workspace (runtime.cuda.launch_json)


@dataclass(frozen=True, slots=True)
class LocalBuilder:
    """Builds candidates on this machine with gcc (CUDA candidates with NVRTC or nvcc).

    Replaying, lowering and generating C run in one thread, in order; up to ``n_parallel``
    compilations run at once. A candidate that fails becomes a ``BuildResult`` with
    its error kind (INSTANTIATION, COMPILE or BUILD_TIMEOUT) instead of raising.

    Args:
        timeout_secs: The longest one compilation may run before it is stopped (BUILD_TIMEOUT).
        n_parallel: Compilations at once; None for one per CPU core.
        cache_dir: The kernel cache of ``compile_c``; None for its default.
        cuda_compiler: ``"nvrtc"``, ``"nvcc"``, or None for NVRTC where its library loads.

    Raises:
        ValueError: If ``timeout_secs`` is not positive, ``n_parallel`` is below 1 or
            ``cuda_compiler`` names another compiler.
    """

    timeout_secs: float = 15.0
    n_parallel: int | None = None
    cache_dir: Path | None = None
    cuda_compiler: str | None = None

    def __post_init__(self) -> None:
        if not self.timeout_secs > 0:
            raise ValueError(f"LocalBuilder: timeout_secs={self.timeout_secs} must be > 0")
        if self.n_parallel is not None and self.n_parallel < 1:
            raise ValueError(f"LocalBuilder: n_parallel={self.n_parallel} must be >= 1 (or None for one per core)")
        if self.cuda_compiler not in CUDA_COMPILERS:
            raise ValueError(f"LocalBuilder: cuda_compiler={self.cuda_compiler!r}; choose 'nvrtc', 'nvcc' or None "
                             f"(NVRTC where its library loads, else nvcc)")

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """Build every candidate; one result per input, in input order, a failure as an
        error result (never raised)."""
        return [future.result() for future in self.start(inputs)]

    def start(self, inputs: Sequence[MeasureInput]) -> list[Future[BuildResult]]:
        """Start building every candidate and return at once: one future per input, in input
        order, each done when its candidate is built (its result as ``build`` gives it).
        A thread generates the sources in order while up to ``n_parallel`` compilations run."""
        n_parallel = self.n_parallel or os.cpu_count() or 1
        futures: list[Future[BuildResult]] = [Future() for _ in inputs]
        pool = ThreadPoolExecutor(max_workers=n_parallel, thread_name_prefix="tilecraft-build")

        def feed() -> None:
            try:  # gcc or NVRTC compiles the first candidates while this thread generates the next ones
                for candidate, future in zip(inputs, futures):
                    generated = _generate(candidate)
                    if isinstance(generated, _Generated):
                        pool.submit(self._compile, generated, candidate).add_done_callback(
                            lambda compiled, future=future: _settle(future, compiled))
                    else:
                        future.set_result(generated)
            except BaseException as error:  # noqa: BLE001 - a bug here must not leave a caller waiting forever
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
            finally:
                pool.shutdown(wait=False)  # the compilations submitted still run

        threading.Thread(target=feed, name="tilecraft-build-feed", daemon=True).start()
        return futures

    def _compile(self, generated: _Generated, candidate: MeasureInput) -> BuildResult:
        start = perf_counter()
        kind, message, lib_path = MeasureErrorKind.NONE, "", None
        try:
            if generated.launch is not None:
                lib_path = str(compile_cuda_file(generated.source, candidate.target.nvcc_arch, self.cache_dir,
                                                 self.timeout_secs, self.cuda_compiler))
            else:
                lib_path = str(compile_c(generated.source, candidate.target, self.cache_dir, self.timeout_secs))
        except BuildTimeoutError as error:
            kind, message = MeasureErrorKind.BUILD_TIMEOUT, str(error)
        except BuildError as error:
            kind, message = MeasureErrorKind.COMPILE, str(error)
        except Exception as error:  # noqa: BLE001 - an unwritable cache must not stop the tuner either
            kind, message = MeasureErrorKind.COMPILE, f"compiling: {error_line(error)}"
        time_cost = generated.time_cost + perf_counter() - start
        if lib_path is None:
            return BuildResult.failed(kind, message, time_cost, generated.source, ENTRY_NAME)
        return BuildResult(lib_path, generated.source, ENTRY_NAME, generated.args, generated.packs,
                           MeasureErrorKind.NONE, "", time_cost, generated.launch)


def _settle(future: Future[BuildResult], compiled: Future[BuildResult]) -> None:
    """Give ``future`` what the compilation ``compiled`` gave."""
    if (error := compiled.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(compiled.result())


def _generate(candidate: MeasureInput) -> _Generated | BuildResult:
    """The C source of ``candidate``, or the error that stopped it, with the time spent."""
    start = perf_counter()

    def failed(kind: MeasureErrorKind, stage: str, error: Exception) -> BuildResult:
        return BuildResult.failed(kind, f"{stage}{error_line(error)}", perf_counter() - start)

    try:
        sch = candidate.trace.replay(candidate.dag)
    except Exception as error:  # noqa: BLE001 - any failure of a candidate is a result, not a crash
        return failed(MeasureErrorKind.INSTANTIATION, "replaying the trace: ", error)
    try:
        func = lower(sch, ENTRY_NAME)
    except Exception as error:  # noqa: BLE001
        return failed(MeasureErrorKind.COMPILE, "lowering: ", error)
    gpu = getattr(candidate.target, "kind", "llvm") == "cuda"
    if gpu:
        try:  # the verifier's refusals cost no compilation
            verify_gpu(func, candidate.target)
        except GpuLimitError as error:
            return failed(MeasureErrorKind.INSTANTIATION, "GPU verifier: ", error)
    launch = None
    try:
        args, packs = entry_signature(func)
        if gpu:
            source, launches = generate_cuda(func, candidate.target)
            launch = launch_json(*kernel_launches(func, args, launches))
        else:
            source = generate_c(func, candidate.target)
    except Exception as error:  # noqa: BLE001
        return failed(MeasureErrorKind.COMPILE, "code generation: ", error)
    return _Generated(source, args, packs, perf_counter() - start, launch)
