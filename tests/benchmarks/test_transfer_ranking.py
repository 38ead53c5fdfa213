"""benchmarks/transfer_ranking.py: a taught model's zero-shot ranking of a workload's records."""

import sys
from pathlib import Path

import tilecraft as tc
from tilecraft.search.policy import SketchPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import transfer_ranking  # noqa: E402


def test_a_model_taught_another_workload_ranks_the_records_it_never_saw(tmp_path, made_up_log):
    target = tc.Target.host()
    donors, ranked = tmp_path / "donors.json", tmp_path / "ranked.json"
    made_up_log(donors, tc.SearchTask(func="matmul", args=(64, 32, 32), target=target), 160, seed=0, failing_every=0)
    made_up_log(ranked, tc.SearchTask(func="matmul", args=(32, 32, 64), target=target), 48, seed=1, failing_every=0)
    cases = transfer_ranking.operator_cases([ranked], target, {"taught": [donors]})
    assert len(cases) == 1
    task, records, models = cases[0]
    result = transfer_ranking.rank(SketchPolicy(task, models["taught"]), records)
    assert result["records"] == 48 and result["rho"] > 0.5 and result["peak@32"] > 0.9
