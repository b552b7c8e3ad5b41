"""τ, the flooded decryptions one joint key serves: a session that needs more is refused
before any key is made, by every runner; a protocol that declares no count is stopped by
the parties past its budget; a product of many parties' bits, flooded for fewer
decryptions, spends more of it.  The counts are read from the frames a party receives."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fednorm.engine.ckks import Flooding, ProductFlooding, get_preset
from fednorm.engine.errors import InputError, ProtocolError, SessionRefused
from fednorm.engine.tracing import FrameEvent
from fednorm.multihost.config import ServerConfig
from fednorm.multihost.server import Server
from fednorm.protocols import get_protocol
from fednorm.protocols.base import FitOptions, Protocol
from fednorm.protocols.collective import PartyCrypto
from fednorm.protocols.collective.sums import product_decryptions
from fednorm.protocols.decryptions import (
    budget_spent,
    decryption_count,
    least_decryptions,
    refuse_decryptions_beyond,
    require_decryptions_within,
    session_decryptions,
)
from fednorm.protocols.ledger import Allowance
from fednorm.session import SessionPlan
from fednorm.sim.federation import run_federation, simulate, simulate_session

TEST = FitOptions(preset="test")
DECRYPTION_REQUESTS = ("ckks.decrypt_sum_request", "ckks.decrypt_product_request",
                       "ckks.decrypt_coefficients_request")
DEFAULTS = ("zscore", "minmax", "robust", "yeojohnson")


def _parts() -> list[np.ndarray]:
    """Three parties, three features: one with a party of one row, one feature empty at
    a party, values of either sign and of very different magnitudes."""
    rng = np.random.default_rng(7)
    parts = [rng.normal(size=(n, 3)) * [1.0, 1e6, 1e-6] for n in (12, 1, 9)]
    parts[2][:, 2] = np.nan
    return parts


def _declared(method: str, options: FitOptions = TEST, width: int = 3) -> int:
    return decryption_count(_allowance(method, options, width))


def _allowance(method: str, options: FitOptions = TEST, width: int = 3) -> Allowance:
    protocol = get_protocol(method, "mhe")
    return session_decryptions([protocol], options, width)[protocol.name]


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
                       rf"features .* τ = {declared - 1} serve: declare at least "
                       rf"τ = {declared} "):
        simulate(_parts(), method, "mhe", replace(TEST, flooding_decryptions=declared - 1),
                 tracer=SimpleNamespace(frame=frames.append))
    assert frames == []


def test_the_methods_of_one_session_share_the_keys_decryptions() -> None:
    """Two methods on one key setup: their counts add up, and the error says so."""
    both = _declared("zscore") + _declared("minmax")
    with pytest.raises(InputError, match=rf"up to {both} .*zscore-mhe 2 coefficient sums, "
                       r"minmax-mhe \d+ coefficient sums\).*separate sessions"):
        simulate_session(_parts(), ["zscore", "minmax"], "mhe",
                 replace(TEST, flooding_decryptions=both - 1))


def test_wide_data_needs_more_rounds_and_chunks() -> None:
    """The count follows the features: fewer thresholds per bracket and round, and
    chunks once the brackets leave fewer than 15 slots each."""
    counts = [_declared("minmax", TEST, width) for width in (1, 30, 600)]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert _allowance("yeojohnson", FitOptions(preset="paper"), 30) \
        == Allowance(sums=10, coefficients=8)  # BCW: its MinMax, the summary, 9 λ rounds
    assert _declared("zscore", TEST, 600) == 2


def test_a_product_spends_the_share_of_the_budget_it_is_flooded_for() -> None:
    """1/τ per sum, 1/τ_p per product: 8 products flooded for 21 (100 parties' bits at the
    paper preset) and 18 sums spend 8/21 + 18/1024 of the default budget; keys declared
    for 29 are refused (8/21 + 18/29 > 1), for 30 they serve.  The default protocols
    multiply nothing, so a default session of 100 parties needs only its own count."""
    count = Allowance(sums=18, products=8)
    assert budget_spent(count, 1024, 21) == Fraction(8, 21) + Fraction(18, 1024)
    assert budget_spent(count, 20, 21) == Fraction(26, 20)  # τ ≤ τ_p: every share alike
    assert least_decryptions(count, 21) == 30
    assert budget_spent(count, 29, 21) > 1 >= budget_spent(count, 30, 21)
    assert least_decryptions(Allowance(products=21), 21) == 21
    assert least_decryptions(Allowance(products=22), 21) is None
    plan = SessionPlan(("zscore", "robust", "yeojohnson"), "mhe").protocols
    paper = FitOptions(preset="paper")
    total = sum(session_decryptions(plan, paper, 30).values(), Allowance())
    assert total.products == 0 and least_decryptions(total, 21) == decryption_count(total)
    require_decryptions_within(plan, replace(paper, flooding_decryptions=decryption_count(
        total)), 30, 100)


def test_products_flooded_for_fewer_decryptions_read_exactly_and_are_refused_past_it(
) -> None:
    """Ten parties at the test preset: the paper z-score's presence product flooded for
    τ = 1024 at s = 42 would drown the bits, flooded for the 21 decryptions that keep them
    readable it does not: the z-score is numpy's.  At s = 46 a product is flooded for a
    single decryption and so spends the keys' whole budget: a party refuses the next
    flooded share."""
    parts = [np.arange(4.0).reshape(2, 2) * (p + 1) - p for p in range(10)]
    paper = replace(TEST, algorithm="paper")
    fitted = simulate(parts, "zscore", "mhe", replace(paper, flooding_bits=42)).normalizer
    np.testing.assert_allclose(fitted.mean, np.vstack(parts).mean(axis=0), rtol=1e-6)
    preset = get_preset("test")
    tau_p = product_decryptions(preset, 10, 46, 1024)
    held = SimpleNamespace(flooding_spent=Fraction(0), flooding_decryptions=1024,
                           product_decryptions=tau_p)
    party = SimpleNamespace(held=held)
    PartyCrypto.count_flooded_share(party, ProductFlooding(preset.ring_dim, 10, 10, 46, tau_p))
    with pytest.raises(ProtocolError, match=r"than the τ = 1024 these keys were declared "
                       r"for \(a share of a product of bits counts as 1.02e\+03 of them\)"):
        PartyCrypto.count_flooded_share(party, Flooding(preset.ring_dim, 10, 10, 46))
    assert tau_p == 1


def _undeclared(method: str) -> Protocol:
    """The registered protocol with no count declared, as the paper's algorithms."""
    protocol = get_protocol(method, "mhe")
    return replace(protocol, kinds={name: replace(kind, flooded_decryptions=None)
                                    for name, kind in protocol.kinds.items()})


