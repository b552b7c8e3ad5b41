"""One conformance suite for every :class:`~fednorm.engine.runtime.Link`: in memory, TCP
with mutual TLS, and Flower (the server's node link and the party worker's relay link).

Modelled on trio's generic stream checks (``trio.testing.check_two_way_stream``): each
implementation gives a *pair maker* (two connected ends, and a way to make one end
vanish without closing), and every property runs in both directions.  A role relies on
exactly these properties, whatever carries its frames:

- ordering and framing: frames arrive whole, in order, each exactly once (0 bytes,
  1 byte, several MB);
- byte counts: a role context counts on the receiving side what the sending side sent;
- close: frames sent before a close still arrive, then the peer's receive raises
  PartyDropped; the closed end refuses to send or receive; closing twice is harmless;
- abort: when the peer vanishes without closing, a receive raises PartyDropped (it
  neither hangs nor returns data), and a send never hangs.

Flower delivers in turns (the server's frames go out when it waits for a party; a
party's frames go back when it waits for the server), so every property is written as
an exchange in which the sender waits next, as every protocol role does.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import trio
from tcp_federation import connected_pair

from fednorm.engine.errors import PartyDropped, ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, Link, RoleContext
from fednorm.transport.memory import link_pair
from fednorm.transport.tcp import TcpLink

LARGE = 3 * 2**20 + 17  # several MB, and not a round number
RNG = np.random.default_rng(15)
FRAMES = [b"", b"x", RNG.bytes(LARGE), b"", RNG.bytes(1000), b"\x00", RNG.bytes(2**16 + 1)]
LIMIT = 30.0  # seconds any one property may take; a hang fails instead of stalling CI


@message("test.links.blob")
class Blob(Message):
    data: bytes


@dataclass
class Ends:
    """Two connected ends of one link, and how to make either vanish without closing."""

    near: Link
    far: Link
    vanish: Callable[[Link], Awaitable[None]]


PairMaker = Callable[[], AbstractAsyncContextManager[Ends]]


# -- the implementations ----------------------------------------------------------------
@asynccontextmanager
async def memory_pair() -> AsyncIterator[Ends]:
    server_end, party_end = link_pair(SERVER, 1)

    async def vanish(end: Link) -> None:  # in memory, a vanished end is a closed one
        await end.aclose()

    yield Ends(server_end, party_end, vanish)


def tcp_pair_maker(certs: Path) -> PairMaker:
    """TcpLinks over TLS over a loopback socket, authenticated as in a multi-host run."""

    @asynccontextmanager
    async def tcp_pair() -> AsyncIterator[Ends]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        server_end, party_end = await connected_pair(listeners[0], certs, 1)

        async def vanish(end: Link) -> None:
            """The host is gone: its socket closes at once, without a TLS close."""
            assert isinstance(end, TcpLink)
            await trio.aclose_forcefully(end.stream)

        try:
            yield Ends(server_end, party_end, vanish)
        finally:
            for end in (server_end, party_end):
                await trio.aclose_forcefully(end.stream)
            for listener in listeners:
                await listener.aclose()

    return tcp_pair


def flower_pair_maker() -> PairMaker:
    """The server's NodeLink and the party worker's RelayLink, through the FlowerExchange,
    Flower messages on an in-process Grid, and the worker's turns.  Only the pipe between
    a node's ClientApp runs and its worker is left out (tests/test_flower.py runs it)."""
    pytest.importorskip("flwr")
    from flwr.app import Message
    from loopback_grid import LoopbackGrid

    from fednorm.flower.content import Answer, Start, answer_content, parse_request
    from fednorm.flower.server import FlowerExchange, NodeLink, PartyLine
    from fednorm.flower.worker import PartyTurns

    node = 4242

    @asynccontextmanager
    async def flower_pair() -> AsyncIterator[Ends]:
        turns = PartyTurns(timeout=LIMIT)
        gone: list[str] = []  # set when the party's worker has died
        turns_in_progress: list[trio.CancelScope] = []

        async def take_turn(frames: list[bytes], closing: bool) -> dict | None:
            with trio.CancelScope() as scope:
                turns_in_progress.append(scope)
                return await turns.take_turn(frames, closing=closing)
            return None  # the worker died during the turn

        def node_app(message: Message, context: object) -> Message:
            """What the node's ClientApp answers (fednorm.flower.client.relay)."""
            request = parse_request(message)
            reply = None if gone else trio.from_thread.run(take_turn, request.frames,
                                                           request.closing)
            answer = (Answer(request.session, "failed", error=gone[0]) if reply is None else
                      Answer(request.session, reply["status"], reply["frames"],
                             reply.get("error", "")))
            return Message(answer_content(answer), reply_to=message)

        line = PartyLine(1, node)
        exchange = FlowerExchange(LoopbackGrid(node_app, [node]), {1: line}, "links",
                                  Start("zscore", "plain", {}, 1), LIMIT)
        server_end = NodeLink(line, exchange)

        async def vanish(end: Link) -> None:
            if end is server_end:  # what a worker concludes when no ClientApp run comes
                turns.link.server_gone("no ClientApp run came back")
                return
            gone.append("PartyGone: the party worker is gone")  # what the ClientApp says
            for scope in turns_in_progress:
                scope.cancel()

        yield Ends(server_end, turns.link, vanish)

    return flower_pair


