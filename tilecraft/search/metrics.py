"""How well a cost model ranks candidates: the numbers to judge one model against another.

A cost model is only ever used to pick which candidates to measure, so what matters is
whether the truly fast candidates land near the top of its ranking, not how close its
scores are to any unit. All functions take the model's scores (higher = predicted faster)
and the measured costs in seconds, with ``inf`` for a candidate that failed to build or
run; a failed candidate has throughput 0.

  peak_at_k          Ansor's a-peak@k: the mean of the best-so-far curve over the top k
  top_k_peak         the best true throughput among the top k, relative to the best overall
  recall_at_k        how many of the truly best k are among the predicted best k
  rank_correlation   Spearman's rho between scores and throughputs

Every function returns NaN when no candidate succeeded: there is nothing to find.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "normalized_throughput", "peak_at_k", "top_k_peak", "recall_at_k", "rank_correlation",
]


def normalized_throughput(costs: np.ndarray) -> np.ndarray:
    """min(costs) / costs, in [0, 1]: 1 for the fastest candidate, 0 for a failed one.

    This is Ansor's training label (Zheng et al., OSDI 2020, §5.2). All zeros when every
    candidate failed.
    """
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 1:
        raise ValueError(f"costs must be a 1-D array of seconds, got shape {costs.shape}")
    if np.isnan(costs).any() or (costs <= 0).any():
        raise ValueError("costs must be positive seconds, or inf for a failed candidate; got NaN or <= 0")
    finite = np.isfinite(costs)
    throughput = np.zeros_like(costs)
    if finite.any():
        throughput[finite] = costs[finite].min() / costs[finite]
    return throughput


def _predicted_order(predicted_scores: np.ndarray, n: int) -> np.ndarray:
    scores = np.asarray(predicted_scores, dtype=np.float64)
    if scores.shape != (n,):
        raise ValueError(f"predicted_scores has shape {scores.shape}, costs have {n} entries")
    # A stable sort of the negated scores keeps ties in input order, so results are repeatable.
    return np.argsort(-scores, kind="stable")


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


def _best_so_far(predicted_scores: np.ndarray, true_costs: np.ndarray, k: int) -> np.ndarray | None:
    """The best true throughput among the first 1..k predicted, divided by the best overall."""
    _check_k(k)
    throughput = normalized_throughput(true_costs)
    order = _predicted_order(predicted_scores, len(throughput))
    if not throughput.any():
        return None
    return np.maximum.accumulate(throughput[order[:k]])


def peak_at_k(predicted_scores: np.ndarray, true_costs: np.ndarray, k: int) -> float:
    """Ansor's a-peak@k, in [0, 1]: the mean of the normalized best-so-far curve over the top k.

    Measuring the candidates in predicted order, entry i of the curve is the best true
    throughput found after i + 1 measurements divided by the best in the whole set; the
    mean rewards a model that finds a fast candidate early (TVM ``xgb_model.py``,
    ``pack_sum_average_peak_score``). With fewer than k candidates the curve is shorter.
    """
    curve = _best_so_far(predicted_scores, true_costs, k)
    return float("nan") if curve is None else float(curve.mean())


def top_k_peak(predicted_scores: np.ndarray, true_costs: np.ndarray, k: int) -> float:
    """The best true throughput among the predicted top k, divided by the best overall."""
    curve = _best_so_far(predicted_scores, true_costs, k)
    return float("nan") if curve is None else float(curve[-1])


def recall_at_k(predicted_scores: np.ndarray, true_costs: np.ndarray, k: int) -> float:
    """The fraction of the truly fastest k candidates that are among the predicted top k.

    Failed candidates never count as truly fast: with only m < k successes, the true top
    set has m members and the result is the fraction of those m in the predicted top k.
    Ties in cost at the boundary go to the candidate that comes first in the input.
    """
    _check_k(k)
    throughput = normalized_throughput(true_costs)
    order = _predicted_order(predicted_scores, len(throughput))
    n_valid = int(np.count_nonzero(throughput))
    if n_valid == 0:
        return float("nan")
    true_top = np.argsort(-throughput, kind="stable")[: min(k, n_valid)]
    found = np.intersect1d(true_top, order[:k], assume_unique=True)
    return len(found) / len(true_top)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with tied values sharing the mean of their ranks (as Spearman needs)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts_group) - 1
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = ((starts + ends + 1) / 2)[group]
    return ranks


def rank_correlation(predicted_scores: np.ndarray, true_costs: np.ndarray) -> float:
    """Spearman's rho between the scores and the true throughputs, in [-1, 1].

    Tied values (all failed candidates tie at throughput 0) get their average rank. NaN
    when either side is constant, which includes every candidate having failed.
    """
    throughput = normalized_throughput(true_costs)
    scores = np.asarray(predicted_scores, dtype=np.float64)
    if scores.shape != throughput.shape:
        raise ValueError(f"predicted_scores has shape {scores.shape}, costs have {len(throughput)} entries")
    if len(scores) < 2:
        return float("nan")
    a = _average_ranks(scores)
    b = _average_ranks(throughput)
    a -= a.mean()
    b -= b.mean()
    denominator = np.sqrt((a * a).sum() * (b * b).sum())
    return float("nan") if denominator == 0 else float((a * b).sum() / denominator)
