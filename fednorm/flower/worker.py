"""The party worker: one node's party role, alive for one fednorm session of one Flower run.

A fednorm party is a coroutine that keeps state between messages (rank-search columns,
for MHE its secret key share).  Flower runs every message in a fresh ClientApp process,
so the first ClientApp run of a session starts this worker and every run after it only
relays: it hands over the server's frames and takes back what the party said until the
party next waits for the server (its *turn*).  The party's state, secret key included,
never leaves this process; only protocol frames do, the same frames a TCP party sends.

The worker ends when its party role ends (result, error or the server's Abort), when no
ClientApp run comes back within the protocol timeout, when the Flower process that
started it (the SuperNode's SuperExec) goes away, or on SIGTERM/SIGINT; it removes its
socket on the way out.  Run as ``python -m fednorm.flower.worker --pipe PATH ...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine.errors import FednormError, ProtocolError
from fednorm.engine.runtime import SERVER
from fednorm.flower.localpipe import (
    HEADER_BYTES,
    READY,
    array_from_wire,
    normalizer_to_wire,
    pack,
    packet_length,
    unpack,
)
from fednorm.protocols import Normalizer, get_protocol
from fednorm.protocols.base import check_party_data
from fednorm.session import (
    abort_reason,
    options_from_wire,
    play,
    role_context,
    root_cause,
    run_role,
)

_PARENT_POLL_SECONDS = 0.5


class RelayLink:
    """The party's link to the server, fed in batches: one batch per Flower message.

    ``receive`` on an empty inbox ends the party's turn: everything it has sent since
    the last batch is what the node answers to the current Flower message.
    """

    def __init__(self) -> None:
        self._inbox: deque[bytes] = deque()
        self._outbox: list[bytes] = []
        self._arrived = trio.Event()
        self.turn_over = trio.Event()

    async def send(self, frame: bytes) -> None:
        self._outbox.append(bytes(frame))

    async def receive(self) -> bytes:
        while not self._inbox:
            self.turn_over.set()
            await self._arrived.wait()
        return self._inbox.popleft()

    async def aclose(self) -> None:
        """Nothing to close: the pipe belongs to the worker, not to the role."""

    def deliver(self, frames: list[bytes]) -> trio.Event:
        """Start a turn with the server's ``frames``; returns the event that ends it."""
        self._inbox.extend(frames)
        self.turn_over = trio.Event()
        arrived, self._arrived = self._arrived, trio.Event()
        arrived.set()
        return self.turn_over

    def take_sent(self) -> list[bytes]:
        sent, self._outbox = self._outbox, []
        return sent


@dataclass(frozen=True)
class Setup:
    """What the first ClientApp run tells the worker: the session, the role, the data."""

    party: int
    session: str
    method: str
    privacy: str
    options: dict[str, Any]
    timeout: float
    X: np.ndarray

    @classmethod
    def from_packet(cls, packet: dict[str, Any]) -> Setup:
        try:
            setup = packet["setup"]
            return cls(int(setup["party"]), str(setup["session"]), str(setup["method"]),
                       str(setup["privacy"]), dict(setup["options"]), float(setup["timeout"]),
                       array_from_wire(setup["X"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed setup on the party pipe: {exc}") from None


@dataclass
class Outcome:
    normalizer: Normalizer | None = None
    error: str | None = None
    finished: bool = False

    def status(self) -> str:
        if not self.finished:
            return "waiting"
        return "done" if self.error is None else "failed"


class PartyWorker:
    """Serves one party role to the ClientApp runs that connect to its pipe, one at a time."""

    def __init__(self, listener: trio.SocketListener, timeout: float) -> None:
        self._listener = listener
        self._timeout = timeout
        self._link = RelayLink()
        self._outcome = Outcome()
        self._setup: Setup | None = None
        self._between_runs = trio.CancelScope()

    async def serve(self) -> Outcome:
        async with trio.open_nursery() as nursery:
            while not self._outcome.finished:
                stream = await self._next_run()
                if stream is None:  # the role ended between two ClientApp runs
                    break
                async with stream:
                    await self._serve_turn(stream, nursery)
            nursery.cancel_scope.cancel()
        return self._outcome

    async def _next_run(self) -> trio.SocketStream | None:
        """The next ClientApp run's connection; None if the role ends while waiting."""
        with trio.fail_after(self._timeout), trio.CancelScope() as self._between_runs:
            return await self._listener.accept()
        return None

    async def _serve_turn(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        with trio.fail_after(self._timeout):
            request = await receive_packet(stream)
        if self._setup is None:
            self._setup = Setup.from_packet(request)
            nursery.start_soon(self._run_party, self._setup)
        else:
            self._check_same_session(request)
        turn_over = self._link.deliver(list(request.get("frames", [])))
        with trio.fail_after(self._timeout):
            await turn_over.wait()
        await stream.send_all(pack(self._answer()))

    def _check_same_session(self, request: dict[str, Any]) -> None:
        assert self._setup is not None
        same = (request.get("session"), request.get("party")) == (self._setup.session,
                                                                    self._setup.party)
        if not same:
            raise ProtocolError("a ClientApp run relayed frames of another session or party")

    def _answer(self) -> dict[str, Any]:
        outcome = self._outcome
        answer: dict[str, Any] = {"status": outcome.status(), "frames": self._link.take_sent()}
        if outcome.error is not None:
            answer["error"] = outcome.error
        if outcome.normalizer is not None:
            answer["normalizer"] = normalizer_to_wire(outcome.normalizer)
        return answer

    async def _run_party(self, setup: Setup) -> None:
        try:
            protocol = get_protocol(setup.method, setup.privacy)
            options = options_from_wire(setup.options)
            ctx = role_context(setup.party, {SERVER: self._link}, setup.session, protocol,
                               timeout=setup.timeout)
            X = check_party_data(setup.X)
            self._outcome.normalizer = await run_role(ctx, play(ctx, protocol, options, X))
        except Exception as exc:
            self._outcome.error = abort_reason(setup.party, exc)
        finally:
            self._outcome.finished = True
            self._link.turn_over.set()
            self._between_runs.cancel()  # no-op during a turn: that scope has exited


async def receive_packet(stream: trio.SocketStream) -> dict[str, Any]:
    async def exactly(size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = await stream.receive_some(min(size - len(data), 1 << 20))
            if not chunk:
                raise ProtocolError("the ClientApp closed the party pipe mid-packet")
            data += chunk
        return bytes(data)

    return unpack(await exactly(packet_length(await exactly(HEADER_BYTES))))


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
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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
        async for _ in signals:
            return


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
        outcome = trio.run(run_worker, args.pipe, args.watch_pid, args.timeout)
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
        print(f"fednorm party worker: {outcome.error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
