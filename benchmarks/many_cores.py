"""Issue 43's figures on a many-core host, in one run of under four minutes.

    python benchmarks/many_cores.py OUT_DIR [--quick] [--budget-secs 230]

Meant for one short call on a machine we hold for minutes (a GPU host's 16-core CPU), so
each step runs in its own process group under a time cap, and a slow step cannot eat
the ones after it. The steps, each opened by an ``=== step ===`` banner:

  machine            cores, CPU, gcc, versions and tilecraft's target
  reported_vs_fresh  ``reported_vs_fresh.py``: the README's ``tilecraft tune matmul`` at
                     1024^3 for 256 trials, its reported best against 5 fresh processes
                     timing ``apply_best`` on NumPy's (16-byte) and cache-line (64-byte)
                     aligned inputs, interleaved
  conv2d             ``tune_ops.py --only conv2d_r50_3x3 --trials 128``: ResNet-50's 3x3
                     convolution (NCHW, batch 1, 64->64, 56x56, pad 1), trials per minute
  matmul_2048        ``tilecraft tune matmul`` at 2048^3, for what time is left
  baselines          in a fresh process, each log's best, NumPy and PyTorch (with
                     ``torch.set_num_threads(cores)``: tune_ops pins it to 2) in
                     interleaved rounds, on matmul 1024^3, the convolution and matmul 2048^3

Writes into OUT_DIR (the names carry the core count N): reported_vs_fresh_N.json,
tune_ops_N.json, many_cores_N.json (each step's status and time, the baselines, the
headline figures), the logs matmul_1024_log.json, tune_logs/conv2d_r50_3x3.json and
matmul_2048_log.json, and many_cores.log (everything printed). ``--quick`` shrinks every
step (8 trials, 2 processes, matmul 512^3 for 2048^3) for a smoke test.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINE = "baseline "  # the prefix of the baselines process's result lines


def versions() -> dict[str, str | None]:
    found = {}
    for name in ("numpy", "torch", "xgboost-cpu", "xgboost", "scipy", "rich", "threadpoolctl"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    cpu = models[0] if models else platform.processor()
    try:
        gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        gcc = None  # tilecraft cannot build a kernel: every tuning step will fail
    import tilecraft as tc
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "gcc": gcc,
            "python": sys.version.split()[0], "platform": platform.platform(), "target": str(tc.Target.host()),
            "versions": versions()}


class Steps:
    """Runs the steps one after another against one deadline, echoing each one's output to
    the screen and to many_cores.log, and keeps what each step did."""

    def __init__(self, out: Path, budget_secs: float):
        self.deadline = time.monotonic() + budget_secs
        self.log = (out / "many_cores.log").open("w", buffering=1)
        self.done: dict[str, dict] = {}
        self.lines: list[str] = []  # of the step running now

    def left_secs(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def run(self, name: str, argv: list[str], cap_secs: float) -> bool:
        timeout_secs = max(0.0, min(cap_secs, self.left_secs()))
        self.say(f"=== {name} === (at most {timeout_secs:.0f} s; {self.left_secs():.0f} s of the budget left)")
        self.say("$ " + " ".join(argv))
        started = time.monotonic()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        timer = threading.Timer(timeout_secs, self._stop, (process,))
        timer.start()
        self.lines = []
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))
            sys.stdout.write(line)
            sys.stdout.flush()
            self.log.write(line)
        returncode = process.wait()
        timer.cancel()
        self._stop(process)  # stragglers (measure workers, gcc) would disturb the next step's timings
        secs = time.monotonic() - started
        timed_out = secs >= timeout_secs and returncode == -signal.SIGKILL
        self.done[name] = {"returncode": returncode, "secs": round(secs, 1), "timed_out": timed_out}
        self.say(f"--- {name}: {'stopped at its cap' if timed_out else f'exit {returncode}'} after {secs:.0f} s")
        return returncode == 0

    def skip(self, name: str, why: str) -> None:
        self.say(f"=== {name} === skipped: {why}")
        self.done[name] = {"skipped": why}

    @staticmethod
    def _stop(process: subprocess.Popen) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group this step's process leads, nothing else
        except ProcessLookupError:
            pass


def time_baselines(names: list[str], logs: list[Path], repeat: int, min_ms: float) -> None:
    """The hidden ``--baselines`` mode: one result line per workload (run in a fresh process)."""
    import tune_ops  # benchmarks/tune_ops.py, beside this script: its workloads and interleaved timing

    for n in (512, 1024, 2048):  # as `tilecraft tune` keys them (the dtype given), and 2048^3 added
        tune_ops.WORKLOADS[f"matmul_{n}"] = ("matmul", (n, n, n, "float32"), lambda a, b: a @ b, lambda a, b: a @ b)
    cores = len(os.sched_getaffinity(0))
    if tune_ops.torch is not None:
        tune_ops.torch.set_num_threads(cores)
    for name, log in zip(names, logs):
        started = time.perf_counter()
        try:
            if log.exists():
                result = tune_ops.time_best(name, str(log), repeat, min_ms)
            else:  # the tuning step failed: NumPy and PyTorch alone
                result = time_numpy_and_torch(tune_ops, name, repeat, min_ms)
        except Exception as error:  # noqa: BLE001 - the next workload's figures are still wanted
            result = {"error": f"{type(error).__name__}: {error}"}
        result = {"workload": name, "log": log.name if log.exists() else None, "torch_threads": cores,
                  "secs": round(time.perf_counter() - started, 1), **result}
        print(BASELINE + json.dumps(result), flush=True)


def time_numpy_and_torch(tune_ops, name: str, repeat: int, min_ms: float) -> dict:
    """``tune_ops.time_best`` without a tuned schedule to time beside them."""
    import tilecraft as tc

    workload, args, numpy_fn, torch_fn = tune_ops.WORKLOADS[name]
    task = tc.SearchTask(func=workload, args=args, target=tc.Target.host())
    inputs = task.compute_dag.random_inputs()
    systems = {"numpy": lambda: numpy_fn(*inputs)}
    torch = tune_ops.torch
    if torch is not None:
        tensors = [torch.from_numpy(x) for x in inputs]
        systems["torch"] = lambda: torch_fn(*tensors)
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        secs = tune_ops.interleaved_times(systems, repeat, min_ms)
    flop = task.compute_dag.flop_count()
    return {"correct": None, "tilecraft_gflops": None, **{f"{s}_gflops": flop / t / 1e9 for s, t in secs.items()}}


def headline(out: Path, cores: int, baselines: list[dict], big: dict) -> dict:
    """The figures issue 43 asks for, read back from the steps' files."""
    figures: dict = {}
    path = out / f"reported_vs_fresh_{cores}.json"
    if path.exists():
        r = json.loads(path.read_text())
        figures["matmul_1024"] = {
            "reported_gflops": r["reported_gflops"],
            "best_single_measurement_gflops": r["best_single_measurement_gflops"],
            "fresh_16_byte_aligned_median_gflops": r["fresh_numpy_median"],
            "fresh_64_byte_aligned_median_gflops": r["fresh_aligned_median"],
            "fresh_over_reported": r["fresh_numpy_median"] / r["reported_gflops"],
            "trials": r["trials"], "tuning_secs": r["tuning_secs"],
            "trials_per_minute": 60 * r["trials"] / r["tuning_secs"]}
    path = out / f"tune_ops_{cores}.json"
    if path.exists():
        w = json.loads(path.read_text())["workloads"][0]
        kept = ("trials", "valid", "tilecraft_gflops", "numpy_gflops", "reported_gflops", "tuning_wall_secs",
                "trials_per_minute")
        figures["conv2d_r50_3x3"] = {**{key: w[key] for key in kept}, "torch_2_threads_gflops": w["torch_gflops"]}
    if big:
        figures[big["workload"]] = big
    figures["baselines"] = {b["workload"]: b for b in baselines}
    return figures


