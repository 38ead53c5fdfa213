"""benchmarks/transfer_ranking.py: a taught model's zero-shot ranking of a workload's records."""

import sys
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database.record import TuningRecord, trace_key
from tilecraft.search.evolution import Candidate
from tilecraft.search.features import feature_names
from tilecraft.search.policy import SketchPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import transfer_ranking  # noqa: E402

INNERMOST = "matmul.j.t3"


def _log(path: Path, task, count: int, seed: int) -> None:
    """``count`` of ``task``'s candidates at a made-up cost: bigger innermost tiles are faster."""
    policy = SketchPolicy(task)
    sketch = next(n for n, s in enumerate(policy.sketches) if INNERMOST in feature_names(s))
    rows = policy.sketches[sketch].sample_uniform(np.random.default_rng(seed), count)
    candidates = [Candidate(sketch, tuple(int(v) for v in row)) for row in rows]
    innermost = policy.features(candidates)[:, policy.feature_space.names.index(INNERMOST)]
    with open(path, "a") as file:
        for candidate, tile in zip(candidates, innermost):
            record = TuningRecord(task.workload_key, task.workload, str(task.target),
                                  trace_key(policy.trace_of(candidate)), (1e-3 / (1 + tile),), "none", "", 0.1, 0.0,
                                  task.compute_dag.flop_count(), None)
            file.write(record.to_json_line() + "\n")


def test_a_model_taught_another_workload_ranks_the_records_it_never_saw(tmp_path):
    target = tc.Target.host()
    donors, ranked = tmp_path / "donors.json", tmp_path / "ranked.json"
    _log(donors, tc.SearchTask(func="matmul", args=(64, 32, 32), target=target), 160, seed=0)
    _log(ranked, tc.SearchTask(func="matmul", args=(32, 32, 64), target=target), 48, seed=1)
    cases = transfer_ranking.operator_cases([ranked], target, {"taught": [donors]})
    assert len(cases) == 1
    task, records, models = cases[0]
    result = transfer_ranking.rank(SketchPolicy(task, models["taught"]), records)
    assert result["records"] == 48 and result["rho"] > 0.5 and result["peak@32"] > 0.9
