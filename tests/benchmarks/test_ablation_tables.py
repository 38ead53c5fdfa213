"""The ablation's summary: the shares the faster-search claims rest on, and its command line."""

import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.database.record import TuningRecord, trace_key
from tilecraft.measure import LocalRunner
from tilecraft.search.default import default_schedule
from tilecraft.search.policy import SketchPolicy
from tilecraft.search.shared_model import SharedCostModel

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import ablation  # noqa: E402  (benchmarks/ablation.py, beside its archive module)

TRIALS = 10


def run(arm: str, best: list[float], seconds_per_trial: float = 1.0) -> dict:
    return {"arm": arm, "seed": 0, "best_gflops": best, "seconds": list(np.cumsum([seconds_per_trial] * len(best)))}


def _cells(line: str) -> list[str]:
    """The cells of a row of a printed table: the text between wide gaps (a cell may hold single spaces)."""
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def _table(said: str, title: str) -> list[list[str]]:
    """The rows, as cells, of the first table printed under the line that starts with ``title``:
    those after the rule under its header, up to the first line that is not a row."""
    lines = said.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(title))
    rule = next(n for n in range(start, len(lines)) if lines[n].startswith("─"))
    rows = []
    for line in lines[rule + 1:]:
        if not line.startswith(" ") or not line.strip():
            break
        rows.append(_cells(line))
    return rows


def runs() -> list[dict]:
    return [
        run("baseline", [50, 60, 70, 80, 90, 95, 99, 99, 99, 100]),
        run("both", [60, 80, 95, 99.5, 100, 100, 100, 100, 100, 101], seconds_per_trial=2.0),
        run("bandit", [40, 50, 60, 70, 80, 98, 98, 98, 98, 98]),
    ]


def test_shares_count_the_trials_and_time_to_the_baselines_final_mean_and_to_within_one_percent():
    table = ablation.summarise(runs(), TRIALS)
    base, both, bandit = table["baseline"], table["both"], table["bandit"]
    assert (base["trials_to_baseline_best"], base["trial_share"], base["time_share"]) == (10, 1.0, 1.0)
    assert (base["trials_to_near_baseline"], base["near_trial_share"]) == (7, 0.7)
    # "both" reaches 100 at trial 5 but spends two seconds a trial: half the trials, the same time.
    assert (both["trials_to_baseline_best"], both["trial_share"], both["time_share"]) == (5, 0.5, 1.0)
    assert (both["trials_to_near_baseline"], both["near_trial_share"], both["near_time_share"]) == (4, 0.4, 0.8)
    assert bandit["trials_to_baseline_best"] is None and bandit["trial_share"] is None
    assert bandit["trials_to_near_baseline"] is None  # 98 is not within 1% of 100
    assert (bandit["trials_to_steep"], bandit["steep_trial_share"]) == (6, 0.6)  # but within 3%
    assert both["final_gflops_mean"] == 101 and bandit["final_gflops_max"] == 98


def test_a_pace_is_the_trials_and_time_to_within_three_percent_over_the_baselines_own():
    table = ablation.summarise(runs() + [run("predictor", [50] * TRIALS)], TRIALS)
    assert (table["baseline"]["trial_pace"], table["baseline"]["time_pace"]) == (1.0, 1.0)
    # The baseline comes within 3% of its final (100) at trial 7, in 7 seconds; "both" at
    # trial 4, in 8 seconds: faster in trials, slower in time.
    assert table["both"]["trial_pace"] == pytest.approx(4 / 7) and table["both"]["time_pace"] == pytest.approx(8 / 7)
    assert table["bandit"]["trial_pace"] == pytest.approx(6 / 7)
    assert table["predictor"]["trial_pace"] == pytest.approx(10 / 7)  # never there: counted at the budget's end


