"""Links over TCP with mutual TLS: framing, the admission handshake, and who may join.

Frames are a 4-byte big-endian length and that many bytes.  The length is checked
against a maximum *before* anything is read or allocated, so a peer announcing a
4 GiB frame costs nothing.  Before any protocol frame, each connection carries one
handshake exchange of small msgpack frames::

    party  -> server   Hello    versions, party id, feature names (+ optional session, protocol)
    server -> party    Welcome  session id, method, privacy, options   (or Refusal)
    party  -> server   Ready    its data fits those options  (or Withdraw, saying why not)
    server -> party    Start    once all N parties are in; protocol frames follow

The server, not the parties, chooses the protocol and its options, so parties cannot
disagree on them.  A party's id comes from its client certificate; the handshake must
claim the same id.  The :class:`Lobby` holds the admission rules of one session:
exactly parties 1..N, once each, all with the federation's features (the server's
configured ones, or the majority's once all N are in).
"""

from __future__ import annotations

import socket
import ssl
import struct
import types
import typing
from collections import Counter
from contextlib import suppress
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, TypeVar

import msgpack
import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError
from fednorm.engine.runtime import role_name
from fednorm.transport.tls import peer_party

NET_VERSION = 2  # 2: the party answers the welcome with Ready or Withdraw
DEFAULT_MAX_FRAME = 64 * 2**20  # room for 2^15-ring relinearization-key shares (~25 MB)
HANDSHAKE_MAX_FRAME = 64 * 2**10
_PREFIX = struct.Struct(">I")
_CLOSE_GRACE = 1.0  # seconds a graceful TLS close may take before it is forced


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
                raise PartyDropped(self.peer, describe_broken(exc)) from None

    async def receive(self) -> bytes:
        (length,) = _PREFIX.unpack(await self._read(_PREFIX.size, boundary=True))
        if length > self.max_frame:
            raise ProtocolError(f"{self.peer} announced a frame of {length} bytes; "
                                f"the limit is {self.max_frame}")
        return await self._read(length, boundary=False)

    async def _read(self, size: int, *, boundary: bool) -> bytes:
        """Exactly ``size`` bytes; EOF is a dropout, and says whether it cut a frame."""
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PartyDropped(self.peer, describe_broken(exc)) from None
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


def describe_broken(exc: BaseException) -> str:
    """A readable cause for a broken stream: the TLS alert or socket error behind it."""
    if isinstance(exc, trio.ClosedResourceError):
        return "link closed"
    cause = exc.__cause__ or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        hint = (" (the server certificate must name the host parties connect to: "
                "fednorm certs init --host HOST)" if "mismatch" in cause.verify_message else "")
        return f"certificate verify failed: {cause.verify_message}{hint}"
    if isinstance(cause, ssl.SSLEOFError):
        return "connection lost (closed without TLS shutdown)"
    return f"connection lost ({cause})" if str(cause) else "connection lost"


# -- handshake messages -----------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """Party -> server: who I am, what I speak, which columns I hold.

    ``session`` and ``protocol`` are optional pins: when set, the server refuses the
    party unless its session / protocol is that one.
    """

    TYPE: ClassVar[str] = "hello"
    version: int
    wire: int
    party: int
    features: tuple[str, ...]
    session: str | None = None
    protocol: str | None = None


@dataclass(frozen=True)
class Welcome:
    """Server -> party: admitted to ``session``; the server's protocol and options."""

    TYPE: ClassVar[str] = "welcome"
    version: int
    session: str
    method: str
    privacy: str
    parties: int
    options: dict[str, Any]


@dataclass(frozen=True)
class Start:
    """Server -> every party, once all are in: protocol frames follow."""

    TYPE: ClassVar[str] = "start"
    session: str


@dataclass(frozen=True)
class Refusal:
    """Server -> party: not admitted, or the session was abandoned, and why."""

    TYPE: ClassVar[str] = "refusal"
    reason: str


@dataclass(frozen=True)
class Ready:
    """Party -> server, after the welcome: its data fits the announced options."""

    TYPE: ClassVar[str] = "ready"
    session: str


@dataclass(frozen=True)
class Withdraw:
    """Party -> server, instead of :class:`Ready`: this party cannot take part, and why
    (e.g. its data is beyond the bound V_abs the welcome announced)."""

    TYPE: ClassVar[str] = "withdraw"
    reason: str


