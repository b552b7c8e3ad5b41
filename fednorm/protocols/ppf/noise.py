"""The noise each flooded decryption of the paper's algorithms declares, so that every
party floods its share by it (:class:`~fednorm.engine.ckks.DecryptionNoise`).

No proof bounds the noise of a comparison polynomial after collective bootstraps, nor
of a product of flags each refreshed on the way, so fednorm sizes their flooding as
OpenFHE sizes CKKS flooding where it cannot bound the noise: the same computation, run on
fresh keys whose joint secret is known, its decrypted noise measured (the standard
deviation of the slots' imaginary parts, which a computation on real values leaves as
pure noise; :mod:`fednorm.bench.decryption_noise`), over ordinary data, data near the
bounds, tiny values and mixed magnitudes (``fednorm bench --sections flooding --preset
test --parties 3``, and at the paper preset with 10 parties).  Each kind is declared one
bit above the largest measured (``tests/test_decryption_noise.py`` measures again through
the real roles and fails if a declared noise lies below what it measures).

Measured, the largest log2 σ per coefficient per unit of scale, before the margin (test
preset, P = 3; paper preset, P = 10):

=====================  =========  =========  ============================================
kind                   test       paper      what is decrypted
=====================  =========  =========  ============================================
MinMax pass            -38.0      -36.4      each window's maximum, within ±2·HEADROOM
Yeo-Johnson flags      -44.1      -42.1      a product of 0/1 flags
=====================  =========  =========  ============================================

The other decryptions of the paper's algorithms are not flooded (docs/LEAKAGE.md gives
the numbers): flooded this way, the z-score presence bit as first computed (measured
-39.5 / -37.3) would have carried noise of σ 0.012 / 0.15 around its 0 or 1, too close to
0.5 for every bit to come out right (it is now a flooded product of fresh bits); the
quotients (μ and σ² over the encrypted inverse, and Yeo-Johnson's) carry a noise that
grows with the largest value decrypted (2^-45.9 / 2^-46.6 of it beyond a floor of
2^-39.5 / 2^-37.3) and with the pooled count, which only public bounds (V_abs,
max_count) would size, and flooded by those bounds they kept no useful precision
(measured, docs/LEAKAGE.md "Why not the others"); and
Yeo-Johnson's search signs (2^-21.6 / 2^-20.8 of values in [−1, 1]) would keep no
significant bit.
"""

from __future__ import annotations

from typing import Protocol

from fednorm.engine import ckks
from fednorm.engine.ckks.presets import CkksPreset


class FloodingOptions(Protocol):
    """What the flooding of a fit is sized by: s and τ (``FitOptions`` has both)."""

    flooding_bits: int
    flooding_decryptions: int

MARGIN_BITS = 1.0
CALIBRATED_PARTIES = {"test": 3, "paper": 10}

MINMAX_PASS = "MinMax pass"
SIGN_FLAGS = "Yeo-Johnson sign flags"

MEASURED: dict[str, dict[str, float]] = {
    MINMAX_PASS: {"test": -38.0, "paper": -36.4},
    SIGN_FLAGS: {"test": -44.1, "paper": -42.1},
}
"""kind → preset → the measured floor, log2 σ per coefficient per unit of scale."""


def declared(kind: str, preset: CkksPreset) -> ckks.DecryptionNoise:
    """The noise a decryption of ``kind`` declares at ``preset``: the measured noise, one
    bit up."""
    return ckks.DecryptionNoise(kind, MEASURED[kind][preset.name] + MARGIN_BITS,
                                CALIBRATED_PARTIES[preset.name])


def fused_sigma(declared: ckks.DecryptionNoise, preset: CkksPreset, parties: int,
                options: FloodingOptions) -> float:
    """The standard deviation all parties' flooding adds to each value such a decryption
    reveals, with the fit's flooding options (s, τ)."""
    flooding = ckks.MeasuredFlooding(preset.ring_dim, parties, 1, options.flooding_bits,
                                     options.flooding_decryptions, noise=declared, scale=1.0)
    return flooding.fused_value_sigma()