def flipped(maker: PairMaker) -> PairMaker:
    """The same pair seen from its other end."""

    @asynccontextmanager
    async def flipped_pair() -> AsyncIterator[Ends]:
        async with maker() as ends:
            yield Ends(ends.far, ends.near, ends.vanish)

    return flipped_pair


IMPLEMENTATIONS = ["memory", "tcp-tls", "flower"]


@pytest.fixture(params=[(name, direction) for name in IMPLEMENTATIONS
                        for direction in ("server-end", "party-end")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def make_pair(request: pytest.FixtureRequest, certs: Path) -> PairMaker:
    name, direction = request.param
    makers: dict[str, Callable[[], PairMaker]] = {
        "memory": lambda: memory_pair,
        "tcp-tls": lambda: tcp_pair_maker(certs),
        "flower": flower_pair_maker,
    }
    maker = makers[name]()
    return maker if direction == "server-end" else flipped(maker)


# -- the properties ---------------------------------------------------------------------
@asynccontextmanager
async def far_end_playing(role: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Run ``role`` at the far end while the body acts at the near end, then stop it;
    a property that hangs fails after LIMIT seconds instead of stalling the suite."""
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(role)
            yield
            nursery.cancel_scope.cancel()


async def test_frames_arrive_whole_in_order_each_way(make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        async def far_echoes() -> None:
            got = [await ends.far.receive() for _ in FRAMES]
            for frame in reversed(got):
                await ends.far.send(frame)
            await ends.far.receive()  # waits, as a role does, until stopped

        async with far_end_playing(far_echoes):
            for frame in FRAMES:
                await ends.near.send(frame)
            assert [await ends.near.receive() for _ in FRAMES] == list(reversed(FRAMES))


async def test_a_waiting_receive_gets_a_frame_sent_later(make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        async def far_answers_late() -> None:
            assert await ends.far.receive() == b"ping"
            await trio.sleep(0.2)
            await ends.far.send(b"pong")
            await ends.far.receive()

        async with far_end_playing(far_answers_late):
            await ends.near.send(b"ping")
            assert await ends.near.receive() == b"pong"


async def test_a_role_context_counts_on_each_side_the_bytes_of_the_other(
        make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        near = RoleContext(SERVER, {1: ends.near}, "s", protocol="links", timeout=LIMIT)
        far = RoleContext(1, {SERVER: ends.far}, "s", protocol="links", timeout=LIMIT)
        sizes = [0, 1, LARGE]

        async def far_answers() -> None:
            for _ in sizes:
                await far.receive(SERVER, Blob)
            await far.send(SERVER, Blob(data=b"done"))
            await ends.far.receive()

        async with far_end_playing(far_answers):
            for size in sizes:
                await near.send(1, Blob(data=bytes(size)))
            assert (await near.receive(1, Blob)).data == b"done"
        assert near.stats.bytes_sent == far.stats.bytes_received > LARGE
        assert far.stats.bytes_sent == near.stats.bytes_received > 0
        assert (near.stats.messages_sent, far.stats.messages_received) == (3, 3)


async def test_frames_sent_before_a_close_arrive_then_the_peer_sees_it(
        make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        async def far_closes_after_sending() -> None:
            assert await ends.far.receive() == b"last words?"
            for frame in FRAMES:
                await ends.far.send(frame)
            await ends.far.aclose()

        async with far_end_playing(far_closes_after_sending):
            await ends.near.send(b"last words?")
            assert [await ends.near.receive() for _ in FRAMES] == FRAMES
            with pytest.raises(PartyDropped):
                await ends.near.receive()


async def test_a_closed_end_refuses_to_send_and_receive_and_closes_twice(
        make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        with trio.fail_after(LIMIT):
            await ends.near.aclose()
            with pytest.raises(PartyDropped):
                await ends.near.send(b"after close")
            with pytest.raises(PartyDropped):
                await ends.near.receive()
            await ends.near.aclose()


async def test_a_peer_that_vanishes_makes_receive_raise_and_send_not_hang(
        make_pair: PairMaker) -> None:
    async with make_pair() as ends:
        async def far_vanishes() -> None:
            assert await ends.far.receive() == b"are you there?"
            await ends.vanish(ends.far)

        async with far_end_playing(far_vanishes):
            await ends.near.send(b"are you there?")
            with pytest.raises(PartyDropped):
                await ends.near.receive()
            with pytest.raises(PartyDropped):  # a broken link stays broken
                await ends.near.receive()
            try:  # a send may still be buffered, or refused; it must return either way
                for _ in range(20):
                    await ends.near.send(FRAMES[2])
            except PartyDropped:
                pass


COVERED = {"MemoryLink": "memory", "TcpLink": "tcp-tls", "NodeLink": "flower",
           "RelayLink": "flower"}


def test_every_link_the_package_defines_is_in_the_suite() -> None:
    """A new Link in fednorm.transport or fednorm.flower must join IMPLEMENTATIONS."""
    pytest.importorskip("flwr")
    import fednorm.flower
    import fednorm.transport

    found = set()
    for package in (fednorm.transport, fednorm.flower):
        for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            for name, cls in inspect.getmembers(importlib.import_module(module.name),
                                                inspect.isclass):
                if cls.__module__ == module.name and all(
                        inspect.iscoroutinefunction(getattr(cls, verb, None))
                        for verb in ("send", "receive", "aclose")):
                    found.add(name)
    assert found == set(COVERED)
    assert set(COVERED.values()) <= set(IMPLEMENTATIONS)


# -- sending while reading (what key setup relies on) ---------------------------------
CROSSING = 40 * 2**20  # past the most both loopback sockets buffer (tcp_wmem + rmem: 36 MB)


async def exchange(certs: Path, play: Callable[[RoleContext, int, Blob], Awaitable[Blob]],
                   within: float) -> dict[int, Blob] | None:
    """Both ends of a TCP link send each other a frame of CROSSING bytes at once, each
    with ``play``; what each received, or None if they did not finish ``within`` s."""
    async with tcp_pair_maker(certs)() as ends:
        roles = {SERVER: RoleContext(SERVER, {1: ends.near}, "s", protocol="links",
                                     timeout=LIMIT),
                 1: RoleContext(1, {SERVER: ends.far}, "s", protocol="links", timeout=LIMIT)}
        got: dict[int, Blob] = {}

        async def run(me: int, peer: int) -> None:
            got[me] = await play(roles[me], peer, Blob(data=bytes([me]) * CROSSING))

        with trio.move_on_after(within):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, SERVER, 1)
                nursery.start_soon(run, 1, SERVER)
            return got
    return None


async def test_two_roles_sending_each_other_large_frames_do_not_block(certs: Path) -> None:
    """A party sends its key shares while the server forwards it another party's: with
    :meth:`RoleContext.sending` each reads while it sends, and both frames arrive."""
    async def sending(rc: RoleContext, peer: int, blob: Blob) -> Blob:
        async with rc.sending(peer, blob):
            return await rc.receive(peer, Blob)

    got = await exchange(certs, sending, LIMIT)
    assert got is not None and got[SERVER].data == bytes([1]) * CROSSING
    assert got[1].data == bytes([SERVER]) * CROSSING

    async def send_then_receive(rc: RoleContext, peer: int, blob: Blob) -> Blob:
        await rc.send(peer, blob)
        return await rc.receive(peer, Blob)

    assert await exchange(certs, send_then_receive, 5.0) is None  # both block


async def test_a_failure_while_sending_is_raised_as_itself() -> None:
    """Not wrapped in an exception group: a party's refusal of a forwarded share reaches
    its caller (and its report) as the ProtocolError it is."""
    _, party_end = link_pair(SERVER, 1)
    party = RoleContext(1, {SERVER: party_end}, "s", protocol="links", timeout=LIMIT)
    with pytest.raises(ProtocolError, match="party 2's share"):
        async with party.sending(SERVER, Blob(data=b"share")):
            raise ProtocolError("party 2's share is unsigned")
