"""PPF robust scaling, default and the paper's (Alg. 3 on Alg. 4), against numpy's pooled
quartiles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import HOSTILE, Federation, federations

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.sim.federation import simulate


def test_ppf_robust_quartiles_equal_pooled_within_epsilon() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.normal(-2, 3, size=(n, 2)) for n in (30, 1, 17)]  # one party has one row
    parts[0][3, 1] = np.nan
    pooled = np.vstack(parts)
    epsilon = 1e-4
    expected = np.nanpercentile(pooled, [25, 50, 75], axis=0)
    rounds = {}
    for probes in (1, 15):
        options = FitOptions(algorithm="paper",
                             preset="test", vabs=(50.0,), epsilon=epsilon, rank_probes=probes)
        result = simulate(parts, "robust", "mhe", options)
        fitted = result.normalizer
        # Each order statistic is within ε/2 of the truth once the bracket is narrower than
        # ε; the brackets start from PPF MinMax, whose error is far below ε here.
        for got, want in zip((fitted.q1, fitted.median, fitted.q3), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=epsilon)
        rounds[probes] = result.report.rounds
    # The search narrows ~17 bits (range ~20 down to 1e-4): ~17 rounds by bisection, ~5 with
    # 15 probes (4 bits a round); everything else is the same.
    assert rounds[15] <= rounds[1] - 10, rounds


def test_paper_robust_finds_quartiles_that_sit_on_the_extremes() -> None:
    """Quartiles equal to the pooled min and max (ties): the search starts from PPF
    MinMax's extremes widened by its public error bound (flooding included), so neither
    lies outside the bracket; from the extremes as decrypted, a feature whose min (max)
    came out inside the data returned that estimate, off by up to the bound (7.1e-5 here;
    up to 1.0e-5 on the code before, 7 of 8 features, far above ε)."""
    rng = np.random.default_rng(11)
    low, high = rng.uniform(-6, -2, 8), rng.uniform(2, 6, 8)

    def rows(n: int) -> np.ndarray:  # 40 % of each party's rows at each extreme
        tied = -(-2 * n // 5)
        middle = rng.uniform(low, high, (n - 2 * tied, 8))
        return rng.permuted(np.vstack([np.tile(low, (tied, 1)), np.tile(high, (tied, 1)),
                                       middle]), axis=0)

    parts = [rows(n) for n in (12, 9, 11)]
    epsilon = 1e-9
    options = FitOptions(algorithm="paper", preset="test", vabs=(8.0,), epsilon=epsilon)
    fitted = simulate(parts, "robust", "mhe", options).normalizer
    q1, _, q3 = np.percentile(np.vstack(parts), [25, 50, 75], axis=0)
    np.testing.assert_array_equal(q1, low)  # the data put them on the extremes
    np.testing.assert_array_equal(q3, high)
    np.testing.assert_allclose(fitted.q1, q1, rtol=0, atol=2 * epsilon)
    np.testing.assert_allclose(fitted.q3, q3, rtol=0, atol=2 * epsilon)


def test_ppf_robust_needs_the_agreed_bound() -> None:
    with pytest.raises(InputError, match=r"(?i)v_?abs"):
        simulate([np.ones((3, 1)), np.ones((3, 1))], "robust", "mhe", FitOptions(algorithm="paper",
                                                                                 preset="test"))


# -- the default algorithm: the search from the whole float order ------------------------
def _order_statistics_quartiles(pooled: np.ndarray) -> np.ndarray:
    """numpy's linear-interpolation quartiles, combined as the protocol combines the
    order statistics it finds (so exact order statistics give exactly these values)."""
    from fednorm.protocols.plain.robust import QUARTILES
    from fednorm.protocols.quantiles import plan_quantiles

    counts = np.sum(~np.isnan(pooled), axis=0).astype(np.float64)
    plan = plan_quantiles(counts, QUARTILES)
    columns = [np.sort(column[~np.isnan(column)]) for column in pooled.T]
    values = np.array([columns[j][k - 1] for j, k in zip(plan.features, plan.ranks,
                                                          strict=True)])
    quartiles = plan.combine(values)
    quartiles[:, counts == 0] = np.nan
    return quartiles


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations(max_parties=4, max_features=3, kinds=HOSTILE))
def test_default_ppf_robust_finds_the_exact_order_statistics(federation: Federation) -> None:
    """No V_abs, no MinMax: every quartile is built from the exact pooled order statistics
    (equal to numpy's quantiles up to the interpolation's last bit), on hostile columns."""
    fitted = simulate(federation.parts, "robust", "mhe", FitOptions(preset="test")).normalizer
    got = np.vstack([fitted.q1, fitted.median, fitted.q3])
    np.testing.assert_array_equal(got, _order_statistics_quartiles(federation.pooled))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN (empty) features
        numpy = np.nanpercentile(federation.pooled, [25, 50, 75], axis=0)
    np.testing.assert_allclose(got, numpy, rtol=1e-15, atol=0)


def test_default_ppf_robust_spans_every_magnitude_and_stops_at_epsilon() -> None:
    """1e-300 beside 1e300 in one search, exact; an absolute ε stops each target once its
    bracket is that narrow, in fewer rounds than the exact search."""
    rng = np.random.default_rng(11)
    pooled = np.column_stack([rng.lognormal(0, 200, 40) * rng.choice([-1, 1], 40),
                              rng.normal(5, 1, 40)])
    parts = [pooled[:13], pooled[13:14], pooled[14:]]
    exact = simulate(parts, "robust", "mhe", FitOptions(preset="test"))
    got = np.vstack([exact.normalizer.q1, exact.normalizer.median, exact.normalizer.q3])
    np.testing.assert_array_equal(got, _order_statistics_quartiles(pooled))
    # (ε = 1e-3 is finer than float64 resolves at 1e136: the second feature alone)
    coarse = simulate([part[:, 1:] for part in parts], "robust", "mhe",
                      FitOptions(preset="test", epsilon=1e-3))
    got = np.vstack([coarse.normalizer.q1, coarse.normalizer.median, coarse.normalizer.q3])
    np.testing.assert_allclose(got[:, 0], np.percentile(pooled[:, 1], [25, 50, 75]),
                               rtol=0, atol=1e-3)
    assert coarse.report.rounds < exact.report.rounds


async def test_a_default_ppf_robust_party_refuses_rounds_past_the_agreed_plan() -> None:
    """A server that probes one point a round (to learn the pooled counts at ever more
    points) instead of the agreed K is refused once it passes the rounds K needs to cut
    the whole float order to one float."""
    from deviating import deviating

    from fednorm.engine.errors import ProtocolError
    from fednorm.protocols.collective import setup_server
    from fednorm.protocols.plain.robust import QUARTILES
    from fednorm.protocols.ppf import kth
    from fednorm.protocols.quantiles import plan_quantiles
    from fednorm.protocols.rank import start_unbounded_search
    from fednorm.sim.federation import run_federation

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)  # counts only
        count, _, _ = await kth.reveal_counts_and_opening(crypto, options, QUARTILES)
        plan = plan_quantiles(count, QUARTILES)
        await kth.kth_server(crypto, start_unbounded_search(plan, count, options, probes=1),
                             count)

    rng = np.random.default_rng(4)
    with pytest.raises(ProtocolError, match="more search rounds"):
        await run_federation(deviating("robust", server=server),
                             [rng.normal(size=(6, 1)) for _ in range(3)],
                             FitOptions(preset="test"), timeout=300)


def test_the_default_search_s_first_round_travels_with_the_count() -> None:
    """n_g and the counts at the opening probe (which every role computes alone) come
    out of one flooded decryption: the server learns the first round's counts before it
    sends any probe, and the search saves the round trip of that round (before, the first
    decryption held n_g alone and a probe followed it)."""
    from fednorm.engine import ckks
    from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
    from fednorm.protocols.collective import shared_context
    from fednorm.protocols.plain.robust import QUARTILES
    from fednorm.protocols.rank import opening_probe

    class Kinds(Tracer):
        """The kinds the server sends, in order, and the values each decryption gave it."""

        def __init__(self) -> None:
            self.sent: list[str] = []
            self.decrypted: list[int] = []

        def frame(self, event: FrameEvent) -> None:
            if event.direction == "sent" and event.kind not in self.sent[-1:]:
                self.sent.append(event.kind)

        def crypto_call(self, event: CryptoEvent) -> None:
            if event.call == ckks.Decryption.finalize.__qualname__:
                self.decrypted.append(len(event.result))

    rng = np.random.default_rng(12)
    parts = [rng.lognormal(size=(n, 3)) for n in (20, 7, 13)]
    options = FitOptions(preset="test")
    kinds = Kinds()
    result = simulate(parts, "robust", "mhe", options, tracer=kinds)
    pooled = np.vstack(parts)
    for got, q in zip(result.normalizer.params().values(), (25, 50, 75), strict=True):
        np.testing.assert_array_equal(got, np.percentile(pooled, q, axis=0))
    slots = shared_context("test").slots
    assert len(opening_probe(3, slots - 3, QUARTILES, options).points) == 3 * 255
    after_setup = kinds.sent[kinds.sent.index("ckks.setup_done") + 1:]
    assert after_setup[:4] == ["ckks.decrypt_sum_request", "ckks.relayed_upload",
                               "ppf_robust.pooled_counts", "rank.probe"], after_setup
    assert kinds.decrypted[0] == 3 + 3 * 255, kinds.decrypted  # n_g, then the opening's


async def test_the_opening_counts_as_one_of_the_agreed_search_rounds() -> None:
    """The opening's counts are revealed like a search round's, so a party counts it
    against the rounds it allows: a server that follows it with the full number of
    K-point rounds gets one round fewer (before, the opening came on top)."""
    from deviating import deviating

    from fednorm.engine.errors import ProtocolError
    from fednorm.protocols.collective import setup_server
    from fednorm.protocols.plain.robust import QUARTILES
    from fednorm.protocols.ppf import kth
    from fednorm.protocols.ppf.robust import default_probes
    from fednorm.protocols.quantiles import plan_quantiles
    from fednorm.protocols.rank import RankProbe
    from fednorm.protocols.rank_rounds import unbounded_round_limit
    from fednorm.sim.federation import run_federation

    answered: list[int] = []

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)  # counts only
        count, _, _ = await kth.reveal_counts_and_opening(crypto, options, QUARTILES)
        probes = default_probes(plan_quantiles(count, QUARTILES), options,
                                kth.probe_capacity(crypto, count))
        counts = kth.EncryptedCountAggregator(crypto, count)
        points = np.linspace(-1.0, 1.0, probes)
        with rc.subprotocol("kth"):
            for _ in range(unbounded_round_limit(probes)):
                await rc.broadcast(RankProbe(features=np.zeros(probes, dtype=np.int64),
                                             points=points))
                await counts.pooled(rc, probes)
                answered.append(probes)

    rng = np.random.default_rng(4)
    options = FitOptions(preset="test")
    with pytest.raises(ProtocolError, match="more search rounds"):
        await run_federation(deviating("robust", server=server),
                             [rng.normal(size=(6, 1)) for _ in range(3)], options,
                             timeout=300)
    probes = answered[0]
    assert len(answered) == unbounded_round_limit(probes) - 1
