"""Crypto cores: multi-step encrypted computations as synchronous code without I/O.

A deep computation (an inverse, a comparison, a tree of them) runs out of levels and
needs the federation to refresh a ciphertext (a collective bootstrap: a network round).
Written as a generator, it *yields* a :class:`Refresh` of the ciphertext and is resumed
with the fresh one; it never awaits anything, so the caller decides where the arithmetic
runs (the PPF protocols run it in a worker thread, off the event loop, and answer each
request with a collective round: :mod:`fednorm.protocols.ppf.driver`).  A protocol's
core also yields :class:`Decrypt` (a collective decryption; the engine's own cores
never do): the two make :data:`CoreRequest`, which every driver matches on.

``x = yield from core`` composes cores; :func:`drive` runs one with an async ``refresh``
callback, on the caller's task (tests, local runs).  A core touches ciphertexts only
through its context, so it also runs on level counts
(:class:`~fednorm.engine.ckks.levels.LevelArithmetic`): the same schedule, no crypto.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.flooding import DecryptionNoise
from fednorm.engine.ckks.levels import LevelBudgetError, Refresher
from fednorm.engine.errors import InputError

T = TypeVar("T")



@dataclass(frozen=True)
class Refresh:
    """A core's request: ``ct`` at the full level budget (a collective bootstrap); the
    core is resumed with the fresh ciphertext (on level counts: a count)."""

    ct: Any


@dataclass(frozen=True)
class Decrypt:
    """A core's request: the first ``width`` slots of ``ct``, decrypted collectively; the
    core is resumed with the values.  ``noise``: what the step declares of the noise it
    decrypts, so that every party floods its share by it; ``None`` where flooding would
    leave no useful precision (each such decryption is named in docs/LEAKAGE.md)."""

    ct: openfhe.Ciphertext
    width: int
    noise: DecryptionNoise | None


CoreRequest = Refresh | Decrypt
"""What a core may yield."""

Core = Generator[CoreRequest, Any, T]
r"""A crypto core returning T: yields :data:`CoreRequest`\ s, is resumed with answers."""


def decrypted(ct: openfhe.Ciphertext, width: int, noise: DecryptionNoise | None
              ) -> Core[Any]:
    """Inside a core: ``values = yield from decrypted(ct, width, noise)``."""
    return (yield Decrypt(ct, width, noise))


def unexpected(request: object) -> TypeError:
    """The error for a yielded value that is not a :data:`CoreRequest`."""
    return TypeError(f"a crypto core yielded {type(request).__name__}, not a Refresh or a "
                     "Decrypt")


def refreshed(ctx: CkksContext, ct: openfhe.Ciphertext, needed: int
              ) -> Core[openfhe.Ciphertext]:
    """``ct`` if it has ``needed`` levels left, else ``ct`` refreshed (one request).

    A ciphertext already past the budget cannot be refreshed (bootstrapping it would
    return garbage), so that is a :class:`LevelBudgetError`, as is a refresh that does
    not restore enough levels.
    """
    budget = ctx.level_budget
    if not 0 <= needed <= budget:
        raise InputError(f"needed={needed} levels, but the budget is {budget}")
    left = ctx.levels_left(ct)
    if left >= needed:
        return ct
    if left < 0:
        raise LevelBudgetError(
            f"ciphertext consumed {ctx.consumed(ct)} levels, past the bootstrap budget "
            f"{budget}: it can no longer be refreshed")
    fresh = yield Refresh(ct)
    if ctx.levels_left(fresh) < needed:
        raise LevelBudgetError(
            f"refresh returned a ciphertext with {ctx.levels_left(fresh)} levels left, "
            f"{needed} needed")
    return fresh


def fully_refreshed(ctx: CkksContext, ct: openfhe.Ciphertext) -> Core[openfhe.Ciphertext]:
    """``ct`` refreshed to the full budget (one request), whatever it has left."""
    if ctx.levels_left(ct) < 0:
        raise LevelBudgetError("ciphertext is past the bootstrap budget")
    fresh = yield Refresh(ct)
    if ctx.consumed(fresh) != 0:
        raise LevelBudgetError("refresh did not return a fresh ciphertext")
    return fresh


async def drive(core: Core[T], refresh: Refresher) -> T:
    """Run ``core`` here, answering each :class:`Refresh` with ``await refresh(ct)``
    (an engine core asks for nothing else)."""
    try:
        request = core.send(None)
        while True:
            match request:
                case Refresh(ct):
                    request = core.send(await refresh(ct))
                case _:
                    raise unexpected(request)
    except StopIteration as done:
        return done.value


async def ensure_levels(ctx: CkksContext, ct: openfhe.Ciphertext, needed: int,
                        refresh: Refresher) -> openfhe.Ciphertext:
    """:func:`refreshed` with the refresh answered by ``await refresh(ct)``."""
    return await drive(refreshed(ctx, ct, needed), refresh)


def dry_run(core: Core[T], answer: Any) -> tuple[T, int]:
    """Run a core answering every request with ``answer`` (a symbolic run, e.g. on level
    counts): its result, and how many requests it made."""
    requests = 0
    try:
        core.send(None)
        while True:
            requests += 1
            core.send(answer)
    except StopIteration as done:
        return done.value, requests


def done(value: T) -> Core[T]:
    """A core that needs nothing from the federation: ``value`` at once."""
    return value
    yield  # unreachable: it only makes this function a generator


def pairwise(items: Sequence[T], combine: Callable[[T, T], Core[T]],
             prepare: Callable[[T], Core[T]] | None = None) -> Core[T]:
    """Reduce ``items`` pairwise in ⌈log2 n⌉ rounds (an odd one out waits for the next
    round); ``prepare`` runs on every item at the start of each round (a refresh)."""
    if not items:
        raise InputError("need at least one item")
    level = list(items)
    while len(level) > 1:
        if prepare is not None:
            prepared = []
            for item in level:
                prepared.append((yield from prepare(item)))
            level = prepared
        pairs = []
        for i in range(0, len(level) - 1, 2):
            pairs.append((yield from combine(level[i], level[i + 1])))
        level = pairs + level[len(level) - len(level) % 2:]
    return level[0]
