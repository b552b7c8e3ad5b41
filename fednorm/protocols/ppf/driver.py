"""Run a crypto core over the server's crypto: the one place where a PPF protocol's
encrypted computations meet the network.

A core (:mod:`fednorm.engine.ckks.cores`) is synchronous code that yields what it needs
from the federation, a :data:`~fednorm.engine.ckks.cores.CoreRequest`: a ``Refresh``
(a collective bootstrap) or a ``Decrypt`` (a collective decryption); the driver, and a
party's :class:`Replay`, match on it.  :func:`run_core` runs the core's
arithmetic between two requests in a worker thread (``RoleContext.run_sync``), so the
event loop stays free for the parties' frames, and answers each request with one round
of :class:`~fednorm.protocols.collective.ServerCrypto`, in the order the core asks.
:func:`planned_requests` runs a core on level counts instead: the requests it will make,
known from public sizes alone (a party's allowance for the server's step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.ckks.cores import Core, CoreRequest, Decrypt, Refresh, unexpected
from fednorm.engine.ckks.levels import Levels
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message
from fednorm.protocols.collective import (
    BootRequest,
    DecryptRequest,
    PartyCrypto,
    ServerCrypto,
)
from fednorm.protocols.collective.decryption import decryption_of, same_ciphertext
from fednorm.protocols.ledger import Allowance

T = TypeVar("T")


@dataclass(frozen=True)
class _Step:
    """What a core did between two requests: its next request, or its result."""

    request: CoreRequest | None = None
    done: bool = False
    value: Any = None


class _Resume:
    """Resumes a core with an answer (in a worker thread), up to its next request; it
    carries the core's name, so a tracer's worker-call events tell the cores apart."""

    def __init__(self, core: Core[Any]) -> None:
        self._core = core
        self.__qualname__ = getattr(core, "__qualname__", type(core).__name__)

    def __call__(self, answer: Any) -> _Step:
        try:
            return _Step(request=self._core.send(answer))
        except StopIteration as finished:
            return _Step(done=True, value=finished.value)


async def run_core(crypto: ServerCrypto, core: Core[T], phase: str, replayed: bool = False
                   ) -> T:
    """``core``'s result, its arithmetic off the event loop, each of its requests answered
    by the federation (a collective bootstrap for a ``Refresh``, a collective decryption
    for a ``Decrypt``);
    tracers see it as the protocol step ``phase``.  ``replayed``: the parties run the same
    core (:class:`Replay`), so each bootstrap's shares are forwarded to them."""
    advance, answer = _Resume(core), None
    with crypto.rc.phase(phase):
        while not (step := await crypto.rc.run_sync(advance, answer)).done:
            match step.request:
                case Decrypt(ct, width, noise):
                    answer = await crypto.decrypt(ct, width, noise)
                case Refresh(ct):
                    answer = await crypto.bootstrap(ct, forward=replayed)
                case request:
                    raise unexpected(request)
    return step.value


class Replay:
    """Party: the server's core for one phase, run here on inputs this party checked
    (every party's signed uploads, relayed; the bootstraps' signed shares, forwarded),
    so that each decryption or bootstrap the server asks for must be the very one this
    core asks for next — or the party refuses it (docs/LEAKAGE.md).

    A decryption's values never reach a party, so the core is answered with zeros: a
    core replayed here must not branch on what it decrypts before its last request.
    """

    def __init__(self, core: Core[Any]) -> None:
        self._advance = _Resume(core)
        self._answer: Any = None  # what resumes the core: the last request's outcome
        self._kept: Any = None  # what the party keeps of the request it is answering

    async def check(self, crypto: PartyCrypto, request: Message) -> None:
        """ProtocolError naming ``request`` unless it is the core's next request."""
        step = await crypto.rc.run_sync(self._advance, self._answer)
        expected = step.request
        noun = "decryption" if isinstance(request, DecryptRequest) else "bootstrap"
        if step.done:
            raise ProtocolError(f"{noun} request refused: this party's own run of the step "
                                "makes no more requests")
        if not isinstance(expected, Refresh | Decrypt):
            raise unexpected(expected)
        match request, expected:
            case DecryptRequest(), Decrypt(ct, width, noise):
                if request.declared_noise() != noise:
                    raise ProtocolError("decryption request refused: it declares another "
                                        "noise than this party's own run of the step")
                prepared = await crypto.rc.run_sync(decryption_of(crypto.ckks, noise).prepare, ct)
                if await crypto.rc.run_sync(same_ciphertext, prepared, request.ciphertext):
                    self._kept = np.zeros(width)
                    return
            case BootRequest(), Refresh(ct):
                rnd = await crypto.rc.run_sync(ckks.Bootstrap(crypto.ckks).prepare,
                                               crypto.joint, ct, request.index)
                if await crypto.rc.run_sync(same_ciphertext, rnd.c1, request.c1):
                    self._kept = rnd
                    return
        raise ProtocolError(f"{noun} request refused: its ciphertext is not the one this "
                            "party computes for the step from the signed uploads")

    async def answered(self, crypto: PartyCrypto, shares: list[ckks.BootstrapShare]
                       ) -> None:
        """The checked request was answered; for a bootstrap, ``shares`` are every party's
        checked share, which this party aggregates itself into the refreshed ciphertext."""
        if not isinstance(self._kept, ckks.BootRound):
            self._answer = self._kept
            return
        operation, rnd = ckks.Bootstrap(crypto.ckks), self._kept
        aggregate = await crypto.rc.run_sync(operation.aggregate_shares, crypto.joint, rnd,
                                             shares)
        self._answer = await crypto.rc.run_sync(operation.finalize, crypto.joint, rnd,
                                                aggregate)

    async def finish(self, crypto: PartyCrypto) -> Any:
        """The core's result, once the phase ended; ProtocolError if the server ended it
        before every request the core makes."""
        step = await crypto.rc.run_sync(self._advance, self._answer)
        if not step.done:
            raise ProtocolError("the server ended the step before the requests this "
                                "party's own run of it makes")
        return step.value


class Trusted:
    """Party: the server's step taken on trust (``FitOptions.replay`` off, in a simulation
    whose roles share one process): every request within the phase's allowance is
    answered unchecked, and each bootstrap's forwarded shares are read and dropped."""

    async def check(self, crypto: PartyCrypto, request: Message) -> None:
        return None

    async def answered(self, crypto: PartyCrypto, shares: list[ckks.BootstrapShare]
                       ) -> None:
        return None

    async def finish(self, crypto: PartyCrypto) -> None:
        return None


def planned_requests(core: Core[T]) -> tuple[T, Allowance]:
    """``core`` built on level counts (:class:`~fednorm.engine.ckks.LevelArithmetic`, its
    inputs :class:`~fednorm.engine.ckks.Levels`), run to the end: its result, and the
    decryptions and bootstraps it asked for — what the same core asks of the parties on
    ciphertexts, since a core's requests depend on levels only.  Each refresh is
    answered with a fresh ciphertext, each decryption with zeros."""
    advance, answer, asked = _Resume(core), None, Allowance()
    while not (step := advance(answer)).done:
        match step.request:
            case Decrypt(_, width, _):
                asked += Allowance(decryptions=1)
                answer = np.zeros(width)
            case Refresh():
                asked += Allowance(bootstraps=1)
                answer = Levels(0)
            case request:
                raise unexpected(request)
    return step.value, asked
