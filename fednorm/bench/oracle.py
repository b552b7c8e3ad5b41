"""The numpy oracle of every benchmark error: what each protocol estimates, computed by
numpy (scikit-learn for Yeo-Johnson's λ) on the pooled rows, never by the library's own
plaintext fit; and the bound V_abs the parties could agree on."""

from __future__ import annotations

import numpy as np

from fednorm.bench.measure import sci
from fednorm.engine.errors import InputError
from fednorm.protocols.normalizers import Normalizer


def agreed_bound(X: np.ndarray) -> tuple[float, ...]:
    """A per-feature V_abs the parties could announce: |x| rounded up to a power of two."""
    top = np.nanmax(np.abs(X), axis=0)
    return tuple(float(v) for v in 2.0 ** np.ceil(np.log2(np.maximum(top, 1e-300))))


def oracle(method: str, X: np.ndarray) -> dict[str, np.ndarray]:
    """The statistics a protocol estimates, computed by numpy / scikit-learn on pooled X."""
    if method in ("zscore", "zscore_reveal"):
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


def estimate_errors(method: str, fitted: Normalizer, X: np.ndarray
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Per statistic, max over features of |ours − numpy| / |numpy| (numpy ≠ 0), and of
    |ours − numpy|."""
    ours = fitted.params()
    relative, absolute = {}, {}
    for name, ref in oracle(method, X).items():
        got = np.asarray(ours[name], dtype=np.float64)
        keep = np.isfinite(ref) & (ref != 0)
        miss = np.abs(got[keep] - ref[keep])
        relative[name] = float(np.max(miss / np.abs(ref[keep])))
        absolute[name] = float(np.max(miss))
    return relative, absolute


def errors_text(relative: dict[str, float], absolute: dict[str, float]) -> str:
    return ", ".join(f"{k} {sci(v)} (abs. {sci(absolute[k])})" for k, v in relative.items())
