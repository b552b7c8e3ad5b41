"""Normalization protocols by kind: :mod:`~fednorm.protocols.plain` and
:mod:`~fednorm.protocols.ppf`, one module per method, each a server and a party role.

Importing this package registers every protocol, so callers can look them up by
method and privacy mode with :func:`get_protocol`.
"""

from fednorm.protocols import plain, ppf  # noqa: F401 - registration side effect
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
