"""The role runner: what a protocol role can do, and nothing more.

A protocol role is an ``async`` function that only talks through a :class:`RoleContext`:
``send`` / ``receive`` to one peer, ``broadcast`` / ``gather`` across all parties.  The
context stamps and checks every frame (session, sub-protocol, per-link round, sender,
kind), enforces receive timeouts, counts bytes, and runs heavy crypto in worker threads.
Roles never see sockets, and transports never see messages: a :class:`Link` moves bytes.
Whoever watches a role (progress, benchmarks, tests) gives its context a tracer
(:mod:`fednorm.engine.tracing`) instead of wrapping links or functions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine import inprocess
from fednorm.engine.codec import (
    Header,
    Received,
    body_digest,
    decode_received,
    encode_body,
    encode_frame,
)
from fednorm.engine.errors import ProtocolError, ProtocolTimeout, RunAborted, root_cause
from fednorm.engine.messages import Abort, Message
from fednorm.engine.signing import Keyring
from fednorm.engine.tracing import CryptoEvent, Direction, FrameEvent, PhaseEvent, Tracers
from fednorm.engine.traffic import TrafficStats
from fednorm.engine.transcript import Transcript

if TYPE_CHECKING:  # the crypto layer is loaded by the roles that use it, not here
    from fednorm.engine.ckks.keys import HeldKeys

SERVER = 0
_INLINE_DECODE_BYTES = 1 << 16
M = TypeVar("M", bound=Message)
T = TypeVar("T")


def role_name(role: int) -> str:
    """Human name of a role id: the server is 0, parties are 1..P."""
    return "server" if role == SERVER else f"party {role}"


class Link(Protocol):
    """A reliable, ordered, authenticated byte pipe to one peer.

    ``receive`` raises :class:`PartyDropped` when the peer is gone.  Who the peer is comes
    from the transport (a channel, a TLS certificate), which is why a frame whose header
    names another sender is rejected.  A link whose frames move in a host framework's
    rounds (a Flower message a round) says so: ``moves_in_rounds``.
    """

    async def send(self, frame: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def aclose(self) -> None: ...


@dataclass
class _GatheredRound:
    """What one :meth:`RoleContext.gather` read: each party's frame (kept for a tracer
    that wants frames), its parse or its error, and the error that stopped the reading."""

    frames: dict[int, bytes] = field(default_factory=dict)
    parsed: dict[int, Received | Exception] = field(default_factory=dict)
    unread: Exception | None = None

    def outcome(self, party: int) -> Received:
        """``party``'s parsed frame, or its error, else the one that stopped the reading."""
        outcome = self.parsed.get(party, self.unread)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is None:  # not read: reading stops only at a failure, raised above
            raise ProtocolError(f"no reply from {role_name(party)}")
        return outcome