def test_paces_are_taken_at_every_level_below_the_baselines_final():
    paced = ablation.paces_of(ablation.summarise(runs(), TRIALS))
    assert ablation.LEVELS == (0.85, 0.90, 0.95, ablation.STEEP)
    # The baseline is at 85% and 90% of its final (100) at trial 5, 95% at 6, 97% at 7;
    # "both" at trial 3, 3, 3 and 4, two seconds a trial.
    assert np.ravel(paced["both"]) == pytest.approx([3 / 5, 6 / 5, 3 / 5, 6 / 5, 3 / 6, 6 / 6, 4 / 7, 8 / 7])
    assert paced["bandit"][0] == pytest.approx((6 / 5, 6 / 5))
    assert [pace for pace, _ in paced["baseline"]] == [1.0] * 4
    table = ablation.summarise(runs(), TRIALS)
    assert (table["both"]["trial_pace"], table["both"]["time_pace"]) == pytest.approx(paced["both"][-1])
    # nothing to judge by without the baseline
    assert ablation.paces_of(ablation.summarise([run("both", [1.0] * TRIALS)], TRIALS)) == {}


def test_no_pace_is_taken_where_the_baselines_default_schedules_were_already_there():
    # Both seeds of the baseline measure the same two defaults first, the second at 91% of
    # the final (100): a taught arm, its first trials the same defaults after seconds of
    # teaching, has no search to compare there.
    taught = run("baseline+transfer", [50, 91, 100, 100, 100, 100, 100, 100, 100, 100])
    taught["seconds"] = [6.0 + n for n in range(TRIALS)]
    baseline = [run("baseline", [50, 91, 93, 93, 95, 96, 97, 98, 99, 100]),
                run("baseline", [50, 91, 92, 94, 95, 96, 97, 98, 99, 100])]
    paced = ablation.paces_of(ablation.summarise([*baseline, taught], TRIALS))
    assert paced["baseline+transfer"][:2] == [None, None]
    assert paced["baseline+transfer"][2] == pytest.approx((3 / 5, 8 / 5))
    assert ablation.mean_paces([paced["baseline+transfer"], [(0.5, 0.5), None, (1.0, 1.0), (1.0, 1.0)]])[:3] == [
        (0.5, 0.5), None, pytest.approx((0.8, 1.3))]


def test_a_pace_divides_by_the_pooled_baselines_way_to_its_final():
    lucky = run(ablation.NULL, [90] * 4 + [110] * 6, seconds_per_trial=3.0)
    table = ablation.summarise([run("baseline", [90] * 9 + [100]), lucky, run("both", [105] * TRIALS)], TRIALS)
    # The pooled mean curve (90 to trial 4, 100 to trial 9, then 105) comes within 3% of 105
    # only at trial 10, though the null's seeds alone are there at trial 5.
    assert table["both"]["trial_pace"] == pytest.approx(1 / 10)
    assert table[ablation.NULL]["trial_pace"] == pytest.approx(5 / 10)


def test_an_arm_is_judged_by_the_mean_curve_over_its_seeds():
    seeds = [run("baseline", [100] * TRIALS), run("both", [100] * TRIALS), run("both", [90] * 9 + [100])]
    table = ablation.summarise(seeds, TRIALS)
    assert table["both"]["seeds"] == 2
    assert table["both"]["trials_to_baseline_best"] == 10  # the mean is 95 until both seeds are at 100
    assert table["both"]["final_gflops_min"] == 100


def test_the_null_arms_seeds_join_the_baselines_final_and_show_its_luck():
    lucky = run(ablation.NULL, [90] * 4 + [110] * 6, seconds_per_trial=3.0)
    table = ablation.summarise([run("baseline", [90] * 9 + [100]), lucky, run("both", [105] * TRIALS)], TRIALS)
    # The baseline's final is 105 over both sets of its seeds, its time 20 seconds.
    assert all(row["baseline_gflops"] == 105 for row in table.values())
    assert table["both"]["trials_to_baseline_best"] == 1 and table["both"]["time_share"] == 0.05
    assert table["baseline"]["trial_share"] is None  # its own seeds alone end short of the pooled final
    assert (table[ablation.NULL]["trial_share"], table[ablation.NULL]["time_share"]) == (0.5, 0.75)


def test_a_final_is_told_from_the_baselines_by_the_range_of_its_redrawn_seeds():
    steady = [run("baseline", [100] * TRIALS), run(ablation.NULL, [100] * TRIALS), run("both", [110] * TRIALS)]
    assert ablation.final_ranges(steady, TRIALS)["both"] == pytest.approx((1.1, 1.1))
    lucky = [*steady, run("both", [90] * TRIALS)]  # one seed 10% up, one 10% down: its range takes in 1
    low, high = ablation.final_ranges(lucky, TRIALS, draws=400)["both"]
    assert low == pytest.approx(0.9) and high == pytest.approx(1.1)
    assert ablation.final_ranges([run("both", [1.0] * TRIALS)], TRIALS) == {}


