"""The library inside an application's own event loop, trio or asyncio: the async API
fits while the loop keeps ticking, and the blocking API says what to call instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import trio

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.sim.federation import (
    SessionResult,
    simulate,
    simulate_async,
    simulate_session,
    simulate_session_async,
)

PARTIES = [np.random.default_rng(p).normal(p, 1 + p, (25, 3)) for p in range(3)]
PPF = ("zscore", "mhe", FitOptions(preset="test"))  # seconds of crypto: time to tick


def pooled_mean() -> np.ndarray:
    return np.concatenate(PARTIES).mean(axis=0)


class Ticks:
    """A task of the caller's own that counts how often its loop let it run."""

    count = 0

    async def run(self, sleep: Callable[[float], Awaitable[object]]) -> None:
        while True:
            await sleep(0.01)
            self.count += 1


async def test_from_trio_the_loop_keeps_ticking_while_a_ppf_fit_runs() -> None:
    ticks = Ticks()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticks.run, trio.sleep)
        result = await simulate_async(PARTIES, *PPF)
        nursery.cancel_scope.cancel()
    np.testing.assert_allclose(result.normalizer.mean, pooled_mean(), rtol=1e-6)
    assert ticks.count >= 10, ticks.count


def test_from_asyncio_the_loop_keeps_ticking_while_a_ppf_fit_runs() -> None:
    async def main() -> tuple[SessionResult, int]:
        ticks = Ticks()
        ticker = asyncio.create_task(ticks.run(asyncio.sleep))
        session = await simulate_session_async(PARTIES, ["zscore", "minmax"], "mhe",
                                               FitOptions(preset="test"))
        ticker.cancel()
        return session, ticks.count

    session, ticks = asyncio.run(main())
    np.testing.assert_allclose(session.results[0].normalizer.mean, pooled_mean(), rtol=1e-6)
    np.testing.assert_array_equal(session.results[1].normalizer.max,
                                  np.concatenate(PARTIES).max(axis=0))
    assert ticks >= 10, ticks


def test_the_blocking_api_inside_a_running_loop_says_what_to_call_instead() -> None:
    async def under_asyncio() -> None:
        simulate(PARTIES)

    with pytest.raises(InputError, match=r"running asyncio event loop: use "
                                         r"`await simulate_async\(\.\.\.\)`"):
        asyncio.run(under_asyncio())

    async def under_trio() -> None:
        simulate_session(PARTIES, ["zscore"], "plain")

    with pytest.raises(InputError, match=r"running trio event loop: use "
                                         r"`await simulate_session_async\(\.\.\.\)`"):
        trio.run(under_trio)
