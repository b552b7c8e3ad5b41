"""Homomorphic comparison: max(a, b), min(a, b) by composite sign polynomials.

max(a, b) = b + (a − b)·h(t) and min(a, b) = a − (a − b)·h(t), where t = (a − b)/(2B) lies
in [−1, 1] for inputs bounded by B and h ≈ 1{t > 0} is a composite polynomial: the
odd degree-7 polynomials of Cheon, Kim, Kim, Lee (Asiacrypt 2020, "Efficient homomorphic
comparison methods with optimal complexity") — first ``g`` stages (slope 4.48 at 0,
they push small |t| away from 0 fast) then ``f`` stages (f(±1) = ±1 with vanishing
derivatives, they pull everything onto ±1 and squash the noise a refresh left behind).
Each stage costs 3 levels and 4 ciphertext products; the last one also folds
h = (1 + sign)/2 into its coefficients.

**Error bound.** For |t| ≥ δ the sign is exact to far below CKKS noise; below it the
product (a − b)·h still keeps the result between min(a, b) and max(a, b), so the error
is at most |a − b|. Both cases fold into one number, an upper bound computed from the
polynomials by interval arithmetic (:func:`comparison_error`)::

    |max~(a, b) − max(a, b)| ≤ B · max_t |t| · |1 − p(t)|   (p: the composite sign)

``bits`` asks for that relative error to be ≤ 2^-bits; :func:`plan_compare` picks the
fewest stages that achieve it (each 3 levels buys ~2.2 bits). It is reached only by
near-ties (|a − b| around δ·B); pairs further apart come out within ~6e-8·B (the f tail)
plus CKKS noise.

Measured (``max_and_min`` of one ciphertext, inputs at magnitude B = 128 with gaps
log-uniform over 1e-9..1: error / B; from fresh inputs, P=10, all roles in one process
via :mod:`.local`, one OpenMP thread on a 2-core machine at load ~5 — expect 2–3× less
on a quiet one)::

    bits  g+f  levels  bound    max error  gap>2e-2·B  bootstraps  products  paper s  test s
     6    2+1    9     1.0e-2   1.0e-2     1.0e-2      1 / 2        13       3.1      1.8
     8    2+2   12     2.8e-3   2.8e-3     2.3e-3      1 / 3        17       3.7      2.4
    10    3+2   15     6.3e-4   6.3e-4     6.4e-8      2 / 4        21       4.9      2.9
    12    4+2   18     1.4e-4   1.4e-4     5.9e-8      2 / 5        25       5.5      3.3
    14    5+2   21     3.1e-5   3.1e-5     5.8e-8      3 / 6        29       8.3      4.3
    16    6+2   24     7.0e-6   7.0e-6     6.4e-8      3 / –        33       8.3      –
    20    8+2   30     3.5e-7   3.5e-7     5.9e-8      4 / –        41      10.0      –

(bootstraps: paper / test preset — the test preset's budget of 5 fits one stage per
refresh). The bound is tight: the worst near-tie meets it.

**Levels.** A stage runs only with 3 levels left; otherwise the sign ciphertext is
refreshed: the ``*_core`` functions are crypto cores (:mod:`.cores`) that yield it for a
collective bootstrap and are resumed with the fresh one, exactly as
:func:`~fednorm.engine.ckks.inversion.inverse_core` does (the functions without the
suffix drive them with an async ``refresh`` callback); the step ends at most one level
below the budget. The inputs need one level left (refreshed otherwise) and the result stays within
the budget, so comparisons chain (:func:`fold_maximum`). Refreshing the *values* costs
them ~6e-9 of their largest slot (measured), the sign nothing that matters: its last
stages flatten any noise near ±1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.cores import Core, drive, fully_refreshed, pairwise, refreshed
from fednorm.engine.ckks.levels import LevelBudgetError, Refresher
from fednorm.engine.errors import InputError

Coefficients = tuple[float, ...]

F3: Coefficients = (0.0, 35 / 16, 0.0, -35 / 16, 0.0, 21 / 16, 0.0, -5 / 16)
"""f_3(x) = (35x − 35x³ + 21x⁵ − 5x⁷)/16: f(±1) = ±1, f', f'', f''' vanish at ±1."""

G3: Coefficients = (0.0, 4589 / 1024, 0.0, -16577 / 1024, 0.0, 25614 / 1024, 0.0,
                    -12860 / 1024)
"""g_3 of Cheon et al. (2020): slope 4.48 at 0, maps [−1, 1] into [−1, 1]."""

STAGE_LEVELS = 3
"""Levels one degree-7 stage consumes (x², x⁴, then the odd terms)."""

STAGE_PRODUCTS = 4
"""Ciphertext-ciphertext products per stage."""

MAX_STAGES = 24
_EDGES = np.geomspace(2.0**-60, 1.0, 40_001)
"""t in (0, 1] cut into intervals of ratio 1.0010 for the error bound; below 2^-60 the
error |t|·|1 − p| is below 2^-60 anyway."""


def evaluate(coefficients: Coefficients, x: np.ndarray) -> np.ndarray:
    """A stage polynomial on plaintext values (the model the ciphertext path follows)."""
    return np.polynomial.polynomial.polyval(x, coefficients)


def composite_sign(g_stages: int, f_stages: int, t: np.ndarray) -> np.ndarray:
    """The composite sign approximation ``f^f_stages ∘ g^g_stages`` on plaintext ``t``."""
    for coefficients in (G3,) * g_stages + (F3,) * f_stages:
        t = evaluate(coefficients, t)
    return t


def _image(coefficients: Coefficients, low: np.ndarray, high: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Exact range of a polynomial over each interval [low, high]: its values at the ends
    and at the critical points inside."""
    ends = (evaluate(coefficients, low), evaluate(coefficients, high))
    out_low, out_high = np.minimum(*ends), np.maximum(*ends)
    derivative = np.polynomial.polynomial.polyder(coefficients)
    for root in np.polynomial.polynomial.polyroots(derivative):
        if abs(root.imag) > 1e-12:
            continue
        inside = (low <= root.real) & (root.real <= high)
        value = float(evaluate(coefficients, np.array(root.real)))
        out_low = np.where(inside, np.minimum(out_low, value), out_low)
        out_high = np.where(inside, np.maximum(out_high, value), out_high)
    return out_low, out_high


