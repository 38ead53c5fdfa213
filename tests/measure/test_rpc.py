"""The device server and RPCRunner on loopback: a tuning through them, and every way a
peer can misbehave (wrong secret, altered, replayed, oversized or trickled frames, unknown
requests, crashing kernels, a lost server) refused or recorded, the server still serving."""

import hashlib
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.database import load_records
from tilecraft.measure import (AuthenticationError, BuildResult, DeviceServer, MeasureErrorKind, MeasureInput,
                               RPCError, RPCRunner, rpc_protocol)
from tilecraft.measure import server as server_module
from tilecraft.measure.rpc_protocol import client_handshake
from tilecraft.runtime import ArgSpec, compile_c
from tilecraft.search.default import default_row
from tilecraft.search.space import generate_sketches
from test_runner import two_gpus_in_flight  # tests/measure, beside this file

SECRET = secrets.token_hex(32).encode()
KERNELS = r"""
void add(const float* restrict a, const float* restrict b, float* restrict c) {
  for (int i = 0; i < 64; ++i) c[i] = a[i] + b[i];
}
void write_null(const float* restrict a, const float* restrict b, float* restrict c) { *(volatile float*)0 = a[0]; }
void spin(const float* restrict a, const float* restrict b, float* restrict c) {
  volatile int forever = 1; while (forever) {}
}
"""
ARGS = (ArgSpec("A", (64,), "float32", False), ArgSpec("B", (64,), "float32", False),
        ArgSpec("C", (64,), "float32", True))
OPEN = {"kind": "open", "settings": {"timeout": 5, "number": 1, "repeat": 1, "min_repeat_ms": 0,
                                     "enable_cpu_cache_flush": False, "stop_slow_candidates": False}}


@pytest.fixture(scope="module")
def server():
    lines = []
    with DeviceServer(port=0, secret=SECRET, log=lines.append).start() as serving:
        serving.lines = lines
        yield serving


@pytest.fixture(scope="module")
def runner(server):
    with RPCRunner(port=server.port, secret=SECRET, timeout=5, number=2, min_repeat_ms=0) as shared:
        yield shared


@pytest.fixture(scope="module")
def kernel(runner, kernel_cache):
    """``kernel(name)``: a candidate adding two 64-vectors, built for the server's target, whose entry is ``name``."""
    A = te.placeholder((64,), name="A")
    B = te.placeholder((64,), name="B")
    dag = tc.ComputeDAG([A, B, te.compute((64,), lambda i: A[i] + B[i], name="C")])
    lib_path = str(compile_c(KERNELS, tc.Target.host(), kernel_cache))
    candidate = MeasureInput(dag, runner.target(), tc.Schedule(dag).trace)
    return lambda name: (candidate, BuildResult(lib_path, KERNELS, name, ARGS, (), MeasureErrorKind.NONE, "", 0.0))


def _run(runner, *candidates):
    inputs, builds = zip(*candidates)
    return runner.run(inputs, builds)


class Recording:
    """A socket that keeps every byte sent through it, and sends what ``alter`` makes of them."""

    def __init__(self, sock, alter=lambda data: data):
        self.sock, self.sent, self.alter = sock, [], alter

    def sendall(self, data):
        self.sent.append(bytes(data))
        self.sock.sendall(self.alter(bytes(data)))

    def __getattr__(self, name):
        return getattr(self.sock, name)


def _session(server, alter=lambda data: data):
    """A raw authenticated session: its channel, past the server's hello, and its recorded socket."""
    recording = Recording(socket.create_connection(("127.0.0.1", server.port)), alter)
    channel = client_handshake(recording, SECRET, timeout_secs=5.0)
    assert channel.receive()[0]["kind"] == "hello"
    return channel, recording


def _logged(server, text: str) -> bool:
    """Whether the server logs ``text`` within 5 s (it logs just after it closes the session)."""
    deadline = time.monotonic() + 5.0
    while not any(text in line for line in server.lines):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _closed_by_server(sock) -> bool:
    sock.settimeout(5.0)
    return sock.recv(1) == b""