class Withdrawal(FednormError):
    """A :class:`Withdraw` arrived where another handshake message was expected."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PartyWithdrew(PartyDropped):
    """A party of the federation cannot take part (it said why): the session is doomed."""

    def __init__(self, party: int, reason: str) -> None:
        super().__init__(role_name(party), f"withdrew: {reason}")
        self.party = party


HandshakeMessage = Hello | Welcome | Start | Refusal | Ready | Withdraw
_HANDSHAKE_TYPES: dict[str, type] = {cls.TYPE: cls for cls in typing.get_args(HandshakeMessage)}
H = TypeVar("H", Hello, Welcome, Start, Refusal, Ready, Withdraw)


def encode_handshake(msg: HandshakeMessage) -> bytes:
    body = {f.name: getattr(msg, f.name) for f in fields(msg)}
    return msgpack.packb({"type": msg.TYPE, **body}, use_bin_type=True)


def decode_handshake(data: bytes, expected: type[H]) -> H:
    """Parse a handshake frame that must be ``expected`` (a :class:`Refusal` is raised)."""
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"undecodable handshake frame ({len(data)} bytes): {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("handshake frame is not a map")
    kind = body.pop("type", None)
    if kind == Refusal.TYPE and expected is not Refusal:
        reason = _build(Refusal, body).reason
        raise HandshakeRefused(f"server refused: {reason}")
    if kind == Withdraw.TYPE and expected is not Withdraw:
        raise Withdrawal(_build(Withdraw, body).reason)
    if kind != expected.TYPE:
        raise ProtocolError(f"expected a {expected.TYPE!r} handshake frame, got {kind!r}")
    return _build(expected, body)


def _build(cls: type[H], body: dict[str, Any]) -> H:
    """Instantiate ``cls`` from a decoded map, checking names and types of every field."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING}
    if not required <= set(body) <= names:
        raise ProtocolError(f"{cls.TYPE!r} handshake has fields {sorted(body)}, "
                            f"expected {sorted(names)}")
    for name, value in body.items():
        if not _conforms(value, hints[name]):
            raise ProtocolError(f"{cls.TYPE!r} handshake field {name!r} has a bad value")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    return cls(**values)


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


async def send_handshake(link: TcpLink, msg: HandshakeMessage) -> None:
    await link.send(encode_handshake(msg))


async def receive_handshake(link: TcpLink, expected: type[H]) -> H:
    return decode_handshake(await link.receive(), expected)


# -- admission --------------------------------------------------------------------------
class SchemaMismatch(HandshakeRefused):
    """Parties do not hold the federation's columns; the session cannot run.

    ``party`` is the one refused for it at admission (None: found once all were in)."""

    def __init__(self, message: str, party: int | None = None) -> None:
        super().__init__(message)
        self.party = party


def column_difference(party: int, have: tuple[str, ...], expected: tuple[str, ...]) -> str:
    """Which columns a party lacks or adds against ``expected``, by name."""
    missing = [name for name in expected if name not in have]
    extra = [name for name in have if name not in expected]
    if not missing and not extra:
        return (f"party {party} has the federation's columns in another order "
                f"({', '.join(have)}; expected {', '.join(expected)})")
    parts = ([f"lacks {', '.join(map(repr, missing))}"] if missing else []) + (
        [f"has unexpected {', '.join(map(repr, extra))}"] if extra else [])
    return f"party {party}'s columns differ from the federation's: " + " and ".join(parts)


