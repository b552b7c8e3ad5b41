"""The default PPF z-score (three flooded sums) against the pooled numpy oracle, and a
server that sends what an honest one would not."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from deviating import deviating
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.tracing import CryptoEvent, Tracer
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import setup_server
from fednorm.protocols.ppf import moments, pooled
from fednorm.sim.federation import run_federation, simulate

DEFAULT = FitOptions(preset="test")


@st.composite
def federations(draw: st.DrawFn) -> list[np.ndarray]:
    """2–6 parties (single rows among them), 1–4 features whose magnitudes span 1e-6…1e6
    side by side, means of either sign or exactly 0, a value missing here and there."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    features = draw(st.integers(1, 4))
    scales = 10.0 ** rng.uniform(-6, 6, size=features)
    centers = rng.choice([-2.0, 0.0, 3.0], size=features) * scales
    rows = draw(st.lists(st.integers(1, 12), min_size=2, max_size=6))
    parts = [rng.normal(centers, scales, size=(n, features)) for n in rows]
    if draw(st.booleans()):
        for part in parts[1:]:
            part[rng.random(part.shape) < 0.2] = np.nan
    return parts


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations())
def test_the_default_zscore_equals_the_pooled_oracle(parts: list[np.ndarray]) -> None:
    """Every feature to 1e-12 of its own magnitude, however small beside the others."""
    fitted = simulate(parts, "zscore", "mhe", DEFAULT).normalizer
    pooled_rows = np.vstack(parts)
    mean, var = np.nanmean(pooled_rows, axis=0), np.nanvar(pooled_rows, axis=0)
    spread = np.sqrt(var)
    np.testing.assert_allclose(fitted.mean, mean, rtol=1e-12, atol=0)
    # σ² relative to itself, plus what a mean's own rounding leaves in it (mean ≫ σ).
    np.testing.assert_allclose(fitted.var, var, rtol=1e-11,
                               atol=1e-14 * float(np.max(np.abs(mean) * spread)))


class SumDecryptions(Tracer):
    """The widths of the pooled sums the server decrypts, in order."""

    def __init__(self) -> None:
        self.widths: list[int] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.role == "server" and event.call == ckks.Decryption.finalize.__qualname__:
            self.widths.append(int(np.asarray(event.result).size))


def test_three_flooded_sums_reveal_count_mean_and_variance() -> None:
    """n_g beside Σx, then Σ(x − μ̃)², then both again at per-feature scales: three sums
    where Algorithm 1 with revealed counts decrypts five."""
    parts = [np.random.default_rng(k).normal(4, 2, size=(5, 3)) for k in range(3)]
    decryptions = SumDecryptions()
    simulate(parts, "zscore", "mhe", DEFAULT, tracer=decryptions)
    paper = SumDecryptions()
    simulate(parts, "zscore", "mhe", FitOptions(preset="test", algorithm="paper",
                                                reveal_counts=True), tracer=paper)
    assert decryptions.widths == [6, 3, 6] and len(paper.widths) == 5


def _cheat(*broadcasts: moments.CoarseMean | moments.PreciseScales) -> None:
    """Run the default z-score with a server that answers the parties' sums with
    ``broadcasts``, one after each; raise what the parties raise."""
    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **moments.setup_arguments(options))
        for broadcast in broadcasts:
            await pooled.pooled_sum(crypto)
            await rc.broadcast(broadcast)
        await rc.gather(pooled.EncryptedSum)

    trio.run(run_federation, deviating("zscore", server=server),
             [np.full((4, 2), 3.0)] * 3, DEFAULT)


HONEST_START = moments.CoarseMean(mean=np.full(2, 3.0))


def test_a_party_refuses_scales_that_would_overflow_its_encoding() -> None:
    with pytest.raises(InputError, match="would pass 2\\^50"):
        _cheat(HONEST_START, moments.PreciseScales(mean=np.full(2, 2.0**60),
                                                   squares=np.ones(2)))


@pytest.mark.parametrize("scales", [
    moments.PreciseScales(mean=np.array([1.0, 0.0]), squares=np.ones(2)),
    moments.PreciseScales(mean=np.ones(2), squares=np.array([1.0, np.nan])),
    moments.PreciseScales(mean=np.ones(3), squares=np.ones(3))])
def test_a_party_refuses_scales_it_cannot_use(scales) -> None:
    with pytest.raises(ProtocolError):
        _cheat(HONEST_START, scales)


@pytest.mark.parametrize("mean", [np.array([3.0, np.inf]), np.full(3, 3.0)])
def test_a_party_refuses_a_coarse_mean_it_cannot_use(mean) -> None:
    with pytest.raises(ProtocolError):
        _cheat(moments.CoarseMean(mean=mean))
