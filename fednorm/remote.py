"""One role of a multi-host federation over TCP + mutual TLS: the server, or one party.

The server listens, admits exactly parties 1..N (see :class:`~fednorm.transport.tcp.Lobby`),
starts the protocol when all are in, and can serve further sessions on the same
listener.  A party validates its data, connects, learns the protocol and options from
the server's welcome, runs its role, and only then writes its outputs.

Failure is all-or-nothing, because the run is N-out-of-N: a role that fails sends an
Abort carrying the cause to its peers (:func:`run_role`), so everyone stops promptly and
names the same culprit, and nobody writes a partial result.
"""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np
import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError
from fednorm.engine.runtime import SERVER, RoleContext, role_name
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol, check_party_data
from fednorm.sim.datasets import load_dataset
from fednorm.transport.tcp import (
    DEFAULT_MAX_FRAME,
    NET_VERSION,
    Hello,
    Lobby,
    Refusal,
    Start,
    TcpLink,
    Welcome,
    admit_connection,
    connect_party,
    send_handshake,
    wait_start,
)
from fednorm.transport.tls import party_context, server_context

T = TypeVar("T")
Log = Callable[[str], None]
NORMALIZED_CSV = "normalized.csv"
PARAMS_JSON = "params.json"


def _quiet(message: str) -> None:
    """The default log: library callers get results and errors, not chatter."""


@dataclass(frozen=True)
class Timeouts:
    """Per-phase limits in seconds.

    ``join``: the server waits this long for the rest of the parties once the first
    is in; a party keeps trying to connect, then waits for the start, this long.
    ``handshake``: TLS plus hello/welcome of one connection.  ``protocol``: each
    protocol message (the receive timeout of the role).
    """

    join: float = 120.0
    handshake: float = 10.0
    protocol: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise InputError(f"the {f.name} timeout must be positive")


@dataclass(frozen=True)
class ServerConfig:
    """What ``fednorm serve`` runs: where, for whom, which protocol, how many sessions."""

    host: str
    port: int
    parties: int
    method: str
    certs: Path
    privacy: str = "plain"
    options: FitOptions = field(default_factory=FitOptions)
    timeouts: Timeouts = field(default_factory=Timeouts)
    sessions: int | None = 1  # None: serve until cancelled
    out: Path | None = None
    max_frame: int = DEFAULT_MAX_FRAME


@dataclass(frozen=True)
class PartyConfig:
    """What ``fednorm party`` runs: which server, as whom."""

    host: str
    port: int
    party: int
    certs: Path
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_frame: int = DEFAULT_MAX_FRAME


@dataclass
class SessionOutcome:
    """How one server session ended: a fitted normalizer, or the error that stopped it."""

    session: str
    normalizer: Normalizer | None = None
    features: tuple[str, ...] = ()
    error: Exception | None = None
    seconds: float = 0.0
    written: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Rejection:
    """A connection the server refused, and why (kept for logs and tests)."""

    session: str
    error: Exception


@dataclass(frozen=True)
class PartyRun:
    """A party's successful run: what the server told it, and its fitted normalizer."""

    welcome: Welcome
    protocol: Protocol
    normalizer: Normalizer


# -- roles ------------------------------------------------------------------------------
async def run_role(ctx: RoleContext, role: Awaitable[T]) -> T:
    """Await a protocol role; if it fails, tell every peer why before the error propagates.

    Peers would notice a closed link anyway, but only an Abort carries the cause
    ("party 2 dropped: ...") to them, and it stops them before their own timeouts.
    """
    try:
        return await role
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await ctx.send_abort(abort_reason(ctx.me, exc))
        raise


def abort_reason(me: int, exc: BaseException) -> str:
    if isinstance(exc, FednormError):
        return str(exc)
    if isinstance(exc, trio.Cancelled | KeyboardInterrupt):
        return f"{role_name(me)} was interrupted"
    return f"{role_name(me)} failed: {type(exc).__name__}: {exc}"


def options_to_wire(options: FitOptions) -> dict[str, Any]:
    """The server's options as a welcome carries them; unsendable options are bad input."""
    wire = {f.name: getattr(options, f.name) for f in fields(FitOptions)}
    try:
        msgpack.packb(wire, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"fit options cannot be sent to the parties: {exc}") from None
    return wire


def options_from_wire(wire: Mapping[str, Any]) -> FitOptions:
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in wire.items()}
    try:
        return FitOptions(**values)
    except (TypeError, InputError) as exc:
        raise ProtocolError(f"the server sent unusable options: {exc}") from None