class RoleContext:
    """Identity, links and bookkeeping of one role in one session."""

    def __init__(
        self,
        me: int,
        links: Mapping[int, Link],
        session: str,
        *,
        protocol: str,
        timeout: float | None = 60.0,
        held_keys: HeldKeys | None = None,
        worker_limiter: trio.CapacityLimiter | None = None,
        tracer: object | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.me = me
        self.session = session
        self.timeout = timeout
        self.held_keys = held_keys  # the joint keys an earlier step left (PPF), else None
        self.keyring = keyring  # a party's signing key and its peers' verification keys
        self.stats = TrafficStats()
        self._links = dict(links)
        self._protocols = [protocol]
        self._send_round = dict.fromkeys(self._links, 0)
        self._receive_round = dict.fromkeys(self._links, 0)
        self._limiter = worker_limiter
        self._tracers = Tracers.of(tracer)
        self._transcript = Transcript()

    # -- identity ---------------------------------------------------------------
    @property
    def is_server(self) -> bool:
        return self.me == SERVER

    @property
    def parties(self) -> list[int]:
        """The party ids this role talks to (for a party: none but the server)."""
        return sorted(peer for peer in self._links if peer != SERVER)

    @property
    def protocol(self) -> str:
        return self._protocols[-1]

    @contextmanager
    def subprotocol(self, name: str, planned_rounds: int | None = None) -> Iterator[None]:
        """Frames in this block belong to sub-protocol ``name`` (``robust/kth``), a tracer phase."""
        self._protocols.append(f"{self.protocol}/{name}")
        try:
            with self._traced_phase(name, True, planned_rounds):
                yield
        finally:
            self._protocols.pop()

    @contextmanager
    def phase(self, name: str, planned_rounds: int | None = None) -> Iterator[None]:
        """Tell tracers that this block is step ``name`` of the protocol (e.g. the
        encrypted inverse); the frames inside keep their protocol id."""
        with self._traced_phase(name, False, planned_rounds):
            yield

    @contextmanager
    def _traced_phase(self, name: str, subprotocol: bool,
                      planned_rounds: int | None) -> Iterator[None]:
        if not (self._tracers.wants("phase_started") or self._tracers.wants("phase_ended")):
            yield
            return
        event = PhaseEvent(role_name(self.me), self.protocol, name, subprotocol,
                           planned_rounds=planned_rounds)
        self._tracers.emit("phase_started", event)
        started = time.perf_counter()
        try:
            yield
        finally:
            self._tracers.emit("phase_ended", PhaseEvent(
                event.role, event.protocol, name, subprotocol, time.perf_counter() - started,
                planned_rounds))

    # -- messaging --------------------------------------------------------------
    def _link(self, peer: int) -> Link:
        try:
            return self._links[peer]
        except KeyError:
            raise ValueError(f"{role_name(self.me)} has no link to {role_name(peer)}") from None

    async def send(self, peer: int, msg: Message, body: bytes | memoryview | None = None,
                   frames: dict[int, bytes] | None = None) -> None:
        """Send one message to ``peer`` (``body``: its pre-encoded body, for broadcasts;
        ``frames``: the broadcast's frames so far, by send round)."""
        link = self._link(peer)
        header = Header(self.protocol, self.session, self._send_round[peer], self.me, msg.KIND)
        if body is None:
            body = await self.run_sync(encode_body, msg)
        frame = frames.get(header.round) if frames is not None else None
        if frame is None:
            frame = encode_frame(header, msg, body)
            if frames is not None:
                frames[header.round] = frame
        self._send_round[peer] += 1
        self.stats.count_sent(msg.KIND, len(frame))
        await link.send(frame)
        self._trace_frame("sent", peer, header, msg, frame)

    async def receive(self, peer: int, expected: type[M] | tuple[type[Message], ...]) -> M:
        """Receive the next message from ``peer``; it must be of (one of) ``expected``."""
        kinds = expected if isinstance(expected, tuple) else (expected,)
        return await self.receive_any(peer, dict.fromkeys(kinds, self.protocol))  # type: ignore[return-value]

    async def receive_any(self, peer: int, accepted: Mapping[type[Message], str]) -> Message:
        """Receive the next message from ``peer``: one of ``accepted``'s kinds, each only
        within its own (sub-)protocol id.

        For a role that cannot know which comes next, e.g. a party that answers any
        number of bootstrap requests (sub-protocol ``…/bootstrap``) before the result.
        """
        frame = await self._next_frame(peer, accepted)
        return self._accept(peer, frame, await self._parse(frame), accepted)

    async def _next_frame(self, peer: int, accepted: Mapping[type[Message], str]) -> bytes:
        """The next frame on ``peer``'s link, unparsed, within the receive timeout."""
        link = self._link(peer)
        try:
            with trio.fail_after(self.timeout if self.timeout is not None else float("inf")):
                frame = await link.receive()
        except trio.TooSlowError:
            waiting_for = "|".join(k.KIND for k in accepted)
            raise ProtocolTimeout(role_name(peer), self.timeout or 0.0, waiting_for) from None
        self.stats.count_received(len(frame))
        return frame

    async def _parse(self, frame: bytes) -> Received:
        # Parses and a party's digests of bodies take ms: off the event loop (codec docs).
        transcribed = None if self.is_server else self._transcript.takes
        if len(frame) < _INLINE_DECODE_BYTES:
            return decode_received(frame, transcribed=transcribed)
        shared = inprocess.shared_parse(frame) if transcribed else None
        return shared or await self.run_sync(decode_received, frame, self.is_server,
                                             transcribed)

    def _accept(self, peer: int, frame: bytes, parsed: Received,
                accepted: Mapping[type[Message], str]) -> Message:
        """Check a parsed frame against ``peer``'s conversation; count it received."""
        header, msg, digest = parsed
        self._trace_frame("received", peer, header, msg, frame)
        self._check_header(peer, header, accepted, msg)
        self._receive_round[peer] += 1
        if peer == SERVER and self._transcript.takes(header):  # digest: b"" if not taken
            self._transcript.add(header, digest or body_digest(frame))
        return msg

    # -- what the server told this party ------------------------------------------
    def transcript(self) -> bytes:
        """A party: the digest of what the server told it in this step
        (:class:`~fednorm.engine.transcript.Transcript`)."""
        return self._transcript.digest()

    def leave_out_of_transcript(self, *scopes: str) -> None:
        """Messages of these scopes (last part of their protocol id) differ between
        parties by design, or are checked otherwise: not in :meth:`transcript`."""
        self._transcript.leave_out(*scopes)

    def moves_in_rounds(self, peer: int) -> bool:
        """Whether frames to ``peer`` move in a host framework's rounds (:class:`Link`):
        there, a role that sends all it can before it waits saves whole rounds."""
        return bool(getattr(self._link(peer), "moves_in_rounds", False))

    def _trace_frame(self, direction: Direction, peer: int, header: Header, msg: Message,
                     frame: bytes) -> None:
        if self._tracers.wants("frame"):
            self._tracers.emit("frame", FrameEvent(
                direction, role_name(peer), len(frame), header.protocol, header.kind,
                header.round, role_name(self.me), frame, msg))

    def _check_header(
        self, peer: int, header: Header, accepted: Mapping[type[Message], str], msg: Message
    ) -> None:
        who = role_name(peer)
        if header.session != self.session:
            raise ProtocolError(f"frame from {who} belongs to session {header.session!r}")
        if header.sender != peer:
            raise ProtocolError(f"frame on {who}'s link claims sender {header.sender}")
        if isinstance(msg, Abort):
            raise RunAborted(who, msg.reason)
        if header.round != self._receive_round[peer]:
            raise ProtocolError(f"frame from {who} has round {header.round}, expected "
                                f"{self._receive_round[peer]} (out of order or replayed)")
        protocol = accepted.get(type(msg))
        if protocol is None:
            wanted = " or ".join(repr(cls.KIND) for cls in accepted)
            raise ProtocolError(f"expected {wanted} from {who}, got {header.kind!r}")
        if header.protocol != protocol:
            raise ProtocolError(
                f"frame from {who} is for protocol {header.protocol!r}, expected {protocol!r}"
            )

    @asynccontextmanager
    async def sending(self, peer: int, msg: Message) -> AsyncIterator[None]:
        """``msg`` sent to ``peer`` while the block runs (reading what ``peer`` sends
        meanwhile): over TCP two roles that only send large frames to each other would
        both block.  A failure of the block or of the send is raised as itself."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.send, peer, msg)
                yield
        except BaseExceptionGroup as group:
            if (cause := root_cause(group)) is group:
                raise
            raise cause from None

    async def broadcast(self, msg: Message) -> None:
        """Server: send the same message to every party (its body encoded once)."""
        await self.forward(msg, self.parties)

    async def forward(self, msg: Message, peers: list[int]) -> None:
        """Send the same message to each of ``peers``, encoding its body once.

        Peers at the same round of this role's conversation with them get one and the
        same frame object (its bytes are identical): in one process, a broadcast to P
        parties waits in their links as one copy instead of P.
        """
        body = await self.run_sync(encode_body, msg)
        frames: dict[int, bytes] = {}
        for peer in peers:
            await self.send(peer, msg, body, frames)

    async def gather(self, expected: type[M]) -> dict[int, M]:
        """Server: one message of type ``expected`` from every party (a protocol round).

        Frames are read in party order; each is parsed (in a worker thread) and its header
        checked as soon as it is read, while the next is awaited, so the parses overlap
        one another and the parties' work instead of alternating with the reads. The
        replies are then accepted in party order, so the failure of the lowest party (a
        malformed frame, an abort, a timeout) is the one that surfaces, on its own; a
        failed parse or header stops the reading at once. On a failure, frames read from
        later parties are counted received but neither traced nor accepted: the role
        fails anyway. A frame is kept past its parse only for a tracer that wants frames.
        """
        self.stats.rounds += 1
        accepted: dict[type[Message], str] = {expected: self.protocol}
        gathered = await self._read_round(accepted)
        replies: dict[int, M] = {}
        for party in self.parties:
            outcome = gathered.outcome(party)  # raises first: a failed party has no frame
            replies[party] = self._accept(party, gathered.frames[party], outcome,
                                          accepted)  # type: ignore[assignment]
        return replies

    async def _read_round(self, accepted: dict[type[Message], str]) -> _GatheredRound:
        """Every party's next frame, read in party order, each parsed and checked in the
        background as soon as it is read; the first failure stops the reading."""
        gathered = _GatheredRound()
        keep_frames = self._tracers.wants("frame")
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as reading:
                for party in self.parties:
                    try:
                        frame = await self._next_frame(party, accepted)
                    except Exception as exc:  # earlier parties are checked first
                        gathered.unread = exc
                        break
                    gathered.frames[party] = frame if keep_frames else b""
                    nursery.start_soon(self._parse_checked, party, frame, accepted,
                                       gathered, reading)
                    del frame
        return gathered

    async def _parse_checked(self, party: int, frame: bytes,
                             accepted: dict[type[Message], str], gathered: _GatheredRound,
                             reading: trio.CancelScope) -> None:
        """Parse ``frame`` in a worker thread and check its header; a failure is kept as
        the party's outcome (raised later, in party order) and stops the reading."""
        try:
            parsed = gathered.parsed[party] = await self._parse(frame)
            self._check_header(party, parsed.header, accepted, parsed.message)
        except Exception as exc:
            gathered.parsed.setdefault(party, exc)  # a bad header: again in _accept
            reading.cancel()

    async def send_abort(self, reason: str) -> None:
        """Best effort: tell every peer this role is failing, so they stop promptly."""
        for peer, link in self._links.items():
            header = Header(self.protocol, self.session, self._send_round[peer], self.me,
                            Abort.KIND)
            with trio.move_on_after(1.0):
                with suppress(Exception):
                    await link.send(encode_frame(header, Abort(reason=reason)))

    # -- heavy work -------------------------------------------------------------
    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a heavy (GIL-releasing) call in a worker thread, off the event loop;
        tracers learn its name and how long it ran (not how long it queued).

        A cancelled role (an interrupt, a peer's abort) does not wait for the call: its
        thread is abandoned, its result dropped, so the role can tell its peers at once."""
        if not self._tracers.wants("crypto_call"):
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter,
                                                 abandon_on_cancel=True)

        def timed() -> tuple[T, float]:
            started = time.perf_counter()
            return fn(*args), time.perf_counter() - started

        out, seconds = await trio.to_thread.run_sync(timed, limiter=self._limiter,
                                                     abandon_on_cancel=True)
        self._tracers.emit("crypto_call", CryptoEvent(
            role_name(self.me), self.protocol, call_name(fn), seconds, out))
        return out


def call_name(fn: Callable[..., Any]) -> str:
    """A readable name of a callable: ``CkksContext.encrypt``, ``encode_body``."""
    inner = getattr(fn, "func", fn)  # functools.partial
    return getattr(inner, "__qualname__", None) or type(inner).__name__
