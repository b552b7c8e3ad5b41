"""The server side: run a fednorm server role inside a ServerApp, over the Grid.

The server role talks to :class:`NodeLink` objects, one per party.  A send only queues
the frame; a receive that finds nothing buffered starts one Flower round
(:meth:`FlowerExchange.round_trip`): one message to every party that has frames queued
(or has not started yet), then the answers, whose frames fill the links' buffers.  A
protocol round — a broadcast, then a gather — is thus one Flower round, and a party
that answers ``waiting`` has said everything it will say until the server sends again.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import trio

from fednorm.engine.clock import run_trio
from fednorm.engine.errors import (
    InputError,
    PartyDropped,
    ProtocolError,
    ProtocolTimeout,
    RunAborted,
)
from fednorm.engine.runtime import SERVER, Link, role_name
from fednorm.engine.tracing import Tracer
from fednorm.engine.traffic import TrafficStats
from fednorm.flower.content import (
    MESSAGE_TYPE,
    Answer,
    Grid,
    Message,
    Request,
    Start,
    parse_answer,
    request_content,
)
from fednorm.flower.localpipe import params_digest, pick_normalizer
from fednorm.protocols import FitOptions, Normalizer
from fednorm.protocols.base import options_to_wire
from fednorm.protocols.columns import check_feature_names
from fednorm.protocols.decryptions import require_decryptions_within
from fednorm.protocols.progress import LineTracer
from fednorm.session import (
    SessionPlan,
    StepContexts,
    play_session,
    run_role,
)

DEFAULT_TIMEOUT = 300.0
POLL_SECONDS = 0.1
ABORT_GRACE_SECONDS = 30.0


@dataclass
class PartyLine:
    """The server's view of one party: its node, queued frames both ways, its status."""

    party: int
    node_id: int
    outbox: list[bytes] = field(default_factory=list)
    inbox: deque[bytes] = field(default_factory=deque)
    status: str = "new"
    error: str = ""
    digest: bytes = b""
    closed: bool = False  # the server closed its link to this party

    @property
    def started(self) -> bool:
        return self.status != "new"

    @property
    def active(self) -> bool:
        return not self.closed and self.status in ("new", "waiting")

    def dropped(self) -> PartyDropped:
        """Why this party is gone: its own reason when it gave one (\"party 2 refused its
        input: ...\"), as a multi-host server reports it, else what the server saw."""
        peer = f"{role_name(self.party)} (node {self.node_id})"
        if self.error.startswith(f"{role_name(self.party)} "):
            return RunAborted(peer, self.error)
        return PartyDropped(peer, self.error or (
            "link closed" if self.closed else f"the party is {self.status}"))


class NodeLink:
    """The server's link to one party: frames go out and come in with Flower rounds."""

    def __init__(self, line: PartyLine, exchange: FlowerExchange) -> None:
        self._line = line
        self._exchange = exchange

    async def send(self, frame: bytes) -> None:
        if self._line.closed:
            raise self._line.dropped()
        self._line.outbox.append(bytes(frame))

    async def receive(self) -> bytes:
        while not self._line.inbox or self._line.closed:
            await self._exchange.round_trip(self._line.party)
        return self._line.inbox.popleft()

    async def aclose(self) -> None:
        """Send the party what is queued for it, marked as the server's last frames
        (the Grid itself belongs to the ServerApp)."""
        await self._exchange.close(self._line.party)


