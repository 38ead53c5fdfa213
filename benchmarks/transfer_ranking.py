"""How well a cost model taught only other workloads' records ranks a task's candidates
before its first measurement: the donors' records of the task's target alone, against
those with every donor workload the target lacks lent by its nearest target.

    python benchmarks/transfer_ranking.py [--model resnet50]            # a model's tasks, this machine
    python benchmarks/transfer_ranking.py --log LOG [LOG ...] [--target TARGET]  # operator workloads
                                          [--donors DEFAULT] [--out FILE]

A taught model's worth is in the first rounds, before a task has measurements of its
own: there it alone decides which candidates are measured. So each task's records in the
log (measured by earlier searches) are ranked by the taught model, zero-shot: a-peak@32
(how fast the best of the first 32 measured in the model's order is), recall@16 and
Spearman's rho (``tilecraft/search/metrics.py``). A model's tasks share one taught model,
as ``tilecraft tune-model``'s do; an operator gets its own, as ``tilecraft tune`` gives it
(never taught its own workload's records). No candidate is measured, so any target a log
holds can be ranked on any machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import load_records
from tilecraft.search.metrics import peak_at_k, rank_correlation, recall_at_k
from tilecraft.search.policy import SketchPolicy
from tilecraft.tune.transfer import DEFAULT_RECORDS, transfer_model
from tilecraft.tune.task import WORKLOADS

from ablation import model_tasks  # benchmarks/ablation.py, beside this script
from tables import numeric_table, print_table  # benchmarks/tables.py

MOST_RECORDS = 3000  # of a task, ranked
METRICS = {"peak@32": lambda s, c: peak_at_k(s, c, 32), "recall@16": lambda s, c: recall_at_k(s, c, 16),
           "rho": rank_correlation}


def own_target_log(donors: Path, target: tc.Target, directory: Path) -> Path:
    """The donors' records of ``target`` alone, as a log of their own."""
    path = directory / "own_target.json"
    path.write_text("".join(r.to_json_line() + "\n" for r in load_records(donors, target=target)))
    return path


def rank(policy: SketchPolicy, records: list) -> dict[str, float]:
    """The metrics of the model's ranking of the records a sketch of the task stands for."""
    located = [(candidate, record.mean_cost) for record, candidate in zip(records, policy.locate(records))
               if candidate is not None]
    candidates = [candidate for candidate, _ in located]
    scores = policy.model.predict(policy.features(candidates))
    costs = np.array([cost for _, cost in located])
    return {"records": len(candidates), **{name: float(metric(scores, costs)) for name, metric in METRICS.items()}}


def model_cases(name: str, log: Path, target: tc.Target, donors: dict[str, list[Path]], scratch: Path):
    """(task, its records, taught model per arm) for each task of model ``name`` with 32 records."""
    tasks, _ = model_tasks(name, scratch)
    own = records_by_workload(log, target)
    arms = {arm: transfer_model(taught_by, tasks) for arm, taught_by in donors.items()}
    return [(task, own[task.workload_key], arms) for task in tasks if len(own.get(task.workload_key, ())) >= 32]


def operator_cases(logs: list[Path], target: tc.Target, donors: dict[str, list[Path]]):
    """(task, its records, taught model per arm) for each registered workload ``logs`` hold on ``target``."""
    cases = []
    for records in (group for log in logs for group in records_by_workload(log, target).values()):
        workload = records[0].workload
        if workload and workload.get("func") in WORKLOADS and len(records) >= 32:
            task = tc.SearchTask(func=workload["func"], args=tuple(workload["args"]), target=target)
            try:
                cases.append((task, records,
                              {arm: transfer_model(taught_by, task) for arm, taught_by in donors.items()}))
            except ValueError as error:  # no donor of its kind: it tunes on a model of its own, not ranked here
                print(f"{workload['func']} {workload['args']}: {error}")
    return cases


def records_by_workload(log: Path, target: tc.Target, most: int = MOST_RECORDS) -> dict[str, list]:
    """Each workload's records on ``target``, a random ``most`` of them where there are more
    (ranking tens of thousands adds little and takes minutes)."""
    grouped: dict[str, list] = {}
    for record in load_records(log, target=target):
        grouped.setdefault(record.workload_key, []).append(record)
    rng = np.random.default_rng(0)
    return {key: records if len(records) <= most else [records[n] for n in
                                                       sorted(rng.choice(len(records), most, replace=False))]
            for key, records in grouped.items()}


def print_ranking(rows: list[dict], means: dict[str, dict[str, float]]) -> None:
    """Each task's metrics under each arm, then their means over the tasks."""
    table = numeric_table("task", "records", *(f"{arm}: {m}" for arm in means for m in METRICS))
    for row in rows:
        table.add_row(row["task"], str(row["own target"]["records"]),
                      *(f"{row[arm][m]:.3f}" for arm in means for m in METRICS))
    table.add_section()
    table.add_row("mean", "", *(f"{means[arm][m]:.3f}" for arm in means for m in METRICS))
    print_table(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="rank this model's tasks (unless --log names operators)")
    parser.add_argument("--log", type=Path, nargs="+", help="rank the operator workloads of these logs instead")
    parser.add_argument("--target", help="the target whose records are ranked (this machine's by default)")
    parser.add_argument("--donors", type=Path, default=DEFAULT_RECORDS, help="the log the models are taught")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "transfer_ranking.json")
    args = parser.parse_args()
    target = tc.Target(args.target) if args.target else tc.Target.host()
    with tempfile.TemporaryDirectory() as scratch:
        donors = {"own target": [own_target_log(args.donors, target, Path(scratch))],
                  "lent per workload": [args.donors]}
        if args.log:
            what, cases = ", ".join(log.name for log in args.log), operator_cases(args.log, target, donors)
        else:
            log = Path(__file__).parent / "records" / f"{args.model}.json.xz"
            what, cases = args.model, model_cases(args.model, log, target, donors, Path(scratch))
        if not cases:
            raise SystemExit(f"{what} holds fewer than 32 records of every task on {target}: rank a log that "
                             f"measured them (benchmarks/models.py tunes a model on this machine)")
        print(f"{len(cases)} tasks of {what} with 32 or more records on {target}")
        rows = []
        for task, records, arms in cases:
            result = {arm: rank(SketchPolicy(task, model), records) for arm, model in arms.items()}
            rows.append({"task": task.desc or task.workload_key, **result})
            print(f"  {rows[-1]['task']}: ranked", flush=True)
    means = {arm: {m: float(np.nanmean([row[arm][m] for row in rows])) for m in METRICS} for arm in donors}
    print_ranking(rows, means)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"ranked": what, "machine": platform.processor() or platform.machine(),
                                    "target": str(target), "tasks": rows, "means": means}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
