"""Evicting given buffers from every cache level, so that a timed call reads them from memory.

Inside a model, a layer's weights are evicted by the layers between two of its calls; timed
alone and warm, they sit in the caches. On four of ResNet-50's 14x14 and 7x7 layers (AVX-512
machine), a call after its packed weights were evicted took 90-101% of the layer's time
inside the model, a warm call 62-83%. Flushing every cache (``cache_flusher``) evicts the
input too, which the layer before has just written, and costs twice the L3 in memory traffic
a call. So ``weight_evictor`` flushes the weights' own cache lines (``clflushopt``, or
``dc civac`` on Arm), nothing else. It measures where a model's time goes
(``benchmarks/model_profile.py``); as a tuning objective it did not find faster kernels in
place (docs/experiments/tuning-with-weights-evicted.md).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Callable, Sequence

import numpy as np

from ..target import Target
from .compiler import compile_c

_SOURCE = """\
#include <stdint.h>

/* Writes back and invalidates every cache line that holds a byte of [start, start + nbytes),
   in all levels; line is the cache line's size, a power of two. */
void tc_evict(const char* start, int64_t nbytes, int64_t line) {
  uintptr_t end = (uintptr_t)start + (uintptr_t)nbytes;
  for (uintptr_t at = (uintptr_t)start & ~(uintptr_t)(line - 1); at < end; at += (uintptr_t)line) {
#if defined(__CLFLUSHOPT__)
    __builtin_ia32_clflushopt((void*)at);
#elif defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_clflush((void*)at);
#elif defined(__aarch64__)
    __asm__ volatile("dc civac, %0" : : "r"(at) : "memory");
#else
#error "no instruction to evict a cache line on this architecture"
#endif
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_mfence();
#elif defined(__aarch64__)
  __asm__ volatile("dsb sy" : : : "memory");
#endif
}
"""


@cache
def _evict_function() -> ctypes._CFuncPtr:
    function = ctypes.CDLL(str(compile_c(_SOURCE, Target.host())))["tc_evict"]
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    function.restype = None
    return function


def weight_evictor(buffers: Sequence[np.ndarray]) -> Callable[[], None]:
    """A function that evicts ``buffers`` (kept alive by it) from the caches."""
    evict, line = _evict_function(), Target.host().cache_line_bytes
    regions = [(buffer, buffer.ctypes.data, buffer.nbytes) for buffer in buffers]

    def run() -> None:
        for _, address, nbytes in regions:
            evict(address, nbytes, line)

    return run