def test_a_short_curve_is_held_at_its_last_value():
    table = ablation.summarise([run("baseline", [100] * TRIALS), run("both", [80, 100])], TRIALS)
    assert table["both"]["trials_to_baseline_best"] == 2
    assert table["both"]["final_gflops_mean"] == 100


@pytest.mark.slow
def test_tables_prints_saved_results_anew_and_averages_over_workloads(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    stale = [run("baseline", [1.0] * TRIALS), run("both", [1.0] * TRIALS)]
    first.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": stale},
                                                                  "dense": {"runs": runs()}}}))
    second.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": runs()}}}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(first), str(second)],
                          capture_output=True, text=True, check=True)
    # matmul's later file wins, so both workloads hold runs(): "both" reaches the baseline's final
    # at trial 5 (0.50 of its trials, 1.00 of its time), comes within 1% at 4 and within 3% at 4.
    matmul = {row[0]: row for row in _table(done.stdout, "matmul, as recorded")}
    assert matmul["both"] == ["both", "101.0 (101.0-101.0)", "1.010-1.010", "5", "0.50", "1.00", "4", "0.40", "0.80",
                              "4", "0.57, 1.14"]
    assert matmul["bandit"][3:6] == ["never", "-", "-"]
    overall = {row[0]: row for row in _table(done.stdout, "over 2 workloads")}
    assert overall["both"][1:6] == ["2", "0.50", "1.00", "0.40", "0.80"]
    assert overall["bandit"][1:6] == ["2", "1.00", "1.00", "1.00", "1.00"]  # never reached counts as the whole budget
    paces = {row[0]: row for row in _table(done.stdout, "mean pace over the workloads")}
    assert paces["both"][1:] == ["0.60 (1.20)", "0.60 (1.20)", "0.50 (1.00)", "0.57 (1.14)"]


