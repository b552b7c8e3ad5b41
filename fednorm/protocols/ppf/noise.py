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
z-score quotient       TESTQ      PAPERQ     μ or σ² at public scales (at most 2^16),
                                             per slot at that bound, n_g near 2^20
=====================  =========  =========  ============================================

A quotient's noise grows with the values it decrypts (it sits in each slot in
proportion to the slot's value: σ per coefficient √W times one slot's for W slots at the
bound) and with the pooled count (2^-45 of the value at n_g = 10^3, 2^-40.4 at 10^6,
test preset), so the z-score's quotients are flooded only when V_abs bounds their values
(:class:`~.quotient.BoundedQuotients`), declared for W = the run's width, and measured on
means and variances at their bounds over a pooled count of 2^20, the most ``max_count``
allows with them (:data:`CALIBRATED_COUNT`).

The other decryptions of the paper's algorithms are not flooded (docs/LEAKAGE.md gives
the numbers): flooded this way, the z-score presence bit as first computed (measured
-39.5 / -37.3) would have carried noise of σ 0.012 / 0.15 around its 0 or 1, too close to
0.5 for every bit to come out right (it is now a flooded product of fresh bits); the
z-score's quotients without V_abs, and Yeo-Johnson's, have no public bound on their
values; and Yeo-Johnson's search signs (2^-21.6 / 2^-20.8 of values in [−1, 1]) would
keep no significant bit.
"""

from __future__ import annotations

import math
from typing import Protocol

from fednorm.engine import ckks
from fednorm.engine.ckks.presets import CkksPreset


class FloodingOptions(Protocol):
    """What the flooding of a fit is sized by: s and τ (``FitOptions`` has both)."""

    flooding_bits: int
    flooding_decryptions: int

MARGIN_BITS = 1.0
CALIBRATED_PARTIES = {"test": 3, "paper": 10}
CALIBRATED_COUNT = 2**20
"""The largest pooled count the z-score quotient's noise was measured at: it grows with
n_g, so a run whose ``max_count`` allows more is refused."""

MINMAX_PASS = "MinMax pass"
SIGN_FLAGS = "Yeo-Johnson sign flags"
BOUNDED_QUOTIENT = "z-score quotient"

MEASURED: dict[str, dict[str, float]] = {
    MINMAX_PASS: {"test": -38.0, "paper": -36.4},
    SIGN_FLAGS: {"test": -44.1, "paper": -42.1},
    BOUNDED_QUOTIENT: {"test": -24.6, "paper": -23.1},
}
"""kind → preset → the measured floor, log2 σ per coefficient per unit of scale."""


def declared(kind: str, preset: CkksPreset, slots: int = 1) -> ckks.DecryptionNoise:
    """The noise a decryption of ``kind`` declares at ``preset``: the measured noise, one
    bit up; for a quotient, whose noise sits in the slots it decrypts in proportion to
    their values, that of ``slots`` slots each at the bound (√slots times one's)."""
    spread = 0.5 * math.log2(slots) if kind == BOUNDED_QUOTIENT else 0.0
    return ckks.DecryptionNoise(kind, MEASURED[kind][preset.name] + MARGIN_BITS + spread,
                                CALIBRATED_PARTIES[preset.name])


def fused_sigma(declared: ckks.DecryptionNoise, preset: CkksPreset, parties: int,
                options: FloodingOptions) -> float:
    """The standard deviation all parties' flooding adds to each value such a decryption
    reveals, with the fit's flooding options (s, τ)."""
    flooding = ckks.MeasuredFlooding(preset.ring_dim, parties, 1, options.flooding_bits,
                                     options.flooding_decryptions, noise=declared, scale=1.0)
    return flooding.fused_value_sigma()
