"""``LocalRunner``: built candidates are checked and timed in a worker process that may die.

Candidates run one at a time (timings must not overlap) in a long-lived worker
(``worker.py``), reused from one candidate to the next because starting Python and
NumPy costs far more than measuring a small kernel. When a kernel crashes its worker,
the candidate is recorded as WORKER_CRASH with the signal; when it runs past
``timeout_secs``, the worker is killed and the candidate recorded as RUN_TIMEOUT. In
both cases a fresh worker starts when the next candidate needs one, so no candidate
can stop the tuner. ``on_result`` hears of each candidate as it finishes, so a tuner
killed mid-batch loses at most the candidate in flight.

Every output is compared with NumPy's: per workload the runner draws inputs once (with
a fixed seed), evaluates the reference and saves both to an ``.npz`` in a temporary
directory it owns, which the worker loads and keeps.

On a machine with several GPUs (``gpus``), each GPU has a worker of its own that sees only
that GPU, and GPU kernels are measured on all of them at once, one candidate a GPU: a
kernel is timed by its GPU's clock, which another GPU's kernel does not disturb. CPU
kernels are still measured one at a time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from queue import SimpleQueue
from time import perf_counter, time
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from ..runtime.compiler import worker_env
from ..te.dag import ComputeDAG
from .result import BuildResult, MeasureErrorKind, MeasureInput, MeasureResult, check_run, error_line
from .worker import PRECISION, least_precise

REFERENCE_SEED = 0
# A random candidate may be thousands of times slower than the best (a reduction recomputed
# for every element): such a kernel ranks last on one call, and is stopped once its first
# call runs past what the fastest so far makes plausible, rather than at the run timeout.
# Both limits have a floor, so that a call that waited for a core on a busy machine (a 6 us
# kernel took 8 ms) is neither taken for the kernel's speed nor stopped.
SLOW_FACTOR, SLOW_FLOOR_SECS = 20, 0.1  # a checking call this long (this many times the fastest) is the measurement
STOP_FACTOR, STOP_ALLOWANCE_SECS = 100, 0.5  # a first call running past allowance + factor x fastest is stopped
# A GPU kernel's first timed call (CUDA events, after the checking call loaded it and an L2
# flush) reads as its later calls do, and no wait for a core enters it: one this many times
# the fastest is timed by that call alone, with no floor. In the kept H100 logs, 39% of a 2048³
# matmul's trials and 64% of a 4096³'s ran at least twice the best and under the floor; their
# further calls took 6.0 s of 306 trials and 8.7 s of 163.
GPU_SLOW_FACTOR = 2
_START_TIMEOUT_SECS = 60.0   # importing NumPy and tilecraft; not a candidate's fault when slow
_RUNS_PER_WORKER = 500       # a fresh worker now and then: loaded libraries are never unloaded
_STDERR_TAIL_CHARS = 600


class Runner(Protocol):
    """Measures built candidates. A runner that measures several at once (on several
    devices) says how many as ``measures_at_once``; one without it measures one at a time.
    One that can start a fresh worker on one of its devices, with settings changed, gives it
    as ``on_one_device(**changes)``, for the re-measurement that ends a tuning
    (``tune/remeasure.py``); one without it re-measures as it is."""

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """One result per input, in order, each also given to ``on_result`` as soon as it is known."""


class LocalRunner:
    """Checks and times built candidates on this machine, one at a time, in a worker process.

    Each candidate's outputs are first compared with NumPy's on seeded random inputs
    (WRONG_ANSWER when they differ), then timed. A kernel that crashes its worker is
    recorded as WORKER_CRASH, one that runs too long as RUN_TIMEOUT, and a fresh worker
    takes the next candidate. The timing protocol (``number``, ``repeat``,
    ``min_repeat_ms``, ``enable_cpu_cache_flush``) is that of ``Module.time_evaluator``;
    ``costs`` has one entry per repeat. By default 3 calls a repeat, at least 100 ms,
    once; with the cache flushed before every call (as the layers of a model find it:
    their weights evicted by the layers between), Ansor's one call a repeat and no
    minimum, ten times.

    Use it as a context manager, or call ``close()``, to stop the worker and delete the
    reference data; both also happen when the runner is garbage-collected or at exit.

    Args:
        timeout_secs: The longest one candidate may run in the worker (loading, checking and
            timing) before the worker is killed (RUN_TIMEOUT).
        number: Calls per measurement; None for the protocol's default.
        repeat: Measurements per candidate; None for the protocol's default.
        min_repeat_ms: The shortest a measurement may last; None for the protocol's default.
        enable_cpu_cache_flush: Flush the caches before every timed call.
        max_memory_bytes: When set, the worker's address-space limit (RLIMIT_AS); a kernel
            that allocates beyond it fails instead of swapping the machine. Address space
            counts reservations too (about 8 MiB of stack and up to 64 MiB of malloc arena per
            thread), so leave room above what the kernels touch on many-core machines. CPU
            kernels only: CUDA reserves address space past any such limit, and a GPU kernel's
            device memory is bounded already (its arguments and the L2 flush).
        evict_weights: The kernel's weights alone are evicted from the caches before every
            timed call, and the protocol is otherwise the warm one. Inside a model a layer
            finds its input in the caches, just written by the layer before, and its weights
            in memory; this measures that (``runtime/evict.py``) where a flush measures neither.
            It estimates a kernel's time in place, but tuning by it picked kernels slower in
            place than the warm protocol's (docs/experiments/tuning-with-weights-evicted.md).
        stop_slow_candidates: A candidate whose checking call takes ``SLOW_FACTOR`` times the
            fastest call this runner has measured of its workload (and at least
            ``SLOW_FLOOR_SECS``) is timed by that call alone, and one whose first call runs
            past ``STOP_FACTOR`` times it plus ``STOP_ALLOWANCE_SECS`` is stopped as a
            RUN_TIMEOUT: the search needs no precise time of a candidate it will not keep, and
            a random one can be thousands of times slower than the best. A GPU kernel is
            timed by its first timed call alone from ``GPU_SLOW_FACTOR`` times the fastest.
            False times every candidate in full, as the re-measurement of finalists does.
        gpus: The GPUs that measure CUDA kernels, by their ordinal in this process (``[0, 1]``
            for cuda:0 and cuda:1, counted within ``CUDA_VISIBLE_DEVICES`` where it is set),
            each with a worker of its own, all measuring at once; GPUs of one kind, since
            every candidate is built for one arch. None: GPU 0 alone.

    Raises:
        ValueError: If both ``enable_cpu_cache_flush`` and ``evict_weights`` are set, a
            number is below its least value, ``max_memory_bytes`` is below 64 MiB, or
            ``gpus`` is empty, repeats a GPU or names one this process cannot see.
    """

    def __init__(self, timeout_secs: float = 10.0, number: int | None = None, repeat: int | None = None,
                 min_repeat_ms: float | None = None, enable_cpu_cache_flush: bool = False,
                 max_memory_bytes: int | None = None, evict_weights: bool = False,
                 stop_slow_candidates: bool = True, gpus: Sequence[int] | None = None) -> None:
        if enable_cpu_cache_flush and evict_weights:
            raise ValueError("LocalRunner: a cache flush evicts the weights too; ask for one of "
                             "enable_cpu_cache_flush and evict_weights")
        flushed = enable_cpu_cache_flush
        number = number if number is not None else 1 if flushed else 3
        repeat = repeat if repeat is not None else 10 if flushed else 1
        min_repeat_ms = min_repeat_ms if min_repeat_ms is not None else 0 if flushed else 100
        for name, value, least in (("timeout_secs", timeout_secs, 1e-3), ("number", number, 1),
                                   ("repeat", repeat, 1), ("min_repeat_ms", min_repeat_ms, 0)):
            if value < least:
                raise ValueError(f"LocalRunner: {name}={value} must be >= {least}")
        if max_memory_bytes is not None and max_memory_bytes < 64 << 20:
            raise ValueError(f"LocalRunner: max_memory_bytes={max_memory_bytes} is below 64 MiB, too little to "
                             f"start Python and NumPy; use None for no limit")
        self.timeout_secs = timeout_secs
        self.number = number
        self.repeat = repeat
        self.min_repeat_ms = min_repeat_ms
        self.enable_cpu_cache_flush = enable_cpu_cache_flush
        self.evict_weights = evict_weights
        self.max_memory_bytes = max_memory_bytes
        self.stop_slow_candidates = stop_slow_candidates
        self.gpus, self._visible = checked_gpus(gpus, "LocalRunner")
        self.device = f"local@{socket.gethostname()}"
        self._directory = tempfile.TemporaryDirectory(prefix="tilecraft-measure-")
        self._references: dict[str, Path] = {}  # workload key -> .npz of inputs and expected outputs
        self._fastest: dict[str, float] = {}  # workload key -> the fastest call measured, in seconds
        self._workers: dict[int, _Worker] = {}  # GPU ordinal (0 without gpus) -> its worker, which CPU kernels use too
        self._lock = threading.Lock()  # the references and the fastest calls, which every GPU's thread shares

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def fresh(self, **changes: Any) -> LocalRunner:
        """A new runner with this one's settings, changed by ``changes`` (``repeat=1``), and a
        worker of its own: the re-measurement when tuning ends runs in a fresh process, as
        a user's program would."""
        settings = {"timeout_secs": self.timeout_secs, "number": self.number, "repeat": self.repeat,
                    "min_repeat_ms": self.min_repeat_ms, "enable_cpu_cache_flush": self.enable_cpu_cache_flush,
                    "max_memory_bytes": self.max_memory_bytes, "evict_weights": self.evict_weights,
                    "stop_slow_candidates": self.stop_slow_candidates, "gpus": self.gpus}
        return LocalRunner(**{**settings, **changes})

    def on_one_device(self, **changes: Any) -> LocalRunner:
        """``fresh``, measuring on the first of this runner's GPUs alone (or, without GPUs,
        here as before): the re-measurement's, whose finalists are compared on one device,
        since two of a kind differ by more than finalists may."""
        return self.fresh(**({"gpus": self.gpus[:1]} if self.gpus else {}), **changes)

    @property
    def measures_at_once(self) -> int:
        """GPU kernels in flight at once: one a GPU (``build_and_run`` hands over runs this long)."""
        return len(self.gpus or (0,))

    def close(self) -> None:
        """Stop the workers and delete the reference data; the runner cannot run after this."""
        for gpu in list(self._workers):
            self._discard_worker(gpu)
        self._directory.cleanup()

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Check and time every built candidate; a failed build gives a result with the
        build's error, and no candidate's failure raises.

        Args:
            inputs: The candidates.
            builds: The builder's results for exactly these candidates, in order.
            on_result: Called as ``on_result(index, result)`` as soon as each is known.

        Returns:
            One ``MeasureResult`` per input, in order.

        Raises:
            ValueError: If ``inputs`` and ``builds`` differ in length, or GPU kernels are to be
                measured under ``max_memory_bytes``.
            RuntimeError: If the runner was closed.
        """
        check_run("LocalRunner", inputs, builds, closed=not Path(self._directory.name).is_dir())
        if self.max_memory_bytes is not None and any(build.launch is not None for build in builds):
            raise ValueError("LocalRunner: max_memory_bytes limits the worker's address space, and CUDA reserves "
                             "more than any such limit allows; leave it None to measure GPU kernels (their device "
                             "memory is their arguments and the L2 flush, nothing a kernel allocates)")
        slots = self.gpus or (0,)
        if len(slots) > 1 and all(getattr(candidate.target, "kind", "llvm") == "cuda" for candidate in inputs):
            return self._run_on_gpus(inputs, builds, slots, on_result)
        results = []
        for index, (candidate, build) in enumerate(zip(inputs, builds)):
            results.append(self._result(candidate, build, slots[0]))
            if on_result is not None:
                on_result(index, results[-1])
        return results

    def _run_on_gpus(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult], gpus: Sequence[int],
                     on_result: Callable[[int, MeasureResult], None] | None) -> list[MeasureResult]:
        """Each candidate, in order, on the next GPU whose worker is free; ``on_result`` hears
        of each as it finishes, in this thread."""
        free: SimpleQueue[int] = SimpleQueue()
        for gpu in gpus:
            free.put(gpu)

        def measure(index: int) -> tuple[int, MeasureResult]:
            gpu = free.get()
            try:
                return index, self._result(inputs[index], builds[index], gpu)
            finally:
                free.put(gpu)

        results: list[MeasureResult | None] = [None] * len(inputs)
        pool = ThreadPoolExecutor(max_workers=len(gpus), thread_name_prefix="tilecraft-measure")
        try:
            for future in as_completed([pool.submit(measure, index) for index in range(len(inputs))]):
                index, results[index] = future.result()
                if on_result is not None:
                    on_result(index, results[index])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # an interrupted run leaves no kernel in flight
        return results

    def _result(self, candidate: MeasureInput, build: BuildResult, gpu: int) -> MeasureResult:
        if build.error_kind is MeasureErrorKind.NONE:
            return self._measure(candidate, build, gpu)
        return MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time(),
                             device=self._device_of(candidate, build, gpu))

    def _device_of(self, candidate: MeasureInput, build: BuildResult, gpu: int) -> str:
        """The device a record names: the GPU for a CUDA candidate, also one whose build failed,
        numbered as the machine numbers it (its entry in ``CUDA_VISIBLE_DEVICES``, where given)."""
        on_gpu = build.launch is not None or getattr(candidate.target, "kind", "llvm") == "cuda"
        return f"{self.device}/cuda:{self._visible.get(gpu, gpu)}" if on_gpu else self.device

    def _measure(self, candidate: MeasureInput, build: BuildResult, gpu: int) -> MeasureResult:
        start = perf_counter()
        device = self._device_of(candidate, build, gpu)

        def result(kind: MeasureErrorKind, message: str = "", costs: Sequence[float] = ()) -> MeasureResult:
            return MeasureResult(tuple(costs), kind, message, build.time_cost + perf_counter() - start, time(),
                                 device=device)

        try:
            reference = self._reference(candidate.dag)
        except Exception as error:  # noqa: BLE001 - a workload NumPy cannot evaluate is still only a result
            return result(MeasureErrorKind.RUNTIME, f"computing the NumPy reference: {error_line(error)}")
        worker = self._ready_worker(gpu)
        if isinstance(worker, str):
            return result(MeasureErrorKind.WORKER_CRASH, worker)
        fastest = self._fastest.get(candidate.dag.workload_key) if self.stop_slow_candidates else None
        run_limit_secs = None if fastest is None else STOP_ALLOWANCE_SECS + STOP_FACTOR * fastest
        try:
            reply = worker.ask(self._request(build, reference, fastest), self.timeout_secs, run_limit_secs)
        except BaseException:  # e.g. KeyboardInterrupt: its reply would answer the next request
            self._discard_worker(gpu)
            raise
        if reply is None or reply.get("stopped"):
            self._discard_worker(gpu)
            why = (f"kernel ran longer than {self.timeout_secs:g} s (run timeout)" if reply is None else
                   f"kernel's first call ran longer than {run_limit_secs:.3g} s, {STOP_FACTOR} times the fastest "
                   f"call of this workload so far ({fastest * 1e3:.3g} ms): it will not be kept")
            return result(MeasureErrorKind.RUN_TIMEOUT, f"{why}; the worker was killed and will be restarted")
        if "crash" in reply:
            self._discard_worker(gpu)
            return result(MeasureErrorKind.WORKER_CRASH, reply["crash"])
        if reply["error_kind"] == MeasureErrorKind.WRONG_ANSWER.value or (
                build.launch is not None and reply["error_kind"] == MeasureErrorKind.RUNTIME.value):
            # A kernel that computes wrongly may also have written out of bounds, over the
            # worker's cached reference; a GPU kernel that failed (an illegal address, a trap)
            # leaves the worker's CUDA context unusable: later candidates get a fresh worker.
            self._discard_worker(gpu)
        if reply["error_kind"] != MeasureErrorKind.NONE.value:
            return result(MeasureErrorKind(reply["error_kind"]), reply["error_msg"])
        key = candidate.dag.workload_key
        with self._lock:
            self._fastest[key] = min(self._fastest.get(key, math.inf), *reply["costs"])
        return result(MeasureErrorKind.NONE, costs=reply["costs"])

    def _request(self, build: BuildResult, reference: Path, fastest: float | None) -> dict[str, Any]:
        return {"lib_path": os.path.abspath(build.lib_path), "entry_name": build.entry_name,
                "args": [[a.name, list(a.shape), a.dtype, a.is_output] for a in build.args],
                "packs": [[p.arg_index, p.func_name, list(p.packed_shape)] for p in build.packs],
                "reference": str(reference), "number": self.number, "repeat": self.repeat,
                "min_repeat_ms": self.min_repeat_ms, "flush": self.enable_cpu_cache_flush,
                "evict_weights": self.evict_weights, "launch": build.launch,
                "slow_call_secs": None if fastest is None else GPU_SLOW_FACTOR * fastest if build.launch is not None
                else max(SLOW_FLOOR_SECS, SLOW_FACTOR * fastest)}

    def _ready_worker(self, gpu: int) -> _Worker | str:
        """The running worker of ``gpu``, or a fresh one; why none could start, if so."""
        if gpu in self._workers and self._workers[gpu].runs >= _RUNS_PER_WORKER:
            self._discard_worker(gpu)
        if gpu not in self._workers:
            worker = _Worker(self.max_memory_bytes, Path(self._directory.name), self._visible.get(gpu))
            failure = worker.wait_ready(_START_TIMEOUT_SECS)
            if failure is not None:
                worker.stop()
                return failure
            self._workers[gpu] = worker
        return self._workers[gpu]

    def _discard_worker(self, gpu: int) -> None:
        if (worker := self._workers.pop(gpu, None)) is not None:
            worker.stop()

    def _reference(self, dag: ComputeDAG) -> Path:
        """The .npz of ``dag``'s inputs and expected outputs by tensor name, made once per workload."""
        key = dag.workload_key
        with self._lock:  # made once, by whichever GPU's thread needs it first
            if key not in self._references:
                self._references[key] = self._make_reference(dag)
            return self._references[key]

    def _make_reference(self, dag: ComputeDAG) -> Path:
        inputs = dag.random_inputs(np.random.default_rng(REFERENCE_SEED))
        # On one BLAS thread: OpenBLAS's threads spin for ~0.1 s after a call, and that
        # slowed the timing of the next candidate (a new task's first) by up to 2x.
        with threadpool_limits(limits=1, user_api="blas"):
            outputs = dag.evaluate_numpy(inputs)
        arrays = {t.name: a for t, a in zip(dag.placeholders, inputs)}
        arrays.update({t.name: a for t, a in zip(dag.outputs, outputs)})
        arrays[PRECISION] = np.array(least_precise(t.dtype for t in dag.compute_ops))
        path = Path(self._directory.name) / f"{hashlib.sha256(dag.workload_key.encode()).hexdigest()[:24]}.npz"
        np.savez(path, **arrays)
        return path