# -- server -----------------------------------------------------------------------------
class Server:
    """Serves sessions of one protocol on one listener, each with parties 1..N.

    A session that fails (a dropout, a protocol violation, parties missing) is recorded
    in :attr:`outcomes` and the server goes on to the next one; refused connections are
    recorded in :attr:`rejections` and never disturb the session they tried to join.
    """

    def __init__(self, config: ServerConfig, log: Log = _quiet) -> None:
        if config.parties < 1:
            raise InputError(f"--parties must be at least 1, got {config.parties}")
        if config.sessions is not None and config.sessions < 1:
            raise InputError(f"--sessions must be at least 1, got {config.sessions}")
        check_out_dir(config.out)
        self.config = config
        self.protocol = get_protocol(config.method, config.privacy)
        self.context = server_context(config.certs)
        self.wire_options = options_to_wire(config.options)
        self.outcomes: list[SessionOutcome] = []
        self.rejections: list[Rejection] = []
        self._log = log

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> list[SessionOutcome]:
        """Listen, report the bound (host, port), and serve the configured sessions."""
        try:
            listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        except OSError as exc:
            raise InputError(f"cannot listen on {self.config.host}:{self.config.port}: "
                             f"{exc}") from None
        try:
            host, port = listeners[0].socket.getsockname()[:2]
            self._log(f"listening on {host}:{port} for parties 1..{self.config.parties} "
                      f"({self.protocol.name})")
            task_status.started((host, port))
            while self.config.sessions is None or len(self.outcomes) < self.config.sessions:
                self.outcomes.append(await self.run_session(listeners))
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
        return self.outcomes

    async def run_session(self, listeners: Sequence[trio.SocketListener]) -> SessionOutcome:
        """Admit the parties, run the protocol, write the result; never raise a FednormError."""
        lobby = Lobby(self._welcome(secrets.token_hex(8)), self.protocol.name)
        outcome = SessionOutcome(lobby.session)
        try:
            await self._gather(listeners, lobby)
            started = trio.current_time()
            outcome.normalizer = await self._run_protocol(lobby)
            outcome.seconds = trio.current_time() - started
            outcome.features = lobby.features or ()
            outcome.written = self._write(outcome)
        except Exception as exc:  # a failed session must not stop the server
            outcome.error = exc
        finally:
            with trio.CancelScope(shield=True):
                for link in lobby.links.values():
                    await link.aclose()
        self._report(outcome)
        return outcome

    def _welcome(self, session: str) -> Welcome:
        return Welcome(NET_VERSION, session, self.protocol.method, self.protocol.privacy,
                       self.config.parties, self.wire_options)

    async def _gather(self, listeners: Sequence[trio.SocketListener], lobby: Lobby) -> None:
        """Accept connections until all N parties are in; the clock starts with the first."""
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, lobby, nursery)
            await lobby.first_joined.wait()
            with trio.move_on_after(self.config.timeouts.join):
                await lobby.full.wait()
            nursery.cancel_scope.cancel()
        missing = lobby.missing()
        if missing:
            error = PartyDropped(", ".join(map(role_name, missing)),
                                 f"did not join within {self.config.timeouts.join:g} s")
            await _refuse_all(lobby, f"session abandoned: {error}")
            raise error

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

    async def _run_protocol(self, lobby: Lobby) -> Normalizer:
        ctx = RoleContext(SERVER, lobby.links, lobby.session, protocol=self.protocol.name,
                          timeout=self.config.timeouts.protocol)

        async def start_and_serve() -> Normalizer:
            for link in lobby.links.values():
                await send_handshake(link, Start(lobby.session))
            return await self.protocol.server(ctx, self.config.options)

        return await run_role(ctx, start_and_serve())

    def _write(self, outcome: SessionOutcome) -> list[Path]:
        if self.config.out is None or outcome.normalizer is None:
            return []
        document = params_document(self.protocol, self.config.parties, outcome.session,
                                   outcome.features, outcome.normalizer)
        return write_atomically({self.config.out / PARAMS_JSON: document})

    def _report(self, outcome: SessionOutcome) -> None:
        if outcome.error is None:
            wrote = f"; wrote {', '.join(map(str, outcome.written))}" if outcome.written else ""
            self._log(f"session {outcome.session}: {self.protocol.name} with "
                      f"{self.config.parties} parties done in {outcome.seconds:.3f} s{wrote}")
        else:
            self._log(f"session {outcome.session} failed: {type(outcome.error).__name__}: "
                      f"{outcome.error}")


async def _refuse_all(lobby: Lobby, reason: str) -> None:
    """Tell the parties waiting for a start that there will be none."""
    with trio.CancelScope(shield=True):
        for link in lobby.links.values():
            with trio.move_on_after(0.5), suppress(FednormError):
                await send_handshake(link, Refusal(reason))


