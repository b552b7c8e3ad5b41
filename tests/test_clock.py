"""A process stopped while its roles wait does not time them out: trio's clock in a
fednorm run counts only the time the process ran (:mod:`fednorm.engine.clock`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fednorm.engine.clock import STOPPED_AFTER, TICK, RunningClock, run_trio
from fednorm.engine.errors import ProtocolTimeout
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.transport.memory import link_pair

REPO = Path(__file__).resolve().parents[1]

# Plain z-score federations back to back, each role waiting at most 2 s for a frame,
# for 4 s of the process's own CPU time (stopped time is not CPU time).
FEDERATIONS = """
import time
import numpy as np
from fednorm.sim.federation import simulate
rng = np.random.default_rng(0)
parts = [rng.normal(size=(40, 3)) for _ in range(3)]
print("ready", flush=True)
start, runs = time.process_time(), 0
while time.process_time() - start < 4.0:
    simulate(parts, "zscore", "plain", timeout=2.0)
    runs += 1
print("done", runs, flush=True)
"""


def test_a_federation_stopped_longer_than_its_timeout_finishes(tmp_path):
    """SIGSTOP three times for 3 s, more than the roles' 2 s timeout, while federations
    run: every run finishes (on the monotonic clock, the role waiting at the stop timed
    out on waking)."""
    script = tmp_path / "federations.py"
    script.write_text(FEDERATIONS, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(3):
            time.sleep(0.4)
            child.send_signal(signal.SIGSTOP)
            time.sleep(3.0)
            child.send_signal(signal.SIGCONT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err[-2000:]
    assert out.startswith("done")


@message("test.clock.silence")
class Silence(Message):
    n: int


def test_a_silent_peer_still_times_out_on_the_running_clock():
    """The clock leaves out stops, not silence: a party that never sends times out the
    server after its 1.5 s timeout, counted in the ticks the process runs."""
    server_end, _party_end = link_pair(SERVER, 1)
    server = RoleContext(SERVER, {1: server_end}, "s1", protocol="proto", timeout=1.5)
    started = time.monotonic()
    with pytest.raises(ProtocolTimeout, match="party 1"):
        run_trio(server.receive, 1, Silence)
    assert 1.4 < time.monotonic() - started < 10.0


class Source:
    """Readings the test sets, in seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_gap_longer_than_a_stop_is_left_out_but_one_tick():
    source = Source()
    clock = RunningClock(source)
    clock.start_clock()
    source.now += 0.4
    assert clock.current_time() == pytest.approx(100.4)
    source.now += STOPPED_AFTER  # not more than a stop: a long sleep, kept
    assert clock.current_time() == pytest.approx(100.4 + STOPPED_AFTER)
    source.now += 300.0  # stopped for 300 s: one tick of it counts
    assert clock.current_time() == pytest.approx(100.4 + STOPPED_AFTER + TICK)
    assert clock.skipped == pytest.approx(300.0 - TICK)


def test_the_loop_never_sleeps_past_a_tick():
    source = Source()
    clock = RunningClock(source)
    clock.start_clock()
    assert clock.deadline_to_sleep_time(source.now + 60.0) == TICK
    assert clock.deadline_to_sleep_time(source.now + TICK / 4) == pytest.approx(TICK / 4)
    assert clock.deadline_to_sleep_time(source.now - 5.0) == 0.0
