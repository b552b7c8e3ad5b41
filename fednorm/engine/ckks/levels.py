"""Level bookkeeping: know how many multiplications a ciphertext has left.

OpenFHE (FLEXIBLEAUTO) rescales lazily: after a multiplication the ciphertext keeps its
level and carries noise-scale degree 2 until the next operation rescales it. The levels a
ciphertext has *consumed* are therefore ``level + noise_scale_degree - 1``. A ciphertext
can be collectively bootstrapped only while ``consumed <= level_budget`` (depth - 4) and
decrypted only while ``consumed <= depth``; past either limit OpenFHE fails or, worse,
silently returns garbage. Every deep computation therefore checks levels *before* it
multiplies and refreshes in time (see :func:`ensure_levels`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openfhe

from fednorm.engine.errors import InputError, ProtocolError

Refresh = Callable[[openfhe.Ciphertext], Awaitable[openfhe.Ciphertext]]
"""An async collective bootstrap: takes a ciphertext, returns it at full level budget."""


class LevelBudgetError(ProtocolError):
    """A ciphertext would run past the levels it has left.

    Raised instead of letting OpenFHE produce a silently wrong result: a protocol that
    meets this error forgot to refresh (collectively bootstrap) in time, or a peer sent a
    ciphertext at an unexpected level.
    """


def consumed_levels(ct: openfhe.Ciphertext) -> int:
    """Multiplicative levels ``ct`` has used, counting a pending rescale as used."""
    return ct.GetLevel() + ct.GetNoiseScaleDeg() - 1


def levels_left(ct: openfhe.Ciphertext, budget: int) -> int:
    """Levels ``ct`` may still consume before it must be bootstrapped (negative: too late)."""
    return budget - consumed_levels(ct)


def require_consumed_at_most(ct: openfhe.Ciphertext, limit: int, what: str) -> None:
    """Raise :class:`LevelBudgetError` if ``ct`` has consumed more than ``limit`` levels."""
    used = consumed_levels(ct)
    if used > limit:
        raise LevelBudgetError(
            f"{what}: ciphertext has consumed {used} levels, limit is {limit}; "
            "refresh it (collective bootstrap) before this point"
        )


async def ensure_levels(ctx, ct: openfhe.Ciphertext, needed: int,
                        refresh: Refresh) -> openfhe.Ciphertext:
    """Return ``ct`` if it has ``needed`` levels left, else ``await refresh(ct)``.

    ``ctx`` is a :class:`~fednorm.engine.ckks.context.CkksContext`. A ciphertext already
    past the budget cannot be refreshed (bootstrapping it would return garbage), so that
    is a :class:`LevelBudgetError`, as is a refresh that does not restore enough levels.
    """
    budget = ctx.level_budget
    if not 0 <= needed <= budget:
        raise InputError(f"needed={needed} levels, but the budget is {budget}")
    left = levels_left(ct, budget)
    if left >= needed:
        return ct
    if left < 0:
        raise LevelBudgetError(
            f"ciphertext consumed {consumed_levels(ct)} levels, past the bootstrap budget "
            f"{budget}: it can no longer be refreshed"
        )
    fresh = await refresh(ct)
    if levels_left(fresh, budget) < needed:
        raise LevelBudgetError(
            f"refresh returned a ciphertext with {levels_left(fresh, budget)} levels left, "
            f"{needed} needed"
        )
    return fresh
