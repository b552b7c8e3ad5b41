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
import math
import os
import re
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np
import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError
from fednorm.engine.runtime import SERVER, Link, RoleContext, role_name
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol, check_party_data
from fednorm.sim.datasets import Dataset, load_dataset
from fednorm.sim.federation import (
    VABS_METHODS,
    check_fit_options,
    check_no_overflow,
    check_real,
    check_within_vabs,
)
from fednorm.transport.tcp import (
    DEFAULT_MAX_FRAME,
    NET_VERSION,
    Hello,
    Lobby,
    PartyWithdrew,
    Ready,
    Refusal,
    SchemaMismatch,
    Start,
    TcpLink,
    Welcome,
    Withdraw,
    admit_connection,
    connect_party,
    send_handshake,
    wait_start,
)
from fednorm.transport.tls import party_context, server_context
from fednorm.transport.trace import TracedLink, Tracer

T = TypeVar("T")
_DRAIN_SECONDS = 2.0  # how long a failing server lets each party read the cause
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
    features: tuple[str, ...] | None = None  # the federation's columns; None: the majority's
    force: bool = False  # replace files in a non-empty --out


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
    number: int = 1  # 1-based, in the order the server ran its sessions
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
        reason = abort_reason(ctx.me, exc)
        with trio.CancelScope(shield=True):
            await ctx.send_abort(reason)
        if isinstance(exc, InputError) and reason != str(exc):
            # Only the category went out: this console gets it and the detail.
            raise InputError(f"{reason}: {exc}") from exc
        raise


def check_server_options(protocol: Protocol, options: FitOptions,
                         features: Sequence[str] | None) -> None:
    """What the server can check of its own configuration before anyone connects.

    Without this a server missing V_abs would listen, admit every party and only then
    fail, blaming the first party whose data it could not check.
    """
    if features is not None:
        check_feature_names(features)
    check_fit_options(options)
    if protocol.privacy != "mhe" or protocol.method not in VABS_METHODS:
        return
    if options.vabs is None:
        raise InputError(f"{protocol.name} needs --vabs: a bound on |x| the parties agree "
                         "on, one value for all features or one per feature")
    if features is not None and len(options.vabs) not in (1, len(features)):
        raise InputError(f"--vabs has {len(options.vabs)} bounds for {len(features)} "
                         f"features ({', '.join(features)})")


def check_feature_names(features: Sequence[str]) -> None:
    if not features or not all(name.strip() for name in features):
        raise InputError(f"--features needs non-empty names, got {list(features)}")
    duplicates = sorted({name for name in features if list(features).count(name) > 1})
    if duplicates:
        raise InputError(f"--features names {', '.join(duplicates)} more than once")


