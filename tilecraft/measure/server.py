"""``DeviceServer`` (``tilecraft serve``): measure candidates for tuners on other machines.

A tuner on a host searches and compiles; the machine that runs this server checks and
times what it is sent, as ``LocalRunner`` does on the tuner's own machine, and answers
with the costs or the error. The server trusts nothing from the wire
(``rpc_protocol.py``): peers prove they hold the secret, every frame is authenticated,
sizes and times are capped, and the uploaded library runs in ``LocalRunner``'s isolated
worker, so a kernel that crashes, hangs or exhausts memory costs its request, never the
server. It listens on loopback unless told otherwise, and beyond it only with a secret.

Each connection is a session with a runner and a worker of its own (a fresh connection
is a fresh process, as the re-measurement at the end of a tuning wants), but one
candidate is measured at a time across all of them: timings must not overlap. A server
of several GPUs (``gpus``) gives each session the GPU with the fewest sessions, its
worker seeing that GPU alone, and measures one candidate at a time on each GPU. The
reference data (inputs and NumPy's outputs) arrive once per workload as an ``.npz``,
named by its SHA-256, and stay until the server stops.

Requests, each answered by one reply (docs/formats.md, "The device server's protocol"):

  open       the timing settings of the session   -> opened
  reference  an .npz of a workload's data          -> stored
  measure    a shared library (a cubin and its launch  -> result (costs, or error kind and message)
             for a GPU) and how to call it
  (other)                                          -> error, and the session goes on
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from ..runtime.module import ArgSpec, PackSpec
from ..target import Target
from .result import BuildResult, MeasureErrorKind, MeasureInput, error_line
from .rpc_protocol import MAX_FRAME_BYTES, SECRET_HINT, Channel, RPCError, secret_bytes, server_handshake
from .runner import LocalRunner, checked_gpus

PROTOCOL_VERSION = 1
_IDLE_SECS = 900.0  # a session without a request this long is closed; its tuner reconnects
_HANDSHAKE_SECS = 10.0  # a peer that has not proved itself holds a connection slot no longer


class DeviceServer:
    """Serves measurement requests from clients (``RPCRunner``) that hold the same secret.

    ``serve_forever`` answers until ``close``; ``start`` does so in a background thread.
    The server reports its target when a client connects: its CPU as the host's
    ``Target`` with gcc's name for ``-march=native`` (``znver3``), which a compiler on
    another machine understands.

    Args:
        host: The address to listen on; loopback by default. Any other needs a secret.
        port: The TCP port; 0 for a free one (``port`` then holds it).
        secret: The pre-shared secret (at least 16 bytes); None only on loopback.
        key: The device's label; a client asking for another key is refused.
        max_connections: Sessions at once; a connection beyond them is closed at once
            (None: 4, or two a GPU where that is more).
        request_timeout: Seconds within which a frame, once begun, must arrive, and the
            most one candidate may run (a client's ``timeout`` is capped by it).
        max_frame_bytes: The largest frame accepted (a library, or a workload's data).
        max_memory_bytes: The measuring worker's address-space limit (``LocalRunner``).
        target: The target to report instead of this machine's.
        certfile: A PEM certificate (chain) to serve TLS with; None for plain TCP.
        keyfile: Its private key, when not in ``certfile``.
        log: Called with a line for each session's start and end.
        gpus: The GPUs that measure CUDA kernels, by their ordinals in this process, one a
            session, all at once (``LocalRunner``'s ``gpus``); None: the first GPU alone.

    Raises:
        RPCError: If asked to listen beyond loopback without a secret, or the secret is short.
        ValueError: If ``max_connections`` is below 1, ``request_timeout`` not positive, or
            ``gpus`` empty, repeating a GPU, naming one this process cannot see, or given with
            a CPU target.
        OSError: If the address cannot be bound.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9190, secret: bytes | str | None = None,
                 key: str = "cpu", max_connections: int | None = None, request_timeout: float = 60.0,
                 max_frame_bytes: int = MAX_FRAME_BYTES, max_memory_bytes: int | None = None,
                 target: Target | str | None = None, certfile: str | None = None, keyfile: str | None = None,
                 log: Callable[[str], object] | None = None, gpus: Sequence[int] | None = None) -> None:
        self.secret = secret_bytes(secret)
        if self.secret is None and not is_loopback(host):
            raise RPCError(f"refusing to listen on {host!r} without a secret: anyone who reaches it could run "
                           f"code here; give a secret (tilecraft serve --secret-file FILE; {SECRET_HINT}), "
                           f"or listen on 127.0.0.1")
        self.gpus, self.gpu_ids = checked_gpus(gpus, "DeviceServer")  # gpu_ids: as the machine numbers them
        max_connections = max(4, 2 * len(self.gpus or ())) if max_connections is None else max_connections
        if max_connections < 1 or not request_timeout > 0:
            raise ValueError(f"DeviceServer: max_connections={max_connections} must be >= 1 and "
                             f"request_timeout={request_timeout} > 0")
        self.host, self.key, self.request_timeout = host, key, request_timeout
        self.max_connections, self.max_frame_bytes = max_connections, max_frame_bytes
        self.max_memory_bytes = max_memory_bytes
        self.target = Target(target) if target is not None else serving_target()
        if self.gpus and self.target.kind != "cuda":  # CPU kernels timed side by side would slow each other
            raise ValueError(f"DeviceServer: gpus={list(self.gpus)} measure CUDA kernels, and the target "
                             f"{self.target} is a CPU; give a CUDA target, or no gpus")
        self._tls = None
        if certfile is not None:
            import ssl

            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(certfile, keyfile)
        self._log = log or (lambda line: None)
        self._directory = tempfile.TemporaryDirectory(prefix="tilecraft-serve-", ignore_cleanup_errors=True)
        self.references: dict[str, Path] = {}  # SHA-256 of an .npz -> its file
        self._slots = threading.BoundedSemaphore(max_connections)
        self.device_lock = threading.Lock()  # held while a candidate is measured (without gpus)
        self.gpu_locks = {gpu: threading.Lock() for gpu in self.gpus or ()}  # each held while its GPU measures one
        self.sessions_on = {gpu: 0 for gpu in self.gpus or ()}  # sessions measuring on each GPU
        self._lock = threading.Lock()  # guards references, _sockets and sessions_on
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server((host, port))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False

    def __enter__(self) -> DeviceServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def serve_forever(self) -> None:
        """Accept and serve sessions, each in a thread of its own, until ``close``."""
        while not self._closed:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                raise
            if not self._slots.acquire(blocking=False):
                self._log(f"{peer[0]}:{peer[1]}: refused: {self.max_connections} sessions are open (max_connections)")
                sock.close()
                continue
            with self._lock:
                self._sockets.add(sock)
            threading.Thread(target=self._serve, args=(sock, f"{peer[0]}:{peer[1]}"), daemon=True).start()

    def start(self) -> DeviceServer:
        """Serve in a background thread (for tests, or a program that serves as it goes); itself."""
        threading.Thread(target=self.serve_forever, name="tilecraft-serve", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop listening, end every session (killing its worker) and delete the uploads."""
        self._closed = True
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
        self._listener.close()
        self._directory.cleanup()

    def upload(self, data: bytes, suffix: str) -> Path:
        """A new file in the server's private directory holding ``data``."""
        descriptor, path = tempfile.mkstemp(suffix=suffix, dir=self._directory.name)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        return Path(path)

    def _serve(self, raw: socket.socket, peer: str) -> None:
        session, sock = _Session(self), raw
        try:
            handshake_secs = min(self.request_timeout, _HANDSHAKE_SECS)
            if self._tls is not None:
                raw.settimeout(handshake_secs)
                sock = self._tls.wrap_socket(raw, server_side=True)
                with self._lock:
                    self._sockets.add(sock)  # the TLS socket owns the connection now; close() shuts it down
            channel = server_handshake(sock, self.secret, handshake_secs, self.max_frame_bytes)
            channel.timeout_secs = self.request_timeout
            channel.send({"kind": "hello", "version": PROTOCOL_VERSION, "key": self.key, "target": str(self.target),
                          "gpus": len(self.gpus or (0,))})
            self._log(f"{peer}: session opened")
            session.serve(channel)
        except (RPCError, OSError) as error:
            self._log(f"{peer}: session closed: {error}")
        finally:
            session.close()
            sock.close()
            with self._lock:
                self._sockets -= {raw, sock}
            self._slots.release()


class _Session:
    """One client's connection: its runner (and so its worker), and the answers to its requests."""

    def __init__(self, server: DeviceServer) -> None:
        self.server = server
        self.runner: _UploadedDataRunner | None = None
        self.gpu: int | None = None  # the GPU this session measures on, of the server's gpus

    def serve(self, channel: Channel) -> None:
        while True:
            header, payload = channel.receive(wait_secs=_IDLE_SECS)
            try:
                reply = self.answer(header, payload)
            except Exception as error:  # noqa: BLE001 - a malformed request costs that request, never the server
                reply = {"kind": "error", "message": f"bad {header['kind']!r} request: {error_line(error)}"}
            channel.send(reply)

    def answer(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        server, kind = self.server, header["kind"]
        if kind == "open":
            settings = header["settings"]
            self.close()
            if server.gpus:  # the GPU fewest sessions measure on
                with server._lock:
                    self.gpu = min(server.gpus, key=lambda gpu: server.sessions_on[gpu])
                    server.sessions_on[self.gpu] += 1
            self.runner = _UploadedDataRunner(
                server.references, timeout_secs=min(float(settings["timeout"]), server.request_timeout),
                number=int(settings["number"]), repeat=int(settings["repeat"]),
                min_repeat_ms=float(settings["min_repeat_ms"]),
                enable_cpu_cache_flush=bool(settings["enable_cpu_cache_flush"]),
                stop_slow_candidates=bool(settings["stop_slow_candidates"]), max_memory_bytes=server.max_memory_bytes,
                gpus=None if self.gpu is None else [self.gpu])
            return {"kind": "opened"}
        if kind == "reference":
            digest = hashlib.sha256(payload).hexdigest()
            if digest != header["sha256"]:
                return {"kind": "error", "message": f"the reference data's SHA-256 is {digest}, not {header['sha256']}"}
            with server._lock:
                if digest not in server.references:
                    server.references[digest] = server.upload(payload, ".npz")
            return {"kind": "stored"}
        if kind == "measure":
            if self.runner is None or header["reference"] not in server.references:
                return {"kind": "error", "message": "send 'open' and the workload's 'reference' before 'measure'"}
            return self.measure(header, payload)
        return {"kind": "error", "message": f"unknown request {kind!r}; this server answers open, reference, measure"}

    def measure(self, header: dict[str, Any], library: bytes) -> dict[str, Any]:
        args = tuple(ArgSpec(str(name), tuple(map(int, shape)), str(dtype), bool(is_output))
                     for name, shape, dtype, is_output in header["args"])
        packs = tuple(PackSpec(int(index), str(name), tuple(map(int, shape))) for index, name, shape in header["packs"])
        launch = _launch(header.get("launch"), args)
        if isinstance(launch, str):
            return {"kind": "error", "message": launch}
        if (launch is None) != (getattr(self.server.target, "kind", "llvm") != "cuda"):
            return {"kind": "error", "message": f"this server measures {self.server.target}: send "
                                                f"{'a cubin and its launch' if launch is None else 'a shared library'}"}
        # a new name each time: a loaded library is never loaded again by name
        path = self.server.upload(library, ".so" if launch is None else ".cubin")
        try:
            build = BuildResult(str(path), "", str(header["entry_name"]), args, packs, MeasureErrorKind.NONE, "", 0.0,
                                launch)
            workload = SimpleNamespace(workload_key=header["reference"])  # all of a dag the runner reads
            with self.server.device_lock if self.gpu is None else self.server.gpu_locks[self.gpu]:
                (result,) = self.runner.run([MeasureInput(workload, None, None)], [build])
        finally:
            path.unlink(missing_ok=True)
        return {"kind": "result", "costs": list(result.costs), "error_kind": result.error_kind.value,
                "error_msg": result.error_msg, "gpu": self.server.gpu_ids.get(self.gpu)}

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        if self.gpu is not None:
            with self.server._lock:
                self.server.sessions_on[self.gpu] -= 1
            self.gpu = None


class _UploadedDataRunner(LocalRunner):
    """A ``LocalRunner`` whose reference data were uploaded: a candidate's "workload key"
    is the SHA-256 of its ``.npz``, and the file is the server's."""

    def __init__(self, references: dict[str, Path], **settings: Any) -> None:
        super().__init__(**settings)
        self._uploaded = references

    def _reference(self, dag: Any) -> Path:
        return self._uploaded[dag.workload_key]


def _launch(value: Any, args: tuple[ArgSpec, ...]) -> dict | None | str:
    """A CUDA candidate's launch as sent (``runtime.cuda.launch_json``: each kernel's grid,
    block, dynamic shared bytes and zeroed outputs, and the workspace), checked by building
    its module's description; None for a CPU library; or what is wrong with it."""
    if value is None:
        return None
    from ..runtime.cuda import CudaModule

    try:
        if not isinstance(value, dict) or not isinstance(value.get("workspace", []), list):
            raise ValueError("not an object with a list of workspace buffers")
        CudaModule.of_launch(b"", "kernel", args, value)
        return value
    except ValueError as error:
        return (f"'launch' must be {{'launch': a kernel's {{grid, block, shared_bytes, zeroed}} or a list of them, "
                f"'workspace': [{{name, shape, dtype, is_output}}]}}: {error_line(error)} (got {str(value)[:100]})")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``""`` and ``0.0.0.0`` do not)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serving_target() -> Target:
    """This machine as a target another machine can compile for: ``-march=native`` named
    as gcc resolves it here, since a client's gcc would resolve "native" to its own CPU.

    Raises:
        RPCError: If gcc cannot say.
    """
    host = Target.host()
    if host.march != "native":
        return host
    try:
        shown = subprocess.run(["gcc", "-Q", "--help=target", "-march=native"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        shown = str(error)
    names = [words[1] for words in map(str.split, shown.splitlines()) if len(words) > 1 and words[0] == "-march="]
    if not names:
        raise RPCError(f"cannot name this CPU for compilers elsewhere: `gcc -Q --help=target -march=native` does "
                       f"not say ({shown.strip()[:200]}); give the target to serve (target=, or --target)")
    return Target(host, march=names[0])
