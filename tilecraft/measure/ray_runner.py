"""``RayRunner`` and ``RayBuilder``: candidates built and measured on a Ray cluster.

Past one device server, TVM keeps a tracker of its own; tilecraft leaves the cluster to
Ray, which already places work by resources, moves bytes between nodes and tells when a
process dies. The shapes are Kernel Tuner's:

- ``RayBuilder`` builds a batch as Ray tasks on CPU nodes, each a ``LocalBuilder`` over a
  slice of it. The libraries come back as bytes into a directory of the builder's, so its
  results read as a ``LocalBuilder``'s and any runner can take them.
- ``RayRunner`` keeps one measuring actor per device. An actor holds what makes the device
  (``{"GPU": 1}``, or a custom resource each CPU host was started with once), so no two
  actors time kernels on one device at once, and it measures one candidate at a time in
  ``LocalRunner``'s isolated worker, as the device server does (the library and the
  workload's data arrive as bytes, the data once per actor). A free actor takes the next
  candidate, and results come back in the order they finish (``ray.wait``).

An actor that dies (its process killed, its node lost) costs the candidate in flight a
WORKER_CRASH result with Ray's message, and one that gives no answer within the timeout
(plus a grace for its start and the transfer) a RUN_TIMEOUT; either way a new actor takes
its place and the batch goes on. Nothing is retried, so no candidate is measured twice.

Ray is imported here only, when a builder or runner is made (``pip install
'tilecraft[ray]'``). Ray moves Python objects between the processes of a cluster with
pickle: run the cluster with its token authentication on (docs/cluster.md).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import secrets
import shutil
import socket
import tempfile
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from time import perf_counter, time
from types import SimpleNamespace
from typing import Any

from .builder import LocalBuilder
from .result import BuildResult, MeasureErrorKind, MeasureInput, MeasureResult, check_run, error_line
from .runner import LocalRunner
from .server import _UploadedDataRunner  # a LocalRunner whose workload data arrived as bytes

INSTALL_HINT = "pip install 'tilecraft[ray]'"
_REPLY_GRACE_SECS = 120.0  # beyond `timeout`: an actor's start, the transfer, a worker's start
_POLL_SECS = 1.0  # how often the deadlines of the candidates in flight are checked
_SESSIONS = itertools.count()  # a runner and each of its fresh copies measure in workers of their own


def import_ray(address: str | None = None) -> Any:
    """The ``ray`` module, connected: to ``address`` (as ``ray.init`` takes it) unless this
    process already is.

    Raises:
        ImportError: If Ray is not installed, naming the extra that installs it.
    """
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"building and measuring on a Ray cluster needs Ray: {INSTALL_HINT} ({error})") from None
    if not ray.is_initialized():
        ray.init(address=address)
    return ray


class RayBuilder:
    """Builds candidates as Ray tasks of one CPU each, ``candidates_per_task`` to a task.

    Each task runs ``LocalBuilder`` on a node of the cluster and returns the libraries'
    bytes, written here under their SHA-256; results come in input order, a failure as an
    error result. A task Ray could not finish (its node lost, past Ray's own retries)
    makes its candidates COMPILE errors with Ray's message. Build for the devices' CPU by
    name (``-march``), not ``native``, which each build node would read as its own.

    Args:
        address: The cluster, as ``ray.init`` takes it, if this process is not connected yet.
        timeout_secs: The longest one compilation may run (BUILD_TIMEOUT).
        candidates_per_task: Candidates a task builds, one after another: fewer spread a
            batch over more nodes, more save Ray's cost per task.

    Raises:
        ImportError: If Ray is not installed.
        ValueError: If ``candidates_per_task`` is below 1.
    """

    def __init__(self, address: str | None = None, timeout_secs: float = 15.0, candidates_per_task: int = 4) -> None:
        if candidates_per_task < 1:
            raise ValueError(f"RayBuilder: candidates_per_task={candidates_per_task} must be >= 1")
        self._ray = import_ray(address)
        self._task = self._ray.remote(num_cpus=1)(_build_here)
        self.timeout_secs, self.candidates_per_task = timeout_secs, candidates_per_task
        self._directory = tempfile.TemporaryDirectory(prefix="tilecraft-ray-build-")

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """One result per input, in input order; a failure is an error result, never raised."""
        size = self.candidates_per_task
        slices = [list(inputs[n:n + size]) for n in range(0, len(inputs), size)]
        started = perf_counter()
        pending = [self._task.remote(part, self.timeout_secs) for part in slices]
        results = []
        for part, ref in zip(slices, pending):
            try:
                results += [self._landed(build, library) for build, library in self._ray.get(ref)]
            except self._ray.exceptions.RayError as error:
                why = f"the Ray task building it failed: {error_line(error)}"
                results += [BuildResult.failed(MeasureErrorKind.COMPILE, why, perf_counter() - started)] * len(part)
        return results

    def _landed(self, build: BuildResult, library: bytes) -> BuildResult:
        """``build`` with its library written here (under its SHA-256: the same code, the same file)."""
        if build.lib_path is None:
            return build
        path = Path(self._directory.name) / (hashlib.sha256(library).hexdigest()[:32] + Path(build.lib_path).suffix)
        if not path.exists():
            path.write_bytes(library)
        return dataclasses.replace(build, lib_path=str(path))


def _build_here(inputs: list[MeasureInput], timeout_secs: float) -> list[tuple[BuildResult, bytes]]:
    """On a node of the cluster: the candidates built one at a time, with their libraries' bytes."""
    builds = LocalBuilder(timeout_secs, n_parallel=1).build(inputs)
    return [(build, Path(build.lib_path).read_bytes() if build.lib_path else b"") for build in builds]


class RayRunner:
    """Checks and times built candidates on a Ray cluster, one measuring actor per device.

    Each actor measures as ``LocalRunner`` does (the same worker, checks and timeouts),
    one candidate at a time; each result names the device that measured it as
    ``"<key>@<host>/ray:<n>"``, the n-th actor on that host (a GPU build's ``/cuda:0`` is
    the actor's GPU). Every candidate must be built for the devices' CPU or GPU. Make it
    once and pass it to ``TuningOptions(runner=...)``; ``close`` stops its actors.

    Args:
        address: The cluster, as ``ray.init`` takes it, if this process is not connected
            yet: None (the one this machine runs, else a new one here), ``"auto"``, or
            ``"ray://<head>:10001"`` (Ray Client).
        key: The device's label, the start of each result's device name.
        actor_resources: What one actor holds: ``{"GPU": 1}`` for a GPU, or one of a custom
            resource that each CPU host was started with once (``ray start
            --resources='{"cpu_host": 1}'``) for a whole host. None holds nothing, for
            trying things on one machine.
        n_actors: Measuring actors; None for as many as the cluster holds
            ``actor_resources`` for (one when it is None).
        timeout: The longest one candidate may run on its actor (RUN_TIMEOUT).
        number: Calls per measurement.
        repeat: Measurements per candidate.
        min_repeat_ms: The shortest a measurement may last.
        enable_cpu_cache_flush: Flush the caches before every timed call.
        stop_slow_candidates: Stop candidates far slower than the fastest (``LocalRunner``).
        max_memory_bytes: Each measuring worker's address-space limit (``LocalRunner``).

    Raises:
        ImportError: If Ray is not installed.
        ValueError: If a number is below its least value, or the cluster has none of
            ``actor_resources`` and ``n_actors`` is not given.
    """

    def __init__(self, address: str | None = None, key: str = "cpu",
                 actor_resources: Mapping[str, float] | None = None, n_actors: int | None = None,
                 timeout: float = 10, number: int = 3, repeat: int = 1, min_repeat_ms: float = 100,
                 enable_cpu_cache_flush: bool = False, stop_slow_candidates: bool = True,
                 max_memory_bytes: int | None = None) -> None:
        for name, value, least in (("timeout", timeout, 1e-3), ("number", number, 1), ("repeat", repeat, 1),
                                   ("min_repeat_ms", min_repeat_ms, 0),
                                   ("n_actors", 1 if n_actors is None else n_actors, 1)):
            if value < least:
                raise ValueError(f"RayRunner: {name}={value} must be >= {least}")
        self._ray = ray = import_ray(address)
        resources = dict(actor_resources or {})
        if n_actors is None:
            total = ray.cluster_resources()
            n_actors = min((int(total.get(name, 0) // amount) for name, amount in resources.items()), default=1)
            if n_actors < 1:
                raise ValueError(f"RayRunner: the cluster has no room for an actor holding {resources} (it has "
                                 f"{total}); start its nodes with those resources, or give n_actors")
        self.key, self.timeout = key, timeout
        self.settings = {"timeout_secs": timeout, "number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms,
                         "enable_cpu_cache_flush": enable_cpu_cache_flush,
                         "stop_slow_candidates": stop_slow_candidates, "max_memory_bytes": max_memory_bytes}
        options = {"num_cpus": resources.pop("CPU", 0), "num_gpus": resources.pop("GPU", 0), "resources": resources}
        self._actor_class = ray.remote(_MeasuringActor).options(**options)
        self._id = secrets.token_hex(6)  # names the actors' directories
        self._actors: list[Any] = [None] * n_actors
        self._slots = range(n_actors)  # the actors this runner measures on (a copy on one device: the first)
        self._names: list[Any] = [None] * n_actors  # refs of the actors' device names, which name their hosts
        for slot in range(n_actors):
            self._start(slot)
        self._data = LocalRunner()  # makes the workload data as local measurement does; its worker never starts
        self._references: dict[str, tuple[str, Any] | str] = {}  # workload key -> SHA-256 and ref of its .npz
        self._session, self._owner = next(_SESSIONS), True

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def fresh(self, **changes: Any) -> RayRunner:
        """A runner on the same actors with this one's settings changed by ``changes``
        (``repeat=1``), each actor measuring its candidates in a new worker, as the
        re-measurement that ends a tuning wants; closing it leaves the actors be."""
        changes = {"timeout_secs" if name == "timeout" else name: value for name, value in changes.items()}
        if unknown := set(changes) - set(self.settings):
            raise TypeError(f"RayRunner.fresh: unknown settings {sorted(unknown)}; known: {sorted(self.settings)}")
        twin = copy.copy(self)
        twin.settings, twin._session, twin._owner = {**self.settings, **changes}, next(_SESSIONS), False
        return twin

    def on_one_device(self, **changes: Any) -> RayRunner:
        """``fresh``, measuring on the first actor alone: the re-measurement's, whose
        finalists are compared on one device, since two of a kind differ by more than
        finalists may."""
        twin = self.fresh(**changes)
        twin._slots = self._slots[:1]
        return twin

    def close(self) -> None:
        """Stop the actors (their workers with them) and delete the workload data; a
        fresh copy closes nothing. The Ray connection stays, as ``ray.init`` made it."""
        if self._owner and self._actors:
            self._ray.wait([actor.close.remote() for actor in self._actors], num_returns=len(self._actors),
                           timeout=10.0)
            for actor in self._actors:
                self._ray.kill(actor)
            self._data.close()
        self._actors = []

    @property
    def measures_at_once(self) -> int:
        """Candidates in flight at once: an actor each (``build_and_run`` hands over runs this long)."""
        return len(self._slots) if self._actors else 1

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Check and time every built candidate on the actors, as ``LocalRunner.run`` does
        here; ``on_result`` hears of each in the order they finish.

        Raises:
            ValueError: If ``inputs`` and ``builds`` differ in length.
            RuntimeError: If the runner was closed.
        """
        check_run("RayRunner", inputs, builds, closed=not self._actors)
        results: list[Any] = [None] * len(inputs)

        def finish(index: int, result: MeasureResult) -> None:
            results[index] = result
            if on_result is not None:
                on_result(index, result)

        todo: deque[int] = deque()
        for n, build in enumerate(builds):
            if build.error_kind is not MeasureErrorKind.NONE:
                finish(n, MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time()))
            elif isinstance(reference := self._reference(inputs[n]), str):
                finish(n, MeasureResult((), MeasureErrorKind.RUNTIME, reference, build.time_cost, time()))
            else:
                todo.append(n)
        idle = list(self._slots)
        in_flight: dict[Any, tuple[int, int, float]] = {}  # ref -> candidate, actor, when it was sent
        while todo or in_flight:
            while todo and idle:
                index, slot = todo.popleft(), idle.pop()
                in_flight[self._send(slot, builds[index], inputs[index])] = (index, slot, perf_counter())
            done, _ = self._ray.wait(list(in_flight), num_returns=1, timeout=_POLL_SECS)
            for ref in done:
                index, slot, sent = in_flight.pop(ref)
                finish(index, self._collect(ref, slot, builds[index], sent))
                idle.append(slot)
            for ref, (index, slot, sent) in list(in_flight.items()):
                if perf_counter() - sent > self.timeout + _REPLY_GRACE_SECS:
                    del in_flight[ref]
                    finish(index, self._failed(slot, builds[index], sent, MeasureErrorKind.RUN_TIMEOUT,
                                               f"gave no answer in {self.timeout + _REPLY_GRACE_SECS:g} s"))
                    idle.append(slot)
        return results

    def _start(self, slot: int) -> None:
        actor = self._actor_class.remote(self.key, slot, f"tilecraft-ray-measure-{self._id}-{slot}")
        self._actors[slot], self._names[slot] = actor, actor.name.remote()

    def _name(self, slot: int) -> str:
        """The device name of actor ``slot``, as it said; its host is unknown until it has started."""
        try:
            return self._ray.get(self._names[slot], timeout=0)
        except self._ray.exceptions.RayError:
            return f"{self.key}@?/ray:{slot}"

    def _send(self, slot: int, build: BuildResult, candidate: MeasureInput) -> Any:
        """The ref of the actor's answer for ``build``, whose library travels as bytes."""
        digest, data = self._references[candidate.dag.workload_key]
        library = Path(build.lib_path).read_bytes()
        # The data's ref travels inside a list, so Ray sends the bytes only to an actor that asks.
        return self._actors[slot].measure.remote(dataclasses.replace(build, source=""), library, digest, [data],
                                                 self._session, self.settings)

    def _collect(self, ref: Any, slot: int, build: BuildResult, sent: float) -> MeasureResult:
        try:
            result = self._ray.get(ref)
        except self._ray.exceptions.RayActorError as error:
            return self._failed(slot, build, sent, MeasureErrorKind.WORKER_CRASH, f"died ({error_line(error)})")
        except self._ray.exceptions.RayError as error:  # the actor raised: its candidate's error, the actor lives
            return MeasureResult((), MeasureErrorKind.RUNTIME, f"measuring on {self._name(slot)}: "
                                 f"{error_line(error)}", build.time_cost + perf_counter() - sent, time(),
                                 device=self._name(slot))
        return result

    def _failed(self, slot: int, build: BuildResult, sent: float, kind: MeasureErrorKind, why: str) -> MeasureResult:
        """The result of a candidate whose actor was lost; a new actor takes that one's place."""
        name = self._name(slot)
        self._ray.kill(self._actors[slot])
        self._start(slot)
        return MeasureResult((), kind, f"the measuring actor {name} {why}; a new actor takes its place",
                             build.time_cost + perf_counter() - sent, time(), device=name)

    def _reference(self, candidate: MeasureInput) -> tuple[str, Any] | str:
        """The SHA-256 and ref of the candidate's workload data, or why NumPy could not make them."""
        key = candidate.dag.workload_key
        if key not in self._references:
            try:
                data = self._data._reference(candidate.dag).read_bytes()
                self._references[key] = (hashlib.sha256(data).hexdigest(), self._ray.put(data))
            except Exception as error:  # noqa: BLE001 - as in LocalRunner, a result and not a crash
                self._references[key] = f"computing the NumPy reference: {error_line(error)}"
        return self._references[key]


class _MeasuringActor:
    """One device's measurer, a Ray actor: libraries and workload data arrive as bytes and
    are measured by a ``LocalRunner`` (and its worker) per session, one at a time."""

    def __init__(self, key: str, slot: int, directory_name: str) -> None:
        self.device = f"{key}@{socket.gethostname()}/ray:{slot}"
        # The slot's own name: an actor that replaces a killed one on this host deletes what that one left.
        self._directory = Path(tempfile.gettempdir()) / directory_name
        shutil.rmtree(self._directory, ignore_errors=True)
        self._directory.mkdir()
        self._references: dict[str, Path] = {}  # SHA-256 of an .npz -> its file here
        self._runner: LocalRunner | None = None
        self._session: int | None = None

    def measure(self, build: BuildResult, library: bytes, digest: str, data: list, session: int,
                settings: dict[str, Any]) -> MeasureResult:
        if session != self._session:
            if self._runner is not None:
                self._runner.close()
            self._runner = _UploadedDataRunner(self._references, **settings)
            self._runner.device, self._session = self.device, session
        if digest not in self._references:
            self._references[digest] = self._written(import_ray().get(data[0]), ".npz")
        path = self._written(library, Path(build.lib_path).suffix)  # a new name: a loaded library is never reloaded
        try:
            workload = SimpleNamespace(workload_key=digest)  # all of a dag the runner reads
            (result,) = self._runner.run([MeasureInput(workload, None, None)],
                                         [dataclasses.replace(build, lib_path=str(path))])
        finally:
            path.unlink(missing_ok=True)
        return result

    def name(self) -> str:
        return self.device

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _written(self, data: bytes, suffix: str) -> Path:
        with tempfile.NamedTemporaryFile(suffix=suffix, dir=self._directory, delete=False) as file:
            file.write(data)
        return Path(file.name)
