"""The benchmark cases of whole PPF protocols: one table.

A case is a registered PPF (``mhe``) method run with some :class:`FitOptions` fields,
with its display name, the paper's Table V seconds, our target, and the case it is
compared with side by side (a default algorithm beside its ``--algorithm paper``
counterpart: the "× faster than ``--algorithm paper``" column is the ratio of their
medians measured in the same run). The totals (Table V), the totals vs P, the precision
section (Table VI), the communication section and the oracle all name runs by case.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednorm.bench.paper import (
    PAPER_TABLE_V_S,
    STRETCH_TABLE_V_S,
    TABLE_V_ROBUST_EPSILON,
    TARGET_ERRORS,
    TARGET_SPEEDUP,
    TARGET_TABLE_V_S,
)
from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions, get_protocol

NAN = math.nan


@dataclass(frozen=True)
class Case:
    """One benchmarked configuration of a PPF protocol."""

    name: str
    method: str  # the registered method (get_protocol(method, "mhe"))
    display: str
    options: Mapping[str, Any] = field(default_factory=dict)  # FitOptions fields
    versus: str | None = None  # the case it is compared with side by side
    paper_figure: bool = True  # the paper's Table V figure of the method applies

    @property
    def algorithm(self) -> str:
        return self.options.get("algorithm", "default")

    @property
    def protected(self) -> bool:
        """Whether every party floods and checks as outside a benchmark (the cases that
        turn either off measure what it costs)."""
        return bool(self.options.get("flood", True) and self.options.get("replay", True))

    @property
    def needs_vabs(self) -> bool:
        """Only the paper's MinMax, robust and Yeo-Johnson need the bound V_abs."""
        return self.algorithm == "paper" and self.method != "zscore"

    @property
    def paper_s(self) -> float:
        """The paper's Table V seconds for this method (z-score: with the hidden count)."""
        return PAPER_TABLE_V_S.get(self.method, NAN) if self.paper_figure else NAN

    @property
    def target_s(self) -> float:
        return TARGET_TABLE_V_S.get(self.name, NAN)

    @property
    def stretch_s(self) -> float:
        return STRETCH_TABLE_V_S.get(self.name, NAN)

    @property
    def speedup_target(self) -> float:
        """How many times faster than :attr:`versus` it should run (NaN: no target)."""
        return TARGET_SPEEDUP.get(self.name, NAN)

    @property
    def error_targets(self) -> dict[str, float]:
        """Relative error bound per statistic (0: equal to numpy's)."""
        return dict(TARGET_ERRORS.get(self.name, {}))

    def fit_options(self, X: np.ndarray | None, preset: str, **overrides: Any) -> FitOptions:
        """The case's options on pooled rows ``X`` (V_abs from them, paper cases only)."""
        from fednorm.bench.oracle import agreed_bound

        fields = {**self.options, **overrides}
        vabs = (agreed_bound(X) if X is not None else (1.0,)) if self.needs_vabs else None
        return FitOptions(preset=preset, vabs=vabs, **fields)


_E = {"epsilon": TABLE_V_ROBUST_EPSILON}
_PAPER = {"algorithm": "paper"}
_METHODS = (("zscore", "z-score", {}), ("minmax", "MinMax", {}),
            ("robust", f"robust, ε={TABLE_V_ROBUST_EPSILON:g}", _E),
            ("yeojohnson", "Yeo-Johnson", {}))
"""(method, label, options) of each protocol the protections are measured on."""
CASES: dict[str, Case] = {c.name: c for c in (
    Case("zscore", "zscore", "PPF z-score", versus="zscore_paper"),
    Case("zscore_paper", "zscore", "PPF z-score, paper (hidden count)", _PAPER),
    Case("zscore_paper_reveal", "zscore", "PPF z-score, paper, reveal_counts",
         {**_PAPER, "reveal_counts": True}, paper_figure=False),
    Case("minmax", "minmax", "PPF MinMax", versus="minmax_paper"),
    Case("minmax_paper", "minmax", "PPF MinMax, paper", _PAPER),
    Case("robust", "robust", f"PPF robust, ε={TABLE_V_ROBUST_EPSILON:g}", _E,
         versus="robust_paper"),
    Case("robust_exact", "robust", "PPF robust, exact", versus="robust_paper"),
    Case("robust_paper", "robust", f"PPF robust, paper, ε={TABLE_V_ROBUST_EPSILON:g}",
         {**_PAPER, **_E}),
    Case("yeojohnson", "yeojohnson", "PPF Yeo-Johnson", versus="yeojohnson_paper"),
    Case("yeojohnson_paper", "yeojohnson", "PPF Yeo-Johnson, paper", _PAPER),
    *(Case(f"{method}_paper_on_trust", method,
           f"PPF {label}, paper, parties on trust (`--no-replay`)",
           {**_PAPER, **extra, "replay": False}, versus=f"{method}_paper", paper_figure=False)
      for method, label, extra in _METHODS),
    *(Case(f"{method}_unflooded", method, f"PPF {label}, flooding off",
           {**extra, "flood": False}, versus=method, paper_figure=False)
      for method, label, extra in _METHODS),
    *(Case(f"{method}_paper_unprotected", method,
           f"PPF {label}, paper, flooding off and parties on trust",
           {**_PAPER, **extra, "replay": False, "flood": False}, versus=f"{method}_paper",
           paper_figure=False)
      for method, label, extra in _METHODS),
)}
"""Every case, in the order the totals run and show them.  The rest measure what the
protections against a deviating server cost, each beside the same protocol with them in
the same run: the ``_on_trust`` cases are the paper's algorithms with every party taking
the server's steps on trust (``FitOptions.replay`` off: the cost of the parties' request
checks, docs/LEAKAGE.md); ``_unflooded``, a default protocol whose parties do not flood
their shares (``FitOptions.flood`` off; its other checks are the wire itself: relayed
signed uploads, the joint key's aggregate); ``_paper_unprotected``, the paper's with both
off."""

OTHER_NAMES = {"kth": "PPF k-th (median)"}
"""Runs named outside :data:`CASES` (the k-th search of the ε sweep)."""


def display_name(name: str) -> str:
    return CASES[name].display if name in CASES else OTHER_NAMES.get(name, name)


def base_method(name: str) -> str:
    """The registered method behind a case name (other names are methods already)."""
    return CASES[name].method if name in CASES else name


def check_cases(names: Iterable[str]) -> None:
    strange = sorted(set(names) - set(CASES))
    if strange:
        raise InputError(f"unknown benchmark cases {strange}; choose from {list(CASES)}")


def with_counterparts(names: Iterable[str]) -> list[str]:
    """``names`` and the case each is compared with, in :data:`CASES` order."""
    wanted = set(names)
    check_cases(wanted)
    wanted |= {CASES[n].versus for n in wanted if CASES[n].versus}
    return [n for n in CASES if n in wanted]


# -- which cases this tree can run -----------------------------------------------------
def refusal(name: str) -> str | None:
    """Why case ``name`` cannot run in this tree (its method is not registered under
    mhe), or None if it can: every registered PPF method has both algorithms."""
    case = CASES[name]
    try:
        get_protocol(case.method, "mhe")
    except InputError:
        return f"`get_protocol({case.method!r}, 'mhe')` is not registered in this tree"
    return None


def available(name: str) -> bool:
    return refusal(name) is None