@pytest.mark.slow
def test_a_tuning_through_the_server_records_the_device_that_measured(tmp_path, server, runner):
    log = tmp_path / "matmul.json"
    task = tc.SearchTask(func="matmul", args=(32, 32, 32), target=runner.target())
    summary = task.tune(tc.TuningOptions(num_measure_trials=8, num_measures_per_round=8, runner=runner, verbose=0,
                                         measure_callbacks=[tc.RecordToFile(log)], num_remeasured=1,
                                         remeasure_repeats=2), search_policy=tc.SketchPolicy(task, tc.RandomModel()))
    records = load_records(log)
    assert summary.trials == 8 and summary.valid >= 1
    assert {r.device for r in records} == {f"cpu@127.0.0.1:{server.port}"}
    assert {r.phase for r in records} == {"search", "final"}
    assert runner.target().march not in ("native", "") and str(task.target) == str(runner.target())


@pytest.mark.slow
def test_a_crashing_kernel_is_an_error_record_and_the_server_measures_the_next(runner, kernel):
    crashed, good = _run(runner, kernel("write_null"), kernel("add"))
    assert crashed.error_kind is MeasureErrorKind.WORKER_CRASH and "SIGSEGV" in crashed.error_msg
    assert good.is_valid
    assert crashed.device == good.device == f"cpu@127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.slow
def test_a_hanging_kernel_is_a_run_timeout_and_the_server_measures_the_next(server, kernel):
    with RPCRunner(port=server.port, secret=SECRET, timeout=1, number=1, min_repeat_ms=0) as runner:
        hung, good = _run(runner, kernel("spin"), kernel("add"))
    assert hung.error_kind is MeasureErrorKind.RUN_TIMEOUT and good.is_valid


@pytest.mark.parametrize("gpu, device", [("3", "/cuda:3"), ("../../etc", None), (7, None), ("x" * 65, None)])
@pytest.mark.slow
def test_a_result_names_its_gpu_only_as_a_cuda_visible_devices_entry(server, kernel, monkeypatch, gpu, device):
    """A server's reply is not trusted: a GPU named otherwise fails the session, which reconnects."""
    measure = server_module._Session.measure
    monkeypatch.setattr(server_module._Session, "measure", lambda self, *a: {**measure(self, *a), "gpu": gpu})
    with RPCRunner(port=server.port, secret=SECRET, number=1, min_repeat_ms=0) as runner:
        (result,) = _run(runner, kernel("add"))
    if device is not None:
        assert result.is_valid and result.device == f"cpu@127.0.0.1:{server.port}{device}"
    else:
        assert result.error_kind is MeasureErrorKind.RUNTIME and "not a CUDA_VISIBLE_DEVICES entry" in result.error_msg


@pytest.mark.slow  # two more servers; a server's sessions stay in the quick subset
def test_candidates_spread_over_several_servers(server, kernel):
    with DeviceServer(port=0, secret=SECRET, target=kernel("add")[0].target).start() as second:
        addresses = [("127.0.0.1", server.port), ("127.0.0.1", second.port)]
        with RPCRunner(addresses=addresses, secret=SECRET, number=1, min_repeat_ms=0) as runner:
            results = _run(runner, *[kernel("add")] * 6)
            with runner.on_one_device(repeat=2) as final:  # the re-measurement's: the first server, one session
                finals = _run(final, *[kernel("add")] * 3)
                assert final.measures_at_once == 1 and final.settings["repeat"] == 2
    assert all(r.is_valid for r in results + finals)
    assert {r.device for r in results} == {f"cpu@127.0.0.1:{port}" for _, port in addresses}
    assert {r.device for r in finals} == {f"cpu@127.0.0.1:{server.port}"}


def test_a_wrong_secret_is_refused_and_the_server_serves_on(server, runner, kernel):
    with pytest.raises(AuthenticationError, match=f"127.0.0.1:{server.port}.*secret"):
        RPCRunner(port=server.port, secret=secrets.token_hex(32))
    with pytest.raises(AuthenticationError):
        RPCRunner(port=server.port)  # no secret at all
    assert _run(runner, kernel("add"))[0].is_valid


def test_the_secret_never_crosses_the_wire(server, kernel, monkeypatch):
    recordings = []
    connect = socket.create_connection

    def recorded(*args, **kwargs):
        recordings.append(Recording(connect(*args, **kwargs)))
        return recordings[-1]

    monkeypatch.setattr(rpc_protocol.socket, "create_connection", recorded)
    with RPCRunner(port=server.port, secret=SECRET, timeout=5, number=1, min_repeat_ms=0) as runner:
        assert _run(runner, kernel("add"))[0].is_valid
    sent = b"".join(b"".join(r.sent) for r in recordings)
    assert len(sent) > 1000 and SECRET not in sent and bytes.fromhex(SECRET.decode()) not in sent


