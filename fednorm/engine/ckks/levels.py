"""Level bookkeeping: know how many multiplications a ciphertext has left.

OpenFHE (FLEXIBLEAUTO) rescales lazily: after a multiplication the ciphertext keeps its
level and carries noise-scale degree 2 until the next operation rescales it. The levels a
ciphertext has *consumed* are therefore ``level + noise_scale_degree - 1``. A ciphertext
can be collectively bootstrapped only while ``consumed <= level_budget`` (depth - 4) and
decrypted only while ``consumed <= depth``; past either limit OpenFHE fails or, worse,
silently returns garbage. Every deep computation therefore checks levels *before* it
multiplies and refreshes in time (see :func:`.cores.refreshed`); :class:`LevelArithmetic`
runs such a computation on level counts alone, to know its refreshes in advance.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import openfhe

from fednorm.engine.ckks.presets import CkksPreset
from fednorm.engine.errors import ProtocolError

Refresher = Callable[[openfhe.Ciphertext], Awaitable[openfhe.Ciphertext]]
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


@dataclass(frozen=True)
class Levels:
    """A ciphertext in a run on level counts: only the levels it has consumed."""

    consumed: int


class LevelArithmetic:
    """The arithmetic of :class:`~.context.CkksContext` a crypto core uses, on
    :class:`Levels` instead of ciphertexts: each product one level (FLEXIBLEAUTO's
    count, :func:`consumed_levels`), additions and rotations none.

    A core run on it (:func:`.cores.dry_run`) makes every refresh and decryption request
    the ciphertext run makes, from public sizes alone: how a party knows in advance how
    many collective bootstraps a step of the server takes, and refuses more.
    """

    def __init__(self, level_budget: int, depth: int, preset: CkksPreset | None = None
                 ) -> None:
        self.level_budget = level_budget
        self.depth = depth
        self.preset = preset  # the context's CkksPreset: what its decryptions declare

    @classmethod
    def like(cls, context: Any) -> LevelArithmetic:
        """The level counts of ``context`` (a :class:`~.context.CkksContext`)."""
        return cls(context.level_budget, context.depth, context.preset)

    def consumed(self, ct: Levels) -> int:
        return ct.consumed

    def levels_left(self, ct: Levels) -> int:
        return self.level_budget - ct.consumed

    def add(self, a: Levels, b: object) -> Levels:
        return Levels(max(a.consumed, _consumed(b)))

    sub = add

    def mul(self, a: Levels, b: object) -> Levels:
        used = max(a.consumed, _consumed(b)) + 1
        if used > self.depth:
            raise LevelBudgetError(f"multiplication needs level {used}, depth is {self.depth}")
        return Levels(used)

    def square(self, a: Levels) -> Levels:
        return self.mul(a, a)

    def negate(self, a: Levels) -> Levels:
        return a

    def rotate(self, ct: Levels, index: int) -> Levels:
        return ct

    def check_same_context(self, obj: object, what: str) -> None:
        if not isinstance(obj, Levels):
            raise ProtocolError(f"{what} is a {type(obj).__name__}, not a level count")


def _consumed(operand: object) -> int:
    """Levels an operand has consumed: a plaintext vector or scalar none."""
    return operand.consumed if isinstance(operand, Levels) else 0
