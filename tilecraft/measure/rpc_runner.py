"""``RPCRunner``: candidates measured on device servers (``tilecraft serve``), as in Ansor.

The tuner searches and compiles here, for the target the server reports; each built
library's bytes travel to a server, which checks and times it in its isolated worker
(``server.py``) and sends back the costs or the error. A workload's inputs and NumPy
outputs are made here once, exactly as ``LocalRunner`` makes them, and sent once per
session; the server keeps them by their SHA-256.

With several servers (``addresses``), or ``n_parallel`` sessions a server, each candidate
goes to the next free session. A server measures one candidate at a time whatever its
sessions, so more than one session a server only overlaps uploads with measuring.

A server that cannot be reached when the runner is made is an error; a session lost
while running (the server stopped, the network failed, no reply in time) costs the
candidate in flight a RUNTIME error naming the device, and the next candidate reconnects.
"""

from __future__ import annotations

import hashlib
import queue
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from time import perf_counter, sleep, time
from typing import Any, Callable, Sequence

from ..target import Target
from .result import BuildResult, MeasureErrorKind, MeasureInput, MeasureResult, check_run, error_line
from .rpc_protocol import Channel, RPCError, connect, secret_bytes
from .runner import LocalRunner

_REPLY_GRACE_SECS = 120.0  # beyond `timeout`: the upload, a worker's start, a turn at the device
_IO_SECS = 60.0  # the most one frame may take to send or arrive (a workload's data may be large)
_MAX_GPUS = 64  # the most GPUs a server may say it has: sessions opened to it
_GPU_ID = re.compile(r"[A-Za-z0-9:_-]{1,64}")  # a CUDA_VISIBLE_DEVICES entry: an ordinal, a GPU or MIG UUID


