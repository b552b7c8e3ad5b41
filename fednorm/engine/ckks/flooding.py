"""Noise flooding of decryption shares: the bound, and the noise itself.

A decryption share ``c0·[lead] + c1·s_i + e_i`` tells the server ``c1·s_i`` up to the
ciphertext's own noise; knowing a message exactly, the server would learn the noise,
which depends on the secret (Li–Micciancio's IND-CPA^D attacks).  Each party therefore
adds a fresh Gaussian whose standard deviation exceeds the ciphertext's noise bound
``B_ct`` by ``2^s·√N`` (``s`` the statistical security parameter): over the N
coefficients, the share with the noise is then within statistical distance ~2^-s of one
without it.

OpenFHE 1.6.1 offers ``NOISE_FLOODING_MULTIPARTY`` only for BFV/BGV; for CKKS its
``MultipartyDecryptMain`` adds a fixed Gaussian (σ = 2^20), and ``Compress`` rescales a
share, which divides even that by the dropped moduli (~2^50).  So the flooding noise is
added here, as a plaintext polynomial added to the share *after* it is compressed — at
the modulus and scale it is sent at, where nothing divides it away.

The bound ``B_ct`` is the one of a *sum of fresh encryptions* (what the linear
decryptions of fednorm reveal, see docs/LEAKAGE.md): with ternary secrets and encryption
randomness, discrete Gaussian errors (σ = 3.19) and P parties, a fresh joint encryption's
noise ``v·e_pk + e_0 + e_1·s`` has per-coefficient variance σ²(1 + 4NP/3); a sum of k of
them k times that, and ``B_ct`` is 8 standard deviations of it.  Uploads for such sums
are encoded at scale Δ² (2^100), so the flooding costs no precision that matters (the
fused error stays near 1e-11 absolute at P=10, paper preset).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.errors import InputError

ERROR_SIGMA = 3.19  # OpenFHE's discrete Gaussian for RLWE errors
TAIL = 8.0  # B_ct is this many standard deviations: exceeded with probability < 1e-15
MIN_SECURITY_BITS = 20
DEFAULT_SECURITY_BITS = 30


def check_security_bits(bits: int) -> int:
    """The statistical security parameter s, refused below 20."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < MIN_SECURITY_BITS:
        raise InputError(f"flooding security must be an integer >= {MIN_SECURITY_BITS} bits, "
                         f"got {bits!r}")
    return bits


@dataclass(frozen=True)
class Flooding:
    """How much noise a party adds to a decryption share of a sum of fresh ciphertexts.

    All quantities are per polynomial coefficient, in the ciphertext's own units (the
    integer coefficients mod q); divide by the scale for the value units of slots.
    """

    ring_dim: int
    parties: int
    summands: int  # fresh ciphertexts added into the decrypted one (at most)
    security_bits: int = DEFAULT_SECURITY_BITS

    def __post_init__(self) -> None:
        check_security_bits(self.security_bits)
        if self.parties < 1 or self.summands < 1:
            raise InputError("flooding needs at least one party and one summand")

    @property
    def ciphertext_noise_bound(self) -> float:
        """B_ct: a bound on any coefficient of the decrypted sum's noise."""
        per_fresh = ERROR_SIGMA * math.sqrt(1 + 4 * self.ring_dim * self.parties / 3)
        return TAIL * per_fresh * math.sqrt(self.summands)

    @property
    def sigma(self) -> float:
        """B_flood: the standard deviation of the noise each party adds, 2^s·√N·B_ct."""
        return 2.0**self.security_bits * math.sqrt(self.ring_dim) * self.ciphertext_noise_bound

    def slot_sigma(self, scale: float) -> float:
        """The added noise's standard deviation in each slot's real part, at ``scale``
        (a coefficient Gaussian of std σ is one of std σ·√(N/2)/scale per slot)."""
        return self.sigma * math.sqrt(self.ring_dim / 2) / scale


def flood_share(ctx: CkksContext, share: openfhe.Ciphertext,
                flooding: Flooding) -> openfhe.Ciphertext:
    """``share`` plus Gaussian noise of std ``flooding.sigma`` in every coefficient.

    The noise is drawn in the slots (independent complex Gaussians, from the operating
    system's CSPRNG), which the encoding maps to independent Gaussian coefficients; it
    is added at the share's own level and scale, after any compression.
    """
    noise = secure_complex_gaussians(ctx.slots, flooding.slot_sigma(share.GetScalingFactor()))
    plaintext = ctx.raw.MakeCKKSPackedPlaintext(noise.tolist(), share.GetNoiseScaleDeg(),
                                                share.GetLevel())
    return ctx.raw.EvalAdd(share, plaintext)


def secure_complex_gaussians(count: int, sigma: float) -> np.ndarray:
    """``count`` complex numbers with independent N(0, σ²) real and imaginary parts, by
    Box–Muller from ``os.urandom`` (flooding noise must be unpredictable)."""
    words = np.frombuffer(os.urandom(16 * count), dtype=np.uint64).reshape(2, count)
    u1, u2 = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # in (0, 1]
    radius = sigma * np.sqrt(-2.0 * np.log(u1))
    return radius * np.exp(2j * np.pi * u2)
