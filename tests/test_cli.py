"""The tilecraft command: `best` prints a table and the best schedule, `report` writes a PNG;
a mistake in the arguments exits with status 2 and one line that names the argument and the
fix, a failed command with status 1 and one line, never a traceback."""

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.cli import COMMANDS, CommandError, _workload_args, build_parser, main
from tilecraft.database import TuningRecord, load_records, trace_key
from tilecraft.graph import run_reference

TARGET = str(tc.Target("llvm -isa=avx2 -num-cores=4 -l2-bytes=1048576 -l3-bytes=33554432 -march=haswell"))
MATMUL = {"func": "matmul", "args": [16, 16, 16]}


def _trace(inner):
    A = te.placeholder((16, 16), name="A")
    B = te.placeholder((16, 16), name="B")
    k = te.reduce_axis((0, 16), name="k")
    C = te.compute((16, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul")
    sch = tc.Schedule(tc.ComputeDAG([A, B, C]), seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    j0, j1 = sch.split(j, [None, inner])
    sch.vectorize(j1)
    return sch.trace


def _record(cost, inner=4, error="none", key='["dag", "mm"]', workload=MATMUL, timestamp=0.0):
    return TuningRecord(key, workload, TARGET, trace_key(_trace(inner)), () if cost is None else (cost,), error,
                        "gcc: error: bad" if error != "none" else "", 0.2, 1.7e9 + timestamp, 2.0 * 16**3, "tiling")


def _cells(line: str) -> list[str]:
    """The cells of a row of a printed table, whatever its borders: the text between rules or wide gaps."""
    return [cell for cell in re.split(r"\s*[│┃|]\s*|\s{2,}", line.strip()) if cell]


@pytest.fixture
def log(tmp_path):
    records = [_record(4e-6, 1, timestamp=0), _record(None, 2, "compile", timestamp=1), _record(2e-6, 8, timestamp=2),
               _record(3e-6, 16, timestamp=3), _record(1e-5, 4, key='["dag", "relu"]', workload=None, timestamp=4)]
    path = tmp_path / "tuning.json"
    path.write_text("".join(r.to_json_line() + "\n" for r in records))
    return path


def test_best_prints_a_table_and_the_best_schedule_as_python(log, capsys):
    assert main(["best", str(log)]) == 0
    out = capsys.readouterr().out
    assert "matmul(16, 16, 16)" in out and '["dag", "relu"]' in out
    assert "compile 1" in out and "4.10" in out and "0.002 ms" in out  # 8192 flop in 2 us
    assert "# Best of matmul(16, 16, 16): 4.10 GFLOPS" in out and f"# target: {TARGET}" in out
    assert "def apply_trace(sch):" in out and "factors=[None, 8]" in out


def test_best_of_one_workload_by_its_name(log, capsys):
    assert main(["best", str(log), "--workload", "matmul", "--target", TARGET]) == 0
    out = capsys.readouterr().out
    assert "matmul(16, 16, 16)" in out and '["dag", "relu"]' not in out


TUNE = ["tune", "matmul", "--shape", "16,16,16"]
TUNE_MODEL = ["tune-model", "{model}"]
# Each command fed each of its wrong arguments, and what the one line of error must say: the
# argument and the fix. None of them reaches any work: nothing is tuned, compiled or printed.
MISTAKES = [
    (["serve", "--device", "gpu0"], "argument --device: 'gpu0' is not a GPU; write cuda:0 (the first), cuda:1"),
    ([*TUNE, "--device", "cuda:0,gpu1"], "argument --device: 'gpu1' is not a GPU; write cuda:0 (the first), cuda:1"),
    ([*TUNE, "--device", "cuda:1,cuda:1"], "argument --device: 'cuda:1,cuda:1' names a GPU twice; name each once"),
    ([*TUNE, "--device", "cuda:0,cuda:1", "--target", "llvm"], "--device measures CUDA kernels, and --target llvm is "
                                                               "a CPU; give a CUDA target"),
    (["tune", "matmul", "--shape", "512,512"], "--shape: matmul takes 3 sizes (N, L, M), got 2: 512,512"),
    (["tune", "conv2d", "--shape", "1,2,3"], "--shape: conv2d takes 7 to 9 sizes (N, C, H, W, F, KH, KW[, stride, "
                                             "padding]), got 3"),
    (["tune", "matmul", "--shape", "16,x,16"], "argument --shape: '16,x,16': give positive integers separated by"),
    (["tune", "matmul", "--shape", "16,0,16"], "argument --shape: '16,0,16': give positive integers separated by"),
    (["tune", "nosuch", "--shape", "16"], "argument WORKLOAD: invalid choice: 'nosuch' (choose from 'batch_matmul'"),
    ([*TUNE, "--trials", "-3"], "argument --trials: -3: give the number of measurements to make, a whole number, 1 "
                                "or more"),
    ([*TUNE, "--trials", "0"], "argument --trials: 0: give the number of measurements"),
    ([*TUNE, "--trials", "2.5"], "argument --trials: 2.5: give the number of measurements"),
    ([*TUNE, "--per-round", "0"], "argument --per-round: 0: give the measurements per search round"),
    ([*TUNE, "--time", "10 minutes"], "argument --time: '10 minutes': give a duration longer than 0, such as 90s, "
                                      "10m, 1h30m or 45 (seconds)"),
    ([*TUNE, "--time", "0s"], "argument --time: '0s': give a duration longer than 0"),
    ([*TUNE, "--remeasure", "-1"], "argument --remeasure: -1: give the number of finalists to measure again (0: none)"
                                   ", a whole number, 0 or more"),
    ([*TUNE, "--target", "bogus"], "argument --target: 'bogus': target kind 'bogus' is unknown; use 'llvm'"),
    ([*TUNE, "--target", "llvm -isa=avx9"], "target isa 'avx9' is unknown; use one of avx512, avx2"),
    ([*TUNE, "--dtype", "float99"], "argument --dtype: invalid choice: 'float99' (choose from 'bool'"),
    ([*TUNE, "--log", "{notlog}"], "argument --log: {notlog} is not a tuning log: no line of it is a record (line 1: "
                                   "not valid JSON"),
    ([*TUNE, "--log", "{tmp}"], "argument --log: {tmp} is not a file; give a tuning log"),
    ([*TUNE, "--log", "{tmp}/mm.json.xz"], "argument --log: {tmp}/mm.json.xz: a log is appended a line at a time "
                                           "and cannot be xz-compressed; name it without .xz"),
    ([*TUNE, "--transfer", "{tmp}/none.json"], "argument --transfer: {tmp}/none.json does not exist; give a tuning "
                                               "log, as `tilecraft tune` writes"),
    (["best", "{tmp}/missing.json"], "argument LOG: {tmp}/missing.json does not exist; give a tuning log"),
    (["best", "{notlog}"], "argument LOG: {notlog} is not a tuning log"),
    (["best", "{empty}"], "LOG: {empty} holds no tuning records; tune into it first"),
    (["best", "{log}", "--workload", "conv2d"], "--workload 'conv2d': {log} has no records of workload conv2d; its 5 "
                                                "records are of 2 other"),
    (["best", "{log}", "--target", "llvm -isa=avx512 -num-cores=64"], "--target 'llvm -isa=avx512 -num-cores=64': "
                                                                      "{log} has 4 records of workload"),
    (["best", "{log}", "--target", "bogus"], "argument --target: 'bogus': target kind 'bogus' is unknown"),
    (["report", "{tmp}/missing.json", "-o", "{tmp}/out.png"], "argument LOG: {tmp}/missing.json does not exist"),
    (["report", "{notlog}"], "argument LOG: {notlog} is not a tuning log"),
    (["tasks", "{tmp}/none.onnx"], "MODEL: {tmp}/none.onnx does not exist"),
    (["tasks", "{tmp}"], "MODEL: {tmp} is not a file; give an ONNX model"),
    (["tasks", "{notlog}"], "MODEL: {notlog} is not an ONNX model (ParseError"),
    (["tasks", "{model}", "--input-shape", "x=1,a"], "argument --input-shape: '1,a': give positive integers"),
    (["tasks", "{model}", "--input-shape", "x"], "argument --input-shape: 'x': give an input's name and its sizes"),
    (["tasks", "{model}", "--target", "bogus"], "argument --target: 'bogus'"),
    (["tasks", "{model}", "--input-shape", "y=1,2"], "--input-shape: {model} has no input y; its inputs are x"),
    ([*TUNE_MODEL, "--trials", "-3"], "argument --trials: -3: give the number of measurements to make"),
    ([*TUNE_MODEL, "--per-round", "0"], "argument --per-round: 0: give the measurements per round of a task"),
    ([*TUNE_MODEL, "--warm-up", "0"], "argument --warm-up: 0: give the measurements of each task's first round"),
    ([*TUNE_MODEL, "--in-place", "1"], "argument --in-place: 1: give the schedules to time of each task, "
                                       "2 or more, or 0 to skip"),
    ([*TUNE_MODEL, "--per-task-early-stopping", "0"], "argument --per-task-early-stopping: 0: give the trials"),
    ([*TUNE_MODEL, "--tasks", "("], "argument --tasks: '(' is not a regular expression (missing ), unterminated "
                                    "subpattern at position 0); match task descriptions as `tilecraft tasks`"),
    ([*TUNE_MODEL, "--tasks", "softmax"], "--tasks 'softmax' matches none of the model's tasks: transpose 1x6x6x2; "
                                          "conv2d_nhwc+relu 1x4x4x4"),
    ([*TUNE_MODEL, "--time", "x"], "argument --time: 'x': give a duration"),
    ([*TUNE_MODEL, "--remeasure", "-2"], "argument --remeasure: -2: give the number of finalists"),
    ([*TUNE_MODEL, "--log", "{notlog}"], "argument --log: {notlog} is not a tuning log"),
    (["tune-model", "{tmp}/none.onnx"], "MODEL: {tmp}/none.onnx does not exist"),
    (["choose-in-place", "{model}"], "the following arguments are required: --log"),
    (["choose-in-place", "{model}", "--log", "{tmp}/none.json"], "argument --log: {tmp}/none.json does not exist"),
    (["choose-in-place", "{model}", "--log", "{log}", "--candidates", "1"], "argument --candidates: 1: give the "
                                                                            "schedules to time of each task, a whole "
                                                                            "number, 2 or more"),
    (["choose-in-place", "{model}", "--log", "{log}", "--candidates", "0"], "argument --candidates: 0: give the "
                                                                            "schedules to time of each task, a whole "
                                                                            "number, 2 or more"),
    (["choose-in-place", "{model}", "--log", "{log}", "--rounds", "4"], "argument --rounds: 4: give the interleaved "
                                                                        "rounds (a paired test), a whole number, 5"),
    (["choose-in-place", "{model}", "--log", "{log}", "--target", "cuda"], "--target cuda: models are timed in place "
                                                                           "on this machine's CPU only"),
    (["run-model", "{tmp}/none.onnx"], "MODEL: {tmp}/none.onnx does not exist"),
    (["run-model", "{tmp}"], "MODEL: {tmp}/model.json does not exist: {tmp} is not a saved model"),
    (["run-model", "{model}", "--log", "{tmp}/none.json"], "argument --log: {tmp}/none.json does not exist"),
    (["run-model", "{model}", "--log", "{notlog}"], "argument --log: {notlog} is not a tuning log"),
    (["run-model", "{model}", "--input", "x={tmp}/none.npy"], "argument --input: {tmp}/none.npy does not exist; "
                                                              "give a .npy file"),
    (["run-model", "{model}", "--target", "bogus"], "argument --target: 'bogus'"),
    (["run-model", "{model}", "--emulate"], "--emulate: only a model compiled for a GPU is emulated; "
                                            "add --target cuda"),
    (["run-model", "{model}", "--target", "cuda -arch=sm_90", "--cuda-source"],
     "--cuda-source: it says how --emulate runs the kernels; add --emulate"),
]


@pytest.mark.parametrize("argv, message", MISTAKES, ids=[" ".join(argv) for argv, _ in MISTAKES])
def test_a_mistake_in_the_arguments_exits_with_status_2_and_one_line_naming_it(log, tmp_path, capsys, request,
                                                                                 argv, message):
    names = {"log": log, "tmp": tmp_path, "notlog": tmp_path / "notes.json", "empty": tmp_path / "empty.json"}
    names["notlog"].write_text("hello\n{\"a\": 1}\n")
    names["empty"].write_text("")
    if any("{model}" in arg for arg in argv):
        names["model"] = request.getfixturevalue("onnx_model")
    try:
        status = main([arg.format(**names) for arg in argv])
    except SystemExit as exit_info:  # argparse's own errors
        status = exit_info.code
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if "error:" in line]
    assert status == 2 and out == "" and "Traceback" not in err
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1]
    assert errors[0].startswith(f"tilecraft {argv[0]}: error: ") and message.format(**names) in errors[0]


@pytest.mark.parametrize("visible, devices, seen", [(None, [2, 0], "2,0"), ("4,6,7", [2, 0], "7,4")])
def test_device_lets_the_tuner_see_the_gpus_it_names_counted_as_the_shell_let_it(monkeypatch, visible, devices, seen):
    """``--device cuda:2,cuda:0`` leaves the tuner, its workers and the target's reading of GPU 0
    those GPUs alone, in that order; within a CUDA_VISIBLE_DEVICES already set, cuda:2 is its third."""
    from tilecraft.cli import _show_only_gpus

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _show_only_gpus(devices)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == seen


def test_device_past_the_gpus_the_shell_lets_the_tuner_see_is_refused_with_the_fix(monkeypatch):
    from tilecraft.cli import _show_only_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(CommandError, match=re.escape("--device: this process sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=3), "
                                                     "so there is no cuda:1; count the GPUs within that list, from 0")):
        _show_only_gpus([0, 1])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize("command", ["tune", "tune-model"])
def test_device_tunes_on_the_gpus_it_names_with_the_first_ones_target(onnx_model, tmp_path, monkeypatch, command):
    """Each tuning command measures on a runner of those GPUs (a worker each), for the first's arch;
    the tuning itself is left out here, since no GPU measures on this machine."""
    import tilecraft.cli as cli

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(cli.CudaTarget, "device", classmethod(lambda cls: cls("cuda -arch=sm_80")))
    monkeypatch.setattr("tilecraft.tune.task.cuda_available", lambda: True)  # as where such GPUs are
    runners, tuned = [], []
    monkeypatch.setattr(cli, "LocalRunner", lambda **settings: runners.append(settings) or contextlib.nullcontext())
    monkeypatch.setattr(cli.SearchTask, "tune", lambda task, options, **kwargs: tuned.append(task.target))
    monkeypatch.setattr(cli.TaskScheduler, "tune", lambda scheduler, options, **kwargs: tuned.append(
        scheduler.states[0].task.target) or 1e-3)
    monkeypatch.setattr(cli, "load_best_record", lambda *args: SimpleNamespace(gflops=1.0, cost=1e-3))
    monkeypatch.setattr(cli, "_how_measured", lambda best: "")
    argv = [*TUNE, "--trials", "1"] if command == "tune" else ["tune-model", str(onnx_model), "--trials", "1"]
    assert main([*argv, "--device", "cuda:3,cuda:1", "--no-transfer", "--log", str(tmp_path / "log.json")]) == 0
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,1" and runners[0]["gpus"] == (0, 1)
    assert [str(target) for target in tuned] == [str(tc.CudaTarget("cuda -arch=sm_80"))]


@pytest.mark.parametrize("argv, message", [
    (["--trials", "-3"], "argument --trials: -3: give the number of measurements to make"),
    (["--shape", "512,512"], "--shape: matmul takes 3 sizes (N, L, M), got 2: 512,512"),
])
@pytest.mark.slow
def test_the_command_as_a_person_runs_it_answers_a_mistake_in_one_line(tmp_path, argv, message):
    command = [sys.executable, "-m", "tilecraft.cli", "tune", "matmul", "--shape", "16,16,16", "--trials", "4", *argv]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    assert message in done.stderr.splitlines()[-1] and not list(tmp_path.iterdir())


def test_optional_sizes_left_out_of_the_shape_take_the_workloads_defaults():
    assert _workload_args("conv2d", (1, 3, 8, 8, 4, 3, 3), "float32") == (1, 3, 8, 8, 4, 3, 3, 1, 0, "float32")
    assert _workload_args("matmul", (4, 5, 6), "float16") == (4, 5, 6, "float16")
    assert _workload_args("matmul", (4, 5, 6), "bfloat16", "float32") == (4, 5, 6, "bfloat16", "float32")
    with pytest.raises(CommandError, match="--out-dtype: softmax sums in its own dtype; matmul take"):
        _workload_args("softmax", (4, 5), "bfloat16", "float32")


def test_best_of_a_log_of_errors_only_shows_them_and_fails_with_status_1(tmp_path, capsys):
    path = tmp_path / "errors.json"
    path.write_text(_record(None, error="run_timeout").to_json_line() + "\n")
    assert main(["best", str(path)]) == 1
    captured = capsys.readouterr()
    assert "run_timeout 1" in captured.out and "no valid record" in captured.out
    assert captured.err.startswith("tilecraft best: error: none of the 1 records selected")
    assert len(captured.err.splitlines()) == 1
    with pytest.raises(tc.database.NoValidRecordError, match="none of the 1 records selected"):
        main(["--debug", "best", str(path)])  # the traceback, for a bug report


def test_a_torn_line_is_reported_as_a_warning(log, capsys):
    with open(log, "a") as file:
        file.write('{"v":1,"key":')
    assert main(["best", str(log)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("tilecraft: warning: ") and "line 6: the last line is incomplete" in err


@pytest.mark.slow  # a second and a half: matplotlib imported and drawing
def test_report_writes_a_png(log, tmp_path, capsys):
    output = tmp_path / "plots" / "report.png"
    assert main(["report", str(log), "-o", str(output)]) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and output.stat().st_size > 10_000
    assert f"wrote {output} (5 trials of 2 workload/target pair(s))" in capsys.readouterr().out


def test_report_without_matplotlib_says_what_to_install(log, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["report", str(log), "-o", str(tmp_path / "r.png")]) == 2
    assert "pip install 'tilecraft[plot]'" in capsys.readouterr().err


def test_every_command_is_registered_and_one_is_required(capsys):
    assert [c.__name__ for c in COMMANDS] == ["add_tune_command", "add_best_command", "add_report_command",
                                              "add_tasks_command", "add_tune_model_command",
                                              "add_choose_in_place_command", "add_run_model_command",
                                              "add_serve_command", "add_db_command"]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_tune_command_tunes_and_resumes(tmp_path, capsys):
    log = tmp_path / "mm.json"
    argv = ["tune", "matmul", "--shape", "16,16,16", "--trials", "2", "--per-round", "2", "--log", str(log),
            "--verbose", "0", "--no-transfer"]
    assert main(argv) == 0
    assert main(argv) == 0  # resumes: two more, none measured twice
    records = load_records(log)
    searched = [r for r in records if r.phase == "search"]
    assert len(searched) == 4 and len({r.trace_json for r in searched}) == 4
    finals = [r for r in records if r.phase == "final"]  # 5 repeats each, of the first run's two, then of all four
    assert len(finals) == 2 + 4 and all(len(r.costs) == 5 for r in finals), [r.error_msg for r in finals]
    assert {r.trace_json for r in finals} == {r.trace_json for r in searched}
    assert re.search(r"best of the whole log .*\(median of 5 re-measured\)", capsys.readouterr().out)


@pytest.mark.slow
def test_tune_command_transfers_from_another_workloads_log_and_says_when_it_teaches_nothing(tmp_path, capsys):
    donor, log = tmp_path / "small.json", tmp_path / "mm.json"
    assert main(["tune", "matmul", "--shape", "16,16,16", "--trials", "4", "--per-round", "4", "--log", str(donor),
                 "--verbose", "0", "--no-transfer", "--remeasure", "0"]) == 0
    argv = ["tune", "matmul", "--shape", "32,16,16", "--trials", "2", "--per-round", "2", "--log", str(log),
            "--verbose", "0", "--remeasure", "0", "--no-transfer", "--transfer", str(donor)]  # only the logs named
    assert main(argv) == 0
    assert {r.workload["args"][0] for r in load_records(log)} == {32} and len(load_records(log)) == 2
    argv = ["tune", "dense", "--shape", "1,16,16", "--trials", "2", "--log", str(tmp_path / "dense.json")]
    assert main([*argv, "--no-transfer", "--transfer", str(donor)]) == 2  # a matmul teaches dense nothing
    assert "no record of a reduction of the kind reduce0[i.k,j.k]; tune it on a" in capsys.readouterr().err


@pytest.mark.slow
def test_tune_command_learns_the_default_database_and_its_own_logs_other_workloads_unless_told_not_to(
        tmp_path, capsys):
    log = tmp_path / "mm.json"
    argv = ["tune", "matmul", "--trials", "2", "--per-round", "2", "--log", str(log), "--remeasure", "0"]
    assert main([*argv, "--shape", "16,16,16", "--no-transfer"]) == 0
    assert "first learns" not in capsys.readouterr().out
    assert main([*argv, "--shape", "32,16,16", "--target", "llvm -isa=scalar"]) == 0
    said = capsys.readouterr().out  # the default database holds no scalar machine
    assert "first learns" not in said and "starts from nothing: nothing to transfer from" in said
    assert main([*argv, "--shape", "48,16,16"]) == 0
    said = capsys.readouterr().out
    if tc.Target.host().isa in ("avx2", "avx512"):  # the machines the default database was measured on
        assert re.search(rf"first learns \d+ records of [6-9] other workloads in {re.escape(str(log))}, "
                         r"the default database \(--no-transfer", said)
    else:
        assert f"first learns 2 records of 1 other workload in {log} (--no-transfer" in said
    assert sorted(r.workload["args"][0] for r in load_records(log)) == [16, 16, 32, 32, 48, 48]


@pytest.mark.parametrize("command", ["tune", "tune-model"])
def test_tuning_for_a_gpu_where_none_can_run_stops_before_any_work(command, onnx_model, tmp_path, capsys,
                                                                   monkeypatch):
    """No cost model taught, no log written: its launches, all failed here, would keep a resumed
    tuning on a GPU from measuring them."""
    monkeypatch.setattr("tilecraft.tune.task.cuda_available", lambda: False)
    log = tmp_path / "log.json"
    argv = ["tune", "matmul", "--shape", "16,16,16"] if command == "tune" else ["tune-model", str(onnx_model)]
    assert main([*argv, "--target", "cuda -arch=sm_90", "--trials", "4", "--log", str(log)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "times CUDA kernels on a GPU, and none can run here" in err.splitlines()[-1]
    assert not log.exists()


@pytest.mark.slow
def test_tune_command_stops_at_its_time_limit_and_tune_model_too(onnx_model, tmp_path):
    log = tmp_path / "mm.json"
    started = time.perf_counter()
    assert main(["tune", "matmul", "--shape", "16,16,16", "--trials", "100000", "--per-round", "4", "--time", "2s",
                 "--log", str(log), "--verbose", "0", "--no-transfer", "--remeasure", "0"]) == 0
    assert time.perf_counter() - started < 10 and 0 < len(load_records(log)) < 100000
    started = time.perf_counter()
    assert main(["tune-model", str(onnx_model), "--trials", "100000", "--per-round", "2", "--time", "2s",
                 "--log", str(tmp_path / "model.json"), "--verbose", "0", "--no-transfer", "--remeasure", "0",
                 "--in-place", "0"]) == 0
    assert time.perf_counter() - started < 15 and 0 < len(load_records(tmp_path / "model.json")) < 100000


@pytest.fixture
def onnx_model(tmp_path):
    """conv + relu on a [1, 2, 6, 6] input, saved as tmp_path/model.onnx."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "model.onnx")
    return tmp_path / "model.onnx"


def test_tasks_prints_the_task_table(onnx_model, capsys):
    assert main(["tasks", str(onnx_model)]) == 0
    out = capsys.readouterr().out
    assert "conv2d_nhwc+relu" in out and "1x4x4x4" in out and "3 tasks, 3 kernels" in out


@pytest.mark.slow
def test_tune_model_shares_the_trials_over_the_tasks_then_run_model_uses_the_log(onnx_model, tmp_path, capsys):
    log = tmp_path / "model.json"
    assert main(["tune-model", str(onnx_model), "--trials", "8", "--per-round", "2", "--log", str(log),
                 "--remeasure", "1", "--verbose", "1"]) == 0
    said = capsys.readouterr().out
    assert "model latency as the sum of weight x best kernel latency" in said
    if tc.Target.host().isa in ("avx2", "avx512"):  # the machines the default database was measured on
        assert re.search(r"the cost model first learns \d+ records of [6-9] other workloads in the default "
                         r"database \(--no-transfer", said)
    records = [r for r in tc.load_records(log) if r.phase == "search"]
    assert len(records) == 8 and len({r.workload_key for r in records}) == 3  # a warm-up round for each task
    finals = [r for r in tc.load_records(log) if r.phase == "final"]
    assert {r.workload_key for r in finals} == {r.workload_key for r in records}  # every task re-measured
    assert "whole model, interleaved:" in said and "chosen in place" in said  # then its best timed in the model
    in_model = [r for r in tc.load_records(log) if r.phase == "model"]
    assert in_model and all(len(r.costs) == 8 and r.is_valid for r in in_model)
    assert main(["run-model", str(onnx_model), "--log", str(log)]) == 0
    assert "have the default schedule" not in capsys.readouterr().err


@pytest.mark.slow
def test_choose_in_place_times_the_best_of_a_log_tuned_before_inside_the_model(onnx_model, tmp_path, capsys):
    log = tmp_path / "model.json"
    assert main(["tune-model", str(onnx_model), "--trials", "12", "--per-round", "4", "--log", str(log),
                 "--verbose", "0", "--no-transfer", "--remeasure", "0", "--in-place", "0"]) == 0
    assert not [r for r in tc.load_records(log) if r.phase == "model"]
    capsys.readouterr()
    assert main(["choose-in-place", str(onnx_model), "--log", str(log), "--candidates", "3", "--rounds", "5"]) == 0
    said = capsys.readouterr().out
    assert "ms a call in the model:" in said and f"run it with: tilecraft run-model {onnx_model} --log {log}" in said
    timed = [r for r in tc.load_records(log) if r.phase in ("model", "model_rival")]
    assert timed and all(len(r.costs) == 5 for r in timed)
    for key in {r.workload_key for r in timed}:  # each choice: one schedule kept, the others its rivals
        theirs = [r.phase for r in timed if r.workload_key == key]
        assert len(theirs) in (2, 3) and theirs.count("model") == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("cuda_source", [False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs a C++ compiler")])])
def test_run_model_for_a_gpu_checks_its_kernels_emulated_where_there_is_no_gpu(onnx_model, tmp_path, capsys,
                                                                                cuda_source):
    """Its kernels' loop nests emulated, or (``--cuda-source``) their CUDA C run on the CPU."""
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert main(["run-model", str(onnx_model), "--target", "cuda -arch=sm_90", "--emulate", "--input",
                 str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")] + ["--cuda-source"] * cuda_source) == 0
    out = capsys.readouterr().out
    assert "y: float32[1, 4, 4, 4]" in out and "latency" not in out
    expected = run_reference(tc.frontend.from_onnx(str(onnx_model)), {"x": x})["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_tune_model_warms_each_task_up_with_the_trials_asked(onnx_model, tmp_path):
    log = tmp_path / "model.json"
    assert main(["tune-model", str(onnx_model), "--trials", "5", "--per-round", "2", "--warm-up", "1",
                 "--log", str(log), "--verbose", "0", "--no-transfer", "--remeasure", "0", "--in-place", "0"]) == 0
    keys = [r.workload_key for r in tc.load_records(log)]
    assert len(keys) == 5 and len(set(keys[:3])) == 3  # one measurement of each task first


@pytest.mark.slow
def test_tune_model_of_some_tasks_with_flushed_caches_into_a_log_run_model_takes_first(onnx_model, tmp_path,
                                                                                       capsys):
    tasks, _ = tc.extract_tasks(str(onnx_model))
    chosen = [t for t in tasks if t.desc.startswith("conv2d_nhwc+relu")]
    assert len(chosen) == 1
    flushed = tmp_path / "flushed.json"
    assert main(["tune-model", str(onnx_model), "--trials", "2", "--per-round", "2", "--log", str(flushed),
                 "--tasks", "^conv2d_nhwc\\+relu", "--cache-flush", "--verbose", "0", "--no-transfer",
                 "--in-place", "0"]) == 0
    assert {r.workload_key for r in tc.load_records(flushed)} == {chosen[0].workload_key}
    capsys.readouterr()
    assert main(["run-model", str(onnx_model), "--log", str(flushed), "--log", str(flushed)]) == 0
    err = capsys.readouterr().err
    assert "2 of 3 kernels, " in err and "have the default schedule" in err
    assert f"no record in {flushed}, {flushed}" in err


@pytest.mark.slow
def test_run_model_runs_saves_the_output_and_times_it(onnx_model, tmp_path, capsys):
    from tilecraft.frontend import from_onnx
    from tilecraft.graph import run_reference

    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert main(["run-model", str(onnx_model), "--input", f"x={tmp_path / 'x.npy'}", "--output",
                 str(tmp_path / "y.npy")]) == 0
    captured = capsys.readouterr()
    assert "y: float32[1, 4, 4, 4] [" in captured.out and "latency:" in captured.out
    assert "3 of 3 kernels, 100% of the model's FLOPs, have the default schedule" in captured.err
    assert "no log given" in captured.err
    expected = run_reference(from_onnx(str(onnx_model)), {"x": x})["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_run_model_of_a_saved_model_and_its_input_errors(onnx_model, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc.compile_model(str(onnx_model)).save(tmp_path / "saved")
    np.save(tmp_path / "x64.npy", np.zeros((1, 2, 6, 6)))
    assert main(["run-model", str(tmp_path / "saved"), "--profile"]) == 0  # random inputs
    out = capsys.readouterr().out
    assert "y: float32[1, 4, 4, 4]" in out
    rows = [_cells(line) for line in out[out.index("calls"):].splitlines()]
    kernels = [row for row in rows if row[-1:] in (["default"], ["tuned"])]
    assert len(kernels) == 3 and all(row[-1] == "default" for row in kernels)  # 3 kernels, all untuned
    assert next(row for row in rows if row[:1] == ["all kernels"])[1] == "3"  # their calls, in all
    assert main(["run-model", str(tmp_path / "saved"), "--input", str(tmp_path / "x64.npy")]) == 2
    assert "--input: input x must be a numpy array float32[1, 2, 6, 6] but got float64" in capsys.readouterr().err


def test_db_imports_logs_into_a_store_and_exports_them_as_one_log(log, tmp_path, capsys):
    store, merged = tmp_path / "records.db", tmp_path / "merged.json"
    assert main(["db", "import", str(store), str(log), str(log)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{log}: 5 records added to {store} (10 in all)"
    assert main(["db", "export", str(store), str(merged)]) == 0
    assert merged.read_text() == log.read_text() * 2  # the same lines, in the order they were added
    capsys.readouterr()
    tables = []
    for path in (merged, store):  # a store reads as its log
        assert main(["best", str(path)]) == 0
        tables.append([line.rstrip() for line in capsys.readouterr().out.splitlines()[1:]])
    assert tables[0] == tables[1] and "def apply_trace(sch):" in "\n".join(tables[1])
    assert main(["db", "export", str(store), str(merged)]) == 2
    assert f"{merged} exists; export into a new file" in capsys.readouterr().err
    assert main(["db", "import", str(store), str(tmp_path / "nosuch.json")]) == 2
    assert "no such file:" in capsys.readouterr().err
