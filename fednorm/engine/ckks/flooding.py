"""Noise flooding of decryption shares: the bound, and the noise itself.

A decryption share ``c0·[lead] + c1·s_i + e_i`` tells the server ``c1·s_i`` up to the
ciphertext's own noise; knowing a message exactly, the server would learn the noise,
which depends on the secret (Li–Micciancio's IND-CPA^D attacks).  Each party therefore
adds a fresh integer Gaussian to every coefficient of its share.

Size, as OpenFHE sizes CKKS flooding (Li–Micciancio–Schultz–Sorrell 2022, as corrected
in OpenFHE's CKKS noise-flooding notes): σ = √(12τ)·2^(s/2)·t per coefficient, in the
coefficient embedding, where ``t`` bounds the noise of what is decrypted, ``τ`` is the
number of decryptions the joint key serves and ``s`` the statistical security parameter.
For a *sum of fresh encryptions* (what fednorm's flooded decryptions reveal) ``t`` is a
proven bound: with ternary secrets and encryption randomness, discrete Gaussian errors
(σ_e = 3.19) and P parties, a fresh joint encryption's noise ``v·e_pk + e_0 + e_1·s``
has per-coefficient variance σ_e²(1 + 4NP/3), a sum of k of them k times that, and ``t``
is 8 standard deviations of it.

For a *product of fresh encryptions of bits* (slot values in [0, 1], :class:`ProductFlooding`;
the paper z-score's presence bits) the bound follows the noise through the
product tree.  A product of ciphertexts Δ_a·m_a + e_a and Δ_b·m_b + e_b has noise
Δ_a·m_a·e_b + Δ_b·m_b·e_a + e_a·e_b plus the key switching of relinearization.  A
coefficient of m_a·e_b has variance Var(e_b)·‖m_a‖², and ‖m_a‖² (the coefficient vector's)
is the mean square of the slots, at most 1 for bits; so relative to the scale, the
variances of the factors' noises add up, and e_a·e_b (N·σ² against Δ²·σ²) is
negligible.  A rescale adds its rounding τ_0 + τ_1·s, of variance (1 + 2NP/3)/12 at the
new scale (σ_r ≈ 95 at N = 2^14, P = 10), and key switching divides its noise by the
special modulus, to below that.  Bits are uploaded at scale Δ² ≈ 2^100, so each factor
is rescaled before its first product: its encryption noise (σ_fresh ≈ 1500, as above)
shrinks by ~2^50 and the rounding, 16× smaller, takes its place, which leaves the
flooded bits 16× more headroom.  A product of F factors has F such roundings, F − 1
products each rescaled once and F − 1 key switchings: the bound counts 3F roundings,
t = 8·√(F·((Δ_prod/Δ_upload)·σ_fresh)² + 3F·σ_r²), the scales along the tree all ≈ Δ.
The product is decrypted rescaled (scale ≈ Δ, :data:`~.context.PRODUCT_TOWERS` towers),
so σ (≈ 2^34) stays in the range of the integer sampler, where at scale Δ² it would be
~2^84.  Measured (test preset, P = 10, every slot 1 — the largest noise — read with the
joint secret in the coefficient domain, ``tests/test_ppf_extremes.py``): noise std
2^8.70 where the bound's σ is 2^9.03, largest coefficient 2^10.7 against t = 2^12.0;
the flooded bits (s = 30, τ = 1024) within 0.022 of 0 and 1 (0.22 with bits uploaded at
scale Δ, whose encryption noise the product then carries).

For a *computed* ciphertext (a comparison after collective bootstraps, a product of
flags refreshed on the way: :class:`MeasuredFlooding`) no proof bounds the noise, so
``t`` is what the step declares (:class:`DecryptionNoise`): its noise measured as
OpenFHE measures it for CKKS flooding, on fresh keys whose joint secret is known, 8 of
those standard deviations at the request's scale.  Such a request is compressed to
:data:`FLOODED_TOWERS` towers at scale Δ, and its shares are decoded by the server
itself (:mod:`.decoding`).

Where: OpenFHE 1.6.1 offers ``NOISE_FLOODING_MULTIPARTY`` only for BFV/BGV, and its
slot encoder cannot carry such noise (it scales every coefficient by the integer scaling
factor, so noise encoded through it sits on a sublattice a server reduces away, and real
slot values make coefficients i and N−i opposite).  So the noise is written into the
share's own ring element: N independent integers from the operating system's CSPRNG,
carried into every RNS tower by the number-theoretic transform (:mod:`.ring`), at the
modulus the share is sent at, after any compression.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import openfhe

from fednorm.engine.ckks import ring
from fednorm.engine.ckks.context import COEFFICIENT_TOWERS, PRODUCT_TOWERS, SUM_TOWERS, CkksContext
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import InputError, ProtocolError

ERROR_SIGMA = 3.19  # OpenFHE's discrete Gaussian for RLWE errors
TAIL = 8.0  # B_ct is this many standard deviations: exceeded with probability < 1e-15
MIN_SECURITY_BITS = 20
DEFAULT_SECURITY_BITS = 30
DEFAULT_DECRYPTIONS = 1024  # τ: flooded decryptions one joint key serves, at most


def check_security_bits(bits: int) -> int:
    """The statistical security parameter s, refused below 20."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < MIN_SECURITY_BITS:
        raise InputError(f"flooding security must be an integer >= {MIN_SECURITY_BITS} bits, "
                         f"got {bits!r}")
    return bits


