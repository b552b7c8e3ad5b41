"""A scikit-learn MinMaxScaler fitted federatedly (imports scikit-learn: loaded by
:func:`fednorm.protocols.estimators.federated_minmax_scaler` only)."""

from __future__ import annotations

from typing import Any

from sklearn.preprocessing import MinMaxScaler


class FederatedMinMaxScaler(MinMaxScaler):
    """MinMaxScaler with the federation's min and max.  PPF MinMax never learns the pooled
    row count, so ``n_samples_seen_`` is None: a ``partial_fit`` would carry on from a
    count that does not exist, and is refused saying so."""

    def partial_fit(self, X: Any, y: Any = None) -> FederatedMinMaxScaler:
        if getattr(self, "data_min_", None) is not None and self.n_samples_seen_ is None:
            raise ValueError(
                "this MinMaxScaler was fitted federatedly without revealing the pooled row "
                "count, so partial_fit cannot add rows to it: fit federatedly again over "
                "all the parties' rows (or use fit to start afresh on local rows)")
        return super().partial_fit(X, y)
