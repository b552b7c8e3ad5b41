"""The math of PPF Yeo-Johnson that server and parties share, in plaintext float64.

**Why a sign suffices.** The Yeo-Johnson profile log-likelihood

    llf(λ) = −n/2 · log var(ψ) + (λ − 1) · Σ s,   ψ = yj(x, λ), s = sign(x)·log1p|x|

is concave in λ (Marchand et al., SecureFedYJ, 2022), so its maximizer is where llf'
changes sign. With ψ' = ∂ψ/∂λ and pooled means E[·] over the n present values,

    llf'(λ)/n = E[s] − cov(ψ, ψ')/var(ψ),  so  sign llf'(λ) = sign D,
    D = E[s]·var(ψ) − cov(ψ, ψ') = E[s]·(E[ψ²] − E[ψ]²) − (E[ψψ'] − E[ψ]·E[ψ']).

**Scaling from V_abs.** yj(·, λ) is increasing and ψ' grows with |x| on each side of 0
(ψ = ∫₀ᴸ e^{λu} du, ψ' = ∫₀ᴸ u·e^{λu} du with L = log1p x for x ≥ 0, mirrored with
2 − λ below 0), so the agreed bound |x| ≤ V_abs — narrowed to [0, V_abs] or [−V_abs, 0]
when the pooled data have one sign (the sign flags below) — gives, per λ, plaintext
centres c, c' and half-widths B_ψ, B_ψ' of ψ and ψ', and |s| ≤ B_s = log1p V_abs. Then
|D| ≤ K = B_s·B_ψ² + B_ψ·B_ψ', and each party maps its values, before encrypting, to

    ψ̃ = a·(ψ − c),  ψ̃' = (a/B_s)·(ψ' − c'),  s̃ = s/B_s,  a = sqrt(B_s/K),

so that t = E[s̃]·var(ψ̃) − cov(ψ̃, ψ̃') = D/K lies in [−1, 1] (shifts leave var and cov
unchanged) and the server needs no bound of its own.

**λ range.** Where the pooled data hold positive values, λ ≤ λ_max, the largest
λ ≤ 1 + :data:`LAMBDA_SPAN` with yj(V_abs, λ) ≤ 2^40 (the transformed data must fit the
PPF z-score's range); where they hold negative values, λ ≥ 2 − λ_max; a side no value
constrains is open to 1 ∓ :data:`OPEN_SPAN`. The result is the pooled maximizer over
that range (the range's end where the unconstrained maximizer lies beyond it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednorm.engine.errors import ProtocolError
from fednorm.protocols.normalizers import yeo_johnson
from fednorm.protocols.ppf.zscore import MAX_ABS_VALUE

LAMBDA_SPAN = 20.0
"""λ is searched within 1 ± this where the data have both signs (and within the range
V_abs allows)..."""

OPEN_SPAN = 1e4
"""...and within 1 ∓ this on the side no value constrains (λ → −∞ keeps yj(x, λ) of
non-negative x within [0, 1/|λ|]; scikit-learn reaches λ ≈ −280 on BCW)."""

MAX_TRANSFORMED = MAX_ABS_VALUE
"""|yj(x, λ)| the PPF z-score of the transformed data accepts."""

CONSTANT_RTOL = 1e-6
CONSTANT_ATOL = 1e-9
BLOCK_ROWS = 4096  # a party transforms its rows in blocks of this many


def _phi(a: np.ndarray) -> np.ndarray:
    """(a·eᵃ − expm1 a)/a², by its series Σ (k+1)·aᵏ/(k+2)! near 0 (no cancellation)."""
    a = np.asarray(a, dtype=np.float64)
    small = np.abs(a) < 0.25
    safe = np.where(small, 1.0, a)
    with np.errstate(over="ignore", invalid="ignore"):
        closed = (safe * np.exp(safe) - np.expm1(safe)) / safe**2
    series = np.zeros_like(a)
    term = np.full_like(a, 0.5)  # k = 0: 1/2!
    for k in range(18):
        series = series + term
        term = term * a * (k + 2) / ((k + 1) * (k + 3))
    return np.where(small, series, closed)


def yeo_johnson_derivative(x: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """∂yj(x, λ)/∂λ, stable near λ = 0 and λ = 2: L²·φ(λL) above 0, L²·φ((2−λ)L) below."""
    x = np.asarray(x, dtype=np.float64)
    lam = np.asarray(lambdas, dtype=np.float64)
    log_abs = np.log1p(np.abs(x))
    exponent = np.where(x >= 0, lam, 2 - lam) * log_abs
    return log_abs**2 * _phi(exponent)


@dataclass(frozen=True)
class SignFlags:
    """Per feature, whether the pooled data hold no value, a negative one, a positive one
    (decrypted products of the parties' 0/1 flags; public from then on)."""

    empty: np.ndarray
    negative: np.ndarray
    positive: np.ndarray

    @classmethod
    def local(cls, X: np.ndarray) -> SignFlags:
        """This party's flags (NaN compares false, so it counts as neither sign)."""
        return cls(np.all(np.isnan(X), axis=0), np.any(X < 0, axis=0), np.any(X > 0, axis=0))

    def absent(self) -> np.ndarray:
        """What a party encrypts: 1 where its data *lack* each property, in three groups
        (no values, no negative, no positive); the product over the parties is 1 iff the
        pooled data lack it."""
        return np.concatenate([self.empty, ~self.negative, ~self.positive]).astype(np.float64)

    @classmethod
    def from_absent(cls, product: np.ndarray) -> SignFlags:
        empty, no_negative, no_positive = np.split(np.asarray(product) > 0.5, 3)
        return cls(empty, ~no_negative, ~no_positive)

    def interval(self, vabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lower, upper] holding every pooled value: one-sided where the data are; the
        whole [−V_abs, V_abs] for features of zeros or of no values (D = 0 there)."""
        degenerate = ~self.negative & ~self.positive
        lower = np.where(self.negative | degenerate, -vabs, 0.0)
        upper = np.where(self.positive | degenerate, vabs, 0.0)
        return lower, upper

    def check_local(self, mine: SignFlags) -> None:
        """A party refuses flags its own data contradict (they bound t)."""
        if (np.any(mine.negative & ~self.negative) or np.any(mine.positive & ~self.positive)
                or np.any(~mine.empty & self.empty)):
            raise ProtocolError("the server's sign flags contradict this party's data")


@dataclass(frozen=True)
class ProbeScaling:
    """Per (feature, probe): the shifts and factors mapping ψ, ψ', s so that t = D/K."""

    shift: np.ndarray
    factor: np.ndarray
    derivative_shift: np.ndarray
    derivative_factor: np.ndarray

    @classmethod
    def for_probes(cls, lambdas: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                   vabs: np.ndarray) -> ProbeScaling:
        """``lambdas`` (features, probes); per feature the value interval and V_abs."""
        top = yeo_johnson_at(upper, lambdas)
        bottom = yeo_johnson_at(lower, lambdas)
        shift, half = (top + bottom) / 2, (top - bottom) / 2
        d_half = np.maximum(yeo_johnson_derivative(upper[:, None], lambdas),
                            yeo_johnson_derivative(lower[:, None], lambdas)) / 2
        b_s = np.log1p(vabs)[:, None]
        factor = np.sqrt(b_s / (b_s * half**2 + half * d_half))
        return cls(shift, factor, d_half, factor / b_s)


def yeo_johnson_at(x: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """yj(x_j, λ_jk) for one value per feature and (features, probes) λ's."""
    values = np.broadcast_to(x[:, None], lambdas.shape).ravel()
    return yeo_johnson(values[None, :], lambdas.ravel())[0].reshape(lambdas.shape)


def lambda_range(vabs: np.ndarray, flags: SignFlags | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The λ range per feature: within 1 ± LAMBDA_SPAN, and |yj(x, λ)| ≤ 2^40 for every x
    in the interval :meth:`SignFlags.interval` allows (all of [−V_abs, V_abs] without flags).

    yj(v, λ) grows with λ for v > 0 and yj(−v, λ) = −yj(v, 2 − λ), so positive values
    cap λ at λ_max (the largest λ with yj(V_abs, λ) ≤ 2^40) and negative values floor it
    at 2 − λ_max.
    """
    log_v = np.log1p(vabs)
    log_cap = math.log(MAX_TRANSFORMED)
    low, high = np.ones_like(vabs), np.full_like(vabs, 1 + LAMBDA_SPAN)
    fits = _log_yeo_johnson_top(log_v, high) <= log_cap
    for _ in range(80):  # bisection on a monotone function, to 2^-80 of the span
        mid = (low + high) / 2
        ok = _log_yeo_johnson_top(log_v, mid) <= log_cap
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    top = np.where(fits, 1 + LAMBDA_SPAN, low)
    if flags is None:
        return 2 - top, top
    lower, upper = flags.interval(vabs)
    return (np.where(lower < 0, 2 - top, 1 - OPEN_SPAN),
            np.where(upper > 0, top, 1 + OPEN_SPAN))


def _log_yeo_johnson_top(log_v: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log yj(v, λ) for λ ≥ 1, v > 0, without overflow: log(expm1(λL)/λ)."""
    a = lam * log_v
    return np.where(a > 30, a, np.log(np.expm1(np.minimum(a, 30)))) - np.log(lam)




def plain_t(column: np.ndarray, lambdas: np.ndarray, vabs: float) -> np.ndarray:
    """t = D/K for one feature's pooled (non-NaN) values at each λ, in float64: what the
    encrypted path computes (for tests and precision measurements)."""
    flags = SignFlags.local(column[:, None])
    lower, upper = flags.interval(np.array([vabs]))
    moments = scaled_sums(column[:, None], lambdas[None, :], lower, upper, np.array([vabs]))
    n = len(column)
    mean_a, mean_q, mean_r, mean_g = (m[0] / n for m in moments)
    s_mean = np.sum(np.sign(column) * np.log1p(np.abs(column))) / np.log1p(vabs) / n
    return s_mean * (mean_q - mean_a**2) - (mean_r - mean_a * mean_g)


def scaled_sums(X: np.ndarray, lambdas: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                vabs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' per (feature, probe) over the present values of X."""
    scaling = ProbeScaling.for_probes(lambdas, lower, upper, vabs)
    shape = lambdas.shape
    sums = [np.zeros(shape) for _ in range(4)]
    for j in range(X.shape[1]):
        column = X[:, j][~np.isnan(X[:, j])]
        for start in range(0, len(column), BLOCK_ROWS):
            x = column[start:start + BLOCK_ROWS, None]
            lam = lambdas[j][None, :]
            psi = (yeo_johnson(np.broadcast_to(x, (len(x), shape[1])), lam[0])
                   - scaling.shift[j]) * scaling.factor[j]
            dpsi = ((yeo_johnson_derivative(x, lam) - scaling.derivative_shift[j])
                    * scaling.derivative_factor[j])
            for total, value in zip(sums, (psi, psi**2, psi * dpsi, dpsi), strict=True):
                total[j] += value.sum(axis=0)
    return sums[0], sums[1], sums[2], sums[3]



def constant_features(mean: np.ndarray, var: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """Features whose transformed variance is zero within the PPF z-score's precision."""
    return ~empty & (var <= (CONSTANT_RTOL * mean) ** 2 + CONSTANT_ATOL**2)


def conventions(lambdas: np.ndarray, mean: np.ndarray, var: np.ndarray, empty: np.ndarray,
                values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plain protocol's conventions on the revealed z-score: λ = 1, the value and
    variance 0 for constant features (``values``: their pooled mean of x); λ = 1 and NaN
    for empty ones."""
    constant = constant_features(mean, var, empty)
    lambdas = np.where(constant | empty, 1.0, lambdas)
    mean = np.where(empty, np.nan, np.where(constant, values, mean))
    var = np.where(empty, np.nan, np.where(constant, 0.0, var))
    return lambdas, mean, var

