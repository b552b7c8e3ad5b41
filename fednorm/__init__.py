"""fednorm: federated and privacy-preserving data normalization for federated learning.

Parties of a federation fit z-score, MinMax, robust or Yeo-Johnson normalization
as if their data were pooled, without pooling it: in plaintext-federated mode, or
under multiparty CKKS homomorphic encryption.

The public API (everything in ``__all__``, importable from ``fednorm``):

- **One process, every role** (simulation, research): :func:`simulate` fits one method
  over a list of per-party arrays or DataFrames and blocks; :func:`simulate_session`
  fits several methods on one joint key setup; :func:`simulate_async` and
  :func:`simulate_session_async` do the same from a running trio or asyncio loop, and
  :func:`fit_federation` / :func:`fit_session` inside the caller's own trio run.
- **One party in your process** against a ``fednorm serve`` elsewhere: :class:`Party`
  with a :class:`PartyConfig` (server address, party id, its certificates: a directory,
  :class:`PartyFiles` under any names, or an ``ssl.SSLContext`` of your own);
  ``await Party(config).run(X, features)``.  The server side: :class:`Server` with a
  :class:`ServerConfig`.
- **Methods**: ``"zscore"``, ``"minmax"``, ``"robust"``, ``"yeojohnson"`` (:data:`METHODS`).
  **Privacy**: ``"plain"`` (federated statistics in the clear) or ``"mhe"`` (multiparty
  CKKS; what each protocol reveals is in docs/LEAKAGE.md).  **Options**:
  :class:`FitOptions` (algorithm, ε, V_abs, CKKS preset, flooding, ...).
- **Results**: a :class:`Normalizer` per method (:class:`ZScoreNormalizer`,
  :class:`MinMaxNormalizer`, :class:`RobustNormalizer`, :class:`YeoJohnsonNormalizer`):
  ``transform``, ``params()``, ``to_sklearn()`` (a fitted scikit-learn estimator carrying
  the columns' names).
- **Errors**: every failure is a :class:`FednormError`: :class:`InputError` (bad input,
  nothing started), :class:`ProtocolError` (a peer broke the protocol),
  :class:`PartyDropped` (a peer went away or stalled), :class:`RunAborted` (a peer stopped
  the run and said why), :class:`SessionRefused` (a party would not take part in what the
  server announced); an interrupted command exits 130.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if sys.version_info[:2] != (3, 10):
    raise ImportError(
        "fednorm needs CPython 3.10: its CKKS backend (openfhe 1.6.1) ships a "
        f"3.10 extension only, and this is Python {sys.version.split()[0]}. "
        "Use `make demo` / `make test`, which build a 3.10 virtualenv."
    )

__version__ = "0.1.0"

# Where each public name lives.  They are imported on first use, so that ``import
# fednorm`` (and ``fednorm --version``) does not load the CKKS backend.
_HOMES = {
    "fednorm.sim.federation": ("simulate", "simulate_async", "simulate_session",
                               "simulate_session_async", "fit_federation", "fit_session",
                               "SimulationResult", "SessionResult"),
    "fednorm.protocols": ("FitOptions", "METHODS"),
    "fednorm.protocols.normalizers": ("Normalizer", "ZScoreNormalizer", "MinMaxNormalizer",
                                      "RobustNormalizer", "YeoJohnsonNormalizer"),
    "fednorm.multihost.party": ("Party", "PartyRun"),
    "fednorm.multihost.server": ("Server", "SessionOutcome"),
    "fednorm.multihost.config": ("PartyConfig", "PartyFiles", "ServerConfig", "Timeouts"),
    "fednorm.engine.errors": ("FednormError", "InputError", "ProtocolError", "PartyDropped",
                              "RunAborted", "SessionRefused"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = [
    "METHODS",
    "FednormError",
    "FitOptions",
    "InputError",
    "MinMaxNormalizer",
    "Normalizer",
    "Party",
    "PartyConfig",
    "PartyDropped",
    "PartyFiles",
    "PartyRun",
    "ProtocolError",
    "RobustNormalizer",
    "RunAborted",
    "Server",
    "ServerConfig",
    "SessionOutcome",
    "SessionRefused",
    "SessionResult",
    "SimulationResult",
    "Timeouts",
    "YeoJohnsonNormalizer",
    "ZScoreNormalizer",
    "fit_federation",
    "fit_session",
    "simulate",
    "simulate_async",
    "simulate_session",
    "simulate_session_async",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'fednorm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:
    from fednorm.engine.errors import (
        FednormError,
        InputError,
        PartyDropped,
        ProtocolError,
        RunAborted,
        SessionRefused,
    )
    from fednorm.multihost.config import PartyConfig, PartyFiles, ServerConfig, Timeouts
    from fednorm.multihost.party import Party, PartyRun
    from fednorm.multihost.server import Server, SessionOutcome
    from fednorm.protocols import METHODS, FitOptions
    from fednorm.protocols.normalizers import (
        MinMaxNormalizer,
        Normalizer,
        RobustNormalizer,
        YeoJohnsonNormalizer,
        ZScoreNormalizer,
    )
    from fednorm.sim.federation import (
        SessionResult,
        SimulationResult,
        fit_federation,
        fit_session,
        simulate,
        simulate_async,
        simulate_session,
        simulate_session_async,
    )
