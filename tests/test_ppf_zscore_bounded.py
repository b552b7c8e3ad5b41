"""The paper's PPF z-score over the encrypted inverse with an agreed V_abs: every quotient
one decryption, flooded by the declared noise of a quotient of at most 2^16.

Read through the real party roles: the fused decryption carries the documented flooding
in every slot, a party refuses a request that declares another noise and clips a mean
beyond V_abs (on which the variance's bound rests), and the fit keeps the precision
:meth:`~fednorm.protocols.ppf.quotient.BoundedQuotients.value_sigma` states.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import trio
from deviating import deviating, zscore_server_with
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine.ckks import get_preset
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols import FitOptions, get_protocol
from fednorm.protocols.collective import ServerCrypto
from fednorm.protocols.normalizers import ZScoreNormalizer
from fednorm.protocols.ppf import noise, quotient
from fednorm.protocols.ppf import zscore as ppf
from fednorm.protocols.ppf.quotient import BoundedQuotients
from fednorm.session import check_options_used
from fednorm.sim.federation import run_federation, simulate

PARTIES = 3


def _bounded(vabs: tuple[float, ...]) -> FitOptions:
    return FitOptions(algorithm="paper", preset="test", vabs=vabs)


def _parts(seed: int) -> list[np.ndarray]:
    """Tiny, ordinary and near-the-bound features side by side (V_abs 0.01, 20, 1e3)."""
    rng = np.random.default_rng(seed)
    return [np.column_stack([rng.normal(1e-3, 1e-3, 9), rng.normal(5, 2, 9),
                             rng.uniform(-900, 900, 9)]) for _ in range(PARTIES)]


VABS = (0.01, 20.0, 1e3)


@st.composite
def bounded_federations(draw: st.DrawFn) -> tuple[list[np.ndarray], tuple[float, ...]]:
    """Parties (single rows among them) of features from 1e-3 to 1e6, and a V_abs per
    feature between the largest |x| and 64 times it."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    features = draw(st.integers(1, 4))
    scales = 10.0 ** rng.uniform(-3, 6, size=features)
    rows = [draw(st.integers(1, 12)) for _ in range(draw(st.integers(2, 5)))]
    parts = [rng.normal(rng.uniform(-2, 2, features) * scales, scales, (r, features))
             for r in rows]
    largest = np.abs(np.vstack(parts)).max(axis=0)
    return parts, tuple(largest * 2.0 ** rng.uniform(0, 6, size=features))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounded_federations())
def test_a_bounded_zscore_keeps_its_stated_precision(case) -> None:
    """Each mean within 6 σ of numpy's, σ the flooding's per feature (σ_μ); each
    variance within 6 σ_σ² plus (6 σ_μ)², what a mean that far off adds to Σ(x − μ)²."""
    parts, vabs = case
    pooled, options = np.vstack(parts), _bounded(vabs)
    fitted = simulate(parts, "zscore", "mhe", options).normalizer
    bounded = BoundedQuotients.of(options, pooled.shape[1])
    mean_sigma = bounded.value_sigma(options, len(parts), squared=False)
    var_sigma = bounded.value_sigma(options, len(parts), squared=True)
    assert np.all(np.abs(fitted.mean - pooled.mean(axis=0)) <= 6 * mean_sigma)
    assert np.all(np.abs(fitted.var - pooled.var(axis=0))
                  <= 6 * var_sigma + (6 * mean_sigma) ** 2)


def _reading(read: list, declare=None, reveal=None):
    """A server crypto that decrypts every slot of each quotient request and keeps them;
    ``declare``, if given, replaces the noise a request declares, ``reveal`` what the
    server goes on with."""

    class Reading(ServerCrypto):
        async def decrypt(self, ct, n, declared):
            values = await super().decrypt(ct, self.ckks.slots,
                                           declared if declare is None else declare(declared))
            read.append(values)
            return (values if reveal is None else reveal(values))[:n]

    return partial(zscore_server_with, cls=Reading)