def test_an_altered_frame_is_refused_and_the_session_closed(server):
    def flip_header_byte(data):
        return data[:30] + bytes([data[30] ^ 1]) + data[31:] if len(data) > 40 else data

    channel, recording = _session(server, flip_header_byte)
    channel.send(OPEN)
    assert _closed_by_server(recording.sock)
    assert _logged(server, "MAC is wrong")


def test_replayed_frames_are_refused_in_their_session_and_in_another(server):
    channel, recording = _session(server)
    channel.send({"kind": "ping"})
    assert channel.receive()[0]["kind"] == "error"
    recording.sock.sendall(recording.sent[-1])  # the same frame again
    assert _closed_by_server(recording.sock)
    assert _logged(server, "replayed")
    _, other = _session(server)
    other.sock.sendall(recording.sent[-1])  # a frame of the first session
    assert _closed_by_server(other.sock)


def test_an_oversized_frame_is_refused_before_it_is_read(server):
    _, recording = _session(server)
    recording.sock.sendall(struct.pack(">QIQ", 0, 2, 1 << 40))
    assert _closed_by_server(recording.sock)
    assert _logged(server, "over the caps")


def test_an_unknown_request_is_answered_with_an_error_and_the_session_goes_on(server):
    channel, _ = _session(server)
    channel.send({"kind": "format_disk"})
    reply, _ = channel.receive()
    assert reply["kind"] == "error" and "unknown request 'format_disk'" in reply["message"]
    channel.send({"kind": "measure", "reference": "0" * 64})
    assert "before 'measure'" in channel.receive()[0]["message"]
    channel.send(OPEN)
    assert channel.receive()[0]["kind"] == "opened"
    channel.close()


@pytest.mark.slow
def test_a_client_trickling_a_frame_is_cut_off_after_the_request_timeout():
    with DeviceServer(port=0, secret=SECRET, request_timeout=0.5, target=tc.Target.host()).start() as server:
        _, recording = _session(server)
        recording.sock.sendall(b"\0\0\0")  # a frame begun, never finished
        started = time.perf_counter()
        assert _closed_by_server(recording.sock)
        assert time.perf_counter() - started < 4.0


def test_a_server_at_max_connections_refuses_one_more(kernel):
    with DeviceServer(port=0, secret=SECRET, max_connections=1, target=kernel("add")[0].target).start() as server:
        with RPCRunner(port=server.port, secret=SECRET):
            with pytest.raises(RPCError, match="max_connections"):
                RPCRunner(port=server.port, secret=SECRET)


def test_a_server_refuses_gpus_that_are_not_there_or_measure_a_cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    for gpus, target, message in (([0, 2], "cuda -arch=sm_90", "this process sees 2 GPU"),
                                  ([1, 1], "cuda -arch=sm_90", "distinct GPUs"),
                                  ([0], "llvm -isa=avx2", "give a CUDA target, or no gpus")):
        with pytest.raises(ValueError, match=re.escape(message)):
            DeviceServer(port=0, secret=SECRET, target=target, gpus=gpus)


def test_listening_beyond_loopback_needs_a_secret_and_a_secret_needs_16_bytes():
    with pytest.raises(RPCError, match="refusing to listen on '0.0.0.0' without a secret"):
        DeviceServer(host="0.0.0.0", port=0)
    with pytest.raises(RPCError, match="at least 16"):
        DeviceServer(port=0, secret="hunter2")


def test_an_unreachable_server_is_an_error_naming_its_address():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RPCError, match=f"127.0.0.1:{port}.*tilecraft serve"):
        RPCRunner(port=port, secret=SECRET)


def test_a_runner_refuses_another_key_and_candidates_built_for_another_target(server, runner, kernel):
    with pytest.raises(RPCError, match="serves the device 'cpu', not 'h100'"):
        RPCRunner(key="h100", port=server.port, secret=SECRET)
    candidate, build = kernel("add")
    other = MeasureInput(candidate.dag, tc.Target(runner.target(), march="x86-64"), candidate.trace)
    with pytest.raises(RPCError, match=r"target=runner.target\(\)"):
        runner.run([other], [build])


