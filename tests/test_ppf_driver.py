"""The crypto-core driver of the PPF protocols: a core's arithmetic runs in a worker
thread, off the event loop, inside a named protocol step, and its requests are answered
by the federation in order."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import trio

from fednorm.engine.ckks.cores import Decrypt, Refresh, decrypted, dry_run, pairwise
from fednorm.protocols.ppf.driver import Replay, planned_requests, run_core


class FakeContext:
    """A role context whose run_sync, like the real one, goes through a worker thread."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.phases: list[str] = []
        self.in_phase = False

    async def run_sync(self, fn, *args):
        assert self.in_phase
        self.calls.append(fn.__qualname__)
        return await trio.to_thread.run_sync(fn, *args)

    @contextmanager
    def phase(self, name):
        self.phases.append(name)
        self.in_phase = True
        try:
            yield
        finally:
            self.in_phase = False


class FakeCrypto:
    """Answers bootstraps and decryptions on the event loop, and logs them in order."""

    def __init__(self) -> None:
        self.rc = FakeContext()
        self.log: list[tuple[str, object, bool]] = []

    async def bootstrap(self, ct, forward=False):
        self.log.append(("bootstrap", ct, _on_main_thread()))
        return f"fresh {ct}"

    async def decrypt(self, ct, width, noise):
        self.log.append(("decrypt", (ct, width), _on_main_thread()))
        return [1.0] * width


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def test_a_core_runs_off_the_event_loop_and_its_requests_in_order() -> None:
    threads: list[bool] = []

    def core():
        threads.append(_on_main_thread())
        fresh = yield Refresh("a")
        threads.append(_on_main_thread())
        values = yield from decrypted(fresh, 2, None)
        threads.append(_on_main_thread())
        again = yield Refresh("b")
        return fresh, values, again

    crypto = FakeCrypto()
    result = await run_core(crypto, core(), "step")
    assert result == ("fresh a", [1.0, 1.0], "fresh b")
    assert threads == [False, False, False]  # every step of the arithmetic off the loop
    assert crypto.log == [("bootstrap", "a", True), ("decrypt", ("fresh a", 2), True),
                          ("bootstrap", "b", True)]
    # Three requests, then the step that returns; each worker call named after the core,
    # all inside the named protocol step.
    assert crypto.rc.calls == [core.__qualname__] * 4
    assert crypto.rc.phases == ["step"]


async def test_a_core_that_fails_fails_its_caller() -> None:
    def core():
        yield Refresh("a")
        raise ValueError("bad level")

    with pytest.raises(ValueError, match="bad level"):
        await run_core(FakeCrypto(), core(), "step")


def test_a_decryption_request_names_its_ciphertext_width_and_noise() -> None:
    request = decrypted("ct", 3, None).send(None)
    assert request == Decrypt("ct", 3, None)


def test_pairwise_prepares_every_item_each_round_then_combines_in_pairs() -> None:
    log: list[str] = []

    def prepare(item):
        log.append(f"prepare {item}")
        return (yield Refresh(item))

    def combine(a, b):
        log.append(f"combine {a} {b}")
        return a + b
        yield

    total, requests = dry_run(pairwise(["a", "b", "c"], combine, prepare), "x")
    # Round 1 prepares a, b, c (three requests, answered "x"); round 2 the two left.
    assert log == ["prepare a", "prepare b", "prepare c", "combine x x",
                   "prepare xx", "prepare x", "combine x x"]
    assert (total, requests) == ("xx", 5)


def test_every_driver_refuses_a_yield_that_is_not_a_core_request() -> None:
    """A core's requests are one typed union: a bare ciphertext (what cores yielded for
    a refresh before) is not taken for a bootstrap by the server's driver, a party's
    replay or the request planner."""
    def core():
        yield "a ciphertext"

    with pytest.raises(TypeError, match="yielded str, not a Refresh or a Decrypt"):
        trio.run(run_core, FakeCrypto(), core(), "step")
    with pytest.raises(TypeError, match="yielded str"):
        planned_requests(core())
    party = FakeCrypto()
    party.rc.in_phase = True  # a party checks a request inside the server's phase
    with pytest.raises(TypeError, match="yielded str"):
        trio.run(Replay(core()).check, party, object())