def check_decryptions(decryptions: int) -> int:
    """τ, the flooded decryptions a joint key may serve: a positive integer."""
    if isinstance(decryptions, bool) or not isinstance(decryptions, int) or decryptions < 1:
        raise InputError(f"flooded decryptions per key must be a positive integer, "
                         f"got {decryptions!r}")
    return decryptions


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
    decryptions: int = DEFAULT_DECRYPTIONS  # τ
    enabled: bool = field(default=True, kw_only=True)
    """False: every size still computed, the noise left out of the share — only for
    measuring what flooding costs (``FitOptions.flood``, a simulation's own choice)."""

    def __post_init__(self) -> None:
        check_security_bits(self.security_bits)
        check_decryptions(self.decryptions)
        if self.parties < 1 or self.summands < 1:
            raise InputError("flooding needs at least one party and one summand")

    @property
    def decrypted_shape(self) -> tuple[str, int, int]:
        """What the bound is for: its name, scale degree and towers (a sum upload's)."""
        return "a sum upload", 2, SUM_TOWERS

    @property
    def fresh_sigma(self) -> float:
        """σ of a coefficient of a fresh joint encryption's noise: σ_e·√(1 + 4NP/3)."""
        return ERROR_SIGMA * math.sqrt(1 + 4 * self.ring_dim * self.parties / 3)

    @property
    def ciphertext_noise_bound(self) -> float:
        """t: a bound on any coefficient of the decrypted sum's noise."""
        return TAIL * self.fresh_sigma * math.sqrt(self.summands)

    @property
    def sigma(self) -> float:
        """σ of the integer Gaussian each party adds per coefficient: √(12τ)·2^(s/2)·t."""
        return (math.sqrt(12 * self.decryptions) * 2.0 ** (self.security_bits / 2)
                * self.ciphertext_noise_bound)

    def slot_sigma(self, scale: float) -> float:
        """The added noise's standard deviation in each slot's real part, at ``scale``
        (a coefficient Gaussian of std σ is one of std σ·√(N/2)/scale per slot)."""
        return self.sigma * math.sqrt(self.ring_dim / 2) / scale


