"""rfactor: a reduction factored over one of its loops computes what NumPy computes, for
sum, max and min, guarded tails, fused reduction axes, and the new axis run in parallel
or as vector lanes; the step round-trips through traces; misuse is refused by name."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.tune.task import WORKLOADS


def _check(sch, dag, kernel_cache, seed=0):
    inputs = dag.random_inputs(np.random.default_rng(seed))
    outputs = tc.build(sch, cache_dir=kernel_cache)(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for got, want in zip(outputs, dag.evaluate_numpy(inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _row_reduction(combiner, rows=8, columns=100, dtype="float32", where=False):
    A = te.placeholder((rows, columns), name="A", dtype=dtype)
    k = te.reduce_axis((0, columns), name="k")
    condition = (lambda i: (k + i) % 3 != 0) if where else (lambda i: None)
    B = te.compute((rows,), lambda i: combiner(A[i, k], axis=k, where=condition(i)), name="B")
    return tc.ComputeDAG([A, B])


def _factor(dag, block, factor, which, factor_axis=0):
    """Split the block's only reduction loop by ``factor`` and factor piece ``which``."""
    sch = tc.Schedule(dag)
    reduction = sch.get_loops(sch.get_block(block))[-1]
    pieces = sch.split(reduction, [None, factor])
    rf = sch.rfactor(pieces[which], factor_axis)
    return sch, rf, pieces


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("combiner", [te.sum, te.max, te.min])
def test_row_reduction_with_a_guarded_tail_matches_numpy(combiner, which, kernel_cache):
    # 100 columns split by 16: the last tile's 12 extra iterations must add the identity
    dag = _row_reduction(combiner, where=True)
    sch, rf, _ = _factor(dag, "B", 16, which, factor_axis=1)
    assert rf.name == "B_rf" and sch.state.stage("B_rf").tensor.shape == (8, 7 if which == 0 else 16)
    _check(sch, dag, kernel_cache)


def test_integer_max_uses_the_lowest_integer_as_identity(kernel_cache):
    dag = _row_reduction(te.max, dtype="int32", where=True)
    sch, _, _ = _factor(dag, "B", 16, 1)
    _check(sch, dag, kernel_cache)


@pytest.mark.parametrize("combiner", [te.max, te.min])
def test_bool_any_and_all_use_false_and_true_as_identity(combiner, kernel_cache):
    dag = _row_reduction(combiner, dtype="bool", where=True)
    sch, _, _ = _factor(dag, "B", 16, 1)
    _check(sch, dag, kernel_cache)


def test_the_only_reduction_loop_can_be_factored(kernel_cache):
    dag = _row_reduction(te.max, columns=20, where=True)
    sch = tc.Schedule(dag)
    i, k = sch.get_loops(sch.get_block("B"))
    sch.rfactor(k, 1)
    assert not sch.state.stage("B_rf").is_reduction  # one term per element: a select, no loop
    _check(sch, dag, kernel_cache)


def test_softmax_max_and_sum_factored(kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS["softmax"](16, 200))
    sch = tc.Schedule(dag)
    for name, which in (("softmax_max", 1), ("softmax_sum", 0)):
        k = sch.get_loops(sch.get_block(name))[-1]
        pieces = sch.split(k, [None, 8])
        sch.rfactor(pieces[which], 1)
    assert [s.name for s in sch.state.stages].count("softmax_max_rf") == 1
    _check(sch, dag, kernel_cache)


def test_layer_norm_mean_factored_and_computed_inside_its_consumer(kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS["layer_norm"](16, 96))
    sch = tc.Schedule(dag)
    k = sch.get_loops(sch.get_block("layer_norm_sum"))[-1]
    ko, ki = sch.split(k, [None, 16])
    rf = sch.rfactor(ki, 1)
    i = sch.get_loops(sch.get_block("layer_norm_sum"))[0]
    sch.compute_at(rf, i)  # the partial sums of one row, just before they are combined
    _check(sch, dag, kernel_cache)


def test_full_reduction_runs_its_partial_sums_in_parallel(kernel_cache):
    A = te.placeholder((4096,), name="A")
    k = te.reduce_axis((0, 4096), name="k")
    B = te.compute((1,), lambda i: te.sum(A[k], axis=k), name="B")
    dag = tc.ComputeDAG([A, B])
    sch, rf, (ko, ki) = _factor(dag, "B", 64, 0)
    i = sch.get_loops(rf)[0]
    sch.reorder(ko, i)
    sch.parallel(ko)
    assert "parallel" in tc.build(sch, cache_dir=kernel_cache).source
    _check(sch, dag, kernel_cache)


