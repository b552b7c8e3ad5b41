"""Non-IID partitioners that turn one tabular dataset into a simulated federation.

Normalization only matters in federated learning because parties see different slices of
the data, so the simulator must reproduce the kinds of skew studied in NIID-Bench
(Li et al., "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022):

* ``iid``          -- a shuffled, near-equal split: the baseline with no skew;
* ``label:β``      -- Dirichlet label-distribution skew: each class is spread over the
  parties with proportions drawn from Dir(β); small β gives parties few classes;
* ``quantity:β``   -- Dirichlet quantity skew: party sizes drawn from Dir(β), labels IID;
* ``feature:σ``    -- noise-based feature skew: an IID split where party i of P adds
  Gaussian noise with standard deviation σ·i/P to every value, so parties disagree on
  feature scales, which is exactly what federated normalization has to reconcile.
  ``noise_scale`` gives the noise a unit per feature: the study passes each feature's
  standard deviation (σ then means "σ standard deviations", whatever the feature's
  units) and 0 for categorical columns, which get no noise; images scaled to [0, 1]
  get unit scale, so σ is in pixel units there, as in NIID-Bench.

Every party gets at least ``min_samples`` rows. NIID-Bench redraws its Dirichlet splits
until every party has 10 rows; on the study's small tables (569-615 rows over 20-30
parties) no draw in thousands satisfies that, so a draw whose smallest parties fall
short is **topped up** instead: each short party receives random rows of the currently
largest party until it has ``min_samples``. The skew of the draw survives everywhere
else; only the short parties' label mix is diluted.

Every split is driven by one ``np.random.default_rng(seed)``, so a seed names a split.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from fednorm.engine.errors import InputError

SplitKind = Literal["iid", "label", "quantity", "feature"]

ACCEPTED_FORMS = "'iid', 'label:β' (β > 0), 'quantity:β' (β > 0) or 'feature:σ' (σ ≥ 0)"

# A Dirichlet draw whose shares all underflow to 0 (tiny β) is redrawn; bounding the
# retries turns an impossible request into an error instead of a hang.
MAX_ATTEMPTS = 1000

# A float target with more distinct values than this is treated as continuous, and
# label skew then works on quantile bins of it (there are no classes to skew).
MAX_DISCRETE_LABELS = 20
CONTINUOUS_LABEL_BINS = 10


@dataclass(frozen=True)
class SplitSpec:
    """How to split rows over parties; parsed from / printed as text such as ``label:0.5``."""

    kind: SplitKind
    param: float | None = None

    def __post_init__(self) -> None:
        # Validating here (not only in ``parse``) keeps hand-built specs equally safe.
        if self.kind not in get_args(SplitKind):
            raise InputError(f"unknown split kind {self.kind!r}; use {ACCEPTED_FORMS}")
        if self.kind == "iid":
            if self.param is not None:
                raise InputError(f"'iid' takes no parameter; use {ACCEPTED_FORMS}")
            return
        if not _is_real(self.param) or not math.isfinite(self.param):
            raise InputError(f"{self.kind!r} needs a finite number; use {ACCEPTED_FORMS}")
        object.__setattr__(self, "param", float(self.param))  # label:1 == label:1.0
        lowest_ok = self.param >= 0 if self.kind == "feature" else self.param > 0
        if not lowest_ok:
            raise InputError(f"{self.kind}:{self.param} is out of range; use {ACCEPTED_FORMS}")

    @classmethod
    def parse(cls, text: str) -> SplitSpec:
        """Read ``iid``, ``label:β``, ``quantity:β`` or ``feature:σ`` (case-insensitive)."""
        if not isinstance(text, str):
            raise InputError(f"a split must be text such as 'label:0.5', got {text!r}")
        kind, sep, param_text = text.strip().lower().partition(":")
        if kind not in get_args(SplitKind) or (kind == "iid") == bool(sep):
            raise InputError(f"cannot read split {text!r}; use {ACCEPTED_FORMS}")
        if kind == "iid":
            return cls("iid")
        try:
            param = float(param_text)
        except ValueError:
            raise InputError(
                f"cannot read the parameter of split {text!r}; use {ACCEPTED_FORMS}"
            ) from None
        return cls(kind, param)

    def __str__(self) -> str:
        if self.param is None:
            return self.kind
        text = repr(float(self.param))  # shortest text that reads back to the same float
        return f"{self.kind}:{text.removesuffix('.0')}"


@dataclass
class Partition:
    """One party's rows; ``indices`` point into the original rows for traceability."""

    X: np.ndarray
    y: np.ndarray | None
    indices: np.ndarray