@dataclass(frozen=True)
class CoefficientFlooding(Flooding):
    """The noise a party adds to a decryption share of a sum of the parties' masked
    uploads (:mod:`.masking`): a sum of fresh encryptions like any sum upload, so the same
    proven bound; only its shape differs (scale Δ, :data:`~.context.COEFFICIENT_TOWERS`
    towers)."""

    @property
    def decrypted_shape(self) -> tuple[str, int, int]:
        return "a coefficient sum", 1, COEFFICIENT_TOWERS


@dataclass(frozen=True)
class ProductFlooding(Flooding):
    """The noise a party adds to a decryption share of a product of ``summands`` (its
    factors, one per party) fresh encryptions of bits, multiplied by a tree of
    relinearized, rescaled products (module doc).

    ``growth`` is the product's scale over a factor's as uploaded (Δ_prod/Δ_upload,
    ≈ 2^-50 for uploads at scale Δ² and a product rescaled to scale Δ): the uploads'
    noise is carried to the product's units with it.
    """

    growth: float = 1.0

    @property
    def decrypted_shape(self) -> tuple[str, int, int]:
        """A product rescaled to :data:`~.context.PRODUCT_TOWERS` towers."""
        return "a product", 1, PRODUCT_TOWERS

    @property
    def rounding_sigma(self) -> float:
        """σ of a rescale's rounding τ_0 + τ_1·s (joint secret of P ternary shares)."""
        return math.sqrt((1 + 2 * self.ring_dim * self.parties / 3) / 12)

    @property
    def ciphertext_noise_bound(self) -> float:
        """t: a bound on any coefficient of the decrypted product's noise."""
        carried = (self.fresh_sigma * self.growth) ** 2
        return TAIL * math.sqrt(self.summands * (carried + 3 * self.rounding_sigma ** 2))


@dataclass(frozen=True)
class DecryptionNoise:
    """What a flooded decryption of a *computed* ciphertext (not a sum or product of
    uploads) declares about the noise it decrypts, for OpenFHE's way of sizing flooding
    where no proof bounds it: run the same computation on fresh keys and measure.

    ``kind`` names the computation; ``log2_sigma`` is the measured standard deviation of
    its noise per coefficient, per unit of the ciphertext's scale, at
    ``calibrated_parties`` parties (:mod:`fednorm.bench.decryption_noise` measures it).
    Beyond that many parties the noise grows as √P (each party's encryption and bootstrap
    shares add their own).  Only computations whose noise does not grow with data-dependent
    values are declared so (bits, comparisons on a fixed window): for the others no one
    number bounds it.
    """

    kind: str
    log2_sigma: float
    calibrated_parties: int

    def relative_sigma(self, parties: int) -> float:
        """σ of the decrypted request's noise per coefficient, per unit of scale."""
        return 2.0**self.log2_sigma * math.sqrt(max(1.0, parties / self.calibrated_parties))


FLOODED_TOWERS = 2  # a flooded decryption request: compressed to 2 towers, scale ≈ Δ


@dataclass(frozen=True)
class MeasuredFlooding(Flooding):
    """The noise a party adds to a decryption share of a computed ciphertext, sized by
    the decryption's declared, measured noise (:class:`DecryptionNoise`) at the request's
    scale: t = 8 σ, σ the declared noise times the scale."""

    noise: DecryptionNoise = field(kw_only=True)
    scale: float = field(kw_only=True)

    @property
    def decrypted_shape(self) -> tuple[str, int, int]:
        return "a flooded decryption request", 1, FLOODED_TOWERS

    @property
    def ciphertext_noise_bound(self) -> float:
        if self.scale <= 0:
            raise InputError("a measured flooding needs the request's scale")
        return TAIL * self.noise.relative_sigma(self.parties) * self.scale

    def fused_value_sigma(self) -> float:
        """The standard deviation all P parties' flooding adds to each decrypted value, in
        the values' units (the scale cancels)."""
        return self.slot_sigma(self.scale) * math.sqrt(self.parties)


