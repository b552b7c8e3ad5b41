"""The λ search of PPF Yeo-Johnson: its public plan, its slot layout, and the server's
sans-IO multi-probe bisection.

**Probes and rounds.** Up to 255 probes per feature fit a slot block (fewer for many
features), so each round shrinks the bracket 256-fold and 3 rounds reach
:data:`TOLERANCE` for up to 10 features (BCW's 30: 3 at the paper preset, 4 at the test
preset). Decrypted per probe is p(t), the composite sign: ±1 to within 1e-6 for
|t| ≥ 4.9e-6 with the default 8 + 2 stages, and a value increasing with t below that
(see the ledger, docs/LEAKAGE.md). The split kept is the one that best fits "+ then −"
weighted by |p|, so probes whose sign drowns in noise barely count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednorm.engine.ckks.compare import ComparePlan
from fednorm.engine.errors import InputError
from fednorm.protocols.base import FitOptions
from fednorm.protocols.ppf.checks import BlockLayout, compare_plan, vabs_vector
from fednorm.protocols.ppf.yeojohnson_math import SignFlags, lambda_range, scaled_sums

PROBES = 255
"""λ's probed per feature and round (fewer when features × probes exceed a slot block)."""

TOLERANCE = 1e-5
"""Final bracket width in asinh(λ) units: λ to about 1e-5·max(1, |λ|)."""

DEFAULT_SIGN_BITS = 20
"""Precision of the composite sign (``FitOptions.yeojohnson_sign_bits`` overrides it)."""

BLOCKS = 4  # Σψ̃, Σψ̃², Σψ̃ψ̃', Σψ̃' side by side in one ciphertext


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
    """The composite sign of the search, at ``FitOptions.yeojohnson_sign_bits``."""
    return compare_plan(options.yeojohnson_sign_bits, DEFAULT_SIGN_BITS,
                        "yeojohnson_sign_bits")


@dataclass(frozen=True)
class Layout(BlockLayout):
    """Slot k·width + j holds (feature j, probe k); four blocks of slots/4 each."""

    probes: int

    @property
    def blocks(self) -> int:
        return BLOCKS

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
        row = np.tile(per_feature, self.probes)
        return self.placed(dict.fromkeys(range(blocks), row), self.block * blocks)

    def packed(self, parts: list[np.ndarray]) -> np.ndarray:
        """Four (features, probes) arrays, one per block."""
        vectors = {b: self.probe_vector(part) for b, part in enumerate(parts)}
        return self.placed(vectors, self.block * len(parts))

    def padding(self, empty: np.ndarray) -> np.ndarray:
        """1 where a count is absent or 0 (unused slots, empty features): keeps the
        inverse within [1, max_count] everywhere."""
        used = self.tiled(np.where(empty, 1.0, 0.0))
        mask = self.tiled(np.ones(self.width)) > 0
        return np.where(mask, used, 1.0)

    def mask(self) -> np.ndarray:
        return self.first(self.used)


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

