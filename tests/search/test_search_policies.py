"""The sketch bandit, the learned mutation policy, and how the search and tuner use them."""

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.search.bandit import SketchBandit
from tilecraft.search.cost_model import XGBModel
from tilecraft.search.evolution import SearchParams, evolutionary_search
from tilecraft.search.mutation_predictor import FixedMutations, LearnedMutations
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.shared_model import SharedCostModel
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS


def matmul_sketches():
    return generate_sketches(tc.ComputeDAG(WORKLOADS["matmul"](256, 256, 256)))


def test_bandit_favours_the_sketch_holding_the_best_but_starves_none():
    bandit = SketchBandit(3, floor=0.3)
    assert np.allclose(bandit.shares(), 1 / 3)  # nothing measured: alike
    bandit.update([0, 1, 2] * 20, [2e-3, 1e-3, 5e-3] * 20)
    shares = bandit.shares()
    assert shares.sum() == pytest.approx(1.0)
    assert shares[1] > 0.6 and shares.argmax() == 1
    assert shares.min() >= 0.3 / 3 - 1e-12
    bandit.update([2] * 10, [0.5e-3] * 10)  # a sketch that pays off late takes over
    assert bandit.shares().argmax() == 2


def test_bandit_gives_an_unmeasured_sketch_its_chance():
    bandit = SketchBandit(3)
    bandit.update([0, 1], [1e-3, 2e-3])
    assert bandit.shares().argmax() == 2
    assert SketchBandit(1).shares().tolist() == [1.0]


def test_bandit_ignores_failures_for_the_best():
    bandit = SketchBandit(2)
    bandit.update([0, 0, 1], [np.inf, np.inf, 1e-3])
    assert bandit.values().tolist() == [0.0, 1.0]


def test_measurement_slots_follow_the_shares():
    sketches = matmul_sketches()
    shares = np.array([0.1, 0.1, 0.8])

    def favours_sketch_zero(sketch_index, rows):
        return np.full(len(rows), 1.0 if sketch_index == 0 else 0.5) + np.random.default_rng(0).random(len(rows)) * 0.01

    params = SearchParams(population=256, num_iters=1, eps_greedy=0.0, sketch_quotas=True)
    chosen = evolutionary_search(sketches, favours_sketch_zero, 40, set(), [], np.random.default_rng(0), 32, params,
                                 sketch_shares=shares)
    per_sketch = np.bincount([c.sketch for c in chosen], minlength=3)
    assert per_sketch[2] >= 32 and len(chosen) == 40
    unshared = evolutionary_search(sketches, favours_sketch_zero, 40, set(), [], np.random.default_rng(0), 32, params)
    assert np.bincount([c.sketch for c in unshared], minlength=3)[0] == 40  # Ansor: by score alone
    scored = evolutionary_search(sketches, favours_sketch_zero, 40, set(), [], np.random.default_rng(0), 32,
                                 SearchParams(population=256, num_iters=1, eps_greedy=0.0, sketch_quotas=False),
                                 sketch_shares=shares)
    assert np.bincount([c.sketch for c in scored], minlength=3)[0] == 40  # shares split the population only


@pytest.mark.slow
def test_a_bandit_sets_quotas_of_the_slots_only_for_a_cost_model_not_taught_before_the_search():
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    taught = SharedCostModel(XGBModel(num_warmup_sample=8, adaptive_training=False))
    donor = SketchPolicy(tc.SearchTask(func="matmul", args=(32, 64, 64), target=tc.Target.host()), taught)
    donor.update(chosen := donor.next_batch(8), [1e-3 * (n + 1) for n in range(len(chosen))])
    assert SketchPolicy(task, sketch_policy="bandit").params.sketch_quotas is True
    assert SketchPolicy(task, taught, sketch_policy="bandit").params.sketch_quotas is False
    assert SketchPolicy(task, taught, SearchParams(sketch_quotas=True)).params.sketch_quotas is True