class RPCRunner:
    """Checks and times built candidates on remote device servers, with Ansor's arguments.

    The runner connects when made and learns the server's target: build for it
    (``SearchTask(..., target=runner.target())``). Results are those of ``LocalRunner``
    on the server (costs, or an error kind and message), each naming its device as
    ``"<key>@<host>:<port>"`` (and ``/cuda:<n>``, the GPU that measured it, for a GPU server).

    Args:
        key: The device's label; the server must serve the same key.
        host: The server's address, when ``addresses`` is not given.
        port: The server's port, when ``addresses`` is not given.
        secret: The secret the server was started with.
        secret_file: A file holding it (``tilecraft serve --secret-file``), instead.
        n_parallel: Sessions per server; None: one for each GPU it measures on (one for a
            CPU), so that a server of several GPUs measures on all of them at once.
        timeout: The longest one candidate may run on the server (its RUN_TIMEOUT).
        number: Calls per measurement.
        repeat: Measurements per candidate.
        min_repeat_ms: The shortest a measurement may last.
        cooldown_interval: Seconds to wait after each candidate, per session.
        addresses: ``[(host, port), ...]`` of several servers of one kind of device.
        enable_cpu_cache_flush: Flush the caches before every timed call.
        stop_slow_candidates: Stop candidates far slower than the fastest (``LocalRunner``).
        ca_file: A CA certificate to check a TLS server's certificate with; None for no TLS.

    Raises:
        RPCError: If a server cannot be reached, speaks another protocol, serves another
            key, or the servers report different targets; the message names ``host:port``.
        AuthenticationError: If a server does not share the secret.
        ValueError: If a number is below its least value.
    """

    def __init__(self, key: str = "cpu", host: str = "127.0.0.1", port: int = 9190, secret: bytes | str | None = None,
                 secret_file: str | Path | None = None, n_parallel: int | None = None, timeout: float = 10,
                 number: int = 3, repeat: int = 1, min_repeat_ms: float = 100, cooldown_interval: float = 0.0,
                 addresses: Sequence[tuple[str, int]] | None = None, enable_cpu_cache_flush: bool = False,
                 stop_slow_candidates: bool = True, ca_file: str | Path | None = None) -> None:
        for name, value, least in (("n_parallel", n_parallel or 1, 1), ("timeout", timeout, 1e-3),
                                   ("number", number, 1), ("repeat", repeat, 1), ("min_repeat_ms", min_repeat_ms, 0),
                                   ("cooldown_interval", cooldown_interval, 0)):
            if value < least:
                raise ValueError(f"RPCRunner: {name}={value} must be >= {least}")
        self.key, self.n_parallel, self.cooldown_interval, self.ca_file = key, n_parallel, cooldown_interval, ca_file
        self.settings = {"timeout": timeout, "number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms,
                         "enable_cpu_cache_flush": enable_cpu_cache_flush,
                         "stop_slow_candidates": stop_slow_candidates}  # the server's LocalRunner's, for each session
        self.addresses = [(str(h), int(p)) for h, p in (addresses or [(host, port)])]
        self._secret = secret_bytes(secret, secret_file)
        self._data = LocalRunner()  # makes the reference data as local measurement does; its worker never starts
        self._references: dict[str, tuple[str, Path]] = {}  # workload key -> SHA-256 and .npz of its data
        self._sessions = [_Session(self, *address) for address in self.addresses]
        try:
            for session in list(self._sessions):  # then as many more on each server as n_parallel, or its GPUs, say
                session.open()
                more = [_Session(self, session.host, session.port) for _ in range((n_parallel or session.gpus) - 1)]
                self._sessions += more
                for extra in more:
                    extra.open()
        except RPCError as error:
            self.close()
            raise type(error)(f"device server {session.host}:{session.port}: {error}") from None
        targets = sorted({session.target for session in self._sessions})
        if len(targets) > 1:
            self.close()
            raise RPCError(f"the device servers report different targets ({'; '.join(targets)}); give the addresses "
                           f"of one kind of device, since every candidate is built for one")
        self._target = Target(targets[0])

    def __enter__(self) -> RPCRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def measures_at_once(self) -> int:
        """Candidates in flight at once: a session each (``build_and_run`` hands over runs this long)."""
        return max(1, len(self._sessions))

    def target(self) -> Target:
        """The target the servers measure, to build for: ``SearchTask(..., target=runner.target())``."""
        return self._target

    def fresh(self, **changes: Any) -> RPCRunner:
        """A new runner with this one's settings, changed by ``changes``, and new sessions:
        each server measures its candidates in a fresh worker."""
        return RPCRunner(**{"key": self.key, "secret": self._secret, "n_parallel": self.n_parallel,
                            "ca_file": self.ca_file, "addresses": self.addresses,
                            "cooldown_interval": self.cooldown_interval, **self.settings, **changes})

    def on_one_device(self, **changes: Any) -> RPCRunner:
        """``fresh``, one session on the first server alone: the re-measurement's, whose
        finalists are compared on one device, since two of a kind differ by more than
        finalists may (a second session would measure on a server's second GPU)."""
        return self.fresh(**{"addresses": self.addresses[:1], "n_parallel": 1, **changes})

    def close(self) -> None:
        """End the sessions (each server stops their workers) and delete the reference data."""
        for session in self._sessions:
            session.close()
        self._sessions = []
        self._data.close()

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Check and time every built candidate on the servers, as ``LocalRunner.run`` does
        here; ``on_result`` hears of each in the order they finish.

        Raises:
            ValueError: If ``inputs`` and ``builds`` differ in length.
            RPCError: If a candidate was built for a target other than the servers'
                (before anything is sent).
            RuntimeError: If the runner was closed.
        """
        check_run("RPCRunner", inputs, builds, closed=not self._sessions)
        todo = [n for n, build in enumerate(builds) if build.error_kind is MeasureErrorKind.NONE]
        for n in todo:
            if str(inputs[n].target) != str(self._target):
                raise RPCError(f"a candidate was built for {inputs[n].target}, but the device server measures "
                               f"{self._target}; make the task with target=runner.target() so that it is built "
                               f"for that device")
        results: list[Any] = [None] * len(inputs)

        def finish(index: int, result: MeasureResult) -> None:
            results[index] = result
            if on_result is not None:
                on_result(index, result)

        for n, build in enumerate(builds):
            if build.error_kind is not MeasureErrorKind.NONE:
                finish(n, MeasureResult((), build.error_kind, build.error_msg, build.time_cost, time(),
                                        device=self._sessions[0].device))
        references = {n: self._reference(inputs[n]) for n in todo}
        free: queue.SimpleQueue[_Session] = queue.SimpleQueue()
        for session in self._sessions:
            free.put(session)

        def measure(index: int) -> tuple[int, MeasureResult]:
            session = free.get()
            try:
                return index, session.measure(builds[index], references[index])
            finally:
                free.put(session)

        pool = ThreadPoolExecutor(len(self._sessions), thread_name_prefix="tilecraft-rpc")
        try:
            for future in as_completed([pool.submit(measure, n) for n in todo]):
                finish(*future.result())
        finally:
            pool.shutdown(cancel_futures=True)  # on an interrupt, only the candidates in flight finish
        return results

    def _reference(self, candidate: MeasureInput) -> tuple[str, Path] | str:
        """The SHA-256 and ``.npz`` of the candidate's workload data, or why NumPy could not make them."""
        key = candidate.dag.workload_key
        if key not in self._references:
            try:
                path = self._data._reference(candidate.dag)
            except Exception as error:  # noqa: BLE001 - as in LocalRunner, a result and not a crash
                return f"computing the NumPy reference: {error_line(error)}"
            self._references[key] = (hashlib.sha256(path.read_bytes()).hexdigest(), path)
        return self._references[key]


