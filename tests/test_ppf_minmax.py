"""PPF MinMax, the paper's algorithm (algorithm="paper"), against the pooled numpy oracle, its
guaranteed error, its ledger, bad input; the default is tests/test_ppf_extremes.py."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.tracing import CryptoEvent, Tracer
from fednorm.protocols import FitOptions, MinMaxNormalizer, get_protocol
from fednorm.protocols.ppf import minmax_layout
from fednorm.protocols.ppf.checks import vabs_vector
from fednorm.sim.federation import run_federation, simulate

CHEAP = {"minmax_bits": 4, "minmax_passes": 2}  # 2 stages per comparison: fast, coarse
SLOP = 1e-12  # float64 rounding of the affine maps, relative to V_abs


def _options(vabs, knobs=CHEAP, preset="test") -> FitOptions:
    return FitOptions(preset=preset, algorithm="paper",
                      vabs=tuple(np.atleast_1d(vabs).tolist()), **knobs)


def _assert_within_bound(parts, options, fitted) -> None:
    """|result − pooled| ≤ error_bound · V_abs, NaN exactly where nobody has values."""
    pooled = np.vstack(parts)
    vabs = vabs_vector(options, pooled.shape[1])
    empty = np.all(np.isnan(pooled), axis=0)
    tolerance = (minmax_layout.error_bound(options, len(parts)) + SLOP) * vabs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        want_min, want_max = np.nanmin(pooled, axis=0), np.nanmax(pooled, axis=0)
    np.testing.assert_array_equal(np.isnan(fitted.min), empty)
    np.testing.assert_array_equal(np.isnan(fitted.max), empty)
    assert np.all(np.abs(fitted.min - want_min)[~empty] <= tolerance[~empty])
    assert np.all(np.abs(fitted.max - want_max)[~empty] <= tolerance[~empty])


def _relative_errors(parts, options) -> tuple[np.ndarray, np.ndarray]:
    """Fit PPF MinMax, check it against the bound, and return its relative errors
    (min, max) per feature against the pooled extremes."""
    fitted = simulate(parts, "minmax", "mhe", options).normalizer
    _assert_within_bound(parts, options, fitted)
    pooled = np.vstack(parts)
    return (np.abs(fitted.min / np.min(pooled, axis=0) - 1),
            np.abs(fitted.max / np.max(pooled, axis=0) - 1))


class PartyEncryptions(Tracer):
    """What the parties encrypted: their worker calls of the context's ``encrypt*``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.call.startswith("CkksContext.encrypt"):
            self.calls.append(event.call)


def _fit_watched(parts, options, watch: PartyEncryptions) -> MinMaxNormalizer:
    return trio.run(partial(run_federation, get_protocol("minmax", "mhe"), parts, options,
                            party_tracer=watch)).normalizer


@contextmanager
def _refused_before_encryption(match: str | None = None) -> Iterator[PartyEncryptions]:
    """An InputError inside the block, and no party encrypted before it."""
    watch = PartyEncryptions()
    with pytest.raises(InputError, match=match):
        yield watch
    assert not watch.calls, "encrypted before the input check"


@st.composite
def federations(draw: st.DrawFn) -> tuple[list[np.ndarray], np.ndarray]:
    """2–10 parties, some with one row, values of either sign and any scale, some NaN."""
    parties = draw(st.integers(2, 10))
    features = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scales = 10.0 ** rng.uniform(-3, 6, size=features)
    parts = [rng.normal(rng.uniform(-1, 1, features) * scales, scales,
                        size=(int(rng.integers(1, 6)), features)) for _ in range(parties)]
    for part in parts[1:]:
        part[rng.random(part.shape) < 0.2] = np.nan
    vabs = np.nanmax(np.abs(np.vstack(parts)), axis=0) * rng.uniform(1, 8, features)
    return parts, vabs


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations())
def test_ppf_minmax_is_within_its_guaranteed_error(federation) -> None:
    parts, vabs = federation
    options = _options(vabs)
    fitted = simulate(parts, "minmax", "mhe", options).normalizer
    _assert_within_bound(parts, options, fitted)


def test_four_flooded_passes_keep_the_precision_two_had_unflooded() -> None:
    """Two parties, 12 bits per comparison: with every pass flooded, four passes bring
    large values to 1e-9 and small ones to 1e-4 relative, as two passes did before the
    passes were flooded (docs/LEAKAGE.md gives the bounds per number of passes)."""
    rng = np.random.default_rng(11)
    large = [rng.uniform(1e5, 1e6, (12, 2)) * [1, -1] for _ in range(2)]
    small = [rng.uniform(1e-4, 1e-3, (12, 2)) * [1, -1] for _ in range(2)]
    parts = [np.hstack(pair) for pair in zip(large, small, strict=True)]
    options = FitOptions(preset="test", algorithm="paper", vabs=(1e6, 1e6, 1.0, 1.0),
                         minmax_passes=4)
    rel_min, rel_max = _relative_errors(parts, options)
    assert np.all(rel_min[:2] < 1e-9) and np.all(rel_max[:2] < 1e-9)
    assert np.all(rel_min[2:] < 1e-4) and np.all(rel_max[2:] < 1e-4)