class Lobby:
    """Who may join one session: parties 1..N, once each, with the same features.

    :meth:`reserve` checks and claims a slot without awaiting, so two connections
    claiming the same id cannot both pass; :meth:`admit` fills it once the party has
    been welcomed.  The columns are the configured ``schema`` when there is one (a
    party that differs is refused at once), otherwise those of the majority once all N
    are in (:meth:`agree`): never those of whoever came first.  A cause that dooms the
    session (:meth:`abandon`) ends the wait for everyone at once.
    """

    def __init__(self, welcome: Welcome, protocol: str,
                 schema: tuple[str, ...] | None = None) -> None:
        self.welcome = welcome
        self.protocol = protocol
        self.schema = schema
        self.links: dict[int, TcpLink] = {}
        self._claims: dict[int, Hello] = {}
        self.agreed: tuple[str, ...] | None = schema
        self.failure: FednormError | None = None
        self.told: set[int] = set()  # parties told why a doomed session will not run
        self.first_joined = trio.Event()  # a party is in, or the session is doomed
        self.settled = trio.Event()  # all parties are in, or the session is doomed
        self.all_told = trio.Event()  # every party of a doomed session knows the cause

    @property
    def session(self) -> str:
        return self.welcome.session

    @property
    def features(self) -> tuple[str, ...] | None:
        """The federation's columns: configured, or agreed by :meth:`agree`."""
        return self.agreed

    @property
    def full(self) -> bool:
        return not self.missing()

    def missing(self) -> list[int]:
        return [p for p in range(1, self.welcome.parties + 1) if p not in self.links]

    def reserve(self, hello: Hello, cert_party: int | None) -> None:
        """Claim ``hello.party``'s slot, or raise :class:`HandshakeRefused` saying why.

        Once the session is doomed, a party of the federation that arrives late is
        refused with the cause everyone else was given.
        """
        self._check(hello, cert_party)
        if self.failure is not None:
            self.tell(hello.party)
            raise HandshakeRefused(f"session abandoned: {self.failure}")
        if self.schema is not None and hello.features != self.schema:
            raise SchemaMismatch(column_difference(hello.party, hello.features, self.schema),
                                 hello.party)
        self._claims[hello.party] = hello

    def release(self, party: int) -> None:
        self._claims.pop(party, None)
        self.links.pop(party, None)

    def admit(self, party: int, link: TcpLink) -> None:
        self.links[party] = link
        self.first_joined.set()
        if self.full:
            self.settled.set()

    def abandon(self, cause: FednormError, party: int | None = None) -> None:
        """The session cannot run: the first cause is the one everyone is told
        (``party``, whose fault it is, already knows)."""
        if self.failure is None:
            self.failure = cause
        if party is not None:
            self.tell(party)
        self.first_joined.set()
        self.settled.set()

    def tell(self, party: int) -> None:
        """Note that ``party`` knows the cause of the session's failure."""
        self.told.add(party)
        if len(self.told) >= self.welcome.parties:
            self.all_told.set()

    def agree(self) -> tuple[str, ...]:
        """With every party in: the majority's columns; :class:`SchemaMismatch` naming
        the columns of each party that differs (everyone, if no schema has a majority)."""
        if self.agreed is not None:
            return self.agreed
        schemas = {p: self._claims[p].features for p in sorted(self.links)}
        votes = Counter(schemas.values())
        leader, count = votes.most_common(1)[0]
        if count * 2 > len(schemas):
            differ = [column_difference(p, have, leader) for p, have in schemas.items()
                      if have != leader]
            if differ:
                raise SchemaMismatch("; ".join(differ))
            self.agreed = leader
            return leader
        held = "; ".join(f"party {p}: {', '.join(have)}" for p, have in schemas.items())
        raise SchemaMismatch(f"the parties disagree on the columns and no set has a "
                             f"majority ({held}); give the server --features")

    def _check(self, hello: Hello, cert_party: int | None) -> None:
        party, n = hello.party, self.welcome.parties
        refusals = [
            (hello.version != NET_VERSION,
             f"handshake version {hello.version}, the server speaks {NET_VERSION}"),
            (hello.wire != WIRE_VERSION,
             f"wire version {hello.wire}, the server speaks {WIRE_VERSION}"),
            (cert_party is None, "the client certificate names no party"),
            (cert_party is not None and cert_party != party,
             f"the certificate is party {cert_party}'s but the handshake claims party {party}"),
            (not 1 <= party <= n, f"party {party} is not expected: parties are 1..{n}"),
            (party in self._claims, f"party {party} is already connected"),
            (hello.session is not None and hello.session != self.session,
             f"the party wants session {hello.session!r}, this is session {self.session!r}"),
            (hello.protocol is not None and hello.protocol != self.protocol,
             f"the party wants protocol {hello.protocol!r}, the server runs {self.protocol!r}"),
            (not hello.features, "the party has no features"),
        ]
        for refused, reason in refusals:
            if refused:
                raise HandshakeRefused(reason)


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