def test_small_matmul_with_long_k_vectorizes_the_new_innermost_axis(kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS["matmul"](4, 4096, 4))
    sch, rf, (ko, ki) = _factor(dag, "matmul", 16, 1, factor_axis=2)
    assert sch.state.stage("matmul_rf").tensor.shape == (4, 4, 16)
    assert [l.id for l in sch.get_loops(rf)][-1] == ki.id  # the loop handle is still valid
    sch.vectorize(ki)
    _check(sch, dag, kernel_cache)


def test_fused_reduction_axes_split_unevenly(kernel_cache):
    A = te.placeholder((4, 30, 50), name="A")
    r = te.reduce_axis((0, 30), name="r")
    s = te.reduce_axis((0, 50), name="s")
    B = te.compute((4,), lambda i: te.max(A[i, r, s], axis=[r, s]), name="B")
    dag = tc.ComputeDAG([A, B])
    for which in (0, 1):
        sch = tc.Schedule(dag)
        i, r_loop, s_loop = sch.get_loops(sch.get_block("B"))
        pieces = sch.split(sch.fuse(r_loop, s_loop), [None, 64])  # 1500 = 23 * 64 + 28
        sch.rfactor(pieces[which], 0)
        _check(sch, dag, kernel_cache)


def test_trace_round_trips_through_json_python_and_replay(kernel_cache):
    dag = tc.ComputeDAG(WORKLOADS["matmul"](4, 256, 4))
    sch = tc.Schedule(dag, seed=3)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    ko, ki = sch.split(k, sch.sample_perfect_tile(k, 2, 16))
    rf = sch.rfactor(ko, 0)
    sch.parallel(sch.get_loops(rf)[0])
    text = sch.trace.dumps()
    assert '"kind":"rfactor"' in text
    again = tc.Trace.from_json(text).replay(dag)
    assert again.trace.dumps() == text and str(tc.lower(again)) == str(tc.lower(sch))
    namespace = {}
    exec(sch.trace.to_python(), namespace)
    fresh = tc.Schedule(dag)
    namespace["apply_trace"](fresh)
    assert "sch.rfactor(loop=l" in sch.trace.to_python() and str(tc.lower(fresh)) == str(tc.lower(sch))
    step = next(n for n, s in enumerate(sch.trace.steps) if s.is_sampling)
    other = sch.trace.replay(dag, decisions={step: (256 // 8, 8)})
    assert other.state.stage("matmul_rf").tensor.shape == (32, 4, 4)
    _check(other, dag, kernel_cache)


def _refused(sch, call, pattern):
    before = sch.state
    with pytest.raises(tc.ScheduleError, match=pattern):
        call()
    assert sch.state is before


def test_misuse_is_refused_with_the_reason():
    dag = tc.ComputeDAG(WORKLOADS["softmax"](4, 32))
    sch = tc.Schedule(dag)
    i, k = sch.get_loops(sch.get_block("softmax_sum"))
    _refused(sch, lambda: sch.rfactor(i), r"loop ax0 of block softmax_sum: it is a spatial loop")
    exp_loops = sch.get_loops(sch.get_block("softmax_exp"))
    _refused(sch, lambda: sch.rfactor(exp_loops[1]), r"block softmax_exp: the block is not a reduction")
    _refused(sch, lambda: sch.rfactor(k, 2), r"factor_axis must be an int in \[-2, 1\]")
    ko, ki = sch.split(k, [None, 8])
    _refused(sch, lambda: sch.rfactor(k), r"no longer exists")
    sch.rfactor(ki)
    k_max = sch.get_loops(sch.get_block("softmax_max"))[-1]
    sch.compute_at(sch.get_block("softmax_max"), sch.get_loops(sch.get_block("softmax_exp"))[0])
    _refused(sch, lambda: sch.rfactor(k_max), r"computed at a loop of block softmax_exp; apply rfactor before")


def test_decomposed_and_already_factored_blocks_are_refused():
    dag = _row_reduction(te.sum)
    sch = tc.Schedule(dag)
    i, k = sch.get_loops(sch.get_block("B"))
    ko, ki = sch.split(k, [None, 4])
    sch.decompose_reduction(sch.get_block("B"), ko)
    _refused(sch, lambda: sch.rfactor(ki), r"decomposed; apply rfactor before decompose_reduction")
    sch = tc.Schedule(dag)
    i, k = sch.get_loops(sch.get_block("B"))
    ko, ki = sch.split(k, [None, 4])
    sch.rfactor(ki)
    k_v = sch.get_loops(sch.get_block("B"))[-1]
    _refused(sch, lambda: sch.rfactor(k_v), r"a block named B_rf already exists")
