"""Property test: random legal schedules of many workloads compute what NumPy computes.

Each schedule is made by a random sequence of primitives drawn from a seeded generator
(splits with dividing and non-dividing factors, reorders, fuses, annotations, inlining,
compute_at / reverse_compute_at, cache_write, transform_layout, decompose_reduction,
sampled tiles). A primitive that may be illegal is applied inside ``try``; when it is
refused the schedule must be left exactly as it was. On a mismatch the message prints
the trace as Python, so the failing schedule can be replayed.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te

# ----------------------------------------------------------------------------- workloads
# Each builder returns (dag, layouts): layouts lists (block, read_index, index_map) for
# layout-free placeholders that transform_layout may repack.


def matmul():
    A = te.placeholder((24, 17), name="A")
    B = te.placeholder((17, 20), name="B")
    k = te.reduce_axis((0, 17), name="k")
    C = te.compute((24, 20), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                   attrs={"layout_free_placeholders": [B]})
    return tc.ComputeDAG([A, B, C]), [("matmul", 1, lambda k, j: (j // 4, k, j % 4))]


def matmul_bias_relu():
    A = te.placeholder((16, 32), name="A")
    B = te.placeholder((32, 24), name="B")
    bias = te.placeholder((24,), name="bias")
    k = te.reduce_axis((0, 32), name="k")
    M = te.compute((16, 24), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                   attrs={"layout_free_placeholders": [B]})
    Bi = te.compute((16, 24), lambda i, j: M[i, j] + bias[j], name="bias_add")
    O = te.compute((16, 24), lambda i, j: te.max(Bi[i, j], 0.0), name="relu")
    return tc.ComputeDAG([A, B, bias, O]), [("matmul", 1, lambda k, j: (j // 8, k, j % 8))]


def dense_bias():
    X = te.placeholder((12, 40), name="X")
    W = te.placeholder((18, 40), name="W")
    bias = te.placeholder((18,), name="bias")
    k = te.reduce_axis((0, 40), name="k")
    D = te.compute((12, 18), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="dense",
                   attrs={"layout_free_placeholders": [W]})
    O = te.compute((12, 18), lambda i, j: D[i, j] + bias[j], name="add")
    return tc.ComputeDAG([X, W, bias, O]), [("dense", 1, lambda j, k: (k // 8, j, k % 8))]


def batch_matmul_int32():
    A = te.placeholder((3, 10, 12), name="A", dtype="int32")
    B = te.placeholder((3, 12, 14), name="B", dtype="int32")
    k = te.reduce_axis((0, 12), name="k")
    C = te.compute((3, 10, 14), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name="batch_matmul",
                   attrs={"layout_free_placeholders": [B]})
    return tc.ComputeDAG([A, B, C]), [("batch_matmul", 1, lambda b, k, j: (b, j // 7, k, j % 7))]


def conv2d_nchw():
    data = te.placeholder((1, 3, 11, 11), name="data")
    weight = te.placeholder((4, 3, 3, 3), name="weight")
    pad = te.compute(
        (1, 3, 13, 13),
        lambda n, c, h, w: te.if_then_else(te.all(h >= 1, h < 12, w >= 1, w < 12),
                                           data[n, c, h - 1, w - 1], 0.0),
        name="pad")
    rc = te.reduce_axis((0, 3), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    conv = te.compute(
        (1, 4, 6, 6),
        lambda n, f, y, x: te.sum(pad[n, rc, y * 2 + ry.var, x * 2 + rx.var] * weight[f, rc, ry, rx],
                                  axis=[rc, ry, rx]),
        name="conv", attrs={"layout_free_placeholders": [weight]})
    return tc.ComputeDAG([data, weight, conv]), [("conv", 1, lambda f, c, y, x: (f // 2, c, y, x, f % 2))]


def depthwise_conv_f64():
    data = te.placeholder((1, 4, 9, 9), name="data", dtype="float64")
    weight = te.placeholder((4, 3, 3), name="weight", dtype="float64")
    pad = te.compute(
        (1, 4, 11, 11),
        lambda n, c, h, w: te.if_then_else(te.all(h >= 1, h < 10, w >= 1, w < 10),
                                           data[n, c, h - 1, w - 1], te.const(0.0, "float64")),
        name="pad")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    conv = te.compute((1, 4, 9, 9),
                      lambda n, c, y, x: te.sum(pad[n, c, y + ry.var, x + rx.var] * weight[c, ry, rx], axis=[ry, rx]),
                      name="depthwise")
    return tc.ComputeDAG([data, weight, conv]), []


def pools():
    data = te.placeholder((1, 3, 10, 10), name="data")
    ry = te.reduce_axis((0, 2), name="ry")
    rx = te.reduce_axis((0, 2), name="rx")
    mx = te.compute((1, 3, 5, 5), lambda n, c, y, x: te.max(data[n, c, y * 2 + ry.var, x * 2 + rx.var], axis=[ry, rx]),
                    name="max_pool")
    sy = te.reduce_axis((0, 3), name="sy")
    sx = te.reduce_axis((0, 3), name="sx")
    sm = te.compute((1, 3, 8, 8), lambda n, c, y, x: te.sum(data[n, c, y + sy.var, x + sx.var], axis=[sy, sx]),
                    name="pool_sum")
    avg = te.compute((1, 3, 8, 8), lambda n, c, y, x: sm[n, c, y, x] / 9.0, name="avg_pool")
    return tc.ComputeDAG([data, mx, avg]), []


def softmax():
    X = te.placeholder((8, 21), name="X")
    k1 = te.reduce_axis((0, 21), name="k1")
    mx = te.compute((8,), lambda i: te.max(X[i, k1], axis=k1), name="row_max")
    ex = te.compute((8, 21), lambda i, j: te.exp(X[i, j] - mx[i]), name="exp")
    k2 = te.reduce_axis((0, 21), name="k2")
    sm = te.compute((8,), lambda i: te.sum(ex[i, k2], axis=k2), name="row_sum")
    out = te.compute((8, 21), lambda i, j: ex[i, j] / sm[i], name="softmax")
    return tc.ComputeDAG([X, out]), []


def layer_norm():
    X = te.placeholder((6, 24), name="X")
    gamma = te.placeholder((24,), name="gamma")
    beta = te.placeholder((24,), name="beta")
    k1 = te.reduce_axis((0, 24), name="k1")
    mean = te.compute((6,), lambda i: te.sum(X[i, k1], axis=k1) , name="sum_x")
    mu = te.compute((6,), lambda i: mean[i] / 24.0, name="mean")
    k2 = te.reduce_axis((0, 24), name="k2")
    var = te.compute((6,), lambda i: te.sum((X[i, k2] - mu[i]) * (X[i, k2] - mu[i]), axis=k2), name="var_sum")
    out = te.compute((6, 24), lambda i, j: (X[i, j] - mu[i]) * te.rsqrt(var[i] / 24.0 + 1e-5) * gamma[j] + beta[j],
                     name="layer_norm")
    return tc.ComputeDAG([X, gamma, beta, out]), []


def elementwise_f16():
    A = te.placeholder((12, 20), name="A", dtype="float16")
    row = te.placeholder((20,), name="row", dtype="float16")
    col = te.placeholder((12, 1), name="col", dtype="float16")
    s = te.compute((12, 20), lambda i, j: A[i, j] + row[j], name="add_row")
    m = te.compute((12, 20), lambda i, j: s[i, j] * col[i, 0], name="mul_col")
    t = te.compute((12, 20), lambda i, j: te.max(m[i, j], te.const(0.0, "float16")), name="relu")
    return tc.ComputeDAG([A, row, col, t]), []


def transpose_reshape():
    A = te.placeholder((6, 8, 5), name="A")
    T = te.compute((5, 6, 8), lambda c, a, b: A[a, b, c] * 2.0, name="transpose")
    R = te.compute((30, 8), lambda r, b: T[r // 6, r % 6, b] + 1.0, name="reshape")
    return tc.ComputeDAG([A, R]), []


def masked_reduction_int():
    A = te.placeholder((16, 16), name="A", dtype="int32")
    k = te.reduce_axis((0, 16), name="k")
    S = te.compute((16,), lambda i: te.sum(A[i, k] * (k.var + 1), axis=k, where=k.var <= i), name="tri_sum")
    O = te.compute((16, 16), lambda i, j: A[i, j] - S[i], name="sub")
    return tc.ComputeDAG([A, O]), []


WORKLOADS = {f.__name__: f for f in [
    matmul, matmul_bias_relu, dense_bias, batch_matmul_int32, conv2d_nchw, depthwise_conv_f64, pools,
    softmax, layer_norm, elementwise_f16, transpose_reshape, masked_reduction_int,
]}

SCHEDULES_PER_WORKLOAD = 28


# ----------------------------------------------------------------------------- random schedules
class Fuzzer:
    """Applies random primitives to ``sch``; refused ones must leave it unchanged."""

    def __init__(self, sch: tc.Schedule, rng: np.random.Generator, layouts):
        self.sch, self.rng, self.layouts = sch, rng, layouts
        self.refused: list[str] = []

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def attempt(self, name: str, fn, *args):
        before, steps = self.sch.state, len(self.sch.trace.steps)
        try:
            return fn(*args)
        except tc.ScheduleError as error:
            assert self.sch.state is before, f"{name} failed ({error}) but changed the schedule"
            assert len(self.sch.trace.steps) == steps, f"{name} failed ({error}) but was recorded in the trace"
            self.refused.append(f"{name}: {error}")
            return None

    def stages(self):
        return [s.name for s in self.sch.state.stages]

    def own_loops(self, name: str):
        block = self.sch.get_block(name)
        leaves = set(self.sch.state.stage(name).leaves)
        return block, [l for l in self.sch.get_loops(block) if l.id in leaves]

    def extent(self, loop) -> int:
        return self.sch.loop_extent(loop)

    # ---- phases
    def inline(self):
        for name in self.stages():
            stage = self.sch.state.stage(name)
            if not stage.is_reduction and not stage.is_output and self.chance(0.5):
                self.attempt("compute_inline", self.sch.compute_inline, self.sch.get_block(name))

    def layout(self):
        for block, index, index_map in self.layouts:
            if block in self.stages() and self.chance(0.5):
                self.attempt("transform_layout", self.sch.transform_layout, self.sch.get_block(block),
                             ("read", index), index_map)

    def cache(self):
        for name in self.stages():
            stage = self.sch.state.stage(name)
            if stage.is_reduction and self.chance(0.3):
                self.attempt("cache_write", self.sch.cache_write, self.sch.get_block(name), 0, "local")

    def tile(self, name: str):
        for _ in range(int(self.rng.integers(0, 4))):
            _, loops = self.own_loops(name)
            loop = loops[int(self.rng.integers(len(loops)))]
            extent = self.extent(loop)
            choice = self.rng.random()
            if choice < 0.3 and extent > 1:
                n = int(self.rng.integers(2, 4))
                factors = self.attempt("sample_perfect_tile", self.sch.sample_perfect_tile, loop, n,
                                       int(self.rng.integers(1, 17)))
                if factors is None:
                    continue
                factors = list(factors)
                if self.chance(0.3):
                    factors[0] = None
            elif choice < 0.8:  # any factor, often not dividing the extent
                factors = [None, int(self.rng.integers(1, extent + 3))]
            else:
                factors = [None, int(self.rng.integers(1, 5)), int(self.rng.integers(1, 5))]
            self.attempt("split", self.sch.split, loop, factors)
        _, loops = self.own_loops(name)
        if len(loops) > 1 and self.chance(0.5):
            order = [loops[int(i)] for i in self.rng.permutation(len(loops))]
            self.attempt("reorder", self.sch.reorder, *order)
        _, loops = self.own_loops(name)
        if len(loops) > 1 and self.chance(0.3):
            self.attempt("fuse", self.sch.fuse, loops[0], loops[1])

    def attach(self):
        for name in reversed(self.stages()):
            if name not in self.stages():
                continue
            stage = self.sch.state.stage(name)
            consumers = self.sch.state.consumers_of(name)
            producers = [s for s in self.sch.state.stages if any(t is s.tensor for t in stage.op.input_tensors)]
            if not stage.is_output and len(consumers) == 1 and self.chance(0.6):
                block = self.sch.get_block(name)
                if self.chance(0.3):
                    loop = self.attempt("sample_compute_location", self.sch.sample_compute_location, block)
                else:
                    path = self.sch.get_loops(self.sch.get_block(consumers[0].name))
                    loop = path[int(self.rng.integers(len(path)))] if path else None
                if loop is not None:
                    self.attempt("compute_at", self.sch.compute_at, block, loop)
            elif producers and not stage.is_reduction and self.chance(0.6):
                path = self.sch.get_loops(self.sch.get_block(producers[-1].name))
                if path:
                    loop = path[int(self.rng.integers(len(path)))]
                    self.attempt("reverse_compute_at", self.sch.reverse_compute_at, self.sch.get_block(name), loop)

    def annotate(self, name: str):
        stage = self.sch.state.stage(name)
        _, loops = self.own_loops(name)
        if stage.attach is None and self.chance(0.5):
            self.attempt("parallel", self.sch.parallel, loops[0])
        if self.chance(0.5):
            self.attempt("vectorize", self.sch.vectorize, loops[-1])
        if len(loops) > 2 and self.chance(0.2):
            self.attempt("unroll", self.sch.unroll, loops[int(self.rng.integers(1, len(loops) - 1))])
        if self.chance(0.3):
            self.attempt("annotate", self.sch.annotate, loops[0], "pragma_auto_unroll_max_step",
                         int(self.rng.choice([0, 16, 64, 512])))

    def decompose(self, name: str):
        stage = self.sch.state.stage(name)
        if stage.is_reduction and self.chance(0.4):
            block, loops = self.own_loops(name)
            self.attempt("decompose_reduction", self.sch.decompose_reduction, block,
                         loops[int(self.rng.integers(len(loops)))])

    def run(self):
        self.inline()
        self.layout()
        self.cache()
        for name in self.stages():
            self.tile(name)
        self.attach()
        for name in self.stages():
            self.annotate(name)
        for name in self.stages():
            self.decompose(name)


def tolerance(dtype: str) -> float:
    return {"float16": 1e-2, "float32": 1e-4, "float64": 1e-9}.get(dtype, 0.0)


def check_schedule(dag, layouts, seed: int, cache_dir) -> tc.Schedule:
    rng = np.random.default_rng(seed)
    sch = tc.Schedule(dag, seed=seed)
    fuzzer = Fuzzer(sch, rng, layouts)
    try:
        fuzzer.run()
        kernel = tc.build(sch, cache_dir=cache_dir)
    except Exception as error:
        raise AssertionError(f"seed {seed}: {type(error).__name__}: {error}\n{sch.trace.to_python()}") from error
    inputs = dag.random_inputs(np.random.default_rng(seed))
    expected = dag.evaluate_numpy(inputs)
    got = kernel(*inputs)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected)
    for out, ref, tensor in zip(got, expected, dag.outputs):
        assert out.shape == ref.shape and out.dtype == ref.dtype, f"{tensor.name}: {out.shape} {out.dtype}"
        tol = tolerance(tensor.dtype)
        scale = max(1.0, float(np.max(np.abs(ref.astype(np.float64)))))
        if tol == 0.0:
            ok = np.array_equal(out, ref)
        else:
            ok = np.allclose(out.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol * scale)
        if not ok:
            diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
            where = np.unravel_index(np.argmax(diff), diff.shape)
            raise AssertionError(
                f"seed {seed}: output {tensor.name} differs from NumPy by up to {diff.max()} at {where}\n"
                f"trace:\n{sch.trace.to_python()}\nlowered:\n{tc.lower(sch)}")
    return sch


# Workloads whose random schedules still expose lowering bugs (wrong results or C that does
# not compile for some seeds; the failing traces print on failure). Strict: a fix makes
# the case pass, which fails this mark until the name is removed from the set.
KNOWN_LOWERING_BUGS: set[str] = set()
FAST_WORKLOADS = {"matmul"}  # the `not slow` subset checks one operator; CI checks every one


def _marks(name: str) -> list:
    marks = [] if name in FAST_WORKLOADS else [pytest.mark.slow]
    if name in KNOWN_LOWERING_BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason="open lowering bug, see the failing trace"))
    return marks


@pytest.mark.parametrize("workload", [pytest.param(name, marks=_marks(name)) for name in WORKLOADS])
@pytest.mark.slow
def test_random_schedules(workload, kernel_cache):
    dag, layouts = WORKLOADS[workload]()
    kinds = set()
    for n in range(SCHEDULES_PER_WORKLOAD):
        seed = 1000 * (list(WORKLOADS).index(workload) + 1) + n
        sch = check_schedule(dag, layouts, seed, kernel_cache)
        kinds.update(step.kind for step in sch.trace.steps)
    # the random sequences exercise the primitives they are meant to; compute_inline only
    # where the workload has an intermediate element-wise block to inline
    inlinable = any(not s.is_reduction and not s.is_output for s in tc.Schedule(dag).state.stages)
    assert {"split", "reorder"} | ({"compute_inline"} if inlinable else set()) <= kinds


def test_total_schedule_count():
    assert len(WORKLOADS) * SCHEDULES_PER_WORKLOAD >= 300