def flood_share(ctx: CkksContext, share: openfhe.Ciphertext,
                flooding: Flooding) -> openfhe.Ciphertext:
    """``share`` plus an independent integer Gaussian of std ``flooding.sigma`` in each
    of its N coefficients, written into every RNS tower the share is sent with."""
    if share.NumberCiphertextElements() != 1:
        raise ProtocolError("only a one-element decryption share can be flooded")
    if not flooding.enabled:
        return share
    data = bytearray(openfhe.Serialize(share, openfhe.BINARY))
    moduli = ctx.moduli[:ctx.towers(share)]
    towers = ring.locate_towers(data, ctx.preset.ring_dim, len(moduli), moduli)
    for i, spread in enumerate(_noise_towers(ctx, moduli, flooding.sigma)):
        towers.write(data, i, ring.add_mod(towers.read(data, i), spread, moduli[i]))
    return deserialize(openfhe.DeserializeCiphertextString, bytes(data))


def _noise_towers(ctx: CkksContext, moduli: tuple[int, ...], sigma: float
                  ) -> Iterator[np.ndarray]:
    """N fresh integer Gaussians of std ``sigma`` (one per coefficient), carried into each
    tower of ``moduli`` in the evaluation domain."""
    n = ctx.preset.ring_dim
    noise = secure_integer_gaussians(n, sigma)
    for modulus in moduli:
        yield ring.ntt(modulus, n).forward(ring.residues(noise, modulus))


def flooded_share(ctx: CkksContext, ct: openfhe.Ciphertext, secret: ring.Multiplier,
                  lead: bool, flooding: Flooding) -> openfhe.Ciphertext:
    """A party's flooded decryption share of ``ct``, made here: ``c1·s_i`` (plus ``c0``
    for the lead) plus an integer Gaussian of std ``flooding.sigma`` in each coefficient,
    in every tower of ``ct``.  What OpenFHE's ``MultipartyDecryptMain`` / ``Lead`` and
    :func:`flood_share` make together, less OpenFHE's fixed Gaussian (σ = 2^20, far
    below the flooding), whose sampling is most of OpenFHE's share; here a ring product
    per tower takes its place.  ``secret``: the party's secret key share, evaluation
    domain, at least ``ct``'s towers."""
    if not flooding.enabled:
        raise InputError("a share made here is always flooded (flooding off: OpenFHE's)")
    n = ctx.preset.ring_dim
    moduli = ctx.moduli[:ctx.towers(ct)]
    whole = openfhe.Serialize(ct, openfhe.BINARY)
    c1 = ring.locate_towers(whole, n, len(moduli), moduli)  # the last element
    one_element = ct.Clone()
    one_element.RemoveElement(1)  # the share's shape: ct's metadata, one element (c0)
    data = bytearray(openfhe.Serialize(one_element, openfhe.BINARY))
    c0 = ring.locate_towers(data, n, len(moduli), moduli)
    for i, spread in enumerate(_noise_towers(ctx, moduli, flooding.sigma)):
        share = secret.times(i, c1.read(whole, i))
        if lead:
            share = ring.add_mod(share, c0.read(data, i), moduli[i])
        c0.write(data, i, ring.add_mod(share, spread, moduli[i]))
    return deserialize(openfhe.DeserializeCiphertextString, bytes(data))


def secure_integer_gaussians(count: int, sigma: float) -> np.ndarray:
    """``count`` independent integers, each N(0, σ²) rounded (int64), by Box–Muller from
    ``os.urandom``: flooding noise must be unpredictable.  σ must stay below 2^56."""
    if not 0 < sigma < 2.0**56:
        raise InputError(f"flooding σ = {sigma:.3g} outside (0, 2^56)")
    words = np.frombuffer(os.urandom(16 * count), dtype=np.uint64).reshape(2, count)
    u1, u2 = ((words >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # in (0, 1]
    return np.rint(sigma * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)) \
        .astype(np.int64)