def headline_text(figures: dict, cores: int) -> str:
    from tables import numeric_table  # benchmarks/tables.py, beside this script

    from tilecraft.tables import table_text
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    table = numeric_table("workload", "tilecraft", "NumPy", f"PyTorch ({cores} thr)", "tc/torch", "correct",
                          title=f"GFLOPS on {cores} cores, interleaved in one fresh process")
    for name, b in figures["baselines"].items():
        tc_gflops, torch_gflops = b.get("tilecraft_gflops"), b.get("torch_gflops")
        ratio = f"{tc_gflops / torch_gflops:.2f}x" if tc_gflops and torch_gflops else "-"
        table.add_row(name, fmt(tc_gflops), fmt(b.get("numpy_gflops")), fmt(torch_gflops), ratio,
                      str(b["correct"]) if "correct" in b else b.get("error", "-").split(":")[0])
    lines = [table_text(table)]
    for name, found in figures.items():
        if name != "baselines":
            lines.append(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in found.items()))
    return "\n".join(lines)


def tune_big_matmul(steps: Steps, out: Path, quick: bool) -> tuple[str, Path, dict]:
    """The step ``matmul_2048``, only with the baselines' time kept back: its search stops at
    ``--time``, then the re-measurement follows, and before it the cost model learns the
    default database. Returns the workload's name, its log and what the step found."""
    name, shape = ("matmul_512", "512,512,512") if quick else ("matmul_2048", "2048,2048,2048")
    log = out / f"{name}_log.json"
    log.unlink(missing_ok=True)
    keep_secs, overhead_secs = (30, 10) if quick else (45, 25)
    search_secs = min(10 if quick else 45, steps.left_secs() - keep_secs - overhead_secs)
    if search_secs < (3 if quick else 15):
        steps.skip(name, f"{steps.left_secs():.0f} s left")
        return name, log, {}
    steps.run(name, [sys.executable, "-m", "tilecraft.cli", "tune", "matmul", "--shape", shape,
                     "--trials", "8" if quick else "128", "--time", f"{search_secs:.0f}s", "--log", str(log)],
              cap_secs=steps.left_secs() - keep_secs)
    if not log.exists():
        return name, log, {}
    import tilecraft as tc

    said = re.search(r"best of the whole log .*?: ([\d.]+) GFLOPS", "\n".join(steps.lines))
    trials = sum(r.phase == "search" for r in tc.load_records(str(log)))
    secs = steps.done[name]["secs"]
    return name, log, {"workload": name, "shape": shape, "search_secs_asked": round(search_secs), "trials": trials,
                       "command_secs": secs, "trials_per_minute_of_command": 60 * trials / secs,
                       "reported_gflops": float(said.group(1)) if said else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write every result into")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 8 trials, 2 processes, small shapes")
    parser.add_argument("--budget-secs", type=float, default=230, help="wall time for all the steps (default 230)")
    parser.add_argument("--baselines", nargs="+", help=argparse.SUPPRESS)  # internal: NAME=LOG ..., fresh process
    options = parser.parse_args()
    out, quick = options.out, options.quick
    repeat, min_ms = (3, 50) if quick else (5, 200)
    if options.baselines:
        pairs = [item.split("=", 1) for item in options.baselines]
        time_baselines([n for n, _ in pairs], [Path(p) for _, p in pairs], repeat, min_ms)
        return 0

    os.environ["PYTHONUNBUFFERED"] = "1"  # the steps' output reaches the log as it is printed
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps(out, options.budget_secs)
    steps.say("=== machine ===")
    facts = machine()
    steps.say(json.dumps(facts, indent=1))
    cores, python, small = facts["cores"], sys.executable, ["--quick"] if quick else []
    matmul_log, conv_log = out / "matmul_1024_log.json", out / "tune_logs" / "conv2d_r50_3x3.json"
    steps.run("reported_vs_fresh", [python, str(HERE / "reported_vs_fresh.py"), "--shape", "1024,1024,1024",
                                    "--trials", "8" if quick else "256", "--processes", "2" if quick else "5",
                                    "--out", str(out / f"reported_vs_fresh_{cores}.json"), "--log", str(matmul_log)],
              cap_secs=130)
    steps.run("conv2d", [python, str(HERE / "tune_ops.py"), "--only", "conv2d_r50_3x3",
                         "--trials", "8" if quick else "128", "--out", str(out / f"tune_ops_{cores}.json"), *small],
              cap_secs=110)  # writes its log to conv_log
    big_name, big_log, big = tune_big_matmul(steps, out, quick)
    timed = {"matmul_1024": matmul_log, "conv2d_r50_3x3": conv_log, big_name: big_log}
    steps.run("baselines", [python, __file__, str(out), *small, "--baselines", *(f"{n}={p}" for n, p in timed.items())],
              cap_secs=60)
    baselines = [json.loads(line[len(BASELINE):]) for line in steps.lines if line.startswith(BASELINE)]

    steps.say("=== summary ===")
    figures = headline(out, cores, baselines, big)
    summary = out / f"many_cores_{cores}.json"
    summary.write_text(json.dumps({"machine": facts, "quick": quick, "steps": steps.done, **figures}, indent=1))
    steps.say(headline_text(figures, cores))
    steps.say(f"steps: {json.dumps(steps.done)}")
    steps.say(f"wrote {summary} and the files beside it")
    return 0 if all(s.get("returncode") == 0 for s in steps.done.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
