"""The MetaSchedule chapter's flows: tune_tir into a work dir, compile_tir from it, a tuned
kernel inside a NumPy model. A handful of trials each."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.database import NoValidRecordError, load_records, trace_key

TARGET = "llvm --num-cores=2"


@pytest.fixture(scope="module")
def runner():
    with tc.LocalRunner(number=2, repeat=1, min_repeat_ms=0) as r:
        yield r


def matmul(n=32):
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tc.ComputeDAG([A, B, C])


def stochastic_schedule_mm(sch):
    block_C = sch.get_block("C", "main")
    i, j, k = sch.get_loops(block=block_C)
    j_factors = sch.sample_perfect_tile(loop=j, n=2, max_innermost_factor=16)
    j_0, j_1 = sch.split(loop=j, factors=j_factors)
    sch.reorder(i, j_0, k, j_1)
    sch.decompose_reduction(block_C, k)
    return sch


@pytest.mark.slow
def test_a_stochastic_schedule_is_tuned_and_compiled(tmp_path, runner, capsys):
    dag = matmul()
    database = tc.tune_tir(mod=dag, target=TARGET, max_trials_global=64, num_trials_per_iter=64,
                           space=tc.ScheduleFn(stochastic_schedule_mm), work_dir=tmp_path / "tune_tmp",
                           task_name="main", runner=runner, verbose=0)
    records = database.records(dag, TARGET)
    searched = [r for r in records if r.phase == "search"]
    assert len(searched) == 5  # every tiling of 32 with an innermost factor <= 16: the space is exhausted
    finals = [r for r in records if r.phase == "final"]  # all five re-measured, five repeats each
    assert {r.trace_json for r in finals} == {r.trace_json for r in searched} and all(len(r.costs) == 5 for r in finals)
    assert database.query_best(dag, TARGET).phase == "final"
    sch = tc.compile_tir(database, dag, TARGET)
    sch.trace.show()
    shown = capsys.readouterr().out
    assert "v4, v5 = sch.sample_perfect_tile(loop=l2, n=2, max_innermost_factor=16, decision=[" in shown
    assert "sch.decompose_reduction(block=b0, loop=l3)" in shown
    a, b = dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, TARGET)(a, b), a @ b, rtol=1e-4, atol=1e-4)
    log = (tmp_path / "tune_tmp" / "tuning.log").read_text()
    assert "trial 5:" in log and "trial 6:" not in log and "no unmeasured candidate left" in log
    assert log.count("re-measured [stochastic_schedule_mm]: ") == 5 and "GFLOPS (re-measured)" in log


@pytest.mark.slow
def test_the_generated_space_is_tuned_and_records_are_shared_with_search_task(tmp_path, runner):
    dag = matmul()
    database = tc.tune_tir(dag, TARGET, tmp_path, max_trials_global=4, num_trials_per_iter=4, runner=runner,
                           verbose=0)
    best = database.query_best(dag, TARGET)
    task = tc.SearchTask(compute_dag=dag, target=TARGET)
    assert best.workload_key == task.workload_key and best.target == str(task.target)
    sch = tc.compile_tir(tmp_path, list(dag.tensors), TARGET)
    assert str(tc.lower(sch)) == str(tc.lower(task.apply_best(tmp_path / "records.json")))


@pytest.mark.slow
def test_rerunning_into_the_same_work_dir_resumes(tmp_path, runner):
    task = tc.SearchTask(func="matmul", args=(16, 16, 16, "float32"))  # a registered workload
    for budget, expected in ((3, 3), (6, 6), (6, 6)):
        database = tc.tune_tir(task, TARGET, tmp_path, max_trials_global=budget, num_trials_per_iter=4,
                               strategy="replay-trace", runner=runner, verbose=0)
        records = [r for r in load_records(tmp_path / "records.json") if r.phase == "search"]
        assert len(records) == expected == len([r for r in database.records(task, TARGET) if r.phase == "search"])
        assert len({trace_key(r.trace) for r in records}) == expected  # nothing measured twice
    assert {r.workload_key for r in records} == {task.workload_key}
    log = (tmp_path / "tuning.log").read_text()
    assert "3 trials already in the work dir, 3 to go" in log and "6 trials already in the work dir, 0 to go" in log


@pytest.mark.slow
def test_a_work_dir_with_a_store_is_written_and_read_through_it_by_two_tuners(tmp_path, runner):
    """A work dir holding records.db (RecordStore) is that store: two tunings of two workloads
    write it, each resumes from it, and the Database reads its bests by the store's index."""
    tc.RecordStore(tmp_path / "records.db").close()
    tasks = [tc.SearchTask(func="matmul", args=(n, 16, 16, "float32")) for n in (16, 32)]
    for budget in (3, 5):
        for task in tasks:
            database = tc.tune_tir(task, TARGET, tmp_path, max_trials_global=budget, num_trials_per_iter=4,
                                   strategy="replay-trace", runner=runner, verbose=0)
    assert not (tmp_path / "records.json").exists() and "of 2 workload/target pairs" in repr(database)
    with tc.RecordStore(tmp_path / "records.db") as store:
        for task in tasks:
            records = [r for r in store.records(task) if r.phase == "search"]
            assert len(records) == 5 == len({trace_key(r.trace) for r in records})  # resumed, nothing twice
            assert database.query_best(task, TARGET) == store.best(task)
    sch = tc.compile_tir(tmp_path, tasks[1], TARGET)
    a, b = tasks[1].compute_dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, TARGET)(a, b), a @ b, rtol=1e-4, atol=1e-4)