@pytest.mark.slow
def test_tables_gathers_a_workloads_arms_from_every_file(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": runs()}}}))
    null = run(ablation.NULL, [50, 60, 70, 80, 90, 95, 99, 99, 99, 100])
    second.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": [runs()[0], null]}}}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(first), str(second)],
                          capture_output=True, text=True, check=True)
    arms = [row[0] for row in _table(done.stdout, "matmul, as recorded")]
    assert arms == ["baseline", "both", "bandit", ablation.NULL]
    second.write_text(json.dumps({"trials": 2 * TRIALS, "workloads": {"matmul": {"runs": [null]}}}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(first), str(second)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "matmul ran 20 trials there and 10 in an earlier file" in done.stderr


def _first_fast(cases: list) -> list:
    """Cases of a parametrize whose first stays in the `not slow` subset; the others, each
    ablation.py in a fresh interpreter, are `slow`."""
    return [case if n == 0 else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
            for n, case in enumerate(cases)]


@pytest.mark.parametrize("content", _first_fast([None, "not json", '{"trials": 10}']))
def test_tables_refuses_a_file_that_is_not_an_ablation_result_naming_it(content, tmp_path):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(path)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"--tables {path}: not the results of an ablation run" in done.stderr
    assert "name files that ablation.py wrote with --out" in done.stderr


@pytest.mark.parametrize("arguments, message", _first_fast([
    (["--remeasure", "-1"], "--remeasure -1"),
    (["--only", "conv2d_r50_9x9"], "unknown workload 'conv2d_r50_9x9'"),
    (["--arms", "baseline,greedy"], "unknown arm 'greedy'"),
    (["--arms", "both+ties+ties"], "once each"),
    (["--arms", "baseline,both+basins"], "docs/experiments/basins.md"),
    (["--transfer-rows", "0"], "--transfer-rows 0"),
    (["--only", "dense_1x2048x1000", "--arms", "baseline,both+short-warm-up"], "are for whole models"),
]))
def test_bad_arguments_are_refused_naming_the_fix(arguments, message, tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), *arguments,
                           "--records", str(tmp_path), "--archive", str(tmp_path), "--out", str(tmp_path / "o.json")],
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert message in done.stderr
    assert not (tmp_path / "o.json").exists()


def test_an_arm_is_a_policy_pair_with_modifiers_in_any_order():
    assert ablation.arm_of("both") == ablation.Arm("bandit", "learned")
    combined = ablation.arm_of("predictor+transfer+ties")
    assert (combined.sketch_policy, combined.mutation_policy) == ("uniform", "learned")
    assert combined.transfer and combined.sketch_tie == ablation.TIE and combined.sketch_quotas is None
    assert combined == ablation.arm_of("predictor+ties+transfer")
    params = ablation.arm_of("both+scored-slots+gentle").params(defaults_first=False)
    assert not params.sketch_quotas and params.sketch_temperature == ablation.GENTLE and not params.defaults_first
    assert ablation.arm_of("both").params(defaults_first=True).sketch_quotas is None  # the policy decides
    assert ablation.arm_of("both+quotas").params(defaults_first=True).sketch_quotas is True
    assert ablation.arm_of("both+ties").params(defaults_first=True).sketch_tie == ablation.TIE > 0
    assert ablation.arm_of("baseline+reseeded").reseed == ablation.RESEED > 0
    with pytest.raises(ValueError, match="unknown arm 'ties'"):
        ablation.arm_of("ties")


@pytest.mark.slow
@pytest.mark.parametrize("modifier", _first_fast(sorted(ablation.REMOVED)))
def test_a_removed_modifier_is_refused_naming_its_write_up_and_its_saved_runs_still_print(modifier, tmp_path):
    with pytest.raises(ValueError, match=f"{ablation.REMOVED[modifier]}.*797298c"):
        ablation.arm_of(f"both+{modifier}")
    saved, arm = tmp_path / "saved.json", f"both+{modifier}"
    saved_runs = [*runs(), run(arm, [100] * TRIALS)]
    saved.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": saved_runs}}}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(saved)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert arm in done.stdout


class FakeMeasurements:
    """Replays a made-up cost per trace (a few fail), so no candidate is built."""

    def __init__(self, task):
        self.task, self.scales, self.measured, self.replayed = task, [], 0, 0
        self.seen: list[float] = []

    def costs(self, traces, sketches):
        codes = [zlib.crc32(trace_key(t).encode()) for t in traces]
        costs = [np.inf if code % 7 == 0 else 1e-6 * (1 + code % 1000) for code in codes]
        self.seen += costs
        self.replayed += len(traces)
        return costs, [0.5] * len(traces)


@pytest.mark.slow
def test_a_search_remembers_each_schedule_it_believed_best_and_when():
    task = tc.SearchTask(func="matmul", args=(16, 16, 16))
    measurements = FakeMeasurements(task)
    search = ablation.Search(task, measurements, "baseline", 0, 2 * ablation.PER_ROUND, None)
    curve = ablation.run_lockstep([search], [measurements])[0]["best_gflops"]
    trials = [trial for trial, _ in search.believed]
    assert trials == sorted(set(trials)) and len(trials) > 1
    assert trials == [t for t in range(len(curve)) if curve[t] > (curve[t - 1] if t else 0)]
    last = zlib.crc32(search.believed[-1][1].encode())
    assert curve[-1] == pytest.approx(search.flop / (1e-6 * (1 + last % 1000)) / 1e9)


class Believer:
    """A finished search as true_curves reads it: its curve, and where its believed best changed."""

    def __init__(self, curve: list[float], believed: list[tuple[int, str]]):
        self.best_gflops, self.believed, self.flop = curve, believed, 1e9


class Sitting:
    def __init__(self, gflops: dict[str, float]):
        self.gflops, self.asked = gflops, []

    def sitting(self, keys):
        self.asked += keys
        return {key: 1 / self.gflops[key] for key in keys}


def test_true_curves_follow_the_believed_best_as_timed_in_one_sitting():
    slow = Believer([50, 95, 95, 99], [(0, "slow"), (1, "good"), (3, "lucky")])
    other = Believer([60, 60, 96, 96], [(0, "other"), (2, "good2")])
    runs = [{"best_gflops": slow.best_gflops}, {"best_gflops": other.best_gflops}]
    timer = Sitting({"good": 90.0, "lucky": 85.0, "good2": 96.0})
    ablation.true_curves([slow, other], timer, runs)
    assert sorted(timer.asked) == ["good", "good2", "lucky"]  # those recorded below FLOOR of 99 are not timed
    scale = np.median([90 / 95, 85 / 99, 96 / 96])
    # The lucky schedule read 99 when recorded; timed again it is slower than the one it displaced.
    assert runs[0]["true_gflops"] == pytest.approx([50 * scale, 90, 90, 85])
    assert runs[1]["true_gflops"] == pytest.approx([60 * scale, 60 * scale, 96, 96])
    assert runs[0]["sitting"] == runs[1]["sitting"] and ablation.timed_alike(runs)
    assert not ablation.timed_alike([runs[0], {**runs[1], "sitting": 0.0}])
    assert not ablation.timed_alike([runs[0], {"best_gflops": [1.0]}])


@pytest.mark.slow
def test_a_sitting_times_schedules_anew_and_leaves_the_record_alone(tmp_path):
    task = tc.SearchTask(func="matmul", args=(32, 32, 32))
    record = tmp_path / "matmul.json"
    runner = LocalRunner()
    try:
        measurements = ablation.Measurements(task, record, False, runner)
        key = trace_key(default_schedule(task.compute_dag, task.target).trace)
        timed = measurements.sitting([key], passes=2)
    finally:
        runner.close()
    assert list(timed) == [key] and 0 < timed[key] < 1
    assert not record.exists()


@pytest.mark.slow
def test_tables_judge_the_timed_curves_only_where_one_sitting_timed_every_arm(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    timed = [{**one, "true_gflops": one["best_gflops"], "sitting": 1.0} for one in runs()]
    first.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": timed}}}))
    tables = [sys.executable, str(BENCHMARKS / "ablation.py"), "--tables", str(first)]
    said = subprocess.run(tables, capture_output=True, text=True, check=True).stdout
    assert "matmul, the believed best, timed in one sitting" in said and "over 1 workloads, the believed" in said
    second.write_text(json.dumps({"trials": TRIALS, "workloads": {"matmul": {"runs": [
        {**run(ablation.NULL, [100] * TRIALS), "true_gflops": [100] * TRIALS, "sitting": 2.0}]}}}))
    said = subprocess.run([*tables, str(second)], capture_output=True, text=True, check=True).stdout
    assert "timed in one sitting" not in said and ablation.NULL in said


@pytest.mark.slow
def test_a_model_search_follows_the_weighted_latency_of_its_tasks_through_the_task_scheduler():
    tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16)), tc.SearchTask(func="dense", args=(1, 32, 16))]
    weights = [3, 1]
    measurements = [FakeMeasurements(task) for task in tasks]
    search = ablation.ModelSearch(tasks, weights, measurements, "both", seed=0, trials=3 * ablation.PER_ROUND)
    runs = ablation.run_lockstep([search], measurements)
    curve = runs[0]["best_gflops"]
    assert len(curve) == 3 * ablation.PER_ROUND and sum(runs[0]["trials_per_task"]) == len(curve)
    assert curve[ablation.PER_ROUND - 1] == 0  # the second task has had no round yet
    assert curve[2 * ablation.PER_ROUND - 1] > 0 and np.all(np.diff(curve) >= 0)
    flop = sum(w * t.compute_dag.flop_count() for t, w in zip(tasks, weights))
    latency = sum(w * min(m.seen) for w, m in zip(weights, measurements))
    assert curve[-1] == pytest.approx(flop / latency / 1e9)
    assert np.all(np.diff(runs[0]["seconds"]) >= 0.5)  # each trial adds its recorded seconds


