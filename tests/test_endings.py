"""How a run ends, one row per way, over TCP with real processes: every role's exit
status and message.  One cause everywhere: the role that stopped is named, by every
other role, in the same words; no traceback, no "Broken pipe", no internal frame names,
and no "server dropped" when the server is fine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from federation_processes import STALL_PARTY, finish, nothing_written, start_party, start_server

from fednorm.transport.tls import init_certs

Spawn = Callable[..., subprocess.Popen[bytes]]
INTERRUPTED = 130
STALLER = 3  # party 3 stops answering when asked for its first decryption share


@dataclass(frozen=True)
class Ending:
    """What happens to ``victim`` once party 3 stalls, and what everyone then says."""

    victim: str  # "server" or "party 3"
    act: signal.Signals | None  # None: nothing is done to it, it stays stalled
    cause: str  # what every other role prints
    victim_says: str | None  # what the victim prints (None: killed, it says nothing)
    victim_exit: int
    timeout: float = 60.0  # the server's --timeout


ENDINGS = {
    "server SIGINT": Ending("server", signal.SIGINT, "server was interrupted",
                            "fednorm: interrupted", INTERRUPTED),
    "server SIGTERM": Ending("server", signal.SIGTERM, "server was interrupted",
                             "fednorm: interrupted", INTERRUPTED),
    "server SIGKILL": Ending("server", signal.SIGKILL, "server dropped: connection lost",
                             None, -signal.SIGKILL),
    "party SIGINT": Ending("party 3", signal.SIGINT, "party 3 was interrupted",
                           "fednorm: interrupted", INTERRUPTED),
    "party SIGTERM": Ending("party 3", signal.SIGTERM, "party 3 was interrupted",
                            "fednorm: interrupted", INTERRUPTED),
    "party SIGKILL": Ending("party 3", signal.SIGKILL, "party 3 dropped: connection lost",
                            None, -signal.SIGKILL),
    # 6 s: short enough to end the run well within the 30 s asserted below, long enough
    # that an honest party of a loaded machine does not stall first (at 3 s, party 2 did
    # once, beside a P = 100 run).
    "party stalls": Ending("party 3", None, "party 3 stalled: sent nothing for 6 s",
                           None, -signal.SIGKILL, timeout=6.0),
}


def assert_plain_words(err: str) -> None:
    """What a user reads: no traceback, no socket wording, no protocol internals."""
    for internal in ("Traceback", "Broken pipe", "Errno", "ckks.", "BaseExceptionGroup"):
        assert internal not in err, f"{internal!r} in {err!r}"


@pytest.mark.parametrize("name", list(ENDINGS))
def test_every_ending_gives_every_role_one_cause(
    name: str, spawn: Spawn, certs: Path, csvs: list[Path], tmp_path: Path
) -> None:
    ending = ENDINGS[name]
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    marker = tmp_path / "stalled"
    server, port = start_server(spawn, certs, "zscore", outs[0], "--privacy", "mhe",
                                "--preset", "test", "--algorithm", "paper",
                                "--timeout", ending.timeout)
    roles = {f"party {p}": start_party(spawn, port, p, csvs[p - 1], certs, outs[p],
                                       timeout=ending.timeout) for p in (1, 2)}
    roles["party 3"] = start_party(
        spawn, port, STALLER, csvs[STALLER - 1], certs, outs[STALLER], script=STALL_PARTY,
        timeout=ending.timeout, env={**os.environ, "FEDNORM_STALL_MARKER": str(marker),
                                     "FEDNORM_STALL_AT": "mhe-decrypt"})
    roles["server"] = server
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and server.poll() is None, finish(server)
        time.sleep(0.02)
    time.sleep(0.3)  # every role is inside the decryption now
    acted = time.monotonic()
    if ending.act is not None:
        roles[ending.victim].send_signal(ending.act)

    # The stalled party cannot read anything (it sleeps inside its computation): unless
    # it is the victim, it is not asked what it saw.
    others = [role for role in roles if role not in (ending.victim, "party 3")]
    said = {role: finish(roles[role], timeout=45) for role in others}
    assert time.monotonic() - acted < 30  # the cause arrives, no timeout is waited out
    for role, (code, err) in said.items():
        assert code == 1, (role, err)
        assert ending.cause in err, (role, ending.cause, err)
        assert_plain_words(err)
        if ending.victim != "server":
            assert "server dropped" not in err, (role, err)
    if ending.act is None:  # the stalled victim has nothing to say: it is stalled
        roles[ending.victim].kill()
        finish(roles[ending.victim])
        assert nothing_written(outs)
        return
    code, err = finish(roles[ending.victim])
    assert code == ending.victim_exit, err
    if ending.victim_says is not None:
        assert ending.victim_says in err and "was interrupted" not in err, err
        assert_plain_words(err)
    assert nothing_written(outs)


def test_a_party_whose_certificate_the_server_refuses_is_told_so_and_why(
    spawn: Spawn, certs: Path, csvs: list[Path], tmp_path: Path
) -> None:
    """Party 1 holds the federation's CA (it accepts the server) but a certificate of
    another CA: TLS 1.3 refuses it after the party's own handshake ended, so without the
    server's alert the party would see only a closed connection."""
    foreign = tmp_path / "foreign"
    init_certs(foreign, parties=1, hosts=[])
    mixed = tmp_path / "mixed"
    shutil.copytree(certs, mixed)
    for name in ("party-1.pem", "party-1.key"):
        shutil.copy(foreign / name, mixed / name)
    server, port = start_server(spawn, certs, "zscore", tmp_path / "server-out")
    party = start_party(spawn, port, 1, csvs[0], mixed, tmp_path / "party-out")
    code, err = finish(party)
    assert code == 1
    assert ("server refused the certificate this end presented: it was not issued by "
            "the CA the peer trusts") in err, err
    assert_plain_words(err)
    server.kill()
    assert "certificate verify failed" in finish(server)[1]


@pytest.mark.parametrize("after", [3.0, 3.7, 4.4])
def test_simulate_interrupted_says_so_without_a_traceback(spawn: Spawn, after: float) -> None:
    """The paper's z-score at the paper preset over 10 parties (an encrypted inverse with
    collective bootstraps) runs well past the interrupt, which lands at several points of
    the run: most of them inside a crypto call in a worker thread, which the process must
    not wait for and must not abort in (SIGABRT at interpreter exit)."""
    run = spawn("simulate", "--privacy", "mhe", "--preset", "paper", "--parties", "10",
                "--algorithm", "paper", "--quiet")
    time.sleep(after)
    assert run.poll() is None, finish(run)
    run.send_signal(signal.SIGINT)
    code, err = finish(run, timeout=30)
    assert code == INTERRUPTED, err
    assert err.strip().endswith("fednorm: interrupted"), err
    assert_plain_words(err)
