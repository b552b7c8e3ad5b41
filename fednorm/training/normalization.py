"""The study's normalization modes, and applying one to a federation's clients.

* ``none``: raw features;
* ``local_<m>``: each client fits ``m`` on its own training rows and transforms its own
  train, validation and test rows (the paper's baseline);
* ``federated_<m>``: ``m`` is fitted by the real message-passing protocols
  (:func:`fednorm.sim.federation.simulate`) over the clients' training rows, with the
  chosen privacy mode, and every client applies the result; nothing is pooled;
* ``pooled_<m>``: the oracle, ``m`` fitted with numpy on the union of the training rows
  (what federated must equal; used to test it, not part of the paper grid);
* ``batch_norm``, ``layer_norm``, ``group_norm``, ``instance_norm``: no data
  normalization, the model gets that activation normalization layer instead;
* ``central_model``, ``central_linear``, ``central_majority``, ``central_lookup``:
  **references, not federated results**: the clients' rows pooled into one training
  set (z-scored with the pooled fit), on which the same network is trained (one
  client, one epoch per round, the same early stopping) or a baseline is fitted
  (:mod:`fednorm.training.baselines`: logistic / ridge regression, the majority
  class, the per-(age, sex) mean). They are scored on the same validation and test
  rows as the federated runs of the partition, so they show what "learning" means on
  that split.

``m`` is one of zscore, minmax, robust, yeojohnson. Torch-free.

Under ``mhe``, PPF MinMax, robust scaling and Yeo-Johnson need V_abs, a bound on |x|
the parties agree on in advance (in a real federation from domain knowledge, such as
a dataset's published ranges). A study run that gives none gets
:func:`study_bound`: per feature, the power of two at or above the largest |x| any
client holds. It is a public protocol parameter, not a result: the statistics
themselves still come from the encrypted protocol.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

import fednorm.protocols.plain.yeojohnson  # noqa: F401 - registers the Yeo-Johnson protocols
from fednorm.engine.errors import InputError
from fednorm.protocols import METHODS, FitOptions, Normalizer, fit_local
from fednorm.sim.federation import simulate
from fednorm.training.data import ClientData, HeldOutLabels

Kind = Literal["none", "local", "federated", "pooled", "activation", "central"]
DATA_KINDS: tuple[Kind, ...] = ("local", "federated", "pooled")
ACTIVATION_NORMS = ("batch", "layer", "group", "instance")
CENTRAL_REFERENCES = ("model", "linear", "majority", "lookup")
# Every dataset gets these; central_lookup only a dataset with lookup columns.
REFERENCE_NORMALIZATIONS = ("central_model", "central_linear", "central_majority")
LOOKUP_REFERENCE = "central_lookup"
PRIVACY_MODES = ("plain", "mhe")

# The paper's 13 (Fig. 2): no normalization, local and federated versions of the four
# data normalizations, and the four activation normalizations.
PAPER_NORMALIZATIONS = (
    "none",
    *(f"local_{m}" for m in METHODS),
    *(f"federated_{m}" for m in METHODS),
    *(f"{a}_norm" for a in ACTIVATION_NORMS),
)
# Yeo-Johnson was run on tabular data only.
IMAGE_NORMALIZATIONS = tuple(n for n in PAPER_NORMALIZATIONS if not n.endswith("yeojohnson"))
# On an MLP, instance norm has no spatial positions to normalize over; what the paper's
# scripts ran is GroupNorm with one group, i.e. layer norm (identical results), so the
# tabular grid leaves it out.
TABULAR_NORMALIZATIONS = tuple(n for n in PAPER_NORMALIZATIONS if n != "instance_norm")


@dataclass(frozen=True)
class NormalizationSpec:
    """A parsed normalization name: its kind and the data method or activation layer."""

    kind: Kind
    method: str | None = None

    @classmethod
    def parse(cls, text: str) -> NormalizationSpec:
        """Read ``none``, ``<local|federated|pooled>_<method>`` or ``<layer>_norm``."""
        name = text.strip().lower() if isinstance(text, str) else ""
        if name == "none":
            return cls("none")
        prefix, _, rest = name.partition("_")
        if prefix in DATA_KINDS and rest in METHODS:
            return cls(prefix, rest)
        if rest == "norm" and prefix in ACTIVATION_NORMS:
            return cls("activation", prefix)
        if prefix == "central" and rest in CENTRAL_REFERENCES:
            return cls("central", rest)
        raise InputError(
            f"unknown normalization {text!r}; use none, local_<m>, federated_<m>, pooled_<m> "
            f"(m: {', '.join(METHODS)}), {', '.join(a + '_norm' for a in ACTIVATION_NORMS)} "
            f"or a reference ({', '.join(f'central_{r}' for r in CENTRAL_REFERENCES)})"
        )

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        if self.kind == "activation":
            return f"{self.method}_norm"
        return f"{self.kind}_{self.method}"

    @property
    def is_reference(self) -> bool:
        """A centralized reference (pooled data), not a federated run."""
        return self.kind == "central"

    @property
    def activation(self) -> str:
        """The activation normalization layer the model gets (``none`` for data modes)."""
        return self.method if self.kind == "activation" and self.method else "none"


@dataclass
class NormalizedFederation:
    """The clients after normalization, with what it cost (protocol rounds and bytes)."""

    clients: list[ClientData]
    seconds: float = 0.0
    rounds: int = 0
    bytes: int = 0
    normalizer: Normalizer | None = None


def normalize_clients(
    clients: list[ClientData],
    spec: NormalizationSpec,
    privacy: str = "plain",
    options: FitOptions | None = None,
) -> NormalizedFederation:
    """Apply ``spec`` to every client's train, validation and test features."""
    started = time.perf_counter()
    if spec.kind in ("none", "activation"):
        return NormalizedFederation(clients)
    if spec.kind == "central":
        pooled = pool_clients(clients)
        normalizer = fit_local("zscore", pooled.X_train, options)
        return NormalizedFederation([pooled.with_features(normalizer.transform)],
                                    time.perf_counter() - started, normalizer=normalizer)
    assert spec.method is not None
    if spec.kind == "local":
        normalized = [
            client.with_features(fit_local(spec.method, client.X_train, options).transform)
            for client in clients
        ]
        return NormalizedFederation(normalized, time.perf_counter() - started)
    if spec.kind == "federated":
        if privacy == "mhe":  # PPF z-score ignores V_abs; the others need it
            options = with_study_bound(options, clients)
        result = simulate([c.X_train for c in clients], spec.method, privacy, options)
        normalizer, rounds, n_bytes = result.normalizer, result.report.rounds, \
            result.report.bytes_total
    else:
        pooled_rows = np.concatenate([c.X_train for c in clients])
        normalizer, rounds, n_bytes = fit_local(spec.method, pooled_rows, options), 0, 0
    normalized = [client.with_features(normalizer.transform) for client in clients]
    return NormalizedFederation(
        normalized, time.perf_counter() - started, rounds, n_bytes, normalizer
    )


def pool_clients(clients: list[ClientData]) -> ClientData:
    """All clients' rows as one client's (the centralized references' data); the test
    labels stay unread."""
    parts = ("X_train", "y_train", "X_val", "y_val", "X_test")
    return ClientData(*(np.concatenate([getattr(c, part) for c in clients])
                        for part in parts), HeldOutLabels.pool([c.y_test for c in clients]))


def with_study_bound(options: FitOptions | None, clients: list[ClientData]) -> FitOptions:
    """``options`` with V_abs set to :func:`study_bound` unless it already has one."""
    options = options or FitOptions()
    if options.vabs is not None:
        return options
    return replace(options, vabs=study_bound(clients))


def study_bound(clients: list[ClientData]) -> tuple[float, ...]:
    """Per feature, the smallest power of two ≥ the largest |x| of any client's
    training rows (1 for a feature that is zero everywhere).

    Each client contributes only its own maximum; rounding up to a power of two keeps
    the bound from pinning the federation's extreme value.
    """
    largest = np.max([np.nanmax(np.abs(c.X_train), axis=0, initial=0.0) for c in clients],
                     axis=0)
    return tuple(2.0 ** math.ceil(math.log2(v)) if v > 0 else 1.0 for v in largest)