@pytest.mark.slow
def test_a_model_search_replays_to_the_same_curve_with_the_same_seed():
    def curve(seed: int) -> list[float]:
        tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16)), tc.SearchTask(func="dense", args=(1, 32, 16))]
        measurements = [FakeMeasurements(task) for task in tasks]
        search = ablation.ModelSearch(tasks, [1, 2], measurements, "both", seed=seed, trials=4 * ablation.PER_ROUND)
        return ablation.run_lockstep([search], measurements)[0]["best_gflops"]

    assert curve(1) == curve(1)


@pytest.mark.slow
def test_a_reseeded_arm_is_the_same_search_on_the_random_streams_of_other_seeds():
    def curve(arm: str, seed: int) -> list[float]:
        task = tc.SearchTask(func="matmul", args=(16, 16, 16))
        measurements = FakeMeasurements(task)
        search = ablation.Search(task, measurements, arm, seed, 3 * ablation.PER_ROUND, None)
        return ablation.run_lockstep([search], [measurements])[0]["best_gflops"]

    reseeded = curve("baseline+reseeded", 0)
    assert reseeded == curve("baseline", ablation.RESEED) and reseeded != curve("baseline", 0)


@pytest.mark.slow
def test_a_short_warm_up_arm_values_a_model_once_every_task_had_its_few_trials():
    tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16)), tc.SearchTask(func="dense", args=(1, 32, 16))]
    measurements = [FakeMeasurements(task) for task in tasks]
    search = ablation.ModelSearch(tasks, [1, 1], measurements, "both+short-warm-up", seed=0,
                                  trials=2 * ablation.SHORT_WARM_UP + ablation.PER_ROUND)
    ablation.run_lockstep([search], measurements)
    curve = search.best_gflops
    assert curve[ablation.SHORT_WARM_UP - 1] == 0 < curve[2 * ablation.SHORT_WARM_UP - 1]
    assert sorted(search.result()["trials_per_task"]) == [ablation.SHORT_WARM_UP,
                                                          ablation.SHORT_WARM_UP + ablation.PER_ROUND]


