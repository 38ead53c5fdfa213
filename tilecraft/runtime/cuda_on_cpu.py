"""The CUDA C of a GPU kernel, as the code generator wrote it, run on this CPU.

The loop-nest emulation (``ir/emulate.py``) checks what a schedule computes; it never runs
the CUDA text, so an index the code generator prints wrong, a vector copy, a shuffle tree,
a wmma call or a cp.async would go unseen until a GPU ran it. Here the kernels
(``codegen/cuda.py``'s ``cuda_kernels``) are compiled by the host's C++ compiler with
``cuda_on_cpu.h`` in place of the CUDA prelude, each thread a fiber, into a program run in a
process of its own (so that a kernel reading past an array ends that process, not ours) under
AddressSanitizer and UBSan's alignment check. Its threads run in a chosen order, and what a
GPU leaves undefined (shared memory not written yet, an output the kernel never writes, a
cp.async not waited for) reads as NaN, so a missing barrier or wait shows in the values.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import BuildError, TilecraftError
from .compiler import _compiler_version, _run_compiler, cached_build
from .cuda import LaunchSpec, _bytes, bind_arrays
from .module import ArgSpec

HEADER = (Path(__file__).parent / "cuda_on_cpu.h").read_text()
FLAGS = ("-std=c++17", "-O1", "-g", "-w", "-fno-strict-aliasing", "-fno-sanitize-recover=all")
# AddressSanitizer, its globals left alone (each block fills the shared arrays whole); or for a
# racecheck, ThreadSanitizer (the two cannot share a program)
SANITIZERS = {False: ("-fsanitize=address,alignment", "--param", "asan-globals=0"),
              True: ("-fsanitize=thread,alignment",)}
RUN_TIMEOUT_SECS = 120.0
_SANITIZER_OPTIONS = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=4",
                      "TSAN_OPTIONS": "halt_on_error=1:exitcode=4:report_signal_unsafe=0",
                      "UBSAN_OPTIONS": "print_stacktrace=0:exitcode=4"}


# ``program DIR SEED``: argument n (on 256 bytes, as cudaMalloc puts it) read from DIR/n where the
# file is there (an output too: a kernel may write part of it), else NaN until written; the
# launches; the outputs written back
_MAIN = """
int main(int argc, char** argv) {{
  if (argc != 3) {{ fprintf(stderr, "usage: program DIR SEED\\n"); return 2; }}
  unsigned seed = (unsigned)atoi(argv[2]);
  const size_t bytes[] = {{{bytes}}};
  const int outputs[] = {{{outputs}}};
  void* p[{count}];
  char path[4096];
  for (int n = 0; n < {count}; ++n) {{
    if (posix_memalign(&p[n], 256, bytes[n] ? bytes[n] : 1)) {{ fprintf(stderr, "out of memory\\n"); return 2; }}
    memset(p[n], 0xff, bytes[n]);
    snprintf(path, sizeof path, "%s/%d", argv[1], n);
    FILE* f = fopen(path, "rb");
    if (!f) continue;
    if (fread(p[n], 1, bytes[n], f) != bytes[n]) {{ fprintf(stderr, "cannot read %s\\n", path); return 2; }}
    fclose(f);
  }}
{launches}
  for (int n : outputs) {{
    snprintf(path, sizeof path, "%s/%d", argv[1], n);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p[n], 1, bytes[n], f) != bytes[n]) {{ fprintf(stderr, "cannot write %s\\n", path); return 2; }}
    fclose(f);
  }}
  return 0;
}}
"""


def cuda_program(kernels: str, entries: Sequence[str], args: Sequence[ArgSpec],
                 launches: Sequence[LaunchSpec], workspace: Sequence[ArgSpec]) -> str:
    """The C++ program that runs ``kernels`` (``cuda_kernels``' text after the helpers it
    calls, ``DEVICE_HELPERS``) as ``launches`` say: ``program DIR SEED`` reads argument n
    from ``DIR/n`` (an output there too if given), zeroes what a launch adds into, runs the
    kernels in order (threads in the order ``SEED`` picks) and writes the outputs back."""
    every = [*args, *workspace]
    pointers = ", ".join(f"tc_cpu::Arg{{p[{n}]}}" for n in range(len(every)))
    calls = "".join(f"static void tc_call_{n}(void** p) {{ {entry}({pointers}); }}\n"
                    for n, entry in enumerate(entries))
    steps = "\n".join(f"  {''.join(f'memset(p[{z}], 0, bytes[{z}]); ' for z in launch.zeroed)}"
                      f"tc_cpu::launch(dim3{{{_list(launch.grid)}}}, dim3{{{_list(launch.block)}}}, "
                      f"{launch.shared_bytes}, seed, tc_call_{n}, p);" for n, launch in enumerate(launches))
    main = _MAIN.format(bytes=_list(map(_bytes, every)), count=len(every), launches=steps,
                        outputs=_list(n for n, arg in enumerate(args) if arg.is_output))
    return f"{HEADER}\n{kernels}\n{calls}{main}"


def compile_program(source: str, cache_dir: Path | None = None, racecheck: bool = False,
                    compile_timeout_secs: float = 120.0) -> Path:
    """The cached executable of ``cuda_program``'s ``source``, under AddressSanitizer, or
    ThreadSanitizer with ``racecheck``."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise BuildError("no C++ compiler was found on PATH (looked for g++ and c++); running CUDA kernels on the "
                         "CPU compiles them with one: install g++ (the host compiler nvcc uses too)")
    flags = (*FLAGS, *SANITIZERS[racecheck])
    return cached_build(source, [" ".join(flags), compiler, _compiler_version(compiler)], ".cpp", ".exe", cache_dir,
                        lambda path, out: _run_compiler([compiler, *flags, "-o", str(out), str(path)], path,
                                                        compile_timeout_secs))