async def test_a_protocol_that_declares_no_count_is_stopped_by_the_parties_past_tau(
) -> None:
    """The parties count every flooded share (the paper's algorithms declare no count):
    keys declared for 1 refuse z-score's second sum, mid-run."""
    with pytest.raises(ProtocolError, match="more flooded decryptions than the τ = 1 these "
                       r"keys were declared for$"):
        await run_federation(_undeclared("zscore"), _parts(),
                             replace(TEST, flooding_decryptions=1))


def test_a_multihost_server_that_knows_the_columns_refuses_at_start(tmp_path: Path) -> None:
    config = ServerConfig("127.0.0.1", 0, parties=3, methods=("yeojohnson",),
                          certs=tmp_path, privacy="mhe", features=("a", "b", "c"),
                          options=replace(TEST, flooding_decryptions=10))
    with pytest.raises(InputError, match="up to 16 flooded decryptions on 3 features"):
        Server(config)


def test_a_party_refuses_a_session_its_keys_cannot_serve_on_its_own_columns() -> None:
    """Where the server does not know the columns (a Flower ServerApp without
    ``features``), or does not check: the party's refusal names the numbers, no data."""
    plan = SessionPlan(("zscore", "robust"), "mhe")
    options = replace(TEST, flooding_decryptions=10)
    with pytest.raises(SessionRefused, match=r"^party 2 refused the session: this session "
                       r"makes up to 13 flooded decryptions on 3 features"):
        refuse_decryptions_beyond(2, plan.protocols, options, 3, 3)
    refuse_decryptions_beyond(2, plan.protocols, replace(options, flooding_decryptions=13), 3,
                              3)
