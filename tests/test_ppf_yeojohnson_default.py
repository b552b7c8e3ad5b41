"""The default PPF Yeo-Johnson (flooded sums) against scikit-learn on the pooled rows:
right — λ's pooled log-likelihood within 1e-9 (relative) of scikit-learn's λ's — or refused
with an error naming the feature; never a wrong λ with a normal exit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.stats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_wine
from sklearn.preprocessing import PowerTransformer
from strategies import Federation, federations

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.protocols.ppf.yeojohnson_sums import LLF_TOLERANCE
from fednorm.sim.federation import simulate

TEST = FitOptions(preset="test")


def pooled_llf(column: np.ndarray, lam: float) -> float:
    """SciPy's Yeo-Johnson log-likelihood of the present values at ``lam``."""
    return float(scipy.stats.yeojohnson_llf(lam, column[~np.isnan(column)]))


def sklearn_lambdas(pooled: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return PowerTransformer(standardize=False).fit(pooled).lambdas_


def assert_right_or_refused(parts: list[np.ndarray], pooled: np.ndarray,
                            refusal: bool = True) -> None:
    """λ as good as scikit-learn's for the pooled log-likelihood, feature by feature, and
    the transformed mean and variance those of the pooled transformed rows; or, where
    ``refusal`` allows it, an InputError that names a feature."""
    try:
        fitted = simulate(parts, "yeojohnson", "mhe", TEST).normalizer
    except InputError as exc:
        assert refusal and "feature" in str(exc), exc
        return
    reference = sklearn_lambdas(pooled)
    for j, column in enumerate(pooled.T):
        present = column[~np.isnan(column)]
        if len(present) == 0 or np.ptp(present) == 0:
            continue  # no values or constant: λ = 1 by convention (tested elsewhere)
        ours, theirs = pooled_llf(column, fitted.lambdas[j]), pooled_llf(column, reference[j])
        assert ours >= theirs - LLF_TOLERANCE * abs(theirs) - 1e-12, (j, ours, theirs)
        transformed = scipy.stats.yeojohnson(present, fitted.lambdas[j])
        np.testing.assert_allclose(fitted.mean[j], transformed.mean(), rtol=1e-9,
                                   atol=1e-9 * np.abs(transformed).max())
        np.testing.assert_allclose(fitted.var[j], transformed.var(), rtol=1e-6,
                                   atol=1e-300)


def test_a_nearly_constant_transformed_feature_is_right_or_refused() -> None:
    """Wine's magnesium (178 values in 70–162): its pooled fit's transform is nearly
    constant (λ ≈ −1.45, variance ~3e-8); the paper's encrypted search returned λ = 1 and
    variance 0 with a normal exit."""
    X = load_wine().data[:, [4]]
    parts = [X[:60], X[60:61], X[61:]]
    assert_right_or_refused(parts, X, refusal=False)


def test_it_runs_without_vabs_on_a_wine_split() -> None:
    """Every wine feature over three parties: no bound needed, right or refused."""
    X = load_wine().data
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))
    parts = [X[order[:50]], X[order[50:120]], X[order[120:]]]
    assert_right_or_refused(parts, X, refusal=False)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations(max_parties=3, max_features=2,
                   kinds=("normal", "constant", "ties", "offset", "zero_mean", "empty")),
       st.sampled_from([0.0, 100.0]))
def test_default_ppf_yeojohnson_is_right_or_refused_on_hostile_data(
        federation: Federation, shift: float) -> None:
    parts = [part + shift for part in federation.parts]
    assert_right_or_refused(parts, federation.pooled + shift)


def test_default_ppf_yeojohnson_needs_no_vabs() -> None:
    X = np.random.default_rng(1).gamma(2, 3, size=(30, 2)) - 1
    fitted = simulate([X[:10], X[10:]], "yeojohnson", "mhe", TEST).normalizer
    assert np.all(np.isfinite(fitted.lambdas))
    with pytest.raises(InputError):
        simulate([X[:10], X[10:]], "yeojohnson", "mhe",
                 FitOptions(preset="test", algorithm="paper"))  # the paper's needs V_abs


def test_a_lambda_whose_log_likelihood_the_noise_could_move_is_refused() -> None:
    """The refusal itself: a chosen λ whose variance flooding may move by more than the
    tolerance allows is named, one the noise cannot move is not."""
    from fednorm.protocols.plain.yeojohnson import Candidates
    from fednorm.protocols.plain.yeojohnson_math import PooledSummary
    from fednorm.protocols.ppf.yeojohnson_sums import ProbedMoments

    class Chosen:  # what ProbedMoments reads of a finished search
        features = np.array([0, 1])
        lambdas = np.array([0.5, 0.5])

    count = np.array([100.0, 100.0])
    summary = PooledSummary(count, np.zeros(2), np.ones(2), np.ones(2), np.zeros(2),
                            np.zeros(2))
    probed = ProbedMoments(noise=1e-16)
    probe = Candidates(features=np.array([0, 1]), lambdas=np.array([[0.5], [0.5]]))
    # half-range 1 for both; feature 1's variance is far below what the noise resolves
    probed.record(probe, count, np.zeros((2, 1)), np.array([[0.1], [1e-14]]),
                  np.ones((2, 1)), np.zeros((2, 1)))
    assert probed.unsure(Chosen(), summary).tolist() == [1]


def test_a_party_refuses_more_candidates_than_the_search_probes() -> None:
    """A server asking for the pooled moments at more λ's than the search's grid (to map
    the pooled distribution) is refused before any party uploads them."""
    import trio
    from deviating import deviating

    from fednorm.engine.errors import ProtocolError
    from fednorm.protocols.collective import setup_server
    from fednorm.protocols.plain.yeojohnson import Candidates
    from fednorm.protocols.plain.yeojohnson_math import FIRST_GRID
    from fednorm.protocols.ppf import extremes, pooled
    from fednorm.protocols.ppf import yeojohnson_sums as yj
    from fednorm.sim.federation import run_federation

    sent: list[int] = []

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **yj.setup_arguments(options))
        await extremes.extremes_server(crypto, None)
        await pooled.pooled_sum(crypto)
        wide = np.linspace(-2.0, 2.0, FIRST_GRID + 1)[None, :].repeat(2, axis=0)
        await rc.broadcast(Candidates(features=np.arange(2), lambdas=wide))
        sent.extend(await rc.gather(pooled.EncryptedSum))

    X = np.random.default_rng(2).gamma(2, 3, size=(12, 2))
    with pytest.raises(ProtocolError, match="more than the search's 16"):
        trio.run(lambda: run_federation(deviating("yeojohnson", server=server),
                                        [X[:6], X[6:]], TEST, timeout=120))
    assert sent == []


def test_later_rounds_allow_the_search_grid_and_no_more_candidates() -> None:
    """After the first round a party answers 30 candidates per feature (fewer where a sum
    upload cannot hold them, never fewer than the plain search's 6), and the search's
    rounds follow from that grid: 9 at most."""
    from fednorm.engine.errors import ProtocolError
    from fednorm.protocols.plain.yeojohnson_math import GRID
    from fednorm.protocols.ppf import yeojohnson_sums as yj

    grid = yj.search_grid(TEST, 3)
    assert grid == yj.SEARCH_GRID == 30 and yj.search_round_limit(grid) == 9
    assert yj.search_grid(TEST, 10**6) == GRID
    yj.require_grid(np.ones((3, grid)), 2, grid)
    with pytest.raises(ProtocolError, match="round 2 probes 31 candidates per feature"):
        yj.require_grid(np.ones((3, grid + 1)), 2, grid)
