"""Homomorphic inverse 1/x on [lo, hi]: Goldschmidt division, Chebyshev-accelerated.

The paper's Inv (Lattigo) is Goldschmidt division: with x' = x/hi and r = 1 - x',
``a <- a(1 + r), r <- r^2`` doubles the polynomial degree per level, and 1 - x'a = r^(2^k).
On a wide range (x' down to lo/hi = 2^-20) it needs ~log2(hi/lo) + 5 = 25 doublings,
i.e. 4 collective bootstraps at depth 11.

Here the same product form runs with Chebyshev-optimal factors: the residual after k
doublings is R_k = T_{2^k}(y)/T_{2^k}(y0) with y = (1 + d - 2x')/(1 - d), d = lo/hi — the
minimax residual of degree 2^k, of size 1/cosh(2^k * 2 sqrt(d)). The recurrences stay
one squaring and one product per doubling (see :class:`_Schedule`), but the doublings
needed drop to about log2(ln(2/tol) / (2 sqrt(d))): 13 instead of 25 for [1, 2^20] at
tol 1e-6, so two bootstraps instead of four at the paper preset.

Collective bootstrapping refreshes only ``a``: after a refresh the residual is measured
afresh from x and the refreshed ``a``, so errors made before a refresh (including the
bootstrap's own noise) are corrected, not accumulated. That product is formed as
(gamma x) * (a / gamma) with gamma = 1/sqrt(lo hi), keeping both factors near 1: CKKS
noise is absolute (~1e-11), so a tiny factor times a large one loses digits.

Cost for [1, 2^20] at the default rel_tol 1e-6 (13 doublings, 24 ct-ct products):
paper preset (budget 7) 2 collective bootstraps, output at 5 levels used; test preset
(budget 5) 3 bootstraps. :func:`plan_inverse` gives these numbers for any range.

Measured max relative error of 1/x (``fednorm bench --sections noise``,
:mod:`fednorm.bench.noise`; P=3 and P=10 alike, one decryption per octave band so decoding
noise does not mix magnitudes):

    out_scale = hi (outputs hi/x in [1, 2^20]): <= 3.3e-7 over all of [1, 2^20], both presets
    out_scale = 1  (outputs 1/x):   x <= 2^10: 2.8e-7;  2^10..2^15: 2.3e-6;  2^15..2^20: 4.3e-5

The approximation bound is 2.25e-7; the rest is CKKS noise, ~4e-11 *absolute* on the
output, which only matters for tiny outputs — hence ``out_scale``.

Supported input: lo <= x <= hi with 0 < lo < hi, hi/lo <= 2^40. Slightly below lo
converges more slowly; above hi (y < -1) it diverges, so hi must be a true upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.cores import Core, Refresh, drive, dry_run, fully_refreshed
from fednorm.engine.ckks.levels import Refresher
from fednorm.engine.errors import InputError

COUNT_RANGE = (1.0, float(2**20))
"""Default input range: counts of samples, 1 .. 2^20."""

_MAX_DOUBLINGS = 24


@dataclass(frozen=True)
class _Schedule:
    """Constants of the iteration for [lo, hi] and ``doublings`` K.

    With y0 = cosh(theta) and lam_k = exp(-2^k theta), the Chebyshev values are
    c_k = T_{2^k}(y0) = (1/lam_k + lam_k)/2. The iteration keeps u_k = lam_k * 2T_{2^k}(y)
    (|u_k| <= 2), which obeys u_{k+1} = u_k^2 - 2 lam_{k+1}, and multiplies ``a`` by
    f_k = u_k + 1 + lam_{k+1}; the tracked factor sigma with p_k = sigma_k a_k stays in
    [2, 4]. So every constant is moderate: CKKS encodes a constant with absolute precision
    ~2^-50, which would ruin tiny constants (a 1e-12 factor loses 3 digits).
    """

    lo: float
    hi: float
    lam: tuple[float, ...]  # lam_k, k = 0..K+1

    @property
    def doublings(self) -> int:
        return len(self.lam) - 2

    @property
    def delta(self) -> float:
        return self.lo / self.hi

    def u0(self) -> tuple[float, float]:
        """u_0 = lam_0 * 2y = slope * x + shift, y = (1 + d - 2x/hi) / (1 - d)."""
        d, lam0 = self.delta, self.lam[0]
        return -4.0 * lam0 / ((1.0 - d) * self.hi), 2.0 * lam0 * (1.0 + d) / (1.0 - d)

    def sigma_step(self, k: int) -> float:
        """sigma_{k+1} / sigma_k = c_k / (c_{k+1} lam_k) = (1 + lam_{k+1}) / (1 + lam_{k+2})."""
        return (1.0 + self.lam[k + 1]) / (1.0 + self.lam[k + 2])

    @property
    def sigma0(self) -> float:
        """p_0 = 2 / (1 + d), the degree-0 approximation of 1/x'."""
        return 2.0 / (1.0 + self.delta)

    @property
    def error_bound(self) -> float:
        """Max relative error of the exact polynomial: 1 / c_K."""
        lam = self.lam[-2]
        return 2.0 * lam / (1.0 + lam * lam)


