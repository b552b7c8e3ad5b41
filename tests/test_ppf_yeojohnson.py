"""PPF Yeo-Johnson against the pooled scikit-learn / SciPy oracle, its ledger, bad input.

The oracle: scikit-learn's ``PowerTransformer(method="yeo-johnson")`` on the pooled data.
The PPF search maximizes the same log-likelihood over the λ range V_abs allows, so the
check is llf(λ_ppf) ≥ llf(λ_sklearn clipped to that range) − δ (llf concave: the clipped
λ is the range's maximizer), with llf from SciPy on the pooled values.
"""

from __future__ import annotations

import numpy as np
import pytest
from deviating import deviating
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_cases import yeojohnson_plan
from scipy import stats
from sklearn.preprocessing import PowerTransformer

from fednorm.engine.ckks.compare import composite_sign
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.tracing import CryptoEvent, Tracer
from fednorm.protocols import FitOptions
from fednorm.protocols.normalizers import yeo_johnson
from fednorm.protocols.ppf import yeojohnson as ppf
from fednorm.protocols.ppf import yeojohnson_math as yj_math
from fednorm.protocols.ppf import yeojohnson_search as yj_search
from fednorm.sim.federation import simulate

# Stated tolerances. λ: a probe's sign is wrong only where |t| = |D|/K is below the
# CKKS noise of ⟨t⟩ (measured ≤ 1e-9), i.e. where llf is flat; with 1e-8 noise on t the
# plaintext model of the search loses ≤ 2e-6 nats on BCW
# (n = 569), so δ = 1e-6·n + 1e-6 leaves an order of magnitude. Mean and variance of the
# transformed data: the PPF z-score's passes on the Newton-refined inverse (~4e-10
# relative, measured ~1e-11 on the results), so 1e-8.
LLF_DELTA_PER_VALUE = 1e-6
RTOL = 1e-8
NOISE = 1e-8  # noise on t in the plaintext model of the search (10× the measured)


def pooled_llf(column: np.ndarray, lam: float) -> float:
    return float(stats.yeojohnson_llf(lam, column[~np.isnan(column)]))


def sklearn_lambdas(pooled: np.ndarray) -> np.ndarray:
    return PowerTransformer(method="yeo-johnson", standardize=False).fit(pooled).lambdas_


def assert_reaches_pooled_maximum(pooled: np.ndarray, lambdas: np.ndarray,
                                  plan: yj_search.SearchPlan) -> None:
    oracle = np.clip(sklearn_lambdas(pooled), plan.low, plan.high)
    for j, column in enumerate(pooled.T):
        n = np.sum(~np.isnan(column))
        delta = LLF_DELTA_PER_VALUE * n + 1e-6
        assert pooled_llf(column, lambdas[j]) >= pooled_llf(column, oracle[j]) - delta, \
            (j, lambdas[j], oracle[j])


# -- the math, in plaintext -----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.floats(-50, 50), st.floats(-6, 8))
def test_the_lambda_derivative_matches_finite_differences(x, lam) -> None:
    h = 1e-6
    column = np.array([[x]])
    numeric = (yeo_johnson(column, [lam + h]) - yeo_johnson(column, [lam - h]))[0, 0] / (2 * h)
    exact = yj_math.yeo_johnson_derivative(np.array(x), np.array(lam))
    assert abs(exact - numeric) <= 1e-6 * (1 + abs(numeric))


@st.composite
def pooled_columns(draw: st.DrawFn) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(2, 120))
    kind = draw(st.sampled_from(["normal", "gamma", "negative", "ties"]))
    scale = 10.0 ** rng.uniform(-2, 3)
    if kind == "normal":
        x = rng.normal(rng.uniform(-2, 2) * scale, scale, n)
    elif kind == "gamma":
        x = rng.gamma(rng.uniform(0.5, 4), scale, n)
    elif kind == "negative":
        x = -rng.lognormal(np.log(scale), 0.7, n)
    else:
        x = rng.choice(rng.normal(0, scale, 3), n)
    if np.ptp(x) == 0:
        x[0] += scale
    return x, float(np.abs(x).max() * rng.uniform(1.05, 4))


@settings(max_examples=40, deadline=None)
@given(pooled_columns(), st.floats(-3, 5))
def test_t_is_the_scaled_derivative_sign_within_one(column_vabs, lam) -> None:
    """|t| ≤ 1 (the sign polynomial's domain) and sign t = sign llf'(λ)."""
    x, vabs = column_vabs
    t = yj_math.plain_t(x, np.array([lam]), vabs)[0]
    assert abs(t) <= 1
    h = 1e-5 * max(1, abs(lam))
    slope = (stats.yeojohnson_llf(lam + h, x) - stats.yeojohnson_llf(lam - h, x)) / (2 * h)
    if abs(slope) > 1e-3 * len(x):  # clear of the maximizer: the sign must agree
        assert np.sign(t) == np.sign(slope)