@lru_cache(maxsize=64)
def _sign_range(g_stages: int, f_stages: int) -> tuple[np.ndarray, np.ndarray]:
    """Range of the composite sign over each interval of :data:`_EDGES` (interval
    arithmetic, stage by stage: a rigorous enclosure)."""
    if f_stages:
        return _image(F3, *_sign_range(g_stages, f_stages - 1))
    if g_stages:
        return _image(G3, *_sign_range(g_stages - 1, 0))
    return _EDGES[:-1], _EDGES[1:]


@cache
def comparison_error(g_stages: int, f_stages: int) -> float:
    """An upper bound of |t|·|1 − p(t)| over t in (0, 1] (p is odd, so this covers
    [−1, 1]): the relative error bound of :func:`maximum` / :func:`minimum`.

    Computed by interval arithmetic over 40 000 intervals, so it holds between the
    sample points too (the composite oscillates at degree 7^stages).
    """
    low, high = _sign_range(g_stages, f_stages)
    deviation = np.maximum(1.0 - low, high - 1.0)
    return float(max(np.max(_EDGES[1:] * deviation), 2.0**-60))


@dataclass(frozen=True)
class ComparePlan:
    """A composite sign: ``g_stages`` of :data:`G3`, then ``f_stages`` of :data:`F3`."""

    g_stages: int
    f_stages: int

    def __post_init__(self) -> None:
        if self.g_stages < 0 or self.f_stages < 1 or self.stages_count > MAX_STAGES:
            raise InputError(f"need g_stages >= 0, f_stages >= 1 and at most {MAX_STAGES} "
                             f"stages, got {self.g_stages} + {self.f_stages}")

    @property
    def stages_count(self) -> int:
        return self.g_stages + self.f_stages

    @property
    def stages(self) -> tuple[Coefficients, ...]:
        return (G3,) * self.g_stages + (F3,) * self.f_stages

    @property
    def levels(self) -> int:
        """Levels the sign's stages consume, refreshes in between (:func:`refresh_schedule`)."""
        return STAGE_LEVELS * self.stages_count

    @property
    def products(self) -> int:
        """Ciphertext products of one comparison (sign stages plus the final product)."""
        return STAGE_PRODUCTS * self.stages_count + 1

    @property
    def error_bound(self) -> float:
        """|max~(a, b) − max(a, b)| ≤ error_bound · B for inputs in [−B, B]."""
        return comparison_error(self.g_stages, self.f_stages)

    @property
    def bits(self) -> float:
        return -math.log2(self.error_bound)

    def bootstraps(self, budget: int, start: int, end_level: int) -> int:
        """Refreshes one sign evaluation takes (see :func:`refresh_schedule`)."""
        return sum(refresh_schedule(self.stages_count, budget, start, end_level))


