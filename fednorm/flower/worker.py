"""The party worker: one node's party role, alive for one fednorm session of one Flower run.

A fednorm party is a coroutine that keeps state between messages (rank-search columns,
its secret key share).  Flower runs every message in a fresh ClientApp process, so the
session's first ClientApp run starts this worker and every later run only relays the
server's frames and takes back what the party said until it next waits (its *turn*).
Its state, secret key included, never leaves this process; only protocol frames do.

The worker ends when its party role ends (result, error or the server's Abort), when no
ClientApp run comes back within the protocol timeout, when the SuperNode's SuperExec that
started it goes away, or on SIGTERM/SIGINT, removing its socket.  Run as ``python -m
fednorm.flower.worker --pipe PATH ...``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine.clock import run_trio
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError, root_cause
from fednorm.engine.runtime import SERVER, role_name
from fednorm.flower.localpipe import (
    READY,
    array_from_wire,
    normalizer_to_wire,
    optional_names,
    pack,
    receive_packet,
)
from fednorm.protocols import Normalizer
from fednorm.protocols.base import check_party_data, options_from_wire, refuse_unflooded
from fednorm.protocols.columns import refuse_other_width
from fednorm.protocols.decryptions import refuse_decryptions_beyond
from fednorm.session import (
    SessionPlan,
    StepContexts,
    abort_reason,
    check_session_inputs,
    play_session,
)
from fednorm.transport.tls import party_keyring

_PARENT_POLL_SECONDS = 0.5


class RelayLink:
    """The party's link to the server, fed in batches: one batch per Flower message (it
    ``moves_in_rounds``: a party that says all it can before it waits saves rounds).

    ``receive`` on an empty inbox ends the party's turn: everything it has sent since
    the last batch is what the node answers to the current Flower message.  Once the
    server has closed the link, or is gone, a receive that finds nothing raises
    :class:`PartyDropped`, as a closed TCP link does."""

    moves_in_rounds = True

    def __init__(self) -> None:
        self._inbox: deque[bytes] = deque()
        self._outbox: list[bytes] = []
        self._arrived = trio.Event()
        self.turn_over = trio.Event()
        self.closed = False
        self._server_gone: str | None = None  # why no frame will come any more

    async def send(self, frame: bytes) -> None:
        if self.closed:
            raise PartyDropped(role_name(SERVER), "link closed")
        self._outbox.append(bytes(frame))

    async def receive(self) -> bytes:
        while not self._inbox:
            self.turn_over.set()
            if self.closed or self._server_gone is not None:
                raise PartyDropped(role_name(SERVER), self._server_gone or "link closed")
            await self._arrived.wait()
        if self.closed:
            raise PartyDropped(role_name(SERVER), "link closed")
        return self._inbox.popleft()

    async def aclose(self) -> None:
        """End the party's last turn; the pipe itself belongs to the worker."""
        self.closed = True
        self.turn_over.set()
        self._wake()

    def deliver(self, frames: list[bytes], *, closing: bool = False) -> trio.Event:
        """Start a turn with the server's ``frames`` (its last ones, if ``closing``);
        returns the event that ends the turn."""
        self._inbox.extend(frames)
        if closing:
            self._server_gone = "closed the link"
        self.turn_over = trio.Event()
        if self.closed:
            self.turn_over.set()
        self._wake()
        return self.turn_over

    def server_gone(self, reason: str) -> None:
        """No frame will come any more: a waiting receive raises, saying ``reason``."""
        self._server_gone = reason
        self._wake()

    def take_sent(self) -> list[bytes]:
        sent, self._outbox = self._outbox, []
        return sent

    def _wake(self) -> None:
        arrived, self._arrived = self._arrived, trio.Event()
        arrived.set()


