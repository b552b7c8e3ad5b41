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

**Precision across magnitudes.**  Steps 4 and 5 each run as a two-pass quotient
(:mod:`.quotient`): a coarse decryption gives every feature's magnitude, the parties
re-encrypt at per-feature scales, and the second decryption is precise in every slot.
Both passes reveal the same quantity (the first coarsely), so only μ and σ² are
revealed; the pooled count stays encrypted.  Which features hold any value at all (the
others are NaN, as in plain mode) comes from the product of the parties' fresh "no value
here" bits, 1 exactly where n_g = 0: a flooded decryption under the proven product
bound (:func:`pooled_presence`).

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

from functools import partial

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.ckks.cores import Core
from fednorm.engine.ckks.inversion import inverse_core
from fednorm.engine.errors import InputError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    agreed_width,
    feature_counts,
)
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.collective.sums import InputUpload, ProductUpload, SumUpload
from fednorm.protocols.ledger import COLLECTIVE, NOTHING, Allowance, declare
from fednorm.protocols.normalizers import ZScoreNormalizer
from fednorm.protocols.plain.zscore import deviation_sums
from fednorm.protocols.ppf import quotient
from fednorm.protocols.ppf.checks import (
    product_bits,
    require_counts_within,
    require_pooled_count_within,
    require_product_for,
)
from fednorm.protocols.ppf.driver import run_core
from fednorm.protocols.ppf.quotient import (
    PRECISE,
    Denominator,
    Passes,
    QuotientReplay,
    pooled_quotient,
    precise_quotient,
    precise_quotient_party,
)

MAX_ABS_VALUE = 2.0**40
INVERSE_KEEP_LEVELS = 3  # levels the inverse leaves for the quotient products
SQUARES_FLOOR = 2.0**-80  # sums of squares do not cancel: lift even tiny variances

PRESENCE = Allowance(products=1)
"""Before the mean's coarse pass, with the encrypted inverse: one bit per feature, whether
it holds any value (a flooded product of the parties' "empty here" bits)."""

REVEALED_COUNT = Allowance(sums=1)
"""Before the mean's coarse pass, with revealed counts: n_g (a flooded sum)."""

PLAINTEXT = {
    **quotient.PLAINTEXT,
    "ppf_zscore.mean": ("mean",),
    "ppf_zscore.result": ("mean", "var"),
}
"""The ledger's entry for μ and σ² (and their scales); the sums carry their width."""

PAPER_LEDGER = declare("zscore", "mhe", {**COLLECTIVE, **PLAINTEXT,
                                          "ppf_zscore.encrypted_sums": ("width",)},
                       algorithm="paper")
"""Allowances: :data:`PRESENCE` (:data:`REVEALED_COUNT` with revealed counts), then per
quotient (μ, σ²) :data:`~.quotient.COARSE`
(:data:`~.quotient.COARSE_FLOODED` with revealed counts) and :data:`~.quotient.PRECISE`;
the encrypted inverse's bootstraps (:func:`inverse_plan`) before the first pass only."""


@message("ppf_zscore.encrypted_sums")
class EncryptedSums(Message):
    """Σx and the count per feature: signed input uploads (relayed to every party), or
    signed sum uploads with revealed counts; with the encrypted inverse, ``empty``: per
    feature, 1 if this party holds no value of it (a signed product upload), else None."""

    total: InputUpload | SumUpload
    count: InputUpload | SumUpload
    width: int
    empty: ProductUpload | None = None


@message("ppf_zscore.mean")
class PpfMean(Message):
    mean: np.ndarray


@message("ppf_zscore.result")
class PpfZScoreResult(Message):
    mean: np.ndarray
    var: np.ndarray