class _Session:
    """One connection to one server; one request in flight at a time."""

    def __init__(self, runner: RPCRunner, host: str, port: int) -> None:
        self.runner, self.host, self.port = runner, host, port
        self.device = f"{runner.key}@{host}:{port}"
        self.channel: Channel | None = None
        self.target = ""
        self.gpus = 1  # the GPUs the server measures on
        self._sent: set[str] = set()  # SHA-256s of the reference data this session's server holds

    def open(self) -> None:
        """Connect, check the server's key, learn its target and send the timing settings."""
        runner = self.runner
        channel = connect(self.host, self.port, runner._secret, _IO_SECS, runner.ca_file)
        hello = _expect(channel, "hello")
        if hello.get("key") != runner.key:
            channel.fail(f"it serves the device {hello.get('key')!r}, not {runner.key!r}; give RPCRunner its key")
        if self.target and hello["target"] != self.target:  # reconnected to another machine
            channel.fail(f"it now measures {hello['target']}, not {self.target} as before; start a new tuning")
        channel.send({"kind": "open", "settings": runner.settings})
        _expect(channel, "opened")
        self.channel, self.target, self._sent = channel, str(hello["target"]), set()
        gpus = hello.get("gpus", 1)  # an older server says nothing: one device
        self.gpus = gpus if isinstance(gpus, int) and 1 <= gpus <= _MAX_GPUS else 1

    def measure(self, build: BuildResult, reference: tuple[str, Path] | str) -> MeasureResult:
        start = perf_counter()

        def result(kind: MeasureErrorKind, message: str = "", costs: Sequence[float] = (), gpu: str | None = None):
            return MeasureResult(tuple(costs), kind, message, build.time_cost + perf_counter() - start, time(),
                                 device=self.device if gpu is None else f"{self.device}/cuda:{gpu}")

        if isinstance(reference, str):
            return result(MeasureErrorKind.RUNTIME, reference)
        digest, data = reference
        try:
            library = Path(build.lib_path).read_bytes()
        except OSError as error:
            return result(MeasureErrorKind.RUNTIME, f"reading the built library: {error_line(error)}")
        try:
            if self.channel is None:
                self.open()
            if digest not in self._sent:
                self.channel.send({"kind": "reference", "sha256": digest}, data.read_bytes())
                _expect(self.channel, "stored")
                self._sent.add(digest)
            self.channel.send({"kind": "measure", "reference": digest, "entry_name": build.entry_name,
                               "args": [[a.name, list(a.shape), a.dtype, a.is_output] for a in build.args],
                               "packs": [[p.arg_index, p.func_name, list(p.packed_shape)] for p in build.packs],
                               "launch": build.launch},
                              library)
            reply, _ = self.channel.receive(wait_secs=self.runner.settings["timeout"] + _REPLY_GRACE_SECS)
            if reply["kind"] == "error":
                return result(MeasureErrorKind.RUNTIME, f"device server {self.device}: {reply.get('message')}")
            gpu = reply.get("gpu")
            if gpu is not None and not (isinstance(gpu, str) and _GPU_ID.fullmatch(gpu)):
                raise ValueError(f"the result names the GPU {str(gpu)[:40]!r}, not a CUDA_VISIBLE_DEVICES entry")
            costs = map(float, reply["costs"])
            return result(MeasureErrorKind(reply["error_kind"]), str(reply["error_msg"]), costs, gpu)
        except (RPCError, OSError, KeyError, ValueError, TypeError) as error:  # lost, or a reply out of protocol
            self.close()
            return result(MeasureErrorKind.RUNTIME, f"the session with {self.device} failed: {error_line(error)}; "
                                                    f"the next candidate reconnects")
        finally:
            if self.runner.cooldown_interval:
                sleep(self.runner.cooldown_interval)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def _expect(channel: Channel, kind: str) -> dict[str, Any]:
    """The next reply, which must be of ``kind`` (else the channel is closed and RPCError raised)."""
    header, _ = channel.receive()
    if header["kind"] != kind:
        channel.fail(f"the server answered {header['kind']!r} where {kind!r} was due: {header.get('message', '')}")
    return header
