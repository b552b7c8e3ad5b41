"""Level bookkeeping: know how many multiplications a ciphertext has left.

OpenFHE (FLEXIBLEAUTO) rescales lazily: after a multiplication the ciphertext keeps its
level and carries noise-scale degree 2 until the next operation rescales it. The levels a
ciphertext has *consumed* are therefore ``level + noise_scale_degree - 1``. A ciphertext
can be collectively bootstrapped only while ``consumed <= level_budget`` (depth - 4) and
decrypted only while ``consumed <= depth``; past either limit OpenFHE fails or, worse,
silently returns garbage. Every deep computation therefore checks levels *before* it
multiplies and refreshes in time (see :func:`.cores.refreshed`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openfhe

from fednorm.engine.errors import ProtocolError

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