# -- party ------------------------------------------------------------------------------
class Party:
    """One party: connect, be admitted, run the role the server chose."""

    def __init__(self, config: PartyConfig, log: Log = _quiet) -> None:
        if config.party < 1:
            raise InputError(f"party ids are 1..N, got {config.party}")
        self.config = config
        self.context = party_context(config.certs, config.party)
        self._log = log

    async def run(self, X: np.ndarray, features: Sequence[str]) -> PartyRun:
        X = check_party_data(X)
        config, timeouts = self.config, self.config.timeouts
        hello = Hello(NET_VERSION, WIRE_VERSION, config.party, tuple(features))
        link, welcome = await connect_party(
            config.host, config.port, self.context, hello, connect_timeout=timeouts.join,
            handshake_timeout=timeouts.handshake, max_frame=config.max_frame,
        )
        try:
            protocol, options = _agreed_protocol(welcome)
            self._log(f"admitted to session {welcome.session} ({protocol.name}, "
                      f"{welcome.parties} parties); waiting for the start")
            await wait_start(link, welcome.session, timeouts.join + timeouts.handshake)
            ctx = RoleContext(config.party, {SERVER: link}, welcome.session,
                              protocol=protocol.name, timeout=timeouts.protocol)
            normalizer = await run_role(ctx, protocol.party(ctx, X, options))
        finally:
            await link.aclose()
        return PartyRun(welcome, protocol, normalizer)


def _agreed_protocol(welcome: Welcome) -> tuple[Protocol, FitOptions]:
    try:
        protocol = get_protocol(welcome.method, welcome.privacy)
    except InputError as exc:
        raise ProtocolError(f"the server runs a protocol this party lacks: {exc}") from None
    return protocol, options_from_wire(welcome.options)


# -- party data and outputs -------------------------------------------------------------
@dataclass(frozen=True)
class PartyData:
    """A party's CSV: the features it brings, and its rows to write back normalized.

    ``positions`` maps CSV column positions to feature indices; every other column
    (the target, unnamed empty ones) is written back untouched.
    """

    path: Path
    features: list[str]
    X: np.ndarray
    header: list[str]
    rows: list[list[str]]
    positions: dict[int, int]


def load_party_data(path: Path | str, target: str | None = None) -> PartyData:
    """Load and validate a party's CSV before anything is sent; problems are InputErrors."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--data {path} is not a file")
    try:
        dataset = load_dataset(path, target)
        with path.open(newline="", encoding="utf-8-sig") as stream:
            table = [row for row in csv.reader(stream) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    X = check_party_data(dataset.X)
    header, rows = table[0], table[1:]
    names = [name.strip() for name in header]
    positions = {names.index(name): j for j, name in enumerate(dataset.feature_names)}
    if len(rows) != len(X):  # the loader and this reader disagree on what a row is
        raise InputError(f"cannot map the rows of {path} back to its data")
    return PartyData(path, list(dataset.feature_names), X, header, rows, positions)


def check_out_dir(out: Path | None) -> None:
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")


def _cell(value: float) -> str:
    """Shortest round-tripping text of a value; missing stays an empty cell."""
    return repr(float(value)) if np.isfinite(value) else ""


def normalized_csv(data: PartyData, normalizer: Normalizer) -> bytes:
    """The party's CSV with its features normalized, every other column as it was."""
    Z = normalizer.transform(data.X)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(data.header)
    for r, row in enumerate(data.rows):
        cells = list(row)
        for column, j in data.positions.items():
            cells[column] = _cell(Z[r, j])
        writer.writerow(cells)
    return text.getvalue().encode("utf-8")


def json_params(params: Mapping[str, Sequence[float]]) -> dict[str, list[float | None]]:
    """Parameters as in ``simulate --json``: NaN (a feature without values) is null."""
    return {k: [float(v) if np.isfinite(v) else None for v in vs] for k, vs in params.items()}


def params_document(protocol: Protocol, parties: int, session: str,
                    features: Sequence[str], normalizer: Normalizer) -> bytes:
    document = {
        "method": protocol.method,
        "privacy": protocol.privacy,
        "parties": parties,
        "session": session,
        "features": list(features),
        "params": json_params(normalizer.params()),
    }
    return (json.dumps(document, indent=2, allow_nan=False) + "\n").encode("utf-8")


def party_outputs(out: Path, data: PartyData, run: PartyRun) -> dict[Path, bytes]:
    return {
        out / NORMALIZED_CSV: normalized_csv(data, run.normalizer),
        out / PARAMS_JSON: params_document(run.protocol, run.welcome.parties,
                                           run.welcome.session, data.features, run.normalizer),
    }


def write_atomically(files: Mapping[Path, bytes]) -> list[Path]:
    """Write every file or none: all go to temporary files first, then are renamed.

    Temporary files live in the target directory, so ``os.replace`` is an atomic
    rename; they are created 0600, which suits a party's normalized data.
    """
    temporaries: dict[Path, str] = {}
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporaries[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as stream:
                stream.write(content)
                stream.flush()
                os.fsync(stream.fileno())
        for path, temporary in temporaries.items():
            os.replace(temporary, path)
    except OSError as exc:
        raise FednormError(f"cannot write outputs: {exc}") from None
    finally:
        for temporary in temporaries.values():
            with suppress(FileNotFoundError):
                os.unlink(temporary)
    return list(files)