def test_a_feature_nobody_has_values_of_is_nan_and_one_row_parties_count() -> None:
    parts = [np.array([[np.nan, 3.0, -2.0]]), np.array([[np.nan, -5.0, np.nan]])]
    options = _options((10.0,), {"minmax_bits": 4, "minmax_passes": 1})
    watch = PartyEncryptions()
    _assert_within_bound(parts, options, _fit_watched(parts, options, watch))
    assert watch.calls  # what the input checks below must see none of


def test_more_features_than_one_block_holds_go_in_chunks() -> None:
    width = minmax_layout.Layout(ckks.TEST.slots, 1).per_chunk + 5
    rng = np.random.default_rng(2)
    parts = [rng.uniform(-1, 1, (3, width)) for _ in range(2)]
    options = _options((1.0,), {"minmax_bits": 4, "minmax_passes": 1})
    fitted = simulate(parts, "minmax", "mhe", options).normalizer
    _assert_within_bound(parts, options, fitted)


def test_more_parties_than_blocks_are_compared_across_ciphertexts() -> None:
    parties = minmax_layout.BLOCKS + 1  # two packed ciphertexts, compared pairwise first
    assert len(minmax_layout.party_groups(list(range(1, parties + 1)))) == 2
    rng = np.random.default_rng(4)
    parts = [rng.uniform(-1, 1, (4, 2)) for _ in range(parties)]
    options = _options((1.0,), {"minmax_bits": 4, "minmax_passes": 1})
    fitted = simulate(parts, "minmax", "mhe", options).normalizer
    _assert_within_bound(parts, options, fitted)


# -- plaintext pieces --------------------------------------------------------------------------
def test_a_window_maps_onto_the_headroom_and_back() -> None:
    window = minmax_layout.Window(np.array([-2.0, 0.0, 1.0]), np.array([2.0, 1.0, 3.0]))
    top = np.array([1.0, -np.inf, 0.5])
    scaled = window.encode(top)
    headroom = minmax_layout.HEADROOM
    np.testing.assert_allclose(scaled, [headroom / 2, -headroom, -headroom])
    np.testing.assert_allclose(window.decode(scaled)[0], 1.0)
    with pytest.raises(ProtocolError, match="below a local extreme"):
        window.encode(np.array([2.5, 0.0, 1.0]))
    narrowed = window.narrowed(np.array([1.0, 0.5, 2.0]), rounds=2, error_bound=0.01)
    assert np.all(narrowed.low < [1.0, 0.5, 2.0]) and np.all(narrowed.high > [1.0, 0.5, 2.0])


# -- input checks, before any encryption -----------------------------------------------------
@pytest.mark.parametrize(("vabs", "match"), [
    (None, "vabs"),
    ((1.0, 2.0, 3.0), "3 values for 2 features"),
    ((0.0,), "positive"),
    ((5.0, 1.0), r"beyond the agreed bound vabs: feature 2 \(\|x\| up to 3, bound 1\)$"),
])
def test_bad_or_violated_vabs_is_an_input_error_before_encryption(vabs, match) -> None:
    parts = [np.array([[1.0, 0.5], [2.0, -3.0]]), np.array([[0.0, 0.0]])]
    with _refused_before_encryption(match) as watch:
        _fit_watched(parts, FitOptions(preset="test", algorithm="paper", vabs=vabs), watch)


def test_bad_precision_settings_are_input_errors() -> None:
    parts = [np.ones((2, 1)), np.ones((2, 1))]
    for knobs in ({"minmax_bits": 80}, {"minmax_passes": 0}, {"minmax_bits": "many"}):
        with _refused_before_encryption() as watch:
            _fit_watched(parts, _options((2.0,), knobs), watch)


# -- the paper's setting -----------------------------------------------------------------------
@pytest.mark.slow
def test_ppf_minmax_at_the_paper_preset_with_ten_parties() -> None:
    rng = np.random.default_rng(7)
    parts = [np.hstack([rng.uniform(1e5, 1e6, (20, 2)) * [1, -1],
                        rng.uniform(1e-4, 1e-3, (20, 2)) * [1, -1]]) for _ in range(10)]
    options = FitOptions(preset="paper", algorithm="paper", vabs=(1e6, 1e6, 1.0, 1.0),
                         minmax_passes=4)
    # Within the flooded bound (2.6e-7 of V_abs at four passes); the paper's Table VI,
    # not flooded, reports min 2.92e-9 / 1.78e-4 and max 1.27e-8 / 4.64e-4 relative.
    _relative_errors(parts, options)


def test_values_beyond_vabs_are_refused_naming_features_from_one() -> None:
    parts = [np.array([[1.0, 50.0, 2.0]]), np.array([[1.0, 2.0, -90.0]])]  # party 1 first
    with pytest.raises(InputError, match=r"vabs: feature 2 \(\|x\| up to 50, bound 10\)$"):
        simulate(parts, "minmax", "mhe", _options((10.0,)))
