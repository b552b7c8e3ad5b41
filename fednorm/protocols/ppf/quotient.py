"""The two-pass quotient: numerator / n_g per feature, precise at every magnitude.

A CKKS ciphertext holds every slot to about 2^-50 of its *largest* slot, so a feature of
order 1e-4 packed beside one of order 1e12 would come out as noise.  A quotient is
therefore decrypted twice: the coarse pass gives every feature's magnitude; the server
sends per-feature powers of two (:class:`Scales`), the parties re-encrypt their
numerators scaled by them (all slots now of one order), and the precise pass is exact in
every slot.  Both passes reveal the same quantity (the first coarsely).  A coarse
quotient too large to decode is decrypted once more, shifted by the public 2^-40: the
retry each coarse pass declares (:data:`COARSE`), bound to the first request
(:func:`_coarse_quotient`).

The denominator is the encrypted ⟨max_count / n_g⟩ (an encrypted inverse) or, with
revealed counts, max_count / n_g in plaintext, where every numerator is a sum upload
whose flooded decryption is divided in the clear.  PPF z-score (:mod:`.zscore`) and PPF
Yeo-Johnson (:mod:`.yeojohnson`) both run it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.ckks.cores import Core, decrypted
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import PartyCrypto, ServerCrypto
from fednorm.protocols.collective.sums import InputUpload, SumUpload
from fednorm.protocols.ledger import NOTHING, Allowance
from fednorm.protocols.ppf.phases import serve_phase, serve_replayed

M = TypeVar("M", bound=Message)
QUOTIENT_EXPONENT = 16  # the precise pass works on quotients of order 2^16
COARSE_NOISE_FLOOR = 2.0**-10  # |coarse mean| below this counts as zero for scales
MAX_SCALED_VALUE = 2.0**50  # a party refuses scales pushing its |value · scale| beyond

COARSE = Allowance(decryptions=1, retries=1)
"""The coarse pass: the quotient, and, if it does not decode, its request once more
times 2^-40 — a party accepts that second decryption only as exactly this retry
(:func:`~fednorm.protocols.collective.decryption.require_retry_of`), so it reveals the
same quotient and nothing else."""

COARSE_FLOODED = Allowance(sums=1)
"""The coarse pass with revealed counts: one flooded sum (it always decodes)."""

PRECISE = Allowance(decryptions=1)
"""The precise pass (with revealed counts: a flooded sum instead)."""

PLAINTEXT = {"ppf_zscore.scales": ("scales",)}
"""The ledger's entry: the per-feature powers of two between the passes."""


@message("ppf_zscore.encrypted_vector")
class EncryptedVector(Message):
    """A party's per-feature vector, encrypted (possibly scaled by the server's scales):
    a signed input upload (relayed), or a signed sum upload with revealed counts."""

    values: InputUpload | SumUpload


@message("ppf_zscore.scales")
class Scales(Message):
    """Per-feature powers of two to re-encrypt with, from the coarse pass."""

    scales: np.ndarray


Denominator = openfhe.Ciphertext | np.ndarray
"""⟨max_count / n_g⟩ under encryption, or max_count / n_g per slot (revealed counts)."""


# -- server -------------------------------------------------------------------------------
async def pooled_vector(crypto: ServerCrypto) -> openfhe.Ciphertext:
    """⊕ of every party's :class:`EncryptedVector`."""
    uploads = await crypto.rc.gather(EncryptedVector)
    return await crypto.add_all({p: m.values for p, m in uploads.items()})


async def pooled_quotient(crypto: ServerCrypto, scaled_inverse: Denominator, width: int,
                          options: FitOptions, floor: float = COARSE_NOISE_FLOOR
                          ) -> np.ndarray:
    """The parties' next uploads, pooled, divided by n_g (:func:`precise_quotient`)."""
    numerator = await pooled_vector(crypto)
    return await precise_quotient(crypto, numerator, scaled_inverse, width, options, floor)