@settings(max_examples=25, deadline=None)
@given(pooled_columns(), st.integers(0, 2**32 - 1))
def test_the_bisection_reaches_the_maximum_from_noisy_signs(column_vabs, seed) -> None:
    """The server's search on the composite sign of t plus CKKS-sized noise."""
    x, vabs = column_vabs
    pooled = x[:, None]
    plan = yeojohnson_plan(pooled, (vabs,))
    search = yj_search.SignBisection(plan, np.array([True]))
    sign = yj_search.sign_plan(FitOptions(algorithm="paper"))
    rng = np.random.default_rng(seed)
    while not search.finished:
        lam = search.probe()
        t = yj_math.plain_t(x, lam[0], vabs)[None, :] + rng.normal(0, NOISE, lam.shape)
        search.update(composite_sign(sign.g_stages, sign.f_stages, np.clip(t, -1, 1)))
    # The search's guarantee: every sign it acts on is right where |t| exceeds the noise,
    # so it ends at the pooled maximum, or where |t| = |llf'|-scaled-by-V_abs is within the
    # noise. The second case is the documented limit (few values, V_abs loose against the
    # data): there llf can still be measurably below its maximum.
    t_found = yj_math.plain_t(x, search.lambdas, vabs)[0]
    if abs(t_found) > 10 * NOISE:
        assert_reaches_pooled_maximum(pooled, search.lambdas, plan)


# -- the protocol under multiparty CKKS (test preset) ----------------------------------------
def _column(rng: np.random.Generator, kind: str, scale: float, n: int) -> np.ndarray:
    if kind == "normal":
        return rng.normal(rng.uniform(-1, 1) * scale, scale, n)
    if kind == "gamma":
        return rng.gamma(2.0, scale, n)
    if kind == "negative":
        return -rng.lognormal(np.log(scale), 0.5, n)
    column = rng.choice([-scale, 0.5 * scale, 2 * scale], n)  # ties
    column[:2] = [-scale, 2 * scale]
    return column


@st.composite
def ppf_federations(draw: st.DrawFn) -> tuple[list[np.ndarray], tuple[float, ...]]:
    parties = draw(st.integers(1, 4))
    features = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = [int(r) for r in rng.integers(1, 25, size=parties)]
    rows[0] = 1 if parties > 1 and draw(st.booleans()) else rows[0]  # a party with one row
    kinds = draw(st.lists(st.sampled_from(["normal", "gamma", "negative", "ties"]),
                          min_size=features, max_size=features))
    columns = [_column(rng, kind, 10.0 ** rng.uniform(-1, 2), sum(rows)) for kind in kinds]
    pooled = np.column_stack(columns)
    if draw(st.booleans()):
        pooled[rng.random(pooled.shape) < 0.1] = np.nan
        pooled[:2] = np.column_stack(columns)[:2]  # keep two values per feature
    parts = np.split(pooled, np.cumsum(rows)[:-1])
    vabs = tuple(np.nanmax(np.abs(pooled), axis=0) * rng.uniform(1.05, 3, size=features))
    return parts, vabs


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ppf_federations())
def test_ppf_yeojohnson_reaches_the_pooled_maximum_likelihood(federation) -> None:
    parts, vabs = federation
    pooled = np.vstack(parts)
    fitted = simulate(parts, "yeojohnson", "mhe", FitOptions(algorithm="paper",
                                                             preset="test", vabs=vabs),
                      timeout=900).normalizer
    assert_reaches_pooled_maximum(pooled, fitted.lambdas, yeojohnson_plan(pooled, vabs))
    transformed = yeo_johnson(pooled, fitted.lambdas)
    np.testing.assert_allclose(fitted.mean, np.nanmean(transformed, axis=0), rtol=RTOL,
                               atol=1e-9 * np.nanmax(np.abs(transformed)))
    np.testing.assert_allclose(fitted.var, np.nanvar(transformed, axis=0), rtol=RTOL)