class FlowerExchange:
    """Moves queued frames between the server role and the parties, one Flower round at
    a time, over a Grid whose blocking calls run in a worker thread."""

    def __init__(self, grid: Grid, lines: dict[int, PartyLine], session: str, start: Start,
                 timeout: float) -> None:
        self.grid = grid
        self.lines = lines
        self.session = session
        self.start = start
        self.timeout = timeout
        self.flower_rounds = 0
        self._lock = trio.Lock()

    async def round_trip(self, waiting_for: int) -> None:
        """Get frames from party ``waiting_for``: run a Flower round if need be."""
        async with self._lock:
            line = self.lines[waiting_for]
            if line.inbox and not line.closed:
                return
            if not line.active:
                raise line.dropped()
            targets = [p for p, other in self.lines.items()
                       if other.active and (not other.started or other.outbox)]
            if waiting_for not in targets:
                raise ProtocolError(f"{role_name(waiting_for)} waits for the server while the "
                                    "server waits for it")
            await self._send_round(targets, self.timeout)

    async def close(self, party: int) -> None:
        """Close the server's link to ``party``: a party that is waiting gets the frames
        queued for it with word that no more will come."""
        async with self._lock:
            line = self.lines[party]
            if line.closed:
                return
            line.closed = True
            if line.started and line.status == "waiting":
                await self._send_round([party], self.timeout)

    async def finish(self, digest: bytes) -> None:
        """After the server role: deliver its last frames; every party must end done with
        the same parameters as the server."""
        async with self._lock:
            targets = [p for p, line in self.lines.items() if line.active and line.outbox]
            if targets:
                await self._send_round(targets, self.timeout)
        for line in self.lines.values():
            if line.status != "done":
                raise line.dropped() if line.status == "failed" else ProtocolError(
                    f"{role_name(line.party)} did not finish with the server")
            if line.digest != digest:
                raise ProtocolError(f"{role_name(line.party)} fitted other parameters than "
                                    "the server")

    async def abort(self) -> None:
        """Best effort after a failure: deliver the Abort frames so workers stop now."""
        targets = [p for p, line in self.lines.items()
                   if line.status == "waiting" and line.outbox]
        if not targets:
            return
        with trio.move_on_after(ABORT_GRACE_SECONDS):
            try:
                await self._send_round(targets, ABORT_GRACE_SECONDS)
            except Exception:  # the original failure is what the caller reports
                return

    async def _send_round(self, targets: Sequence[int], timeout: float) -> None:
        self.flower_rounds += 1
        messages = {p: self._message(self.lines[p]) for p in targets}
        ids = await trio.to_thread.run_sync(self._push, list(messages.values()))
        party_of = dict(zip(ids, targets, strict=True))
        deadline = trio.current_time() + timeout
        while party_of:
            for reply in await trio.to_thread.run_sync(self._pull, list(party_of)):
                party = party_of.pop(reply.metadata.reply_to_message_id, None)
                if party is not None:
                    self._take(self.lines[party], reply)
            if party_of:
                if trio.current_time() > deadline:
                    late = ", ".join(role_name(p) for p in sorted(party_of.values()))
                    raise ProtocolTimeout(late, timeout, "Flower reply")
                await trio.sleep(POLL_SECONDS)

    def _message(self, line: PartyLine) -> Message:
        frames, line.outbox = line.outbox, []
        request = Request(self.session, line.party, self.timeout, frames,
                          None if line.started else self.start, line.closed)
        line.status = "waiting" if line.status == "new" else line.status
        return Message(request_content(request), dst_node_id=line.node_id,
                       message_type=MESSAGE_TYPE, group_id=f"fednorm-{self.session}")

    def _push(self, messages: list[Message]) -> list[str]:
        return list(self.grid.push_messages(messages))

    def _pull(self, message_ids: list[str]) -> list[Message]:
        return list(self.grid.pull_messages(message_ids))

    def _take(self, line: PartyLine, reply: Message) -> None:
        try:
            answer = parse_answer(reply)
        except ProtocolError as exc:
            answer = Answer(self.session, "failed", error=str(exc))
        if answer.session != self.session:
            answer = Answer(self.session, "failed", error="answered for another session")
        line.inbox.extend(answer.frames)
        line.status, line.error, line.digest = answer.status, answer.error, answer.digest


@dataclass
class FlowerNormalization:
    """A fednorm session run over Flower: a fit per method and what the session cost
    (key setup included; ``traffic`` has each step's, by its protocol name)."""

    normalizers: dict[str, Normalizer]  # by method, in the order fitted
    parties: dict[int, int]  # party id -> Flower node id
    session: str
    protocol_rounds: int
    flower_rounds: int
    seconds: float
    traffic: dict[str, TrafficStats]

    @property
    def normalizer(self) -> Normalizer:
        """The session's only fit (a session of several methods: ``normalizers[m]``)."""
        return pick_normalizer(self.normalizers, None)


