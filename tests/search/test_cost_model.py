import json
import sys

import numpy as np
import pytest

from tilecraft.search.cost_model import (
    OBJECTIVES, LightGBMModel, RandomModel, XGBModel, make_cost_model,
)
from tilecraft.search.metrics import peak_at_k, rank_correlation

NUM_FEATURES = 60


def tiling_task(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic matmul tiling space: (features, costs) where the cost is a known function.

    Tiles split 512 = 2^9 three ways for i and j and two ways for k; the cost multiplies
    vectorization, L1 and L2 footprint, register blocking, parallelism and unroll terms,
    has 5% noise, and about 19% of the candidates fail (mostly in a learnable region).
    Features are the log tile sizes, derived footprints, NaN for the cache-write features
    of candidates without that stage, and noise columns up to 60.
    """
    def split(total, parts):
        cuts = np.sort(rng.integers(0, total + 1, size=(n, parts - 1)), axis=1)
        return np.diff(np.concatenate([np.zeros((n, 1), int), cuts, np.full((n, 1), total)], axis=1), axis=1)

    li, lj, lk = split(9, 3), split(9, 3), split(9, 2)
    unroll = rng.choice([0, 4, 6, 9], size=n)
    par_depth = rng.integers(1, 3, size=n)
    cache_write = rng.integers(0, 2, size=n)
    i2, j2, k1 = 2.0 ** li[:, 2], 2.0 ** lj[:, 2], 2.0 ** lk[:, 1]
    i12, j12 = 2.0 ** (li[:, 1] + li[:, 2]), 2.0 ** (lj[:, 1] + lj[:, 2])
    par = np.where(par_depth == 1, 2.0 ** li[:, 0], 2.0 ** (li[:, 0] + lj[:, 0]))
    l1_bytes = 4 * (i2 * k1 + k1 * j2 + i2 * j2)
    l2_bytes = 4 * (i12 * k1 + k1 * j12 + i12 * j12)
    regs = i2 * j2 / 8
    efficiency = (
        (0.15 + 0.85 * np.minimum(j2, 8) / 8)
        / (1 + np.maximum(0, np.log2(l1_bytes / 32768)))
        / (1 + 0.5 * np.maximum(0, np.log2(l2_bytes / 2**20)))
        * np.where(regs < 1, 0.4 + 0.6 * regs, np.where(regs <= 16, 1.0, 16 / regs))
        * np.minimum(par, 8) / 8 / (1 + 0.02 * np.maximum(0, np.log2(par / 64)))
        * np.where((unroll > 0) & (i2 * j2 <= 64), 1.25, 1.0) * np.where(unroll == 9, 0.9, 1.0)
        * np.where(cache_write == 1, np.where(lk[:, 1] >= 4, 1.2, 0.9), 1.0)
    )
    costs = 2 * 512**3 / (efficiency**2 * 800e9) * np.exp(rng.normal(0, 0.05, size=n))
    failed = ((unroll == 9) & (i2 * j2 * k1 >= 2**12)) | ((cache_write == 1) & (j2 == 1) & (i2 >= 16))
    costs[failed | (rng.random(n) < 0.08)] = np.inf

    cache_write_features = np.stack([lk[:, 1], np.log2(i2 * j2 * 4), np.log2(i12 * j12 * 4)], axis=1)
    cache_write_features[cache_write == 0] = np.nan
    columns = [li, lj, lk, unroll[:, None], par_depth[:, None], cache_write[:, None],
               np.log2(np.stack([l1_bytes, l2_bytes, par, regs], axis=1)), np.minimum(j2, 8)[:, None] / 8,
               cache_write_features]
    features = np.concatenate([np.asarray(c, dtype=float) for c in columns], axis=1)
    noise = rng.normal(size=(n, NUM_FEATURES - features.shape[1]))
    return np.concatenate([features, noise], axis=1).astype(np.float32), costs


@pytest.fixture(scope="module")
def task():
    """800 training and 400 held-out candidates of one tiling task."""
    features, costs = tiling_task(1200, np.random.default_rng(7))
    return features[:800], costs[:800], features[800:], costs[800:]


def random_baseline(held_out_features, held_out_costs):
    """Mean a-peak@32 and Spearman rho of 20 random rankings."""
    scores = [RandomModel(seed).predict(held_out_features) for seed in range(20)]
    return (np.mean([peak_at_k(s, held_out_costs, 32) for s in scores]),
            np.mean([rank_correlation(s, held_out_costs) for s in scores]))


def test_synthetic_task_has_failures_and_missing_features(task):
    train_features, train_costs, _, _ = task
    assert 0.12 < np.isinf(train_costs).mean() < 0.28
    assert np.isnan(train_features).any()


def test_trained_xgb_model_ranks_held_out_candidates_far_better_than_random(task):
    train_features, train_costs, held_out_features, held_out_costs = task
    model = XGBModel(nthread=1)
    model.update(train_features, train_costs)
    scores = model.predict(held_out_features)
    peak, rho = peak_at_k(scores, held_out_costs, 32), rank_correlation(scores, held_out_costs)
    random_peak, random_rho = random_baseline(held_out_features, held_out_costs)
    assert peak > 0.9 and rho > 0.6
    assert random_peak < 0.75 and abs(random_rho) < 0.1


def test_lightgbm_model_ranks_held_out_candidates_well(task):
    pytest.importorskip("lightgbm")
    train_features, train_costs, held_out_features, held_out_costs = task
    model = LightGBMModel(nthread=1)
    model.update(train_features, train_costs)
    scores = model.predict(held_out_features)
    assert peak_at_k(scores, held_out_costs, 32) > 0.9
    assert rank_correlation(scores, held_out_costs) > 0.6


@pytest.mark.parametrize("objective", OBJECTIVES[1:])
def test_every_objective_trains_and_ranks_better_than_random(task, objective):
    train_features, train_costs, held_out_features, held_out_costs = task
    model = XGBModel(nthread=1, objective=objective, num_boost_round=10)
    model.update(train_features, train_costs)
    scores = model.predict(held_out_features)
    assert np.isfinite(scores).all()
    assert peak_at_k(scores, held_out_costs, 32) > 0.85


def test_model_predicts_random_scores_until_warm_up(task):
    train_features, train_costs, held_out_features, _ = task
    model = XGBModel(num_warmup_sample=100, nthread=1, seed=5)
    model.update(train_features[:99], train_costs[:99])
    assert not model.is_trained and model.num_trainings == 0 and model.num_samples == 99
    expected = RandomModel(seed=5)
    np.testing.assert_array_equal(model.predict(held_out_features), expected.predict(held_out_features))
    model.update(train_features[99:100], train_costs[99:100])
    assert model.is_trained and model.num_trainings == 1
    first = model.predict(held_out_features)
    np.testing.assert_array_equal(first, model.predict(held_out_features))  # no longer random


def test_adaptive_training_retrains_only_after_20_percent_growth(task):
    train_features, train_costs, _, _ = task
    model = XGBModel(num_warmup_sample=100, nthread=1, num_boost_round=2)
    trainings = []
    for start, stop in [(0, 100), (100, 119), (119, 120), (120, 143), (143, 144), (144, 150)]:
        model.update(train_features[start:stop], train_costs[start:stop])
        trainings.append(model.num_trainings)
    # trained at 100 rows, then at 120 (+20%), then at 144 (+20% of 120)
    assert trainings == [1, 1, 2, 2, 3, 3]


def test_without_adaptive_training_every_update_retrains(task):
    train_features, train_costs, _, _ = task
    model = XGBModel(num_warmup_sample=100, adaptive_training=False, nthread=1, num_boost_round=2)
    for start in range(0, 160, 10):
        model.update(train_features[start:start + 10], train_costs[start:start + 10])
    assert model.num_trainings == 7  # at 100, 110, ..., 160 rows


def test_only_failures_never_train(task):
    train_features, _, _, _ = task
    model = XGBModel(num_warmup_sample=10, nthread=1)
    model.update(train_features[:50], np.full(50, np.inf))
    assert not model.is_trained and model.num_samples == 50


def saved_and_loaded(model, make, tmp_path):
    path = tmp_path / "model.json"
    model.save(path)
    json.loads(path.read_text())  # plain JSON
    loaded = make()
    loaded.load(path)
    return loaded


@pytest.mark.parametrize("name", ["xgb", "lightgbm"])
def test_save_and_load_round_trip_predicts_the_same_and_keeps_training_alike(task, tmp_path, name):
    if name == "lightgbm":
        pytest.importorskip("lightgbm")
    train_features, train_costs, held_out_features, _ = task
    make = lambda: make_cost_model(name, num_warmup_sample=100, nthread=1)  # noqa: E731
    model = make()
    model.update(train_features[:300], train_costs[:300])
    loaded = saved_and_loaded(model, make, tmp_path)
    assert loaded.num_samples == 300 and loaded.num_trainings == model.num_trainings
    np.testing.assert_array_equal(loaded.predict(held_out_features), model.predict(held_out_features))
    for each in (model, loaded):  # 60 more rows: +20%, so both retrain on the same data
        each.update(train_features[300:360], train_costs[300:360])
    assert loaded.num_trainings == model.num_trainings == 2
    np.testing.assert_array_equal(loaded.predict(held_out_features), model.predict(held_out_features))


def test_round_trip_before_warm_up_continues_the_random_sequence(task, tmp_path):
    train_features, train_costs, held_out_features, _ = task
    for make in (lambda: RandomModel(seed=3), lambda: XGBModel(seed=3, nthread=1)):
        model = make()
        model.update(train_features[:10], train_costs[:10])
        model.predict(held_out_features)
        loaded = saved_and_loaded(model, make, tmp_path)
        assert loaded.num_samples == 10
        np.testing.assert_array_equal(loaded.predict(held_out_features), model.predict(held_out_features))


def test_loading_a_different_model_kind_or_objective_is_refused(task, tmp_path):
    train_features, train_costs, _, _ = task
    path = tmp_path / "model.json"
    RandomModel().save(path)
    with pytest.raises(ValueError, match="holds a 'random' model"):
        XGBModel(nthread=1).load(path)
    XGBModel(nthread=1).save(path)
    with pytest.raises(ValueError, match="objective='weighted_squared_error'"):
        XGBModel(nthread=1, objective="squared_error").load(path)
    path.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a tilecraft-cost-model version 1 file"):
        RandomModel().load(path)


def test_malformed_batches_are_refused(task):
    train_features, train_costs, _, _ = task
    model = XGBModel(nthread=1)
    with pytest.raises(ValueError, match="one entry per feature row"):
        model.update(train_features[:5], train_costs[:4])
    with pytest.raises(ValueError, match="positive seconds"):
        model.update(train_features[:2], np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="use NaN"):
        model.update(np.full((2, 3), np.inf), np.ones(2))
    model.update(train_features[:5], train_costs[:5])
    with pytest.raises(ValueError, match="60 before"):
        model.predict(train_features[:5, :10])


def test_make_cost_model_knows_the_three_models_and_names_them_on_a_typo():
    assert isinstance(make_cost_model("random", seed=1), RandomModel)
    assert isinstance(make_cost_model("xgb", nthread=1), XGBModel)
    with pytest.raises(ValueError, match="xgb, lightgbm, random"):
        make_cost_model("xgboost")
    with pytest.raises(ValueError, match="choose one of weighted_squared_error"):
        XGBModel(objective="mse")


def test_missing_lightgbm_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # makes `import lightgbm` fail
    with pytest.raises(ImportError, match=r"pip install 'tilecraft\[lightgbm\]'"):
        make_cost_model("lightgbm")


@pytest.mark.parametrize("objective", ["weighted_squared_error", "rank_pairwise"])
def test_rows_of_several_tasks_are_labelled_against_their_own_best(objective):
    """Task 1 runs 10x slower than task 0; each task's fastest row still scores as high."""
    features = np.array([[0.0], [1.0], [2.0], [3.0]] * 3)
    model = XGBModel(num_warmup_sample=4, nthread=1, objective=objective)
    model.update(features[[0, 1]], np.array([1.0, 2.0]), group=0)
    model.update(features[[2, 3]], np.array([10.0, 20.0]), group=1)
    scores = model.predict(features[:4])
    assert scores[0] > scores[1] and scores[2] > scores[3]
    if objective == "weighted_squared_error":  # labels 1, 0.5 in each task (not 0.1, 0.05 in task 1)
        np.testing.assert_allclose(scores, [1.0, 0.5, 1.0, 0.5], atol=0.1)


def test_a_model_widens_and_keeps_its_rows(task, tmp_path):
    train_features, train_costs, held_out_features, _ = task
    model = XGBModel(num_warmup_sample=50, adaptive_training=False, nthread=1)
    model.update(train_features[:100], train_costs[:100])
    model.widen(NUM_FEATURES + 2)
    assert model.num_trainings == 2  # retrained at once: it predicts on the new width
    wider = np.concatenate([held_out_features, np.full((len(held_out_features), 2), np.nan)], axis=1)
    assert model.predict(wider).shape == (len(held_out_features),)
    with pytest.raises(ValueError, match="columns"):
        model.predict(held_out_features)
    with pytest.raises(ValueError, match="can only widen"):
        model.widen(NUM_FEATURES)
    model.update(wider[:10], train_costs[:10], group=1)
    loaded = saved_and_loaded(model, lambda: XGBModel(num_warmup_sample=50, adaptive_training=False, nthread=1),
                              tmp_path)
    np.testing.assert_array_equal(loaded.predict(wider), model.predict(wider))
    np.testing.assert_array_equal(loaded._groups, [0] * 100 + [1] * 10)
