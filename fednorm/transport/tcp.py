"""Links over TCP with mutual TLS: length-prefixed frames, and reaching the other end.

Frames are a 4-byte big-endian length and that many bytes.  The length is checked
against a maximum *before* anything is read or allocated, so a peer announcing a
4 GiB frame costs nothing.  What is said over a new connection before any protocol
frame (who is who, which session) is the multi-host handshake
(:mod:`fednorm.multihost.handshake`); this module only moves bytes and names what
broke when they stop moving.
"""

from __future__ import annotations

import socket
import ssl
import struct
from contextlib import suppress

import trio

from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError

DEFAULT_MAX_FRAME = 64 * 2**20  # room for 2^15-ring key shares (30-54 MiB)
_PREFIX = struct.Struct(">I")
_CLOSE_GRACE = 1.0  # seconds a graceful TLS close may take before it is forced
_DISCARD_SECONDS = 10.0  # at most this long is spent reading a refused frame's bytes,
_DISCARD_IDLE = 0.5  # and no longer than this once they stop coming


class HandshakeRefused(ProtocolError):
    """A connection was refused before any protocol frame (TLS, identity or admission)."""


class ConnectFailed(FednormError):
    """The server could not be reached at all."""


# -- framing ----------------------------------------------------------------------------
class TcpLink:
    """A :class:`~fednorm.engine.runtime.Link` over a trio stream (TLS in practice).

    ``peer`` names the other end in errors: its address until it is identified, then
    ``"party 3"`` or ``"server"``.  Sends are serialized by a lock, because a trio
    stream refuses two concurrent ``send_all`` calls (e.g. a role's send and an abort).
    """

    def __init__(self, stream: trio.abc.Stream, peer: str,
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self.peer = peer
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._send_lock = trio.StrictFIFOLock()

    async def send(self, frame: bytes) -> None:
        if len(frame) > self.max_frame:
            raise ProtocolError(f"refusing to send a frame of {len(frame)} bytes to "
                                f"{self.peer}: the limit is {self.max_frame}")
        async with self._send_lock:
            try:
                await self.stream.send_all(_PREFIX.pack(len(frame)) + frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise broken(self.peer, exc) from None

    async def receive(self) -> bytes:
        (length,) = _PREFIX.unpack(await self._read(_PREFIX.size, boundary=True))
        if length > self.max_frame:
            await self._discard(length)
            raise ProtocolError(f"{self.peer} announced a frame of {length} bytes; "
                                f"the limit is {self.max_frame}")
        return await self._read(length, boundary=False)

    async def _discard(self, size: int) -> None:
        """Read a refused frame's ``size`` bytes and keep none (for at most
        ``_DISCARD_SECONDS``, while they come): the sender's send then completes and it
        reads why its frame was refused (the role's abort), where closing with its
        bytes unread would reset the connection under it ("connection lost", not the
        cause)."""
        buffered = min(size, len(self._buffer))
        del self._buffer[:buffered]
        left = size - buffered
        with trio.move_on_after(_DISCARD_SECONDS), suppress(trio.BrokenResourceError,
                                                            trio.ClosedResourceError):
            while left > 0:
                chunk = b""
                with trio.move_on_after(_DISCARD_IDLE):
                    chunk = await self.stream.receive_some(min(left, 2**20))
                if not chunk:
                    return
                left -= len(chunk)

    async def _read(self, size: int, *, boundary: bool) -> bytes:
        """Exactly ``size`` bytes; EOF is a dropout, and says whether it cut a frame."""
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise broken(self.peer, exc) from None
            if not chunk:
                cut = "" if boundary and not self._buffer else (
                    f" mid-frame ({len(self._buffer)} of {size} bytes)")
                raise PartyDropped(self.peer, f"connection closed{cut}")
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def aclose(self) -> None:
        """Close gracefully if the peer lets us within a second, else forcefully."""
        with trio.CancelScope(deadline=trio.current_time() + _CLOSE_GRACE, shield=True):
            await self.stream.aclose()


# The TLS alerts a peer sends when it refuses the certificate this end presented.
CERTIFICATE_ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "it was not issued by the CA the peer trusts (unknown CA)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "it has expired",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "it was revoked",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer found it malformed or its signature bad",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "the peer does not accept its kind",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the peer could not verify it",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "none was presented and the peer requires one",
}


def broken(peer: str, exc: BaseException) -> FednormError:
    """The error for a stream to ``peer`` that broke: the peer refused this end's
    certificate (a :class:`HandshakeRefused` saying why), or it went away."""
    cause = exc.__cause__ or exc
    refused = CERTIFICATE_ALERTS.get(getattr(cause, "reason", None) or "")
    if isinstance(cause, ssl.SSLError) and refused:
        return HandshakeRefused(f"{peer} refused the certificate this end presented: "
                                f"{refused}")
    return PartyDropped(peer, describe_broken(exc))


def describe_broken(exc: BaseException) -> str:
    """A readable cause for a broken stream: the TLS error behind it, or that the
    connection was lost (a socket error's wording, e.g. "Broken pipe", says which end
    noticed first, not what happened)."""
    if isinstance(exc, trio.ClosedResourceError):
        return "link closed"
    cause = exc.__cause__ or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        hint = (" (the server certificate must name the host parties connect to: "
                "fednorm certs init --host HOST)" if "mismatch" in cause.verify_message else "")
        return f"certificate verify failed: {cause.verify_message}{hint}"
    if isinstance(cause, ssl.SSLEOFError):
        return "connection lost (closed without TLS shutdown)"
    if isinstance(cause, ssl.SSLError):  # what TLS objected to
        return f"connection lost ({cause})"
    return "connection lost"


# -- connecting -------------------------------------------------------------------------
def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` as (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def set_keepalive(stream: trio.SocketStream, idle: int = 15) -> None:
    """Let the kernel notice a vanished host (no FIN ever comes) within about a minute."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, option):
            stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def address_of(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "an unknown peer"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def tls_handshake(tls: trio.SSLStream[trio.SocketStream], peer: str) -> None:
    """Complete the TLS handshake; a failure says what TLS objected to."""
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await _send_alert(tls)
        raise HandshakeRefused(f"TLS handshake with {peer} failed: "
                               f"{describe_broken(exc)}") from None


async def _send_alert(tls: trio.SSLStream[trio.SocketStream]) -> None:
    """Deliver the TLS alert that says why the handshake failed (e.g. "unknown CA" for a
    client certificate from another CA).  OpenSSL writes it, but trio's SSLStream stops
    sending once an operation failed, so without this the peer sees only a closed
    connection and cannot tell its certificate was refused."""
    outgoing = getattr(tls, "_outgoing", None)  # the stream's ssl.MemoryBIO
    alert = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
    if alert:
        with trio.move_on_after(0.5), suppress(trio.BrokenResourceError, OSError):
            await tls.transport_stream.send_all(alert)


async def open_connection(host: str, port: int, timeout: float) -> trio.SocketStream:
    """Connect, retrying while the server is not up yet, for at most ``timeout`` seconds."""
    last_error: OSError | None = None
    with trio.move_on_after(timeout):
        while True:
            try:
                return await trio.open_tcp_stream(host, port)
            except OSError as exc:
                last_error = exc
            await trio.sleep(0.2)
    raise ConnectFailed(f"could not connect to {host}:{port} within {timeout:g} s: "
                        f"{last_error or 'timed out'}")