class _Resumed:
    """An init-search callback that trains the model on measurements of the task itself,
    as resuming from its log does."""

    def apply(self, policy):
        chosen = policy.next_batch(8)
        policy.update(chosen, [1e-3 * (n + 1) for n in range(len(chosen))])


def test_a_search_resumed_from_its_own_log_leaves_the_slots_to_the_model():
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    resumed = SketchPolicy(task, XGBModel(num_warmup_sample=8, adaptive_training=False),
                           init_search_callbacks=[_Resumed()], sketch_policy="bandit")
    assert resumed.model.is_trained and resumed.params.sketch_quotas is False


def test_learned_mutations_learn_which_slot_pays_off():
    sketches = matmul_sketches()
    sketch = sketches[2]
    policy = LearnedMutations(sketches, min_observations=100)
    actions = policy.actions[2]
    useful = next(n for n, (rule, slot) in enumerate(actions) if rule.name == "auto_unroll")
    assert policy.probabilities(2)[useful] < 0.1  # Ansor's weight for auto-unroll: small
    rng = np.random.default_rng(0)
    for _ in range(5):
        drawn = rng.integers(len(actions), size=400)
        gains = np.where(drawn == useful, 0.2, -0.05)
        policy.learn(2, drawn, gains)
    probabilities = policy.probabilities(2)
    assert probabilities.argmax() == useful and probabilities[useful] > 0.5
    assert probabilities.sum() == pytest.approx(1.0) and probabilities.min() > 0  # the rest still explored
    rows = sketch.sample(rng, 200, 32)
    children = policy.mutate_many(2, list(rows), rng)
    unroll_slot = actions[useful][1]
    changed_unroll = sum(child is not None and child[unroll_slot] != row[unroll_slot]
                         for row, (child, _) in zip(rows, children))
    assert changed_unroll > 100


def test_learned_mutations_use_the_fixed_weights_until_they_have_seen_enough():
    sketches = matmul_sketches()
    policy = LearnedMutations(sketches, min_observations=1000)
    policy.learn(2, np.zeros(10, dtype=int), np.ones(10))
    assert np.allclose(policy.probabilities(2), policy.prior[2])


@pytest.mark.parametrize("mutator", [FixedMutations, LearnedMutations])
def test_both_mutation_policies_climb_a_known_score(mutator):
    sketches = matmul_sketches()
    target = np.log2([4, 8, 1, 8])

    def score(sketch_index, rows):
        tiles = np.log2(np.array([sketches[sketch_index].slots[0].domain[r] for r in rows[:, 0]], dtype=float))
        return 10 - np.abs(tiles - target).sum(axis=1)

    chosen = evolutionary_search(sketches, score, 16, set(), [], np.random.default_rng(0), 32,
                                 SearchParams(population=512, num_iters=4), mutator=mutator(sketches))
    assert max(score(c.sketch, np.array([c.row]))[0] for c in chosen) >= 9


def test_a_bandit_with_a_tie_does_not_chase_a_lead_inside_it():
    eager, tied = SketchBandit(3), SketchBandit(3, tie=0.05)
    for bandit in (eager, tied):
        bandit.update([0, 1, 2] * 10, [1.0e-3, 1.03e-3, 3e-3] * 10)  # a 3% lead, and a sketch 3x slower
    assert eager.shares()[0] > 1.5 * eager.shares()[1]
    assert tied.shares()[0] == pytest.approx(tied.shares()[1]) and tied.shares()[2] < 0.5 * tied.shares()[0]
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    assert SketchPolicy(task, params=SearchParams(sketch_tie=0.05), sketch_policy="bandit").sketch_policy.tie == 0.05
    with pytest.raises(ValueError, match=r"tie is a fraction of the best in \[0, 1\), got 1.5"):
        SketchPolicy(task, params=SearchParams(sketch_tie=1.5), sketch_policy="bandit")


