"""A tour of tilecraft: write a 1024^3 fp32 matmul in te, schedule it by hand, check it, time it.

Run: python examples/matmul_hand_schedule.py
"""
import time

import numpy as np

import tilecraft as tc
from tilecraft import te

N = 1024
TI, TJ = 6, 16  # register tile: 6 rows x 16 columns (2 AVX2 vectors) = 12 accumulators + 2 B vectors + 1 broadcast

# 1. What to compute. B is "layout free": the schedule may repack it (once, outside the timed kernel).
A = te.placeholder((N, N), name="A")
B = te.placeholder((N, N), name="B")
k = te.reduce_axis((0, N), name="k")
C = te.compute((N, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
               attrs={"layout_free_placeholders": [B]})
dag = tc.ComputeDAG([A, B, C])
print(dag)

# 2. How to compute it.
sch = tc.Schedule(dag)
b = sch.get_block("matmul")
sch.transform_layout(b, ("read", 1), lambda kk, jj: (jj // TJ, kk, jj % TJ))  # B -> [N/TJ][N][TJ]: unit-stride panels
c = sch.cache_write(b, 0, "local")           # accumulate a tile in a local array, copy it out at the end
ci, cj = sch.get_loops(c)
ci0, ci1 = sch.split(ci, [None, TI])
cj0, cj1 = sch.split(cj, [None, TJ])
sch.reorder(ci0, cj0, ci1, cj1)
f0 = sch.fuse(ci0, cj0)                      # one parallel loop over all output tiles
sch.parallel(f0)
sch.vectorize(cj1)
sch.compute_at(b, f0)                        # compute each tile right where it is copied out
i, j, kk = sch.get_loops(b)[-3:]
sch.reorder(kk, i, j)                        # k outside: each step is TI broadcasts x TJ/8 FMAs
sch.unroll(i)
sch.vectorize(j)
print(tc.lower(sch))

# 3. Build, check, time.
f = tc.build(sch, tc.Target.host())
a, bm = dag.random_inputs()
out = f(a, bm)
np.testing.assert_allclose(out, a @ bm, rtol=1e-3, atol=1e-3)
secs = f.time_evaluator(number=5, repeat=5, min_repeat_ms=200)(a, bm, out).median
t0 = time.perf_counter(); reps = 0
while time.perf_counter() - t0 < 1.0:
    a @ bm; reps += 1
np_secs = (time.perf_counter() - t0) / reps
flops = 2 * N ** 3
print(f"tilecraft {flops / secs / 1e9:.1f} GFLOPS, NumPy {flops / np_secs / 1e9:.1f} GFLOPS")

# 4. The schedule as a replayable Python program.
print(sch.trace.to_python())
