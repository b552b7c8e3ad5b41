"""Normalization protocols: one module per protocol, each a server and a party role.

Importing this package registers every protocol, so callers can look them up by
method and privacy mode with :func:`get_protocol`.
"""

from fednorm.protocols import (  # noqa: F401 - registration side effect
    minmax,
    ppf_minmax,
    ppf_robust,
    ppf_yeojohnson,
    ppf_zscore,
    robust,
    yeojohnson,
    zscore,
)
from fednorm.protocols.base import METHODS, FitOptions, Protocol, fit_local, get_protocol
from fednorm.protocols.normalizers import (
    MinMaxNormalizer,
    Normalizer,
    RobustNormalizer,
    YeoJohnsonNormalizer,
    ZScoreNormalizer,
)

__all__ = [
    "METHODS",
    "FitOptions",
    "MinMaxNormalizer",
    "Normalizer",
    "Protocol",
    "RobustNormalizer",
    "YeoJohnsonNormalizer",
    "ZScoreNormalizer",
    "fit_local",
    "get_protocol",
]
