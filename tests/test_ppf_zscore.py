"""PPF z-score against the pooled numpy oracle, its leakage ledger, and bad shares."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import trio
from deviating import deviating, zscore_server_with
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.runtime import SERVER
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import (
    PartyKeyState,
    ServerCrypto,
    reusable,
    serve_until,
    setup_party,
    shared_context,
)
from fednorm.protocols.collective.signatures import keyring_of
from fednorm.protocols.collective.sums import InputUpload, sign_upload
from fednorm.protocols.ppf import quotient
from fednorm.protocols.ppf import zscore as ppf
from fednorm.protocols.ppf.keys import key_needs
from fednorm.sim.federation import run_federation, simulate, simulate_session

TEST = FitOptions(algorithm="paper", preset="test")
# Stated CKKS tolerance: the encrypted inverse is within 2.3e-7 relative over
# [1, 2^20]; decryption noise and encoding add ~1e-9 relative after the two-pass
# rescaling, so 1e-6 relative (plus float64 rounding) bounds every mean and variance.
RTOL = 1e-6


@st.composite
def ppf_federations(draw: st.DrawFn) -> list[np.ndarray]:
    parties = draw(st.integers(2, 10))
    features = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Magnitudes 1e-3…1e6 across examples; within one federation the features stay within
    # 1e3 of each other (variances within 2^40: the supported dynamic range, see the ledger).
    scales = 10.0 ** (rng.uniform(-3, 6) + rng.uniform(-1.5, 1.5, size=features))
    rows = [int(r) for r in rng.integers(1, 25, size=parties)]
    parts = [rng.normal(rng.uniform(-2, 2, size=features) * scales, scales, size=(r, features))
             for r in rows]
    if draw(st.booleans()):
        for part in parts:
            part[rng.random(part.shape) < 0.1] = np.nan
        for part in parts:  # keep at least one value per feature in the federation
            part[0] = np.where(np.isnan(part[0]), scales, part[0])
    return parts


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ppf_federations(), st.booleans())
def test_ppf_zscore_matches_pooled_mean_and_variance(parts, reveal_counts) -> None:
    pooled = np.vstack(parts)
    options = FitOptions(algorithm="paper", preset="test", reveal_counts=reveal_counts)
    fitted = simulate(parts, "zscore", "mhe", options).normalizer
    np.testing.assert_allclose(fitted.mean, np.nanmean(pooled, axis=0), rtol=RTOL,
                               atol=1e-12 * np.nanmax(np.abs(pooled)))
    np.testing.assert_allclose(fitted.var, np.nanvar(pooled, axis=0), rtol=RTOL)


@pytest.mark.slow
def test_ppf_zscore_at_the_paper_preset_with_ten_parties() -> None:
    from fednorm.sim.datasets import load_dataset
    from fednorm.sim.partition import partition

    data = load_dataset("bcw")
    parts = [p.X for p in partition(data.X, data.y, 10, "label:0.5", seed=0)]
    result = simulate(parts, "zscore", "mhe", FitOptions(algorithm="paper", preset="paper"))
    np.testing.assert_allclose(result.normalizer.mean, data.X.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(result.normalizer.var, data.X.var(axis=0), rtol=RTOL)


# -- keys reused across protocols of one session ----------------------------------------
def _kinds(report) -> set[str]:
    return {kind for stats in report.traffic.values() for kind in stats.by_kind}


def test_a_session_generates_the_joint_keys_once() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.normal(5, 2, size=(10, 3)) for _ in range(3)]
    pooled = np.vstack(parts)
    options = FitOptions(preset="test")
    session = simulate_session(parts, ["zscore", "robust"], "mhe", options)
    zscore, robust = (result.normalizer for result in session.results)
    np.testing.assert_allclose(zscore.mean, pooled.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(zscore.var, pooled.var(axis=0), rtol=RTOL)
    np.testing.assert_allclose(robust.median, np.median(pooled, axis=0), rtol=1e-12)
    for result in session.results:
        assert "ckks.lead_keys" not in _kinds(result.report)
    assert "ckks.lead_keys" in _kinds(session.setup)
    # Sums only: neither method multiplies, so no relinearization round.
    assert "ckks.relin_round2" not in _kinds(session.setup)
    alone = simulate(parts, "zscore", "mhe", options).report
    first = session.results[0].report
    assert first.bytes_total + session.setup.bytes_total == pytest.approx(alone.bytes_total,
                                                                          rel=0.01)
    assert first.rounds < alone.rounds


def test_one_key_setup_covers_every_method_of_a_session() -> None:
    options = FitOptions(algorithm="paper", preset="test")
    needs = key_needs(["zscore", "minmax", "yeojohnson"], options)
    assert needs["relinearize"] and len(needs["rotations"]) == 2  # MinMax's and YJ's blocks
    assert key_needs(["zscore"], FitOptions(algorithm="paper", reveal_counts=True)) == {
        "relinearize": False, "rotations": ()}
    rng = np.random.default_rng(8)
    parts = [rng.normal(5, 2, size=(12, 2)) for _ in range(3)]
    pooled = np.vstack(parts)
    session = simulate_session(parts, ["zscore", "minmax"], "mhe", replace(options, vabs=(16.0,)))
    zs, mm = (r.normalizer for r in session.results)
    np.testing.assert_allclose(zs.mean, pooled.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(mm.min, pooled.min(axis=0), rtol=1e-3)
    np.testing.assert_allclose(mm.max, pooled.max(axis=0), rtol=1e-3)
    for result in session.results:
        assert "ckks.lead_keys" not in _kinds(result.report)
    assert "ckks.relin_round2" in _kinds(session.setup)


def test_keys_are_reused_only_when_they_cover_the_request() -> None:
    from types import SimpleNamespace

    context = shared_context("test")
    held = ckks.HeldKeys(context, None, relinearized=False, rotations=(4,))
    rc = SimpleNamespace(held_keys=held)
    assert reusable(rc, ckks.HeldKeys, "test", False, (4,)) is held
    assert reusable(rc, ckks.HeldKeys, "test", True, ()) is None  # no relinearization key
    assert reusable(rc, ckks.HeldKeys, "test", False, (8,)) is None  # a rotation missing
    assert reusable(rc, ckks.HeldKeys, "paper", False, ()) is None
    assert reusable(rc, PartyKeyState, "test", False, ()) is None  # the server's: no secret
    party = SimpleNamespace(held_keys=PartyKeyState(ckks=context, joint=None, keys=None,
                                                    relinearized=False))
    assert reusable(party, ckks.HeldKeys, "test", False, ()) is None  # a party's, not ours
    assert reusable(party, PartyKeyState, "test", False, ()) is party.held_keys
    assert reusable(SimpleNamespace(held_keys=None), ckks.HeldKeys, "test", False, ()) is None


# -- misbehaving parties ----------------------------------------------------------------
async def _run_with_party(party_role):
    cheat = deviating("zscore", party=party_role)
    rng = np.random.default_rng(0)
    await run_federation(cheat, [rng.normal(size=(5, 2)) for _ in range(3)], TEST, timeout=60)


async def test_a_ciphertext_under_a_private_key_is_rejected() -> None:
    async def party(rc, X, options):
        if rc.me != 3:
            return await ppf.party(rc, X, options)
        crypto = await setup_party(rc, options.preset)
        own = ckks.PartyKeys.generate(crypto.ckks)  # not the joint key
        ct = crypto.ckks.encrypt(own.public_key_share, np.ones(2))
        total, _ = sign_upload(keyring_of(rc), rc.session, 0, ct, InputUpload)
        count, _ = sign_upload(keyring_of(rc), rc.session, 1, ct, InputUpload)
        await rc.send(SERVER, ppf.EncryptedSums(total=total, count=count, width=2))
        await serve_until(crypto, ppf.PpfZScoreResult, decryptions=9)

    with pytest.raises(ProtocolError, match="party 3 is not encrypted under the joint"):
        await _run_with_party(party)


class OneMoreAfterTheRetry(ServerCrypto):
    """The honest requests up to the mean's coarse pass and its declared retry (the
    request at 2^-40, bound to it: answered), then one more decryption."""

    async def decrypt(self, ct, n: int, noise) -> np.ndarray:
        values = await super().decrypt(ct, n, noise)
        if self.decryptions == 2:  # the presence product, then the mean's coarse pass
            await self.decrypt_shifted(ct, n)
            await super().decrypt(self.encrypt(np.full(2, 3.0)), n, None)
        return values


async def test_a_party_asked_for_too_many_decryptions_refuses() -> None:
    async def greedy_server(rc, options):
        return await zscore_server_with(rc, options, OneMoreAfterTheRetry)

    cheat = deviating("zscore", server=greedy_server)
    parts = [np.ones((4, 2)) * i for i in range(1, 4)]
    with pytest.raises(ProtocolError, match="more decryptions"):
        await run_federation(cheat, parts, TEST, timeout=60)


def test_values_beyond_the_supported_range_are_rejected_before_encryption() -> None:
    with pytest.raises(InputError, match="2\\^40"):
        simulate([np.full((3, 1), 2.0**41), np.ones((3, 1))], "zscore", "mhe", TEST)
    with pytest.raises(InputError, match="max_count"):
        simulate([np.ones((9, 1))] * 2, "zscore", "mhe",
                 FitOptions(algorithm="paper", preset="test", max_count=8))


# -- no silent wrong answers ------------------------------------------------------------
def test_a_pooled_count_beyond_max_count_is_refused_before_any_decryption() -> None:
    """Each party holds 5 ≤ max_count = 8 values, but the pooled 10 would leave the
    inverse's range (it returned mean −24020 for 2.65): P·n_p ≤ max_count is enforced."""
    parts = [np.arange(5.0).reshape(5, 1) + i for i in range(2)]
    with pytest.raises(InputError, match="pooled count could exceed max_count=8"):
        simulate(parts, "zscore", "mhe", FitOptions(algorithm="paper", preset="test", max_count=8))
    fitted = simulate(parts, "zscore", "mhe", FitOptions(algorithm="paper",
                                                         preset="test", max_count=10))
    np.testing.assert_allclose(fitted.normalizer.mean, np.vstack(parts).mean(axis=0), rtol=1e-5)


