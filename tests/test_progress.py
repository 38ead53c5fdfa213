"""ProgressReporter: silent at verbose 0, a status line with best and errors at 1, notes at 2."""

import io
from enum import Enum

import pytest
from rich.console import Console

from tilecraft.tune.progress import ProgressReporter


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Kind(str, Enum):
    NONE = "none"
    RUN_TIMEOUT = "run_timeout"


def _run(reporter, clock, trials=10):
    """Trials 2 s apart; every fourth a compile error; the n-th valid one at 10 + n GFLOPS."""
    for n in range(trials):
        clock.now += 2.0
        if n % 4 == 3:
            reporter.update(None, None, "compile")
        else:
            reporter.update(10.0 + n, 1e-3 / (n + 1), _Kind.NONE)
        if n == 4:
            reporter.note("round 1: 5 measured, 1 error")


def test_verbose_0_prints_nothing_at_all():
    for console in (io.StringIO(), Console(file=io.StringIO(), force_terminal=True)):
        clock = _Clock()
        with ProgressReporter(10, verbose=0, console=console, clock=clock) as reporter:
            reporter.phase("search")
            _run(reporter, clock)
        output = console if isinstance(console, io.StringIO) else console.file
        assert output.getvalue() == ""
        assert reporter.trials == 10 and reporter.valid == 8 and reporter.errors == {"compile": 2}


def test_verbose_1_without_a_terminal_prints_plain_status_lines_and_a_summary():
    out, clock = io.StringIO(), _Clock()
    with ProgressReporter(10, verbose=1, peak_gflops=100.0, task_name="matmul", console=out, plain_every=5,
                          clock=clock) as reporter:
        _run(reporter, clock, trials=7)
    text = out.getvalue()
    assert "\x1b[" not in text  # no terminal codes in a CI log
    lines = text.splitlines()
    assert lines[0] == ("[matmul] trials 5/10, valid 4, best 14.0 GFLOPS 0.2 ms (14% of peak), errors compile 1, "
                        "elapsed 0:00:10, ETA 0:00:10")
    assert lines[1].startswith("[matmul] trials 7/10, valid 6, best 16.0 GFLOPS")  # the last count, at close
    assert "round 1" not in text  # notes are for verbose 2
    for row in ("trials", "7 of 10", "errors: compile", "best GFLOPS", "16.00", "of peak", "16.0% of 100 GFLOPS",
                "best latency", "0.1429 ms", "elapsed", "0:00:14"):
        assert row in text


def test_after_a_re_measurement_the_summary_leads_with_its_median_and_spread():
    out, clock = io.StringIO(), _Clock()
    with ProgressReporter(10, verbose=1, peak_gflops=100.0, task_name="matmul", console=out, clock=clock) as reporter:
        _run(reporter, clock, trials=7)
        reporter.remeasured(2e6, (2e-4, 1e-4, 4e-4), finalists=6)  # 2 MFLOP: 10, 20 and 5 GFLOPS
    text = out.getvalue()
    for row in ("best GFLOPS", "10.00 (median of 3, re-measured)", "spread", "5.00-20.00 GFLOPS, the best of 6 "
                "finalists", "while searching", "16.00 GFLOPS", "best latency", "0.2 ms", "10.0% of 100 GFLOPS"):
        assert row in text


def test_verbose_1_on_a_terminal_draws_a_live_bar():
    file, clock = io.StringIO(), _Clock()
    console = Console(file=file, force_terminal=True, width=160)
    with ProgressReporter(20, verbose=1, task_name="conv2d", console=console, clock=clock) as reporter:
        reporter.phase("run")
        _run(reporter, clock)
    text = file.getvalue()
    assert "conv2d run" in text and "10/20" in text
    assert "best 19.0 GFLOPS 0.1 ms, errors compile 2" in text
    assert "ETA 0:00:20" in text and "Tuning summary: conv2d" in text


def test_verbose_2_adds_the_notes():
    out, clock = io.StringIO(), _Clock()
    with ProgressReporter(10, verbose=2, console=out, clock=clock) as reporter:
        _run(reporter, clock)
    assert "round 1: 5 measured, 1 error" in out.getvalue()


def test_eta_follows_the_mean_pace_and_errors_count_by_kind():
    clock = _Clock()
    reporter = ProgressReporter(100, verbose=0, clock=clock)
    assert reporter.eta_secs is None and reporter.status() == "best -, errors none"
    clock.now += 30.0
    for kind in ("run_timeout", "compile", "run_timeout"):
        reporter.update(None, None, kind)
    assert reporter.eta_secs == pytest.approx(30.0 / 3 * 97)
    assert reporter.status() == "best -, errors run_timeout 2, compile 1"


def test_verbose_must_be_0_1_or_2():
    with pytest.raises(ValueError, match="verbose must be 0"):
        ProgressReporter(10, verbose=3)
