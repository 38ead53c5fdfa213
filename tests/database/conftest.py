"""Tuning records without a tuner: a small real trace, records made from it, logs written from them."""

from __future__ import annotations

import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.database import TuningRecord, trace_key

TARGET = ("llvm -isa=avx2 -vector-bytes=32 -num-cores=4 -cache-line-bytes=64 -l1-bytes=32768 "
          "-l2-bytes=1048576 -l3-bytes=33554432 -march=haswell")


def _matmul_dag(n: int = 16) -> tc.ComputeDAG:
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul")
    return tc.ComputeDAG([A, B, C])


def _matmul_trace(inner: int) -> tc.Trace:
    sch = tc.Schedule(_matmul_dag(), seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    j0, j1 = sch.split(j, [None, inner])
    sch.reorder(i, k, j0, j1)
    sch.parallel(i)
    sch.vectorize(j1)
    return sch.trace


@pytest.fixture
def matmul_dag():
    return _matmul_dag


@pytest.fixture
def matmul_trace():
    """``matmul_trace(inner)``: a real schedule trace of a 16x16 matmul; ``inner`` in (1, 2, 4, 8, 16)."""
    return _matmul_trace


@pytest.fixture
def make_record():
    """``make_record(cost, key=..., target=..., error=..., ...)``: a record of a 16x16 matmul; cost None: no costs."""

    def make(cost: float | None = 1e-3, *, key: str = '["dag", "k0"]', target: str = TARGET, error: str = "none",
             msg: str = "", timestamp: float = 1000.0, inner: int = 4, workload: dict | None = None,
             sketch: str | None = "tiling") -> TuningRecord:
        return TuningRecord(
            workload_key=key, workload=workload, target=target, trace_json=trace_key(_matmul_trace(inner)),
            costs=() if cost is None else (cost, cost), error_kind=error, error_msg=msg, all_cost=0.5,
            timestamp=timestamp, flop=2.0 * 16**3, sketch=sketch)

    return make


@pytest.fixture
def write_log():
    """``write_log(path, records, extra="")``: the records as a log, then ``extra`` verbatim."""

    def write(path, records, extra: str = "") -> None:
        with open(path, "w") as file:
            file.writelines(r.to_json_line() + "\n" for r in records)
            file.write(extra)

    return write


@pytest.fixture
def target():
    return TARGET


@pytest.fixture
def other_target():
    return TARGET.replace("-num-cores=4", "-num-cores=8")
