"""PPF z-score, default: the pooled mean and variance from three flooded sums.

Every decryption is a flooded sum of the parties' signed uploads (:mod:`.pooled`), and
each pooled sum is a function of the pooled data alone:

1. each party uploads its counts n_p beside its sums Σx times the public 2^-20: the server
   learns n_g exactly and a coarse mean μ̃;
2. with μ̃ broadcast, each party uploads Σ(x − μ̃)², which gives the variance coarsely
   (Σ(x − μ̃)² = Σ(x − μ)² + n_g·(μ − μ̃)²);
3. with per-feature powers of two broadcast (:func:`~.quotient.power_of_two_scales` of μ̃
   and of the coarse variance), each party uploads Σx and Σ(x − μ̃)², each times its
   feature's power of two: μ and σ² precise in every slot.

Why the passes: the server decodes a decrypted sum in float64, so each slot comes out to
about 2^-52 of the *largest* slot of its ciphertext; a feature of order 1e-4 beside one of
order 1e12 would be noise.  The coarse passes give every feature's magnitude, and in the
last every slot is brought near n_g·2^16 (down to the floors of
:func:`~.quotient.power_of_two_scales`).  The first pass scales Σx down so that n_g,
in the same ciphertext, stays exact (a slot's error stays far below 1/2).  σ² comes from
Σ(x − μ̃)² less n_g·(μ − μ̃)², where μ̃ is off by ~2^-52 of the largest mean: the
correction is negligible, by this estimate (not tested), unless σ is below ~1e-15 of
the largest |μ|.

Three decryptions where Algorithm 1 with revealed counts (``--algorithm paper
--reveal-counts``, :mod:`.zscore`) makes five — n_g, then a coarse and a precise pass for
each of μ and σ²: n_g rides with the coarse mean, and the precise mean with the precise
variance.  What is revealed is the same: n_g, μ and σ², each coarse value a noisier copy
of its precise one.
"""

from __future__ import annotations

import numpy as np

from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions, feature_counts
from fednorm.protocols.collective import (
    PartyCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import ZScoreNormalizer
from fednorm.protocols.plain.zscore import deviation_sums
from fednorm.protocols.ppf import pooled
from fednorm.protocols.ppf.phases import serve_phase
from fednorm.protocols.ppf.quotient import (
    power_of_two_scales,
    received_scales,
    require_sum_values,
    scaled,
)
from fednorm.protocols.ppf.zscore import SQUARES_FLOOR, PpfZScoreResult, check_ppf_values

FIRST_PASS_SCALE = 2.0**-20
"""Σx travels at this public scale beside the counts in the first pass: the P sums of up
to 2^50 each then stay below P·2^30, so the counts' slots err by far less than 1/2."""

LEDGER = declare("zscore", "mhe", {
    **COLLECTIVE, **pooled.PLAINTEXT,
    "ppf_zscore.coarse_mean": ("mean",),
    "ppf_zscore.precise_scales": ("mean", "squares"),
    "ppf_zscore.result": ("mean", "var"),
})
"""Allowances: one :data:`~.pooled.POOLED_SUM` before each message of the server (the
coarse mean, the scales, the result): three flooded sums in all."""

SUMS = pooled.POOLED_SUM.times(3)
"""Flooded decryptions of a run, whatever the data: the three pooled sums."""


def flooded_decryptions(options: FitOptions, width: int) -> Allowance:
    """:data:`SUMS`, on any number of features (each sum is one ciphertext)."""
    return SUMS


@message("ppf_zscore.coarse_mean")
class CoarseMean(Message):
    """μ̃, from the first sum: the center of every party's Σ(x − μ̃)²."""

    mean: np.ndarray


@message("ppf_zscore.precise_scales")
class PreciseScales(Message):
    """Per-feature powers of two for the last pass: for Σx, and for Σ(x − μ̃)²."""

    mean: np.ndarray
    squares: np.ndarray


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Sums are only added: no relinearization, no rotation."""
    return {"relinearize": False}


# -- server -------------------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> ZScoreNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    first = await pooled.pooled_sum(crypto)
    if first.size % 2:
        raise ProtocolError("a party's first z-score upload is not counts and sums side by side")
    count, total = np.split(first, 2)
    count = np.rint(count)
    per_value = 1.0 / np.maximum(count, 1.0)
    coarse_mean = total / FIRST_PASS_SCALE * per_value
    await rc.broadcast(CoarseMean(mean=coarse_mean))
    coarse_var = await pooled.pooled_sum(crypto, count.size) * per_value
    scales = PreciseScales(mean=power_of_two_scales(coarse_mean),
                           squares=power_of_two_scales(coarse_var, SQUARES_FLOOR))
    await rc.broadcast(scales)
    scaled_total, scaled_squares = np.split(await pooled.pooled_sum(crypto, 2 * count.size), 2)
    mean = scaled_total / scales.mean * per_value
    # Σ(x − μ̃)² = Σ(x − μ)² + n_g·(μ − μ̃)²
    var = np.maximum(scaled_squares / scales.squares * per_value - (mean - coarse_mean) ** 2,
                     0.0)
    present = count > 0
    mean, var = np.where(present, mean, np.nan), np.where(present, var, np.nan)
    await rc.broadcast(PpfZScoreResult(mean=mean, var=var))
    return ZScoreNormalizer(mean, var)


# -- party --------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    X = check_ppf_values(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    width = X.shape[1]
    total = np.nansum(X, axis=0)
    await _send(crypto, np.concatenate([feature_counts(X).astype(np.float64),
                                        total * FIRST_PASS_SCALE]))
    coarse = await serve_phase(crypto, CoarseMean, pooled.POOLED_SUM)
    squares, _ = deviation_sums(X, _vector(coarse.mean, width, "coarse mean"))
    await _send(crypto, squares)
    scales = await serve_phase(crypto, PreciseScales, pooled.POOLED_SUM)
    await _send(crypto, np.concatenate([scaled(total, received_scales(scales.mean, width)),
                                        scaled(squares, received_scales(scales.squares,
                                                                        width))]))
    result = await serve_phase(crypto, PpfZScoreResult, pooled.POOLED_SUM)
    return ZScoreNormalizer(as_float_vector(result.mean, width, "mean"),
                            as_float_vector(result.var, width, "variance"))


async def _send(crypto: PartyCrypto, values: np.ndarray) -> None:
    """``values`` as this party's next sum upload, refused (InputError) beyond what a sum
    upload holds, before anything is encrypted."""
    require_sum_values(values, "rescale the data")
    await pooled.send_sum(crypto, values)


def _vector(values: np.ndarray, width: int, what: str) -> np.ndarray:
    vector = as_float_vector(values, width, f"{what} from the server")
    if not np.isfinite(vector).all():
        raise ProtocolError(f"the {what} from the server is not finite")
    return vector
