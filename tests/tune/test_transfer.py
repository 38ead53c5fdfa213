"""Transfer: a new task's cost model first taught a sample of other workloads' records."""

from dataclasses import replace

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.evolution import Candidate
from tilecraft.search.features import feature_names
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.shared_model import SharedCostModel
from tilecraft.tune.transfer import transfer_model, transfer_sample

INNERMOST = "matmul.j.t3"


def _task(*args):
    return tc.SearchTask(func="matmul", args=args, target=tc.Target.host())


class _Cost:  # what a sample reads of a TuningRecord
    def __init__(self, cost):
        self.mean_cost = self.cost = cost
        self.phase, self.trace_json = "search", str(id(self))


def test_a_sample_keeps_the_fastest_quarter_and_samples_the_rest_failures_included():
    records = [_Cost(np.inf if n % 5 == 0 else float(n)) for n in range(1, 401)]
    sample = transfer_sample(records, rows=40)
    assert len(sample) == 40 and len({id(r) for r in sample}) == 40
    assert sorted(r.mean_cost for r in sample)[:10] == sorted(r.mean_cost for r in records)[:10]
    assert any(np.isinf(r.mean_cost) for r in sample)
    assert [id(r) for r in transfer_sample(records, rows=40)] == [id(r) for r in sample]  # the same every time
    assert transfer_sample(records[:30], rows=40) == records[:30]


def test_a_new_task_is_ranked_by_what_other_workloads_logs_measured(tmp_path, made_up_log):
    log = tmp_path / "tuned.json"
    made_up_log(log, _task(32, 32, 32), 48)
    made_up_log(log, _task(64, 32, 32), 48)
    task = _task(48, 32, 64)
    model = transfer_model([log], task, model=SharedCostModel(XGBModel(num_warmup_sample=32, nthread=1)))
    assert model.model.num_samples == 96 and model.model.is_trained
    policy = SketchPolicy(task, model)
    sketch = next(n for n, s in enumerate(policy.sketches) if INNERMOST in feature_names(s))
    rows = policy.sketches[sketch].sample_uniform(np.random.default_rng(1), 64)
    batch = [Candidate(sketch, tuple(int(v) for v in row)) for row in rows]
    innermost = policy.features(batch)[:, policy.feature_space.names.index(INNERMOST)]
    assert np.corrcoef(innermost, policy.model.predict(policy.features(batch)))[0, 1] > 0.5


def test_the_tasks_own_records_and_other_targets_are_left_out_and_a_sample_is_taught(tmp_path, made_up_log):
    here = tc.Target("llvm -isa=avx2 -num-cores=4")
    log = tmp_path / "tuned.json"
    task, other = (tc.SearchTask(func="matmul", args=args, target=here) for args in ((32, 32, 32), (64, 32, 32)))
    made_up_log(log, task, 16)  # resumed from, never transferred
    made_up_log(log, other, 40)
    made_up_log(log, tc.SearchTask(func="matmul", args=(64, 32, 32), target=tc.Target(here, num_cores=2)), 8)
    made_up_log(log, tc.SearchTask(func="matmul", args=(16, 16, 16), target="llvm -isa=avx512 -num-cores=4"), 8)
    model = transfer_model([log], task, rows=24)
    assert model.model.num_samples == 24
    assert set(model.groups) == {other.workload_key}


def test_a_log_with_nothing_to_transfer_is_refused_naming_it(tmp_path, made_up_log):
    task = _task(32, 32, 32)
    with pytest.raises(ValueError, match=f"cannot transfer from {tmp_path / 'none.json'}: no such file"):
        transfer_model([tmp_path / "none.json"], task)
    own = tmp_path / "own.json"
    made_up_log(own, task, 8)
    with pytest.raises(ValueError, match=f"nothing to transfer from {own}: no record of another workload"):
        transfer_model([own], task)
    unregistered = tmp_path / "model.json"
    records = made_up_log(tmp_path / "scratch.json", _task(64, 32, 32), 4)
    unregistered.write_text("".join(replace(r, workload_key='["dag", "abc"]', workload=None).to_json_line() + "\n"
                                    for r in records))
    with pytest.raises(ValueError, match="register their functions with @tc.register_workload"):
        transfer_model([unregistered], task)