def partition(
    X: np.ndarray,
    y: np.ndarray | None,
    parties: int,
    split: SplitSpec | str,
    seed: int = 0,
    min_samples: int = 1,
    noise_scale: np.ndarray | None = None,
) -> list[Partition]:
    """Split the rows of ``X`` (and ``y``) over ``parties`` parties as ``split`` says.

    Every row goes to exactly one party and every party gets at least ``min_samples``
    rows. The inputs are never modified: each party gets its own copy of its rows.
    ``noise_scale`` (one non-negative value per feature, default 1) is the unit of
    feature-skew noise per feature; 0 keeps a feature noise-free.
    """
    spec = split if isinstance(split, SplitSpec) else SplitSpec.parse(split)
    X = np.asarray(X)
    y = None if y is None else np.asarray(y)
    _check_inputs(X, y, parties, spec, seed, min_samples)
    scale = _check_noise_scale(noise_scale, X.shape[1])
    rng = np.random.default_rng(seed)
    n_rows = X.shape[0]
    if spec.kind == "label":
        assert y is not None and spec.param is not None  # guaranteed by _check_inputs
        groups = _label_skew_groups(_discrete_labels(y), parties, spec.param, min_samples, rng)
    elif spec.kind == "quantity":
        assert spec.param is not None
        sizes = _dirichlet_sizes(n_rows, parties, spec.param, min_samples, rng)
        groups = np.split(rng.permutation(n_rows), np.cumsum(sizes)[:-1])
    else:
        groups = np.array_split(rng.permutation(n_rows), parties)
    result = [Partition(X[rows], None if y is None else y[rows], rows) for rows in groups]
    if spec.kind == "feature":
        assert spec.param is not None
        _add_party_noise(result, spec.param * scale, rng)
    return result


def feature_spread(X: np.ndarray, categorical: Sequence[int] = ()) -> np.ndarray:
    """Per feature, the standard deviation over all rows (NaN skipped; 0 for a feature
    without two values, and for the ``categorical`` columns): the unit of feature-skew
    noise that makes σ mean the same for every feature."""
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column
        spread = np.nan_to_num(np.nanstd(X, axis=0), nan=0.0)
    spread[list(categorical)] = 0.0
    return spread


def _check_noise_scale(noise_scale: np.ndarray | None, n_features: int) -> np.ndarray:
    if noise_scale is None:
        return np.ones(n_features)
    scale = np.asarray(noise_scale, dtype=np.float64)
    if scale.shape != (n_features,) or not np.all(np.isfinite(scale)) or np.any(scale < 0):
        raise InputError(f"noise_scale must hold {n_features} finite values ≥ 0, "
                         f"got shape {scale.shape}")
    return scale


def describe(partitions: Sequence[Partition]) -> dict:
    """Summarize a split for reports: party sizes and, when there is a target, label counts.

    A continuous target is summarized by the same quantile bins that label skew uses
    (bin numbers 0..9 as keys), computed over all parties together so bins are shared.
    """
    sizes = [len(part.indices) for part in partitions]
    summary: dict = {"parties": len(partitions), "rows": sum(sizes), "sizes": sizes}
    if not partitions or any(part.y is None for part in partitions):
        summary["label_counts"] = None
        return summary
    labels = _discrete_labels(np.concatenate([part.y for part in partitions]))
    per_party = np.split(labels, np.cumsum(sizes)[:-1])
    summary["label_counts"] = [
        dict(sorted(Counter(party_labels.tolist()).items())) for party_labels in per_party
    ]
    return summary


