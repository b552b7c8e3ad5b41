"""Flooded decryptions of computed ciphertexts (the paper's algorithms' MinMax passes and
Yeo-Johnson sign flags): the server decodes the shares itself, as OpenFHE would;
a party's flooding, read from the ring, is the declared σ in every coefficient even
beyond the smallest tower; and every declared noise lies above the noise measured with
the joint secret in real runs (the calibration of ``fednorm.protocols.ppf.noise``)."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np
import pytest
from ckks_federation import PARTIES as P
from ckks_federation import CkksFederation
from ring_reading import flooding_noise

from fednorm.bench.decryption_noise import calibration_cases, measure_decryptions
from fednorm.engine.ckks import DecryptionNoise, FloodedDecryption, MeasuredFlooding
from fednorm.engine.ckks.decoding import fused_slots
from fednorm.engine.ckks.flooding import flood_share
from fednorm.protocols import FitOptions
from fednorm.protocols.ppf import noise


def _computed(fed: CkksFederation, values: np.ndarray):
    """A ciphertext one product away from a fresh encryption of ``values``."""
    return fed.ctx.mul(fed.encrypt(values), 1.0)


def test_the_server_decodes_fused_shares_as_openfhe_does(fed: CkksFederation) -> None:
    """Slot order and scale: the same raw shares, fused and decoded here and by OpenFHE
    (which adds a little noise of its own when decoding)."""
    x = np.random.default_rng(3).normal(0, 100, fed.ctx.slots)
    declared = DecryptionNoise("test", -40.0, P)
    request = FloodedDecryption(fed.ctx, declared).prepare(_computed(fed, x))
    raw = fed.raw_shares(request)
    ours = fused_slots(fed.ctx, raw, request.GetScalingFactor())
    theirs = np.array(fed.ctx.raw.MultipartyDecryptFusion(raw).GetRealPackedValue())
    assert np.abs(ours - theirs).max() < 1e-4
    assert np.abs(ours - x).max() < 1e-4


def test_a_share_is_flooded_as_declared_beyond_the_smallest_tower(fed: CkksFederation
                                                                   ) -> None:
    """σ ≈ 2^53, above the 51-bit second tower: every coefficient's noise is reduced in
    each tower (before, values past the modulus were written unreduced), the added
    polynomial has gcd 1 and σ within 5 % of the declared, and the fused values are
    within 6 fused standard deviations."""
    x = np.random.default_rng(4).uniform(-1, 1, fed.ctx.slots)
    declared = DecryptionNoise("test", -22.0, P)
    request = FloodedDecryption(fed.ctx, declared).prepare(_computed(fed, x))
    flooding = MeasuredFlooding(fed.n, P, 1, noise=declared,
                                scale=request.GetScalingFactor())
    assert 2.0**52 < flooding.sigma < 2.0**56 and fed.ctx.moduli[1] < 2**52
    before = fed.raw_shares(request)[1]
    drawn = np.array(flooding_noise(fed.ctx, before, flood_share(fed.ctx, before, flooding)),
                     dtype=object)
    assert reduce(math.gcd, drawn.tolist()) == 1
    assert abs(np.std(drawn.astype(np.float64)) / flooding.sigma - 1) < 0.05
    decryption = FloodedDecryption(fed.ctx, declared, flooding)
    shares = [decryption.generate_share(p, request) for p in fed.parties]
    out = decryption.finalize(decryption.aggregate_shares(fed.joint, request, shares), 64)
    assert np.abs(out - x[:64]).max() < 6 * flooding.fused_value_sigma()


def _parts(seed: int, scale: float) -> list[np.ndarray]:
    """Three parties of mixed magnitudes: tiny, ordinary and near the bound."""
    rng = np.random.default_rng(seed)
    return [np.column_stack([rng.normal(1e-3, 1e-3, 9), rng.normal(5, 2, 9),
                             rng.uniform(-scale, scale, 9)]) for _ in range(3)]


CASES = {
    "zscore": FitOptions(algorithm="paper", preset="test"),
    "minmax": FitOptions(algorithm="paper", preset="test", vabs=(0.01, 20.0, 1e3)),
    "yeojohnson": FitOptions(algorithm="paper", preset="test", vabs=(0.01, 20.0, 1e3)),
}
FLOODED = {"zscore": set(), "minmax": {noise.MINMAX_PASS}, "yeojohnson": {noise.SIGN_FLAGS}}


@pytest.mark.parametrize("method", sorted(CASES))
def test_every_declared_noise_lies_above_the_measured_one(method: str) -> None:
    """Each request of a real run, read with the joint secret: the declared noise (at
    the run's P) above the measured, by less than 8 bits (a declaration far above would
    cost precision for nothing); the kinds not flooded are the ones the ledger names."""
    rows = measure_decryptions(method, _parts(5, 1e3), CASES[method])
    flooded = [r for r in rows if r.declared is not None]
    assert {r.kind for r in flooded} == FLOODED[method]
    assert all(0 < r.margin_bits < 8 for r in flooded), [
        (r.kind, r.margin_bits) for r in flooded]
    plain = {r.kind for r in rows if r.declared is None}
    assert plain == (set() if method == "minmax" else {"not flooded"})


def test_a_request_is_read_with_the_largest_value_it_decrypts() -> None:
    """The paper z-score's first quotient request decrypts the pooled means: the largest
    value read from it with the joint secret is the largest |mean|, which is what the
    noise of a quotient grows with (the calibration's 'relative' column)."""
    parts = _parts(7, 40.0)
    rows = measure_decryptions("zscore", parts, CASES["zscore"])
    largest = float(np.abs(np.vstack(parts).mean(axis=0)).max())
    assert abs(rows[0].largest_log2 - math.log2(largest)) < 1e-3


def test_the_quotients_noise_grows_with_the_pooled_count() -> None:
    """The paper z-score's precise quotient passes (values near 2^16), read with the joint
    secret: over 2^20 pooled rows (the calibration's largest case) their noise per unit of
    value is at least 2^4 times that over 3 × 40 rows, which is why docs/LEAKAGE.md says a
    flooding of them must be sized for the largest count ``max_count`` allows."""
    cases = {name: (parts, vabs) for name, parts, vabs in calibration_cases(3, "zscore")}

    def relative(name: str) -> float:
        parts, vabs = cases[name]
        rows = measure_decryptions("zscore", parts,
                                   FitOptions(algorithm="paper", preset="test", vabs=vabs))
        return max(r.measured_log2 - r.largest_log2 for r in rows if r.largest_log2 > 10)

    assert relative("counts at max_count") > relative("ordinary") + 4
