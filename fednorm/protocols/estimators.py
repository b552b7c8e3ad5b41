"""The scikit-learn side of :meth:`Normalizer.to_sklearn`, imported only when called
(scikit-learn is optional): the preprocessing module, or an error saying how to get it,
and the one estimator fednorm subclasses."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from fednorm.engine.errors import InputError

if TYPE_CHECKING:
    from fednorm.protocols.federated_minmax import FederatedMinMaxScaler


def preprocessing() -> ModuleType:
    """``sklearn.preprocessing``, or an :class:`InputError` saying how to install it."""
    try:
        import sklearn.preprocessing
    except ImportError:
        raise InputError("to_sklearn() needs scikit-learn, which is not installed: "
                         "pip install 'fednorm[sklearn]'") from None
    return sklearn.preprocessing


def federated_minmax_scaler() -> FederatedMinMaxScaler:
    """A MinMaxScaler whose ``partial_fit`` says why it cannot go on when the pooled row
    count was never revealed (scikit-learn's own would fail adding to ``None``)."""
    from fednorm.protocols.federated_minmax import FederatedMinMaxScaler

    preprocessing()
    return FederatedMinMaxScaler()
