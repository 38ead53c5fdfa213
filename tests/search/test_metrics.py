import math

import numpy as np
import pytest

from tilecraft.search.metrics import (
    normalized_throughput, peak_at_k, rank_correlation, recall_at_k, top_k_peak,
)

# throughput 1, 0.5, 0.25, 0 (failed); predicted order: 1, 3, 2, 0
COSTS = np.array([1.0, 2.0, 4.0, np.inf])
SCORES = np.array([0.1, 0.9, 0.5, 0.7])


def test_normalized_throughput_is_best_cost_over_cost_and_zero_for_failures():
    assert normalized_throughput(COSTS).tolist() == [1.0, 0.5, 0.25, 0.0]
    assert normalized_throughput(np.array([np.inf, np.inf])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bad", [[1.0, np.nan], [1.0, 0.0], [1.0, -2.0]])
def test_costs_that_are_nan_or_not_positive_are_refused(bad):
    with pytest.raises(ValueError, match="positive seconds"):
        normalized_throughput(np.array(bad))


def test_peak_at_k_is_the_mean_of_the_best_so_far_curve():
    # best-so-far over the predicted order: 0.5, 0.5, 0.5, 1.0
    assert peak_at_k(SCORES, COSTS, 4) == pytest.approx(2.5 / 4)
    assert peak_at_k(SCORES, COSTS, 2) == pytest.approx(0.5)
    assert peak_at_k(SCORES, COSTS, 100) == pytest.approx(2.5 / 4)  # k past the end: the whole curve


def test_top_k_peak_is_the_best_found_in_the_top_k():
    assert top_k_peak(SCORES, COSTS, 3) == pytest.approx(0.5)
    assert top_k_peak(SCORES, COSTS, 4) == pytest.approx(1.0)


def test_a_perfect_ranking_scores_one():
    perfect = -COSTS
    assert peak_at_k(perfect, COSTS, 3) == 1.0
    assert recall_at_k(perfect, COSTS, 2) == 1.0
    assert rank_correlation(perfect, COSTS) == pytest.approx(1.0)
    assert rank_correlation(COSTS[:3], COSTS[:3]) == pytest.approx(-1.0)


def test_tied_scores_keep_input_order():
    # all scores equal, so the candidates are taken in input order: throughput 0, 0.25
    assert peak_at_k(np.zeros(4), np.array([np.inf, 4.0, 2.0, 1.0]), 2) == pytest.approx(0.125)


def test_recall_at_k_counts_the_true_top_k_found():
    assert recall_at_k(SCORES, COSTS, 2) == pytest.approx(0.5)  # true {0, 1}, predicted {1, 3}
    assert recall_at_k(SCORES, COSTS, 3) == pytest.approx(2 / 3)  # true {0, 1, 2}, predicted {1, 3, 2}


def test_recall_with_fewer_successes_than_k_looks_for_the_successes_only():
    costs = np.array([1.0, np.inf, np.inf])
    assert recall_at_k(np.array([0.0, 1.0, 2.0]), costs, 2) == 0.0
    assert recall_at_k(np.array([0.0, 1.0, 2.0]), costs, 3) == 1.0


def test_spearman_gives_tied_failures_their_average_rank():
    # throughput ranks 1.5, 1.5, 3, 4 against score ranks 1, 2, 3, 4: rho = sqrt(0.9)
    rho = rank_correlation(np.array([1.0, 2.0, 3.0, 4.0]), np.array([np.inf, np.inf, 2.0, 1.0]))
    assert rho == pytest.approx(math.sqrt(0.9))


def test_every_metric_is_nan_when_every_candidate_failed():
    costs = np.full(3, np.inf)
    scores = np.array([1.0, 2.0, 3.0])
    assert math.isnan(peak_at_k(scores, costs, 2))
    assert math.isnan(top_k_peak(scores, costs, 2))
    assert math.isnan(recall_at_k(scores, costs, 2))
    assert math.isnan(rank_correlation(scores, costs))


def test_constant_scores_have_no_rank_correlation():
    assert math.isnan(rank_correlation(np.ones(4), COSTS))


def test_mismatched_lengths_and_bad_k_are_refused():
    with pytest.raises(ValueError, match="predicted_scores has shape"):
        peak_at_k(SCORES[:3], COSTS, 2)
    with pytest.raises(ValueError, match="predicted_scores has shape"):
        rank_correlation(SCORES[:3], COSTS)
    with pytest.raises(ValueError, match="k must be at least 1"):
        recall_at_k(SCORES, COSTS, 0)


def test_metrics_agree_with_direct_definitions_on_random_data():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, k = int(rng.integers(2, 60)), int(rng.integers(1, 20))
        costs = np.where(rng.random(n) < 0.2, np.inf, rng.uniform(0.5, 5.0, n))
        costs[0] = 1.0  # at least one success
        scores = rng.normal(size=n)
        throughput = np.where(np.isinf(costs), 0.0, 1.0 / costs)
        order = sorted(range(n), key=lambda i: -scores[i])[:k]
        curve = [max(throughput[order[: j + 1]]) / throughput.max() for j in range(len(order))]
        assert peak_at_k(scores, costs, k) == pytest.approx(np.mean(curve))
        assert top_k_peak(scores, costs, k) == pytest.approx(curve[-1])
        valid = [i for i in range(n) if throughput[i] > 0]
        true_top = sorted(valid, key=lambda i: -throughput[i])[: min(k, len(valid))]
        assert recall_at_k(scores, costs, k) == pytest.approx(len(set(true_top) & set(order)) / len(true_top))
        if np.isfinite(costs).all():  # no ties: Spearman is Pearson on plain ranks
            ranks = lambda x: np.argsort(np.argsort(x))  # noqa: E731
            expected = np.corrcoef(ranks(scores), ranks(throughput))[0, 1]
            assert rank_correlation(scores, costs) == pytest.approx(expected)
