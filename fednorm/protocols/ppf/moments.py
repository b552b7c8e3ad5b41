"""PPF z-score, default: the pooled mean and variance from two flooded exact sums.

Every decryption is a flooded sum of the parties' signed coefficient uploads
(:func:`.pooled.exact_sum`): per feature, the exact sum of the party's rows' values
times a public power of two, each rounded to an integer, written into the ring's
coefficients, so each pooled value decrypts exactly up to the flooding, whatever the
others hold, and is a function of the pooled rows alone, however they are split:

1. each party uploads its counts n_p, Σx and Σx², at powers of two fixed by the public
   bounds (|x| ≤ 2^40, n ≤ max_count): the server learns n_g exactly, Σx within ~2^-53
   and Σx² within ~2^-13 absolute (the flooding's 8σ bound, P = 10, default max_count),
   so a center μ̃ = Σx / n_g;
2. with μ̃ and per-feature powers of two broadcast (from bounds on every party's |Σx|
   and Σ(x − μ̃)² that follow from n_g and Σx², :func:`precise_exponents`), each party
   uploads Σx and Σ(x − μ̃)²: each bound at half the coefficients' capacity (2^156),
   so each sum is read to ~2^-114 of its bound (far below float64's rounding), however
   small a feature is beside the others; σ² = Σ(x − μ̃)²/n_g − (μ − μ̃)².

Why exact sums: CKKS slots are decoded together, so each comes out to about 2^-52 of
the *largest* value of its ciphertext, and a feature of order 1e-6 beside one of order
1e6 loses its variance's precision (the slot version of this protocol, with a third
pass: ~1e-6 relative at the test preset, ``bench/runs/2026-12-07-exact-sums.md``).  A
coefficient is read alone.

Two decryptions where Algorithm 1 with revealed counts (``--algorithm paper
--reveal-counts``, :mod:`.zscore`) makes five; what is revealed is the same: n_g, μ and
σ² (Σx² = n_g·(σ² + μ²)), each first value a noisier copy of a later one.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import (
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import ZScoreNormalizer
from fednorm.protocols.ppf import pooled
from fednorm.protocols.ppf.phases import serve_phase
from fednorm.protocols.ppf.zscore import MAX_ABS_VALUE, PpfZScoreResult, check_ppf_values

LEDGER = declare("zscore", "mhe", {
    **COLLECTIVE, **pooled.EXACT_PLAINTEXT,
    "ppf_zscore.precise_scales": ("center", "mean", "squares"),
    "ppf_zscore.result": ("mean", "var"),
})
"""Allowances: one :data:`~.pooled.EXACT_SUM` before each message of the server (the
scales, the result): two flooded sums in all."""

SUMS = pooled.EXACT_SUM.times(2)
"""Flooded decryptions of a run, whatever the data: the two pooled sums."""

MAX_EXPONENT = 2048
"""A party refuses powers of two beyond ±this: no float64 needs more."""


def flooded_decryptions(options: FitOptions, width: int) -> Allowance:
    """:data:`SUMS`, on any number of features up to a third of the ring (each sum is
    one coefficient upload)."""
    return SUMS


@message("ppf_zscore.precise_scales")
class PreciseScales(Message):
    """μ̃ (the center of every party's Σ(x − μ̃)²), and the per-feature exponents of the
    powers of two for the last pass: for Σx, and for Σ(x − μ̃)²."""

    center: np.ndarray
    mean: np.ndarray
    squares: np.ndarray


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Sums are only added: no relinearization, no rotation."""
    return {"relinearize": False}


def first_exponents(context: ckks.CkksContext, options: FitOptions, width: int
                    ) -> np.ndarray:
    """The first pass's powers of two, public: counts, Σx and Σx² each at the largest
    power that keeps max_count values (of |x| ≤ 2^40) below the capacity, far above the
    flooding (~2^42), so the counts come out exact."""
    room = ckks.coefficient_capacity(context).bit_length() - 2
    count_bits = math.ceil(math.log2(options.max_count)) if options.max_count > 1 else 0
    top = int(math.log2(MAX_ABS_VALUE))
    return np.repeat(np.array([room - count_bits, room - count_bits - top,
                               room - count_bits - 2 * top]), width)


def precise_exponents(context: ckks.CkksContext, first: np.ndarray, error: np.ndarray
                      ) -> PreciseScales:
    """μ̃ and the last pass's powers of two from the first pass's pooled (n, Σx, Σx²) and
    what flooding may have added to each (``error``, value units).

    U ≥ Σx² bounds every party's Σx² too; Cauchy–Schwarz bounds every party's |Σx| (and
    the pooled one) by V = √(n·U), and Σ(x − μ̃)² = Σx² − 2μ̃Σx + n·μ̃² ≤ U + 2|μ̃|V + nμ̃²
    for the pool and so for each party.  Each sum then goes at the power of two that
    brings its bound just under the capacity."""
    count, total, squares = np.split(first, 3)
    _, total_error, squares_error = np.split(error, 3)
    count = np.rint(count)
    center = total / np.maximum(count, 1.0)
    bound = np.maximum(squares, 0.0) + 2 * squares_error
    linear = np.sqrt(count * bound) + total_error
    deviations = bound + 2 * np.abs(center) * linear + count * center**2
    return PreciseScales(center=center, mean=_exponents(context, linear, count),
                         squares=_exponents(context, deviations, count))


def _exponents(context: ckks.CkksContext, bound: np.ndarray, count: np.ndarray
               ) -> np.ndarray:
    """Per feature, the power of two that brings ``bound`` just under the capacity (0
    for an empty feature)."""
    room = ckks.coefficient_capacity(context).bit_length() - 2
    top = np.ceil(np.log2(np.where(bound > 0, bound, 1.0)))
    return np.where(count > 0, room - top, 0).astype(int)


# -- server -------------------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> ZScoreNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    error = pooled.exact_sum_error(crypto.ckks, len(rc.parties), options)
    first = await pooled.exact_sum(crypto, partial(_first_pass, crypto.ckks, options))
    powers = first_exponents(crypto.ckks, options, len(first) // 3)
    scales = precise_exponents(crypto.ckks, first, np.ldexp(error, -powers))
    await rc.broadcast(scales)
    count = np.rint(np.split(first, 3)[0])
    last = await pooled.exact_sum(crypto, lambda _: np.concatenate([scales.mean,
                                                                   scales.squares]))
    total, squares = np.split(last, 2)
    per_value = 1.0 / np.maximum(count, 1.0)
    mean = total * per_value
    # Σ(x − μ̃)² = Σ(x − μ)² + n_g·(μ − μ̃)²
    var = np.maximum(squares * per_value - (mean - scales.center) ** 2, 0.0)
    present = count > 0
    mean, var = np.where(present, mean, np.nan), np.where(present, var, np.nan)
    await rc.broadcast(PpfZScoreResult(mean=mean, var=var))
    return ZScoreNormalizer(mean, var)


def _first_pass(context: ckks.CkksContext, options: FitOptions, width: int) -> np.ndarray:
    """:func:`first_exponents` for an upload of ``width`` values (counts, Σx and Σx² of
    a third as many features)."""
    if width % 3:
        raise ProtocolError("a party's first z-score upload is not counts, Σx and Σx²")
    return first_exponents(context, options, width // 3)


# -- party --------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    X = check_ppf_values(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    width = X.shape[1]
    present = (~np.isnan(X)).astype(np.float64)
    await pooled.send_exact_sum(crypto, np.hstack([present, X, X**2]),
                                first_exponents(crypto.ckks, options, width))
    scales = _received(await serve_phase(crypto, PreciseScales, pooled.EXACT_SUM), width)
    await pooled.send_exact_sum(crypto, np.hstack([X, (X - scales.center) ** 2]),
                                np.concatenate([scales.mean, scales.squares]))
    result = await serve_phase(crypto, PpfZScoreResult, pooled.EXACT_SUM)
    return ZScoreNormalizer(as_float_vector(result.mean, width, "mean"),
                            as_float_vector(result.var, width, "variance"))


def _received(scales: PreciseScales, width: int) -> PreciseScales:
    """The server's center and exponents; ProtocolError unless ``width`` finite values
    and integer exponents within ±:data:`MAX_EXPONENT`."""
    center = as_float_vector(scales.center, width, "center from the server")
    exponents = [as_float_vector(e, width, "exponents from the server")
                 for e in (scales.mean, scales.squares)]
    if not np.isfinite(center).all():
        raise ProtocolError("the center from the server is not finite")
    for e in exponents:
        if not (np.isfinite(e).all() and np.all(e == np.rint(e))
                and np.abs(e).max(initial=0) <= MAX_EXPONENT):
            raise ProtocolError("the server sent invalid exponents")
    return PreciseScales(center=center, mean=exponents[0].astype(int),
                         squares=exponents[1].astype(int))
