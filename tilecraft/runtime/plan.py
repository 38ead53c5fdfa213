"""NativePlan: a fixed sequence of C calls, each a function and its pointer arguments, made by one C call.

A compiled model runs ~50 kernels a call. A plan keeps the calls as arrays of function
addresses and arguments, and a small C loop (built once and cached like a kernel, or loaded
from a saved model) makes them all: one execution path, timed exactly in place. It is not
much faster than calling each kernel through ctypes (0.5 us a call saved; MobileNetV2, 56
calls, 4.94 against 4.97 ms). Arguments
that change from run to run (a model's inputs and new outputs) are named slots, filled
before each run; with ``seconds``, the loop also times every call in place.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..target import Target
from .compiler import compile_c

Call = tuple[int, Sequence[int | str]]
"""A function's address and its arguments: an address, or the name of a slot filled at each run."""

ENTRY = "tc_run_plan"

_SOURCE = """\
#include <stdint.h>
#include <time.h>

typedef void* tc_ptr;

static double tc_seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* Calls functions[k] for k < count with arity[k] pointer arguments each, taken in order
   from args; with seconds, times each call into seconds[k]. Every kernel and pack function is
   a void function of pointers only, so calling it through a void (*)(void*, ...) of its arity
   passes the arguments exactly as its own prototype does. */
void tc_run_plan(int64_t count, tc_ptr const* functions, const int32_t* arity, tc_ptr const* args,
                 double* seconds) {
  for (int64_t k = 0; k < count; ++k) {
    double started = seconds ? tc_seconds() : 0.0;
    switch (arity[k]) {
%s
    }
    if (seconds) seconds[k] = tc_seconds() - started;
    args += arity[k];
  }
}
"""


def plan_source(max_arity: int) -> str:
    """The C source of the loop for functions of 1 to ``max_arity`` pointer arguments."""
    cases = []
    for n in range(1, max_arity + 1):
        params, values = ", ".join(["tc_ptr"] * n), ", ".join(f"args[{i}]" for i in range(n))
        cases.append(f"      case {n}: ((void (*)({params}))functions[k])({values}); break;")
    return _SOURCE % "\n".join(cases)


def compile_plan_runner(max_arity: int, target: Target, cache_dir: Path | None = None) -> Path:
    """The shared library of the loop, for functions of up to ``max_arity`` arguments
    (rounded up to a multiple of 16, so that most models share one cached library)."""
    return compile_c(plan_source(max(16, -(-max_arity // 16) * 16)), target, cache_dir)


class NativePlan:
    """``plan.run(slots)`` makes ``calls`` in order, each slot name replaced by the address of
    ``slots[name]``. ``keep``: what the addresses point into, kept alive with the plan."""

    def __init__(self, calls: Sequence[Call], library: Path, keep: Sequence[object] = ()) -> None:
        self.library = Path(library)
        self._keep = tuple(keep)
        self._functions = np.array([function for function, _ in calls], dtype=np.uintp)
        self._arity = np.array([len(args) for _, args in calls], dtype=np.int32)
        flat = [arg for _, args in calls for arg in args]
        self._args = np.array([0 if isinstance(arg, str) else arg for arg in flat], dtype=np.uintp)
        self.slots = tuple(dict.fromkeys(arg for arg in flat if isinstance(arg, str)))
        self._positions = [(name, np.array([i for i, arg in enumerate(flat) if arg == name]))
                           for name in self.slots]
        self._run = ctypes.CDLL(str(self.library))[ENTRY]
        self._run.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 4
        self._run.restype = None
        self._addresses = (len(calls), self._functions.ctypes.data, self._arity.ctypes.data, self._args.ctypes.data)

    def __len__(self) -> int:
        return len(self._functions)

    def run(self, slots: Mapping[str, np.ndarray], seconds: np.ndarray | None = None) -> None:
        """Make the calls. The caller checked the arrays; ``seconds`` (float64, one per call)
        receives each call's time."""
        if seconds is not None and (seconds.dtype != np.float64 or seconds.shape != (len(self),)):
            raise ValueError(f"seconds must be a float64 array of shape ({len(self)},), one per call")
        for name, positions in self._positions:
            self._args[positions] = slots[name].ctypes.data
        self._run(*self._addresses, None if seconds is None else seconds.ctypes.data)
