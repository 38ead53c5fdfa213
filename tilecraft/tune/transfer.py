"""Transfer: a new task's cost model first taught what other workloads' logs measured.

A task's own cost model predicts at random until it has measured ~100 candidates, and
after that it knows only the basin its measurements came from: on ResNet-50's 3x3
convolution a search that collapsed into one register-tile shape ranked the record's ten
best programs 805th to 9,808th of 13,943. Operators tuned before on the same machine say
where fast programs lie (which tilings, register tiles and loop orders pay); a
``SharedCostModel`` keeps each feature's name across tasks, so their records teach the
new task's model before its first measurement. Ansor's ``update_from_file`` trains on
every record of a log for the same reason.

Only a sample of each workload's records is taught (``transfer_sample``): a whole log of
10,000s of rows would make every retraining of the model seconds long.

tilecraft ships such a sample as its default database (``DEFAULT_RECORDS``: ResNet-50's
convolutions, a 1024³ matmul, dense and batch_matmul, measured on a few x86 machines), so a
first tuning on a new machine starts from what those taught. A workload a log holds no
record of on the task's target lends those of its nearest target of the same ISA and
vector width: what pays (register tiles that fill the registers, loop orders) is set
mostly by the ISA, and the model ranks candidates within a task, not across machines.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..database.best import for_learning
from ..database.log import load_records
from ..database.record import TuningRecord, workload_label
from ..errors import TargetError
from ..target import Target
from ..search.policy import SketchPolicy
from ..search.shared_model import SharedCostModel, reduction_roles
from .task import WORKLOADS, SearchTask

TRANSFER_ROWS = 1024  # of each workload's records
#: The default database shipped with tilecraft: a tuning log (xz-compressed) of ResNet-50's convolutions, a 1024³
#: matmul, dense and batch_matmul measured on a few x86 machines, for ``transfer_model``.
DEFAULT_RECORDS = Path(__file__).resolve().parent.parent / "database" / "default_records.json.xz"


def transfer_sample(records: Sequence[TuningRecord], rows: int = TRANSFER_ROWS, seed: int = 0) -> list[TuningRecord]:
    """The fastest quarter of ``rows`` (where the search must aim) and a random sample of
    the rest, failures included (what it must avoid); all of them if there are fewer. The
    fastest are those first by the rule of ``database/best.py`` (re-measured ones first)."""
    records = for_learning(records)
    if len(records) <= rows:
        return records
    order = sorted(range(len(records)), key=lambda n: (records[n].phase != "final", records[n].cost))
    fastest, rest = order[:rows // 4], order[rows // 4:]
    sampled = np.random.default_rng(seed).choice(len(rest), size=rows - len(fastest), replace=False)
    return [records[n] for n in fastest] + [records[rest[n]] for n in sorted(sampled)]


def transfer_model(logs: Iterable[str | os.PathLike], task: SearchTask | Sequence[SearchTask],
                   rows: int = TRANSFER_ROWS, model: SharedCostModel | None = None) -> SharedCostModel:
    """A cost model for ``task`` (pass it to its ``SketchPolicy``), or a model's tasks (a list,
    for their ``TaskScheduler``), first taught a sample of the records of every other
    registered workload that ``logs`` hold for their target, or its nearest target's
    (``nearest_records``). Their own records are not taught: resume from them (``resume_from``).

    A new task's own model predicts at random until it has measured ~100 candidates;
    taught what other workloads measured on the same kind of machine, it ranks the first
    round's candidates. Only a sample of each workload's records is taught
    (``transfer_sample``), so retraining stays fast.

    Args:
        logs: Tuning logs to learn from, e.g. ``[tc.DEFAULT_RECORDS]``.
        task: A task, or a list of the tasks of a model (the target of the first is used).
        rows: How many records of each workload to teach.
        model: A ``SharedCostModel`` to teach further; None for a new one.

    Returns:
        The taught ``SharedCostModel``.

    Raises:
        ValueError: Naming the logs, if one is missing, or none holds a record it can learn
            from: of another registered workload, on the target's ISA, of a kind of
            reduction a task has (``reduction_kind``). Taught only other kinds, dense
            reached the untaught search's final in 0.60 of the trials, on its own in 0.31.

    Example:
        ::

            model = tc.transfer_model([tc.DEFAULT_RECORDS], task)
            task.tune(options, search_policy=tc.SketchPolicy(task, model))
    """
    logs, tasks = [str(log) for log in logs], list(task) if isinstance(task, Sequence) else [task]
    missing = [log for log in logs if not Path(log).is_file()]
    if missing:
        raise ValueError(f"cannot transfer from {', '.join(missing)}: no such file; name tuning logs (JSON lines)")
    own = {t.workload_key for t in tasks}
    by_workload: dict[str, list[TuningRecord]] = {}
    for log in logs:
        for record in nearest_records(log, tasks[0].target):
            if record.workload_key not in own:
                by_workload.setdefault(record.workload_key, []).append(record)
    donors, unknown = [], []
    for records in by_workload.values():
        workload = records[0].workload
        if not workload or workload.get("func") not in WORKLOADS:
            unknown.append(workload_label(records[0].workload_key, workload))
            continue
        donor = SearchTask(func=workload["func"], args=tuple(workload["args"]), target=tasks[0].target)
        donors.append((donor, transfer_sample(records, rows)))
    if not donors:
        why = (f"only workloads it cannot rebuild ({', '.join(unknown[:3])}: register their functions with "
               f"@tc.register_workload first)" if unknown
               else f"no record of another workload on {tasks[0].target} or another target of its ISA")
        raise ValueError(f"nothing to transfer from {', '.join(logs)}: {why}")
    model = model if model is not None else SharedCostModel()
    taught = model.taught_kinds.union(*(reduction_roles(donor.compute_dag) for donor, _ in donors))
    kinds = [reduction_roles(t.compute_dag) for t in tasks]
    if all(k and not k & taught for k in kinds):
        raise ValueError(f"nothing to transfer from {', '.join(logs)}: no record of a reduction of the kind "
                         f"{' or '.join(sorted(set().union(*kinds)))}; tune it on a cost model of its own")
    with model.model.training_deferred():
        for donor, sample in donors:
            SketchPolicy(donor, model).preload(sample, mark_measured=False)
    return model


def nearest_records(log: str | os.PathLike, target: Target) -> list[TuningRecord]:
    """Per workload, the records ``log`` holds for ``target``; for a workload it holds none
    of there, those of its nearest target with the same ISA and vector width (by cores and
    cache sizes, in factors of two), or for a GPU of the same arch (by SMs and L2); none of
    a workload no such target measured."""
    by_workload: dict[str, dict[str, list[TuningRecord]]] = {}
    for record in load_records(log):
        by_workload.setdefault(record.workload_key, {}).setdefault(record.target, []).append(record)
    own, lent = str(target), []
    for by_target in by_workload.values():
        if own in by_target:
            lent += by_target[own]
            continue
        alike = {name: t for name in by_target if (t := _parsed(name)) and _alike(t, target)}
        if alike:
            lent += by_target[min(alike, key=lambda name: _distance(alike[name], target))]
    return lent


def _alike(other, target) -> bool:
    """CPUs of one ISA and vector width; GPUs of one arch."""
    if other.kind != target.kind:
        return False
    if target.kind == "cuda":
        return other.arch == target.arch
    return (other.isa, other.vector_bytes) == (target.isa, target.vector_bytes)


def _distance(other, target) -> float:
    sizes = ("sm_count", "l2_bytes") if target.kind == "cuda" else ("num_cores", "l1_bytes", "l2_bytes", "l3_bytes")
    return sum(abs(math.log2(getattr(other, size) / getattr(target, size))) for size in sizes)


def _parsed(name: str) -> Target | None:
    """The target a record names; None for one this tilecraft cannot read (a newer field)."""
    try:
        return Target(name)
    except TargetError:
        return None
