"""The multi-host handshake: what a connection carries before any protocol frame.

Each connection carries one exchange of small msgpack frames::

    party  -> server   Hello    versions, party id, feature names (+ optional session, protocol;
                                or, from a party that refuses its own data, why: the end)
    server -> party    Welcome  session id, methods, privacy, options   (or Refusal)
    party  -> server   Ready    its data fits those options  (or Withdraw, saying why not)
    server -> party    Start    once all N parties are in; protocol frames follow

The server, not the parties, chooses the protocol and its options, so parties cannot
disagree on them.  A party's id comes from its client certificate; the handshake must
claim the same id.  Who may join a session is the :class:`~fednorm.multihost.lobby.Lobby`'s
decision; this module carries the messages and runs both sides of one connection.
"""

from __future__ import annotations

import ssl
import types
import typing
from contextlib import suppress
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import msgpack
import trio

from fednorm.engine.errors import FednormError, PartyDropped, ProtocolError, RunAborted
from fednorm.engine.runtime import role_name
from fednorm.transport.tcp import (
    DEFAULT_MAX_FRAME,
    HandshakeRefused,
    TcpLink,
    address_of,
    open_connection,
    set_keepalive,
    tls_handshake,
)
from fednorm.transport.tls import peer_party

if TYPE_CHECKING:
    from fednorm.multihost.lobby import Lobby

NET_VERSION = 4  # 2: Ready or Withdraw after the welcome; 3: methods; 4: Hello.withdraw
HANDSHAKE_MAX_FRAME = 64 * 2**10


# -- messages -------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """Party -> server: who I am, what I speak, which columns I hold.

    ``session`` and ``protocol`` are optional pins: when set, the server refuses the
    party unless its session / protocol is that one.  ``withdraw`` is set by a party
    that cannot use its own data (unreadable, non-numeric): it comes only to say so,
    and the server abandons the session at once instead of waiting for it to join.
    """

    TYPE: ClassVar[str] = "hello"
    version: int
    wire: int
    party: int
    features: tuple[str, ...]
    session: str | None = None
    protocol: str | None = None
    withdraw: str | None = None


@dataclass(frozen=True)
class Welcome:
    """Server -> party: admitted to ``session``; the methods the session fits, in order
    (several share one key setup), the privacy mode and the options."""

    TYPE: ClassVar[str] = "welcome"
    version: int
    session: str
    methods: tuple[str, ...]
    privacy: str
    parties: int
    options: dict[str, Any]


@dataclass(frozen=True)
class _SessionStep:
    """The shape of a handshake step that names only its session."""

    TYPE: ClassVar[str]
    session: str


@dataclass(frozen=True)
class _Explanation:
    """The shape of a handshake answer that says only why."""

    TYPE: ClassVar[str]
    reason: str


class Start(_SessionStep):
    """Server -> every party, once all are in: protocol frames follow."""

    TYPE = "start"


class Ready(_SessionStep):
    """Party -> server, after the welcome: its data fits the announced options."""

    TYPE = "ready"


class Refusal(_Explanation):
    """Server -> party: not admitted, or the session was abandoned, and why."""

    TYPE = "refusal"


class Withdraw(_Explanation):
    """Party -> server, instead of :class:`Ready`: this party cannot take part, and why
    (e.g. its data is beyond the bound V_abs the welcome announced)."""

    TYPE = "withdraw"


class Withdrawal(FednormError):
    """A :class:`Withdraw` arrived where another handshake message was expected."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PartyWithdrew(RunAborted):
    """A party of the federation cannot take part (it said why): the session is doomed.

    The reason is the party's own ("party 3 refused its input: ..."), the cause every
    role reports; one that does not start with the party's name gets it in front, so a
    party cannot pass its reason off as another role's."""

    def __init__(self, party: int, reason: str) -> None:
        name = role_name(party)
        super().__init__(name, reason if reason.startswith(f"{name} ")
                         else f"{name} withdrew: {reason}")
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


# -- the server's side of one connection ----------------------------------------------
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
            await tls_handshake(tls, peer)
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


# -- the party's side -------------------------------------------------------------------
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
            await tls_handshake(tls, f"server {host}:{port}")
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
