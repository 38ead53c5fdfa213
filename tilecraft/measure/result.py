"""The values of the measure pipeline: ``MeasureInput -> BuildResult -> MeasureResult``.

A candidate is a trace applied to a ``ComputeDAG`` for a ``Target``. The builder turns
it into a shared library (or an error), the runner into timings (or an error). Every
failure a candidate can cause is a value here, never an exception in the tuner: its
kind says which stage failed, its message what happened, trimmed so that one broken
candidate cannot flood a log.
"""

from __future__ import annotations

import enum
import math
import statistics
import traceback
from dataclasses import dataclass
from typing import Any, Sequence

from ..runtime.module import ArgSpec, PackSpec
from ..schedule.trace import Trace
from ..target import Target
from ..te.dag import ComputeDAG

MAX_MESSAGE_CHARS = 2000


class MeasureErrorKind(str, enum.Enum):
    """Why a candidate has no timing; ``NONE`` when it has one."""

    NONE = "none"                    #: no error; the candidate was measured and has costs
    INSTANTIATION = "instantiation"  #: the trace could not be replayed on the dag
    COMPILE = "compile"              #: lowering or code generation raised, or the C compiler rejected the source
    RUNTIME = "runtime"              #: the worker raised (library or symbol not loadable, argument mismatch, ...)
    WRONG_ANSWER = "wrong_answer"    #: an output differs from the NumPy reference
    BUILD_TIMEOUT = "build_timeout"  #: the C compiler ran past the builder's timeout
    RUN_TIMEOUT = "run_timeout"      #: the kernel ran past the runner's timeout; its worker was killed
    WORKER_CRASH = "worker_crash"    #: the worker process died (segfault, abort, out-of-memory kill, ...)


@dataclass(frozen=True, slots=True)
class MeasureInput:
    """One candidate: ``trace`` replayed on ``dag``, compiled for ``target``."""

    dag: ComputeDAG
    target: Target
    trace: Trace


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A compiled candidate: ``lib_path`` holds ``entry_name`` taking ``args`` (packing
    inputs with ``packs``); ``lib_path`` is None exactly when ``error_kind`` is not NONE.
    ``time_cost`` is the seconds spent building this candidate. For a CUDA target
    ``lib_path`` is a cubin and ``launch`` how its kernels are launched, and the workspace
    they pass between them (``runtime.cuda.launch_json``)."""

    lib_path: str | None
    source: str
    entry_name: str
    args: tuple[ArgSpec, ...]
    packs: tuple[PackSpec, ...]
    error_kind: MeasureErrorKind
    error_msg: str
    time_cost: float
    launch: dict | None = None  # a CUDA module's kernels: {'launch': ..., 'workspace': [...]}

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_msg", trim_message(self.error_msg))
        if (self.lib_path is None) != (self.error_kind is not MeasureErrorKind.NONE):
            raise ValueError(f"a BuildResult has a lib_path exactly when it has no error; "
                             f"got lib_path={self.lib_path!r} with error_kind={self.error_kind.value}")

    @staticmethod
    def failed(kind: MeasureErrorKind, message: str, time_cost: float, source: str = "",
               entry_name: str = "") -> BuildResult:
        """The result of a candidate that failed to build, with its error kind and message."""
        return BuildResult(None, source, entry_name, (), (), kind, message, time_cost)


@dataclass(frozen=True, slots=True)
class MeasureResult:
    """Seconds per kernel call, one entry per repeat (empty on error). ``all_cost`` is
    the wall-clock seconds the candidate took end to end (build and run); ``timestamp``
    the Unix time it finished. ``phase`` is ``"search"``, or ``"final"`` for the
    re-measurement of a best candidate when tuning ends; ``device`` names what measured
    it (``"local@<host name>"`` for a ``LocalRunner``), None when not known."""

    costs: tuple[float, ...]
    error_kind: MeasureErrorKind
    error_msg: str
    all_cost: float
    timestamp: float
    phase: str = "search"
    device: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_msg", trim_message(self.error_msg))
        if bool(self.costs) != (self.error_kind is MeasureErrorKind.NONE):
            raise ValueError(f"a MeasureResult has costs exactly when it has no error; "
                             f"got {len(self.costs)} cost(s) with error_kind={self.error_kind.value}")

    @property
    def is_valid(self) -> bool:
        """Whether the candidate was measured without error."""
        return self.error_kind is MeasureErrorKind.NONE

    @property
    def mean_cost(self) -> float:
        """Mean seconds per call; infinity for a candidate that failed."""
        return statistics.fmean(self.costs) if self.is_valid else math.inf


def trim_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start (what failed) and
    its end (the last lines of a compiler's or a traceback's output)."""
    if len(text) <= limit:
        return text
    tail = limit // 4
    head = limit - tail
    return f"{text[:head]}\n... ({len(text) - limit} characters trimmed) ...\n{text[-tail:]}"


def error_line(error: BaseException) -> str:
    """``Type: message``, as the last line of a traceback reads."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def check_run(runner: str, inputs: Sequence[Any], builds: Sequence[Any], closed: bool) -> None:
    """What every runner's ``run`` checks of its call before measuring anything.

    Raises:
        ValueError: If ``inputs`` and ``builds`` differ in length.
        RuntimeError: If the runner was closed.
    """
    if len(inputs) != len(builds):
        raise ValueError(f"{runner}.run got {len(inputs)} inputs and {len(builds)} build results; "
                         f"pass the builder's results for exactly these inputs")
    if closed:
        raise RuntimeError(f"this {runner} was closed; create a new one")