def refresh_schedule(stages: int, budget: int, start: int, end_level: int
                     ) -> tuple[bool, ...]:
    """For each stage, whether the sign ciphertext is refreshed right before it.

    Pure level arithmetic, followed by :func:`step`: a stage runs if 3 levels are left
    within ``budget``; the last one must also end by ``end_level``. ``start`` is the
    level the sign input has used.
    """
    if not 0 <= start <= budget:
        raise LevelBudgetError(f"sign input used {start} levels, past the budget {budget}")
    if not STAGE_LEVELS <= end_level <= budget:
        raise InputError(f"end_level must be in [{STAGE_LEVELS}, {budget}], got {end_level}")
    schedule, level = [], start
    for index in range(stages):
        limit = end_level if index == stages - 1 else budget
        refresh = level + STAGE_LEVELS > limit
        level = (0 if refresh else level) + STAGE_LEVELS
        schedule.append(refresh)
    return tuple(schedule)


@cache
def plan_compare(bits: float) -> ComparePlan:
    """The fewest stages whose error bound is ≤ 2^-bits (ties: the smaller bound)."""
    if not 1 <= bits <= 40:
        raise InputError(f"comparison precision must be 1..40 bits, got {bits}")
    target = 2.0**-bits
    for total in range(1, MAX_STAGES + 1):
        plans = [ComparePlan(total - f, f) for f in range(1, total + 1)]
        best = min(plans, key=lambda plan: plan.error_bound)
        if best.error_bound <= target:
            return best
    raise InputError(f"{bits} bits need more than {MAX_STAGES} stages")


# -- ciphertext path -----------------------------------------------------------------------
def _stage(ctx: CkksContext, x: openfhe.Ciphertext, c: Sequence[float]) -> openfhe.Ciphertext:
    """c0 + c1·x + c3·x³ + c5·x⁵ + c7·x⁷ in 3 levels and 4 products.

    Constants ride on a factor that has a level to spare: A = (c7·x)·x² (level 2), then
    c5·x⁵ + c7·x⁷ = x⁴·(c5·x + A) and c3·x³ = (c3/c7)·A, both at level 3.
    """
    x2 = ctx.square(x)
    x4 = ctx.square(x2)
    cubic = ctx.mul(ctx.mul(x, c[7]), x2)
    high = ctx.mul(x4, ctx.add(ctx.mul(x, c[5]), cubic))
    out = ctx.add(ctx.add(ctx.mul(x, c[1]), ctx.mul(cubic, c[3] / c[7])), high)
    return ctx.add(out, c[0]) if c[0] else out


def _step_coefficients(c: Coefficients) -> Coefficients:
    """(1 + p)/2 for an odd p: the sign's last stage turned into a step 1{t > 0}."""
    return (0.5, *(v / 2 for v in c[1:]))