class CudaOnCpuModule:
    """A GPU function's kernels run on this CPU from their CUDA C (``cuda_on_cpu.h``), called
    with NumPy arrays as a ``CudaModule`` is: ``module(*inputs)`` returns new outputs (one, or
    a tuple), ``module(*inputs, out=outputs)`` writes into given ones, ``module(*all_arguments)``
    returns None. Every call runs the program once, the block's threads in the order
    ``thread_order`` picks: 0 in order, 1 reversed, larger a shuffle of its own seed.

    A call raises ``TilecraftError`` with the program's message where the kernel breaks a rule
    the GPU would punish: a barrier some threads never reach, an access outside an argument,
    a misaligned vector or wmma access, a shuffle outside its mask."""

    def __init__(self, executable: Path, source: str, entry: str, args: Sequence[ArgSpec],
                 launches: Sequence[LaunchSpec], thread_order: int = 2) -> None:
        self.executable, self.source, self.entry = Path(executable), source, entry
        self.args, self.launches = tuple(args), tuple(launches)  # the program holds the workspace
        self.thread_order = thread_order

    def __repr__(self) -> str:
        launches = ", ".join(f"grid={launch.grid}, block={launch.block}" for launch in self.launches)
        return f"CudaOnCpuModule({self.entry!r}, args=({', '.join(arg.name for arg in self.args)}), {launches})"

    def __call__(self, *arrays: Any, out: Any = None) -> Any:
        binding = bind_arrays(self.entry, self.args, arrays, out)
        if binding.on_device:
            raise TypeError(f"{self.entry} runs on the CPU: pass NumPy arrays (x.cpu().numpy(), cupy.asnumpy(x))")
        every = {i: binding.arrays.get(i) for i in range(len(self.args))}
        with tempfile.TemporaryDirectory(prefix="tilecraft-cuda-cpu-") as folder:
            for i, spec in enumerate(self.args):
                if every[i] is None:
                    every[i] = np.empty(spec.shape, spec.dtype)  # the program's, NaN where the kernel leaves it
                else:
                    every[i].tofile(os.path.join(folder, str(i)))
            self._run(folder)
            for i, spec in enumerate(self.args):
                if spec.is_output:
                    every[i][...] = np.fromfile(os.path.join(folder, str(i)), every[i].dtype).reshape(spec.shape)
        outputs = tuple(every[i] for i, spec in enumerate(self.args) if spec.is_output)
        if not binding.returns_outputs:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    def _run(self, folder: str) -> None:
        try:
            done = subprocess.run([str(self.executable), folder, str(self.thread_order)], capture_output=True,
                                  text=True, timeout=RUN_TIMEOUT_SECS, env={**os.environ, **_SANITIZER_OPTIONS})
        except subprocess.TimeoutExpired:
            raise TilecraftError(f"{self.entry} ran on the CPU for over {RUN_TIMEOUT_SECS:.0f} s: a kernel that "
                                 "never ends, or one too large to run thread by thread (use smaller shapes)") from None
        if done.returncode != 0:
            raise TilecraftError(f"{self.entry}'s CUDA C, run on the CPU, failed (exit {done.returncode}): "
                                 f"{_summary(done.stderr, self.source)}")


def _list(values) -> str:
    return ", ".join(map(str, values))


_ACCESS = re.compile(r"^(Previous )?(read|write) of size", re.IGNORECASE)


def _summary(stderr: str, source: str) -> str:
    """The lines of a sanitizer's report that name the fault, each access followed by the
    kernel's statement it made; or the program's own message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named, access = [], False
    for line in lines:
        is_access = bool(_ACCESS.search(line))
        if is_access or re.search(r"ERROR:|WARNING:|runtime error|^SUMMARY|^Location is", line):
            named.append(line)
            access = is_access
        elif access and line.startswith("#0 ") and (at := re.search(r"\.cpp:(\d+)", line)):
            named.append(f"  at: {source.splitlines()[int(at.group(1)) - 1].strip()}")
            access = False
    return "\n".join(named or lines[-5:]) or "no message"