@pytest.mark.slow
def test_a_lost_server_costs_the_candidate_in_flight_and_the_runner_reconnects(kernel, secret_file):
    target = kernel("add")[0].target
    with DeviceServer(port=0, secret=SECRET, target=target).start() as first:
        port = first.port
        runner = RPCRunner(port=port, secret_file=secret_file, timeout=5, number=1, min_repeat_ms=0)
        assert _run(runner, kernel("add"))[0].is_valid
    (lost,) = _run(runner, kernel("add"))
    assert lost.error_kind is MeasureErrorKind.RUNTIME and f"cpu@127.0.0.1:{port} failed" in lost.error_msg
    with DeviceServer(port=port, secret=SECRET, target=target).start():
        assert _run(runner, kernel("add"))[0].is_valid
    runner.close()


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
@pytest.mark.slow
def test_tls_wraps_the_sessions_and_a_client_without_the_ca_is_refused(tmp_path, kernel):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with DeviceServer(port=0, secret=SECRET, certfile=str(cert), keyfile=str(key),
                      target=kernel("add")[0].target).start() as server:
        with RPCRunner(port=server.port, secret=SECRET, ca_file=cert, number=1, min_repeat_ms=0) as runner:
            assert _run(runner, kernel("add"))[0].is_valid
        with pytest.raises(RPCError):
            RPCRunner(port=server.port, secret=SECRET)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a worker's environment from /proc")
def test_a_server_of_several_gpus_measures_a_session_on_each_at_once(monkeypatch):
    """Two GPUs: the client opens a session for each, the first two candidates are in flight
    together (each waits for the other), each session's worker sees its GPU alone, and each
    result names the GPU that measured it; the re-measurement's runner uses one. The workers
    are real; their replies, which would need a GPU, are made up."""
    two_gpus_in_flight(monkeypatch)
    with DeviceServer(port=0, secret=SECRET, target="cuda -arch=sm_90", gpus=[0, 1]).start() as server, \
            RPCRunner(port=server.port, secret=SECRET) as runner:
        task = tc.SearchTask(func="matmul", args=(64, 64, 64, "float32"), target=runner.target())
        sketch = next(s for s in generate_sketches(task.compute_dag, target=task.target) if s.name == "gpu_tile")
        inputs = [MeasureInput(task.compute_dag, task.target, sketch.trace_of(default_row(sketch, 1)))] * 6
        builds = tc.LocalBuilder().build(inputs[:1]) * 6
        assert runner.measures_at_once == 2
        results = runner.run(inputs, builds)
        with runner.on_one_device() as final:
            finals = final.run(inputs[:2], builds[:2])
    device = f"cpu@127.0.0.1:{server.port}/cuda:"
    assert all(r.is_valid and r.device == f"{device}{round(r.costs[0] * 1e3)}" for r in results + finals)
    assert {r.device for r in results} == {f"{device}3", f"{device}5"} and len({r.device for r in finals}) == 1