def _check_inputs(
    X: np.ndarray,
    y: np.ndarray | None,
    parties: int,
    spec: SplitSpec,
    seed: int,
    min_samples: int,
) -> None:
    """Reject every bad request up front, so a failure never leaves half a split behind."""
    for name, value, lowest in (("parties", parties, 1), ("min_samples", min_samples, 1)):
        if not _is_int(value) or value < lowest:
            raise InputError(f"{name} must be an integer ≥ {lowest}, got {value!r}")
    if not _is_int(seed) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    if X.ndim != 2:
        raise InputError(f"X must be 2-D (rows × features), got shape {X.shape}")
    if not np.issubdtype(X.dtype, np.number):
        raise InputError(f"X must be numeric, got dtype {X.dtype}")
    n_rows = X.shape[0]
    if y is not None and (y.ndim != 1 or len(y) != n_rows):
        raise InputError(f"y must be 1-D with one value per row of X ({n_rows}), got {y.shape}")
    if parties * min_samples > n_rows:
        raise InputError(
            f"cannot give {parties} parties at least {min_samples} "
            f"row{'s' if min_samples != 1 else ''} each from {n_rows} rows"
        )
    if spec.kind == "label":
        if y is None:
            raise InputError(f"split {spec} skews labels, so it needs a target y")
        if np.issubdtype(y.dtype, np.floating) and np.isnan(y).any():
            raise InputError(f"split {spec} needs a label for every row, but y has NaN")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _discrete_labels(y: np.ndarray) -> np.ndarray:
    """The labels to skew or count: ``y`` itself, or quantile-bin numbers 0..9 if continuous.

    Binning lets label skew (and label histograms) apply to regression targets: parties
    then differ in which range of the target they hold, the regression analogue.
    """
    if np.issubdtype(y.dtype, np.floating) and len(np.unique(y)) > MAX_DISCRETE_LABELS:
        inner_quantiles = np.linspace(0, 1, CONTINUOUS_LABEL_BINS + 1)[1:-1]
        return np.searchsorted(np.quantile(y, inner_quantiles), y, side="right")
    return y


def _label_skew_groups(
    labels: np.ndarray, parties: int, beta: float, min_samples: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """NIID-Bench label skew: spread each class over the parties by Dir(β) proportions,
    then top up parties short of ``min_samples`` rows (see the module doc)."""
    class_ids, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)[1:]
    for _ in range(MAX_ATTEMPTS):
        counts = _class_counts_per_party(class_sizes, parties, beta, rng)
        if counts is not None:
            return _top_up(_deal_rows(class_ids.reshape(-1), counts, rng), min_samples, rng)
    raise _never_drawn(f"label:{beta:g}")


def _class_counts_per_party(
    class_sizes: np.ndarray, parties: int, beta: float, rng: np.random.Generator
) -> np.ndarray | None:
    """How many rows of class k party j gets (``counts[k, j]``); None if a draw degenerated.

    As in NIID-Bench, a party that already holds its fair share (n / parties) of rows gets
    none of the later classes; this keeps sizes from drifting far apart, so that the skew
    stays in the labels rather than in the quantities.
    """
    fair_share = class_sizes.sum() / parties
    proportions = rng.dirichlet(np.full(parties, beta), size=len(class_sizes))
    counts = np.zeros((len(class_sizes), parties), dtype=np.int64)
    party_sizes = np.zeros(parties, dtype=np.int64)
    for k, class_size in enumerate(class_sizes):
        share = proportions[k] * (party_sizes < fair_share)
        total = share.sum()
        if not total > 0:  # every eligible share underflowed to 0 (tiny β): draw again
            return None
        counts[k] = _apportion(share / total, class_size)
        party_sizes += counts[k]
    return counts


