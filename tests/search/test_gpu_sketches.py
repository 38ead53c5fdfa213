"""GPU sketches: the structures the GPU rules give each kind of operator, and random candidates
of every sketch either refused by the GPU verifier or equal to NumPy in the CPU emulation
(and compiled by nvcc for sm_90 where it is installed)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.errors import GpuLimitError
from tilecraft.ops.conv import conv2d_nchw
from tilecraft.ops.linalg import dense
from tilecraft.ops.nn import layer_norm, softmax
from tilecraft.search.space import generate_sketches

TARGET = tc.Target("cuda -arch=sm_90")


def matmul(n, l, m):
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    k = te.reduce_axis((0, l), name="k")
    return tc.ComputeDAG([A, B, te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])


def row_sum(n, m):
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), name="k")
    return tc.ComputeDAG([A, te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")])


def add_relu(n, m):
    A = te.placeholder((n, m), name="A")
    B = te.placeholder((m,), name="B")
    S = te.compute((n, m), lambda i, j: A[i, j] + B[j], name="S")
    return tc.ComputeDAG([A, B, te.compute((n, m), lambda i, j: te.max(S[i, j], te.const(0.0)), name="R")])


def conv():
    X = te.placeholder((1, 8, 10, 10), name="X")
    W = te.placeholder((16, 8, 3, 3), name="W")
    return tc.ComputeDAG([X, W, conv2d_nchw(X, W, padding=1)])


def softmax_rows():
    X = te.placeholder((5, 40), name="X")
    return tc.ComputeDAG([X, softmax(X)])


def layer_norm_rows():
    X = te.placeholder((5, 40), name="X")
    G = te.placeholder((40,), name="G")
    B = te.placeholder((40,), name="Bias")
    return tc.ComputeDAG([X, G, B, layer_norm(X, G, B)])


def dense_layer():
    X = te.placeholder((4, 64), name="X")
    W = te.placeholder((24, 64), name="W")
    return tc.ComputeDAG([X, W, dense(X, W)])


WORKLOADS = {"matmul": lambda: matmul(64, 48, 64), "matmul_odd": lambda: matmul(33, 20, 45), "row_sum": lambda: row_sum(6, 150),
             "add_relu": lambda: add_relu(33, 70), "conv2d": conv, "softmax": softmax_rows,
             "layer_norm": layer_norm_rows, "dense": dense_layer}


def test_a_matmul_is_tiled_for_blocks_vthreads_and_threads_with_shared_tiles():
    (sketch,) = generate_sketches(matmul(64, 48, 64), target=TARGET)
    assert sketch.name == "gpu_tile"
    steps = [(step.kind, dict(step.args)) for step in sketch.trace.steps]
    axes = [args["thread_axis"] for kind, args in steps if kind == "bind"]
    assert axes == ["blockIdx.x", "vthread.x", "threadIdx.x"]
    scopes = [args["storage_scope"] for kind, args in steps if kind in ("cache_read", "cache_write")]
    assert scopes == ["local", "shared", "shared"]
    assert sum(kind == "annotate" and args["ann_key"] == "meta_schedule.cooperative_fetch" for kind, args in steps) == 2


def test_reductions_get_a_sketch_across_threads_and_rows_reduce_in_their_block():
    names = {sketch.name for sketch in generate_sketches(row_sum(6, 150), target=TARGET)}
    assert names == {"auto_bind(B)", "cross_thread(B)"}
    names = {sketch.name for sketch in generate_sketches(softmax_rows(), target=TARGET)}
    assert "auto_bind(softmax) cross_thread_at_block(softmax_sum) inline(softmax_exp) " \
           "cross_thread_at_block(softmax_max)" in names


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_random_candidates_of_every_gpu_sketch_match_numpy_or_are_refused(workload):
    dag = WORKLOADS[workload]()
    inputs = dag.random_inputs(np.random.default_rng(1))
    expected = dag.evaluate_numpy(inputs)[0]
    for sketch in generate_sketches(dag, target=TARGET):
        valid = 0
        for row in sketch.sample_uniform(np.random.default_rng(0), 6):
            sch = sketch.trace_of(row).replay(dag)
            try:
                kernel = tc.emulate_gpu(sch, TARGET)
            except GpuLimitError:  # the verifier's refusals cost no build
                continue
            np.testing.assert_allclose(kernel(*inputs), expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{sketch.name}:\n{sch}")
            if valid == 0 and shutil.which("nvcc"):
                tc.build(sch, TARGET)
            valid += 1
        assert valid, f"no random candidate of sketch {sketch.name} passed the verifier"

