"""C source -> shared library, through gcc and a content-addressed on-disk cache.

Tuning compiles many candidates, and re-running a script compiles the same ones again;
keying each library by the hash of everything that affects it (source, flags, compiler
version) makes the second time free. Libraries appear under their final name only by an
atomic rename, so several processes may compile the same source at once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ..errors import BuildError, BuildTimeoutError
from ..target import Target

_MAX_STDERR_CHARS = 4000
# CUDA compilations run this much nicer than the tuner: GPU kernels are timed while later
# candidates compile (measure/overlap.py), and the process timing them must get a core at once.
BACKGROUND_NICENESS = 10


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "tilecraft" / "kernels"


def compile_c(source: str, target: Target, cache_dir: Path | None = None,
              compile_timeout_secs: float = 60.0) -> Path:
    """The path of a shared library built from ``source`` for ``target``; compiled only
    if no library with the same key is cached. The ``.c`` file is kept beside it."""
    compiler = _find_compiler()
    flags = target.cflags()
    return cached_build(source, [" ".join(flags), compiler, _compiler_version(compiler)], ".c", ".so", cache_dir,
                        lambda c_path, out: _run_compiler([compiler, *flags, "-o", str(out), str(c_path), "-lm"],
                                                          c_path, compile_timeout_secs))


def worker_env() -> dict[str, str]:
    """The environment of a worker process of ours (``python -m tilecraft...``): it imports the
    same tilecraft as this process, installed or not."""
    package_root = str(Path(__file__).resolve().parents[2])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))


def cached_build(source: str, key_parts: Sequence[str], source_suffix: str, output_suffix: str,
                 cache_dir: Path | None, compile_to: Callable[[Path, Path], None]) -> Path:
    """The cached output of compiling ``source``, keyed by the SHA-256 of the source and
    ``key_parts`` (flags, compiler, version); ``compile_to(source_path, output_path)`` runs
    only on a miss. The source is kept beside the output, and the output appears under its
    name only by an atomic rename, so several processes may build the same source at once."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.sha256("\0".join([source, *key_parts]).encode()).hexdigest()
    output = cache_dir / f"{key}{output_suffix}"
    if output.exists():
        return output
    cache_dir.mkdir(parents=True, exist_ok=True)
    source_path = cache_dir / f"{key}{source_suffix}"
    _write_atomically(source_path, source.encode())
    fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=f"{key}.", suffix=f".tmp{output_suffix}")
    os.close(fd)
    try:
        compile_to(source_path, Path(tmp_name))
        os.replace(tmp_name, output)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return output


def _find_compiler() -> str:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise BuildError("no C compiler was found on PATH (looked for gcc and cc); tilecraft compiles its "
                         "kernels with one: install gcc (e.g. `apt-get install gcc`, or `xcode-select "
                         "--install` on macOS) and make sure it is on PATH")
    return compiler


@functools.cache
def _compiler_version(compiler: str) -> str:
    """The first line of ``<compiler> --version``: part of the cache key, so an upgraded
    compiler rebuilds everything."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"the C compiler {compiler} did not answer `--version` ({error}); "
                         f"check that it runs, or reinstall gcc") from None
    return done.stdout.partition("\n")[0]


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp_name, path)
    finally:
        Path(tmp_name).unlink(missing_ok=True)


def _run_compiler(command: list[str], c_path: Path, timeout_secs: float, nicer_by: int = 0) -> None:
    # Its own process group, so that a timeout stops gcc's cc1 and as too, not only the driver.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    if nicer_by:  # before the driver starts its own programs, which inherit it (they take milliseconds to)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nicer_by))
    try:
        _, stderr = process.communicate(timeout=timeout_secs)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise BuildTimeoutError(f"compiling {c_path} took longer than {timeout_secs} s; raise "
                                f"compile_timeout_secs or make the kernel smaller (less unrolling)") from None
    if process.returncode != 0:
        stderr = stderr.strip()
        if len(stderr) > _MAX_STDERR_CHARS:
            stderr = stderr[:_MAX_STDERR_CHARS] + "\n... (trimmed)"
        raise BuildError(f"{Path(command[0]).name} could not compile {c_path} (exit code {process.returncode}):\n"
                         f"{stderr}\nThe source is kept at {c_path}; the command was: {' '.join(command)}. "
                         f"If tilecraft generated this source, please report it with that file.")