@pytest.mark.slow
def test_only_the_transfer_arms_start_from_a_model_taught_the_other_workloads_records(tmp_path):
    task, donor = tc.SearchTask(func="matmul", args=(16, 16, 16)), tc.SearchTask(func="matmul", args=(32, 16, 16))
    donor_policy = SketchPolicy(donor)
    traces = [donor_policy.trace_of(c) for c in donor_policy.next_batch(32)]
    log = tmp_path / "donor.json"
    log.write_text("".join(TuningRecord(donor.workload_key, donor.workload, str(donor.target), trace_key(t),
                                        (1e-6 * (1 + n),), "none", "", 0.1, 0.0, donor.compute_dag.flop_count(),
                                        None).to_json_line() + "\n" for n, t in enumerate(traces)))
    measurements = FakeMeasurements(task)
    baseline, transfer = ablation.operator_searches(task, measurements, ["baseline", "both+transfer"], seeds=1,
                                                    trials=ablation.PER_ROUND, donor_logs=[log])
    assert (baseline.arm, transfer.arm) == ("baseline", "both+transfer")
    assert baseline.policy.model.num_samples == 0
    assert transfer.policy.model.num_samples == len(traces)
    ablation.run_lockstep([baseline, transfer], [measurements])
    assert transfer.policy.model.num_samples == len(traces) + ablation.PER_ROUND
    # A transfer arm's clock starts with the teaching, which its user waits for too.
    taught = ablation.Search(task, measurements, "baseline+transfer", 0, ablation.PER_ROUND, transfer.policy.model,
                             teaching_secs=100.0)
    plain = ablation.Search(task, measurements, "baseline", 0, ablation.PER_ROUND, None, teaching_secs=100.0)
    assert (taught.simulated, plain.simulated) == (100.0, 0.0)


@pytest.mark.slow
def test_a_model_searchs_transfer_arm_starts_from_its_own_copy_of_the_taught_shared_model():
    tasks = [tc.SearchTask(func="matmul", args=(16, 16, 16)), tc.SearchTask(func="dense", args=(1, 32, 16))]
    donor = SketchPolicy(tc.SearchTask(func="matmul", args=(32, 16, 16)), taught := SharedCostModel())
    donor.update(chosen := donor.next_batch(8), [1e-6 * (n + 1) for n in range(len(chosen))])
    measurements = [FakeMeasurements(task) for task in tasks]
    searches = [ablation.ModelSearch(tasks, [1, 1], measurements, arm, seed=0, trials=2 * ablation.PER_ROUND,
                                     taught=taught, teaching_secs=100.0) for arm in ("baseline", "both+transfer")]
    models = [search.scheduler.states[0].policy.model.shared for search in searches]
    assert [model.model.num_samples for model in models] == [0, 8] and taught not in models
    assert [search.simulated for search in searches] == [0.0, 100.0]  # the user waits for the teaching too
    ablation.run_lockstep(searches, measurements)
    assert models[1].model.num_samples == 8 + 2 * ablation.PER_ROUND and taught.model.num_samples == 8


