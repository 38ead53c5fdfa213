"""CUDA C source -> cubin through NVRTC, CUDA's compiler as a library, in worker processes.

nvcc runs its front end, cicc and ptxas as programs of their own for every kernel; NVRTC
is the same compiler in one call, from 1.04x as fast on large kernels (0.78 s) to 3.5x on
small ones (0.044 s against 0.156; ``benchmarks/cuda_build.py``), and building is most of a
GPU search's time. It comes with cuda-bindings' ``nvrtc`` module and the
``nvidia-cuda-nvrtc`` wheel (the ``cuda`` extra) or a CUDA toolkit, and needs no GPU.

A generated kernel can be huge (a search's random proposal once outgrew 23 GiB of memory in
NVRTC and took the tuner down with it), so NVRTC never runs in the tuner's process: each
compilation goes to a worker process (``python -m tilecraft.runtime.nvrtc``) that the
builder's threads share, one compilation at a time each, and that the kernel's OOM killer
takes first. NVRTC's flow callback cancels a compilation past its timeout and the worker
lives on; a worker that stops answering is killed, and one that dies is replaced. The
protocol is one JSON line each way: the request (source, arch, timeout, the cubin's path),
then the answer (``{"error": null | "compile" | "timeout", "message": ...}``). A worker ends
when its input closes, as it does when the tuner's process ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..errors import BuildError, BuildTimeoutError
from .compiler import BACKGROUND_NICENESS, worker_env

# NVRTC calls it during a compilation; a non-zero answer cancels it (nvrtcSetFlowCallback).
_FLOW_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
# past its timeout, what a worker gets to answer before it is killed: NVRTC asks its flow callback
# often in its front end and seldom in ptxas, where a huge kernel spends its time
_GRACE_SECS = 2.0


@functools.cache
def nvrtc_version() -> str | None:
    """``"nvrtc 13.0"``, or None where cuda-bindings or the NVRTC library is missing."""
    try:
        from cuda.bindings import nvrtc

        result, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - no cuda-bindings, or no libnvrtc for it to load
        return None
    return f"nvrtc {major}.{minor}" if result == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def compile_with_nvrtc(source: str, arch: str, timeout_secs: float, name: str, output: Path) -> None:
    """Write the cubin of ``source`` for ``arch`` (``"sm_90"``) to ``output``, compiled by a
    worker process; ``name`` is the file its errors name.

    Raises:
        BuildError: If NVRTC rejects the source (its log in the message), or the worker died.
        BuildTimeoutError: If the compilation runs longer than ``timeout_secs``.
    """
    worker = _Worker.take()
    try:
        answer = worker.ask({"source": source, "arch": arch, "timeout": timeout_secs, "name": name,
                             "output": str(output)})
    except BaseException:
        worker.kill()
        raise
    _Worker.give_back(worker)
    if answer["error"] == "timeout":
        raise BuildTimeoutError(answer["message"])
    if answer["error"] is not None:
        raise BuildError(answer["message"])


class _Worker:
    """A process that compiles with NVRTC, for one thread at a time."""

    _idle: list[_Worker] = []
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tilecraft.runtime.nvrtc"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=worker_env())  # its errors, if any, to ours

    @classmethod
    def take(cls) -> _Worker:
        """An idle worker that is still alive, or a new one."""
        with cls._lock:
            while cls._idle:
                worker = cls._idle.pop()
                if worker.process.poll() is None:
                    return worker
        return cls()

    @classmethod
    def give_back(cls, worker: _Worker) -> None:
        cls._idle.append(worker)  # one step under the interpreter's lock; take's loop needs its own

    def ask(self, request: dict) -> dict:
        with contextlib.suppress(OSError):  # it has died: the end of its output below says so
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], request["timeout"] + _GRACE_SECS)
        if not ready:
            raise BuildTimeoutError(f"NVRTC took longer than {request['timeout']} s on {request['name']} and was "
                                    f"stopped; raise timeout_secs or make the kernel smaller (less unrolling)")
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise BuildError(f"NVRTC's worker died compiling {request['name']} (exit code {code}"
                             f"{', killed: out of memory?' if code == -9 else ''}); the kernel is too large to "
                             f"compile here: unroll less")
        return json.loads(line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def _compile(source: str, arch: str, timeout_secs: float, name: str) -> bytes:
    """The cubin, compiled in this process (the worker's side)."""
    from cuda.bindings import nvrtc

    deadline = time.perf_counter() + timeout_secs
    cancel = _FLOW_CALLBACK(lambda payload, reserved: int(time.perf_counter() > deadline))
    result, program = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BuildError(f"NVRTC could not take the source of {name}: {result.name}")
    try:
        nvrtc.nvrtcSetFlowCallback(program, ctypes.cast(cancel, ctypes.c_void_p).value, 0)  # none before 12.3
        options = [f"--gpu-architecture={arch}".encode()]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if result == nvrtc.nvrtcResult.NVRTC_ERROR_CANCELLED:
            raise BuildTimeoutError(f"NVRTC took longer than {timeout_secs} s on {name}; raise timeout_secs or "
                                    f"make the kernel smaller (less unrolling)")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError(f"NVRTC failed on {name} ({result.name}):\n{_log(nvrtc, program)}")
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = bytearray(size)
        (result,) = nvrtc.nvrtcGetCUBIN(program, cubin)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError(f"NVRTC made no cubin of {name} ({result.name}); is {arch} a real architecture "
                             f"(sm_XX), not a virtual one (compute_XX)?")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _log(nvrtc, program) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = bytearray(size)
    nvrtc.nvrtcGetProgramLog(program, log)
    return log.rstrip(b"\0").decode(errors="replace").strip()


def _serve() -> None:
    """The worker: answer each request line until the input closes."""
    with contextlib.suppress(OSError):  # where the system lets it: out of memory, the kernel ends this process first
        Path("/proc/self/oom_score_adj").write_text("1000")
    os.nice(BACKGROUND_NICENESS)  # the process timing GPU kernels meanwhile goes first
    answers = os.fdopen(os.dup(1), "w")  # the answers' own channel: whatever a library prints goes elsewhere
    os.dup2(2, 1)
    for line in sys.stdin.buffer:
        request = json.loads(line)
        error, message = None, ""
        try:
            Path(request["output"]).write_bytes(_compile(request["source"], request["arch"], request["timeout"],
                                                         request["name"]))
        except BuildTimeoutError as stopped:
            error, message = "timeout", str(stopped)
        except Exception as failed:  # noqa: BLE001 - every failure is an answer, the worker lives on
            error, message = "compile", str(failed)
        answers.write(json.dumps({"error": error, "message": message}) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve()
