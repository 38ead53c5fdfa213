"""winograd_convolutions: which convolutions it rewrites, and that the graph computes the same."""

import dataclasses

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database.record import TuningRecord
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.fuse import partition, subgraph_dag
from tilecraft.graph.layout import convert_layout
from tilecraft.graph.reference import run_reference
from tilecraft.graph.winograd import winograd_convolutions
from tilecraft.model.compiled import DefaultScheduleWarning
from tilecraft.model.tasks import prepare_graph


def block(size=8, channels=64, filters=128, stride=1, kernel=3, dilation=1):
    """conv + bias + ReLU, then a second 3x3 convolution with a residual add: NCHW, as imported."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add_input("input", (1, channels, size, size), "float32")
    w1 = b.add_constant("w1", rng.standard_normal((filters, channels, kernel, kernel)).astype("float32") / 20)
    w2 = b.add_constant("w2", rng.standard_normal((filters, filters, 3, 3)).astype("float32") / 30)
    bias = b.add_constant("bias", rng.standard_normal((filters, 1, 1)).astype("float32"))
    y = b.emit("conv2d", [x, w1], {"stride": stride, "padding": kernel // 2 * dilation, "dilation": dilation}, "c1")
    y = b.emit("relu", [b.emit("add", [y, bias], {}, "bias1")], {}, "relu1")
    z = b.emit("conv2d", [y, w2], {"stride": 1, "padding": 1}, "c2")
    return b.finish([b.emit("relu", [b.emit("add", [z, y], {}, "residual")], {}, "relu2")])


@pytest.mark.parametrize("size, points", [(8, 36), (10, 16)])
def test_3x3_convolutions_become_three_kernels_with_the_same_outputs(size, points):
    """4x4 output tiles (36 points) where 4 divides the output, 2x2 tiles (16) elsewhere."""
    graph = convert_layout(block(size))
    rewritten = winograd_convolutions(graph)
    ops = [n.op for n in rewritten.nodes]
    assert "conv2d_nhwc" not in ops and ops.count("winograd_matmul") == 2
    products = [rewritten.values[n.output].shape for n in rewritten.nodes if n.op == "winograd_matmul"]
    assert {shape[0] for shape in products} == {points}
    x = np.random.default_rng(1).standard_normal((1, 64, size, size)).astype("float32")
    want = run_reference(graph, {"input": x})[graph.outputs[0]]
    got = run_reference(rewritten, {"input": x})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    groups = [part.ops for part in partition(rewritten)]
    assert groups.count("winograd_output+add+relu") == 2  # bias or residual, and ReLU, fused as into the conv


@pytest.mark.parametrize("kwargs", [{"stride": 2, "size": 16}, {"kernel": 1}, {"dilation": 2, "size": 12},
                                    {"size": 7}, {"channels": 32}, {"filters": 64, "size": 10}])
def test_convolutions_where_winograd_does_not_pay_stay_direct(kwargs):
    """Strided, 1x1 and dilated convolutions; outputs under 8x8 (weights outweigh pixels);
    fewer than 64 channels in, or 64 x 64 with 2x2 tiles (moving the transformed tiles costs
    more than the products save)."""
    graph = convert_layout(block(**kwargs))
    first = [n.op for n in winograd_convolutions(graph).nodes if n.name.startswith("c1") and n.op != "transpose"]
    assert first == ["conv2d_nhwc"]


def test_64_by_64_channels_take_4x4_tiles_where_4_divides_the_output():
    graph = convert_layout(block(size=8, filters=64))
    first = [n for n in winograd_convolutions(graph).nodes if n.name.startswith("c1") and n.op != "transpose"]
    assert [n.op for n in first] == ["winograd_input", "winograd_matmul", "winograd_output"]
    assert first[0].attrs["m"] == 4


@pytest.mark.slow
def test_a_cpu_model_is_compiled_with_winograd_and_a_gpu_task_list_is_not(kernel_cache, tmp_path):
    """Compiled, then saved and loaded (the transformed weights are the saved model's constants)."""
    graph = block()
    cpu_tasks, _ = tc.extract_tasks(graph, "llvm")
    gpu_tasks, _ = tc.extract_tasks(graph, "cuda -arch=sm_90")
    assert any("winograd_matmul" in t.desc for t in cpu_tasks)
    assert not any("winograd" in t.desc for t in gpu_tasks)
    with pytest.warns(DefaultScheduleWarning, match="winograd_matmul"):  # untuned, and said so
        model = tc.compile_model(graph, "llvm", cache_dir=kernel_cache)
    x = np.random.default_rng(2).standard_normal((1, 64, 8, 8)).astype("float32")
    want = run_reference(graph, {"input": x})[graph.outputs[0]]
    model.save(tmp_path / "saved")
    for compiled in (model, tc.load_model(tmp_path / "saved")):
        np.testing.assert_allclose(compiled(input=x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def record(key, seconds):
    return TuningRecord(key, None, "llvm", "[]", (seconds,), "none", "", 0.0, 0.0, 1.0, None)


@pytest.mark.parametrize("direct, stages, expected", [
    (None, None, "winograd"),  # no log: by the rule
    (1e-3, None, "direct"),  # a log tuned before the rewrite keeps its kernel
    (1e-3, (2e-4, 2e-4, None), "direct"),  # and so does one that lacks one of the three
    (1e-3, (2e-4, 5e-4, 2e-4), "winograd"),  # the three together faster
    (1e-3, (2e-4, 7e-4, 2e-4), "direct"),  # slower
    (None, (2e-4, 7e-4, 2e-4), "winograd")])
def test_the_log_chooses_between_the_direct_kernel_and_winograd(direct, stages, expected):
    """The first convolution (64 -> 128 channels, 10x10) by the records of its kernels."""
    graph = convert_layout(block(10))
    rewritten = winograd_convolutions(graph)
    c1 = next(n for n in graph.nodes if n.op == "conv2d_nhwc" and n.name.startswith("c1"))
    kernels = {n.op: part for part in partition(rewritten) for n in part.nodes if n.op.startswith("winograd")
               and n.inputs[0] in (c1.inputs[0], f"{c1.output}_tiles", f"{c1.output}_products")}
    best = {}
    if direct is not None:
        part = next(part for part in partition(graph) if c1 in part.nodes)
        best[subgraph_dag(graph, part).workload_key] = record(subgraph_dag(graph, part).workload_key, direct)
    for op, seconds in zip(("winograd_input", "winograd_matmul", "winograd_output"), stages or ()):
        if seconds is not None:
            key = subgraph_dag(rewritten, kernels[op]).workload_key
            best[key] = record(key, seconds)
    prepared = prepare_graph(block(10), None, tc.Target("llvm"), best)
    ops = [n.op for n in prepared.nodes if n.name.startswith("c1") and n.op != "transpose"]
    assert ops == (["conv2d_nhwc"] if expected == "direct" else ["winograd_input", "winograd_matmul",
                                                                  "winograd_output"])


@pytest.mark.slow
def test_times_in_a_model_do_not_choose_between_the_direct_kernel_and_winograd(kernel_cache, tmp_path):
    """A model computes a convolution one way, so only that way's kernels have times in a model,
    and slower than alone: the choice compares the kernels' times alone. Here Winograd's three
    (0.9 ms alone, 1.7 ms in a model) against the direct kernel (1 ms alone)."""
    target = tc.Target("llvm")
    graph = convert_layout(block(10))
    rewritten = winograd_convolutions(graph)
    c1 = next(n for n in graph.nodes if n.op == "conv2d_nhwc" and n.name.startswith("c1"))
    stages = {n.op: part for part in partition(rewritten) for n in part.nodes if n.op.startswith("winograd")
              and n.inputs[0] in (c1.inputs[0], f"{c1.output}_tiles", f"{c1.output}_products")}
    direct = subgraph_dag(graph, next(part for part in partition(graph) if c1 in part.nodes)).workload_key
    records, keys = [dataclasses.replace(record(direct, 1e-3), phase="final", target=str(target))], set()
    for op, alone, in_model in (("winograd_input", 2e-4, 4e-4), ("winograd_matmul", 5e-4, 9e-4),
                                ("winograd_output", 2e-4, 4e-4)):
        key = subgraph_dag(rewritten, stages[op]).workload_key
        keys.add(key)
        records += [dataclasses.replace(record(key, alone), phase="final", target=str(target)),
                    dataclasses.replace(record(key, in_model), phase="model", target=str(target), timestamp=5.0)]
    log = tmp_path / "log.json"
    log.write_text("".join(r.to_json_line() + "\n" for r in records))
    with pytest.warns(DefaultScheduleWarning):
        model = tc.compile_model(block(10), target, log=log, cache_dir=kernel_cache)
    assert keys <= {kernel.workload_key for kernel in model.kernels} and direct not in {
        kernel.workload_key for kernel in model.kernels}