@pytest.mark.parametrize("gpus", [None, pytest.param("cuda:1,cuda:0", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_tilecraft_serve_prints_its_target_serves_and_stops_on_ctrl_c(secret_file, gpus, monkeypatch):
    """A CPU's server, or two GPUs' (CUDA_VISIBLE_DEVICES=3,5 as the shell set it): a client
    opens a session on each GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    devices = ["--device", gpus, "--target", "cuda -arch=sm_90"] if gpus else []
    # Ctrl-C as in a terminal: a shell's background job (CI run with &) passes SIGINT on ignored
    serve = subprocess.Popen([sys.executable, "-m", "tilecraft.cli", "serve", "--port", "0", "--secret-file",
                              str(secret_file), "--key", "cpu", *devices], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first, second = serve.stdout.readline(), serve.stdout.readline()
        port = int(first.split(":")[-1])
        assert first.startswith("tilecraft serve: device 'cpu' on 127.0.0.1:")
        assert second.startswith("target: cuda -arch=sm_90" if gpus else "target: llvm")
        assert not gpus or serve.stdout.readline() == "measuring on GPU(s) 5, 3, a session on each\n"
        with RPCRunner(port=port, secret_file=secret_file) as runner:
            assert str(runner.target()) == second.removeprefix("target: ").strip()
            assert runner.measures_at_once == (2 if gpus else 1)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=10) == 0
    finally:
        serve.kill()
        serve.wait()


def test_a_malformed_launch_or_one_for_the_wrong_kind_of_device_is_refused_and_the_session_goes_on(server):
    channel, _ = _session(server)
    channel.send(OPEN)
    assert channel.receive()[0]["kind"] == "opened"
    data = b"any bytes: the server stores the workload's data by their SHA-256"
    channel.send({"kind": "reference", "sha256": hashlib.sha256(data).hexdigest()}, data)
    assert channel.receive()[0]["kind"] == "stored"
    request = {"kind": "measure", "reference": hashlib.sha256(data).hexdigest(), "entry_name": "add",
               "args": [[a.name, list(a.shape), a.dtype, a.is_output] for a in ARGS], "packs": []}
    malformed = "'launch' must be {'launch': a kernel's {grid, block, shared_bytes, zeroed} or a list of them"
    one = {"grid": [1, 1, 1], "block": [32, 1, 1]}
    workspace = [{"name": "partials", "shape": [4, 8], "dtype": "float32", "is_output": True}]
    for launch, message in (([[1, 1, 1], [32, 1, 1]], malformed),  # the form before workspaces
                            ({"launch": {**one, "grid": [0, 1, 1]}}, malformed),
                            ({"launch": {**one, "grid": [1, 1]}}, malformed),
                            ({"launch": {**one, "block": [32.5, 1, 1]}}, malformed),
                            ({"launch": {**one, "shared_bytes": -1}}, malformed),
                            ({"launch": {**one, "zeroed": [2, 2]}}, malformed),
                            ({"launch": {**one, "zeroed": [0]}}, malformed),  # an input
                            ({"launch": {**one, "zeroed": 2}}, malformed),
                            ({"launch": [one, 7]}, malformed),
                            ({"launch": one, "workspace": workspace}, malformed),  # one kernel has no workspace
                            ({"launch": [one, one], "workspace": [{**workspace[0], "shape": [-4]}]}, malformed),
                            ({"launch": [one, one], "workspace": [{**workspace[0], "name": "A"}]}, malformed),
                            ({"launch": [one, one], "workspace": "partials"}, malformed),
                            ({"launch": one}, "send a shared library"),
                            ({"launch": {**one, "shared_bytes": 65536}}, "send a shared library"),
                            ({"launch": [one, {**one, "zeroed": [2]}], "workspace": workspace},
                             "send a shared library")):
        channel.send({**request, "launch": launch}, b"\x7fELF")
        reply = channel.receive()[0]
        assert reply["kind"] == "error" and message in reply["message"]
    channel.close()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.slow
def test_a_gpu_server_reports_its_arch_and_its_worker_runs_the_cubins_sent_with_their_launch(tmp_path):
    """Without a GPU here the worker's CUDA path fails at its first driver call, which shows
    the cubin and its launch reached it; with one, the candidate is measured."""
    with DeviceServer(port=0, secret=SECRET, target="cuda -arch=sm_90").start() as gpu_server, \
            RPCRunner(port=gpu_server.port, secret=SECRET, timeout=10) as gpu_runner:
        target = gpu_runner.target()
        assert isinstance(target, tc.CudaTarget) and target.arch == "sm_90"
        candidates = []
        for args, kind in (((64, 64, 64), "gpu_tile"), ((64, 512, 64), "gpu_split_k")):  # the second zeroes C first
            task = tc.SearchTask(func="matmul", args=(*args, "float32"), target=target)
            sketch = next(s for s in generate_sketches(task.compute_dag, target=target) if s.name == kind)
            candidates.append(MeasureInput(task.compute_dag, target, sketch.trace_of(default_row(sketch, 1))))
        builds = tc.LocalBuilder().build(candidates)
        assert all(build.launch is not None and build.error_kind is MeasureErrorKind.NONE for build in builds)
        assert builds[1].launch["launch"]["zeroed"] == [2]
        for result in gpu_runner.run(candidates, builds):
            assert result.device == f"cpu@127.0.0.1:{gpu_server.port}"
            if tc.cuda_available():
                assert result.is_valid and 0 < result.costs[0] < 1
            else:
                assert result.error_kind is MeasureErrorKind.RUNTIME
                assert re.search("running CUDA kernels needs|no NVIDIA driver", result.error_msg), result.error_msg
