"""PPF z-score (paper Algorithm 1): pooled mean and variance under multiparty CKKS.

Line by line with the algorithm:

1. collective key generation (:func:`~fednorm.protocols.collective.setup_server`);
2. each party encrypts its per-feature sums S_p and counts n_p (lines 2–9);
3. the server adds them: ⟨S_g⟩, ⟨n_g⟩ (lines 11–13);
4. the server inverts ⟨n_g⟩ homomorphically, with collective bootstrapping when the
   levels run out (lines 14–16), multiplies ⟨μ⟩ = ⟨S_g⟩ ⊙ ⟨1/n_g⟩ (line 17), and the
   parties decrypt μ collectively (line 18);
5. each party encrypts Σ(x − μ)² (lines 20–25); the server adds them and multiplies by
   ⟨1/n_g⟩ (lines 28–29); σ² is decrypted collectively (line 31).

**Precision across magnitudes.**  A CKKS ciphertext holds every slot to about 2^-50 of
its *largest* slot, so a feature of order 1e-4 packed beside one of order 1e12 would
come out as noise.  Steps 4 and 5 therefore run as two passes: the first decryption
gives every feature's magnitude; the server sends per-feature powers of two, the
parties re-encrypt their vectors scaled by them (all slots now of one order), and the
second decryption is precise in every slot.  Both passes reveal the same quantity (the
first coarsely), so only μ and σ² are revealed; the pooled count stays encrypted.  A
coarse quotient too large to decode (beyond ~2^40) is decrypted once more, shifted by a
public 2^-40 (:func:`_coarse_quotient`).

**Sizes.**  Parties encrypt numerators at :func:`numerator_level` (the server multiplies
them twice, then decrypts): 5 of the 12 towers at the paper preset, 2.6 MB instead of
6.3 MB; a count that is only decrypted goes at 3 towers.

With ``FitOptions(reveal_counts=True)`` the count is decrypted instead of inverted
under encryption (FedAvg shares counts anyway): one decryption replaces the inverse and
its bootstraps, and n_g joins the revealed values.

The inverse covers counts in [1, ``max_count``]; it returns max_count/n_g, whose
outputs of order one keep their relative precision, and 1/max_count is folded into the
fresh numerator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    agreed_width,
    check_party_data,
    feature_counts,
    register,
)
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    serve_until,
    setup_party,
    setup_server,
)
from fednorm.protocols.normalizers import ZScoreNormalizer
from fednorm.protocols.plain.zscore import deviation_sums

M = TypeVar("M", bound=Message)
MAX_ABS_VALUE = 2.0**40
QUOTIENT_EXPONENT = 16  # the precise pass works on quotients of order 2^16
COARSE_SHIFT = 40  # a coarse quotient too large to decode is decrypted again at 2^-40
COARSE_DECRYPTIONS = 2  # so a party helps decrypt a coarse pass at most twice
COARSE_NOISE_FLOOR = 2.0**-10  # |coarse mean| below this counts as zero for scales
INVERSE_KEEP_LEVELS = 3  # levels the inverse leaves for the quotient products
SQUARES_FLOOR = 2.0**-80  # sums of squares do not cancel: lift even tiny variances
MAX_SCALED_VALUE = 2.0**50  # a party refuses scales pushing its |value · scale| beyond


@message("ppf_zscore.encrypted_sums")
class EncryptedSums(Message):
    total: openfhe.Ciphertext
    count: openfhe.Ciphertext
    width: int


@message("ppf_zscore.encrypted_vector")
class EncryptedVector(Message):
    """A party's per-feature vector, encrypted (possibly scaled by the server's scales)."""

    values: openfhe.Ciphertext


@message("ppf_zscore.scales")
class Scales(Message):
    """Per-feature powers of two to re-encrypt with, from the coarse pass."""

    scales: np.ndarray


@message("ppf_zscore.mean")
class PpfMean(Message):
    mean: np.ndarray


@message("ppf_zscore.result")
class PpfZScoreResult(Message):
    mean: np.ndarray
    var: np.ndarray


def check_ppf_values(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption, data the encrypted pipeline cannot carry."""
    X = check_party_data(X)
    if np.nanmax(np.abs(X), initial=0.0) > MAX_ABS_VALUE:
        raise InputError(f"PPF z-score supports |x| ≤ 2^40 ({MAX_ABS_VALUE:.3g})")
    if feature_counts(X).max(initial=0) > options.max_count:
        raise InputError(f"a party holds more than max_count={options.max_count} values")
    return X


