"""PPF Yeo-Johnson: the pooled maximum-likelihood λ under multiparty CKKS, revealing per
round only the sign of the log-likelihood's derivative at the probed λ's.

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
   :data:`PROBES` λ's per feature, evenly inside each feature's bracket; every party
   encrypts Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' in four slot blocks of one ciphertext; the server adds
   them, multiplies by the inverse (one ciphertext for all four means), aligns the blocks
   by rotation, forms ⟨t⟩ per (feature, probe), evaluates the composite sign polynomial
   of :mod:`~fednorm.engine.ckks.compare`, and the parties decrypt *only that*. The
   bracket shrinks to the cell where the signs change (PROBES + 1 cells per round), for a
   fixed number of rounds (:func:`search_rounds`).
4. The λ's are broadcast; the PPF z-score of the transformed data runs on the same keys
   and the same encrypted inverse (its two passes, as :mod:`ppf_zscore`).

**λ range.** Where the pooled data hold positive values, λ ≤ λ_max, the largest
λ ≤ 1 + :data:`LAMBDA_SPAN` with yj(V_abs, λ) ≤ 2^40 (the transformed data must fit the
PPF z-score's range); where they hold negative values, λ ≥ 2 − λ_max; a side no value
constrains is open to 1 ∓ :data:`OPEN_SPAN`. The result is the pooled maximizer over
that range (the range's end where the unconstrained maximizer lies beyond it).

**Probes and rounds.** Up to 255 probes per feature fit a slot block (fewer for many
features), so each round shrinks the bracket 256-fold and 3 rounds reach
:data:`TOLERANCE` for up to 10 features (BCW's 30: 3 at the paper preset, 4 at the test
preset). Decrypted per probe is p(t), the composite sign: ±1 to within 1e-6 for
|t| ≥ 4.9e-6 with the default 8 + 2 stages, and a value increasing with t below that
(see the ledger, docs/LEAKAGE.md). The split kept is the one that best fits "+ then −"
weighted by |p|, so probes whose sign drowns in noise barely count.

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

**Cost.** Per round one collective bootstrap of the four means, the sign's refreshes
(5 at the paper preset, 9 at the test preset, with 8 + 2 stages) and one decryption;
before the rounds, the count inverse (2 bootstraps at the paper preset, 4 at the test
preset) and ⟨E[s̃]⟩ (1). Collective bootstraps dominate both time and bytes.

**Conventions** (as :mod:`yeojohnson`). A feature without values gets λ = 1 and NaN mean
and variance. A feature whose transformed pooled variance comes out below
(:data:`CONSTANT_RTOL`·mean)² + :data:`CONSTANT_ATOL`² is constant: λ = 1, mean = its
value, variance 0. Its λ search saw t = 0 (noise signs), so the λ its z-score used is
arbitrary and yj(x, λ) may have saturated there; its value is therefore computed afresh,
as the pooled mean of x (one more two-pass quotient, only when some feature is
constant: the value is in the result anyway).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.ckks.compare import ComparePlan, step
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    agreed_width,
    check_party_data,
    feature_counts,
    register,
    require_within_vabs,
)
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    serve_until,
    setup_party,
    setup_server,
)
from fednorm.protocols.normalizers import YeoJohnsonNormalizer, yeo_johnson
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.protocols.ppf.minmax import vabs_vector

PROBES = 255
"""λ's probed per feature and round (fewer when features × probes exceed a slot block)."""

TOLERANCE = 1e-5
"""Final bracket width in asinh(λ) units: λ to about 1e-5·max(1, |λ|)."""

LAMBDA_SPAN = 20.0
"""λ is searched within 1 ± this where the data have both signs (and within the range
V_abs allows)..."""

OPEN_SPAN = 1e4
"""...and within 1 ∓ this on the side no value constrains (λ → −∞ keeps yj(x, λ) of
non-negative x within [0, 1/|λ|]; scikit-learn reaches λ ≈ −280 on BCW)."""

MAX_TRANSFORMED = ppf_zscore.MAX_ABS_VALUE
"""|yj(x, λ)| the PPF z-score of the transformed data accepts."""

DEFAULT_SIGN_BITS = 20
"""Precision of the composite sign (``FitOptions.yeojohnson_sign_bits`` overrides it)."""

CONSTANT_RTOL = 1e-6
CONSTANT_ATOL = 1e-9
BLOCKS = 4  # Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' side by side in one ciphertext
BLOCK_ROWS = 4096


