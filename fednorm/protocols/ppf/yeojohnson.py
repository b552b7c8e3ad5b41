"""PPF Yeo-Johnson: the pooled maximum-likelihood λ under multiparty CKKS, revealing per
round only the sign of the log-likelihood's derivative at the probed λ's.

Why the sign of D = E[s]·var(ψ) − cov(ψ, ψ') decides, and how each party scales ψ, ψ'
and s from V_abs so that t = D/K lies in [−1, 1], is :mod:`.yeojohnson_math`; the
search's plan, layout and bisection are :mod:`.yeojohnson_search`.

**Steps.**

1. Collective key generation with relinearization and one rotation key (by a quarter of
   the slots).
2. Each party checks its data against V_abs (:class:`InputError` before any encryption),
   then encrypts its per-feature counts, Σ s̃, and 0/1 flags per feature: "no value
   here", "no negative value here", "no positive value here". The server multiplies the
   flags over the parties (1 iff no party has such a value) and decrypts that product
   only: per feature, whether the pooled data are empty (which the result reveals
   anyway, as NaN) and which signs they hold. Without the sign flags, all-positive data
   would be bounded as if values down to −V_abs existed, and t would fall below the CKKS
   noise near the maximizer (~1e-9 on skewed positive data). The server inverts the
   pooled count homomorphically (Goldschmidt, as PPF z-score, then one Newton step:
   relative error ~1e-7 → below CKKS noise) and forms ⟨E[s̃]⟩.
3. Multi-probe bisection in asinh(λ), all features at once: each round the server sends
   :data:`~.yeojohnson_search.PROBES` λ's per feature, evenly inside each feature's
   bracket; every party
   encrypts Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' in four slot blocks of one ciphertext; the server adds
   them, multiplies by the inverse (one ciphertext for all four means), aligns the blocks
   by rotation, forms ⟨t⟩ per (feature, probe), evaluates the composite sign polynomial
   of :mod:`~fednorm.engine.ckks.compare`, and the parties decrypt *only that*. The
   bracket shrinks to the cell where the signs change (PROBES + 1 cells per round), for a
   fixed number of rounds (:func:`~.yeojohnson_search.search_rounds`).
4. The λ's are broadcast; the PPF z-score of the transformed data runs on the same keys
   and the same encrypted inverse (its two-pass quotients, :mod:`.quotient`).

**Precision.** A probe's sign is right whenever |t| exceeds the CKKS noise of ⟨t⟩
(measured ~1e-9 in the first round, ~5e-11 in the last, test preset); wrong signs occur
only where |D| < 1e-7·K: near the maximizer, where llf is flat, or far out where the
transformed data are nearly constant relative to the bounds. Measured on BCW with
V_abs = 1.5·max|x| (search driven by t plus 1e-8 noise): llf within 2e-6 nats of the
pooled maximum in all 30 features; under encryption (P = 10) within 3e-9 (λ within
1.1e-5 relative) at the test preset, 1.5e-9 (7.8e-6) at the paper preset.
Where the pooled transformed data are nearly constant compared with the V_abs bounds
everywhere (data far inside [−V_abs, V_abs]), t is below the noise at every probe and
the search lands anywhere in that flat region: choose V_abs close to the data's bound.

**Cost.** Per round one collective bootstrap of the four means, the sign's refreshes (5
paper preset, 9 test, 8 + 2 stages) and one decryption (not flooded: docs/LEAKAGE.md);
before them the count inverse (2 bootstraps paper preset, 4 test) and ⟨E[s̃]⟩ (1).

**Conventions** (as :mod:`fednorm.protocols.plain.yeojohnson`). A feature without values
gets λ = 1 and NaN mean and variance. A feature whose transformed pooled variance comes
out below (:data:`~.yeojohnson_math.CONSTANT_RTOL`·mean)² + :data:`~.yeojohnson_math.
CONSTANT_ATOL`² is constant: λ = 1, mean = its value, variance 0. Its λ search saw t = 0
(noise signs), so the λ its z-score used is arbitrary and yj(x, λ) may have saturated
there; its value is therefore computed afresh, as the pooled mean of x (one more
two-pass quotient, only when some feature is constant: the value is in the result).
"""

