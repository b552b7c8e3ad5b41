"""The multi-host server: listens, admits exactly parties 1..N, runs the session's protocols.

The server admits parties through a :class:`~fednorm.multihost.lobby.Lobby`, starts the
session when all are in (its methods in turn, several PPF ones on one key setup), writes
their parameters, and can serve further sessions on the same listener.  A session that
fails never takes the server down; everyone in it is told the cause.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import trio

from fednorm.engine.errors import FednormError, InputError, PartyDropped
from fednorm.engine.runtime import SERVER, role_name
from fednorm.engine.tracing import Tracer
from fednorm.multihost.config import Log, ServerConfig, quiet
from fednorm.multihost.files import check_out_dir, params_document, params_path, replace_outputs
from fednorm.multihost.handshake import (
    NET_VERSION,
    PartyWithdrew,
    Refusal,
    Start,
    Welcome,
    admit_connection,
    send_handshake,
)
from fednorm.multihost.lobby import Lobby, SchemaMismatch
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol, options_to_wire
from fednorm.protocols.columns import check_feature_names
from fednorm.protocols.decryptions import require_decryptions_within
from fednorm.session import (
    ProtocolLookup,
    SessionPlan,
    StepContexts,
    check_options_used,
    needs_vabs,
    play_session,
    role_context,
    run_role,
)
from fednorm.transport.tcp import TcpLink
from fednorm.transport.tls import server_context


@dataclass
class SessionOutcome:
    """How one server session ended: a fitted normalizer per method (in the plan's
    order), or the error that stopped it."""

    session: str
    number: int = 1  # 1-based, in the order the server ran its sessions
    normalizers: list[Normalizer] = field(default_factory=list)
    features: tuple[str, ...] = ()
    error: Exception | None = None
    seconds: float = 0.0
    written: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Rejection:
    """A connection the server refused, and why (kept for logs and tests)."""

    session: str
    error: Exception


def check_server_options(protocol: Protocol, options: FitOptions,
                         features: Sequence[str] | None) -> None:
    """What the server can check of its own configuration before anyone connects.

    Without this a server missing V_abs would listen, admit every party and only then
    fail, blaming the first party whose data it could not check.
    """
    if features is not None:
        check_feature_names(features)
    if not needs_vabs(protocol, options):
        return
    if options.vabs is None:
        raise InputError(f"{protocol.name} needs --vabs: a bound on |x| the parties agree "
                         "on, one value for all features or one per feature")
    if features is not None and len(options.vabs) not in (1, len(features)):
        raise InputError(f"--vabs has {len(options.vabs)} bounds for {len(features)} "
                         f"features ({', '.join(features)})")


class Server:
    """Serves sessions of one plan (methods, privacy) on one listener, each with parties 1..N.

    A session that fails (a dropout, a protocol violation, parties missing) is recorded
    in :attr:`outcomes` and the server goes on to the next one; refused connections are
    recorded in :attr:`rejections` and never disturb the session they tried to join,
    unless a party of the federation cannot take part (other columns, data beyond
    V_abs): then the session is abandoned at once and every party is told why.
    """

    def __init__(self, config: ServerConfig, log: Log = quiet,
                 tracer: Tracer | None = None,
                 on_session: Callable[[SessionOutcome], None] = lambda outcome: None,
                 protocols: ProtocolLookup = get_protocol) -> None:
        if config.parties < 1:
            raise InputError(f"--parties must be at least 1, got {config.parties}")
        if config.sessions is not None and config.sessions < 1:
            raise InputError(f"--sessions must be at least 1, got {config.sessions}")
        self.plan = SessionPlan(tuple(config.methods), config.privacy, protocols)
        self.config = config
        self._check_options(config.features)
        check_out_dir(config.out, force=config.force)
        self.context = server_context(config.certs)
        self.wire_options = options_to_wire(config.options)
        self.outcomes: list[SessionOutcome] = []
        self.rejections: list[Rejection] = []
        self.tracer = tracer
        self._on_session = on_session
        self._log = log

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> list[SessionOutcome]:
        """Listen, report the bound (host, port) to ``task_status`` (``await
        nursery.start(server.serve)`` returns it), and serve the configured sessions.

        Returns every session's :class:`SessionOutcome`; a session that fails is recorded
        there with its cause and the server goes on.  Raises :class:`~fednorm.InputError`
        when it cannot listen on the configured address."""
        try:
            listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        except OSError as exc:
            raise InputError(f"cannot listen on {self.config.host}:{self.config.port}: "
                             f"{exc}") from None
        try:
            host, port = listeners[0].socket.getsockname()[:2]
            self._log(f"listening on {host}:{port} for parties 1..{self.config.parties} "
                      f"({self.plan.name})")
            task_status.started((host, port))
            while self.config.sessions is None or len(self.outcomes) < self.config.sessions:
                self.outcomes.append(await self.run_session(listeners))
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
        return self.outcomes

    def session_dir(self, number: int) -> Path | None:
        """Where session ``number`` (1-based) writes: --out itself for a single session,
        else its own ``session-<number>`` directory, so no session replaces another's."""
        if self.config.out is None or self.config.sessions == 1:
            return self.config.out
        return self.config.out / f"session-{number}"

    async def run_session(self, listeners: Sequence[trio.SocketListener]) -> SessionOutcome:
        """Admit the parties, run the protocol, write the result; never raise a FednormError."""
        lobby = Lobby(self._welcome(secrets.token_hex(8)), self.plan.name,
                      self.config.features)
        outcome = SessionOutcome(lobby.session, number=len(self.outcomes) + 1)
        try:
            await self._gather(listeners, lobby)
            started = trio.current_time()
            outcome.normalizers = await self._run_session(lobby)
            outcome.seconds = trio.current_time() - started
            outcome.features = lobby.features or ()
            outcome.written = self._write(outcome)
        except Exception as exc:  # a failed session must not stop the server
            outcome.error = exc
        finally:
            with trio.CancelScope(shield=True):
                await close_links(lobby.links.values(), drain=outcome.error is not None,
                                  patience=self.config.timeouts.protocol)
        self._report(outcome)
        self._on_session(outcome)
        return outcome

    def _welcome(self, session: str) -> Welcome:
        return Welcome(NET_VERSION, session, self.plan.methods, self.plan.privacy,
                       self.config.parties, self.wire_options)

    async def _gather(self, listeners: Sequence[trio.SocketListener], lobby: Lobby) -> None:
        """Accept connections until all N parties are in and agree on the columns, or the
        session is doomed; the clock starts with the first party.  Whatever ends the
        session here, every waiting party is told the cause the server records."""
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, lobby, nursery)
            await lobby.first_joined.wait()
            with trio.move_on_after(self.config.timeouts.join):
                await lobby.settled.wait()
                if lobby.failure is not None:  # tell who waits now, the rest as they come
                    await _refuse_all(lobby, f"session abandoned: {lobby.failure}")
                    await lobby.all_told.wait()
            nursery.cancel_scope.cancel()
        try:
            if lobby.failure is not None:
                raise lobby.failure
            missing = lobby.missing()
            if missing:
                raise PartyDropped(", ".join(map(role_name, missing)),
                                   f"did not join within {self.config.timeouts.join:g} s")
            self._check_options(lobby.agree())
        except FednormError as error:
            await _refuse_all(lobby, f"session abandoned: {error}")
            raise

    async def _accept(self, listener: trio.SocketListener, lobby: Lobby,
                      nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. out of file descriptors: wait, do not die
                self._log(f"accept failed: {exc}")
                await trio.sleep(0.1)
                continue
            nursery.start_soon(self._admit, stream, lobby)

    async def _admit(self, stream: trio.SocketStream, lobby: Lobby) -> None:
        try:
            party, link = await admit_connection(
                stream, self.context, lobby, timeout=self.config.timeouts.handshake,
                max_frame=self.config.max_frame,
            )
        except (SchemaMismatch, PartyWithdrew) as exc:  # a party that cannot take part
            self.rejections.append(Rejection(lobby.session, exc))
            self._log(f"refused a party: {exc}")
            lobby.abandon(exc, exc.party)
            return
        except Exception as exc:  # an untrusted client must never take the session down
            self.rejections.append(Rejection(lobby.session, exc))
            self._log(f"refused a connection: {type(exc).__name__}: {exc}")
            return
        lobby.admit(party, link)
        self._log(f"party {party} joined session {lobby.session} "
                  f"({len(lobby.links)}/{self.config.parties})")
        await self._watch(party, link, lobby)

    async def _watch(self, party: int, link: TcpLink, lobby: Lobby) -> None:
        """Before the start an admitted party says nothing; EOF or any frame frees its slot.

        This is what lets a party that crashed or was interrupted while waiting rejoin,
        instead of being refused as a duplicate of its own ghost.
        """
        try:
            await link.receive()
            reason = "it spoke before the start"
        except FednormError as exc:
            reason = str(exc)
        lobby.release(party)
        await link.aclose()
        self._log(f"party {party} left session {lobby.session} before the start: {reason}")

    def _check_options(self, features: Sequence[str] | None) -> None:
        check_options_used(self.plan.protocols, self.config.options)
        for protocol in self.plan.protocols:
            check_server_options(protocol, self.config.options, features)
        if features is not None:
            require_decryptions_within(self.plan.protocols, self.config.options,
                                       len(features), self.config.parties)

    async def _run_session(self, lobby: Lobby) -> list[Normalizer]:
        contexts = StepContexts(SERVER, lobby.links, lobby.session,
                                self.config.timeouts.protocol, self.tracer)

        async def start() -> None:
            for link in lobby.links.values():
                await send_handshake(link, Start(lobby.session))

        # A failed start tells the parties why as the first step would.
        await run_role(role_context(SERVER, lobby.links, lobby.session, self.plan.steps[0],
                                    timeout=None, tracer=self.tracer), start())
        return await play_session(contexts, self.plan, self.config.options,
                                  features=lobby.features)

    def _write(self, outcome: SessionOutcome) -> list[Path]:
        out = self.session_dir(outcome.number)
        if out is None or not outcome.normalizers:
            return []
        return replace_outputs(out, {
            params_path(out, self.plan, protocol): params_document(
                protocol, self.config.parties, outcome.session, outcome.features, normalizer)
            for protocol, normalizer in zip(self.plan.protocols, outcome.normalizers,
                                            strict=True)})

    def _report(self, outcome: SessionOutcome) -> None:
        if outcome.error is None:
            wrote = f"; wrote {', '.join(map(str, outcome.written))}" if outcome.written else ""
            self._log(f"session {outcome.session}: {self.plan.name} with "
                      f"{self.config.parties} parties done in {outcome.seconds:.3f} s{wrote}")
        else:
            self._log(f"session {outcome.session} failed: {type(outcome.error).__name__}: "
                      f"{outcome.error}")


async def close_links(links: Iterable[TcpLink], *, drain: bool,
                      patience: float) -> None:
    """Close every link; after a failure, first let each peer read the cause.

    Closing a socket with frames still unread (those of the parties the server had
    not come to yet), or one a party is still sending to, makes the kernel send a
    reset, and a reset can discard the Abort waiting in the party's receive buffer:
    it would report "connection reset" (or a broken pipe) instead of the cause.  So the
    server reads and drops what each party sends until the party closes, which it does
    once it reads the Abort: a party still computing its answer sends it first, so the
    wait lasts up to ``patience`` (the protocol timeout), then the link is closed.
    """
    async def close(link: TcpLink) -> None:
        if drain:
            with trio.move_on_after(patience), suppress(FednormError):
                while True:
                    await link.receive()
        await link.aclose()

    async with trio.open_nursery() as nursery:
        for link in links:
            nursery.start_soon(close, link)


async def _refuse_all(lobby: Lobby, reason: str) -> None:
    """Tell the parties waiting for a start, and not told yet, that there will be none."""
    with trio.CancelScope(shield=True):
        for party, link in list(lobby.links.items()):
            if party not in lobby.told:
                lobby.tell(party)
                with trio.move_on_after(0.5), suppress(FednormError):
                    await send_handshake(link, Refusal(reason))