# -- messages ---------------------------------------------------------------------------
@message("ppf_yeojohnson.start")
class EncryptedStart(Message):
    """A party's counts (tiled over the probe layout), Σ s̃ and its "absent" flags
    (:meth:`SignFlags.absent`)."""

    counts: openfhe.Ciphertext
    log_sums: openfhe.Ciphertext
    absent: openfhe.Ciphertext
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
    """Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' per (feature, probe), one slot block each."""

    values: openfhe.Ciphertext


@message("ppf_yeojohnson.lambdas")
class Lambdas(Message):
    lambdas: np.ndarray


@message("ppf_yeojohnson.result")
class PpfYeoJohnsonResult(Message):
    lambdas: np.ndarray
    mean: np.ndarray
    var: np.ndarray


# -- the math both sides share ----------------------------------------------------------
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


def probe_count(width: int, slots: int) -> int:
    """Probes per feature that fit a slot block beside the other features."""
    per_block = slots // BLOCKS
    if width > per_block:
        raise InputError(f"PPF Yeo-Johnson supports at most {per_block} features at this "
                         f"preset, got {width}")
    return max(1, min(PROBES, per_block // width))


def search_rounds(widths: np.ndarray, probes: int, tolerance: float = TOLERANCE) -> int:
    """Rounds until every bracket (asinh units) is at most ``tolerance`` wide: each
    round keeps one of probes + 1 cells."""
    widest = float(np.max(widths, initial=0.0))
    if widest <= tolerance:
        return 1
    return max(1, math.ceil(math.log(widest / tolerance) / math.log(probes + 1)))


def sign_plan(options: FitOptions) -> ComparePlan:
    bits = options.yeojohnson_sign_bits
    bits = DEFAULT_SIGN_BITS if bits is None else bits
    if not isinstance(bits, (int, float)) or isinstance(bits, bool):
        raise InputError(f"yeojohnson_sign_bits must be a number, got {bits!r}")
    return ckks.plan_compare(float(bits))


@dataclass(frozen=True)
class Layout:
    """Slot k·width + j holds (feature j, probe k); four blocks of slots/4 each."""

    slots: int
    width: int
    probes: int

    @property
    def block(self) -> int:
        return self.slots // BLOCKS

    @property
    def used(self) -> int:
        return self.width * self.probes

    def probe_vector(self, values: np.ndarray) -> np.ndarray:
        """(features, probes) → the block-0 slot vector."""
        return np.asarray(values, dtype=np.float64).T.ravel()

    def from_slots(self, slots: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`probe_vector`: (features, probes)."""
        return slots[:self.used].reshape(self.probes, self.width).T

    def tiled(self, per_feature: np.ndarray, blocks: int = BLOCKS) -> np.ndarray:
        """``per_feature`` repeated for every probe, in each of the first ``blocks``."""
        out = np.zeros(self.block * blocks)
        row = np.tile(per_feature, self.probes)
        for b in range(blocks):
            out[b * self.block:b * self.block + self.used] = row
        return out

    def packed(self, parts: list[np.ndarray]) -> np.ndarray:
        """Four (features, probes) arrays, one per block."""
        out = np.zeros(self.block * len(parts))
        for b, part in enumerate(parts):
            out[b * self.block:b * self.block + self.used] = self.probe_vector(part)
        return out

    def padding(self, empty: np.ndarray) -> np.ndarray:
        """1 where a count is absent or 0 (unused slots, empty features): keeps the
        inverse within [1, max_count] everywhere."""
        used = self.tiled(np.where(empty, 1.0, 0.0))
        mask = self.tiled(np.ones(self.width)) > 0
        return np.where(mask, used, 1.0)

    def mask(self) -> np.ndarray:
        return (np.arange(self.slots) < self.used).astype(np.float64)


@dataclass(frozen=True)
class SearchPlan:
    """Everything both sides derive from public inputs: bounds, λ ranges, probes, rounds."""

    vabs: np.ndarray
    lower: np.ndarray  # the interval every pooled value lies in
    upper: np.ndarray
    low: np.ndarray  # the λ range
    high: np.ndarray
    layout: Layout
    rounds: int

    @classmethod
    def build(cls, options: FitOptions, width: int, slots: int, flags: SignFlags
              ) -> SearchPlan:
        vabs = vabs_vector(options, width)
        low, high = lambda_range(vabs, flags)
        probes = probe_count(width, slots)
        widths = np.arcsinh(high) - np.arcsinh(low)
        return cls(vabs, *flags.interval(vabs), low, high, Layout(slots, width, probes),
                   search_rounds(widths, probes))

    def scaled_sums(self, X: np.ndarray, lambdas: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return scaled_sums(X, lambdas, self.lower, self.upper, self.vabs)


class SignBisection:
    """Server-side state of the multi-probe bisection (sans-IO).

    ``probe()`` gives (features, probes) λ's evenly inside each bracket (asinh units);
    ``update(soft)`` takes the decrypted sign approximations p ∈ [−1, 1] and keeps the
    cell between probes m−1 and m, m maximizing Σ_{k<m} p_k − Σ_{k≥m} p_k: the split
    that best fits "+ left of the maximizer, − right of it". Probes whose sign is buried
    in noise (|p| small, near the maximizer) barely weigh.
    """

    def __init__(self, plan: SearchPlan, searched: np.ndarray) -> None:
        self.plan = plan
        self.searched = searched
        self.lo = np.arcsinh(plan.low)
        self.hi = np.arcsinh(plan.high)
        self.rounds = 0
        self._points: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        return self.rounds >= self.plan.rounds

    def probe(self) -> np.ndarray:
        k = self.plan.layout.probes
        steps = np.arange(1, k + 1) / (k + 1)
        self._points = self.lo[:, None] + (self.hi - self.lo)[:, None] * steps
        return np.where(self.searched[:, None], np.sinh(self._points), 1.0)

    def update(self, soft: np.ndarray) -> None:
        if self._points is None:
            raise RuntimeError("update() before probe()")
        points, self._points = self._points, None
        soft = np.clip(np.nan_to_num(soft), -1.0, 1.0)
        before = np.concatenate([np.zeros((len(soft), 1)), np.cumsum(soft, axis=1)], axis=1)
        split = np.argmax(2 * before - before[:, -1:], axis=1)
        rows = np.arange(len(soft))
        edges = np.concatenate([self.lo[:, None], points, self.hi[:, None]], axis=1)
        self.lo, self.hi = edges[rows, split], edges[rows, split + 1]
        self.rounds += 1

    @property
    def lambdas(self) -> np.ndarray:
        return np.where(self.searched, np.sinh((self.lo + self.hi) / 2), 1.0)


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


def check_ppf_yeojohnson_input(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption: no V_abs, data beyond it, too many values/features."""
    X = check_party_data(X)
    vabs = vabs_vector(options, X.shape[1])
    if np.any(vabs > MAX_TRANSFORMED):
        raise InputError(f"PPF Yeo-Johnson supports vabs up to 2^40 ({MAX_TRANSFORMED:.3g})")
    require_within_vabs(X, vabs)
    if feature_counts(X).max(initial=0) > options.max_count:
        raise InputError(f"a party holds more than max_count={options.max_count} values")
    probe_count(X.shape[1], ckks.get_preset(options.preset).slots)
    sign_plan(options)
    return X


def setup_arguments(options: FitOptions) -> dict[str, object]:
    return {"relinearize": True, "rotations": (ckks.get_preset(options.preset).slots // BLOCKS,)}


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


# -- server ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Inverse:
    """⟨max_count/n⟩ from Goldschmidt and its Newton correction ⟨2 − n·inverse/max_count⟩:
    their product squares the inverse's relative error (measured: ~2e-7 → ~1e-12 on a
    quotient, ~4e-10 on the refined inverse itself)."""

    scaled: openfhe.Ciphertext
    correction: openfhe.Ciphertext


@dataclass(frozen=True)
class _Pooled:
    """The server's encrypted pooled quantities that every round reuses."""

    inverse: _Inverse
    log_mean: openfhe.Ciphertext  # E[s̃] in block 0, zero elsewhere (masked)


async def server(rc: RoleContext, options: FitOptions) -> YeoJohnsonNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    start = await rc.gather(EncryptedStart)
    width = agreed_width(start)
    flags = await _sign_flags(crypto, start, width)
    await rc.broadcast(Flags(empty=flags.empty.astype(np.float64),
                             negative=flags.negative.astype(np.float64),
                             positive=flags.positive.astype(np.float64)))
    plan = SearchPlan.build(options, width, crypto.ckks.slots, flags)
    pooled = await _pool(crypto, start, plan, flags.empty, options)

    search = SignBisection(plan, ~flags.empty)
    sign = sign_plan(options)
    while not search.finished:
        await rc.broadcast(Probes(lambdas=search.probe()))
        replies = await rc.gather(EncryptedMoments)
        moments = await crypto.add_all({p: m.values for p, m in replies.items()})
        search.update(await _soft_signs(crypto, moments, pooled, plan, sign, options))
    lambdas = search.lambdas
    await rc.broadcast(Lambdas(lambdas=lambdas))

    mean, var = await _zscore_server(crypto, pooled, width, options)
    await rc.broadcast(ppf_zscore.PpfZScoreResult(mean=mean, var=var))
    values = await _constant_values(crypto, pooled, constant_features(mean, var, flags.empty),
                                    options)
    lambdas, mean, var = conventions(lambdas, mean, var, flags.empty, values)
    await rc.broadcast(PpfYeoJohnsonResult(lambdas=lambdas, mean=mean, var=var))
    return YeoJohnsonNormalizer(lambdas, mean, var)


async def _sign_flags(crypto: ServerCrypto, start: dict[int, EncryptedStart],
                     width: int) -> SignFlags:
    """Multiply the parties' 0/1 "absent" flags (a product tree) and decrypt the product:
    1 iff no party has a value / a negative / a positive value."""
    for party, msg in start.items():
        crypto.check_joint(msg.absent, f"ciphertext from party {party}")
    level = [m.absent for m in start.values()]
    context = crypto.ckks
    while len(level) > 1:
        level = [await ckks.ensure_levels(context, ct, 1, crypto.bootstrap) for ct in level]
        pairs = [await crypto.rc.run_sync(context.mul, level[i], level[i + 1])
                 for i in range(0, len(level) - 1, 2)]
        level = pairs + level[len(level) - len(level) % 2:]
    return SignFlags.from_absent(await crypto.decrypt(level[0], 3 * width))


async def _pool(crypto: ServerCrypto, start: dict[int, EncryptedStart], plan: SearchPlan,
                empty: np.ndarray, options: FitOptions) -> _Pooled:
    """⟨max_count/n⟩ (refined) and ⟨E[s̃]⟩, masked to the probe slots."""
    context, rc = crypto.ckks, crypto.rc
    count = await crypto.add_all({p: m.counts for p, m in start.items()})
    logs = await crypto.add_all({p: m.log_sums for p, m in start.items()})
    hi = float(options.max_count)
    padded = await rc.run_sync(context.add, count, plan.layout.padding(empty))
    scaled = await ckks.inverse(context, padded, 1.0, hi, crypto.bootstrap,
                                out_scale=hi, keep_levels=3)
    # n ⊙ inverse before 1/max_count: scaling n down first leaves ~1e-6 of noise.
    correction = await rc.run_sync(
        lambda: context.negate(
            context.sub(context.mul(context.mul(padded, scaled), 1.0 / hi), 2.0)))
    inverse = _Inverse(scaled, correction)
    log_mean = await _mean_of(crypto, inverse, logs, options)
    return _Pooled(inverse, await rc.run_sync(context.mul, log_mean, plan.layout.mask()))


async def _mean_of(crypto: ServerCrypto, inverse: _Inverse, sums: openfhe.Ciphertext,
                   options: FitOptions) -> openfhe.Ciphertext:
    """⟨Σ/n⟩ = ((Σ ⊙ max_count/n) / max_count) ⊙ correction, collectively refreshed.

    Measured (test preset, n in 1..2^20): relative error ~1e-12, against ~2e-7 without
    the correction."""
    context = crypto.ckks

    def quotient() -> openfhe.Ciphertext:
        raw = context.mul(context.mul(sums, inverse.scaled), 1.0 / options.max_count)
        return context.mul(raw, inverse.correction)

    mean = await crypto.rc.run_sync(quotient)
    return await crypto.bootstrap(mean)


async def _soft_signs(crypto: ServerCrypto, moments: openfhe.Ciphertext, pooled: _Pooled,
                      plan: SearchPlan, sign: ComparePlan, options: FitOptions) -> np.ndarray:
    """Decrypted ≈ sign(t) per (feature, probe), from the four pooled sums."""
    context, layout = crypto.ckks, plan.layout
    means = await _mean_of(crypto, pooled.inverse, moments, options)  # [ā | q̄ | r̄ | ḡ], fresh

    def form_t() -> openfhe.Ciphertext:
        q = context.rotate(means, layout.block)
        r = context.rotate(q, layout.block)
        g = context.rotate(r, layout.block)
        var = context.sub(q, context.square(means))
        cov = context.sub(r, context.mul(means, g))
        masked_cov = context.mul(cov, layout.mask())
        return context.sub(context.mul(pooled.log_mean, var), masked_cov)

    t = await crypto.rc.run_sync(form_t)
    h = await step(context, t, crypto.bootstrap, sign, end_level=context.level_budget)
    soft = 2 * await crypto.decrypt(h, layout.used) - 1
    return layout.from_slots(soft)


async def _zscore_server(crypto: ServerCrypto, pooled: _Pooled, width: int,
                         options: FitOptions) -> tuple[np.ndarray, np.ndarray]:
    """PPF z-score of the transformed data on this setup, with the refined inverse."""
    sums = await crypto.rc.gather(ppf_zscore.EncryptedVector)
    total = await crypto.add_all({p: m.values for p, m in sums.items()})
    return await ppf_zscore.pooled_moments(crypto, total, await _refined_inverse(crypto, pooled),
                                           width, options)


async def _constant_values(crypto: ServerCrypto, pooled: _Pooled, constant: np.ndarray,
                           options: FitOptions) -> np.ndarray:
    """The pooled mean of x for the constant features (their value, which the result
    holds anyway), by one more two-pass quotient; nothing when there are none. λ of a
    constant feature is arbitrary (t = 0), so yj(x, λ) may have saturated: its mean does
    not give x back."""
    if not constant.any():
        return np.zeros(len(constant))
    rc = crypto.rc
    sums = await rc.gather(ppf_zscore.EncryptedVector)
    total = await crypto.add_all({p: m.values for p, m in sums.items()})
    return await ppf_zscore.precise_quotient(crypto, total, await _refined_inverse(crypto, pooled),
                                             len(constant), options)


async def _refined_inverse(crypto: ServerCrypto, pooled: _Pooled) -> openfhe.Ciphertext:
    return await crypto.rc.run_sync(crypto.ckks.mul, pooled.inverse.scaled,
                                    pooled.inverse.correction)


# -- party ------------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    X = check_ppf_yeojohnson_input(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options))
    crypto.require_pooled_count_within(feature_counts(X), options.max_count)
    width = X.shape[1]
    mine = SignFlags.local(X)
    layout = Layout(crypto.ckks.slots, width, probe_count(width, crypto.ckks.slots))
    log_sums = np.nansum(np.sign(X) * np.log1p(np.abs(X)), axis=0)
    await rc.send(SERVER, EncryptedStart(
        counts=await crypto.encrypt(layout.tiled(feature_counts(X))),
        log_sums=await crypto.encrypt(
            layout.tiled(log_sums / np.log1p(vabs_vector(options, width)), blocks=1)),
        absent=await crypto.encrypt(mine.absent()),
        width=width))
    flags = _received_flags(await serve_until(crypto, Flags, decryptions=1), mine)
    plan = SearchPlan.build(options, width, crypto.ckks.slots, flags)
    decryptions, rounds = 0, 0  # none while the server pools, then one per round
    while isinstance(msg := await serve_until(crypto, (Probes, Lambdas),
                                              decryptions=decryptions), Probes):
        rounds += 1
        if rounds > plan.rounds:
            raise ProtocolError(f"the server's λ search exceeds {plan.rounds} rounds")
        sums = plan.scaled_sums(X, _checked_probes(msg.lambdas, plan))
        await rc.send(SERVER, EncryptedMoments(
            values=await crypto.encrypt(layout.packed(list(sums)))))
        decryptions = 1
    lambdas = as_float_vector(msg.lambdas, width, "Yeo-Johnson lambdas from the server")
    _check_in_range(lambdas, plan)
    await _zscore_party(crypto, yeo_johnson(X, lambdas), width)
    scaled = await serve_until(crypto, ppf_zscore.PpfZScoreResult, decryptions=1)
    constant = constant_features(as_float_vector(scaled.mean, width, "mean"),
                                 as_float_vector(scaled.var, width, "variance"), flags.empty)
    owed = 0
    if constant.any():  # the values of constant features, as the server needs them
        raw = np.where(constant, np.nansum(X, axis=0), 0.0)
        await rc.send(SERVER, ppf_zscore.EncryptedVector(values=await crypto.encrypt(raw)))
        await ppf_zscore.precise_quotient_party(crypto, raw, width)
        owed = 1
    result = await serve_until(crypto, PpfYeoJohnsonResult, decryptions=owed)
    return YeoJohnsonNormalizer(as_float_vector(result.lambdas, width, "lambdas"),
                                as_float_vector(result.mean, width, "mean"),
                                as_float_vector(result.var, width, "variance"))


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


async def _zscore_party(crypto: PartyCrypto, Y: np.ndarray, width: int) -> None:
    """Party side of the PPF z-score of the transformed data (:func:`ppf_zscore.party`
    without the count, which the server already holds)."""
    total = np.nansum(Y, axis=0)
    await crypto.rc.send(SERVER, ppf_zscore.EncryptedVector(
        values=await crypto.encrypt(total, ppf_zscore.numerator_level(crypto.ckks))))
    await ppf_zscore.share_moments(crypto, Y, total)


register("yeojohnson", "mhe", server, party)
