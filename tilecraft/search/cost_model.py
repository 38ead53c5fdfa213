"""Learned cost models: score a batch of candidate schedules from their feature rows.

The search asks a model to rank thousands of candidates per round and measures only the
best few, so a model is judged by how it ranks (``metrics.py``), not by its error in
seconds. The design follows Ansor's XGBoost model (Zheng et al., OSDI 2020, §5.2; TVM
``auto_scheduler/cost_model/xgb_model.py``): the label is the normalized throughput
y = min_cost / cost, fast programs weigh more, the model predicts random scores until it
has seen ``num_warmup_sample`` measurements, and adaptive training retrains only once the
data has grown by 20% (TVM #7197). It differs where our features differ: one row
describes a whole candidate, computed without lowering it, so a per-row objective
replaces Ansor's per-statement "pack-sum"; and a fixed 30 boosting rounds replace
Ansor's early stopping after up to 10,000, which keeps a retrain well under a second.

  CostModel        the interface: update with measured costs, predict scores, save, load
  RandomModel      uniform random scores: Ansor's model before warm-up
  XGBModel         gradient-boosted trees with XGBoost, Ansor's parameters
  LightGBMModel    the same with LightGBM, an optional dependency
  make_cost_model  "xgb" | "lightgbm" | "random" -> a model

A saved model is one JSON document: its objective, every feature row and cost it was
given (base64 of the raw little-endian arrays, so NaN and inf survive exactly) and the
booster in the library's own format (XGBoost's JSON, LightGBM's text). Never a pickle.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import json
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import numpy as np

from .metrics import normalized_throughput

__all__ = [
    "CostModel", "RandomModel", "XGBModel", "LightGBMModel", "make_cost_model",
    "OBJECTIVES", "XGB_PARAMS", "LIGHTGBM_PARAMS",
]

FORMAT = "tilecraft-cost-model"
FORMAT_VERSION = 1

# Ansor's parameters (xgb_model.py) with XGBoost's "hist" trees on 64 bins: 64 instead of
# 256 bins trains 2.5x faster at 1000 rows with the same a-peak@32 (0.973 against 0.972
# over 16 synthetic tasks). Keys given as XGBModel(params=...) override these and reach
# XGBoost unchanged.
XGB_PARAMS: Mapping[str, Any] = MappingProxyType({
    "max_depth": 10, "gamma": 0.001, "min_child_weight": 0, "eta": 0.2,
    "tree_method": "hist", "max_bin": 64, "verbosity": 0,
})

# The same trees in LightGBM's terms: leaf-wise growth bounded by depth 10, Ansor's gain
# threshold and learning rate, leaves down to two rows.
LIGHTGBM_PARAMS: Mapping[str, Any] = MappingProxyType({
    "max_depth": 10, "num_leaves": 255, "min_gain_to_split": 0.001, "min_data_in_leaf": 2,
    "learning_rate": 0.2, "verbosity": -1,
})

# The training objectives, default first, chosen by measurement on synthetic tiling tasks
# (60 features, cost a nonlinear function of log tile sizes with interactions and noise,
# 19% failed rows; 16 tasks). a-peak@32 of the ranking of 2048 held-out candidates:
#
#   rows   weighted_squared_error   squared_error   rank_pairwise   rank_ndcg
#    300   0.950                    0.945           0.923           0.936
#   1000   0.973                    0.970           0.951           0.965
#   2000   0.976                    0.978           0.976           0.968
#
# The ranking objectives lose at 300-1000 rows (pairwise -0.027±0.009 at 300) and have a
# Spearman rho of 0.2-0.4 against 0.6-0.7, which matters because evolutionary search uses
# the scores of the whole population as fitness. Weighting by throughput (Ansor) ties the
# plain squared error on a-peak@32 and finds more of the true top 64 (recall 0.65 against
# 0.61 at 1000 rows). Ansor's weight is exactly y, which gives failed candidates weight 0:
# the model never learns where candidates fail, and 19% of its top 64 failed at 800 rows.
# A weight floor of 0.05 cuts that to 11% (8% at 2000 rows, the rate of the synthetic
# random failures), lifts rho from 0.58 to 0.68, and leaves a-peak@32 unchanged.
OBJECTIVES = ("weighted_squared_error", "squared_error", "rank_pairwise", "rank_ndcg")
_MIN_WEIGHT = 0.05


class CostModel(abc.ABC):
    """Scores candidates, higher = predicted faster, from one float feature row each.

    ``update`` takes measured mean seconds per candidate, ``inf`` for one that failed.
    Feature rows may hold NaN for a feature that does not apply to a candidate; the column
    count is fixed by the first update. Scores are comparable within one model only.
    ``load`` restores, into a model built with the same options, the state ``save`` wrote:
    one JSON document, never a pickle (``load`` raises ``ValueError`` for a file of
    another format or another kind of model).
    """

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """How many measured candidates the model has been given."""

    @property
    def is_trained(self) -> bool:
        """Whether its scores say anything yet (a warm-up model's are random)."""
        return True

    @abc.abstractmethod
    def update(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Add measured candidates and retrain if the model decides it is time."""

    def update_from_file(self, log: str | os.PathLike) -> None:
        """Ansor's spelling: learn from the records of ``log``. Features come from a task's
        sketches, so the records are read when a ``SketchPolicy`` adopts this model."""
        self.pending_logs = getattr(self, "pending_logs", []) + [log]

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """One float64 score per row, higher = predicted faster."""

    @abc.abstractmethod
    def save(self, path: str | os.PathLike) -> None:
        """Write the model's state to a JSON file."""

    @abc.abstractmethod
    def load(self, path: str | os.PathLike) -> None:
        """Replace the model's state with the one ``save`` wrote to ``path``."""


class RandomModel(CostModel):
    """Uniform random scores in [0, 1), the same sequence for the same seed: random search.

    It never learns (``is_trained`` is False) and only counts what ``update`` gives it.

    Args:
        seed: Seed of the scores.
    """

    name = "random"

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)
        self._num_samples = 0

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def is_trained(self) -> bool:
        return False

    def update(self, features: np.ndarray, costs: np.ndarray) -> None:
        features, costs = _as_batch(features, costs, None)
        self._num_samples += len(costs)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self._rng.random(len(_as_features(features, None)))

    def save(self, path: str | os.PathLike) -> None:
        _write_document(path, self.name, self._state())

    def load(self, path: str | os.PathLike) -> None:
        self._restore(_read_document(path, self.name))

    def _state(self) -> dict:
        return {"num_samples": self._num_samples, "rng": self._rng.bit_generator.state}

    def _restore(self, state: dict) -> None:
        self._num_samples = int(state["num_samples"])
        self._rng.bit_generator.state = state["rng"]


class _BoostedTreesModel(CostModel):
    """Data, warm-up and adaptive retraining shared by the XGBoost and LightGBM models.

    Invariants: ``_features``, ``_costs`` and ``_groups`` hold every row given to
    ``update``, in order; ``_booster`` is None until the first update that brings
    ``num_samples`` to ``num_warmup_sample`` or more with at least one success, and until
    then ``predict`` returns random scores. Every training starts from scratch on all rows
    (labels are relative to the best cost so far, which moves); with ``adaptive_training``
    the next one waits until the data has grown by 20%. Continuing the old booster for a
    few rounds in between was measured not to find faster programs, at 40% more model time.
    Rows of several tasks (``groups``) are labelled relative to their own task's best.
    """

    name: str

    def __init__(self, num_warmup_sample: int, adaptive_training: bool, seed: int,
                 nthread: int | None, objective: str, num_boost_round: int):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if num_boost_round < 1:
            raise ValueError(f"num_boost_round must be at least 1, got {num_boost_round}")
        self.num_warmup_sample = num_warmup_sample
        self.adaptive_training = adaptive_training
        # Ansor trains on half the cores, leaving the rest to the builders and runner.
        self.nthread = nthread if nthread is not None else max(1, _available_cores() // 2)
        self.objective = objective
        self.num_boost_round = num_boost_round
        self._random = RandomModel(seed)
        self._features: np.ndarray | None = None
        self._costs = np.empty(0)
        self._groups = np.empty(0, dtype=np.int64)
        self._booster: Any = None
        self._trained_rows = 0
        self._num_trainings = 0
        self._deferred = False

    @property
    def num_samples(self) -> int:
        return len(self._costs)

    @property
    def num_trainings(self) -> int:
        """How many times a booster was trained (each time from scratch, on all rows)."""
        return self._num_trainings

    @property
    def is_trained(self) -> bool:
        """Whether predictions come from the trees rather than the random warm-up model."""
        return self._booster is not None

    def update(self, features: np.ndarray, costs: np.ndarray, group: int = 0) -> None:
        """Add measured candidates and retrain if it is time; ``group``: the task the rows
        belong to, when one model learns several (labels are relative to each task's best)."""
        features, costs = _as_batch(features, costs, self._num_features())
        if len(costs) == 0:
            return
        self._features = features if self._features is None else np.concatenate([self._features, features])
        self._costs = np.concatenate([self._costs, costs])
        self._groups = np.concatenate([self._groups, np.full(len(costs), group, dtype=np.int64)])
        if not self._deferred and self._is_time_to_train():
            self._retrain()

    @contextlib.contextmanager
    def training_deferred(self) -> Iterator[None]:
        """Train once, at the end, on the rows given inside (nothing may predict there):
        teaching other tasks' records one task at a time trained a booster for each."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False
            if self._warmed_up():
                self._retrain()

    def widen(self, num_features: int) -> None:
        """Take rows of ``num_features`` columns from now on; the rows so far get NaN
        (missing) in the new ones, and a trained model is retrained on them."""
        if self._features is None or num_features == self._features.shape[1]:
            return
        if num_features < self._features.shape[1]:
            raise ValueError(f"a model can only widen: it has {self._features.shape[1]} columns, "
                             f"asked for {num_features}")
        extra = np.full((len(self._features), num_features - self._features.shape[1]), np.nan, dtype=np.float32)
        self._features = np.concatenate([self._features, extra], axis=1)
        if self._booster is not None and not self._deferred:
            self._retrain()

    def _retrain(self) -> None:
        throughput = np.zeros_like(self._costs)
        for group in np.unique(self._groups):
            rows = self._groups == group
            throughput[rows] = normalized_throughput(self._costs[rows])
        self._booster = self._train(self._features, throughput, self._groups)
        self._trained_rows = self.num_samples
        self._num_trainings += 1

    def _warmed_up(self) -> bool:
        """Enough rows to leave the random warm-up model, one of them a success."""
        return self.num_samples >= self.num_warmup_sample and bool(np.isfinite(self._costs).any())

    def _is_time_to_train(self) -> bool:
        if not self._warmed_up():
            return False
        if self._booster is None or not self.adaptive_training:
            return True
        return 5 * (self.num_samples - self._trained_rows) >= self._trained_rows

    def predict(self, features: np.ndarray) -> np.ndarray:
        features = _as_features(features, self._num_features())
        if self._booster is None:
            return self._random.predict(features)
        if len(features) == 0:
            return np.empty(0)
        return np.asarray(self._score(features), dtype=np.float64)

    def _num_features(self) -> int | None:
        return None if self._features is None else self._features.shape[1]

    def _label_and_weight(self, throughput: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The training label and row weight (None: all rows equal) for the objective."""
        if self.objective == "weighted_squared_error":
            return throughput, np.maximum(throughput, _MIN_WEIGHT)
        if self.objective == "rank_ndcg":
            # NDCG needs integer relevance levels; 0..30 on a log scale, 5 levels per halving.
            return np.ceil(np.clip(30 + 5 * np.log2(np.maximum(throughput, 2.0 ** -7)), 0, 30)), None
        return throughput, None

    @abc.abstractmethod
    def _train(self, features: np.ndarray, throughput: np.ndarray, groups: np.ndarray) -> Any:
        """A new booster trained on all rows (a ranking objective compares rows within a group)."""

    @abc.abstractmethod
    def _score(self, features: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def _booster_to_json(self) -> Any: ...

    @abc.abstractmethod
    def _booster_from_json(self, value: Any) -> Any: ...

    def save(self, path: str | os.PathLike) -> None:
        _write_document(path, self.name, self._state())

    def load(self, path: str | os.PathLike) -> None:
        self._restore(_read_document(path, self.name))

    def _state(self) -> dict:
        return {
            "objective": self.objective, "trained_rows": self._trained_rows,
            "num_trainings": self._num_trainings,
            "features": None if self._features is None else _array_to_json(self._features),
            "costs": _array_to_json(self._costs),
            "groups": _array_to_json(self._groups),
            "random": self._random._state(),
            "booster": None if self._booster is None else self._booster_to_json(),
        }

    def _restore(self, document: dict) -> None:
        if document["objective"] != self.objective:
            raise ValueError(f"the saved model was trained with objective {document['objective']!r}, "
                             f"this one uses {self.objective!r}; build it with objective={document['objective']!r}")
        self._features = None if document["features"] is None else _array_from_json(document["features"])
        self._costs = _array_from_json(document["costs"])
        self._groups = (_array_from_json(document["groups"]) if "groups" in document
                        else np.zeros(len(self._costs), dtype=np.int64))
        self._trained_rows = int(document["trained_rows"])
        self._num_trainings = int(document["num_trainings"])
        self._random._restore(document["random"])
        booster = document["booster"]
        self._booster = None if booster is None else self._booster_from_json(booster)


class XGBModel(_BoostedTreesModel):
    """Ansor's cost model: gradient-boosted trees trained with XGBoost.

    The label is the normalised throughput (the best cost seen over each cost); until
    ``num_warmup_sample`` measurements, one of them a success, the scores are random.
    Every training starts from scratch on all rows. With eta 0.2 and gamma 0.001 the
    trees stop splitting within about 30 rounds: 50 and 100 rounds ranked the synthetic
    tasks exactly as 30 did, 10 rounds lost 0.07 of Spearman rho.

    Args:
        num_warmup_sample: Measurements before the first training.
        adaptive_training: Retrain only once the rows have grown by 20% since the last
            training (TVM #7197); otherwise after every update.
        seed: Seed of the trees and of the warm-up's random scores.
        nthread: Training threads; None for half the available cores, at least one.
        params: Entries that override ``XGB_PARAMS``, passed to XGBoost unchanged.
        objective: One of ``OBJECTIVES`` (the measurements behind the default are beside
            their definition).
        num_boost_round: Boosting rounds per training.

    Raises:
        ValueError: If ``objective`` is unknown or ``num_boost_round`` is below 1; from
            ``update`` and ``predict``, for features that are not a 2-D array of the
            model's column count or that hold inf, or costs that are not positive seconds
            (inf for a failure).
    """

    name = "xgb"

    def __init__(self, num_warmup_sample: int = 100, adaptive_training: bool = True, seed: int = 43,
                 nthread: int | None = None, params: Mapping[str, Any] | None = None,
                 objective: str = OBJECTIVES[0], num_boost_round: int = 30):
        super().__init__(num_warmup_sample, adaptive_training, seed, nthread, objective, num_boost_round)
        self.params = {**XGB_PARAMS, "seed": seed, "nthread": self.nthread, **(params or {})}

    def _train(self, features: np.ndarray, throughput: np.ndarray, groups: np.ndarray) -> Any:
        import xgboost as xgb

        label, weight = self._label_and_weight(throughput)
        objectives = {"rank_pairwise": "rank:pairwise", "rank_ndcg": "rank:ndcg"}
        params = {**self.params, "objective": objectives.get(self.objective, "reg:squarederror")}
        qid = None
        if self.objective in objectives:  # a task is one query: every pair of its rows compares
            order = np.argsort(groups, kind="stable")  # XGBoost wants the rows of a query together
            features, label, qid = features[order], label[order], groups[order]
        data = xgb.DMatrix(features, label=label, weight=weight, qid=qid, nthread=self.nthread)
        return xgb.train(params, data, num_boost_round=self.num_boost_round)

    def _score(self, features: np.ndarray) -> np.ndarray:
        return self._booster.inplace_predict(features)

    def _booster_to_json(self) -> Any:
        return json.loads(bytes(self._booster.save_raw(raw_format="json")))

    def _booster_from_json(self, value: Any) -> Any:
        import xgboost as xgb

        booster = xgb.Booster(params={"nthread": self.nthread})
        booster.load_model(bytearray(json.dumps(value).encode()))
        return booster


class LightGBMModel(_BoostedTreesModel):
    """The same model trained with LightGBM (``pip install 'tilecraft[lightgbm]'``).

    Takes the arguments of ``XGBModel``, except that ``params`` overrides entries of
    ``LIGHTGBM_PARAMS``. LightGBM has no plain pairwise loss, so ``rank_pairwise`` is
    refused; ``rank_ndcg`` is LambdaRank.

    Raises:
        ImportError: If the lightgbm package is not installed.
        ValueError: If ``objective`` is ``"rank_pairwise"`` or unknown, or as ``XGBModel``.
    """

    name = "lightgbm"

    def __init__(self, num_warmup_sample: int = 100, adaptive_training: bool = True, seed: int = 43,
                 nthread: int | None = None, params: Mapping[str, Any] | None = None,
                 objective: str = OBJECTIVES[0], num_boost_round: int = 30):
        _import_lightgbm()
        if objective == "rank_pairwise":
            raise ValueError("LightGBM has no pairwise ranking objective; use objective='rank_ndcg' "
                             "or the XGBoost model")
        super().__init__(num_warmup_sample, adaptive_training, seed, nthread, objective, num_boost_round)
        self.params = {**LIGHTGBM_PARAMS, "seed": seed, "num_threads": self.nthread,
                       "deterministic": True, **(params or {})}

    def _train(self, features: np.ndarray, throughput: np.ndarray, groups: np.ndarray) -> Any:
        lgb = _import_lightgbm()
        label, weight = self._label_and_weight(throughput)
        is_ranking = self.objective == "rank_ndcg"
        params = {**self.params, "objective": "lambdarank" if is_ranking else "regression"}
        sizes = None
        if is_ranking:  # a task is one query, its rows together
            order = np.argsort(groups, kind="stable")
            features, label, sizes = features[order], label[order], np.unique(groups, return_counts=True)[1]
        data = lgb.Dataset(features, label=label, weight=weight, group=sizes, params={"verbosity": -1})
        return lgb.train(params, data, num_boost_round=self.num_boost_round)

    def _score(self, features: np.ndarray) -> np.ndarray:
        return self._booster.predict(features, num_threads=self.nthread)

    def _booster_to_json(self) -> Any:
        return self._booster.model_to_string()

    def _booster_from_json(self, value: Any) -> Any:
        return _import_lightgbm().Booster(model_str=value)


_MODELS = {"xgb": XGBModel, "lightgbm": LightGBMModel, "random": RandomModel}


def make_cost_model(name: str, **options: Any) -> CostModel:
    """The cost model called ``name`` ("xgb", "lightgbm" or "random"), built with ``options``."""
    if name not in _MODELS:
        raise ValueError(f"unknown cost model {name!r}; choose one of {', '.join(_MODELS)}")
    return _MODELS[name](**options)


def _import_lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError as error:
        raise ImportError("LightGBMModel needs the lightgbm package: pip install 'tilecraft[lightgbm]'") from error
    return lightgbm


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _as_features(features: np.ndarray, num_features: int | None) -> np.ndarray:
    features = np.ascontiguousarray(features, dtype=np.float32)
    if features.ndim != 2:
        raise ValueError(f"features must be a 2-D array (candidates x features), got shape {features.shape}")
    if num_features is not None and features.shape[1] != num_features:
        raise ValueError(f"features have {features.shape[1]} columns; this model was given {num_features} before")
    if np.isinf(features).any():
        raise ValueError("features contain inf; use NaN for a feature that does not apply")
    return features


def _as_batch(features: np.ndarray, costs: np.ndarray, num_features: int | None) -> tuple[np.ndarray, np.ndarray]:
    features = _as_features(features, num_features)
    costs = np.asarray(costs, dtype=np.float64)
    if costs.shape != (len(features),):
        raise ValueError(f"costs must be 1-D with one entry per feature row ({len(features)}), got shape {costs.shape}")
    if np.isnan(costs).any() or (costs <= 0).any():
        raise ValueError("costs must be positive seconds, or inf for a failed candidate; got NaN or <= 0")
    return features, costs


def _array_to_json(array: np.ndarray) -> dict:
    little_endian = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": little_endian.dtype.str, "shape": list(array.shape),
            "base64": base64.b64encode(little_endian.tobytes()).decode("ascii")}


def _array_from_json(value: dict) -> np.ndarray:
    stored = np.dtype(value["dtype"])
    raw = np.frombuffer(base64.b64decode(value["base64"]), dtype=stored)
    return raw.reshape(value["shape"]).astype(stored.newbyteorder("="))


def _write_document(path: str | os.PathLike, name: str, state: dict) -> None:
    Path(path).write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "model": name, **state}))


def _read_document(path: str | os.PathLike, name: str) -> dict:
    document = json.loads(Path(path).read_text())
    header = (document.get("format"), document.get("version")) if isinstance(document, dict) else None
    if header != (FORMAT, FORMAT_VERSION):
        raise ValueError(f"{path} is not a {FORMAT} version {FORMAT_VERSION} file (format, version: {header})")
    if document["model"] != name:
        raise ValueError(f"{path} holds a {document['model']!r} model, not {name!r}; "
                         f"load it with make_cost_model({document['model']!r})")
    return document