def abort_reason(me: int, exc: BaseException) -> str:
    """What a failing role tells its peers.

    A party's rejected input is sent as a category only ("input rejected by party 3"):
    its detail (which feature, how large a value, how many rows) is data the ledger
    does not list, so it stays on the party's own console (docs/LEAKAGE.md).
    """
    if isinstance(exc, InputError) and me != SERVER:
        return input_rejected(me)
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
    recorded in :attr:`rejections` and never disturb the session they tried to join,
    unless a party of the federation cannot take part (other columns, data beyond
    V_abs): then the session is abandoned at once and every party is told why.
    """

    def __init__(self, config: ServerConfig, log: Log = _quiet,
                 tracer: Tracer | None = None,
                 on_session: Callable[[SessionOutcome], None] = lambda outcome: None) -> None:
        if config.parties < 1:
            raise InputError(f"--parties must be at least 1, got {config.parties}")
        if config.sessions is not None and config.sessions < 1:
            raise InputError(f"--sessions must be at least 1, got {config.sessions}")
        self.protocol = get_protocol(config.method, config.privacy)
        check_server_options(self.protocol, config.options, config.features)
        check_out_dir(config.out, force=config.force)
        self.config = config
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

    def session_dir(self, number: int) -> Path | None:
        """Where session ``number`` (1-based) writes: --out itself for a single session,
        else its own ``session-<number>`` directory, so no session replaces another's."""
        if self.config.out is None or self.config.sessions == 1:
            return self.config.out
        return self.config.out / f"session-{number}"

    async def run_session(self, listeners: Sequence[trio.SocketListener]) -> SessionOutcome:
        """Admit the parties, run the protocol, write the result; never raise a FednormError."""
        lobby = Lobby(self._welcome(secrets.token_hex(8)), self.protocol.name,
                      self.config.features)
        outcome = SessionOutcome(lobby.session, number=len(self.outcomes) + 1)
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
                await close_links(lobby.links.values(), drain=outcome.error is not None)
        self._report(outcome)
        self._on_session(outcome)
        return outcome

    def _welcome(self, session: str) -> Welcome:
        return Welcome(NET_VERSION, session, self.protocol.method, self.protocol.privacy,
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
            features = lobby.agree()
            check_server_options(self.protocol, self.config.options, features)
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

    async def _run_protocol(self, lobby: Lobby) -> Normalizer:
        links = self._traced(lobby.links)
        ctx = RoleContext(SERVER, links, lobby.session, protocol=self.protocol.name,
                          timeout=self.config.timeouts.protocol)

        async def start_and_serve() -> Normalizer:
            for link in lobby.links.values():
                await send_handshake(link, Start(lobby.session))
            with np.errstate(over="ignore", invalid="ignore"):  # reported just below
                normalizer = await self.protocol.server(ctx, self.config.options)
            return check_no_overflow(normalizer, self.protocol.method, lobby.features)

        return await run_role(ctx, start_and_serve())

    def _traced(self, links: Mapping[int, TcpLink]) -> Mapping[int, Link]:
        if self.tracer is None:
            return links
        return {p: TracedLink(link, self.tracer, role_name(p)) for p, link in links.items()}

    def _write(self, outcome: SessionOutcome) -> list[Path]:
        out = self.session_dir(outcome.number)
        if out is None or outcome.normalizer is None:
            return []
        document = params_document(self.protocol, self.config.parties, outcome.session,
                                   outcome.features, outcome.normalizer)
        return write_atomically({out / PARAMS_JSON: document})

    def _report(self, outcome: SessionOutcome) -> None:
        if outcome.error is None:
            wrote = f"; wrote {', '.join(map(str, outcome.written))}" if outcome.written else ""
            self._log(f"session {outcome.session}: {self.protocol.name} with "
                      f"{self.config.parties} parties done in {outcome.seconds:.3f} s{wrote}")
        else:
            self._log(f"session {outcome.session} failed: {type(outcome.error).__name__}: "
                      f"{outcome.error}")


async def close_links(links: Iterable[TcpLink], *, drain: bool) -> None:
    """Close every link; after a failure, first let each peer read the cause.

    Closing a socket with frames still unread (those of the parties the server had
    not come to yet), or one a party is still sending to, makes the kernel send a
    reset, and a reset can discard the Abort waiting in the party's receive buffer:
    it would report "connection reset" instead of the cause.  So the server reads and
    drops what each party sends until the party closes, for a short while, then closes.
    """
    async def close(link: TcpLink) -> None:
        if drain:
            with trio.move_on_after(_DRAIN_SECONDS), suppress(FednormError):
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


# -- party ------------------------------------------------------------------------------
class Party:
    """One party: connect, be admitted, run the role the server chose."""

    def __init__(self, config: PartyConfig, log: Log = _quiet,
                 tracer: Tracer | None = None) -> None:
        if config.party < 1:
            raise InputError(f"party ids are 1..N, got {config.party}")
        self.config = config
        self.context = party_context(config.certs, config.party)
        self.tracer = tracer
        self._log = log

    async def run(self, X: np.ndarray, features: Sequence[str]) -> PartyRun:
        check_real(X)
        X = check_party_data(X)
        config, timeouts = self.config, self.config.timeouts
        hello = Hello(NET_VERSION, WIRE_VERSION, config.party, tuple(features))
        link, welcome = await connect_party(
            config.host, config.port, self.context, hello, connect_timeout=timeouts.join,
            handshake_timeout=timeouts.handshake, max_frame=config.max_frame,
        )
        try:
            protocol, options = _agreed_protocol(welcome)
            await _check_or_withdraw(link, welcome.session, config.party, X, features,
                                     protocol, options)
            self._log(f"admitted to session {welcome.session} ({protocol.name}, "
                      f"{welcome.parties} parties); waiting for the start")
            await wait_start(link, welcome.session, timeouts.join + timeouts.handshake)
            server: Link = link if self.tracer is None else TracedLink(link, self.tracer,
                                                                        "server")
            ctx = RoleContext(config.party, {SERVER: server}, welcome.session,
                              protocol=protocol.name, timeout=timeouts.protocol)
            with np.errstate(over="ignore", invalid="ignore"):  # reported just below
                normalizer = await run_role(ctx, protocol.party(ctx, X, options))
            check_no_overflow(normalizer, protocol.method, features)
        finally:
            await link.aclose()
        return PartyRun(welcome, protocol, normalizer)


def input_rejected(party: int, what: str = "") -> str:
    """The category a party's refusal of its own input is known by to everyone else."""
    return f"input rejected by {role_name(party)}" + (f": {what}" if what else "")


async def _check_or_withdraw(link: TcpLink, session: str, party: int, X: np.ndarray,
                             features: Sequence[str], protocol: Protocol,
                             options: FitOptions) -> None:
    """Check the data against what the welcome announced (V_abs); if it does not fit,
    tell the server so (the category, not which values) before leaving, so that every
    role stops with this cause; the detail stays on this party's console."""
    try:
        check_within_vabs(X, protocol, options, features)
    except InputError as exc:
        cause = input_rejected(party, "values beyond the agreed V_abs")
        with trio.move_on_after(1.0), suppress(FednormError):
            await send_handshake(link, Withdraw(cause))
        raise InputError(f"{cause}: {exc}") from None
    await send_handshake(link, Ready(session))


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


_NON_NUMERIC = re.compile(r"holds non-numeric value '(?P<cell>[^']*)'(?P<where> \([^)]*\))?")
_FLOAT_MAX = float(np.finfo(np.float64).max)


def load_csv(name_or_path: Path | str, target: str | None = None) -> Dataset:
    """:func:`~fednorm.sim.datasets.load_dataset`, with the causes its errors leave
    implicit: a number too large for float64 is called that rather than non-numeric,
    and a file split by ';' or tabs gets a hint that fednorm reads commas."""
    try:
        return load_dataset(name_or_path, target)
    except InputError as exc:
        message = _NON_NUMERIC.sub(_explain_cell, str(exc), count=1)
        raise InputError(message + _delimiter_hint(name_or_path)) from None


def _explain_cell(match: re.Match[str]) -> str:
    cell, where = match["cell"], match["where"] or ""
    try:
        value = float(cell)
    except ValueError:
        return match[0]
    if math.isinf(value) and "inf" not in cell.lower():
        return (f"holds value {cell!r}{where}, beyond the range of float64 numbers "
                f"(about ±{_FLOAT_MAX:.3g})")
    return f"holds the non-finite value {cell!r}{where}"


def _delimiter_hint(name_or_path: Path | str) -> str:
    path = Path(name_or_path)
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as stream:
            header = stream.readline()
    except OSError:
        return ""
    for delimiter, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "'|'")):
        if "," not in header and delimiter in header:
            return (f" (the header line is separated by {name}: fednorm reads comma-"
                    "separated files; convert it, e.g. re-export it as CSV with commas)")
    return ""


def load_party_data(path: Path | str, target: str | None = None) -> PartyData:
    """Load and validate a party's CSV before anything is sent; problems are InputErrors."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--data {path} is not a file")
    try:
        dataset = load_csv(path, target)
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


def check_out_dir(out: Path | None, *, force: bool = False) -> None:
    """Refuse, before any connection, an output directory the run could not use.

    It must be a directory (or not exist yet), empty unless ``force`` allows replacing
    what is there, and writable: a probe file is created, written and removed, so a
    run never does all its work only to fail when writing.
    """
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if out.is_dir() and not force and any(out.iterdir()):
        raise InputError(f"--out {out} is not empty; choose an empty or new directory, "
                         "or pass --force to replace its files")
    probe_writable(out)


def probe_writable(directory: Path) -> None:
    """Create, write and remove a file in ``directory``; leave no directory it made."""
    created = [d for d in (directory, *directory.parents) if not d.exists()]
    try:
        for missing in reversed(created):
            missing.mkdir()
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".fednorm-probe-")
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise InputError(f"--out {directory} is not writable: {exc.strerror or exc}") from None
    finally:
        for made in created:
            with suppress(OSError):
                made.rmdir()


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