def test_a_quotient_decryption_carries_the_declared_flooding() -> None:
    """The mean's decryption, every slot read by the server: the slots beyond the three
    features decrypt 0 / n_g = 0 plus all parties' flooding, whose standard deviation
    must be within 5 % of what the quotient's declared noise sizes (2^15 bits above
    the quotient's own noise, at s = 30; unflooded, it was 2^-30 of the scale)."""
    read: list[np.ndarray] = []
    options = _bounded(VABS)
    trio.run(partial(run_federation, deviating("zscore", server=_reading(read)),
                     _parts(3), options, timeout=120))
    bounded = BoundedQuotients.of(options, 3)
    expected = noise.fused_sigma(bounded.noise, get_preset(options.preset), PARTIES, options)
    beyond = read[0][3:]
    assert len(read) == 2 and beyond.size > 1000
    assert abs(np.std(beyond) / expected - 1) < 0.05
    assert abs(np.mean(beyond)) < 5 * expected / np.sqrt(beyond.size)


def test_a_quotient_request_declaring_no_flooding_is_refused() -> None:
    """A server that asks for the mean's decryption without flooding (the noise it
    declares, None) is refused by every party's own run of the step; it decrypts nothing."""
    read: list[np.ndarray] = []
    server = _reading(read, declare=lambda declared: None)
    with pytest.raises(ProtocolError, match="declares another noise"):
        trio.run(partial(run_federation, deviating("zscore", server=server), _parts(4),
                         _bounded(VABS), timeout=120))
    assert read == []


def test_a_mean_beyond_vabs_is_clipped_before_the_variance_is_taken() -> None:
    """The variance's flooding is sized for |μ| ≤ V_abs: a server that sends the parties a
    mean far beyond it (to make Σ(x − μ)² larger than the flooding covers) gets a
    variance request whose every value is still within 2^16, its bound: each party
    clipped the mean to ±V_abs (a flooded honest mean near V_abs can pass it too)."""
    read: list[np.ndarray] = []

    async def server(rc, options):
        crypto = await ppf.setup_server(rc, options.preset, **ppf.setup_arguments(options))
        sums = await rc.gather(ppf.EncryptedSums)
        total = await crypto.add_all({p: m.total for p, m in sums.items()})
        count = await crypto.add_all({p: m.count for p, m in sums.items()})
        inverse, _ = await ppf._count_inverse(crypto, sums, count, 3, options)
        await quotient.bounded_quotient(crypto, total, inverse, 3, options)
        await rc.broadcast(ppf.PpfMean(mean=np.full(3, 2.0**40)))
        squares = quotient.encrypted_quotient(crypto.ckks, await quotient.pooled_vector(crypto),
                                              inverse, options.max_count)
        bounded = BoundedQuotients.of(options, 3)
        read.append(await crypto.decrypt(squares, 3, bounded.noise))
        await rc.broadcast(ppf.PpfZScoreResult(mean=np.zeros(3), var=np.ones(3)))
        return ZScoreNormalizer(np.zeros(3), np.ones(3))

    options = _bounded(VABS)
    trio.run(partial(run_federation, deviating("zscore", server=server), _parts(5), options,
                     timeout=120))
    bounded = BoundedQuotients.of(options, 3)
    sigma = noise.fused_sigma(bounded.noise, get_preset(options.preset), PARTIES, options)
    assert np.abs(read[0]).max() <= 2.0**16 + 8 * sigma


def test_with_vabs_every_decryption_is_flooded_and_vabs_is_read() -> None:
    """With V_abs the paper's z-score over the encrypted inverse needs no consent to
    unflooded decryptions; with revealed counts V_abs would be ignored (refused)."""
    protocol = get_protocol("zscore", "mhe")
    assert protocol.unflooded(_bounded(VABS)) is False
    assert protocol.unflooded(FitOptions(algorithm="paper")) is True
    check_options_used([protocol], _bounded(VABS))
    with pytest.raises(InputError, match="ignore it"):
        check_options_used([protocol], replace(_bounded(VABS), reveal_counts=True))


def test_values_beyond_vabs_are_refused_before_any_work() -> None:
    parts = _parts(6)
    with pytest.raises(InputError, match="beyond the agreed bound"):
        simulate(parts, "zscore", "mhe", _bounded((0.01, 20.0, 100.0)))
