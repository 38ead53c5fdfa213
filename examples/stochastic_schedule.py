"""The MetaSchedule chapter with tilecraft: a stochastic schedule searched by tune_tir, then
the generated search space, on the chapter's 128x128 matmul.

Run: python examples/stochastic_schedule.py [--trials 16] [--strategy replay-trace] [--work-dir DIR]

The work dir is the database: run again with the same --work-dir and tuning resumes
(here: finds its budget spent and measures nothing).
"""
import argparse
import tempfile
import timeit
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft import te

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--trials", type=int, default=16, help="max_trials_global of the generated space's run")
parser.add_argument("--strategy", default="evolutionary", choices=["evolutionary", "replay-trace"])
parser.add_argument("--work-dir", type=Path, default=None, help="default: a new temporary directory")
args = parser.parse_args()
work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tune_tmp_"))
target = "llvm --num-cores=2"

# The chapter's MyModule: C = A @ B, 128x128x128, the block named "C".
A = te.placeholder((128, 128), name="A")
B = te.placeholder((128, 128), name="B")
k = te.reduce_axis((0, 128), name="k")
C = te.compute((128, 128), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
dag = tc.ComputeDAG([A, B, C])
a_np, b_np = dag.random_inputs()


def time_ms(sch):
    func = tc.build(sch, target)
    c_np = func(a_np, b_np)
    np.testing.assert_allclose(c_np, a_np @ b_np, rtol=1e-4, atol=1e-3)
    return func.time_evaluator(number=20, repeat=5, min_repeat_ms=50)(a_np, b_np, c_np).median * 1e3


# 1. A stochastic schedule: the split factor is sampled; the trace records the decision.
def stochastic_schedule_mm(sch: tc.Schedule):
    block_C = sch.get_block("C", "main")
    i, j, k = sch.get_loops(block=block_C)
    j_factors = sch.sample_perfect_tile(loop=j, n=2, max_innermost_factor=16)
    j_0, j_1 = sch.split(loop=j, factors=j_factors)
    sch.reorder(i, j_0, k, j_1)
    sch.decompose_reduction(block_C, k)
    return sch


for seed in range(2):
    stochastic_schedule_mm(tc.Schedule(dag, seed=seed)).trace.show()

# 2. Search that space with tune_tir, then take the best from the database.
print(f"\n== tune_tir with space=ScheduleFn(stochastic_schedule_mm), work dir {work_dir / 'stochastic'}")
database = tc.tune_tir(mod=dag, target=target, max_trials_global=64, num_trials_per_iter=64,
                       space=tc.ScheduleFn(stochastic_schedule_mm), work_dir=work_dir / "stochastic",
                       task_name="main", strategy=args.strategy)
sch = tc.compile_tir(database, dag, target)
sch.trace.show()
print(f"Time cost of MyModule after tuning: {time_ms(sch):.3f} ms")

# 3. The generated search space (sketch rules): leave out space=.
print(f"\n== tune_tir with the generated space, work dir {work_dir / 'default'}")
database = tc.tune_tir(mod=dag, target=target, max_trials_global=args.trials, num_trials_per_iter=min(args.trials, 64),
                       work_dir=work_dir / "default", task_name="main", strategy=args.strategy)
sch = tc.compile_tir(database, dag, target)
sch.trace.show()
print(f"Time cost of MyModule after tuning the generated space: {time_ms(sch):.3f} ms")
print(f"NumPy (a @ b): {timeit.timeit(lambda: a_np @ b_np, number=200) / 200 * 1e3:.3f} ms")
print(f"the run, trial by trial: {work_dir / 'default' / 'tuning.log'}")
