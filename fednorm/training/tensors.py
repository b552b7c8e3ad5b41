"""What a study run feeds torch and reads back: client and evaluation tensors, targets
standardized with federated statistics (why: :mod:`fednorm.training.runner`), class
weights and test scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from fednorm.sim.datasets import Dataset
from fednorm.sim.federation import simulate
from fednorm.training.data import ClientData, EvalSet
from fednorm.training.fedavg import ClientTensors, TrainConfig, TrainOutcome, mean_loss, predict
from fednorm.training.metrics import classification_metrics, regression_metrics
from fednorm.training.models import FedNet

# Training needs finite inputs: a local Yeo-Johnson fitted on a handful of rows can map
# another client's test rows to huge values, and NaN (missing) has no learned meaning.
FEATURE_LIMIT = 1e6


def class_weights(clients: list[ClientData], n_classes: int) -> tuple[float, ...]:
    """n / (K · n_k) per class k from the clients' summed training class counts (1 for
    a class no client trains on)."""
    counts = np.sum([np.bincount(c.y_train, minlength=n_classes) for c in clients], axis=0)
    present = counts > 0
    weights = np.ones(n_classes)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return tuple(float(w) for w in weights)


@dataclass(frozen=True)
class TargetScale:
    """The federation's training-target mean and standard deviation."""

    mean: float
    sd: float

    def apply(self, y: np.ndarray) -> np.ndarray:
        return (y - self.mean) / self.sd

    def invert(self, y: np.ndarray) -> np.ndarray:
        return y * self.sd + self.mean


def standardize_targets(clients: list[ClientData]) -> tuple[list[ClientData], TargetScale]:
    """Scale every client's training and validation targets by the federated z-score of
    the training targets (the plain protocol over each client's ``y_train``; nothing is
    pooled). Test targets stay in their units, unread, until scoring."""
    fitted = simulate([c.y_train.reshape(-1, 1) for c in clients], "zscore").normalizer
    mean, var = float(fitted.mean[0]), float(fitted.var[0])
    scale = TargetScale(mean, math.sqrt(var) if var > 0 else 1.0)
    scaled = [replace(c, y_train=scale.apply(c.y_train), y_val=scale.apply(c.y_val))
              for c in clients]
    return scaled, scale


def score_on_test(model: FedNet, outcome: TrainOutcome, test: EvalSet, task: str,
                  config: TrainConfig, scale: TargetScale | None = None) -> dict[str, float]:
    """Test loss and scores of the best-validation weights (regression scores in the
    target's own units; the loss in the standardized units training used)."""
    test_X, test_y = eval_tensors(test if scale is None else
                                  EvalSet(test.X, scale.apply(test.y)), task)
    test_output = predict(model, outcome.state, test_X)
    metrics = {"test_loss": mean_loss(test_output, test_y, task, config)}
    scores = test_output.numpy().astype(np.float64)
    if task == "classification":
        metrics.update(classification_metrics(test.y, scores))
    else:
        metrics.update(regression_scores(test.y, scores, scale))
    return metrics


def regression_scores(y: np.ndarray, predictions: np.ndarray, scale: TargetScale | None
                       ) -> dict[str, float]:
    """MAE and R² of ``predictions`` (standardized by ``scale``, if given) against ``y``
    in the target's own units."""
    if scale is None:
        return regression_metrics(y, predictions)
    return regression_metrics(y, scale.invert(predictions))


def n_outputs(dataset: Dataset) -> int:
    """One logit per class, or one output for regression."""
    assert dataset.y is not None
    if dataset.task == "regression":
        return 1
    return len(dataset.class_names) if dataset.class_names else int(dataset.y.max()) + 1


def client_tensors(clients: list[ClientData], task: str) -> ClientTensors:
    """The clients' training rows as model inputs, concatenated client after client."""
    return ClientTensors(
        _features(np.concatenate([c.X_train for c in clients])),
        _targets(np.concatenate([c.y_train for c in clients]), task),
        [len(c.y_train) for c in clients],
    )


def eval_tensors(rows: EvalSet, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _features(rows.X), _targets(rows.y, task)


def _features(X: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(finite_inputs(X).astype(np.float32))


def finite_inputs(X: np.ndarray) -> np.ndarray:
    return np.clip(np.nan_to_num(X, nan=0.0), -FEATURE_LIMIT, FEATURE_LIMIT)


def _targets(y: np.ndarray, task: str) -> torch.Tensor:
    return torch.from_numpy(y.astype(np.int64 if task == "classification" else np.float32))