def _schedule(lo: float, hi: float, rel_tol: float) -> _Schedule:
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        raise InputError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
    if hi / lo > 2.0**40:
        raise InputError(f"range hi/lo = {hi / lo:.3g} exceeds 2^40")
    if not 1e-12 <= rel_tol < 1:
        raise InputError(f"rel_tol must be in [1e-12, 1), got {rel_tol}")
    eps = 2.0 * lo / (hi - lo)  # y0 - 1
    theta = math.log1p(eps + math.sqrt(eps * (eps + 2.0)))  # acosh(y0), stably
    lam = [math.exp(-theta)]
    while len(lam) < 2 or 2.0 * lam[-1] / (1.0 + lam[-1] ** 2) > rel_tol:
        if len(lam) > _MAX_DOUBLINGS:
            raise InputError(f"rel_tol {rel_tol} needs more than {_MAX_DOUBLINGS} doublings")
        lam.append(lam[-1] ** 2)
    lam.append(lam[-1] ** 2)
    return _Schedule(lo, hi, tuple(lam))


class _Ops(Protocol):
    """What the iteration needs: values are ciphertexts, or just level counts."""

    def consumed(self, v: Any) -> int: ...
    def scale(self, v: Any, s: float) -> Any: ...
    def shift(self, v: Any, s: float) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def square(self, v: Any) -> Any: ...


class _CtOps:
    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx

    def consumed(self, v: openfhe.Ciphertext) -> int:
        return self.ctx.consumed(v)

    def scale(self, v: openfhe.Ciphertext, s: float) -> openfhe.Ciphertext:
        return self.ctx.mul(v, s)

    def shift(self, v: openfhe.Ciphertext, s: float) -> openfhe.Ciphertext:
        return self.ctx.add(v, s)

    def mul(self, a: openfhe.Ciphertext, b: openfhe.Ciphertext) -> openfhe.Ciphertext:
        return self.ctx.mul(a, b)

    def square(self, v: openfhe.Ciphertext) -> openfhe.Ciphertext:
        return self.ctx.square(v)


class _LevelOps:
    """Symbolic run: a value is its consumed level; counts the work done."""

    def __init__(self) -> None:
        self.products = 0
        self.scalings = 0

    def consumed(self, v: int) -> int:
        return v

    def scale(self, v: int, s: float) -> int:
        self.scalings += 1
        return v + 1

    def shift(self, v: int, s: float) -> int:
        return v

    def mul(self, a: int, b: int) -> int:
        self.products += 1
        return max(a, b) + 1

    def square(self, v: int) -> int:
        self.products += 1
        return v + 1


def _segment_end(a_level: int, u_level: int, u_ready: bool, steps: int) -> int:
    """Consumed level of ``a`` after ``steps`` more doublings without a refresh."""
    for _ in range(steps):
        u_level += not u_ready
        a_level = max(a_level, u_level) + 1
        u_ready = False
    return a_level


def _fold_ends_at_limit(a_level: int, u_level: int, u_ready: bool, steps: int,
                        out_limit: int) -> bool:
    """Whether the remaining ``steps`` doublings end exactly at ``out_limit``: the output
    factor then goes into ``a`` now (free: ``a`` waits a level for ``u`` anyway) instead
    of costing a level, and with it a refresh, at the end."""
    end = _segment_end(a_level, u_level, u_ready, steps)
    return end <= out_limit < end + 1


