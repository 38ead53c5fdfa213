"""Hand-written tilecraft schedules against NumPy (and PyTorch CPU when installed).

    python benchmarks/hand_schedules.py [--quick] [--out benchmarks/results/hand_schedules.json]

Every schedule follows one recipe, sized by the host's vector width and registers (AVX2:
16 registers of 8 fp32 lanes; AVX-512: 32 of 16):
  * the weight-like input is a layout-free placeholder, repacked once (outside the timed
    kernel) so the innermost vector loop reads it with unit stride;
  * the output is computed into a `cache_write` "local" tile that gcc keeps in registers:
    rows x VECTORS accumulators + VECTORS weight vectors + 1 broadcast <= the registers
    (6 rows x 2 vectors on AVX2, 6 x 4 on AVX-512);
  * the reduction loop sits directly outside the unrolled rows and vectorized lanes, so
    each reduction step is a few broadcasts and FMAs; one fused parallel loop over tiles,
    a weight panel's tiles together, so that each core reads its panels of the weights once.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft import te
from tilecraft.codegen import generate_c
from tilecraft.runtime import compile_c

from tables import numeric_table, print_table  # benchmarks/tables.py, beside this script

try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)
except ImportError:
    torch = None

TARGET = tc.Target.host()
LANES = TARGET.vector_lanes("float32")
VECTORS = 2 if TARGET.vector_registers < 32 else 4  # vectors of a register tile's row
ROWS = (TARGET.vector_registers - 1 - VECTORS) // VECTORS  # beside them: VECTORS weights, 1 broadcast


# ----------------------------------------------------------------------------- workloads
def matmul_dag(n, m, l):
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    k = te.reduce_axis((0, l), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul",
                   attrs={"layout_free_placeholders": [B]})
    return tc.ComputeDAG([A, B, C])


def conv_nhwc_dag(n=1, h=56, w=56, c=64, k=64, r=3, pad=1):
    X = te.placeholder((n, h, w, c), name="X")
    W = te.placeholder((r, r, c, k), name="W")  # HWIO
    P = te.compute((n, h + 2 * pad, w + 2 * pad, c), lambda b, y, x, ch: te.if_then_else(
        te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), X[b, y - pad, x - pad, ch], 0.0), name="pad")
    rc, ry, rx = te.reduce_axis((0, c), name="rc"), te.reduce_axis((0, r), name="ry"), te.reduce_axis((0, r), name="rx")
    Y = te.compute((n, h, w, k), lambda b, y, x, o: te.sum(P[b, y + ry.var, x + rx.var, rc] * W[ry, rx, rc, o],
                                                           axis=[ry, rx, rc]),
                   name="conv", attrs={"layout_free_placeholders": [W]})
    return tc.ComputeDAG([X, W, Y])


def conv_nchw_dag(n=1, c=64, h=56, w=56, k=64, r=3, pad=1):
    X = te.placeholder((n, c, h, w), name="X")
    W = te.placeholder((k, c, r, r), name="W")  # OIHW
    P = te.compute((n, c, h + 2 * pad, w + 2 * pad), lambda b, ch, y, x: te.if_then_else(
        te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), X[b, ch, y - pad, x - pad], 0.0), name="pad")
    rc, ry, rx = te.reduce_axis((0, c), name="rc"), te.reduce_axis((0, r), name="ry"), te.reduce_axis((0, r), name="rx")
    Y = te.compute((n, k, h, w), lambda b, o, y, x: te.sum(P[b, rc, y + ry.var, x + rx.var] * W[o, rc, ry, rx],
                                                           axis=[rc, ry, rx]),
                   name="conv", attrs={"layout_free_placeholders": [W]})
    return tc.ComputeDAG([X, W, Y])


def dense_dag(batch=1, units=1000, inp=2048):
    X = te.placeholder((batch, inp), name="X")
    W = te.placeholder((units, inp), name="W")
    k = te.reduce_axis((0, inp), name="k")
    Y = te.compute((batch, units), lambda b, j: te.sum(X[b, k] * W[j, k], axis=k), name="dense",
                   attrs={"layout_free_placeholders": [W]})
    return tc.ComputeDAG([X, W, Y])


# ----------------------------------------------------------------------------- schedules
def schedule_matmul(dag, TI=ROWS, TJ=VECTORS * LANES):
    """TI x TJ register tile (AVX2: 6 x 16, 12 accumulators + 2 B vectors + 1 broadcast of A)."""
    sch = tc.Schedule(dag)
    b = sch.get_block("matmul")
    # B -> [N/TJ][K][TJ]: the TJ columns a tile needs are one contiguous panel, streamed along k.
    sch.transform_layout(b, ("read", 1), lambda kk, jj: (jj // TJ, kk, jj % TJ))
    c = sch.cache_write(b, 0, "local")
    ci, cj = sch.get_loops(c)
    ci0, ci1 = sch.split(ci, [None, TI])
    cj0, cj1 = sch.split(cj, [None, TJ])
    sch.reorder(cj0, ci0, ci1, cj1)
    f0 = sch.fuse(cj0, ci0)  # one parallel loop, a B panel's row tiles together: a core reads its panels once
    sch.parallel(f0)
    sch.vectorize(cj1)
    sch.compute_at(b, f0)
    i, j, kk = sch.get_loops(b)[-3:]
    sch.reorder(kk, i, j)  # k outermost in the tile: per k, TI broadcasts x TJ/8 FMAs
    sch.unroll(i)
    sch.vectorize(j)
    return sch


def schedule_conv_nhwc(dag, TW=ROWS, TK=VECTORS * LANES):
    """Implicit GEMM: (H*W) x K output, reduction over (ry, rx, C); TW (w) x TK (k) tile (AVX2: 6 x 16)."""
    sch = tc.Schedule(dag)
    conv, pad = sch.get_block("conv"), sch.get_block("pad")
    # HWIO kernel -> [K/TK][ry][rx][C][TK]: per reduction step one contiguous TK-wide row.
    sch.transform_layout(conv, ("read", 1), lambda ry, rx, ch, o: (o // TK, ry, rx, ch, o % TK))
    # Pad at root, in parallel: a ~0.9 MB copy, cheaper than an if_then_else in the FMA loop.
    pb, py, px, pc = sch.get_loops(pad)
    sch.parallel(sch.fuse(pb, py))
    sch.vectorize(pc)
    out = sch.cache_write(conv, 0, "local")
    n, y, x, o = sch.get_loops(out)
    x0, x1 = sch.split(x, [None, TW])  # 56 = 9*6 + 2: the last tile is guarded/clamped
    o0, o1 = sch.split(o, [None, TK])
    sch.reorder(o0, n, y, x0, x1, o1)
    f0 = sch.fuse(o0, n, y, x0)  # all tiles in parallel, a weight panel's together
    sch.parallel(f0)
    sch.vectorize(o1)
    sch.compute_at(conv, f0)
    loops = sch.get_loops(conv)
    _, _, xi, oi, ry, rx, rc = loops[-7:]
    sch.reorder(ry, rx, rc, xi, oi)  # reduction outside the 6 (unrolled) x 16 (vectorized) tile
    sch.unroll(xi)
    sch.vectorize(oi)
    return sch


def schedule_conv_nchw(dag, TK=6, TY=2, TX=LANES, PK=16):
    """Output channels x rows x columns = 6 x 2 x one vector: 12 accumulators, vectors along
    ow (unit stride in NCHW), weights broadcast from a kernel packed to [K/16][C][ry][rx][16]
    (PK must divide K: a padded pack hits a package bug, see the report)."""
    sch = tc.Schedule(dag)
    conv, pad = sch.get_block("conv"), sch.get_block("pad")
    sch.transform_layout(conv, ("read", 1), lambda o, ch, ry, rx: (o // PK, ch, ry, rx, o % PK))
    pb, pc, py, px = sch.get_loops(pad)
    sch.parallel(sch.fuse(pb, pc))
    sch.vectorize(px)
    out = sch.cache_write(conv, 0, "local")
    n, o, y, x = sch.get_loops(out)
    o0, o1 = sch.split(o, [None, TK])  # 64 = 10*6 + 4: last tile clamped
    y0, y1 = sch.split(y, [None, TY])
    x0, x1 = sch.split(x, [None, TX])  # 56 = 7*8 exactly; 3*16 + 8 on AVX-512, the last tile guarded
    # Spatial tiles outside, channel blocks inside: the input window of a tile stays in
    # L1/L2 while all output-channel blocks use it; the whole packed kernel (147 KB) stays in L2.
    sch.reorder(n, y0, x0, o0, o1, y1, x1)
    f0 = sch.fuse(n, y0, x0, o0)
    sch.parallel(f0)
    sch.vectorize(x1)
    sch.compute_at(conv, f0)
    oi, yi, xi, rc, ry, rx = sch.get_loops(conv)[-6:]
    sch.reorder(rc, ry, rx, oi, yi, xi)  # per (c, ry, rx): 2 row vectors, 6 weight broadcasts, 12 FMAs
    sch.unroll(oi)
    sch.unroll(yi)
    sch.vectorize(xi)
    return sch


def schedule_dense(dag, TJ=40):
    """Matrix-vector, memory bound: W packed to [1000/40][2048][40], 40 columns of independent
    accumulators per tile (hides FMA latency), 25 tiles in parallel. No width of whole
    16-lane vectors divides 1000: 5 x 16 left a guarded last tile and ran at half the speed."""
    sch = tc.Schedule(dag)
    d = sch.get_block("dense")
    sch.transform_layout(d, ("read", 1), lambda j, kk: (j // TJ, kk, j % TJ))
    out = sch.cache_write(d, 0, "local")
    b, j = sch.get_loops(out)
    j0, j1 = sch.split(j, [None, TJ])
    f0 = sch.fuse(b, j0)
    sch.parallel(f0)
    sch.vectorize(j1)
    sch.compute_at(d, f0)
    _, ji, kk = sch.get_loops(d)[-3:]
    sch.reorder(kk, ji)
    sch.vectorize(ji)
    return sch


# ----------------------------------------------------------------------------- baselines
SETTLE_SECS = 0.3
"""Pause before each system is timed: the previous one's threads spin after their last call
(PyTorch's OpenMP for 200 ms by default) and would take a core from the next. Without it, on
2 cores, a kernel timed right after NumPy ran at half its speed."""

def time_fn(fn, repeat, min_ms):
    """Median over `repeat` runs of the mean time of a batch lasting >= min_ms (as time_evaluator)."""
    fn()
    results, number = [], 1
    for _ in range(repeat):
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            dt = time.perf_counter() - t0
            if dt * 1e3 >= min_ms:
                break
            number = max(number * 2, int(min_ms / max(dt * 1e3 / number, 1e-6)) + 1)
        results.append(dt / number)
    return statistics.median(results)


def im2col_nchw(x, r=3, pad=1):
    """x[1,C,H,W] -> cols[C*r*r, H*W] (rows ordered (c, ry, rx), matching W.reshape(K, -1))."""
    xp = np.pad(x[0], ((0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(1, 2))  # [C, H, W, r, r]
    c, h, w = win.shape[:3]
    return win.transpose(0, 3, 4, 1, 2).reshape(c * r * r, h * w)


def im2col_nhwc(x, r=3, pad=1):
    """x[1,H,W,C] -> cols[H*W, r*r*C] (columns ordered (ry, rx, c), matching HWIO W.reshape(-1, K))."""
    xp = np.pad(x[0], ((pad, pad), (pad, pad), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (r, r), axis=(0, 1))  # [H, W, C, r, r]
    h, w, c = win.shape[:3]
    return win.transpose(0, 1, 3, 4, 2).reshape(h * w, r * r * c)


def workloads():
    """name -> (dag, schedule fn, numpy fn(inputs), torch fn(inputs) or None, reference fn or None)"""
    def mm(n):
        return (matmul_dag(n, n, n), schedule_matmul, lambda a, b: a @ b,
                (lambda a, b: torch.matmul(a, b)), lambda a, b: a @ b)

    def nchw_np(x, w):
        return (w.reshape(w.shape[0], -1) @ im2col_nchw(x)).reshape(1, w.shape[0], x.shape[2], x.shape[3])

    def nhwc_np(x, w):
        return (im2col_nhwc(x) @ w.reshape(-1, w.shape[3])).reshape(1, x.shape[1], x.shape[2], w.shape[3])

    return {
        "matmul_1024": mm(1024),
        "matmul_512": mm(512),
        "conv2d_nchw_r50": (conv_nchw_dag(), schedule_conv_nchw, nchw_np,
                            lambda x, w: F.conv2d(x, w, padding=1), None),
        "conv2d_nhwc_r50": (conv_nhwc_dag(), schedule_conv_nhwc, nhwc_np,
                            # torch has no NHWC conv entry: channels_last memory format is its analogue
                            lambda x, w: F.conv2d(x, w, padding=1), None),
        "dense_1x2048x1000": (dense_dag(), schedule_dense, lambda x, w: x @ w.T,
                              lambda x, w: F.linear(x, w), lambda x, w: x @ w.T),
    }


def torch_inputs(name, inputs):
    ts = [torch.from_numpy(a) for a in inputs]
    if name == "conv2d_nhwc_r50":  # NHWC data, HWIO kernel -> torch's channels_last conv
        x = ts[0].permute(0, 3, 1, 2)  # a channels_last view, no copy
        w = ts[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        return [x, w]
    return ts


# ----------------------------------------------------------------------------- main
def run_workload(name, entry, repeat, min_ms):
    dag, schedule, np_fn, torch_fn, ref_fn = entry
    inputs = dag.random_inputs()
    sch = schedule(dag)
    f = tc.build(sch, TARGET)
    out = f(*inputs)
    expect = ref_fn(*inputs) if ref_fn else np_fn(*inputs)
    ok = bool(np.allclose(out, expect, rtol=1e-3, atol=1e-3))
    if name.startswith("conv2d"):  # also the te reference, and our im2col against it
        te_ref = dag.evaluate_numpy(inputs)[0]
        ok = ok and bool(np.allclose(out, te_ref, rtol=1e-3, atol=1e-3))
        ok = ok and bool(np.allclose(np_fn(*inputs), te_ref, rtol=1e-3, atol=1e-3))
    if name.startswith("dense"):
        ok = ok and bool(np.allclose(out, dag.evaluate_numpy(inputs)[0], rtol=1e-3, atol=1e-3))
    # dag.flop_count() also counts the conv's index additions (y + ry, x + rx), doubling it;
    # report the conventional 2 * multiply-accumulates for conv.
    flops = 2 * 56 * 56 * 64 * 64 * 3 * 3 if name.startswith("conv2d") else dag.flop_count()
    time.sleep(SETTLE_SECS)
    t_tc = f.time_evaluator(number=3, repeat=repeat, min_repeat_ms=min_ms)(*inputs, out).median
    time.sleep(SETTLE_SECS)
    t_np = time_fn(lambda: np_fn(*inputs), repeat, min_ms)
    t_torch = None
    if torch is not None:
        targs = torch_inputs(name, inputs)
        time.sleep(SETTLE_SECS)
        with torch.no_grad():
            t_torch = time_fn(lambda: torch_fn(*targs), repeat, min_ms)
    return {"workload": name, "correct": ok, "gflop": flops / 1e9,
            "tilecraft_ms": t_tc * 1e3, "numpy_ms": t_np * 1e3, "torch_ms": t_torch and t_torch * 1e3,
            "tilecraft_gflops": flops / t_tc / 1e9, "numpy_gflops": flops / t_np / 1e9,
            "torch_gflops": t_torch and flops / t_torch / 1e9, "ratio_vs_numpy": t_np / t_tc,
            "trace": sch.trace.to_python()}


def compile_overheads(runs, compiles):
    """Python-side lower+codegen, and one gcc compile (fresh cache dir: never a cache hit)."""
    sch = schedule_matmul(matmul_dag(1024, 1024, 1024))
    lower_ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        source = generate_c(tc.lower(sch), TARGET)
        lower_ms.append((time.perf_counter() - t0) * 1e3)
    compile_ms = []
    for _ in range(compiles):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            compile_c(source, TARGET, cache_dir=Path(tmp))
            compile_ms.append((time.perf_counter() - t0) * 1e3)
    return {"lower_codegen_ms_median": statistics.median(lower_ms), "lower_codegen_runs": runs,
            "compile_ms_median": statistics.median(compile_ms), "compile_runs": compiles}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hand_schedules.json"))
    args = parser.parse_args()
    repeat, min_ms = (3, 50) if args.quick else (7, 300)

    rows = []
    for name, entry in workloads().items():
        row = run_workload(name, entry, repeat, min_ms)
        rows.append(row)
        print(f"  {name}: done ({'ok' if row['correct'] else 'WRONG RESULT'})", flush=True)

    table = numeric_table("workload", "tilecraft", "NumPy", "PyTorch", "tc/NumPy", caption="GFLOPS")
    for r in rows:
        table.add_row(r["workload"] + ("" if r["correct"] else "  WRONG"), f"{r['tilecraft_gflops']:.1f}",
                      f"{r['numpy_gflops']:.1f}", "-" if r["torch_gflops"] is None else f"{r['torch_gflops']:.1f}",
                      f"{r['ratio_vs_numpy']:.2f}x")
    print()
    print_table(table)
    if torch is None:
        print("(PyTorch not installed: skipped)")

    overheads = compile_overheads(runs=5 if args.quick else 20, compiles=2 if args.quick else 5)
    print(f"\nmatmul_1024: lower + codegen {overheads['lower_codegen_ms_median']:.1f} ms (median), "
          f"one gcc compile {overheads['compile_ms_median']:.0f} ms (median)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "target": str(TARGET),
                    "numpy": np.__version__, "torch": torch.__version__ if torch else None},
        "quick": args.quick, "repeat": repeat, "min_repeat_ms": min_ms,
        "workloads": rows, "overheads": overheads}, indent=2))
    print(f"wrote {args.out}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