@pytest.mark.slow
def test_a_long_run_packs_its_record_into_the_archive_as_it_goes(monkeypatch):
    monkeypatch.setattr(ablation, "CHECKPOINT_SECONDS", 0.0)  # every round is past due
    task = tc.SearchTask(func="matmul", args=(16, 16, 16))
    measurements = FakeMeasurements(task)
    searches = ablation.operator_searches(task, measurements, ["baseline"], seeds=1, trials=2 * ablation.PER_ROUND)
    packed = []
    ablation.run_lockstep(searches, [measurements], checkpoint=lambda: packed.append(len(measurements.seen)))
    assert packed == [ablation.PER_ROUND, 2 * ablation.PER_ROUND]


def test_a_models_record_takes_in_the_other_logs_records_of_this_target_once(tmp_path):
    from archive import merge, save  # benchmarks/archive.py

    def line(target: str, cost: float) -> str:
        return json.dumps({"v": 1, "key": "k", "target": target, "costs": [cost]}, separators=(",", ":"))

    kept, record = tmp_path / "kept.json", tmp_path / "record.json"
    kept.write_text("".join(f"{line(t, c)}\n" for t, c in [("here", 1.0), ("elsewhere", 2.0), ("here", 3.0)]))
    save(kept, tmp_path / "kept.json.xz")
    record.write_text(f"{line('elsewhere', 5.0)}\n{line('here', 1.0)}\n")
    assert merge(tmp_path / "kept.json.xz", record, "here") == 1  # the 1.0 is there already
    assert record.read_text().splitlines() == [line("elsewhere", 5.0), line("here", 1.0), line("here", 3.0)]
    assert merge(tmp_path / "kept.json.xz", record, "here") == 0
    assert merge(tmp_path / "none.json.xz", record, "here") == 0


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_packs_what_it_measured_into_the_archive(tmp_path):
    import lzma
    import signal
    import time

    record, archive = tmp_path / "matmul_128.json", tmp_path / "matmul_128.json.xz"
    process = subprocess.Popen([sys.executable, str(BENCHMARKS / "ablation.py"), "--only", "matmul_128",
                                "--trials", "64", "--seeds", "1", "--arms", "baseline", "--records", str(tmp_path),
                                "--archive", str(tmp_path), "--out", str(tmp_path / "o.json")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (record.exists() and record.stat().st_size) and time.monotonic() < deadline:
            assert process.poll() is None, "the run ended before it measured anything"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        process.kill()
    packed = lzma.decompress(archive.read_bytes()).decode().splitlines()
    assert packed and packed == record.read_text().splitlines()


def test_a_second_run_is_refused_while_one_measures_naming_its_pid(tmp_path):
    import os

    lock = tmp_path / "measuring.lock"
    held = ablation.hold_measuring_lock(lock)
    with pytest.raises(SystemExit, match=f"pid {os.getpid()}.*kill {os.getpid()}"):
        ablation.hold_measuring_lock(lock)
    held.close()
    ablation.hold_measuring_lock(lock).close()  # free again once the first run ends


def test_redrawn_seeds_show_how_often_an_arm_would_meet_the_bar():
    steady = [run("baseline", [100] * TRIALS)] * 2 + [run("both", [60, 80, 100] + [100] * 7)] * 2
    drawn = ablation.bootstrap_shares({"steady": (steady, TRIALS)}, draws=200)
    # Every redraw reaches 100 at trial 3; the baseline is within 3% of it at trial 1, where
    # there is no climb to pace: counted as the baseline's own pace, 1.0.
    assert np.allclose(drawn["both"], [0.3, 0.3, 1.0, 1.0])
    # One seed fast, one never there: a redraw meets the bar only when it takes the fast one twice.
    lottery = [run("baseline", [100] * TRIALS)] * 2 + [run("both", [60, 80, 100] + [100] * 7),
                                                       run("both", [90] * TRIALS)]
    drawn = ablation.bootstrap_shares({"lottery": (lottery, TRIALS)}, draws=400)
    meets = np.mean(np.all(drawn["both"][:, :2] <= ablation.BAR, axis=1))
    assert 0.15 < meets < 0.35
    assert set(np.unique(drawn["both"][:, 0])) == {0.3, 1.0}