# -- server -------------------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> ZScoreNormalizer:
    crypto = await setup_server(rc, options.preset, relinearize=not options.reveal_counts)
    sums = await rc.gather(EncryptedSums)
    width = agreed_width(sums)
    total = await crypto.add_all({p: m.total for p, m in sums.items()})
    count = await crypto.add_all({p: m.count for p, m in sums.items()})
    scaled_inverse, present = await _count_inverse(crypto, count, width, options)
    mean, var = await pooled_moments(crypto, total, scaled_inverse, width, options)
    mean, var = np.where(present, mean, np.nan), np.where(present, var, np.nan)
    await rc.broadcast(PpfZScoreResult(mean=mean, var=var))
    return ZScoreNormalizer(mean, var)


async def pooled_moments(
    crypto: ServerCrypto, total: openfhe.Ciphertext,
    scaled_inverse: openfhe.Ciphertext | np.ndarray, width: int, options: FitOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Lines 17–31 given ⟨S_g⟩ and ⟨max_count/n_g⟩: μ (decrypted, broadcast), then the
    parties' ⟨Σ(x − μ)²⟩ and σ².  PPF Yeo-Johnson runs this on its transformed data."""
    rc = crypto.rc
    mean = await precise_quotient(crypto, total, scaled_inverse, width, options)
    await rc.broadcast(PpfMean(mean=mean))
    squares = await rc.gather(EncryptedVector)
    squared = await crypto.add_all({p: m.values for p, m in squares.items()})
    var = np.maximum(
        await precise_quotient(crypto, squared, scaled_inverse, width, options,
                               floor=SQUARES_FLOOR), 0.0)
    return mean, var


async def _count_inverse(
    crypto: ServerCrypto, count: openfhe.Ciphertext, width: int, options: FitOptions
) -> tuple[openfhe.Ciphertext | np.ndarray, np.ndarray]:
    """⟨max_count / n_g⟩ under encryption, or in plaintext if counts are revealed; and
    which features hold any value at all (the others are NaN, as in plain mode)."""
    hi = float(options.max_count)
    if options.reveal_counts:
        pooled = np.rint(await crypto.decrypt_sum(count, width))
        return np.pad(hi / np.maximum(pooled, 1.0), (0, crypto.ckks.slots - width)), pooled > 0
    # Unused slots hold count 0, outside the inverse's range: pad them with 1 so they do
    # not blow up to ~8·max_count and cost precision in the slots that matter.
    padding = np.pad(np.zeros(width), (0, crypto.ckks.slots - width), constant_values=1.0)
    padded = await crypto.rc.run_sync(crypto.ckks.add, count, padding)
    inverse = await ckks.inverse(crypto.ckks, padded, 1.0, hi, crypto.bootstrap,
                                 out_scale=hi, keep_levels=INVERSE_KEEP_LEVELS)
    return inverse, await _present(crypto, count, inverse, width, options)


def inverse_plan(context: ckks.CkksContext, options: FitOptions) -> ckks.InversePlan:
    """The encrypted inverse's schedule on [1, max_count]: public, so every party knows
    how many collective bootstraps it takes (and refuses more)."""
    return ckks.plan_inverse(context.level_budget, 1.0, float(options.max_count),
                             keep_levels=INVERSE_KEEP_LEVELS)


async def _present(crypto: ServerCrypto, count: openfhe.Ciphertext,
                   inverse: openfhe.Ciphertext, width: int, options: FitOptions) -> np.ndarray:
    """Which features hold a value: n_g ⊙ (max_count/n_g) / max_count is 1 where n_g ≥ 1
    and 0 where n_g = 0 (one decryption, revealing one bit per feature)."""
    context = crypto.ckks
    ct = await crypto.rc.run_sync(
        lambda: context.mul(context.mul(count, inverse), 1.0 / options.max_count))
    return await crypto.decrypt(ct, width) > 0.5


async def precise_quotient(
    crypto: ServerCrypto, numerator: openfhe.Ciphertext,
    scaled_inverse: openfhe.Ciphertext | np.ndarray, width: int, options: FitOptions,
    floor: float = COARSE_NOISE_FLOOR,
) -> np.ndarray:
    """numerator / n_g per feature, in two passes (coarse, then at per-feature scales);
    the parties' side is :func:`precise_quotient_party`.  ``floor``: see
    :func:`power_of_two_scales` (a numerator of non-negative terms cannot cancel, so its
    floor may be far lower)."""
    rc = crypto.rc
    coarse = await _coarse_quotient(crypto, numerator, scaled_inverse, width, options)
    scales = power_of_two_scales(coarse, floor)
    await rc.broadcast(Scales(scales=scales))
    rescaled = await rc.gather(EncryptedVector)
    numerator = await crypto.add_all({p: m.values for p, m in rescaled.items()})
    precise = await _decrypt_quotient(crypto, numerator, scaled_inverse, width, options)
    return precise / scales


def power_of_two_scales(coarse: np.ndarray, floor: float = COARSE_NOISE_FLOOR) -> np.ndarray:
    """Per-feature powers of two bringing each |value| near 2^16.

    Measured: the product with the encrypted inverse carries a small absolute error, so
    quotients of order 2^10 and above keep the inverse's own relative precision (~1e-7)
    while quotients of order one lose digits.  Values at the noise floor of the largest
    are lifted only as far as that floor (what lies below it was never resolved), and a
    value below ``floor`` counts as zero: lifting a near-zero mean by 2^49 would push the
    parties' own scaled sums (which may be large while their pooled sum cancels, e.g.
    standardized data split by label) past what CKKS encodes.
    """
    magnitude = np.abs(coarse)
    floor = max(float(magnitude.max(initial=0.0)) * 2.0**-45, floor)
    exponents = np.round(np.log2(np.maximum(magnitude, floor)))
    return np.ldexp(1.0, (QUOTIENT_EXPONENT - exponents).astype(np.int64))


async def _coarse_quotient(
    crypto: ServerCrypto, numerator: openfhe.Ciphertext,
    scaled_inverse: openfhe.Ciphertext | np.ndarray, width: int, options: FitOptions,
) -> np.ndarray:
    """The coarse pass: numerator / n_g, decrypted once more at 2^-COARSE_SHIFT if too
    large to decode (quotients beyond ~2^40, e.g. variances of values beyond ~1e6).

    The second decryption reveals the same quotient, scaled by a public constant.
    Shifting the numerator *before* the product keeps the product's noise small; the
    shifted pass resolves quotients of ~2^14 … 2^54 (measured), enough for the scales.
    """
    if isinstance(scaled_inverse, np.ndarray):  # a flooded sum: it always decodes
        return await _decrypt_quotient(crypto, numerator, scaled_inverse, width, options)
    try:
        return await _decrypt_quotient(crypto, numerator, scaled_inverse, width, options)
    except ckks.DecodeOverflow:
        shifted = await crypto.rc.run_sync(crypto.ckks.mul, numerator, 2.0**-COARSE_SHIFT)
        quotient = await _decrypt_quotient(crypto, shifted, scaled_inverse, width, options)
        return quotient * 2.0**COARSE_SHIFT


async def _decrypt_quotient(
    crypto: ServerCrypto, numerator: openfhe.Ciphertext,
    scaled_inverse: openfhe.Ciphertext | np.ndarray, width: int, options: FitOptions,
) -> np.ndarray:
    """Decrypt ⟨numerator / n_g⟩ = (numerator · 1/max_count) ⊙ ⟨max_count / n_g⟩; with
    revealed counts, the numerator (a sum upload) is decrypted and divided in the clear."""
    if isinstance(scaled_inverse, np.ndarray):
        total = await crypto.decrypt_sum(numerator, width)
        return total * (scaled_inverse[:width] / options.max_count)
    context = crypto.ckks
    # 1/max_count is applied after the product: before it, the numerator would be tiny
    # and the product's absolute noise would swamp small-valued features.
    ct = await crypto.rc.run_sync(
        lambda: context.mul(context.mul(numerator, scaled_inverse), 1.0 / options.max_count))
    return await crypto.decrypt(ct, width)


# -- party --------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    X = check_ppf_values(X, options)
    crypto = await setup_party(rc, options.preset, relinearize=not options.reveal_counts,
                               flooding_bits=options.flooding_bits)
    passes = Passes(revealed=options.reveal_counts,
                    inverse_bootstraps=0 if options.reveal_counts
                    else inverse_plan(crypto.ckks, options).bootstraps)
    width = X.shape[1]
    total = np.nansum(X, axis=0)
    counts = feature_counts(X)
    if not options.reveal_counts:
        crypto.require_pooled_count_within(counts, options.max_count)
    await rc.send(SERVER, EncryptedSums(
        total=await passes.upload(crypto, total),
        # An encrypted-inverse count needs every level; a revealed one is only decrypted.
        count=await (crypto.encrypt_for_sum(counts) if options.reveal_counts
                     else crypto.encrypt(counts)), width=width))
    # One more decryption before the first pass: n_g (revealed counts) or the one bit per
    # feature of whether it holds any value (encrypted inverse).
    await share_moments(crypto, X, total, passes, extra_decryptions=1)
    result = await passes.serve(crypto, PpfZScoreResult, 1)
    return ZScoreNormalizer(as_float_vector(result.mean, width, "mean"),
                            as_float_vector(result.var, width, "variance"))


@dataclass(frozen=True)
class Passes:
    """How a party's side of the quotient passes travels.

    With revealed counts every value is a sum upload whose decryption the party floods
    (:meth:`ServerCrypto.decrypt_sum`); with the encrypted inverse it is a numerator the
    server multiplies by ⟨max_count/n_g⟩ before a (not flooded, see docs/LEAKAGE.md)
    decryption, which may be retried once at a smaller scale in a coarse pass.

    ``inverse_bootstraps``: the collective bootstraps of the encrypted inverse, all run
    before the first pass (the ledger's count; none at all later, none with revealed
    counts); None leaves them uncapped (a caller that bootstraps elsewhere).
    """

    revealed: bool = False
    inverse_bootstraps: int | None = None

    @property
    def coarse_decryptions(self) -> int:
        return 1 if self.revealed else COARSE_DECRYPTIONS

    async def upload(self, crypto: PartyCrypto, values: np.ndarray) -> openfhe.Ciphertext:
        if self.revealed:
            if np.nanmax(np.abs(values), initial=0.0) > ckks.MAX_SUM_VALUE:
                raise InputError(
                    "with revealed counts this party's sums travel as sum uploads, which "
                    f"hold up to 2^50 ({float(ckks.MAX_SUM_VALUE):.3g}); a sum (Σx or "
                    "Σ(x−μ)²) is larger: rescale the data, or use the encrypted inverse")
            return await crypto.encrypt_for_sum(values)
        return await crypto.encrypt(values, numerator_level(crypto.ckks))

    async def serve(self, crypto: PartyCrypto, expected: type[M], decryptions: int,
                    first: bool = False) -> M:
        """Answer ``decryptions`` requests of this run's kind (and the inverse's
        bootstraps if this is the ``first`` phase) until ``expected`` arrives."""
        bootstraps = None if self.inverse_bootstraps is None else \
            self.inverse_bootstraps if first else 0
        if self.revealed:
            return await serve_until(crypto, expected, decryptions=0, sums=decryptions,
                                     bootstraps=bootstraps)
        return await serve_until(crypto, expected, decryptions=decryptions,
                                 bootstraps=bootstraps)


async def share_moments(crypto: PartyCrypto, X: np.ndarray, total: np.ndarray,
                        passes: Passes = Passes(), extra_decryptions: int = 0) -> None:
    """Party side of :func:`pooled_moments`, once ``total`` (Σx) has been sent: the mean's
    two passes, then ⟨Σ(x − μ)²⟩ and its two passes.  The variance's precise pass is
    decrypted before the result arrives (``decryptions=1`` when awaiting it)."""
    width = X.shape[1]
    await precise_quotient_party(crypto, total, width, extra_decryptions, passes)
    # The precise pass is decrypted before the mean arrives.
    mean = as_float_vector((await passes.serve(crypto, PpfMean, 1)).mean,
                           width, "mean from the server")
    squared, _ = deviation_sums(X, mean)
    await crypto.rc.send(SERVER, EncryptedVector(values=await passes.upload(crypto, squared)))
    await precise_quotient_party(crypto, squared, width, passes=passes)


async def precise_quotient_party(
    crypto: PartyCrypto, local: np.ndarray, width: int, extra_decryptions: int = 0,
    passes: Passes = Passes(),
) -> None:
    """Party side of a two-pass quotient: help decrypt the coarse pass, re-encrypt scaled."""
    scales = await passes.serve(crypto, Scales, passes.coarse_decryptions + extra_decryptions,
                                first=extra_decryptions > 0)
    factors = as_float_vector(scales.scales, width, "scales from the server")
    if not np.all(np.isfinite(factors) & (factors > 0)):
        raise ProtocolError("the server sent invalid scales")
    if np.nanmax(np.abs(local * factors), initial=0.0) > MAX_SCALED_VALUE:
        raise InputError(
            "the precise pass cannot resolve a pooled mean this close to zero beside this "
            "party's large sums (|sum × scale| would pass 2^50, what CKKS encodes): refused "
            "(center or rescale the data first)")
    await crypto.rc.send(SERVER, EncryptedVector(
        values=await passes.upload(crypto, local * factors)))


def numerator_level(context: ckks.CkksContext) -> int:
    """The level parties encrypt numerators at: the server multiplies each twice (by the
    inverse count, then by 1/max_count) before decrypting it, so the towers a fresh
    ciphertext carries beyond that are dead weight on the wire (5 of 12 kept at the
    paper preset; the count, inverted in depth, stays at full level)."""
    return context.upload_level(2)


register("zscore", "mhe", server, party)
