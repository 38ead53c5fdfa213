"""CUDA C source -> cubin, through NVRTC or nvcc and the same content-addressed cache as C kernels.

A cubin is machine code for one architecture, ready for ``cuModuleLoadData`` on any host
with a driver: the builder may run where there is no GPU, and only the runner needs one.
As with ``compile_c``, each cubin is keyed by the hash of everything that affects it
(source, flags, the compiler's version), kept beside its ``.cu`` file, and appears only by
an atomic rename, so concurrent builders of one source are safe and a rebuild is free.
NVRTC (``nvrtc.py``) compiles where its library loads, nvcc elsewhere: they are one
compiler, and NVRTC saves nvcc's processes.

Both report errors as ``<file>(<line>): error: ...``; generated kernels are long and
nobody has the file open, so the error message quotes the offending source lines too.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import BuildError, BuildTimeoutError
from .compiler import BACKGROUND_NICENESS, _run_compiler, cached_build
from .nvrtc import compile_with_nvrtc, nvrtc_version

CUDA_COMPILERS = (None, "nvrtc", "nvcc")  # None: NVRTC where its library loads, else nvcc
_ERROR_LINE = re.compile(r"\.cu\((\d+)\): (?:catastrophic )?error")


def compile_cuda(source: str, arch: str = "sm_90", cache_dir: Path | None = None,
                 timeout_secs: float = 60.0, compiler: str | None = None) -> bytes:
    """The cubin of ``source`` for ``arch``: ``compile_cuda_file``'s bytes.

    Raises:
        BuildError: As ``compile_cuda_file``.
        BuildTimeoutError: As ``compile_cuda_file``.
    """
    return compile_cuda_file(source, arch, cache_dir, timeout_secs, compiler).read_bytes()


def compile_cuda_file(source: str, arch: str = "sm_90", cache_dir: Path | None = None,
                      timeout_secs: float = 60.0, compiler: str | None = None) -> Path:
    """The path of the cubin of ``source`` for ``arch`` (nvcc's ``-arch``: ``"sm_90"``,
    ``"sm_90a"``) in the kernel cache, compiled only if no cubin with the same key is cached.
    ``compiler`` is ``"nvrtc"``, ``"nvcc"`` or None: NVRTC where its library loads, else nvcc.

    Raises:
        BuildError: If the compiler is missing (nvcc not on PATH, NVRTC's library not
            found) or rejects the source (the message quotes its errors and the source
            lines they point at).
        BuildTimeoutError: If the compiler runs longer than ``timeout_secs``.
        ValueError: If ``compiler`` names another compiler.
    """
    if compiler not in CUDA_COMPILERS:
        raise ValueError(f"compiler={compiler!r}: choose 'nvrtc', 'nvcc' or None (NVRTC where it loads, else nvcc)")
    if compiler == "nvrtc" or (compiler is None and nvrtc_version() is not None):
        return _compile_with_nvrtc(source, arch, cache_dir, timeout_secs)
    return _compile_with_nvcc(source, arch, cache_dir, timeout_secs)


def _compile_with_nvcc(source: str, arch: str, cache_dir: Path | None, timeout_secs: float) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("nvcc, the CUDA compiler, was not found on PATH; install the CUDA toolkit and put "
                         "its bin/ on PATH (e.g. export PATH=/usr/local/cuda/bin:$PATH)")
    flags = ["-cubin", "-O3", f"-arch={arch}"]

    def compile_to(cu_path: Path, output: Path) -> None:
        try:
            _run_compiler([nvcc, *flags, "-o", str(output), str(cu_path)], cu_path, timeout_secs, BACKGROUND_NICENESS)
        except BuildTimeoutError:
            raise BuildTimeoutError(f"nvcc took longer than {timeout_secs} s on {cu_path}; raise timeout_secs or "
                                    f"make the kernel smaller (less unrolling)") from None
        except BuildError as error:
            raise BuildError(f"{error}\n{quote_error_lines(str(error), source)}".rstrip()) from None

    return cached_build(source, [" ".join(flags), _nvcc_version(nvcc)], ".cu", ".cubin", cache_dir, compile_to)


def _compile_with_nvrtc(source: str, arch: str, cache_dir: Path | None, timeout_secs: float) -> Path:
    version = nvrtc_version()
    if version is None:
        raise BuildError("NVRTC, CUDA's runtime compiler, could not be loaded: pip install 'tilecraft[cuda]' "
                         "(cuda-bindings and nvidia-cuda-nvrtc), or compile with nvcc (compiler='nvcc')")

    def compile_to(cu_path: Path, output: Path) -> None:
        try:
            compile_with_nvrtc(source, arch, timeout_secs, str(cu_path), output)
        except BuildTimeoutError:
            raise
        except BuildError as error:
            raise BuildError(f"{error}\n{quote_error_lines(str(error), source)}".rstrip()) from None

    return cached_build(source, [f"--gpu-architecture={arch}", version], ".cu", ".cubin", cache_dir, compile_to)


def quote_error_lines(message: str, source: str) -> str:
    """The source lines that nvcc's ``message`` reports errors on, each with its number."""
    lines = source.splitlines()
    numbers = sorted({int(n) for n in _ERROR_LINE.findall(message) if 0 < int(n) <= len(lines)})
    if not numbers:
        return ""
    return "The offending source lines:\n" + "".join(f"  line {n}: {lines[n - 1].strip()}\n" for n in numbers)


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    """All of ``nvcc --version`` (its first line names no version): part of the cache key, so
    a new toolkit rebuilds every cubin."""
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"nvcc at {nvcc} did not answer `--version` ({error}); check that it runs, "
                         f"or reinstall the CUDA toolkit") from None
