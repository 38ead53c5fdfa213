"""The machine's measured peak: the yardstick for "% of peak" in summaries and benchmarks.

A nominal peak needs the clock and the number of FMA units, which no portable API gives;
so it is measured instead: every core runs independent chains of vector FMAs (enough of
them to hide the FMA latency), compiled for the target like any kernel. A busy machine
measures low (a tuned kernel once read "187% of peak"), so the highest value ever
measured for the target is kept beside the kernel cache and reported.
"""

from __future__ import annotations

import ctypes
import functools
import json
import time

from ..target import Target
from .compiler import compile_c, default_cache_dir

CHAINS = 12  # independent accumulators: more than latency x FMA ports on current CPUs

_SOURCE = """
#include <omp.h>
typedef float vec __attribute__((vector_size({vector_bytes})));
float tc_fma_peak(long iterations) {{
  float total = 0.0f;
  #pragma omp parallel reduction(+:total)
  {{
    vec acc[{chains}], b, c;
    for (int l = 0; l < {lanes}; ++l) {{ b[l] = 0.999f; c[l] = 0.001f; }}
    for (int n = 0; n < {chains}; ++n) for (int l = 0; l < {lanes}; ++l) acc[n][l] = (float)n;
    for (long i = 0; i < iterations; ++i) {{
      #pragma GCC unroll {chains}
      for (int n = 0; n < {chains}; ++n) acc[n] = acc[n] * b + c;
    }}
    for (int n = 0; n < {chains}; ++n) for (int l = 0; l < {lanes}; ++l) total += acc[n][l];
  }}
  return total;
}}
int tc_threads(void) {{
  int threads = 1;
  #pragma omp parallel
  {{
    #pragma omp single
    threads = omp_get_num_threads();
  }}
  return threads;
}}
"""


@functools.lru_cache(maxsize=8)
def peak_gflops(target: Target | None = None, seconds: float = 0.1) -> float | None:
    """fp32 GFLOPS of FMA chains on every core of ``target`` (the host by default): the
    best of three runs of at least ``seconds`` each, or the best measured before; None
    for a GPU."""
    target = target or Target.host()
    if getattr(target, "kind", "llvm") == "cuda":  # a GPU's peak is not measured yet
        return None
    lanes = target.vector_lanes("float32")
    lib = ctypes.CDLL(str(compile_c(_SOURCE.format(vector_bytes=4 * lanes, chains=CHAINS, lanes=lanes), target)))
    lib.tc_fma_peak.argtypes, lib.tc_fma_peak.restype = [ctypes.c_long], ctypes.c_float
    flop_per_iteration = 2 * CHAINS * lanes * lib.tc_threads()
    iterations, timings = 1 << 12, []
    while len(timings) < 3:
        started = time.perf_counter()
        lib.tc_fma_peak(iterations)
        elapsed = time.perf_counter() - started
        if elapsed < seconds:
            iterations *= 2
        else:
            timings.append(elapsed)
    return _best_ever(str(target), flop_per_iteration * iterations / min(timings) / 1e9)


def _best_ever(key: str, measured: float) -> float:
    path = default_cache_dir().parent / "peak.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    best = max(measured, float(known.get(key, 0.0)))
    if best > known.get(key, 0.0):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**known, key: best}))
        except OSError:
            pass  # a read-only home: the measurement of this run is still good
    return best