def test_constant_and_empty_features_follow_the_plain_conventions() -> None:
    rng = np.random.default_rng(3)
    parts = [np.column_stack([np.full(n, 2.5), rng.gamma(2, 1, n), np.full(n, np.nan)])
             for n in (6, 1, 9)]
    fitted = simulate(parts, "yeojohnson", "mhe",
                      FitOptions(algorithm="paper",
                                 preset="test", vabs=(5.0, 40.0, 1.0)), timeout=900).normalizer
    pooled = np.vstack(parts)
    assert fitted.lambdas[0] == 1 and fitted.var[0] == 0
    assert fitted.mean[0] == pytest.approx(2.5, rel=1e-6)
    assert fitted.lambdas[2] == 1 and np.isnan(fitted.mean[2]) and np.isnan(fitted.var[2])
    plan = yeojohnson_plan(pooled[:, 1:2], (40.0,))
    assert_reaches_pooled_maximum(pooled[:, 1:2], fitted.lambdas[1:2], plan)
    np.testing.assert_allclose(fitted.transform(pooled)[:, 0], 0.0, atol=1e-5)


@pytest.mark.slow
def test_ppf_yeojohnson_at_the_paper_preset_on_bcw_with_ten_parties() -> None:
    from fednorm.sim.datasets import load_dataset
    from fednorm.sim.partition import partition

    data = load_dataset("bcw")
    parts = [p.X for p in partition(data.X, data.y, 10, "label:0.5", seed=0)]
    vabs = tuple(1.5 * np.abs(data.X).max(axis=0))
    fitted = simulate(parts, "yeojohnson", "mhe", FitOptions(algorithm="paper",
                                                             preset="paper", vabs=vabs),
                      timeout=3600).normalizer
    assert_reaches_pooled_maximum(data.X, fitted.lambdas, yeojohnson_plan(data.X, vabs, "paper"))
    transformed = yeo_johnson(data.X, fitted.lambdas)
    np.testing.assert_allclose(fitted.mean, transformed.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(fitted.var, transformed.var(axis=0), rtol=RTOL)


# -- bad input --------------------------------------------------------------------------------
class PartyCalls(Tracer):
    """The crypto calls the parties ran (the crypto-call hook of every party's role)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        self.calls.append(event.call)


def test_values_beyond_vabs_are_rejected_before_encryption() -> None:
    parties = PartyCalls()
    parts = [np.array([[1.0], [2.0]]), np.array([[3.0], [-12.0]])]
    with pytest.raises(InputError, match="beyond the agreed bound"):
        simulate(parts, "yeojohnson", "mhe", FitOptions(algorithm="paper",
                                                        preset="test", vabs=(10.0,)),
                 party_tracer=parties)
    assert parties.calls == []  # no key, no encryption


def test_the_party_calls_watch_sees_a_valid_run_encrypt() -> None:
    """The watch above is not vacuous: through the same hook, a party's key generation and
    encryption of a valid PPF run are seen."""
    parties = PartyCalls()
    simulate([np.ones((3, 1)), np.full((3, 1), 2.0)], "zscore", "mhe",
             FitOptions(preset="test"), party_tracer=parties)
    assert {"KeySetup.generate_keys", "encrypt_coefficients"} <= set(parties.calls)


def test_ppf_yeojohnson_needs_the_agreed_bound() -> None:
    parties = PartyCalls()
    with pytest.raises(InputError, match=r"(?i)v_?abs"):
        simulate([np.ones((3, 1)), np.ones((3, 1))], "yeojohnson", "mhe",
                 FitOptions(algorithm="paper", preset="test"), party_tracer=parties)
    assert parties.calls == []


# -- a misbehaving server ------------------------------------------------------------------
async def test_parties_refuse_sign_flags_their_data_contradict() -> None:
    """False flags would break the bound |t| ≤ 1 (and with it the sign's meaning): the
    server runs the flags' step as the parties check it, then broadcasts other flags."""
    from fednorm.protocols.ppf.driver import run_core
    from fednorm.sim.federation import run_federation

    async def lying_server(rc, options):
        crypto = await ppf.setup_server(rc, options.preset, **ppf.setup_arguments(options))
        absent, _, _ = await ppf._relayed_start(crypto, await rc.gather(ppf.EncryptedStart))
        await run_core(crypto, ppf.sign_flags_core(crypto.ckks, absent, 1), "sign flags",
                       replayed=True)
        none = np.zeros(1)
        await rc.broadcast(ppf.Flags(empty=none, negative=none, positive=np.ones(1)))
        await rc.gather(ppf.EncryptedMoments)  # never comes
        return crypto

    cheat = deviating("yeojohnson", server=lying_server)
    parts = [np.array([[1.0], [-2.0]]), np.array([[3.0]])]
    with pytest.raises(ProtocolError, match="contradict"):
        await run_federation(cheat, parts, FitOptions(algorithm="paper",
                                                      preset="test", vabs=(5.0,)), timeout=300)