from __future__ import annotations

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import FitOptions, agreed_width, feature_counts
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.collective.sums import InputUpload
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import YeoJohnsonNormalizer, yeo_johnson
from fednorm.protocols.ppf import checks, quotient
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.protocols.ppf.driver import run_core
from fednorm.protocols.ppf.phases import serve_phase, serve_replayed
from fednorm.protocols.ppf.quotient import Passes, QuotientReplay
from fednorm.protocols.ppf.yeojohnson_cores import (
    Pooled,
    planned_refreshes,
    pooled_core,
    sign_flags_core,
    soft_signs_core,
)
from fednorm.protocols.ppf.yeojohnson_math import (
    MAX_TRANSFORMED,
    SignFlags,
    constant_features,
    conventions,
)
from fednorm.protocols.ppf.yeojohnson_search import (
    BLOCKS,
    Layout,
    SearchPlan,
    SignBisection,
    probe_count,
    sign_plan,
)

# -- the ledger --------------------------------------------------------------------------
FLAGS = Allowance(decryptions=1)
"""The product of the parties' sign flags (3 bits per feature), and the bootstraps of
its product tree (:class:`~.yeojohnson_cores.Refreshes`, as for the other steps)."""

SEARCH_ROUND = Allowance(decryptions=1)
"""Each search round: the composite sign at every probe, nothing else."""

POOLING = Allowance()
"""Between the flags and the first probes: the inverse and ⟨E[s̃]⟩, bootstraps only."""

PAPER_LEDGER = declare(
    "yeojohnson", "mhe",
    {**COLLECTIVE, **ppf_zscore.PLAINTEXT,
     "ppf_yeojohnson.start": ("width",),
     "ppf_yeojohnson.flags": ("empty", "negative", "positive"),
     "ppf_yeojohnson.probes": ("lambdas",),
     "ppf_yeojohnson.lambdas": ("lambdas",),
     "ppf_yeojohnson.result": ("lambdas", "mean", "var")},
    algorithm="paper",
)
"""Allowances: :data:`FLAGS`, :data:`POOLING`, :data:`SEARCH_ROUND` per round, then the
z-score's quotients (:data:`~.quotient.COARSE`, :data:`~.quotient.PRECISE`)."""


# -- messages ---------------------------------------------------------------------------
@message("ppf_yeojohnson.start")
class EncryptedStart(Message):
    """A party's counts (tiled over the probe layout), Σ s̃ and its "absent" flags
    (:meth:`SignFlags.absent`): signed input uploads, relayed to every party."""

    counts: InputUpload
    log_sums: InputUpload
    absent: InputUpload
    width: int


@message("ppf_yeojohnson.flags")
class Flags(Message):
    """Per feature (1.0 / 0.0): no pooled value at all; some negative; some positive."""

    empty: np.ndarray
    negative: np.ndarray
    positive: np.ndarray


@message("ppf_yeojohnson.probes")
class Probes(Message):
    """Row j: the λ's probed for feature j this round."""

    lambdas: np.ndarray


@message("ppf_yeojohnson.moments")
class EncryptedMoments(Message):
    """Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' per (feature, probe), one slot block each: a signed input
    upload, relayed to every party."""

    values: InputUpload


@message("ppf_yeojohnson.lambdas")
class Lambdas(Message):
    lambdas: np.ndarray