@dataclass
class _Goldschmidt:
    """The product form after ``k`` doublings: ``a`` = a_k (the running product, times
    the output factor once ``folded``), ``u`` = u_j for j = ``u_index`` ≤ k (the scaled
    Chebyshev residual, squared up to u_k when the next factor needs it), ``sigma`` =
    sigma_k (p_k = sigma_k a_k approximates 1/x')."""

    ops: _Ops
    sch: _Schedule
    x: Any
    a: Any
    u: Any
    sigma: float
    folded: bool
    k: int = 1
    u_index: int = 0
    x_gamma: Any = None  # gamma x, made at the first restart

    @classmethod
    def start(cls, ops: _Ops, x: Any, sch: _Schedule, out_limit: int,
              out_factor: float) -> _Goldschmidt:
        """u_0 = lam_0 2y and a_1 = f_0 = u_0 + 1 + lam_1, both affine in x (one level);
        the output factor folded into a_1 when the whole run ends at ``out_limit``."""
        slope, shift = sch.u0()
        u = ops.shift(ops.scale(x, slope), shift)
        folded = _fold_ends_at_limit(ops.consumed(u), ops.consumed(u), False,
                                     sch.doublings - 1, out_limit)
        w = out_factor if folded else 1.0
        a = ops.shift(ops.scale(x, slope * w), (shift + 1.0 + sch.lam[1]) * w)
        return cls(ops, sch, x, a, u, sch.sigma0 * sch.sigma_step(0), folded)

    def next_level(self) -> int:
        """The consumed level a_{k+1} would have, formed now (u squared first if stale)."""
        u_level = self.ops.consumed(self.u) + (self.u_index < self.k)
        return max(self.ops.consumed(self.a), u_level) + 1

    def double(self) -> None:
        """One doubling: u_k = u_{k-1}^2 - 2 lam_k, a_{k+1} = a_k (u_k + 1 + lam_{k+1})."""
        ops, lam, k = self.ops, self.sch.lam, self.k
        if self.u_index < k:
            self.u, self.u_index = ops.shift(ops.square(self.u), -2.0 * lam[k]), k
        self.a = ops.mul(self.a, ops.shift(self.u, 1.0 + lam[k + 1]))
        self.sigma *= self.sch.sigma_step(k)
        self.k += 1

    def remeasure(self, budget: int) -> None:
        """After ``a`` was refreshed: u_k = (1 + lam_{k+1}) (1 - x' sigma_k a) measured
        afresh from x and the fresh ``a`` (so earlier errors, the refresh's included, are
        corrected), formed as (gamma x)(a / gamma) with gamma = 1/sqrt(lo hi): both
        factors near 1, since CKKS noise is absolute."""
        ops, sch, k = self.ops, self.sch, self.k
        gamma = 1.0 / math.sqrt(sch.lo * sch.hi)
        if self.x_gamma is None:
            self.x_gamma = ops.scale(self.x, gamma)
        t = ops.scale(self.a, -(1.0 + sch.lam[k + 1]) * self.sigma / (sch.hi * gamma))
        self.u = ops.shift(ops.mul(self.x_gamma, t), 1.0 + sch.lam[k + 1])
        self.u_index = k
        if max(ops.consumed(self.a), ops.consumed(self.u)) + 1 > budget:
            raise InputError(f"level budget {budget} is too small for the inverse")

    def fold_if_free(self, out_limit: int, out_factor: float) -> None:
        """Fold the output factor into ``a`` now if the rest then ends at ``out_limit``."""
        if _fold_ends_at_limit(self.ops.consumed(self.a) + 1, self.ops.consumed(self.u),
                               True, self.sch.doublings - self.k, out_limit):
            self.a, self.folded = self.ops.scale(self.a, out_factor), True


def _iterate(ops: _Ops, x: Any, sch: _Schedule, budget: int, out_limit: int,
             out_scale: float) -> Core[Any]:
    """The iteration; yields a :class:`Refresh` of a value whenever it must be refreshed
    (a ciphertext, or on level counts a count), gets it back fresh.

    The output constant sigma_K * out_scale / hi is applied at the end (one level) — or,
    when that level would cost an extra refresh, folded into ``a`` at the start of the
    last segment, where it costs no level (``a`` waits a level for ``u`` there anyway).
    """
    if ops.consumed(x) + 3 > budget:  # room for one restart (2 levels) and one product
        x = yield Refresh(x)
    sigma_end = sch.sigma0 * math.prod(sch.sigma_step(j) for j in range(sch.doublings))
    out_factor = sigma_end * out_scale / sch.hi  # output = out_factor * a_K (unfolded a)
    run = _Goldschmidt.start(ops, x, sch, out_limit, out_factor)
    while run.k < sch.doublings:
        if run.next_level() > budget:
            run.a = yield Refresh(run.a)
            run.remeasure(budget)
            run.fold_if_free(out_limit, out_factor)
        else:
            run.double()
    if run.folded:
        return run.a
    a = run.a
    if ops.consumed(a) + 1 > out_limit:
        a = yield Refresh(a)
    return ops.scale(a, out_factor)