def linear0_dag(n_in=64, n_out=16):
    X = te.placeholder((1, n_in), name="X")
    W = te.placeholder((n_out, n_in), name="W")
    B = te.placeholder((n_out,), name="B")
    k = te.reduce_axis((0, n_in), name="k")
    Y = te.compute((1, n_out), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    Z = te.compute((1, n_out), lambda i, j: Y[i, j] + B[j], name="Z")
    return tc.ComputeDAG([X, W, B, Z])


@pytest.mark.slow
def test_a_tuned_kernel_replaces_a_layer_of_a_numpy_model(tmp_path, runner):
    dag = linear0_dag()
    database = tc.tune_tir(dag, TARGET, tmp_path, max_trials_global=3, num_trials_per_iter=3, runner=runner,
                           verbose=0)
    linear0 = tc.build(tc.compile_tir(database, dag, TARGET), TARGET)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64), dtype=np.float32)
    w0, b0 = rng.standard_normal((16, 64), dtype=np.float32), rng.standard_normal(16, dtype=np.float32)
    w1, b1 = rng.standard_normal((4, 16), dtype=np.float32), rng.standard_normal(4, dtype=np.float32)

    def model(x, linear):
        return np.maximum(linear(x, w0, b0), 0) @ w1.T + b1

    z = np.empty((1, 16), np.float32)
    assert linear0(x, w0, b0, out=z) is z and np.array_equal(linear0(x, w0, b0), z)  # preallocated or returned
    np.testing.assert_allclose(model(x, linear0), model(x, lambda x, w, b: x @ w.T + b), rtol=1e-4, atol=1e-4)


def test_mistakes_are_named(tmp_path):
    with pytest.raises(ValueError, match="strategy 'random' is unknown; use one of evolutionary, replay-trace"):
        tc.tune_tir(matmul(), TARGET, tmp_path, max_trials_global=1, strategy="random")
    with pytest.raises(NoValidRecordError, match="holds no tuning records"):
        tc.compile_tir(tmp_path / "nothing", matmul(), TARGET)
    with pytest.raises(TypeError, match="pass a tc.ComputeDAG"):
        tc.tune_tir("matmul", TARGET, tmp_path, max_trials_global=1)