def wait_for_nodes(grid: Grid, count: int, timeout: float = 120.0) -> list[int]:
    """The ids of the first ``count`` nodes to connect (sorted), waiting up to ``timeout``."""
    if count < 1:
        raise InputError(f"a federation needs at least one node, not {count}")
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise PartyDropped(f"{count - len(nodes)} of {count} nodes",
                               f"did not connect within {timeout:g} s")
        time.sleep(0.5)
    return nodes[:count]


def normalize(
    grid: Grid,
    nodes: Iterable[int],
    method: str | Sequence[str],
    privacy: str = "plain",
    options: FitOptions | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    features: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    tracer: Tracer | None = None,
) -> FlowerNormalization:
    """Fit ``method`` over the parties on ``nodes`` (party i+1 is the i-th node id).

    Several methods (``"zscore,minmax"`` or a sequence) are fitted in one session, in
    order; under ``mhe`` they share one joint key setup, run first.  Call it from a
    ServerApp's ``main``; every node's ClientApp must have called
    :func:`fednorm.flower.register_party`.  Every party ends with the same normalizers
    (the server checks a digest of them); read them on the node with
    :func:`fednorm.flower.fitted_normalizer`.  ``features`` names the columns (as
    ``fednorm serve --features``): the fitted normalizers carry the names, on the server
    and on the nodes, and a node's refusal of its data names them in its log.  A node
    whose loader returns a DataFrame has its columns matched by name, in any order, and
    refuses the session, naming them, if they are others; an array's columns are taken
    in this order, and a node with another number of them refuses the session.
    ``progress`` (e.g. the ServerApp's log)
    gets a line each time the phase or the Flower round changes; the run's rounds are
    counted in Flower rounds only ("rank search round 5 of ~22 · Flower round 8 · ..."),
    the count ``flower_rounds`` ends at, never the protocol's own beside them;
    ``tracer`` watches the server role (its phases, crypto calls and every frame).
    """
    plan = SessionPlan(method, privacy)
    options = options or FitOptions()
    wire_options = options_to_wire(options)
    node_ids = list(nodes)
    if not node_ids or len(set(node_ids)) != len(node_ids):
        raise InputError(f"normalize needs distinct node ids, got {node_ids}")
    if not timeout > 0:
        raise InputError(f"the timeout must be positive, got {timeout}")
    if features is not None:
        check_feature_names(features, "features")
        require_decryptions_within(plan.protocols, options, len(features), len(node_ids))
    lines = {party: PartyLine(party, node) for party, node in enumerate(node_ids, start=1)}
    session = secrets.token_hex(8)
    start = Start(plan.methods, privacy, wire_options, len(lines),
                  None if features is None else tuple(features))
    exchange = FlowerExchange(grid, lines, session, start, timeout)
    tracers = [] if tracer is None else [tracer]
    if progress is not None:
        tracers.append(LineTracer(progress, f"fednorm {plan.name}",
                                  lambda: f"Flower round {exchange.flower_rounds}"))
    return run_trio(_serve, plan, options, exchange, tracers)


async def _serve(plan: SessionPlan, options: FitOptions, exchange: FlowerExchange,
                 tracers: list[Tracer]) -> FlowerNormalization:
    features = exchange.start.features
    links: dict[int, Link] = {party: NodeLink(line, exchange)
                              for party, line in exchange.lines.items()}
    contexts = StepContexts(SERVER, links, exchange.session, exchange.timeout, tracers)
    started = time.perf_counter()
    try:
        normalizers = await play_session(contexts, plan, options, features=features)
        await run_role(contexts.made[-1], exchange.finish(params_digest(normalizers)))
    except BaseException:
        with trio.CancelScope(shield=True):
            await exchange.abort()
        raise
    return FlowerNormalization(
        dict(zip(plan.methods, normalizers, strict=True)),
        {p: line.node_id for p, line in exchange.lines.items()},
        exchange.session, sum(ctx.stats.rounds for ctx in contexts.made),
        exchange.flower_rounds, time.perf_counter() - started,
        {ctx.protocol: ctx.stats for ctx in contexts.made})
