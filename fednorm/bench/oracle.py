"""The numpy oracle of every benchmark error: what each protocol estimates, computed by
numpy (scikit-learn for Yeo-Johnson's λ, scipy for its log-likelihood) on the pooled
rows, never by the library's own plaintext fit; and the bound V_abs the parties could
agree on. Runs are named by benchmark case (fednorm/bench/cases.py) or by method."""

from __future__ import annotations

import numpy as np

from fednorm.bench.cases import base_method
from fednorm.bench.measure import sci
from fednorm.engine.errors import InputError
from fednorm.protocols.normalizers import Normalizer


def agreed_bound(X: np.ndarray) -> tuple[float, ...]:
    """A per-feature V_abs the parties could announce: |x| rounded up to a power of two."""
    top = np.nanmax(np.abs(X), axis=0)
    return tuple(float(v) for v in 2.0 ** np.ceil(np.log2(np.maximum(top, 1e-300))))


def oracle(name: str, X: np.ndarray) -> dict[str, np.ndarray]:
    """The statistics a protocol (case ``name`` or method) estimates, computed by numpy /
    scikit-learn on pooled X."""
    method = base_method(name)
    if method == "zscore":
        return {"mean": np.nanmean(X, axis=0), "var": np.nanvar(X, axis=0)}
    if method == "minmax":
        return {"min": np.nanmin(X, axis=0), "max": np.nanmax(X, axis=0)}
    if method in ("robust", "kth"):
        q1, q2, q3 = np.nanquantile(X, [0.25, 0.5, 0.75], axis=0)
        return {"median": q2} if method == "kth" else {"q1": q1, "median": q2, "q3": q3}
    if method == "yeojohnson":
        from sklearn.preprocessing import PowerTransformer

        return {"lambda": PowerTransformer(standardize=False).fit(X).lambdas_}
    raise InputError(f"no oracle for {method!r}")


def yeojohnson_llf(lambdas: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Per feature, Yeo-Johnson's log-likelihood (scipy) of the pooled column at λ_j, its
    missing values left out (as scikit-learn fits)."""
    from scipy.stats import yeojohnson_llf as llf

    return np.array([float(llf(lam, col[~np.isnan(col)]))
                     for lam, col in zip(lambdas, np.asarray(X, dtype=np.float64).T,
                                         strict=True)])


def estimate_errors(name: str, fitted: Normalizer, X: np.ndarray
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Per statistic, max over features of |ours − numpy| / |numpy| (numpy ≠ 0), and of
    |ours − numpy|. Yeo-Johnson also gets ``llf``: the log-likelihood at our λ against
    the one at scikit-learn's (how much of the fit's objective a λ error costs)."""
    ours = fitted.params()
    reference = oracle(name, X)
    if base_method(name) == "yeojohnson":
        reference["llf"] = yeojohnson_llf(reference["lambda"], X)
        ours = {**ours, "llf": yeojohnson_llf(np.asarray(ours["lambda"], np.float64), X)}
    relative, absolute = {}, {}
    for stat, ref in reference.items():
        got = np.asarray(ours[stat], dtype=np.float64)
        keep = np.isfinite(ref) & (ref != 0)
        miss = np.abs(got[keep] - ref[keep])
        relative[stat] = float(np.max(miss / np.abs(ref[keep])))
        absolute[stat] = float(np.max(miss))
    return relative, absolute


def errors_text(relative: dict[str, float], absolute: dict[str, float]) -> str:
    return ", ".join(f"{k} {sci(v)} (abs. {sci(absolute[k])})" for k, v in relative.items())
