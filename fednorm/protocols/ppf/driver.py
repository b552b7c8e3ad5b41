"""Run a crypto core over the server's crypto: the one place where a PPF protocol's
encrypted computations meet the network.

A core (:mod:`fednorm.engine.ckks.cores`) is synchronous code that yields what it needs
from the federation: a ciphertext to refresh (a collective bootstrap) or a
:class:`Decrypt` request (a collective decryption).  :func:`run_core` runs the core's
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
import openfhe

from fednorm.engine.ckks.cores import Core
from fednorm.engine.ckks.levels import Levels
from fednorm.protocols.collective import ServerCrypto
from fednorm.protocols.ledger import Allowance

T = TypeVar("T")


@dataclass(frozen=True)
class Decrypt:
    """A core's request: the first ``width`` slots of ``ct``, decrypted collectively."""

    ct: openfhe.Ciphertext
    width: int


def decrypted(ct: openfhe.Ciphertext, width: int) -> Core[np.ndarray]:
    """Inside a core: ``values = yield from decrypted(ct, width)``."""
    return (yield Decrypt(ct, width))


@dataclass(frozen=True)
class _Step:
    """What a core did between two requests: its next request, or its result."""

    request: Any = None
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


async def run_core(crypto: ServerCrypto, core: Core[T], phase: str) -> T:
    """``core``'s result, its arithmetic off the event loop, each of its requests answered
    by the federation (a bootstrap for a ciphertext, a decryption for :class:`Decrypt`);
    tracers see it as the protocol step ``phase``."""
    advance, answer = _Resume(core), None
    with crypto.rc.phase(phase):
        while not (step := await crypto.rc.run_sync(advance, answer)).done:
            if isinstance(step.request, Decrypt):
                answer = await crypto.decrypt(step.request.ct, step.request.width)
            else:
                answer = await crypto.bootstrap(step.request)
    return step.value


def planned_requests(core: Core[T]) -> tuple[T, Allowance]:
    """``core`` built on level counts (:class:`~fednorm.engine.ckks.LevelArithmetic`, its
    inputs :class:`~fednorm.engine.ckks.Levels`), run to the end: its result, and the
    decryptions and bootstraps it asked for — what the same core asks of the parties on
    ciphertexts, since a core's requests depend on levels only.  Each refresh is
    answered with a fresh ciphertext, each decryption with zeros."""
    advance, answer, asked = _Resume(core), None, Allowance()
    while not (step := advance(answer)).done:
        if isinstance(step.request, Decrypt):
            asked += Allowance(decryptions=1)
            answer = np.zeros(step.request.width)
        else:
            asked += Allowance(bootstraps=1)
            answer = Levels(0)
    return step.value, asked
