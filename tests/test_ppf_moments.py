"""The default PPF z-score (two flooded exact sums) against the pooled numpy oracle, and a
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
    """Every feature's mean and variance to 1e-12 of its own, however small beside the
    others."""
    fitted = simulate(parts, "zscore", "mhe", DEFAULT).normalizer
    pooled_rows = np.vstack(parts)
    mean, var = np.nanmean(pooled_rows, axis=0), np.nanvar(pooled_rows, axis=0)
    np.testing.assert_allclose(fitted.mean, mean, rtol=1e-12, atol=0)
    np.testing.assert_allclose(fitted.var, var, rtol=1e-12, atol=0)


@pytest.mark.parametrize("preset", ["test", pytest.param("paper", marks=pytest.mark.slow)])
def test_a_small_feature_beside_a_large_one_keeps_its_precision(preset: str) -> None:
    """Features of order 1e-6, 1e3 ± 1e-4 and 1e9 side by side: each mean and variance to
    1e-12 of its own.  Decrypted as slots, the small feature's variance came out ~1e-6
    off beside one of order 1e6 (the slots of a ciphertext decode together, each to
    ~2^-52 of the largest)."""
    rng = np.random.default_rng(1)
    parts = [np.column_stack([rng.normal(3e-6, 1e-6, 20), rng.normal(1e3, 1e-4, 20),
                              rng.normal(3e9, 1e9, 20)]) for _ in range(4)]
    fitted = simulate(parts, "zscore", "mhe", FitOptions(preset=preset)).normalizer
    pooled_rows = np.vstack(parts)
    np.testing.assert_allclose(fitted.mean, pooled_rows.mean(axis=0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(fitted.var, pooled_rows.var(axis=0), rtol=1e-12, atol=0)


class SumDecryptions(Tracer):
    """The widths of the pooled sums the server decrypts, in order."""

    FINALIZE = frozenset({ckks.Decryption.finalize.__qualname__,
                          ckks.CoefficientSumDecryption.finalize.__qualname__})

    def __init__(self) -> None:
        self.widths: list[int] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.role == "server" and event.call in self.FINALIZE:
            self.widths.append(len(event.result))


def test_two_flooded_sums_reveal_count_mean_and_variance() -> None:
    """n_g, Σx and Σx², then Σx and Σ(x − μ̃)² at per-feature powers of two: two sums
    where Algorithm 1 with revealed counts decrypts five."""
    parts = [np.random.default_rng(k).normal(4, 2, size=(5, 3)) for k in range(3)]
    decryptions = SumDecryptions()
    simulate(parts, "zscore", "mhe", DEFAULT, tracer=decryptions)
    paper = SumDecryptions()
    simulate(parts, "zscore", "mhe", FitOptions(preset="test", algorithm="paper",
                                                reveal_counts=True), tracer=paper)
    assert decryptions.widths == [9, 6] and len(paper.widths) == 5


def _cheat(scales: moments.PreciseScales) -> None:
    """Run the default z-score with a server that answers the parties' first sums with
    ``scales``; raise what the parties raise."""
    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **moments.setup_arguments(options))
        await pooled.exact_sum(
            crypto, lambda width: moments.first_exponents(crypto.ckks, options, width // 3))
        await rc.broadcast(scales)
        await rc.gather(pooled.EncryptedCoefficients)

    trio.run(run_federation, deviating("zscore", server=server),
             [np.full((4, 2), 3.0)] * 3, DEFAULT)


def _scales(center=(3.0, 3.0), mean=(100, 100), squares=(100, 100)) -> moments.PreciseScales:
    return moments.PreciseScales(center=np.array(center), mean=np.array(mean),
                                 squares=np.array(squares))


def test_a_party_refuses_scales_that_would_overflow_its_encoding() -> None:
    with pytest.raises(InputError, match="would pass what a coefficient upload holds"):
        _cheat(_scales(mean=(200, 100)))


@pytest.mark.parametrize("scales", [
    _scales(mean=(100.5, 100)), _scales(squares=(100, np.nan)), _scales(mean=(100, 5000)),
    _scales(mean=(1, 1, 1)), _scales(center=(3.0, np.inf)), _scales(center=(3.0,) * 3)])
def test_a_party_refuses_scales_it_cannot_use(scales) -> None:
    with pytest.raises(ProtocolError):
        _cheat(scales)