def test_a_warm_bandit_splits_close_sketches_evenly_and_still_drops_a_poor_one():
    eager, gentle = SketchBandit(3), SketchBandit(3, temperature=0.2)
    for bandit in (eager, gentle):
        bandit.update([0, 1, 2] * 10, [1.0e-3, 1.1e-3, 2.5e-3] * 10)  # a 10% lead, and a sketch at 0.4 of the best
    assert eager.shares()[0] > 3 * eager.shares()[1]
    assert gentle.shares()[0] < 2 * gentle.shares()[1] and gentle.shares()[2] < 0.1
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    params = SearchParams(sketch_temperature=0.2)
    assert SketchPolicy(task, params=params, sketch_policy="bandit").sketch_policy.temperature == 0.2
    with pytest.raises(ValueError, match="temperature must be above 0, got 0"):
        SketchPolicy(task, params=SearchParams(sketch_temperature=0), sketch_policy="bandit")


def test_policies_are_switched_by_name_and_bad_names_are_refused():
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    policy = SketchPolicy(task)
    assert (policy.sketch_policy.name, policy.mutation_policy.name) == ("uniform", "fixed")
    policy.use(sketch_policy="bandit", mutation_policy="learned")
    bandit = policy.sketch_policy
    policy.use(sketch_policy="bandit")
    assert policy.sketch_policy is bandit  # the same name keeps what it learned
    with pytest.raises(ValueError, match="sketch_policy='thompson' is unknown; use one of 'uniform', 'bandit'"):
        policy.use(sketch_policy="thompson")


@pytest.mark.slow
def test_tuning_options_switch_the_policies(tmp_path):
    task = tc.SearchTask(func="matmul", args=(32, 24, 40, "float32"), target=tc.Target.host())
    policy = SketchPolicy(task, program_cost_model=tc.XGBModel(num_warmup_sample=8))  # trained after a round
    with tc.LocalRunner(number=2, min_repeat_ms=0) as runner:
        summary = task.tune(tc.TuningOptions(num_measure_trials=16, num_measures_per_round=8, runner=runner,
                                             verbose=0, sketch_policy="bandit", mutation_policy="learned",
                                             num_remeasured=0),
                            search_policy=policy)
    assert summary.valid >= 14
    assert policy.sketch_policy.trials.sum() == 16 and policy.mutation_policy.seen > 0


def test_the_learned_mutations_learn_nothing_from_a_warm_up_models_random_scores():
    task = tc.SearchTask(func="matmul", args=(64, 64, 64), target=tc.Target.host())
    policy = SketchPolicy(task, program_cost_model=tc.XGBModel(num_warmup_sample=32),
                          params=SearchParams(population=256, num_iters=2), mutation_policy="learned")
    rng = np.random.default_rng(0)

    def measure(count: int) -> None:
        batch = policy.next_batch(count)
        policy.update(batch, list(1e-3 * (1 + rng.random(len(batch)))))

    measure(16)
    assert not policy.model.is_trained and policy.mutation_policy.seen == 0
    measure(16)  # 32 measured: the model trains
    assert policy.model.is_trained
    measure(16)
    assert policy.mutation_policy.seen > 0


def test_a_policy_that_cannot_switch_is_refused_clearly():
    class Custom:
        pass

    task = tc.SearchTask(func="matmul", args=(32, 24, 40, "float32"), target=tc.Target.host())
    with pytest.raises(tc.TilecraftError, match="cannot switch them"):
        task.tune(tc.TuningOptions(num_measure_trials=1, sketch_policy="bandit", verbose=0), search_policy=Custom())


@pytest.mark.slow
def test_a_batch_replaces_candidates_whose_compute_locations_do_not_replay():
    task = tc.SearchTask(func="softmax", args=(8, 24), target=tc.Target.host())
    policy = SketchPolicy(task, seed=0)
    checked, unreplayable = policy._replays, []
    policy._replays = lambda c: checked(c) or unreplayable.append(c)
    rng = np.random.default_rng(0)
    for _ in range(8):
        batch = policy.next_batch(4)
        assert len(batch) == 4 and all(checked(c) for c in batch)
        policy.update(batch, list(rng.uniform(1e-4, 1e-3, 4)))
    assert unreplayable  # met, learned as failures, and never offered
    assert all(c.key in policy.measured for c in unreplayable)