def check_ppf_values(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption, data the encrypted pipeline cannot carry."""
    if np.nanmax(np.abs(X), initial=0.0) > MAX_ABS_VALUE:
        raise InputError(f"PPF z-score supports |x| ≤ 2^40 ({MAX_ABS_VALUE:.3g})")
    require_counts_within(X, options)
    return X


def counts_revealed(options: FitOptions) -> bool:
    """Algorithm 1 inverts n_g under encryption unless ``reveal_counts`` (then n_g is a
    flooded sum; the default algorithm, :mod:`.moments`, always reveals it)."""
    return options.reveal_counts


def unflooded_decryptions(options: FitOptions) -> bool:
    """With the encrypted inverse the quotients are plain decryptions: each party checks
    them against its own run of the server's step, but does not flood them
    (docs/LEAKAGE.md), so a multi-host party joins only if its operator allows it."""
    return not counts_revealed(options)


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Relinearization for the encrypted inverse; none when the counts are revealed."""
    return {"relinearize": not counts_revealed(options)}


# -- server -------------------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> ZScoreNormalizer:
    if not counts_revealed(options):
        require_product_for(ckks.get_preset(options.preset), len(rc.parties),
                            options.flooding_bits)
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    sums = await rc.gather(EncryptedSums)
    width = agreed_width(sums)
    total = await crypto.add_all({p: m.total for p, m in sums.items()})
    count = await crypto.add_all({p: m.count for p, m in sums.items()})
    scaled_inverse, present = await _count_inverse(crypto, sums, count, width, options)
    mean, var = await pooled_moments(crypto, total, scaled_inverse, width, options)
    mean, var = np.where(present, mean, np.nan), np.where(present, var, np.nan)
    await rc.broadcast(PpfZScoreResult(mean=mean, var=var))
    return ZScoreNormalizer(mean, var)


async def pooled_moments(
    crypto: ServerCrypto, total: openfhe.Ciphertext, scaled_inverse: Denominator,
    width: int, options: FitOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Lines 17–31 given ⟨S_g⟩ and ⟨max_count/n_g⟩: μ (decrypted, broadcast), then the
    parties' ⟨Σ(x − μ)²⟩ and σ².  PPF Yeo-Johnson runs this on its transformed data."""
    mean = await precise_quotient(crypto, total, scaled_inverse, width, options)
    await crypto.rc.broadcast(PpfMean(mean=mean))
    var = await pooled_quotient(crypto, scaled_inverse, width, options, floor=SQUARES_FLOOR)
    return mean, np.maximum(var, 0.0)


async def _count_inverse(
    crypto: ServerCrypto, sums: dict[int, EncryptedSums], count: openfhe.Ciphertext,
    width: int, options: FitOptions,
) -> tuple[Denominator, np.ndarray]:
    """⟨max_count / n_g⟩ under encryption, or in plaintext if counts are revealed; and
    which features hold any value at all (the others are NaN, as in plain mode)."""
    hi = float(options.max_count)
    if counts_revealed(options):
        pooled = np.rint(await crypto.decrypt_sum(count, width))
        return np.pad(hi / np.maximum(pooled, 1.0), (0, crypto.ckks.slots - width)), pooled > 0
    present = await pooled_presence(crypto, {p: m.empty for p, m in sums.items()}, width)
    inverse = await run_core(crypto, _inverse(crypto.ckks, count, width, options),
                             "inverse", replayed=True)
    return inverse, present


async def pooled_presence(crypto: ServerCrypto, empty: dict[int, object], width: int
                          ) -> np.ndarray:
    """Which features any party holds a value of: the product of the parties' "empty
    here" bits is 1 exactly where n_g = 0, and its flooded decryption reveals that bit
    alone (never n_g)."""
    product = await crypto.multiply_all(empty)
    return product_bits(await crypto.decrypt_product(product, width), "presence bits") == 0


def inverse_plan(context: ckks.CkksContext, options: FitOptions) -> ckks.InversePlan:
    """The encrypted inverse's schedule on [1, max_count]: public, so every party knows
    how many collective bootstraps it takes (and refuses more)."""
    return ckks.plan_inverse(context.level_budget, 1.0, float(options.max_count),
                             keep_levels=INVERSE_KEEP_LEVELS)


def _inverse(context: ckks.CkksContext, count: openfhe.Ciphertext, width: int,
             options: FitOptions) -> Core[openfhe.Ciphertext]:
    """⟨max_count / n_g⟩ (lines 14–16), the same requests on the server and in every
    party's replay."""
    # Unused slots hold count 0, outside the inverse's range: pad them with 1 so they do
    # not blow up to ~8·max_count and cost precision in the slots that matter.
    padding = np.pad(np.zeros(width), (0, context.slots - width), constant_values=1.0)
    return (yield from inverse_core(context, context.add(count, padding), 1.0,
                                    float(options.max_count), out_scale=float(options.max_count),
                                    keep_levels=INVERSE_KEEP_LEVELS))


# -- party --------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    X = check_ppf_values(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    width = X.shape[1]
    total = np.nansum(X, axis=0)
    counts = feature_counts(X)
    passes = Passes(revealed=counts_revealed(options))
    if not passes.revealed:
        require_product_for(crypto.ckks.preset, crypto.n_parties, crypto.held.flooding_bits)
        require_pooled_count_within(counts, crypto.n_parties, options.max_count)
    sums = EncryptedSums(
        total=await passes.upload(crypto, total),
        # An encrypted-inverse count needs every level; a revealed one is only decrypted.
        count=await (crypto.encrypt_for_sum(counts) if passes.revealed
                     else crypto.encrypt_input(counts)), width=width,
        empty=None if passes.revealed else await crypto.encrypt_for_product(
            (counts == 0).astype(np.float64)))
    await rc.send(SERVER, sums)
    if not passes.revealed:
        passes = await _replaying(crypto, sums, width, options)
    await share_moments(crypto, X, total, passes,
                        before=REVEALED_COUNT if passes.revealed else PRESENCE)
    result = await passes.serve(crypto, PpfZScoreResult, PRECISE)
    return ZScoreNormalizer(as_float_vector(result.mean, width, "mean"),
                            as_float_vector(result.var, width, "variance"))


async def _replaying(crypto: PartyCrypto, sums: EncryptedSums, width: int,
                     options: FitOptions) -> Passes:
    """The encrypted inverse's passes, each request checked against this party's own run
    of the server's step (:class:`~.quotient.QuotientReplay`) from the relayed uploads."""
    total = await crypto.pooled_input(sums.total)
    count = await crypto.pooled_input(sums.count)
    replay = QuotientReplay(crypto.ckks, width, options.max_count,
                            partial(_inverse, crypto.ckks, count, width, options),
                            numerator=total)
    return Passes(inverse_bootstraps=inverse_plan(crypto.ckks, options).bootstraps,
                  replay=replay if options.replay else None)


async def share_moments(crypto: PartyCrypto, X: np.ndarray, total: np.ndarray,
                        passes: Passes, before: Allowance = NOTHING) -> None:
    """Party side of :func:`pooled_moments`, once ``total`` (Σx) has been sent: the mean's
    two passes (after ``before``, the decryptions the server makes first), then
    ⟨Σ(x − μ)²⟩ and its two passes.  The variance's precise pass is decrypted before the
    result arrives (:data:`PRECISE` when awaiting it)."""
    width = X.shape[1]
    await precise_quotient_party(crypto, total, width, passes, before)
    # The precise pass is decrypted before the mean arrives.
    mean = as_float_vector((await passes.serve(crypto, PpfMean, PRECISE)).mean,
                           width, "mean from the server")
    squared, _ = deviation_sums(X, mean)
    await passes.send(crypto, squared)
    await precise_quotient_party(crypto, squared, width, passes)

