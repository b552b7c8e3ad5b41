"""PPF Yeo-Johnson's encrypted computations on the server, as crypto cores.

Each function is synchronous ciphertext arithmetic that yields what it needs from the
federation — a ciphertext to refresh (collective bootstrap) or a decryption
(:func:`~fednorm.protocols.ppf.driver.decrypted`) — and is run by
:func:`~fednorm.protocols.ppf.driver.run_core`, off the event loop.  The order of the
requests is the protocol's: the parties answer them in that order, within the ledger's
allowances, whose bootstraps are these cores' own, run on level counts
(:func:`planned_refreshes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openfhe

from fednorm.engine.ckks.compare import ComparePlan, step_core
from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.cores import Core, decrypted, done, fully_refreshed, pairwise, refreshed
from fednorm.engine.ckks.inversion import inverse_core
from fednorm.engine.ckks.levels import LevelArithmetic, Levels
from fednorm.protocols.ppf import noise
from fednorm.protocols.ppf.driver import planned_requests
from fednorm.protocols.ppf.yeojohnson_math import SignFlags
from fednorm.protocols.ppf.yeojohnson_search import Layout

INVERSE_KEEP_LEVELS = 3  # the quotient, its scaling and the Newton correction


@dataclass(frozen=True)
class RefinedInverse:
    """⟨max_count/n⟩ from Goldschmidt and its Newton correction ⟨2 − n·inverse/max_count⟩:
    their product squares the inverse's relative error (measured: ~2e-7 → ~1e-12 on a
    quotient, ~4e-10 on the refined inverse itself)."""

    scaled: openfhe.Ciphertext
    correction: openfhe.Ciphertext

    def product(self, context: CkksContext) -> openfhe.Ciphertext:
        """⟨max_count/n⟩ refined, as one ciphertext (for the two-pass quotients)."""
        return context.mul(self.scaled, self.correction)


@dataclass(frozen=True)
class Pooled:
    """The server's encrypted pooled quantities that every round reuses."""

    inverse: RefinedInverse
    log_mean: openfhe.Ciphertext  # E[s̃] in block 0, zero elsewhere (masked)


def sign_flags_core(context: CkksContext, absent: Sequence[openfhe.Ciphertext],
                    width: int) -> Core[SignFlags]:
    """Multiply the parties' 0/1 "absent" flags (a product tree, every factor refreshed
    when it has no level left) and decrypt the product: 1 iff no party has a value / a
    negative / a positive value."""

    flags = yield from pairwise(absent, lambda a, b: done(context.mul(a, b)),
                                prepare=lambda ct: refreshed(context, ct, 1))
    declared = noise.declared(noise.SIGN_FLAGS, context.preset)
    return SignFlags.from_absent((yield from decrypted(flags, 3 * width, declared)))


def pooled_core(context: CkksContext, count: openfhe.Ciphertext, logs: openfhe.Ciphertext,
                layout: Layout, empty: np.ndarray, max_count: int) -> Core[Pooled]:
    """⟨max_count/n⟩ (refined) and ⟨E[s̃]⟩, masked to the probe slots."""
    hi = float(max_count)
    padded = context.add(count, layout.padding(empty))
    scaled = yield from inverse_core(context, padded, 1.0, hi, out_scale=hi,
                                     keep_levels=INVERSE_KEEP_LEVELS)
    # n ⊙ inverse before 1/max_count: scaling n down first leaves ~1e-6 of noise.
    correction = context.negate(
        context.sub(context.mul(context.mul(padded, scaled), 1.0 / hi), 2.0))
    inverse = RefinedInverse(scaled, correction)
    log_mean = yield from mean_core(context, inverse, logs, max_count)
    return Pooled(inverse, context.mul(log_mean, layout.mask()))


def mean_core(context: CkksContext, inverse: RefinedInverse, sums: openfhe.Ciphertext,
              max_count: int) -> Core[openfhe.Ciphertext]:
    """⟨Σ/n⟩ = ((Σ ⊙ max_count/n) / max_count) ⊙ correction, collectively refreshed.

    Measured (test preset, n in 1..2^20): relative error ~1e-12, against ~2e-7 without
    the correction."""
    raw = context.mul(context.mul(sums, inverse.scaled), 1.0 / max_count)
    return (yield from fully_refreshed(context, context.mul(raw, inverse.correction)))


def soft_signs_core(context: CkksContext, moments: openfhe.Ciphertext, pooled: Pooled,
                    layout: Layout, sign: ComparePlan, max_count: int) -> Core[np.ndarray]:
    """Decrypted ≈ sign(t) per (feature, probe), from the four pooled sums."""
    means = yield from mean_core(context, pooled.inverse, moments, max_count)  # [ā|q̄|r̄|ḡ]
    q = context.rotate(means, layout.block)
    r = context.rotate(q, layout.block)
    g = context.rotate(r, layout.block)
    var = context.sub(q, context.square(means))
    cov = context.sub(r, context.mul(means, g))
    masked_cov = context.mul(cov, layout.mask())
    t = context.sub(context.mul(pooled.log_mean, var), masked_cov)
    h = yield from step_core(context, t, sign, end_level=context.level_budget)
    soft = 2 * (yield from decrypted(h, layout.used, None)) - 1  # not floodable: LEAKAGE.md
    return layout.from_slots(soft)


@dataclass(frozen=True)
class Refreshes:
    """The collective bootstraps of each step of the server's search, as a party answers
    them: the sign flags, the pooling before the first probes, and every round."""

    flags: int
    pooling: int
    round: int


def planned_refreshes(context: CkksContext, parties: int, layout: Layout, sign: ComparePlan,
                      max_count: int) -> Refreshes:
    """:class:`Refreshes` from the cores above run on level counts, on fresh uploads:
    every input is public (P, the layout, the sign's plan), the values play no part."""
    levels = LevelArithmetic.like(context)
    fresh = Levels(0)
    _, flags = planned_requests(sign_flags_core(levels, [fresh] * parties, layout.width))
    pooled, pooling = planned_requests(pooled_core(
        levels, fresh, fresh, layout, np.zeros(layout.width, dtype=bool), max_count))
    _, rounds = planned_requests(soft_signs_core(levels, fresh, pooled, layout, sign,
                                                 max_count))
    return Refreshes(flags.bootstraps, pooling.bootstraps, rounds.bootstraps)