def step_core(ctx: CkksContext, t: openfhe.Ciphertext, plan: ComparePlan, *,
              end_level: int) -> Core[openfhe.Ciphertext]:
    """≈ 1{t > 0} (½ at 0) for every slot t in [−1, 1], at most ``end_level`` levels used.

    Stages run whenever 3 levels are left, refreshing otherwise; the last one starts on
    a fresh ciphertext unless it fits below ``end_level`` as it is.
    """
    stages = (*plan.stages[:-1], _step_coefficients(plan.stages[-1]))
    schedule = refresh_schedule(len(stages), ctx.level_budget, ctx.consumed(t), end_level)
    for coefficients, refresh_first in zip(stages, schedule, strict=True):
        if refresh_first:
            t = yield from fully_refreshed(ctx, t)
        t = _stage(ctx, t, coefficients)
    return t


def _gap_and_step(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                  bound: float, plan: ComparePlan,
                  ) -> Core[tuple[openfhe.Ciphertext, openfhe.Ciphertext]]:
    """(a − b, h) with h ≈ 1{a > b}; a and b need one level left (for t and the product)."""
    if not (math.isfinite(bound) and bound > 0):
        raise InputError(f"bound must be positive and finite, got {bound}")
    a = yield from refreshed(ctx, a, 1)
    b = yield from refreshed(ctx, b, 1)
    gap = ctx.sub(a, b)
    end = ctx.level_budget - 1  # so the product stays within budget, refreshable
    h = yield from step_core(ctx, ctx.mul(gap, 0.5 / bound), plan, end_level=end)
    return gap, h


def maximum_core(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                 plan: ComparePlan, *, bound: float = 1.0) -> Core[openfhe.Ciphertext]:
    """Slot-wise max(a, b) for |a|, |b| ≤ ``bound``, within ``plan.error_bound · bound``.

    The result never exceeds max(a, b) nor falls below min(a, b) (up to CKKS noise), and
    uses at most ``level_budget`` levels, so it can be refreshed or compared again.
    """
    gap, h = yield from _gap_and_step(ctx, a, b, bound, plan)
    return ctx.add(b, ctx.mul(gap, h))


def max_and_min_core(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                     plan: ComparePlan, *, bound: float = 1.0
                     ) -> Core[tuple[openfhe.Ciphertext, openfhe.Ciphertext]]:
    """(max(a, b), min(a, b)) for the price of one comparison: both share the step."""
    gap, h = yield from _gap_and_step(ctx, a, b, bound, plan)
    lift = ctx.mul(gap, h)
    return ctx.add(b, lift), ctx.sub(a, lift)


def tree_maximum_core(ctx: CkksContext, cts: Sequence[openfhe.Ciphertext],
                      plan: ComparePlan, *, bound: float = 1.0) -> Core[openfhe.Ciphertext]:
    """Slot-wise max of several ciphertexts in ⌈log2 n⌉ rounds of pairwise comparisons."""

    def larger(a: openfhe.Ciphertext, b: openfhe.Ciphertext) -> Core[openfhe.Ciphertext]:
        return maximum_core(ctx, a, b, plan, bound=bound)

    return (yield from pairwise(cts, larger))


def fold_rotations(stride: int, steps: int) -> tuple[int, ...]:
    """Rotations :func:`fold_maximum` makes: stride·2^k for k < steps."""
    return tuple(stride << k for k in range(steps))


def rotation_plan(amount: int, keys: Sequence[int]) -> tuple[int, ...]:
    """Rotations by the available ``keys`` (largest first) that add up to ``amount``.

    A rotation key costs every party a 25 MB share at ring 2^15 (and the lead's is
    forwarded to everyone), so a protocol may hold keys for a few indices only and
    compose the rest: one key-switch per rotation, ~1/8 of a comparison stage.
    """
    steps, left = [], amount
    for key in sorted(set(keys), reverse=True):
        count, left = divmod(left, key)
        steps += [key] * count
    if left or amount < 0:
        raise InputError(f"rotation by {amount} is not a sum of the keys {sorted(keys)}")
    return tuple(steps)


