"""What a tuning run shows while it runs: trials done, best so far, errors by kind, ETA.

Ansor shows a dot per trial and an ``E`` per error, with no reason and no end time in
sight. ``ProgressReporter`` instead keeps one status line: trials done of the total,
the best throughput and latency so far (and the share of the machine's peak, when
known), the errors counted by kind, the elapsed time and an estimate of the time left.
``close`` prints a summary table; when the best candidates were measured again at the
end (``remeasured``), it leads with the median of that re-measurement and its spread, the
number a user's own timing should find, and shows the search's best single measurement
beside it.

How much it shows is ``verbose``: 0 nothing at all, 1 the status line and the summary,
2 also a line per round (``note``). On a terminal the status line is a live ``rich``
progress bar; anywhere else (a CI log, a file) it is printed as plain text every
``plain_every`` trials and at most every ``plain_every_secs`` seconds apart otherwise,
so a log shows progress without filling up with redraws.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from datetime import timedelta
from typing import Any, Callable, TextIO

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..tables import print_table

NO_ERROR = "none"


class ProgressReporter:
    """Progress of one tuning run of ``total_trials`` measurements.

    Call ``update`` after every measurement, ``note`` for a line of detail (shown at
    ``verbose >= 2``), ``phase`` to label what the tuner is doing, and ``close`` at the end
    (or use it as a context manager). ``console`` is a ``rich`` Console or a text file;
    by default standard output. ``clock`` returns seconds (tests pass a fake one). With a
    ``time_budget_secs``, the estimate of the time left never passes what the budget leaves.
    """

    def __init__(self, total_trials: int, verbose: int = 1, peak_gflops: float | None = None,
                 task_name: str = "", console: Console | TextIO | None = None, plain_every: int | None = None,
                 plain_every_secs: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 time_budget_secs: float | None = None) -> None:
        if total_trials < 0:
            raise ValueError(f"total_trials must not be negative, not {total_trials}")
        if verbose not in (0, 1, 2):
            raise ValueError(f"verbose must be 0 (silent), 1 (status line) or 2 (a line per round), not {verbose}")
        self.total_trials = total_trials
        self.time_budget_secs = time_budget_secs
        self.verbose = verbose
        self.peak_gflops = peak_gflops
        self.task_name = task_name
        self.trials = 0
        self.valid = 0
        self.errors: Counter[str] = Counter()
        self.rejected = 0  # candidates refused before building (the GPU verifier), set by the tuner
        self.best_gflops: float | None = None
        self.best_latency_secs: float | None = None
        self.final: tuple[float, tuple[float, ...], int] | None = None  # flop, the best's repeats, finalists
        self._clock = clock
        self._started = clock()
        self._phase = ""
        self._plain_every = plain_every or max(1, math.ceil(total_trials / 10))
        self._plain_every_secs = plain_every_secs
        self._last_plain_line = self._started
        self._last_plain_trials = 0
        self._closed = False
        self._console: Console | None = None
        if verbose:
            self._console = console if isinstance(console, Console) else Console(file=console)
        self._live = self._console is not None and self._console.is_terminal
        self._progress: Progress | None = None
        self._bar_task: Any = None

    # -- what the tuner calls -------------------------------------------------------

    def update(self, result_gflops: float | None, latency_secs: float | None, error_kind: Any = NO_ERROR) -> None:
        """One measurement done: its throughput and latency, or the kind of error it met."""
        kind = str(getattr(error_kind, "value", error_kind) or NO_ERROR)
        self.trials += 1
        if kind == NO_ERROR:
            self.valid += 1
            if result_gflops is not None and (self.best_gflops is None or result_gflops > self.best_gflops):
                self.best_gflops = result_gflops
            if latency_secs is not None and (self.best_latency_secs is None or latency_secs < self.best_latency_secs):
                self.best_latency_secs = latency_secs
        else:
            self.errors[kind] += 1
        if self._live:
            self._refresh_bar()
        elif self._console is not None and self._plain_line_is_due():
            self._print_plain_line()

    def note(self, text: str) -> None:
        """A line of detail, such as a round's summary; shown at ``verbose >= 2``."""
        if self.verbose >= 2 and self._console is not None:
            self._print(text)

    def remeasured(self, flop: float, costs: tuple[float, ...], finalists: int) -> None:
        """The best finalist's repeats (seconds) after ``finalists`` were measured again."""
        self.final = (flop, tuple(costs), finalists)

    def phase(self, name: str) -> None:
        """Label what the tuner is doing now (``"search"``, ``"build"``, ``"run"``)."""
        self._phase = name
        if self._live:
            self._refresh_bar()

    def close(self) -> None:
        """Stop the status line and print the summary table (once)."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._refresh_bar()
            self._progress.stop()
        if self._console is None:
            return
        if not self._live and self.trials != self._last_plain_trials:
            self._print_plain_line()  # the final count, if the last periodic line missed it
        print_table(self.summary_table(), self._console)

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- what is shown ----------------------------------------------------------------

    @property
    def elapsed_secs(self) -> float:
        return self._clock() - self._started

    @property
    def eta_secs(self) -> float | None:
        """Time left at the mean pace so far, within the time budget; None before the first trial."""
        return _eta(self.elapsed_secs, self.trials, self.total_trials, self.time_budget_secs)

    def status(self) -> str:
        """Best so far and errors by kind, e.g. ``best 95.2 GFLOPS 1.41 ms (48% of peak), errors compile 2``."""
        if self.best_gflops is None and self.best_latency_secs is None:
            best = "best -"
        else:
            parts = []
            if self.best_gflops is not None:
                parts.append(f"{self.best_gflops:.1f} GFLOPS")
            if self.best_latency_secs is not None:
                parts.append(_format_latency(self.best_latency_secs))
            best = "best " + " ".join(parts)
            if self.peak_gflops and self.best_gflops is not None:
                best += f" ({100 * self.best_gflops / self.peak_gflops:.0f}% of peak)"
        errors = ", ".join(f"{kind} {n}" for kind, n in self.errors.most_common()) or "none"
        return f"{best}, errors {errors}"

    def summary_table(self) -> Table:
        table = Table(title=f"Tuning summary{': ' + self.task_name if self.task_name else ''}", show_header=False,
                      box=box.SIMPLE if self._live else box.ASCII, title_justify="left")
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("trials", f"{self.trials} of {self.total_trials}")
        table.add_row("valid", str(self.valid))
        for kind, n in self.errors.most_common():
            table.add_row(f"errors: {kind}", str(n))
        if self.rejected:
            table.add_row("refused unbuilt", f"{self.rejected} (over the GPU's limits)")
        gflops, latency = self.best_gflops, self.best_latency_secs
        if self.final is not None:
            flop, costs, finalists = self.final
            latency = statistics.median(costs)
            gflops = flop / latency / 1e9
            table.add_row("best GFLOPS", f"{gflops:.2f} (median of {len(costs)}, re-measured)")
            table.add_row("spread", f"{flop / max(costs) / 1e9:.2f}-{flop / min(costs) / 1e9:.2f} GFLOPS, "
                                    f"the best of {finalists} finalists")
            table.add_row("while searching", "-" if self.best_gflops is None else f"{self.best_gflops:.2f} GFLOPS")
        else:
            table.add_row("best GFLOPS", "-" if gflops is None else f"{gflops:.2f}")
        table.add_row("best latency", "-" if latency is None else _format_latency(latency))
        if self.peak_gflops:
            share = "-" if gflops is None else f"{100 * gflops / self.peak_gflops:.1f}%"
            table.add_row("of peak", f"{share} of {self.peak_gflops:.0f} GFLOPS")
        table.add_row("elapsed", _format_secs(self.elapsed_secs))
        return table

    # -- output ---------------------------------------------------------------------

    def _refresh_bar(self) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), _EtaColumn(),
                console=self._console, get_time=self._clock, redirect_stdout=False, redirect_stderr=False)
            self._progress.start()
            self._bar_task = self._progress.add_task(self._description(), total=self.total_trials or None,
                                                     status=self.status(), budget=self.time_budget_secs)
        self._progress.update(self._bar_task, completed=self.trials, description=self._description(),
                              status=self.status())

    def _description(self) -> str:
        return " ".join(part for part in (self.task_name, self._phase) if part) or "tuning"

    def _plain_line_is_due(self) -> bool:
        return (self.trials % self._plain_every == 0 or self.trials == self.total_trials
                or self._clock() - self._last_plain_line >= self._plain_every_secs)

    def _print_plain_line(self) -> None:
        self._last_plain_line = self._clock()
        self._last_plain_trials = self.trials
        eta = self.eta_secs
        prefix = f"[{self.task_name}] " if self.task_name else ""
        self._print(f"{prefix}trials {self.trials}/{self.total_trials}, valid {self.valid}, {self.status()}, "
                    f"elapsed {_format_secs(self.elapsed_secs)}, ETA {'-' if eta is None else _format_secs(eta)}")

    def _print(self, text: str) -> None:
        console = self._progress.console if self._progress is not None else self._console
        console.print(text, markup=False, highlight=False, soft_wrap=True)


class _EtaColumn(ProgressColumn):
    """Time left at the mean pace since the start (steadier than rich's recent-speed estimate:
    measurements take from milliseconds to a timeout)."""

    def render(self, task: Task) -> Text:
        eta = _eta(task.elapsed or 0.0, int(task.completed), int(task.total or 0), task.fields.get("budget"))
        return Text(f"ETA {'-:--:--' if eta is None else _format_secs(eta)}", style="progress.remaining")


def _eta(elapsed_secs: float, done: int, total: int, budget_secs: float | None = None) -> float | None:
    if done <= 0:
        return None
    eta = elapsed_secs / done * max(0, total - done)
    return eta if budget_secs is None else max(0.0, min(eta, budget_secs - elapsed_secs))


def _format_secs(secs: float) -> str:
    return str(timedelta(seconds=round(secs)))


def _format_latency(secs: float) -> str:
    return f"{secs * 1e3:.4g} ms"
