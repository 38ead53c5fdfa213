"""The device server's wire protocol: authenticated frames of JSON and raw bytes.

A device server runs native code that a tuner sends it, so only holders of a shared
secret may talk to it, and nothing on the wire is trusted (TVM's RPC server, which
authenticates no one, is "full remote code execution" for anyone who can reach it).
Standard library only; docs/formats.md ("The device server's protocol") has the layout.

  handshake  each side sends a fresh 32-byte nonce; the client proves it knows the secret
             with HMAC-SHA256(secret, "client" | both nonces), then the server with
             "server" | both nonces. The secret never crosses the wire, and a proof is
             good for one session only.
  frames     ``[seq u64][header bytes u32][payload bytes u64][header][payload][mac]``,
             the MAC an HMAC-SHA256 under a session key derived from the secret and both
             nonces, over the direction, the prefix, the header and the payload. A frame
             with a bad MAC (altered, or from another session), a sequence number other
             than the next (replayed, reordered or dropped), or sizes over the caps ends
             the connection.
  content    the header is a JSON object with a ``kind``; the payload raw bytes (a shared
             library, an ``.npz``). Nothing is unpickled or evaluated.

TLS (``ssl``) may wrap the socket for confidentiality off the host; the HMAC framing
stays on inside it, so the secret still authenticates both ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from pathlib import Path
from typing import Any, NoReturn

from ..errors import TilecraftError

MAGIC = b"TCRPC/2\n"         # the protocol and its version, first on the wire from both sides
NONCE_BYTES = 32
MIN_SECRET_BYTES = 16        # a proof over known nonces lets a listener guess a short secret offline
MAX_FRAME_BYTES = 256 << 20  # header and payload together; a conv layer's reference data fits
MAX_HEADER_BYTES = 1 << 20
CONNECT_SECS = 10.0
_PREFIX = struct.Struct(">QIQ")  # sequence number, header bytes, payload bytes
_MAC_BYTES = hashlib.sha256().digest_size
SECRET_HINT = "make one with: python -c 'import secrets; print(secrets.token_hex(32))' > FILE"


class RPCError(TilecraftError):
    """A device-server connection cannot work: the server is unreachable, a peer broke the
    protocol (a frame altered, replayed or too large, a timeout), or a setting is unsafe.
    The connection, if any, is closed."""


class AuthenticationError(RPCError):
    """The two ends do not share the secret."""


def secret_bytes(secret: bytes | str | None, secret_file: str | Path | None = None) -> bytes | None:
    """The secret given directly or in a file (surrounding whitespace dropped); None for none.

    Raises:
        RPCError: If both or a short secret (under ``MIN_SECRET_BYTES``) are given.
    """
    if secret is not None and secret_file is not None:
        raise RPCError("give the secret or a secret_file, not both")
    if secret_file is not None:
        secret = Path(secret_file).read_bytes().strip()
    if secret is None:
        return None
    secret = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(secret) < MIN_SECRET_BYTES:
        raise RPCError(f"the secret has {len(secret)} bytes; use at least {MIN_SECRET_BYTES} random bytes "
                       f"({SECRET_HINT})")
    return secret


class Channel:
    """An authenticated connection: ``send`` and ``receive`` frames of a JSON header and bytes.

    Made by ``connect`` (or ``client_handshake``) and ``server_handshake``. Any failure
    raises ``RPCError`` and closes the connection: after a refused frame the two ends no
    longer agree on anything.
    """

    def __init__(self, sock: Any, is_client: bool, timeout_secs: float, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._sock = sock
        self._key = b""  # the session key, once the handshake has derived it
        self._outgoing, self._incoming = (b"C", b"S") if is_client else (b"S", b"C")
        self._sent = self._received = 0
        self.timeout_secs = timeout_secs
        self.max_frame_bytes = max_frame_bytes

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        body = json.dumps(header).encode()
        prefix = _PREFIX.pack(self._sent, len(body), len(payload))
        self._sent += 1
        self._write(b"".join((prefix, body, payload, self._mac(self._outgoing, prefix, body, payload))))

    def receive(self, wait_secs: float | None = None) -> tuple[dict[str, Any], bytes]:
        """The next frame's header and payload. Its first byte may take ``wait_secs`` (the
        read timeout by default) to come; the whole frame must then arrive within the
        read timeout."""
        prefix = bytes(self._read(_PREFIX.size, wait_secs))
        sequence, header_bytes, payload_bytes = _PREFIX.unpack(prefix)
        if header_bytes > MAX_HEADER_BYTES or header_bytes + payload_bytes > self.max_frame_bytes:
            self.fail(f"refused a frame of {header_bytes} + {payload_bytes} bytes: over the caps of "
                      f"{MAX_HEADER_BYTES} bytes a header and {self.max_frame_bytes} bytes a frame")
        rest = self._read(header_bytes + payload_bytes + _MAC_BYTES)
        body, payload, mac = rest[:header_bytes], rest[header_bytes:-_MAC_BYTES], rest[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(self._incoming, prefix, body, payload)):
            self.fail("refused a frame whose MAC is wrong: it was altered, or belongs to another session")
        if sequence != self._received:
            self.fail(f"refused frame number {sequence} where {self._received} was due: replayed or reordered")
        self._received += 1
        try:
            header = json.loads(bytes(body))
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            header = None
        if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
            self.fail("refused a frame whose header is not a JSON object with a 'kind'")
        return header, bytes(payload)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def fail(self, why: str, error: type[RPCError] = RPCError) -> NoReturn:
        """Close the connection and raise ``error(why)``."""
        self.close()
        raise error(why)

    def _mac(self, direction: bytes, *parts: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, direction, hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def _write(self, data: bytes) -> None:
        try:
            self._sock.settimeout(self.timeout_secs)
            self._sock.sendall(data)
        except OSError as error:
            self.fail(f"sending: {error}")

    def _read(self, size: int, wait_secs: float | None = None) -> memoryview:
        """``size`` bytes, the first within ``wait_secs`` (or the read timeout), all within
        the read timeout of the first: a peer trickling bytes is cut off."""
        buffer = memoryview(bytearray(size))
        got = 0
        deadline = time.monotonic() + (wait_secs if wait_secs is not None else self.timeout_secs)
        while got < size:
            try:
                self._sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                count = self._sock.recv_into(buffer[got:], min(size - got, 1 << 20))
            except TimeoutError:
                self.fail(f"timed out after {got} of {size} bytes")
            except OSError as error:
                self.fail(f"receiving: {error}")
            if not count:
                self.fail("the peer closed the connection")
            if got == 0 and wait_secs is not None:
                deadline = time.monotonic() + self.timeout_secs
            got += count
        return buffer


def connect(host: str, port: int, secret: bytes | None, timeout_secs: float, ca_file: str | Path | None = None,
            max_frame_bytes: int = MAX_FRAME_BYTES) -> Channel:
    """An authenticated channel to the device server at ``host:port``; over TLS, checking
    the server's certificate against ``ca_file``, when one is given. Connecting may take
    ``CONNECT_SECS``; ``timeout_secs`` is the channel's read and send timeout.

    Raises:
        AuthenticationError: If the server refuses the secret or cannot prove it knows it.
        RPCError: If the server cannot be reached or speaks another protocol.
    """
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout_secs, CONNECT_SECS))
    except OSError as error:
        raise RPCError(f"cannot connect ({error}); is `tilecraft serve` running there, on that port?") from None
    try:
        if ca_file is not None:
            import ssl  # only here: a measuring worker imports this package and must start fast

            sock = ssl.create_default_context(cafile=str(ca_file)).wrap_socket(sock, server_hostname=host)
        return client_handshake(sock, secret, timeout_secs, max_frame_bytes)
    except OSError as error:  # ssl.SSLError is one
        sock.close()
        raise RPCError(f"TLS or connection failure: {error}") from None


def client_handshake(sock: Any, secret: bytes | None, timeout_secs: float,
                     max_frame_bytes: int = MAX_FRAME_BYTES) -> Channel:
    """Authenticate a connected socket to a server; the channel for the session.

    Raises:
        AuthenticationError: If the server refuses the secret or cannot prove it knows it.
        RPCError: If the peer is no device server or the connection fails.
    """
    channel = Channel(sock, True, timeout_secs, max_frame_bytes)
    ours = secrets.token_bytes(NONCE_BYTES)
    channel._write(MAGIC + ours)
    try:
        greeting = bytes(channel._read(len(MAGIC) + NONCE_BYTES))
    except RPCError as error:
        raise RPCError(f"no greeting from the server ({error}); it may be at its max_connections, or serve TLS "
                       f"(give ca_file=)") from None
    if not greeting.startswith(MAGIC):
        channel.fail("the peer is not a tilecraft device server of this protocol version")
    theirs = greeting[len(MAGIC):]
    key = secret or b""
    channel._write(_proof(key, b"client", ours, theirs))
    try:
        proof = bytes(channel._read(_MAC_BYTES))
    except RPCError as error:
        raise AuthenticationError(f"the server refused the handshake ({error}): its secret is another "
                                  f"(or it has none)") from None
    if not hmac.compare_digest(proof, _proof(key, b"server", ours, theirs)):
        channel.fail("the server could not prove it knows the secret", AuthenticationError)
    channel._key = _proof(key, b"session", ours, theirs)
    return channel


def server_handshake(sock: Any, secret: bytes | None, timeout_secs: float,
                     max_frame_bytes: int = MAX_FRAME_BYTES) -> Channel:
    """Authenticate a client that connected; the channel for the session.

    Raises:
        AuthenticationError: If the client does not prove it knows the secret.
        RPCError: If the peer speaks another protocol or the connection fails.
    """
    channel = Channel(sock, False, timeout_secs, max_frame_bytes)
    greeting = bytes(channel._read(len(MAGIC) + NONCE_BYTES))
    if not greeting.startswith(MAGIC):
        channel.fail("the peer does not speak this protocol")
    theirs, ours = greeting[len(MAGIC):], secrets.token_bytes(NONCE_BYTES)
    channel._write(MAGIC + ours)
    key = secret or b""
    if not hmac.compare_digest(bytes(channel._read(_MAC_BYTES)), _proof(key, b"client", theirs, ours)):
        channel.fail("the client's proof of the secret is wrong", AuthenticationError)
    channel._write(_proof(key, b"server", theirs, ours))
    channel._key = _proof(key, b"session", theirs, ours)
    return channel


def _proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, label + client_nonce + server_nonce, hashlib.sha256).digest()