def rotate_by(ctx: CkksContext, ct: openfhe.Ciphertext, amount: int,
              keys: Sequence[int]) -> openfhe.Ciphertext:
    """Rotate left by ``amount`` with rotations by the available ``keys``."""
    for key in rotation_plan(amount, keys):
        ct = ctx.rotate(ct, key)
    return ct


def fold_maximum_core(ctx: CkksContext, ct: openfhe.Ciphertext, stride: int, steps: int,
                      plan: ComparePlan, *, bound: float = 1.0,
                      keys: Sequence[int] | None = None) -> Core[openfhe.Ciphertext]:
    """Slot i gets max over slots i + j·stride, j < 2^steps: a tree of ``steps`` rounds,
    each one comparison of the ciphertext with itself rotated by stride·2^k.

    ``keys``: the rotation indices with keys installed (default: every
    :func:`fold_rotations` index); other rotations are composed of them. The error
    bounds of the rounds add up (max is 1-Lipschitz): ``steps · plan.error_bound · bound``.
    """
    keys = fold_rotations(stride, steps) if keys is None else keys
    for amount in fold_rotations(stride, steps):
        ct = yield from refreshed(ctx, ct, 1)
        rotated = rotate_by(ctx, ct, amount, keys)
        ct = yield from maximum_core(ctx, ct, rotated, plan, bound=bound)
    return ct


# -- the same, driven by an async refresh callback (tests, local runs) ---------------------
async def step(ctx: CkksContext, t: openfhe.Ciphertext, refresh: Refresher, plan: ComparePlan,
               *, end_level: int) -> openfhe.Ciphertext:
    """:func:`step_core`, each refresh awaited."""
    return await drive(step_core(ctx, t, plan, end_level=end_level), refresh)


async def maximum(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                  refresh: Refresher, plan: ComparePlan, *, bound: float = 1.0
                  ) -> openfhe.Ciphertext:
    """:func:`maximum_core`, each refresh awaited."""
    return await drive(maximum_core(ctx, a, b, plan, bound=bound), refresh)


async def minimum(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                  refresh: Refresher, plan: ComparePlan, *, bound: float = 1.0
                  ) -> openfhe.Ciphertext:
    """Slot-wise min(a, b) for |a|, |b| ≤ ``bound`` (see :func:`maximum_core`)."""
    return (await max_and_min(ctx, a, b, refresh, plan, bound=bound))[1]


async def max_and_min(ctx: CkksContext, a: openfhe.Ciphertext, b: openfhe.Ciphertext,
                      refresh: Refresher, plan: ComparePlan, *, bound: float = 1.0
                      ) -> tuple[openfhe.Ciphertext, openfhe.Ciphertext]:
    """:func:`max_and_min_core`, each refresh awaited."""
    return await drive(max_and_min_core(ctx, a, b, plan, bound=bound), refresh)


async def tree_maximum(ctx: CkksContext, cts: Sequence[openfhe.Ciphertext], refresh: Refresher,
                       plan: ComparePlan, *, bound: float = 1.0) -> openfhe.Ciphertext:
    """:func:`tree_maximum_core`, each refresh awaited."""
    return await drive(tree_maximum_core(ctx, cts, plan, bound=bound), refresh)


async def fold_maximum(ctx: CkksContext, ct: openfhe.Ciphertext, stride: int, steps: int,
                       refresh: Refresher, plan: ComparePlan, *, bound: float = 1.0,
                       keys: Sequence[int] | None = None) -> openfhe.Ciphertext:
    """:func:`fold_maximum_core`, each refresh awaited."""
    return await drive(fold_maximum_core(ctx, ct, stride, steps, plan, bound=bound,
                                         keys=keys), refresh)
