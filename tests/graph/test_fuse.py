"""Fusion: which nodes share a kernel, subgraphs in a runnable order, and equal workload keys for equal blocks."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.graph import run_reference
from tilecraft.graph.builder import GraphBuilder
from tilecraft.graph.fuse import partition, subgraph_dag
from tilecraft.graph.layout import convert_layout


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def conv_block(g, x, rng, name, channels=8):
    """conv + bias + relu, weights drawn from ``rng``."""
    k = g.add_constant(f"{name}_k", rng.standard_normal((channels, channels, 3, 3)).astype("float32"))
    b = g.add_constant(f"{name}_b", rng.standard_normal((channels, 1, 1)).astype("float32"))
    y = g.emit("conv2d", [x, k], {"padding": 1}, f"{name}_conv")
    return g.emit("relu", [g.emit("add", [y, b], {}, f"{name}_bias")], {}, f"{name}_relu")


def assert_runnable_partition(graph, subgraphs):
    """Every node in exactly one subgraph; each subgraph reads only inputs, constants and earlier outputs."""
    outputs = [n.output for sg in subgraphs for n in sg.nodes]
    assert sorted(outputs) == sorted(n.output for n in graph.nodes)
    available = {v.name for v in graph.inputs} | set(graph.constants)
    for sg in subgraphs:
        assert set(sg.inputs) <= available, f"{sg.ops} reads {set(sg.inputs) - available} before they exist"
        assert [n for n in graph.nodes if n in sg.nodes] == list(sg.nodes)  # graph order inside
        available |= set(sg.outputs)
    assert set(graph.outputs) <= available


def test_conv_bias_relu_is_one_subgraph(rng):
    g = GraphBuilder()
    y = conv_block(g, g.add_input("x", (1, 8, 6, 6), "float32"), rng, "block")
    graph = g.finish([y])
    (sg,) = partition(graph)
    assert sg.ops == "conv2d+add+relu" and sg.inputs == ("x", "block_k", "block_b") and sg.outputs == (y,)


def test_a_value_read_twice_ends_its_group_and_the_residual_add_joins_the_second_conv(rng):
    g = GraphBuilder()
    first = conv_block(g, g.add_input("x", (1, 8, 6, 6), "float32"), rng, "a")
    k = g.add_constant("k", rng.standard_normal((8, 8, 3, 3)).astype("float32"))
    y = g.emit("conv2d", [first, k], {"padding": 1}, "b_conv")
    y = g.emit("relu", [g.emit("add", [y, first], {}, "residual")], {}, "out", output="y")
    graph = g.finish([y])
    subgraphs = partition(graph)
    assert [sg.ops for sg in subgraphs] == ["conv2d+add+relu", "conv2d+add+relu"]
    assert subgraphs[0].outputs == (first,) and subgraphs[1].inputs == (first, "k")
    assert_runnable_partition(graph, subgraphs)


def test_a_graph_output_read_by_another_node_ends_its_group(rng):
    g = GraphBuilder()
    a = g.emit("relu", [g.add_input("x", (4, 8), "float32")], {}, "a", output="a")
    b = g.emit("sigmoid", [a], {}, "b", output="b")
    assert [sg.ops for sg in partition(g.finish([a, b]))] == ["relu", "sigmoid"]


def test_a_softmax_anchors_its_own_group_and_absorbs_what_follows(rng):
    g = GraphBuilder()
    x = g.add_input("x", (4, 8), "float32")
    w = g.add_constant("w", rng.standard_normal((8, 8)).astype("float32"))
    scores = g.emit("add", [g.emit("dense", [x, w], {}, "fc"), g.add_constant("c", np.float32(0.5))], {}, "shift")
    probs = g.emit("softmax", [scores], {"axis": 1}, "softmax")
    y = g.emit("multiply", [probs, g.add_constant("two", np.float32(2))], {}, "scale", output="y")
    assert [sg.ops for sg in partition(g.finish([y]))] == ["dense+add", "softmax+multiply"]


def test_element_wise_chains_fuse_and_a_reshape_is_a_view_of_its_own():
    g = GraphBuilder()
    x = g.add_input("x", (4, 8), "float32")
    t = g.emit("transpose", [g.emit("relu", [x], {}, "relu")], {"axes": (1, 0)}, "t")
    y = g.emit("sigmoid", [g.emit("reshape", [t], {"newshape": (32,)}, "flat")], {}, "s", output="y")
    subgraphs = partition(g.finish([y]))
    assert [(sg.ops, sg.is_view) for sg in subgraphs] == [("relu+transpose", False), ("reshape", True),
                                                          ("sigmoid", False)]


def test_a_heavy_node_absorbs_nothing_before_it(rng):
    g = GraphBuilder()
    y = conv_block(g, g.add_input("x", (1, 8, 6, 6), "float32"), rng, "block")
    graph = convert_layout(g.finish([y]))
    assert [sg.ops for sg in partition(graph)] == ["transpose", "conv2d_nhwc+add+relu", "transpose"]


def test_identical_blocks_have_one_workload_key_and_one_task_of_weight_2(rng):
    g = GraphBuilder()
    x = g.emit("relu", [g.add_input("x", (1, 8, 6, 6), "float32")], {}, "stem")
    y = conv_block(g, conv_block(g, x, rng, "first"), rng, "second")
    graph = g.finish([y])
    _, a, b = partition(graph)
    assert {n.name for n in a.nodes}.isdisjoint(n.name for n in b.nodes)
    dag_a, dag_b = subgraph_dag(graph, a), subgraph_dag(graph, b)
    assert dag_a.canonical_text() == dag_b.canonical_text() and dag_a.workload_key == dag_b.workload_key
    assert "first" not in dag_a.canonical_text() and "conv2d_0" in dag_a.canonical_text()
    tasks, weights = tc.extract_tasks(graph, "llvm -isa=avx2 -num-cores=2")  # in NHWC, with transposes at the ends
    assert [(t.desc, w) for t, w in zip(tasks, weights)] == [
        ("relu+transpose 1x6x6x8", 1), ("conv2d_nhwc+add+relu 1x6x6x8", 2), ("transpose 1x8x6x6", 1)]


def test_a_subgraph_dag_computes_what_its_nodes_compute(rng):
    g = GraphBuilder()
    y = conv_block(g, g.add_input("x", (1, 8, 6, 6), "float32"), rng, "block")
    graph = g.finish([y])
    (sg,) = partition(graph)
    dag = subgraph_dag(graph, sg)
    x = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    expected = run_reference(graph, {"x": x})[y]
    got = dag.evaluate_numpy([x, *(graph.constants[name] for name in sg.inputs[1:])])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert dag.compute_ops[-1].op.attrs == {} and any(
        op.op.attrs.get("layout_free_placeholders") == [dag.placeholders[1]] for op in dag.compute_ops)


def test_imported_models_partition_into_runnable_subgraphs():
    pytest.importorskip("onnx")
    from onnx_models import tiny_cnn, tiny_transformer

    for model in (tiny_cnn(), tiny_transformer()):
        graph = tc.frontend.from_onnx(model)
        for g in (graph, convert_layout(graph)):
            assert_runnable_partition(g, partition(g))
