"""NativePlan: C calls made in order by one C call, with slots filled at every run and each call timed."""

import ctypes

import numpy as np
import pytest

from tilecraft.runtime import compile_c
from tilecraft.runtime.plan import NativePlan, compile_plan_runner, plan_source
from tilecraft.target import Target

WIDE = 20  # arguments of sum_all: more than the 16 of the smallest runner
SOURCE = f"""
void add_one(float* restrict a) {{ a[0] += 1.0f; }}
void double_it(float* restrict a) {{ a[0] *= 2.0f; }}
void sum_all({", ".join(f"const float* restrict a{i}" for i in range(WIDE - 1))}, float* restrict out) {{
  out[0] = {" + ".join(f"a{i}[0]" for i in range(WIDE - 1))};
}}
"""


@pytest.fixture(scope="module")
def functions(tmp_path_factory):
    lib = ctypes.CDLL(str(compile_c(SOURCE, Target.host(), tmp_path_factory.mktemp("plan"))))
    return {name: ctypes.cast(lib[name], ctypes.c_void_p).value for name in ("add_one", "double_it", "sum_all")}


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return compile_plan_runner(WIDE, Target.host(), tmp_path_factory.mktemp("runner"))


def test_calls_run_in_order_on_fixed_buffers_and_slots(functions, runner):
    a, b = np.zeros(1, np.float32), np.full(1, 5, np.float32)
    plan = NativePlan([(functions["add_one"], (a.ctypes.data,)), (functions["double_it"], (a.ctypes.data,)),
                       (functions["add_one"], ("x",)), (functions["double_it"], ("x",))], runner, keep=[a])
    assert len(plan) == 4 and plan.slots == ("x",)
    plan.run({"x": b})
    assert a[0] == 2.0 and b[0] == 12.0  # (0 + 1) * 2 and (5 + 1) * 2: order kept
    c = np.zeros(1, np.float32)
    plan.run({"x": c})
    assert a[0] == 6.0 and c[0] == 2.0 and b[0] == 12.0  # the slot now points at c


def test_a_function_of_more_arguments_than_the_smallest_runner_is_called_with_all(functions, runner):
    inputs = [np.full(1, i, np.float32) for i in range(WIDE - 1)]
    plan = NativePlan([(functions["sum_all"], (*[x.ctypes.data for x in inputs], "out"))], runner, keep=inputs)
    out = np.zeros(1, np.float32)
    plan.run({"out": out})
    assert out[0] == sum(range(WIDE - 1))
    assert f"case {WIDE}:" not in plan_source(WIDE - 1) and f"case {WIDE}:" in plan_source(WIDE)


def test_seconds_receive_each_calls_time_and_must_be_one_float64_per_call(functions, runner):
    a = np.zeros(1, np.float32)
    plan = NativePlan([(functions["add_one"], (a.ctypes.data,))] * 3, runner, keep=[a])
    seconds = np.full(3, -1.0)
    plan.run({}, seconds)
    assert a[0] == 3.0 and np.all(seconds >= 0) and np.all(seconds < 1)
    with pytest.raises(ValueError, match=r"seconds must be a float64 array of shape \(3,\)"):
        plan.run({}, np.zeros(2))
