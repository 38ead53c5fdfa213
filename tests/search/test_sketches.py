"""Golden sketches: the structures the sketch rules derive for the classic workloads.

A change to the rules shows up here as a diff of readable schedule code; after checking
it is intended, regenerate with ``TILECRAFT_UPDATE_GOLDEN=1 python -m pytest tests/search``.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import ops, te
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS

GOLDEN = Path(__file__).parent / "golden"
TARGET = tc.Target("llvm -mcpu=core-avx2 -num-cores=4")  # rules that count cores see the same machine anywhere


def _two_reductions(last: str, first: str) -> list[str]:
    """Each reduction kept or factored at its outer or inner piece (the last stage is visited first)."""
    pieces = [f"rfactor_{piece}" for piece in ("outer", "inner")]
    names = ["default"] + [f"{p}({first})" for p in pieces]
    for q in pieces:
        names += [f"{q}({last})"] + [f"{q}({last}) {p}({first})" for p in pieces]
    return names


CASES = {
    "matmul": ("matmul", (64, 64, 64), ["tile", "cache_write fuse1", "cache_write fuse2"]),
    "matmul_add": ("matmul_add", (64, 64, 64), ["tile", "fuse1", "fuse2"]),
    "conv2d_bias_relu": ("conv2d", (1, 16, 14, 14, 32, 3, 3, 1, 1),
                         ["inline(bias_add) tile", "inline(bias_add) fuse1", "inline(bias_add) fuse2"]),
    "softmax": ("softmax", (128, 768), _two_reductions("softmax_sum", "softmax_max")),
    "layer_norm": ("layer_norm", (128, 768), _two_reductions("layer_norm_sqsum", "layer_norm_sum")),
    "matmul_long_k": ("matmul", (4, 4096, 4), ["tile", "cache_write fuse1", "cache_write fuse2",
                                                "rfactor_outer(matmul)", "rfactor_inner(matmul)"]),
}


def sketch_text(workload: str, args: tuple) -> tuple[list[str], str]:
    dag = tc.ComputeDAG(WORKLOADS[workload](*args))
    sketches = generate_sketches(dag, target=TARGET)
    text = "\n\n".join(f"# sketch: {s.name}\n{s.trace.to_python()}" for s in sketches)
    return [s.name for s in sketches], text + "\n"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_sketches(case):
    workload, args, names = CASES[case]
    got_names, text = sketch_text(workload, args)
    assert got_names == names
    path = GOLDEN / f"{case}.py.txt"
    if os.environ.get("TILECRAFT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"the sketches of {case} changed; see {path}"


def test_sketch_generation_is_deterministic():
    assert sketch_text("matmul_add", (64, 64, 64)) == sketch_text("matmul_add", (64, 64, 64))


@pytest.mark.parametrize("relu, names", [
    (True, ["inline(add) tile", "inline(add) fuse1", "inline(add) fuse2"]),
    (False, ["tile", "fuse1", "fuse2"]),
])
def test_onnx_style_bias_fuses_into_the_conv(relu, names):
    """A bias broadcast from shape (1, 1, 1, F), as ONNX graphs add it, is an element-wise
    consumer the conv fuses into, and an element-wise op is never tiled on its own."""
    data, kernel = te.placeholder((1, 14, 14, 16), name="data"), te.placeholder((1, 1, 16, 32), name="kernel")
    bias = te.placeholder((1, 1, 1, 32), name="bias")
    out = ops.add(ops.conv2d_nhwc(data, kernel), bias, name="add")
    dag = tc.ComputeDAG([data, kernel, bias, ops.relu(out) if relu else out])
    assert [s.name for s in generate_sketches(dag, target=TARGET)] == names


def test_matmul_sketch_structure():
    """Ansor's CPU structure: SSRSRS tiling, a cache stage fused at tile level 1 or 2,
    the weight packed in the order the tiles read it, parallel/vector/unroll decisions."""
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))
    fuse2 = generate_sketches(dag)[2]
    kinds = [step.kind for step in fuse2.trace.steps]
    assert kinds.count("sample_tile") == 2 and kinds.count("sample_perfect_tile") == 1  # spatial may pad
    assert "cache_write" in kinds and "rewrite_layout" in kinds
    assert [slot.role for slot in fuse2.slots] == ["tile", "tile", "tile", "unroll", "parallel"]
    assert [len(slot.domain[0]) for slot in fuse2.slots[:3]] == [4, 4, 2]


@pytest.mark.parametrize("workload, args, cores, factored", [
    ("softmax", (128, 64), 4, True),  # 64 elements to reduce per row, more than the cores
    ("softmax", (128, 64), 128, False),
    ("softmax", (128, 8), 4, False),  # too short for partial sums or vector lanes to pay
    ("matmul", (8, 512, 8), 4, True),  # 64 outputs: fewer than the reduction and than 16 per core
    ("matmul", (8, 512, 8), 2, False),  # more than 16 outputs per core: enough parallelism
    ("matmul", (32, 16, 32), 64, False),  # more outputs than reduction steps
])
def test_rfactor_only_where_a_reduction_lacks_spatial_parallelism(workload, args, cores, factored):
    dag = tc.ComputeDAG(WORKLOADS[workload](*args))
    names = [s.name for s in generate_sketches(dag, target=tc.Target(f"llvm -mcpu=core-avx2 -num-cores={cores}"))]
    assert any("rfactor" in name for name in names) == factored


def test_a_pool_over_nhwc_reduces_its_window_outside_vector_lanes_over_the_channels(kernel_cache):
    import numpy as np

    from tilecraft.search.default import default_schedule

    x = te.placeholder((1, 9, 9, 32), name="x")
    dag = tc.ComputeDAG([x, ops.max_pool2d(x, 3, 2, padding=1, layout="NHWC")])
    assert [s.name for s in generate_sketches(dag, target=TARGET)] == ["window_outside_lanes(max_pool2d)"]
    sch = default_schedule(dag, tc.Target.host())
    stage = sch.state.stage("max_pool2d")
    kinds = [stage.loop(leaf).kind for leaf in stage.leaves]
    assert kinds[-1] == "spatial" and kinds[-3:-1] == ["reduce", "reduce"]  # the window, then the channels
    assert "max_pool2d_pad" not in [s.name for s in sch.state.stages]  # the padding inlined
    data = np.random.default_rng(0).standard_normal((1, 9, 9, 32)).astype("float32")
    np.testing.assert_allclose(tc.build(sch, tc.Target.host(), cache_dir=kernel_cache)(data),
                               dag.evaluate_numpy([data])[0], rtol=1e-6)
    nchw = te.placeholder((1, 32, 9, 9), name="nchw")  # the window runs along W, the innermost axis
    assert "window_outside_lanes" not in [s.name for s in generate_sketches(
        tc.ComputeDAG([nchw, ops.max_pool2d(nchw, 3, 2, padding=1)]), target=TARGET)][0]


def test_a_transpose_back_to_nchw_walks_its_input_a_cache_line_at_a_time(kernel_cache):
    import numpy as np

    from tilecraft.search.default import default_schedule

    x = te.placeholder((1, 6, 8, 32), name="x")
    dag = tc.ComputeDAG([x, ops.transpose(x, (0, 3, 1, 2))])  # NHWC -> NCHW: read along C, written along W
    assert [s.name for s in generate_sketches(dag, target=TARGET)] == ["tile_transpose(transpose)"]
    sch = default_schedule(dag, tc.Target.host())
    stage = sch.state.stage("transpose")
    assert [stage.loop(leaf).extent for leaf in stage.leaves][-2:] == [16, 8]  # a line of C, then the vector of W
    data = np.random.default_rng(0).standard_normal((1, 6, 8, 32)).astype("float32")
    np.testing.assert_array_equal(tc.build(sch, tc.Target.host(), cache_dir=kernel_cache)(data),
                                  data.transpose(0, 3, 1, 2))
    untouched = {"read along the vector loop": ((1, 6, 8, 32), (0, 2, 1, 3)),
                 "NCHW -> NHWC, read along the loop just outside the vector loop": ((1, 32, 6, 8), (0, 2, 3, 1)),
                 "channels that are not whole lines": ((1, 6, 8, 12), (0, 3, 1, 2))}
    for why, (shape, axes) in untouched.items():
        y = te.placeholder(shape, name="y")
        names = [s.name for s in generate_sketches(tc.ComputeDAG([y, ops.transpose(y, axes)]), target=TARGET)]
        assert names == ["default"], why


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
def test_a_16_bit_sum_always_accumulates_in_a_local_float32_buffer(dtype):
    """Tiled in its output, its loops inside the reduction, a 16-bit sum would round at every
    step (a bfloat16 matmul 1024³ so gave 49 wrong answers in 200 trials): every sketch
    caches it, and every random candidate matches NumPy, its sum rounded once."""
    dag = tc.ComputeDAG(WORKLOADS["matmul"](64, 256, 48, dtype))
    sketches = generate_sketches(dag, target=TARGET)
    assert [s.name for s in sketches] == ["cache_write fuse1", "cache_write fuse2"]
    inputs = dag.random_inputs(np.random.default_rng(0))
    want = dag.evaluate_numpy(inputs)[0].astype(np.float32)
    for sketch in sketches:
        for row in sketch.sample(np.random.default_rng(1), 3, TARGET.num_cores):
            got = tc.build(sketch.trace_of(row).replay(dag), TARGET)(*inputs)
            np.testing.assert_allclose(got.astype(np.float32), want, rtol=8e-3, atol=8e-2)
