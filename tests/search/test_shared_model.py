"""A cost model shared by the tasks of a model: each task's features in one space,
learned together, so a task's first round is ranked by what the others measured."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.evolution import Candidate
from tilecraft.search.features import feature_names
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.shared_model import SharedCostModel, TaskCostModel, role_namer, stage_roles, task_descriptor
from tilecraft.tune.scheduler import TaskScheduler


def _task(*args):
    return tc.SearchTask(func="matmul", args=args, target=tc.Target.host())


def test_tasks_share_feature_names_and_are_told_apart_by_their_extents():
    shared = SharedCostModel()
    small, large = SketchPolicy(_task(32, 32, 32), shared), SketchPolicy(_task(64, 128, 32), shared)
    assert isinstance(small.model, TaskCostModel) and small.model.shared is large.model.shared
    # the same sketches: every feature name is shared, and each task's extents go to the same columns
    assert len(shared.columns) == len(small.feature_space.names) + len(task_descriptor(small.task.compute_dag))
    assert task_descriptor(large.task.compute_dag)["reduce0[i.k,k.j].k.extent"] == 7.0  # log2 of L = 128
    rows = small.features([c for c in small.next_batch(4)])
    placed_small, placed_large = small.model._placed(rows), large.model._placed(rows)
    np.testing.assert_array_equal(placed_small[:, small.model.positions], placed_large[:, large.model.positions])
    assert not np.array_equal(placed_small[:, small.model.described], placed_large[:, large.model.described])


def test_columns_are_named_by_stage_role_so_stages_named_apart_share_them():
    shared = SharedCostModel()
    matmul = SketchPolicy(_task(64, 64, 64), shared)
    batched = SketchPolicy(tc.SearchTask(func="batch_matmul", args=(4, 64, 64, 64), target=tc.Target.host()), shared)
    dense = SketchPolicy(tc.SearchTask(func="dense", args=(64, 64, 64), target=tc.Target.host()), shared)

    def column(policy, name):
        return policy.model.positions[policy.feature_space.names.index(name)]

    # a batch loop outside keeps the kind; weights read across k (dense) do not
    assert column(matmul, "matmul.j.t3") == column(batched, "batch_matmul.j.t3") != column(dense, "dense.j.t3")
    conv = tc.SearchTask(func="conv2d_nhwc", args=(1, 14, 14, 16, 16, 3, 3, 1, 1)).compute_dag
    assert stage_roles(conv) == {"conv2d_pad": "in0", "conv2d": "reduce0[rx+x.rc,rc.f]", "bias_add": "out0",
                                 "relu": "out1"}
    rename = role_namer(conv)
    assert rename("sketch=inline(bias_add) tile") == "sketch=inline(out0) tile"
    assert [rename(name) for name in ("conv2d_pad.location", "conv2d.y.t2", "task.log2_flop")] == [
        "in0.location", "reduce0[rx+x.rc,rc.f].y.t2", "task.log2_flop"]


def test_a_new_task_is_ranked_by_what_the_others_measured():
    shared = SharedCostModel(XGBModel(num_warmup_sample=32, nthread=1))
    first = SketchPolicy(_task(32, 32, 32), shared)
    candidates = first.next_batch(48)
    # a made-up cost: bigger innermost spatial tiles are faster
    costs = [1.0 / (1 + first.features([c])[0, first.feature_space.names.index("matmul.j.t3")]) for c in candidates]
    first.update(candidates, costs)
    assert shared.model.is_trained
    second = SketchPolicy(_task(48, 32, 64), shared)  # fresh, never measured
    # a spread of its candidates: the model's own picks would all share the largest tiles
    sketch = next(n for n, s in enumerate(second.sketches) if "matmul.j.t3" in feature_names(s))
    rows = second.sketches[sketch].sample_uniform(np.random.default_rng(0), 64)
    batch = [Candidate(sketch, tuple(int(v) for v in row)) for row in rows]
    scores = second.model.predict(second.features(batch))
    np.testing.assert_array_equal(scores, second.model.predict(second.features(batch)))  # trained, not random
    names = second.feature_space.names
    innermost = second.features(batch)[:, names.index("matmul.j.t3")]
    assert np.corrcoef(innermost, scores)[0, 1] > 0.5  # what the first task taught


@pytest.mark.slow
def test_a_task_whose_kind_no_rows_taught_scores_at_random_until_its_own_arrive():
    shared = SharedCostModel(XGBModel(num_warmup_sample=32, nthread=1))
    taught = SketchPolicy(_task(32, 32, 32), shared)
    measured = taught.next_batch(48)
    taught.update(measured, [1.0 + n for n in range(len(measured))])
    assert shared.model.is_trained

    def policy(func, args):
        return SketchPolicy(tc.SearchTask(func=func, args=args, target=tc.Target.host()), shared)

    batched, dense = policy("batch_matmul", (2, 32, 32, 32)), policy("dense", (32, 32, 32))
    assert batched.model.is_trained and not batched.params.sketch_quotas  # matmul's kind: taught
    assert not dense.model.is_trained and dense.params.sketch_quotas  # searched as if untaught
    rows = dense.features(dense.next_batch(16))
    assert not np.array_equal(dense.model.predict(rows), dense.model.predict(rows))  # random
    own = dense.next_batch(48)
    dense.update(own, [1.0 + n for n in range(len(own))])
    assert dense.model.is_trained
    np.testing.assert_array_equal(dense.model.predict(rows), dense.model.predict(rows))


@pytest.mark.slow
def test_a_task_that_brings_new_features_widens_the_model():
    shared = SharedCostModel(XGBModel(num_warmup_sample=8, nthread=1))
    matmul = SketchPolicy(_task(32, 32, 32), shared)
    chosen = matmul.next_batch(8)
    matmul.update(chosen, [1e-3 * (n + 1) for n in range(len(chosen))])
    before = len(shared.columns)
    softmax = SketchPolicy(tc.SearchTask(func="softmax", args=(64, 128), target=tc.Target.host()), shared)
    assert len(shared.columns) > before
    assert softmax.model.predict(softmax.features(softmax.next_batch(4))).shape == (4,)
    assert matmul.model.predict(matmul.features(chosen)).shape == (len(chosen),)


def test_the_task_scheduler_shares_one_model_unless_told_not_to():
    tasks = [_task(32, 32, 32), _task(64, 32, 32)]
    shared = TaskScheduler(tasks).states
    assert shared[0].policy.model.shared is shared[1].policy.model.shared
    alone = TaskScheduler(tasks, share_cost_model=False).states
    assert isinstance(alone[0].policy.model, XGBModel) and alone[0].policy.model is not alone[1].policy.model


def test_the_task_scheduler_starts_from_a_model_it_is_given_as_one_taught_by_transfer():
    taught = SharedCostModel()
    donor = SketchPolicy(_task(16, 16, 16), taught)
    donor.update(chosen := donor.next_batch(8), [1e-3 * (n + 1) for n in range(len(chosen))])
    states = TaskScheduler([_task(32, 32, 32), _task(64, 32, 32)], cost_model=taught).states
    assert all(state.policy.model.shared is taught for state in states) and taught.model.num_samples == 8
    with pytest.raises(ValueError, match="a cost_model is shared by the tasks; leave out share_cost_model=False"):
        TaskScheduler([_task(32, 32, 32)], share_cost_model=False, cost_model=taught)


def test_rows_of_the_wrong_width_name_the_task_feature_count():
    shared = SharedCostModel()
    policy = SketchPolicy(_task(32, 32, 32), shared)
    width = len(policy.feature_space.names)
    with pytest.raises(ValueError, match=rf"features must have {width} columns \(this task's feature names\)"):
        policy.model.predict(np.zeros((2, width + 1)))


def test_a_saved_shared_model_loads_with_its_columns_tasks_and_kinds(tmp_path):
    shared = SharedCostModel(XGBModel(num_warmup_sample=8, nthread=1))
    first = SketchPolicy(_task(32, 32, 32), shared)
    chosen = first.next_batch(16)
    first.update(chosen, [1e-3 * (n + 1) for n in range(len(chosen))])
    first.model.save(tmp_path / "shared.json")
    loaded = SharedCostModel(XGBModel(nthread=1))
    loaded.load(tmp_path / "shared.json")
    again = SketchPolicy(_task(32, 32, 32), loaded)
    assert loaded.columns == shared.columns and loaded.groups == shared.groups and again.model.is_trained
    rows = first.features(chosen)
    np.testing.assert_allclose(again.model.predict(rows), first.model.predict(rows), rtol=1e-5)
    shuffled = SharedCostModel()
    SketchPolicy(tc.SearchTask(func="softmax", args=(8, 24), target=tc.Target.host()), shuffled)
    with pytest.raises(ValueError, match="placed its columns otherwise than this model does; load it before"):
        shuffled.load(tmp_path / "shared.json")
    XGBModel(nthread=1).save(tmp_path / "own.json")
    with pytest.raises(ValueError, match="holds one task's cost model, not a shared one; load it into an XGBModel"):
        loaded.load(tmp_path / "own.json")