async def precise_quotient(
    crypto: ServerCrypto, numerator: openfhe.Ciphertext, scaled_inverse: Denominator,
    width: int, options: FitOptions, floor: float = COARSE_NOISE_FLOOR,
) -> np.ndarray:
    """numerator / n_g per feature, in two passes (coarse, then at per-feature scales);
    the parties' side is :func:`precise_quotient_party`.  ``floor``: see
    :func:`power_of_two_scales` (a numerator of non-negative terms cannot cancel, so its
    floor may be far lower)."""
    coarse = await _coarse_quotient(crypto, numerator, scaled_inverse, width, options)
    scales = power_of_two_scales(coarse, floor)
    await crypto.rc.broadcast(Scales(scales=scales))
    numerator = await pooled_vector(crypto)
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
    crypto: ServerCrypto, numerator: openfhe.Ciphertext, scaled_inverse: Denominator,
    width: int, options: FitOptions,
) -> np.ndarray:
    """The coarse pass: numerator / n_g, decrypted once more at 2^-40 if too large to
    decode (quotients beyond ~2^42 after the product, e.g. variances of values beyond
    ~1e6; :meth:`~fednorm.protocols.collective.ServerCrypto.decrypt_shifted`).

    The retry is the first request times the public 2^-40, which every party checks
    before it answers: the same quotient, revealed once more at a public scale.
    """
    if isinstance(scaled_inverse, np.ndarray):  # a flooded sum: it always decodes
        return await _decrypt_quotient(crypto, numerator, scaled_inverse, width, options)
    ct = await _encrypted_quotient(crypto, numerator, scaled_inverse, options)
    try:
        return await crypto.decrypt(ct, width, None)
    except ckks.DecodeOverflow:
        return await crypto.decrypt_shifted(ct, width)


async def _decrypt_quotient(
    crypto: ServerCrypto, numerator: openfhe.Ciphertext, scaled_inverse: Denominator,
    width: int, options: FitOptions,
) -> np.ndarray:
    """Decrypt ⟨numerator / n_g⟩ (:func:`_encrypted_quotient`); with revealed counts, the
    numerator (a sum upload) is decrypted and divided in the clear."""
    if isinstance(scaled_inverse, np.ndarray):
        total = await crypto.decrypt_sum(numerator, width)
        return total * (scaled_inverse[:width] / options.max_count)
    ct = await _encrypted_quotient(crypto, numerator, scaled_inverse, options)
    return await crypto.decrypt(ct, width, None)


async def _encrypted_quotient(crypto: ServerCrypto, numerator: openfhe.Ciphertext,
                              scaled_inverse: openfhe.Ciphertext, options: FitOptions
                              ) -> openfhe.Ciphertext:
    return await crypto.rc.run_sync(encrypted_quotient, crypto.ckks, numerator,
                                    scaled_inverse, options.max_count)


def encrypted_quotient(context: ckks.CkksContext, numerator: openfhe.Ciphertext,
                       scaled_inverse: openfhe.Ciphertext, max_count: int
                       ) -> openfhe.Ciphertext:
    """⟨numerator / n_g⟩ = (numerator · 1/max_count) ⊙ ⟨max_count / n_g⟩: deterministic,
    so a party recomputing it gets the server's bytes (:class:`QuotientReplay`)."""
    # 1/max_count is applied after the product: before it, the numerator would be tiny
    # and the product's absolute noise would swamp small-valued features.
    return context.mul(context.mul(numerator, scaled_inverse), 1.0 / max_count)


# -- party --------------------------------------------------------------------------------
@dataclass
class QuotientReplay:
    """Party: the server's side of the passes, recomputed here from the relayed input
    uploads (:meth:`~fednorm.protocols.collective.PartyCrypto.pooled_input`), so that
    each decryption and bootstrap request is checked against it (:class:`.driver.Replay`):
    every phase decrypts the quotient of the latest pooled numerator, the first after
    ``inverse_core`` (the encrypted inverse, with its bootstraps and decryptions), unless
    the ``inverse`` was computed before (the paper's Yeo-Johnson: its replayed search's)."""

    context: ckks.CkksContext
    width: int
    max_count: int
    inverse_core: Callable[[], Core[openfhe.Ciphertext]] | None = None
    inverse: openfhe.Ciphertext | None = None
    numerator: openfhe.Ciphertext | None = None

    def phase(self) -> Core[None]:
        """One phase's requests, as the server's :func:`precise_quotient` makes them."""
        if self.inverse is None:
            if self.inverse_core is None:
                raise ProtocolError("a quotient pass without the encrypted inverse")
            self.inverse = yield from self.inverse_core()
        if self.numerator is None:
            raise ProtocolError("a quotient pass before this party's numerator was pooled")
        yield from decrypted(encrypted_quotient(self.context, self.numerator, self.inverse,
                                                self.max_count), self.width, None)


