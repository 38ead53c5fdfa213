"""One cost model learned across the tasks of a model, as Ansor's task scheduler shares one.

A task alone has a random cost model until it has ~100 measurements, so when a network's
tasks get one or two rounds each, most of their trials are spent before their model knows
anything. Shared, the model has seen the other tasks by then: ResNet-50's convolutions
differ in shape, not in which tilings pay.

Rows of every task live in one feature space: a feature keeps its name across tasks (the
log2 tile factors of a convolution's ``y`` loop mean the same in every convolution), and
each task adds what tells it apart, the log2 extent of every loop of every stage and its
FLOPs. A column is named by the stage's role, not its name (``stage_roles``): a registered
operator calls its convolution ``conv2d`` and a model's fused task ``conv2d_nhwc_0``, and
by name the default database's convolutions would teach a model's nothing. A reduction's
role carries its kind (``reduction_kind``), so dense, whose loops are matmul's, is not
taught matmul's tilings; a task of a kind no rows taught scores at random until its own
(and ``transfer_model`` refuses to teach a task alone rows of none of its kinds).
Each task sees the model through a ``CostModel`` view that places its columns; labels are
normalised within each task (its best is 1), so tasks of different speeds mix.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..te.expr import free_vars
from .access import reads_of
from .cost_model import CostModel, RandomModel, XGBModel, _BoostedTreesModel, _read_document, _write_document


class SharedCostModel:
    """Pass it as ``program_cost_model`` to the ``SketchPolicy`` of every task that shares it.

    The default ``XGBModel`` retrains after every update: rows arrive a round of one task
    at a time, and waiting for 20% more rows (adaptive training) would keep a task's own
    measurements out of its model for many rounds once thousands are in.

    Rows of every task live in one feature space, a feature keeping its name across tasks
    (see this module's docstring); labels are normalised within each task. ``TaskScheduler``
    makes one for its tasks, and ``transfer_model`` returns one taught other workloads'
    records.

    Args:
        model: The model underneath, an ``XGBModel`` or ``LightGBMModel``; None for an
            ``XGBModel`` without adaptive training.

    Example:
        ::

            shared = SharedCostModel()
            policies = [tc.SketchPolicy(task, shared) for task in tasks]
    """

    def __init__(self, model: _BoostedTreesModel | None = None):
        self.model = model if model is not None else XGBModel(adaptive_training=False)
        self.columns: dict[str, int] = {}
        self.groups: dict[str, int] = {}  # workload key -> the task's group in the model
        self.taught_kinds: set[str] = set()  # the reductions (by role and kind) rows were given of

    def view(self, task, feature_names: list[str]) -> TaskCostModel:
        """The model as ``task`` sees it, its candidates described by ``feature_names``."""
        group = self.groups.setdefault(task.workload_key, len(self.groups))
        descriptor = task_descriptor(task.compute_dag)
        by_role = role_namer(task.compute_dag)
        positions = np.array([self._column(by_role(name)) for name in feature_names], dtype=np.int64)
        described = np.array([self._column(name) for name in descriptor], dtype=np.int64)
        self.model.widen(len(self.columns))
        return TaskCostModel(self, group, positions, described, np.array(list(descriptor.values())),
                             reduction_roles(task.compute_dag))

    def save(self, path: str | os.PathLike) -> None:
        """Every task's rows and where they sit: the columns, the tasks' groups, the kinds taught."""
        layout = {"columns": self.columns, "groups": self.groups, "taught_kinds": sorted(self.taught_kinds)}
        _write_document(path, self.model.name, {**self.model._state(), "layout": layout})

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote, before the tasks' policies are made (or after, the
        same tasks made in the same order: their columns must be where they were).

        Raises:
            ValueError: If the file is not a saved model of this kind, holds one task's
                model, or placed its columns or tasks otherwise than this model has.
        """
        document = _read_document(path, self.model.name)
        layout = document.get("layout")
        if layout is None:
            raise ValueError(f"{path} holds one task's cost model, not a shared one; load it into an XGBModel")
        for mine, saved, what in ((self.columns, layout["columns"], "columns"),
                                  (self.groups, layout["groups"], "tasks")):
            if any(saved.get(key) != value for key, value in mine.items()):
                raise ValueError(f"{path} placed its {what} otherwise than this model does; "
                                 f"load it before making the tasks' policies")
        self.model._restore(document)
        self.columns.update(layout["columns"])
        self.groups.update(layout["groups"])
        self.taught_kinds |= set(layout["taught_kinds"])

    def _column(self, name: str) -> int:
        return self.columns.setdefault(name, len(self.columns))


class TaskCostModel(CostModel):
    """One task's view of a ``SharedCostModel``: its rows placed in the shared columns."""

    def __init__(self, shared: SharedCostModel, group: int, positions: np.ndarray, described: np.ndarray,
                 descriptor: np.ndarray, kinds: set[str]):
        self.shared, self.group, self.kinds = shared, group, kinds
        self.positions, self.described, self.descriptor = positions, described, descriptor
        self.warm_up = RandomModel(group)

    @property
    def num_samples(self) -> int:
        return self.shared.model.num_samples

    @property
    def is_trained(self) -> bool:
        """Trained, and on a reduction of this task's kind (or it has none). Taught only
        other kinds, the model ranks by the columns they share, and ranked dense's records
        worse than at random; until the task's own rows arrive its scores are random."""
        return self.shared.model.is_trained and (not self.kinds or bool(self.kinds & self.shared.taught_kinds))

    def update(self, features: np.ndarray, costs: np.ndarray) -> None:
        self.shared.taught_kinds |= self.kinds
        self.shared.model.update(self._placed(features), costs, group=self.group)

    def predict(self, features: np.ndarray) -> np.ndarray:
        placed = self._placed(features)
        return self.shared.model.predict(placed) if self.is_trained else self.warm_up.predict(placed)

    def save(self, path: str | os.PathLike) -> None:
        self.shared.save(path)

    def load(self, path: str | os.PathLike) -> None:
        self.shared.load(path)

    def _placed(self, features: np.ndarray) -> np.ndarray:
        features = np.asarray(features, dtype=np.float32)
        if features.ndim != 2 or features.shape[1] != len(self.positions):
            raise ValueError(f"features must have {len(self.positions)} columns (this task's feature names), "
                             f"got shape {features.shape}")
        placed = np.full((len(features), len(self.shared.columns)), np.nan, dtype=np.float32)
        placed[:, self.positions] = features
        placed[:, self.described] = self.descriptor
        return placed


def task_descriptor(dag) -> dict[str, float]:
    """What tells a task apart: log2 FLOPs, and the log2 extent of each loop of each stage
    (named by its role)."""
    roles = stage_roles(dag)
    described = {"task.log2_flop": math.log2(max(dag.flop_count(), 1.0))}
    for tensor in dag.compute_ops:
        for axis in (*tensor.op.axis, *tensor.op.reduce_axis):
            described[f"{roles[tensor.name]}.{axis.var.name}.extent"] = math.log2(axis.extent)
    return described


def stage_roles(dag) -> dict[str, str]:
    """Each compute stage's name -> its role, alike in every task of a kind: the reductions
    in order, with their kind ("reduce0[i.k,k.j]", ...), the stages before the first
    ("in0", ...: padding) and the others ("out0", ...: the fused element-wise tail)."""
    roles, counts = {}, {"in": 0, "reduce": 0, "out": 0}
    reduces = any(tensor.op.reduce_axis for tensor in dag.compute_ops)
    for tensor in dag.compute_ops:
        role = "reduce" if tensor.op.reduce_axis else "in" if reduces and not counts["reduce"] else "out"
        kind = f"[{reduction_kind(tensor.op)}]" if role == "reduce" else ""
        roles[tensor.name] = f"{role}{counts[role]}{kind}"
        counts[role] += 1
    return roles


def reduction_roles(dag) -> set[str]:
    """The roles of ``dag``'s reductions, their kinds in them ("reduce0[i.k,k.j]")."""
    return {role for role in stage_roles(dag).values() if role.startswith("reduce")}


def reduction_kind(op) -> str:
    """Which loops walk the two innermost dimensions of each read ("i.k,k.j"). They decide
    which tilings vectorise and stay in cache, so reductions alike in them teach each
    other: a batch loop outside leaves batch_matmul matmul's kind, while dense, which reads
    its weights across ``k``, is not (taught by matmul, its search ended 3% behind; apart,
    3% ahead)."""
    return ",".join(".".join("+".join(sorted(v.name for v in free_vars(index))) for index in read.indices[-2:])
                    for read in reads_of(op))


def role_namer(dag):
    """A function that renames a feature of ``dag``'s candidates by its stages' roles, in a
    sketch's name too ("sketch=inline(relu_2) tile" -> "sketch=inline(out1) tile")."""
    roles = stage_roles(dag)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(roles, key=len, reverse=True))) + r")(?!\w)")
    return lambda name: pattern.sub(lambda found: roles[found.group(1)], name)