@dataclass(frozen=True)
class Setup:
    """What the first ClientApp run tells the worker: the session, the role, the data,
    and the node's own settings (certificates to sign with, consent to unflooded decryptions)."""

    party: int
    parties: int
    session: str
    methods: tuple[str, ...]
    privacy: str
    options: dict[str, Any]
    timeout: float
    X: np.ndarray
    certs: str | None
    allow_unflooded: bool = False
    features: tuple[str, ...] | None = None

    @classmethod
    def from_packet(cls, packet: dict[str, Any]) -> Setup:
        try:
            setup = packet["setup"]
            return cls(int(setup["party"]), int(setup["parties"]), str(setup["session"]),
                       tuple(map(str, setup["methods"])), str(setup["privacy"]),
                       dict(setup["options"]), float(setup["timeout"]),
                       array_from_wire(setup["X"]), setup.get("certs") and str(setup["certs"]),
                       setup.get("allow_unflooded") is True, optional_names(setup.get("features")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed setup on the party pipe: {exc}") from None


@dataclass
class Outcome:
    normalizers: list[Normalizer] | None = None  # one per method of the session
    error: str | None = None  # what the server hears: a refused input's kind, no data
    log: str | None = None  # what this node's log says: the refused columns and values too
    finished: bool = False


class PartyTurns:
    """A party role's side of the Flower exchange: one turn per Flower message.

    A turn hands the role the server's frames and ends when the role waits for the
    server again, or ends; its answer is what the role sent meanwhile and where the
    role stands (``waiting``, ``done`` or ``failed``).
    """

    def __init__(self, timeout: float) -> None:
        self.link = RelayLink()
        self.outcome = Outcome()
        self.ended = trio.Event()
        self._timeout = timeout

    async def play(self, party: int, role: Awaitable[list[Normalizer]]) -> None:
        """Run ``role`` to its end, keep how it ended, and end the turn it ended in."""
        try:
            self.outcome.normalizers = await role
        except Exception as exc:
            self.outcome.error = abort_reason(party, exc)
            self.outcome.log = str(exc) if isinstance(exc, InputError) else self.outcome.error
        finally:
            self.outcome.finished = True
            await self.link.aclose()
            self.ended.set()

    async def take_turn(self, frames: list[bytes], *, closing: bool = False) -> dict[str, Any]:
        turn_over = self.link.deliver(frames, closing=closing)
        with trio.fail_after(self._timeout):
            await turn_over.wait()
        return self.answer()

    def status(self) -> str:
        if not self.link.closed:
            return "waiting"
        return "done" if self.outcome.error is None else "failed"

    def answer(self) -> dict[str, Any]:
        outcome = self.outcome
        answer: dict[str, Any] = {"status": self.status(), "frames": self.link.take_sent()}
        if outcome.error is not None:
            answer["error"] = outcome.error
        if outcome.normalizers is not None:
            answer["normalizers"] = [normalizer_to_wire(n) for n in outcome.normalizers]
        return answer


class PartyWorker:
    """Serves one party role to the ClientApp runs that connect to its pipe, one at a time."""

    def __init__(self, listener: trio.SocketListener, timeout: float) -> None:
        self._listener = listener
        self._timeout = timeout
        self._turns = PartyTurns(timeout)
        self._setup: Setup | None = None
        self._between_runs = trio.CancelScope()

    async def serve(self) -> Outcome:
        async with trio.open_nursery() as nursery:
            while not self._turns.outcome.finished:
                stream = await self._next_run()
                if stream is None:  # the role ended between two ClientApp runs
                    break
                async with stream:
                    await self._serve_turn(stream, nursery)
            nursery.cancel_scope.cancel()
        return self._turns.outcome

    async def _next_run(self) -> trio.SocketStream | None:
        """The next ClientApp run's connection; None if the role ends while waiting.

        Once the session runs, a server that sends nothing within the timeout is gone:
        the role hears it as a dropout, as over TCP, and ends with that cause."""
        with trio.move_on_after(self._timeout) as waiting, \
                trio.CancelScope() as self._between_runs:
            return await self._listener.accept()
        if waiting.cancelled_caught:
            if self._setup is None:
                raise trio.TooSlowError
            self._turns.link.server_gone(
                f"no ClientApp run came back within {self._timeout:g} s")
            await self._turns.ended.wait()
        return None

    async def _serve_turn(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        with trio.fail_after(self._timeout):
            request = await receive_packet(stream)
        if self._setup is None:
            self._setup = Setup.from_packet(request)
            nursery.start_soon(self._run_party, self._setup)
        else:
            self._check_same_session(request)
        answer = await self._turns.take_turn(list(request.get("frames", [])),
                                             closing=bool(request.get("closing", False)))
        await stream.send_all(pack(answer))

    def _check_same_session(self, request: dict[str, Any]) -> None:
        assert self._setup is not None
        same = (request.get("session"), request.get("party")) == (self._setup.session,
                                                                    self._setup.party)
        if not same:
            raise ProtocolError("a ClientApp run relayed frames of another session or party")

    async def _run_party(self, setup: Setup) -> None:
        await self._turns.play(setup.party, self._party_role(setup))
        self._between_runs.cancel()  # no-op during a turn: that scope has exited

    async def _party_role(self, setup: Setup) -> list[Normalizer]:
        plan = SessionPlan(setup.methods, setup.privacy)
        options = options_from_wire(setup.options)
        refuse_unflooded(setup.party, plan.protocols, options, setup.allow_unflooded)
        keyring = party_keyring(Path(setup.certs), setup.party) if setup.certs else None
        contexts = StepContexts(setup.party, {SERVER: self._turns.link}, setup.session,
                                setup.timeout, keyring=keyring)
        X = check_party_data(setup.X)
        refuse_other_width(setup.party, setup.features, X.shape[1])
        refuse_decryptions_beyond(setup.party, plan.protocols, options, X.shape[1], setup.parties)
        check_session_inputs(setup.party, X, plan.protocols, options, setup.features)
        return await play_session(contexts, plan, options, X, setup.features)


# -- process plumbing ---------------------------------------------------------------------
async def watch_process(pid: int) -> None:
    """Return when process ``pid`` has exited."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd: poll instead
        while _alive(pid):
            await trio.sleep(_PARENT_POLL_SECONDS)
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def _alive(pid: int) -> bool:
    try:
        with suppress(PermissionError):  # another user's process: alive
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def open_pipe(path: Path) -> trio.SocketListener:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(os.fspath(path))
    finally:
        os.umask(old_umask)
    sock.listen(4)
    return trio.SocketListener(sock)


async def run_worker(path: Path, watch_pid: int | None, timeout: float) -> Outcome | None:
    """Listen on ``path``, say ready on stdout, serve the party; None if stopped early."""
    listener = await open_pipe(path)
    try:
        sys.stdout.buffer.write(READY)
        sys.stdout.flush()
        _detach_stdout()
        async with trio.open_nursery() as nursery:
            outcome: list[Outcome] = []

            async def serve() -> None:
                outcome.append(await PartyWorker(listener, timeout).serve())
                nursery.cancel_scope.cancel()

            async def stop_on(awaitable_fn: Any) -> None:
                await awaitable_fn()
                nursery.cancel_scope.cancel()

            nursery.start_soon(serve)
            if watch_pid is not None:
                nursery.start_soon(stop_on, lambda: watch_process(watch_pid))
            nursery.start_soon(stop_on, _termination_signal)
        return outcome[0] if outcome else None
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        with suppress(FileNotFoundError):
            path.unlink()


def _detach_stdout() -> None:
    """Let the starter stop reading: point stdout at /dev/null (not closed, so the fd
    cannot be reused by a socket that a stray print would then write into)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


async def _termination_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        await anext(signals)


def describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, trio.TooSlowError):
        return f"no ClientApp run came back within {timeout:g} s; stopping"
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fednorm.flower.worker")
    parser.add_argument("--pipe", type=Path, required=True)
    parser.add_argument("--watch-pid", type=int)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        outcome = run_trio(run_worker, args.pipe, args.watch_pid, args.timeout)
    except BaseExceptionGroup as group:
        print(f"fednorm party worker: {describe(root_cause(group), args.timeout)}",
              file=sys.stderr)
        return 1
    except (FednormError, OSError, trio.TooSlowError) as exc:
        print(f"fednorm party worker: {describe(exc, args.timeout)}", file=sys.stderr)
        return 1
    if outcome is None:
        print("fednorm party worker: stopped before the session ended", file=sys.stderr)
        return 1
    if outcome.error is not None:
        print(f"fednorm party worker: {outcome.log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