@message("ppf_yeojohnson.result")
class PpfYeoJohnsonResult(Message):
    lambdas: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def check_ppf_yeojohnson_input(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption: no V_abs or one too large, too many values or
    features (the values against V_abs were checked at the session's edge,
    :func:`fednorm.session.check_within_vabs`)."""
    if np.any(checks.vabs_vector(options, X.shape[1]) > MAX_TRANSFORMED):
        raise InputError(f"PPF Yeo-Johnson supports vabs up to 2^40 ({MAX_TRANSFORMED:.3g})")
    checks.require_counts_within(X, options)
    probe_count(X.shape[1], ckks.get_preset(options.preset).slots)
    sign_plan(options)
    return X


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Relinearization and the rotation by one of the :data:`BLOCKS` slot blocks."""
    return checks.setup_arguments(options, BLOCKS)


# -- server ---------------------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> YeoJohnsonNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    return await yeojohnson_server(crypto, options)


async def yeojohnson_server(crypto: ServerCrypto, options: FitOptions
                            ) -> YeoJohnsonNormalizer:
    """The server's side after the key setup: steps 2-4 of the module doc."""
    rc = crypto.rc
    start = await rc.gather(EncryptedStart)
    width = agreed_width(start)
    absent, count, logs = await _relayed_start(crypto, start)
    flags = await run_core(crypto, sign_flags_core(crypto.ckks, absent, width), "sign flags",
                           replayed=True)
    await rc.broadcast(Flags(empty=flags.empty.astype(np.float64),
                             negative=flags.negative.astype(np.float64),
                             positive=flags.positive.astype(np.float64)))
    plan = SearchPlan.build(options, width, crypto.ckks.slots, flags)
    pooled = await run_core(crypto, pooled_core(crypto.ckks, count, logs, plan.layout,
                                                flags.empty, options.max_count), "inverse",
                            replayed=True)

    search = SignBisection(plan, ~flags.empty)
    sign = sign_plan(options)
    with rc.phase("λ search", planned_rounds=plan.rounds):
        while not search.finished:
            await rc.broadcast(Probes(lambdas=search.probe()))
            replies = await rc.gather(EncryptedMoments)
            moments = await crypto.add_all({p: m.values for p, m in replies.items()})
            search.update(await run_core(crypto, soft_signs_core(
                crypto.ckks, moments, pooled, plan.layout, sign, options.max_count),
                "soft signs", replayed=True))
    lambdas = search.lambdas
    await rc.broadcast(Lambdas(lambdas=lambdas))

    mean, var = await _zscore_server(crypto, pooled, width, options)
    await rc.broadcast(ppf_zscore.PpfZScoreResult(mean=mean, var=var))
    values = await _constant_values(crypto, pooled, constant_features(mean, var, flags.empty),
                                    options)
    lambdas, mean, var = conventions(lambdas, mean, var, flags.empty, values)
    await rc.broadcast(PpfYeoJohnsonResult(lambdas=lambdas, mean=mean, var=var))
    return YeoJohnsonNormalizer(lambdas, mean, var)


StartInputs = tuple[list[openfhe.Ciphertext], openfhe.Ciphertext, openfhe.Ciphertext]
"""Every party's absent flags, the pooled counts, the pooled Σ s̃."""


async def _relayed_start(crypto: ServerCrypto, start: dict[int, EncryptedStart]
                         ) -> StartInputs:
    """Every party's "absent" flags (each relayed on its own: the flags are multiplied,
    not added), then the pooled counts and Σ s̃, each relayed to every party, which
    recomputes the server's steps from them (:class:`~.driver.Replay`)."""
    absent = [await crypto.add_all({p: start[p].absent}) for p in sorted(start)]
    count = await crypto.add_all({p: m.counts for p, m in start.items()})
    logs = await crypto.add_all({p: m.log_sums for p, m in start.items()})
    return absent, count, logs


async def _zscore_server(crypto: ServerCrypto, pooled: Pooled, width: int,
                         options: FitOptions) -> tuple[np.ndarray, np.ndarray]:
    """PPF z-score of the transformed data on this setup, with the refined inverse."""
    total = await quotient.pooled_vector(crypto)
    return await ppf_zscore.pooled_moments(crypto, total, await _refined_inverse(crypto, pooled),
                                           width, options)


async def _constant_values(crypto: ServerCrypto, pooled: Pooled, constant: np.ndarray,
                           options: FitOptions) -> np.ndarray:
    """The pooled mean of x for the constant features (their value, which the result
    holds anyway), by one more two-pass quotient; nothing when there are none. λ of a
    constant feature is arbitrary (t = 0), so yj(x, λ) may have saturated: its mean does
    not give x back."""
    if not constant.any():
        return np.zeros(len(constant))
    return await quotient.pooled_quotient(crypto, await _refined_inverse(crypto, pooled),
                                          len(constant), options)


async def _refined_inverse(crypto: ServerCrypto, pooled: Pooled) -> openfhe.Ciphertext:
    return await crypto.rc.run_sync(pooled.inverse.product, crypto.ckks)


# -- party ------------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    X = check_ppf_yeojohnson_input(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    checks.require_pooled_count_within(feature_counts(X), crypto.n_parties, options.max_count)
    flags, lambdas, pooled = await _search_party(crypto, X, options)
    passes = Passes(replay=None if pooled is None else QuotientReplay(
        crypto.ckks, X.shape[1], options.max_count,
        inverse=pooled.inverse.product(crypto.ckks)))
    result = await _moments_party(crypto, X, lambdas, flags, passes)
    return YeoJohnsonNormalizer(*(as_float_vector(getattr(result, v), X.shape[1], v)
                                  for v in ("lambdas", "mean", "var")))


async def _search_party(crypto: PartyCrypto, X: np.ndarray, options: FitOptions
                        ) -> tuple[SignFlags, np.ndarray, Pooled | None]:
    """Steps 2-3 on this party's side, each of the server's steps replayed (or, with
    ``FitOptions.replay`` off, taken on trust: then no pooled state comes back)."""
    width = X.shape[1]
    mine = SignFlags.local(X)
    layout = Layout(crypto.ckks.slots, width, probe_count(width, crypto.ckks.slots))
    sign = sign_plan(options)
    refreshes = planned_refreshes(crypto.ckks, crypto.n_parties, layout, sign,
                                  options.max_count)
    log_sums = np.nansum(np.sign(X) * np.log1p(np.abs(X)), axis=0)
    scaled_logs = layout.tiled(log_sums / np.log1p(checks.vabs_vector(options, width)), 1)
    start = EncryptedStart(counts=await crypto.encrypt_input(layout.tiled(feature_counts(X))),
                           log_sums=await crypto.encrypt_input(scaled_logs),
                           absent=await crypto.encrypt_input(mine.absent()), width=width)
    await crypto.rc.send(SERVER, start)
    absent, count, logs = await _pooled_start(crypto, start)
    replay = options.replay
    received, _ = await serve_replayed(
        crypto, sign_flags_core(crypto.ckks, absent, width) if replay else None, Flags,
        FLAGS.with_bootstraps(refreshes.flags))
    flags = _received_flags(received, mine)
    plan = SearchPlan.build(options, width, crypto.ckks.slots, flags)
    msg, pooled = await serve_replayed(
        crypto, pooled_core(crypto.ckks, count, logs, plan.layout, flags.empty,
                            options.max_count) if replay else None,
        (Probes, Lambdas), POOLING.with_bootstraps(refreshes.pooling))
    rounds = 0
    with crypto.rc.phase("λ search", planned_rounds=plan.rounds):
        while isinstance(msg, Probes):
            rounds += 1
            if rounds > plan.rounds:
                raise ProtocolError(f"the server's λ search exceeds {plan.rounds} rounds")
            sums = plan.scaled_sums(X, _checked_probes(msg.lambdas, plan))
            upload = await crypto.encrypt_input(layout.packed(list(sums)))
            await crypto.rc.send(SERVER, EncryptedMoments(values=upload))
            moments = await crypto.pooled_input(upload)
            msg, _ = await serve_replayed(
                crypto, soft_signs_core(crypto.ckks, moments, pooled, plan.layout, sign,
                                        options.max_count) if pooled is not None else None,
                (Probes, Lambdas), SEARCH_ROUND.with_bootstraps(refreshes.round))
    lambdas = as_float_vector(msg.lambdas, width, "Yeo-Johnson lambdas from the server")
    _check_in_range(lambdas, plan)
    return flags, lambdas, pooled


async def _moments_party(crypto: PartyCrypto, X: np.ndarray, lambdas: np.ndarray,
                         flags: SignFlags, passes: Passes) -> PpfYeoJohnsonResult:
    """Step 4 on this party's side: the z-score of yj(x, λ), then, if some feature came
    out constant, the pooled mean of its values; the result."""
    width = X.shape[1]
    await _zscore_party(crypto, yeo_johnson(X, lambdas), width, passes)
    scaled = await passes.serve(crypto, ppf_zscore.PpfZScoreResult, quotient.PRECISE)
    constant = constant_features(as_float_vector(scaled.mean, width, "mean"),
                                 as_float_vector(scaled.var, width, "variance"), flags.empty)
    if not constant.any():
        return await serve_phase(crypto, PpfYeoJohnsonResult, Allowance())
    raw = np.where(constant, np.nansum(X, axis=0), 0.0)  # what the server needs of them
    await passes.send(crypto, raw)
    await quotient.precise_quotient_party(crypto, raw, width, passes=passes)
    return await passes.serve(crypto, PpfYeoJohnsonResult, quotient.PRECISE)


async def _pooled_start(crypto: PartyCrypto, start: EncryptedStart) -> StartInputs:
    """The server's inputs, from its relays (:func:`_relayed_start`), each checked."""
    absent = [await crypto.pooled_input(start.absent, [p])
              for p in range(1, crypto.n_parties + 1)]
    return absent, await crypto.pooled_input(start.counts), \
        await crypto.pooled_input(start.log_sums)


def _received_flags(msg: Flags, mine: SignFlags) -> SignFlags:
    width = len(mine.empty)
    flags = SignFlags(*(as_float_vector(getattr(msg, name), width, f"{name} flags") > 0.5
                        for name in ("empty", "negative", "positive")))
    flags.check_local(mine)
    return flags


def _checked_probes(lambdas: object, plan: SearchPlan) -> np.ndarray:
    shape = (plan.layout.width, plan.layout.probes)
    if not (isinstance(lambdas, np.ndarray) and lambdas.shape == shape
            and lambdas.dtype.kind in "iuf"):
        raise ProtocolError(f"Yeo-Johnson probes: expected a {shape} array, got "
                            f"{getattr(lambdas, 'shape', type(lambdas).__name__)}")
    lambdas = lambdas.astype(np.float64)
    _check_in_range(lambdas, plan)
    return lambdas


def _check_in_range(lambdas: np.ndarray, plan: SearchPlan) -> None:
    low = plan.low if lambdas.ndim == 1 else plan.low[:, None]
    high = plan.high if lambdas.ndim == 1 else plan.high[:, None]
    slack = 1e-9 * (1 + np.abs(high))
    if not (np.all(np.isfinite(lambdas)) and np.all(lambdas >= low - slack)
            and np.all(lambdas <= high + slack)):
        raise ProtocolError("the server sent λ's outside the agreed range")


async def _zscore_party(crypto: PartyCrypto, Y: np.ndarray, width: int, passes: Passes
                        ) -> None:
    """Party side of the PPF z-score of the transformed data (:func:`ppf_zscore.party`
    without the count, which the server already holds)."""
    total = np.nansum(Y, axis=0)
    await passes.send(crypto, total)
    await ppf_zscore.share_moments(crypto, Y, total, passes)

