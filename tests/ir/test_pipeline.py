"""Software pipelining: a GPU block's shared tiles double-buffered across its reduction steps."""

import shutil

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen.cuda import generate_cuda
from tilecraft.ir.nodes import (Allocate, AsyncCopies, AsyncWait, Barrier, Buffer, For, Seq, Store, walk_stmts)
from tilecraft.ir.pipeline import software_pipeline
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches
from tilecraft.te.expr import TensorRead, Var, const

TARGET = tc.Target("cuda -arch=sm_90")


def pipelined_matmul(n=128, l=96, m=128, target=TARGET):
    A, B = te.placeholder((n, l), name="A"), te.placeholder((l, m), name="B")
    k = te.reduce_axis((0, l), name="k")
    dag = tc.ComputeDAG([A, B, te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])
    sketch = next(s for s in generate_sketches(dag, target=target) if s.name == "gpu_tile_pipelined")
    return dag, sketch.trace_of(default_row(sketch, 1)).replay(dag)


@pytest.mark.slow
def test_each_step_fills_the_next_steps_tiles_into_the_other_slot_and_the_values_are_numpys(kernel_cache):
    dag, sch = pipelined_matmul()
    func = tc.lower(sch)
    nodes = list(walk_stmts(func.body))
    tiles = [n.buffer for n in nodes if isinstance(n, Allocate) and n.buffer.scope == "shared"]
    assert sorted(b.name for b in tiles) == ["A_shared", "B_shared"] and all(b.shape[0] == 2 for b in tiles)
    (loop,) = [n for n in nodes if isinstance(n, For) and isinstance(n.body, Seq)
               and any(isinstance(c, AsyncWait) for c in n.body.stmts)]
    inside = list(walk_stmts(loop.body))
    assert loop.kind == "serial" and sum(isinstance(n, Barrier) for n in inside) == 2
    assert [n.pending for n in inside if isinstance(n, AsyncWait)] == [1]
    assert sum(isinstance(n, AsyncCopies) for n in nodes) == 2  # the first step's, before the loop, and the next's
    # the first step's copies a group of their own: committed with the second step's, the wait in
    # the first step (all but the latest group) would not wait for them
    around = next(n.stmts for n in nodes if isinstance(n, Seq) and any(s is loop for s in n.stmts))
    assert [type(s) for s in around] == [AsyncCopies, AsyncWait, For] and around[1].pending == 1
    inputs = dag.random_inputs(np.random.default_rng(0))
    # the CUDA C too, where a copy lands only when a wait requires it
    for cuda_source in [False] + [True] * bool(shutil.which("g++")):
        np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET, cache_dir=kernel_cache, cuda_source=cuda_source)(
            *inputs), dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch, asynchronous", [("sm_90", True), ("sm_75", False)])
@pytest.mark.slow
def test_the_copies_are_cp_async_from_sm_80_on_and_plain_before(arch, asynchronous, kernel_cache):
    target = tc.Target(f"cuda -arch={arch}")
    _, sch = pipelined_matmul(target=target)
    source, _ = generate_cuda(tc.lower(sch), target)
    body = source[source.index('extern "C"'):]  # the prelude defines the copies whether a kernel makes them or not
    assert ("TC_CP_ASYNC(cg, 16," in body and body.count("TC_CP_ASYNC_WAIT(1);") == 2) == asynchronous, source
    if shutil.which("nvcc"):
        tc.build(sch, target, cache_dir=kernel_cache)


def test_a_tile_laid_out_along_i_is_double_buffered_a_cp_async_a_float(kernel_cache):
    """A's tile stored i-contiguous (its copies load along k): pipelined, each thread copies
    one float a step, a 4-byte cp.async, where a float4 would be stored a lane at a time
    through registers; B's tile still moves 16 bytes a copy; the values are NumPy's."""
    A, B = te.placeholder((128, 96), name="A"), te.placeholder((96, 128), name="B")
    k = te.reduce_axis((0, 96), name="k")
    dag = tc.ComputeDAG([A, B, te.compute((128, 128), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])
    sketch = next(s for s in generate_sketches(dag, target=TARGET) if s.name == "gpu_tile_transposed_pipelined")
    sch = sketch.trace_of(default_row(sketch, 1)).replay(dag)
    source, _ = generate_cuda(tc.lower(sch), TARGET)
    copies = [line for line in source.splitlines() if "TC_CP_ASYNC(" in line]
    assert {("A_shared" in line, "(ca, 4," in line) for line in copies} == {(True, True), (False, False)}, source
    assert all("(cg, 16," in line for line in copies if "B_shared" in line)
    inputs = dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(sch, TARGET, cache_dir=kernel_cache)(*inputs),
                               dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)
    if shutil.which("nvcc"):
        tc.build(sch, TARGET, cache_dir=kernel_cache)


def step_loop(tile_floats: int, first_barrier: bool = True) -> For:
    """for k in range(4) pipeline: [barrier] tile[i] = src[k, i]; barrier; out[k] = tile[0]"""
    k, i = Var("k"), Var("i")
    tile, src = Buffer("tile", (tile_floats,), "float32", "shared"), Buffer("src", (4, tile_floats), "float32", "arg")
    out = Buffer("out", (4,), "float32", "arg")
    fill = For(i, tile_floats, "threadIdx.x", Store(tile, (i,), TensorRead(src, (k, i))))
    steps = ([Barrier()] if first_barrier else []) + [fill, Barrier(), Store(out, (k,), TensorRead(tile, (const(0),)))]
    return For(k, 4, "pipeline", Allocate(tile, Seq(tuple(steps))))


@pytest.mark.parametrize("loop", [step_loop(30 * 1024), step_loop(64, first_barrier=False)],
                         ids=["tiles-twice-over-227KB", "no-barrier-before-the-fills"])
def test_a_loop_that_cannot_be_pipelined_stays_as_it_was_but_serial(loop):
    result = software_pipeline(loop)
    assert isinstance(result, For) and result.kind == "serial" and result.body == loop.body
    assert not any(isinstance(n, (AsyncCopies, AsyncWait)) for n in walk_stmts(result))


def test_a_loop_that_can_is_pipelined():
    result = software_pipeline(step_loop(64))
    assert isinstance(result, Allocate) and result.buffer.shape == (2, 64)
