"""τ, the flooded decryptions one joint key serves: a session that needs more is refused
before any key is made, by every runner; a protocol that declares no count is stopped by
the parties at τ + 1.  The counts are read from the frames a party receives."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_runs import run_cli

from fednorm.engine.errors import InputError, ProtocolError, SessionRefused
from fednorm.engine.tracing import FrameEvent
from fednorm.multihost.config import ServerConfig
from fednorm.multihost.server import Server
from fednorm.protocols import get_protocol
from fednorm.protocols.base import FitOptions
from fednorm.protocols.decryptions import refuse_decryptions_beyond, session_decryptions
from fednorm.session import SessionPlan
from fednorm.sim.federation import run_federation, simulate, simulate_session

TEST = FitOptions(preset="test")
DECRYPTION_REQUESTS = ("ckks.decrypt_sum_request", "ckks.decrypt_product_request")
DEFAULTS = ("zscore", "minmax", "robust", "yeojohnson")


def _parts() -> list[np.ndarray]:
    """Three parties, three features: one with a party of one row, one feature empty at
    a party, values of either sign and of very different magnitudes."""
    rng = np.random.default_rng(7)
    parts = [rng.normal(size=(n, 3)) * [1.0, 1e6, 1e-6] for n in (12, 1, 9)]
    parts[2][:, 2] = np.nan
    return parts


def _declared(method: str, options: FitOptions = TEST, width: int = 3) -> int:
    return session_decryptions([get_protocol(method, "mhe")], options, width)[get_protocol(
        method, "mhe").name]


def _requests_to_party_1(frames: list[FrameEvent]) -> int:
    return sum(1 for f in frames if f.role == "party 1" and f.direction == "received"
               and f.kind in DECRYPTION_REQUESTS)


@pytest.mark.parametrize("method", DEFAULTS)
def test_a_default_protocol_runs_on_exactly_the_decryptions_it_declares(method: str) -> None:
    """Keys declared for the protocol's own count serve the whole run, and the flooded
    decryptions a party is asked for stay within it: exactly it for z-score and MinMax,
    whose rounds are fixed; at most it for the searches that may end early."""
    frames: list[FrameEvent] = []
    declared = _declared(method)
    simulate(_parts(), method, "mhe", replace(TEST, flooding_decryptions=declared),
             party_tracer=SimpleNamespace(frame=frames.append))
    asked = _requests_to_party_1(frames)
    assert 0 < asked <= declared, (asked, declared)
    if method in ("zscore", "minmax"):
        assert asked == declared


@pytest.mark.parametrize("method", DEFAULTS)
def test_a_session_that_needs_more_than_tau_stops_before_any_frame(method: str) -> None:
    """One decryption short: refused naming both numbers, before a single frame (the
    default Yeo-Johnson of 100 parties used to stop only after 80 minutes of work)."""
    frames: list[FrameEvent] = []
    declared = _declared(method)
    with pytest.raises(InputError, match=rf"up to {declared} flooded decryptions on 3 "
                       rf"features .* τ = {declared - 1} .* declare at least {declared}"):
        simulate(_parts(), method, "mhe", replace(TEST, flooding_decryptions=declared - 1),
                 tracer=SimpleNamespace(frame=frames.append))
    assert frames == []


def test_the_methods_of_one_session_share_the_keys_decryptions() -> None:
    """Two methods on one key setup: their counts add up, and the error says so."""
    both = _declared("zscore") + _declared("minmax")
    with pytest.raises(InputError, match=rf"up to {both} .*zscore-mhe 3, minmax-mhe "
                       r"\d+\).*separate sessions"):
        simulate_session(_parts(), ["zscore", "minmax"], "mhe",
                 replace(TEST, flooding_decryptions=both - 1))


def test_wide_data_needs_more_rounds_and_chunks() -> None:
    """The count follows the features: fewer thresholds per bracket and round, and
    chunks once the brackets leave fewer than 15 slots each."""
    counts = [_declared("minmax", TEST, width) for width in (1, 30, 600)]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert _declared("yeojohnson", FitOptions(preset="paper"), 13) == 25  # bits allow 21
    assert _declared("zscore", TEST, 600) == 3


async def test_a_protocol_that_declares_no_count_is_stopped_by_the_parties_past_tau(
) -> None:
    """The parties count every flooded share (the paper's algorithms declare no count):
    keys declared for 2 refuse z-score's third sum, mid-run."""
    zscore = get_protocol("zscore", "mhe")
    undeclared = replace(zscore, kinds={name: replace(kind, flooded_decryptions=None)
                                        for name, kind in zscore.kinds.items()})
    with pytest.raises(ProtocolError, match="more than the 2 flooded decryptions"):
        await run_federation(undeclared, _parts(), replace(TEST, flooding_decryptions=2))


def test_a_multihost_server_that_knows_the_columns_refuses_at_start(tmp_path: Path) -> None:
    config = ServerConfig("127.0.0.1", 0, parties=3, methods=("yeojohnson",),
                          certs=tmp_path, privacy="mhe", features=("a", "b", "c"),
                          options=replace(TEST, flooding_decryptions=20))
    with pytest.raises(InputError, match="up to 25 flooded decryptions on 3 features"):
        Server(config)


def test_a_party_refuses_a_session_its_keys_cannot_serve_on_its_own_columns() -> None:
    """Where the server does not know the columns (a Flower ServerApp without
    ``features``), or does not check: the party's refusal names the numbers, no data."""
    plan = SessionPlan(("zscore", "robust"), "mhe")
    options = replace(TEST, flooding_decryptions=10)
    with pytest.raises(SessionRefused, match=r"^party 2 refused the session: this session "
                       r"makes up to 14 flooded decryptions on 3 features"):
        refuse_decryptions_beyond(2, plan.protocols, options, 3)
    refuse_decryptions_beyond(2, plan.protocols, replace(options, flooding_decryptions=14), 3)


def test_the_cli_refuses_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--dataset", "bcw", "--parties", "3", "--method", "yeojohnson",
            "--privacy", "mhe", "--preset", "test", "--flooding-decryptions", "20"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "--flooding-decryptions" in err, err
    needed = int(re.search(r"declare at least (\d+)", err).group(1))
    assert needed == _declared("yeojohnson", TEST, 30)  # BCW's 30 features
