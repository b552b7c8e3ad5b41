"""The protocol runs the ledger and pinned-wire tests share: every protocol, plain and
PPF, on a fixed input, with what its decryptions reveal (tests/test_ledger.py checks the
declared ledger against their wire, tests/test_pinned_wire.py pins their frames)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fednorm.engine import ckks
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import shared_context
from fednorm.protocols.ppf import extremes
from fednorm.protocols.ppf import yeojohnson_math as yj_math
from fednorm.protocols.ppf import yeojohnson_search as yj_search

TEST = FitOptions(preset="test")
PAPER = FitOptions(preset="test", algorithm="paper")
CHEAP_MINMAX = {"minmax_bits": 4, "minmax_passes": 2}  # 2 stages per comparison: fast, coarse


@dataclass(frozen=True)
class Case:
    """One protocol run over the recording transport, and what its decryptions reveal:
    the widths (values) of each decryption in order, or only how many (``None`` widths)."""

    method: str
    privacy: str
    options: FitOptions
    parts: tuple[np.ndarray, ...]
    widths: Callable[[np.ndarray], list[int]] | None = None
    decryptions: int | None = None

    def __str__(self) -> str:
        reveal = "-reveal" if self.options.reveal_counts else ""
        paper = "-paper" if self.privacy == "mhe" and self.options.algorithm == "paper" else ""
        return f"{self.method}-{self.privacy}{reveal}{paper}"

    @property
    def algorithm(self) -> str:
        """The ledger entry's algorithm (plain protocols have one kind: "default")."""
        return self.options.algorithm if self.privacy == "mhe" else "default"


def normal_parts(rows: int = 7, features: int = 2) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(3)
    return tuple(rng.normal(1, 2, size=(n, features)) for n in (rows, rows - 2, rows + 2))


def _yeojohnson_widths(pooled: np.ndarray) -> list[int]:
    # The sign flags (3 per feature); one sign vector per search round; the z-score's four
    # passes of the transformed data.
    plan = yeojohnson_plan(pooled, YJ_VABS)
    width = pooled.shape[1]
    return [3 * width] + [plan.layout.used] * plan.rounds + [width] * 4


def _extremes_widths(pooled: np.ndarray) -> list[int]:
    # Every bracket's thresholds of a round in one masked sum, until each holds one float.
    layout = extremes.Layout(pooled.shape[1], shared_context("test").preset.ring_dim)
    rounds = extremes.Brackets.start(layout.brackets).rounds_left(layout.count)
    return [layout.brackets * layout.count] * rounds


YJ_VABS = (32.0,)
CASES = [
    Case("zscore", "plain", TEST, normal_parts()),
    Case("minmax", "plain", TEST, normal_parts()),
    Case("robust", "plain", FitOptions(preset="test", epsilon=1e-2), normal_parts()),
    Case("yeojohnson", "plain", TEST, normal_parts()),
    # The default: n_g beside Σx, then Σ(x − μ̃)², then both again at per-feature scales.
    Case("zscore", "mhe", TEST, normal_parts(12, 3), widths=lambda pooled: [9, 6]),
    # n_g, then a search from the whole float order: exact, so 64 bits over rounds.
    Case("robust", "mhe", TEST, normal_parts()),
    Case("minmax", "mhe", TEST, normal_parts(6, 3), widths=_extremes_widths),
    # The extremes' rounds, the summary, then one pooled sum per λ round.
    Case("yeojohnson", "mhe", TEST, normal_parts()),
    # The paper's: the presence bit (or n_g), then μ and σ², each a coarse and a precise pass.
    Case("zscore", "mhe", PAPER, normal_parts(12, 3), widths=lambda pooled: [3] * 5),
    Case("zscore", "mhe", FitOptions(preset="test", algorithm="paper", reveal_counts=True),
         normal_parts(12, 3), widths=lambda pooled: [3] * 5),
    Case("minmax", "mhe", FitOptions(preset="test", algorithm="paper", vabs=(20.0,),
                                     **CHEAP_MINMAX),
         normal_parts(6, 3), decryptions=CHEAP_MINMAX["minmax_passes"]),  # one per pass
    Case("robust", "mhe", FitOptions(preset="test", algorithm="paper", vabs=(16.0,),
                                     epsilon=1e-2, **CHEAP_MINMAX), normal_parts()),
    Case("yeojohnson", "mhe", FitOptions(preset="test", algorithm="paper", vabs=YJ_VABS),
         tuple(np.random.default_rng(5).gamma(2, 3, size=(8, 2)) - 1 for _ in range(3)),
         widths=_yeojohnson_widths),
]


def yeojohnson_plan(pooled: np.ndarray, vabs: tuple[float, ...], preset: str = "test"
                    ) -> yj_search.SearchPlan:
    """The paper's Yeo-Johnson search plan for ``pooled`` (its rounds and slot layout),
    as every party derives it from the public options and the sign flags."""
    return yj_search.SearchPlan.build(FitOptions(algorithm="paper",
                                                 vabs=vabs, preset=preset), pooled.shape[1],
                                ckks.get_preset(preset).slots, yj_math.SignFlags.local(pooled))