def test_standardized_data_split_by_label_is_fitted() -> None:
    """Pooled mean exactly ~0 while each party's sum is large (label skew): the coarse
    pass is noise and must not lift the parties' sums past what CKKS encodes."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(20_000, 3))
    X[:, 1] *= 1e-3
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    order = np.argsort(X[:, 0])  # "label" = the sign of feature 0
    parts = [X[order[:10_000]], X[order[10_000:]]]
    fitted = simulate(parts, "zscore", "mhe", TEST).normalizer
    np.testing.assert_allclose(fitted.mean, 0.0, atol=1e-6)
    np.testing.assert_allclose(fitted.var, 1.0, rtol=1e-5)


def test_a_party_refuses_scales_that_would_overflow_its_encoding() -> None:
    async def scaling_server(rc, options):
        await ppf.setup_server(rc, options.preset, **ppf.setup_arguments(options))
        await rc.gather(ppf.EncryptedSums)
        await rc.broadcast(quotient.Scales(scales=np.full(2, 2.0**60)))
        await rc.gather(quotient.EncryptedVector)

    cheat = deviating("zscore", server=scaling_server)  # revealed counts: sums, not relayed
    with pytest.raises(InputError, match="would pass 2\\^50"):
        trio.run(run_federation, cheat, [np.full((4, 2), 3.0)] * 3,
                 FitOptions(algorithm="paper", preset="test", reveal_counts=True))


@pytest.mark.parametrize("reveal_counts", [False, True])
def test_a_feature_without_values_is_nan_as_in_plain_mode(reveal_counts) -> None:
    rng = np.random.default_rng(2)
    parts = [np.column_stack([rng.normal(5, 2, n), np.full(n, np.nan)]) for n in (6, 4, 5)]
    options = FitOptions(algorithm="paper", preset="test", reveal_counts=reveal_counts)
    fitted = simulate(parts, "zscore", "mhe", options).normalizer
    plain = simulate(parts, "zscore", "plain").normalizer
    assert np.isnan(plain.mean[1]) and np.isnan(fitted.mean[1]) and np.isnan(fitted.var[1])
    pooled = np.vstack(parts)[:, 0]
    np.testing.assert_allclose([fitted.mean[0], fitted.var[0]], [pooled.mean(), pooled.var()],
                               rtol=1e-6)


class OneMoreBootstrap(ServerCrypto):
    """The encrypted inverse's bootstraps, honest, then one more (of a fresh ciphertext,
    so neither a repeat nor past the level budget: only more than the plan)."""

    async def bootstrap(self, ct, forward: bool = False):
        refreshed = await super().bootstrap(ct, forward)
        if self.bootstraps == ppf.inverse_plan(self.ckks, TEST).bootstraps:
            await super().bootstrap(self.encrypt(np.ones(2)), forward)
        return refreshed


async def test_a_party_refuses_bootstraps_beyond_the_inverse() -> None:
    """The encrypted inverse's bootstraps are public (its plan); one more, e.g. to refresh
    a ciphertext the ledger does not list, is refused as beyond the plan."""
    async def server(rc, options):
        return await zscore_server_with(rc, options, OneMoreBootstrap)

    cheat = deviating("zscore", server=server)
    with pytest.raises(ProtocolError, match="more bootstraps"):
        await run_federation(cheat, [np.ones((4, 2)) * i for i in range(1, 4)], TEST,
                             timeout=60)


def test_revealed_counts_refuse_sums_beyond_what_a_sum_upload_holds() -> None:
    parts = [np.array([[2.0**30], [-2.0**30]]), np.array([[1.0], [2.0]])]  # Σ(x−μ)² ~ 2^61
    with pytest.raises(InputError, match="hold up to 2\\^50"):
        simulate(parts, "zscore", "mhe", FitOptions(algorithm="paper",
                                                    preset="test", reveal_counts=True))
    fitted = simulate(parts, "zscore", "mhe", TEST).normalizer  # the encrypted inverse
    np.testing.assert_allclose(fitted.var, np.vstack(parts).var(axis=0), rtol=RTOL)