@dataclass(frozen=True)
class Passes:
    """How a party's side of the quotient passes travels.

    With revealed counts every value is a sum upload whose decryption the party floods
    (:meth:`ServerCrypto.decrypt_sum`); with the encrypted inverse it is a numerator the
    server multiplies by ⟨max_count/n_g⟩ before a (not flooded, see docs/LEAKAGE.md)
    decryption, which may be retried once at 2^-40 in a coarse pass (:data:`COARSE`).

    ``inverse_bootstraps``: the collective bootstraps of the encrypted inverse, all run
    before the first pass (the ledger's count; none at all later, none with revealed
    counts, none where the inverse was computed earlier).

    Over the encrypted inverse, numerators travel as input uploads the server relays to
    every party, whose ``replay`` recomputes the passes (None with ``FitOptions.replay``
    off: taken on trust).
    """

    revealed: bool = False
    inverse_bootstraps: int = 0
    replay: QuotientReplay | None = None

    @property
    def coarse(self) -> Allowance:
        return COARSE_FLOODED if self.revealed else COARSE

    async def upload(self, crypto: PartyCrypto, values: np.ndarray
                     ) -> InputUpload | SumUpload:
        if self.revealed:
            require_sum_values(values, "rescale the data, or use the encrypted inverse")
            return await crypto.encrypt_for_sum(values)
        return await crypto.encrypt_input(values, numerator_level(crypto.ckks))

    async def send(self, crypto: PartyCrypto, values: np.ndarray) -> None:
        """``values`` to the server as this run's kind of :class:`EncryptedVector`."""
        upload = await self.upload(crypto, values)
        await crypto.rc.send(SERVER, EncryptedVector(values=upload))
        await self.pooled(crypto, upload)

    async def pooled(self, crypto: PartyCrypto, upload: InputUpload | SumUpload) -> None:
        """An input upload's relay, received and checked; its pool the next numerator of
        the replay (a sum upload is checked when it is decrypted)."""
        if isinstance(upload, InputUpload):
            numerator = await crypto.pooled_input(upload)
            if self.replay is not None:
                self.replay.numerator = numerator

    async def serve(self, crypto: PartyCrypto, expected: type[M], allowance: Allowance,
                    first: bool = False) -> M:
        """Answer the server's requests within ``allowance`` (as flooded sums with revealed
        counts, plus the inverse's bootstraps if this is the ``first`` phase) until
        ``expected`` arrives."""
        allowance = allowance.with_bootstraps(self.inverse_bootstraps if first else 0)
        if self.revealed:
            return await serve_phase(crypto, expected, allowance.as_sums())
        core = None if self.replay is None else self.replay.phase()
        msg, _ = await serve_replayed(crypto, core, expected, allowance)
        return msg


async def precise_quotient_party(crypto: PartyCrypto, local: np.ndarray, width: int,
                                 passes: Passes, before: Allowance = NOTHING) -> None:
    """Party side of a two-pass quotient, once ``local`` (its numerator) was sent: help
    decrypt the coarse pass (after ``before``, the decryptions the server makes first),
    re-encrypt scaled."""
    first = before != NOTHING
    scales = await passes.serve(crypto, Scales, passes.coarse + before, first=first)
    await passes.send(crypto, scaled(local, received_scales(scales.scales, width)))


def require_sum_values(values: np.ndarray, remedy: str) -> None:
    """InputError, before anything is encrypted, if a value passes what a sum upload
    holds (2^50); ``remedy`` says what the user can do."""
    if np.nanmax(np.abs(values), initial=0.0) > ckks.MAX_SUM_VALUE:
        raise InputError(
            "this party's sums travel as sum uploads, which hold up to 2^50 "
            f"({float(ckks.MAX_SUM_VALUE):.3g}); a sum (Σx or Σ(x−μ)²) is larger: {remedy}")


def received_scales(values: object, width: int) -> np.ndarray:
    """The server's per-feature powers of two; ProtocolError unless finite and positive."""
    factors = as_float_vector(values, width, "scales from the server")
    if not np.all(np.isfinite(factors) & (factors > 0)):
        raise ProtocolError("the server sent invalid scales")
    return factors


def scaled(local: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """``local`` times the server's scales; InputError if that passes 2^50: a pooled
    value this close to zero beside this party's large sums cannot be resolved."""
    lifted = local * factors
    if np.nanmax(np.abs(lifted), initial=0.0) > MAX_SCALED_VALUE:
        raise InputError(
            "the precise pass cannot resolve a pooled mean this close to zero beside this "
            "party's large sums (|sum × scale| would pass 2^50, what CKKS encodes): refused "
            "(center or rescale the data first)")
    return lifted


def numerator_level(context: ckks.CkksContext) -> int:
    """The level parties encrypt numerators at: the server multiplies each twice (by the
    inverse count, then by 1/max_count) before decrypting it, so the towers a fresh
    ciphertext carries beyond that are dead weight on the wire (5 of 12 kept at the
    paper preset; the count, inverted in depth, stays at full level)."""
    return context.upload_level(2)