@dataclass(frozen=True)
class InversePlan:
    """What :func:`inverse` will do for a range and budget (computed without crypto)."""

    doublings: int
    bootstraps: int
    products: int
    output_consumed: int
    error_bound: float


def _limits(budget: int, keep_levels: int) -> int:
    if not 0 <= keep_levels <= budget - 1:
        raise InputError(f"keep_levels must be in [0, {budget - 1}], got {keep_levels}")
    return budget - keep_levels


def plan_inverse(budget: int, lo: float = COUNT_RANGE[0], hi: float = COUNT_RANGE[1], *,
                 rel_tol: float = 1e-6, input_consumed: int = 0,
                 keep_levels: int = 0) -> InversePlan:
    """Dry-run the inverse on level counts: doublings, bootstraps, products, output level."""
    sch = _schedule(lo, hi, rel_tol)
    ops = _LevelOps()
    gen = _iterate(ops, input_consumed, sch, budget, _limits(budget, keep_levels), 1.0)
    out, boots = dry_run(gen, 0)  # a refreshed value has consumed no level
    return InversePlan(sch.doublings, boots, ops.products, out, sch.error_bound)


def inverse_core(ctx: CkksContext, ct: openfhe.Ciphertext, lo: float = COUNT_RANGE[0],
                 hi: float = COUNT_RANGE[1], *, rel_tol: float = 1e-6,
                 out_scale: float = 1.0, keep_levels: int = 0) -> Core[openfhe.Ciphertext]:
    """Encrypted ``out_scale / x`` for every slot x in [lo, hi], as a crypto core: it
    yields a ciphertext whenever levels run out and is resumed with it refreshed
    (:func:`plan_inverse` tells how often).

    Relative error: ``rel_tol`` from the approximation (2.25e-7 by default on [1, 2^20]),
    plus CKKS noise of ~1e-11 to 4e-11 *absolute* on the output, so a tiny output such as
    1/2^20 gets up to 4e-5 relative error. If that matters, ask for ``out_scale = hi`` (outputs
    in [1, hi/lo]: measured max relative error 3.3e-7 over [1, 2^20]) and fold 1/hi into
    the factor the inverse multiplies next (free in depth if that factor is fresh).
    ``keep_levels`` levels are left on the result for the caller.
    """
    sch = _schedule(lo, hi, rel_tol)
    ctx.check_same_context(ct, "inverse input")
    budget = ctx.level_budget
    gen = _iterate(_CtOps(ctx), ct, sch, budget, _limits(budget, keep_levels), out_scale)
    try:
        request = gen.send(None)
        while True:
            request = gen.send((yield from fully_refreshed(ctx, request.ct)))
    except StopIteration as done:
        return done.value


async def inverse(ctx: CkksContext, ct: openfhe.Ciphertext, lo: float = COUNT_RANGE[0],
                  hi: float = COUNT_RANGE[1], refresh: Refresher | None = None, *,
                  rel_tol: float = 1e-6, out_scale: float = 1.0,
                  keep_levels: int = 0) -> openfhe.Ciphertext:
    """:func:`inverse_core`, each refresh awaited: ``refresh`` is the collective
    bootstrap (none needed means it may be ``None``)."""
    plan = plan_inverse(ctx.level_budget, lo, hi, rel_tol=rel_tol,
                        input_consumed=ctx.consumed(ct), keep_levels=keep_levels)
    if plan.bootstraps and refresh is None:
        raise InputError(f"inverse needs {plan.bootstraps} collective bootstraps here: "
                         "pass a refresh callback")
    core = inverse_core(ctx, ct, lo, hi, rel_tol=rel_tol, out_scale=out_scale,
                        keep_levels=keep_levels)
    return await drive(core, refresh)  # type: ignore[arg-type]
