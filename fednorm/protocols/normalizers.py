"""Fitted normalizers: what every protocol (federated, PPF or local) produces.

A normalizer holds per-feature parameters, transforms a party's array, reports
its parameters under the names of the ``simulate --json`` contract, and converts
to the equivalent fitted scikit-learn transformer when scikit-learn is there.
Zero scales are handled the way scikit-learn does (scale 1), so a constant
feature maps to 0 instead of NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.protocols.columns import column_names, is_table, table_values
from fednorm.protocols.estimators import federated_minmax_scaler, preprocessing

if TYPE_CHECKING:  # scikit-learn is optional: the annotations name what each returns
    from sklearn.base import TransformerMixin
    from sklearn.preprocessing import PowerTransformer, RobustScaler, StandardScaler

    from fednorm.protocols.federated_minmax import FederatedMinMaxScaler


def _safe_scale(scale: np.ndarray) -> np.ndarray:
    """Scale 1 where the spread is zero or undefined (scikit-learn's convention)."""
    eps = 10 * np.finfo(np.float64).eps
    scale = np.asarray(scale, dtype=np.float64)
    return np.where(np.isfinite(scale) & (np.abs(scale) > eps), scale, 1.0)


def _check_width(X: np.ndarray, width: int) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != width:
        raise InputError(f"expected an array with {width} feature columns, got shape {X.shape}")
    return X


N = TypeVar("N", bound="Normalizer")


@dataclass(frozen=True)
class Normalizer:
    """Common shape: named per-feature parameter vectors."""

    METHOD: ClassVar[str] = ""
    PARAMS: ClassVar[tuple[str, ...]] = ()
    feature_names: tuple[str, ...] | None = field(default=None, kw_only=True)
    """The columns' names when the parties' data had names (DataFrames), in fit order."""

    @property
    def n_features(self) -> int:
        return len(getattr(self, self.PARAMS[0]))

    def params(self) -> dict[str, list[float]]:
        """Parameters as plain lists, keyed as in the ``--json`` contract."""
        return {name: [float(v) for v in getattr(self, name)] for name in self.PARAMS}

    def with_names(self: N, features: Sequence[str] | None) -> N:
        """This normalizer carrying the columns' names, when they are known."""
        return self if features is None else replace(self, feature_names=tuple(features))

    def transform(self, X: Any) -> np.ndarray:
        """``X`` normalized, as an array.  A DataFrame's columns are matched by name to
        those fitted (any order; a missing or extra column is refused, naming it)."""
        if is_table(X):
            X = table_values(X[list(self._names_in(X))], "the data")
        return self._transform(_check_width(X, self.n_features))

    def _names_in(self, frame: Any) -> tuple[str, ...]:
        have = column_names(frame, "the data")
        if self.feature_names is None:
            return have
        missing = [name for name in self.feature_names if name not in have]
        extra = [name for name in have if name not in self.feature_names]
        if missing or extra:
            raise InputError("the data's columns differ from those fitted: " + "; ".join(
                [f"lacks {', '.join(map(repr, missing))}"] * bool(missing)
                + [f"has unexpected {', '.join(map(repr, extra))}"] * bool(extra)))
        return self.feature_names

    def _fitted(self, estimator: Any) -> Any:
        """``estimator`` with what scikit-learn's ``fit`` would have set besides the
        parameters: ``n_features_in_``, and ``feature_names_in_`` when names are known
        (so ``transform(DataFrame)`` checks them, ``get_feature_names_out()`` returns
        them and ``set_output(transform="pandas")`` works)."""
        estimator.n_features_in_ = self.n_features
        if self.feature_names is not None:
            estimator.feature_names_in_ = np.asarray(self.feature_names, dtype=object)
        return estimator

    def _transform(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def to_sklearn(self) -> TransformerMixin:
        """The equivalent fitted scikit-learn transformer (each subclass names its type)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ZScoreNormalizer(Normalizer):
    """(x - mean) / sqrt(var), with population variance (ddof 0)."""

    METHOD: ClassVar[str] = "zscore"
    PARAMS: ClassVar[tuple[str, ...]] = ("mean", "var")
    mean: np.ndarray
    var: np.ndarray
    count: np.ndarray | None = None

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean) / _safe_scale(np.sqrt(self.var))

    def to_sklearn(self) -> StandardScaler:
        scaler = preprocessing().StandardScaler()
        scaler.mean_ = np.asarray(self.mean, dtype=np.float64)
        scaler.var_ = np.asarray(self.var, dtype=np.float64)
        scaler.scale_ = _safe_scale(np.sqrt(self.var))
        scaler.n_samples_seen_ = (
            np.asarray(self.count, dtype=np.int64) if self.count is not None else 0
        )
        return self._fitted(scaler)


@dataclass(frozen=True)
class MinMaxNormalizer(Normalizer):
    """(x - min) / (max - min) into [0, 1]."""

    METHOD: ClassVar[str] = "minmax"
    PARAMS: ClassVar[tuple[str, ...]] = ("min", "max")
    min: np.ndarray
    max: np.ndarray
    rows: int | None = None  # pooled rows, when the protocol counted them

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.min) / _safe_scale(self.max - self.min)

    def to_sklearn(self) -> FederatedMinMaxScaler:
        """A MinMaxScaler (:class:`~fednorm.protocols.federated_minmax.
        FederatedMinMaxScaler`) with the pooled min and max."""
        scaler = federated_minmax_scaler()
        data_range = np.asarray(self.max - self.min, dtype=np.float64)
        scaler.scale_ = 1.0 / _safe_scale(data_range)
        scaler.min_ = -np.asarray(self.min) * scaler.scale_
        scaler.data_min_ = np.asarray(self.min, dtype=np.float64)
        scaler.data_max_ = np.asarray(self.max, dtype=np.float64)
        scaler.data_range_ = data_range
        # The pooled row count when known.  Unknown is None, not 0: a later partial_fit
        # then fails loudly instead of carrying on from a count that is wrong.
        scaler.n_samples_seen_ = self.rows
        return self._fitted(scaler)


@dataclass(frozen=True)
class RobustNormalizer(Normalizer):
    """(x - median) / (q3 - q1), scikit-learn's RobustScaler with quantile range (25, 75)."""

    METHOD: ClassVar[str] = "robust"
    PARAMS: ClassVar[tuple[str, ...]] = ("q1", "median", "q3")
    q1: np.ndarray
    median: np.ndarray
    q3: np.ndarray

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.median) / _safe_scale(self.q3 - self.q1)

    def to_sklearn(self) -> RobustScaler:
        scaler = preprocessing().RobustScaler()
        scaler.center_ = np.asarray(self.median, dtype=np.float64)
        scaler.scale_ = _safe_scale(self.q3 - self.q1)
        return self._fitted(scaler)


def yeo_johnson(X: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """The Yeo-Johnson power transform, column-wise, NaN-preserving (as scikit-learn)."""
    X = np.asarray(X, dtype=np.float64)
    lambdas = np.broadcast_to(np.asarray(lambdas, dtype=np.float64), X.shape[1:] or (1,))
    out = np.empty_like(X)
    positive = X >= 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        lam = np.broadcast_to(lambdas, X.shape)
        log_pos = np.log1p(np.where(positive, X, 0.0))
        log_neg = np.log1p(np.where(positive, 0.0, -X))
        near_zero = np.abs(lam) < np.spacing(1.0)
        near_two = np.abs(lam - 2) < np.spacing(1.0)
        pos = np.where(near_zero, log_pos, np.expm1(lam * log_pos) / np.where(near_zero, 1, lam))
        neg = np.where(
            near_two, -log_neg, -np.expm1((2 - lam) * log_neg) / np.where(near_two, 1, 2 - lam)
        )
        out = np.where(positive, pos, neg)
    return np.where(np.isnan(X), np.nan, out)


@dataclass(frozen=True)
class YeoJohnsonNormalizer(Normalizer):
    """Yeo-Johnson with per-feature lambda, then z-score of the transformed data."""

    METHOD: ClassVar[str] = "yeojohnson"
    PARAMS: ClassVar[tuple[str, ...]] = ("lambda", "mean", "var")
    lambdas: np.ndarray
    mean: np.ndarray
    var: np.ndarray

    @property
    def n_features(self) -> int:
        return len(self.lambdas)

    def params(self) -> dict[str, list[float]]:
        return {
            "lambda": [float(v) for v in self.lambdas],
            "mean": [float(v) for v in self.mean],
            "var": [float(v) for v in self.var],
        }

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (yeo_johnson(X, self.lambdas) - self.mean) / _safe_scale(np.sqrt(self.var))

    def to_sklearn(self) -> PowerTransformer:
        transformer = preprocessing().PowerTransformer(method="yeo-johnson",
                                                     standardize=True)
        transformer.lambdas_ = np.asarray(self.lambdas, dtype=np.float64)
        transformer._scaler = ZScoreNormalizer(self.mean, self.var).to_sklearn()
        return self._fitted(transformer)
