"""Virtual threads moved inside a thread's statements: shared tiles fetched once for all of
them, an accumulator a virtual thread, and what a repeat would change left under the loop."""

import shutil

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.ir.nodes import AtomicAdd, Barrier, Buffer, For, Seq, Store, walk_stmts
from tilecraft.ir.vthread import inject_virtual_threads
from tilecraft.te.expr import TensorRead, Var, binary, const


def matmul_with_virtual_threads(vthreads: int) -> tc.Schedule:
    """A 32 x 16 x 64 matmul: 4 x 4 threads, 2 x 2 registers a thread and a virtual thread,
    ``vthreads`` virtual threads along j, shared tiles fetched at each step of 4."""
    A, B = te.placeholder((32, 16), name="A"), te.placeholder((16, 64), name="B")
    k = te.reduce_axis((0, 16), name="k")
    sch = tc.Schedule(tc.ComputeDAG([A, B, te.compute((32, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k),
                                                       name="C")]))
    c = sch.get_block("C")
    acc = sch.cache_write(c, 0, "local")
    i, j = sch.get_loops(acc)
    bi, ti, ii = sch.split(i, [None, 4, 2])
    bj, vj, tj, jj = sch.split(j, [None, vthreads, 4, 2])
    sch.reorder(bi, bj, vj, ti, tj, ii, jj)
    for loop, axis in ((bi, "blockIdx.y"), (bj, "blockIdx.x"), (vj, "vthread.x"), (ti, "threadIdx.y"),
                       (tj, "threadIdx.x")):
        sch.bind(loop, axis)
    sch.compute_at(c, tj)
    ci, cj, k = sch.get_loops(c)[-3:]
    ko, ki = sch.split(k, [None, 4])
    sch.reorder(ko, ki, ci, cj)
    for index in (0, 1):
        cached = sch.cache_read(c, index, "shared")
        sch.compute_at(cached, ko)
        _, ty, tx = sch.split(sch.fuse(*sch.get_loops(cached)[-2:]), [None, 4, 4])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    return sch


def _under_virtual_thread(body, wanted) -> list[bool]:
    """For each statement ``wanted`` picks, whether a loop bound to a virtual thread encloses it."""
    found = []

    def visit(s, inside):
        if wanted(s):
            found.append(inside)
        if isinstance(s, For):
            visit(s.body, inside or s.kind.startswith("vthread"))
        elif isinstance(s, Seq):
            for child in s.stmts:
                visit(child, inside)
        elif hasattr(s, "body"):
            visit(s.body, inside)
        elif hasattr(s, "then"):
            visit(s.then, inside)

    visit(body, False)
    return found


def test_virtual_threads_share_one_fetch_of_the_shared_tiles_and_keep_an_accumulator_each():
    sch = matmul_with_virtual_threads(2)
    body = tc.lower(sch).body
    shared_stores = _under_virtual_thread(body, lambda s: isinstance(s, Store) and s.buffer.scope == "shared")
    assert shared_stores == [False, False]  # A's and B's tile, each copied once a step
    assert _under_virtual_thread(body, lambda s: isinstance(s, Barrier)) == [False, False]
    accumulator = next(n.buffer for n in walk_stmts(body) if getattr(n, "buffer", None) is not None
                       and n.buffer.scope == "local")
    assert accumulator.shape == (2, 2, 2)  # virtual thread, i, j
    assert all(_under_virtual_thread(body, lambda s: isinstance(s, Store) and s.buffer.scope in ("local", "arg")))

    inputs = sch.dag.random_inputs(np.random.default_rng(0))
    np.testing.assert_allclose(tc.emulate_gpu(sch, "cuda -arch=sm_90")(*inputs), sch.dag.evaluate_numpy(inputs)[0],
                               rtol=1e-4, atol=1e-4)
    if shutil.which("nvcc"):
        assert "__syncthreads" in tc.build(sch, "cuda -arch=sm_90").source


def test_one_virtual_thread_leaves_the_nest_as_it_is():
    body = tc.lower(matmul_with_virtual_threads(1)).body
    assert next(n.buffer for n in walk_stmts(body) if getattr(n, "buffer", None) is not None
                and n.buffer.scope == "local").shape == (2, 2)


def test_what_a_repeat_would_change_stays_under_the_loop():
    """A copy into shared memory and a barrier run once; an accumulation into a buffer that
    does not name the virtual thread, or an atomic add, still run once a virtual thread."""
    vt = Var("vt", "int32")
    tile = Buffer("tile", (4,), "float32", "shared")
    total = Buffer("total", (1,), "float32", "arg")
    source = Buffer("source", (4,), "float32", "arg")
    out = Buffer("out", (2,), "float32", "arg")
    copy = Store(tile, (const(0),), TensorRead(source, (const(0),)))
    accumulate = Store(total, (const(0),), binary("add", TensorRead(total, (const(0),)), const(1.0)))
    atomic = AtomicAdd(total, (const(0),), const(1.0))
    own = Store(out, (vt,), TensorRead(tile, (const(0),)))
    loop = For(vt, 2, "vthread.x", Seq((copy, Barrier(), accumulate, atomic, own)))
    injected = inject_virtual_threads(loop)
    assert isinstance(injected, Seq)
    kept_once = [s for s in injected.stmts if not isinstance(s, For)]
    repeated = [s.body for s in injected.stmts if isinstance(s, For)]
    assert kept_once == [copy, Barrier()]
    assert repeated == [accumulate, atomic, own]
    assert all(s.var is vt and s.extent == 2 and s.kind == "vthread.x" for s in injected.stmts if isinstance(s, For))