def _deal_rows(
    class_ids: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Give each party ``counts[k, j]`` random rows of class k, in random order.

    The final shuffle keeps a party's rows from being ordered by class, which would
    bias any training loop that batches rows in order.
    """
    n_classes, parties = counts.shape
    shuffled = rng.permutation(len(class_ids))
    grouped_by_class = shuffled[np.argsort(class_ids[shuffled], kind="stable")]
    owner = np.repeat(np.tile(np.arange(parties), n_classes), counts.ravel())
    return [rng.permutation(grouped_by_class[owner == party]) for party in range(parties)]


def _dirichlet_sizes(
    n_rows: int, parties: int, beta: float, min_samples: int, rng: np.random.Generator
) -> np.ndarray:
    """NIID-Bench quantity skew: party sizes from Dir(β), short parties topped up to
    ``min_samples`` rows from the currently largest party (see the module doc)."""
    for _ in range(MAX_ATTEMPTS):
        proportions = rng.dirichlet(np.full(parties, beta))
        total = proportions.sum()
        if not total > 0:  # all shares underflowed to 0 (tiny β)
            continue
        sizes = _apportion(proportions / total, n_rows)
        for short in np.flatnonzero(sizes < min_samples):
            while sizes[short] < min_samples:
                largest = int(np.argmax(sizes))
                moved = min(min_samples - sizes[short], sizes[largest] - min_samples)
                sizes[largest] -= moved
                sizes[short] += moved
        return sizes
    raise _never_drawn(f"quantity:{beta:g}")


def _top_up(groups: list[np.ndarray], min_samples: int, rng: np.random.Generator
            ) -> list[np.ndarray]:
    """Give every party short of ``min_samples`` rows random rows of the currently
    largest party, one at a time (feasible: the caller checked parties · min ≤ rows)."""
    groups = [np.asarray(g, dtype=np.int64) for g in groups]
    for short in range(len(groups)):
        while len(groups[short]) < min_samples:
            largest = max(range(len(groups)), key=lambda j: len(groups[j]))
            pick = int(rng.integers(len(groups[largest])))
            groups[short] = np.append(groups[short], groups[largest][pick])
            groups[largest] = np.delete(groups[largest], pick)
    return groups


def _apportion(proportions: np.ndarray, n_rows: int) -> np.ndarray:
    """Whole row counts that follow ``proportions`` and sum to ``n_rows``.

    Largest remainder rounding: NIID-Bench's floor-based cut points instead hand every
    rounding remainder to the last party, which for small classes (a rare label, or a
    one-row value) fills parties in index order rather than by the drawn proportions.
    """
    exact = proportions * n_rows
    counts = np.floor(exact).astype(np.int64)
    shortfall = n_rows - int(counts.sum())
    counts[np.argsort(counts - exact, kind="stable")[:shortfall]] += 1
    return counts


def _never_drawn(split: str) -> InputError:
    return InputError(
        f"split {split}: every one of {MAX_ATTEMPTS} Dirichlet draws underflowed to zero "
        "shares; use a larger β"
    )


def _add_party_noise(parts: list[Partition], sigma: np.ndarray, rng: np.random.Generator
                     ) -> None:
    """Feature skew: party i of P (1-based) gets N(0, (σ_j·i/P)²) noise on feature j.

    Noise grows with the party number so the federation spans mild to strong distortion;
    NaN (missing) stays NaN because NaN plus noise is NaN; a feature with σ_j = 0 is
    left exactly as it was.
    """
    for number, part in enumerate(parts, start=1):
        scale = sigma * number / len(parts)
        noise = rng.normal(0.0, 1.0, part.X.shape) * scale
        part.X = np.asarray(part.X, dtype=np.float64) + noise