def checked_gpus(gpus: Sequence[int] | None, who: str) -> tuple[tuple[int, ...] | None, dict[int, str]]:
    """``gpus`` as a tuple, and the ``CUDA_VISIBLE_DEVICES`` entry of each (``visible_gpu_ids``).

    Raises:
        ValueError: Naming ``who``, if ``gpus`` is empty, repeats a GPU or names one this
            process cannot see.
    """
    if gpus is None:
        return None, {}
    gpus = tuple(gpus)
    if not gpus or len(set(gpus)) < len(gpus) or any(not isinstance(gpu, int) or gpu < 0 for gpu in gpus):
        raise ValueError(f"{who}: gpus={list(gpus)}; give the ordinals of distinct GPUs, at least one "
                         f"([0, 1] for cuda:0 and cuda:1)")
    try:
        return gpus, visible_gpu_ids(gpus)
    except ValueError as error:
        raise ValueError(f"{who}: {error}") from None


def visible_gpu_ids(gpus: Sequence[int]) -> dict[int, str]:
    """The ``CUDA_VISIBLE_DEVICES`` entry of each of ``gpus``, ordinals as this process counts
    them (within ``CUDA_VISIBLE_DEVICES`` where it is set): what a process that is to see that
    GPU alone is given, and the number the machine knows it by.

    Raises:
        ValueError: If one of ``gpus`` is past the GPUs ``CUDA_VISIBLE_DEVICES`` lets this process see.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [gpu.strip() for gpu in visible.split(",")] if visible is not None else None
    if ids is not None and (beyond := [gpu for gpu in gpus if gpu >= len(ids)]):
        raise ValueError(f"this process sees {len(ids)} GPU(s) (CUDA_VISIBLE_DEVICES={visible}), so there is no "
                         f"cuda:{beyond[0]}; count the GPUs within that list, from 0")
    return {gpu: str(gpu) if ids is None else ids[gpu] for gpu in gpus}


class _Worker:
    """One worker process and the two pipes to it; ``stop`` (or the finalizer) kills it."""

    def __init__(self, max_memory_bytes: int | None, directory: Path, visible_gpu: str | None = None) -> None:
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        command = [sys.executable, "-m", "tilecraft.measure.worker",
                   "--request-fd", str(request_read), "--reply-fd", str(reply_write)]
        if max_memory_bytes is not None:
            command += ["--max-memory-bytes", str(max_memory_bytes)]
        self._stderr_path = directory / f"worker-{os.getpid()}-{id(self)}.log"
        env = worker_env() if visible_gpu is None else {**worker_env(), "CUDA_VISIBLE_DEVICES": visible_gpu}
        self._max_memory_bytes = max_memory_bytes
        try:
            with open(self._stderr_path, "wb") as stderr:
                self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=stderr, pass_fds=(request_read, reply_write),
                                                env=env)
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._requests = os.fdopen(request_write, "w")
        self._replies = reply_read
        self._buffer = b""
        self.runs = 0
        self._finalizer = weakref.finalize(self, _kill, self.process, self._requests, self._replies,
                                           self._stderr_path)

    def wait_ready(self, timeout_secs: float) -> str | None:
        """None once the worker has started, else why it did not."""
        reply = self._receive(timeout_secs, "while starting")
        if reply is None:
            return f"the measurement worker did not start within {timeout_secs:g} s{self._stderr_tail()}"
        return reply.get("crash")

    def ask(self, request: dict[str, Any], timeout_secs: float,
            run_limit_secs: float | None = None) -> dict[str, Any] | None:
        """The worker's reply, ``{"crash": why}`` if it died, None if it ran past the timeout,
        or ``{"stopped": True}`` if the kernel's first call and its check, once it is loaded,
        ran past ``run_limit_secs``."""
        self.runs += 1
        deadline = perf_counter() + timeout_secs
        try:
            self._requests.write(json.dumps(request) + "\n")
            self._requests.flush()
        except OSError:  # a broken pipe: the worker is gone
            return {"crash": self._death("before the kernel ran")}
        reply = self._receive(timeout_secs, "while loading the kernel")
        if reply is None or not reply.get("running"):
            return reply
        limit = deadline - perf_counter() if run_limit_secs is None else min(deadline - perf_counter(), run_limit_secs)
        reply = self._receive(max(limit, 0.0), "while running the kernel")
        if reply is None and run_limit_secs is not None and perf_counter() < deadline:
            return {"stopped": True}
        if reply is None or not reply.get("checked"):
            return reply
        return self._receive(max(deadline - perf_counter(), 0.0), "while timing the kernel")

    def stop(self) -> None:
        self._finalizer()

    def _receive(self, timeout_secs: float, doing: str) -> dict[str, Any] | None:
        deadline = perf_counter() + timeout_secs
        while b"\n" not in self._buffer:
            remaining = deadline - perf_counter()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._replies], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                return {"crash": self._death(doing)}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _death(self, doing: str) -> str:
        """What ended the worker, for a candidate's error message."""
        try:
            code = self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "the worker closed its reply pipe but did not exit" + self._stderr_tail()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            cause = " (killed from outside, e.g. by the out-of-memory killer)" if name == "SIGKILL" else ""
            return f"worker died with signal {name} {doing}{cause}{self._memory_hint()}{self._stderr_tail()}"
        return f"worker exited with code {code} {doing}{self._memory_hint()}{self._stderr_tail()}"

    def _memory_hint(self) -> str:
        if self._max_memory_bytes is None:
            return ""
        return (f"; its address space is limited to {self._max_memory_bytes / (1 << 20):g} MiB "
                f"(max_memory_bytes), and a kernel may not survive an allocation that fails there")

    def _stderr_tail(self) -> str:
        try:
            text = self._stderr_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"; its last output: {text[-_STDERR_TAIL_CHARS:]}" if text else ""


def _kill(process: subprocess.Popen, requests, replies: int, stderr_path: Path) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    try:
        requests.close()
    except OSError:  # unsent bytes to a dead worker
        pass
    os.close(replies)
    stderr_path.unlink(missing_ok=True)