def test_a_log_of_another_machine_lends_its_nearest_target_of_the_same_isa(tmp_path, made_up_log):
    here = tc.Target("llvm -isa=avx2 -num-cores=4 -l2-bytes=1048576")
    near = tc.Target(here, num_cores=2)
    far = tc.Target(here, num_cores=2, l2_bytes=262144, l3_bytes=here.l3_bytes * 4)
    log = tmp_path / "elsewhere.json"
    for target, count in ((far, 24), (near, 16), (tc.Target("llvm -isa=avx512 -num-cores=4"), 8)):
        made_up_log(log, tc.SearchTask(func="matmul", args=(64, 32, 32), target=target), count)
    task = tc.SearchTask(func="matmul", args=(32, 32, 32), target=here)
    assert transfer_model([log], task).model.num_samples == 16  # the nearest of the avx2 targets only
    with pytest.raises(ValueError, match="or another target of its ISA"):
        transfer_model([log], tc.SearchTask(func="matmul", args=(32, 32, 32), target="llvm -isa=scalar"))


def test_a_workload_this_target_lacks_is_lent_by_the_nearest_target_that_measured_it(tmp_path, made_up_log):
    here = tc.Target("llvm -isa=avx2 -num-cores=4")
    log = tmp_path / "tuned.json"
    measured_here = tc.SearchTask(func="matmul", args=(64, 32, 32), target=here)
    made_up_log(log, measured_here, 8)
    made_up_log(log, tc.SearchTask(func="matmul", args=(64, 32, 32), target=tc.Target(here, num_cores=2)), 24)
    made_up_log(log, tc.SearchTask(func="matmul", args=(16, 32, 32), target=tc.Target(here, num_cores=2)), 16)
    model = transfer_model([log], tc.SearchTask(func="matmul", args=(32, 32, 32), target=here))
    assert model.model.num_samples == 8 + 16  # the 24 of the first workload elsewhere are not needed
    assert len(model.groups) == 2


@pytest.mark.slow
def test_the_default_database_teaches_a_first_tuning_on_an_x86_machine():
    task = tc.SearchTask(func="matmul", args=(512, 512, 512), target="llvm -isa=avx2 -num-cores=8")
    model = transfer_model([tc.DEFAULT_RECORDS], task, rows=24)
    donors = set(model.groups)
    assert len(donors) >= 6 and task.workload_key not in donors  # convolutions, matmuls, dense, batch_matmul
    assert model.model.is_trained and model.model.num_trainings == 1  # once, not once a workload


def test_a_task_whose_kind_no_donor_measured_is_refused_unless_a_models_tasks_share_it(tmp_path, made_up_log):
    log = tmp_path / "tuned.json"
    made_up_log(log, _task(64, 32, 32), 8)
    made_up_log(log, _task(16, 32, 32), 8)
    dense = tc.SearchTask(func="dense", args=(1, 32, 16), target=_task(8, 8, 8).target)
    with pytest.raises(ValueError, match=r"no record of a reduction of the kind reduce0\[i\.k,j\.k\]; tune it on a"):
        transfer_model([log], dense)
    model = transfer_model([log], [dense, _task(32, 32, 32)])  # a model's tasks: the matmul learns, and teaches
    assert model.model.num_samples == 16 and len(model.groups) == 2


def test_a_deferred_training_trains_once_on_every_row():
    model = XGBModel(num_warmup_sample=8, adaptive_training=False, nthread=1)
    rng = np.random.default_rng(0)
    with model.training_deferred():
        for _ in range(3):
            model.update(rng.random((8, 4)), rng.random(8) + 0.1)
        assert not model.is_trained
    assert model.is_trained and model.num_trainings == 1 and model.num_samples == 24