async def _tls_handshake(tls: trio.SSLStream[trio.SocketStream], peer: str) -> None:
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise HandshakeRefused(f"TLS handshake with {peer} failed: "
                               f"{describe_broken(exc)}") from None


async def admit_connection(
    stream: trio.SocketStream, context: ssl.SSLContext, lobby: Lobby, *,
    timeout: float, max_frame: int = DEFAULT_MAX_FRAME,
) -> tuple[int, TcpLink]:
    """Server side of one connection: TLS, hello, checks, welcome.

    Returns the party id and its link, ready for :class:`Start`.  On any failure the
    connection is closed (after a :class:`Refusal` naming the reason, when TLS is up)
    and the error is raised for the server to log; the lobby is left as it was.
    """
    peer = address_of(stream)
    set_keepalive(stream)
    tls = trio.SSLStream(stream, context, server_side=True)
    link = TcpLink(tls, peer, HANDSHAKE_MAX_FRAME)
    tls_up, party = False, None
    try:
        with trio.fail_after(timeout):
            await _tls_handshake(tls, peer)
            tls_up = True
            hello = await receive_handshake(link, Hello)
            lobby.reserve(hello, peer_party(tls.getpeercert()))
            party = hello.party
            await send_handshake(link, lobby.welcome)
            try:
                await receive_handshake(link, Ready)
            except Withdrawal as withdrawal:
                raise PartyWithdrew(party, withdrawal.reason) from None
    except BaseException as exc:
        if party is not None:
            lobby.release(party)
        error = exc
        if isinstance(exc, trio.TooSlowError):
            error = HandshakeRefused(f"{peer} did not complete the handshake in {timeout:g} s")
        await _refuse(link, error if tls_up else None)
        if error is exc:
            raise
        raise error from None
    link.peer, link.max_frame = role_name(party), max_frame
    return party, link


async def _refuse(link: TcpLink, error: BaseException | None) -> None:
    """Tell a refused client why (when its TLS session is up), then close the connection."""
    if isinstance(error, FednormError):
        with trio.move_on_after(0.5, shield=True), suppress(FednormError):
            await send_handshake(link, Refusal(str(error)))
    await link.aclose()


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


async def connect_party(
    host: str, port: int, context: ssl.SSLContext, hello: Hello, *,
    connect_timeout: float, handshake_timeout: float, max_frame: int = DEFAULT_MAX_FRAME,
) -> tuple[TcpLink, Welcome]:
    """Party side: connect, TLS (the server must present a certificate for ``host``), hello.

    Every failure before the welcome is a :class:`HandshakeRefused` (or
    :class:`ConnectFailed`) that says what the server or TLS objected to.
    """
    stream = await open_connection(host, port, connect_timeout)
    set_keepalive(stream)
    tls = trio.SSLStream(stream, context, server_hostname=host)
    link = TcpLink(tls, "server", HANDSHAKE_MAX_FRAME)
    try:
        with trio.fail_after(handshake_timeout):
            await _tls_handshake(tls, f"server {host}:{port}")
            await send_handshake(link, hello)
            welcome = await receive_handshake(link, Welcome)
    except BaseException as exc:
        await link.aclose()
        if isinstance(exc, trio.TooSlowError):
            raise HandshakeRefused(f"no welcome from {host}:{port} within "
                                   f"{handshake_timeout:g} s") from None
        if isinstance(exc, PartyDropped):
            raise HandshakeRefused(f"server {host}:{port} closed the connection during the "
                                   f"handshake: {exc.reason}") from None
        raise
    if welcome.version != NET_VERSION:
        await link.aclose()
        raise HandshakeRefused(f"server speaks handshake version {welcome.version}, "
                               f"this party {NET_VERSION}")
    link.max_frame = max_frame
    return link, welcome


async def wait_start(link: TcpLink, session: str, timeout: float) -> None:
    """Party side: wait until every party is in and the server starts the protocol."""
    with trio.move_on_after(timeout):
        start = await receive_handshake(link, Start)
        if start.session != session:
            raise ProtocolError(f"start for session {start.session!r}, joined {session!r}")
        return
    raise HandshakeRefused(f"the server did not start the session within {timeout:g} s "
                           "(are all parties connected?)")
