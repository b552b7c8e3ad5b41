"""The fitted references: what a score means on a partition, without any training.

Each is fitted on the pooled training rows of the partition (the ``central_*``
normalizations pool and z-score them, :mod:`fednorm.training.normalization`) and scored
once on the same test rows as the federated runs, like a trained model:

* ``central_linear``: logistic regression (classification) or ridge regression;
* ``central_majority``: the majority class of the training labels for every test row
  (regression: the training mean). Beside every table, because a score is only as good
  as its distance from this one: HCV's majority predictor has a weighted F1 of ~0.81;
* ``central_lookup``: the training mean of the target per combination of the dataset's
  ``lookup_columns`` (Parkinson's age and sex; the overall mean for a combination no
  training row has). Under a row-random split this names the patient, whose other
  recordings are in the training rows: it shows how much of a score is recognition.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import Dataset
from fednorm.training.data import ClientData
from fednorm.training.metrics import classification_metrics
from fednorm.training.tensors import TargetScale, finite_inputs, n_outputs, regression_scores

FittedScores = Callable[[Dataset, ClientData, "TargetScale | None"], dict[str, float]]


def linear_scores(dataset: Dataset, pooled: ClientData, scale: TargetScale | None
                  ) -> dict[str, float]:
    """Logistic or ridge regression on the pooled, z-scored training rows."""
    from sklearn.linear_model import LogisticRegression, Ridge

    X_train = finite_inputs(pooled.X_train)
    X_test = finite_inputs(pooled.X_test)
    if dataset.task == "classification":
        model = LogisticRegression(max_iter=2000).fit(X_train, pooled.y_train)
        scores = np.full((len(X_test), n_outputs(dataset)), -1.0)  # absent classes
        scores[:, model.classes_] = model.predict_proba(X_test)
        return classification_metrics(pooled.y_test.read(), scores)
    return regression_scores(pooled.y_test.read(), model_predict(Ridge(alpha=1.0), X_train,
                                                                 pooled.y_train, X_test), scale)


def model_predict(model: object, X_train: np.ndarray, y_train: np.ndarray,
                  X_test: np.ndarray) -> np.ndarray:
    return model.fit(X_train, y_train).predict(X_test)  # type: ignore[attr-defined]


def majority_scores(dataset: Dataset, pooled: ClientData, scale: TargetScale | None
                    ) -> dict[str, float]:
    """The most common training class (or the training mean) for every test row."""
    rows = len(pooled.X_test)
    if dataset.task == "classification":
        counts = np.bincount(pooled.y_train, minlength=n_outputs(dataset))
        scores = np.zeros((rows, len(counts)))
        scores[:, int(np.argmax(counts))] = 1.0
        return classification_metrics(pooled.y_test.read(), scores)
    return regression_scores(pooled.y_test.read(), np.full(rows, pooled.y_train.mean()), scale)


def lookup_scores(dataset: Dataset, pooled: ClientData, scale: TargetScale | None
                  ) -> dict[str, float]:
    """The training mean per combination of ``dataset.lookup_columns`` (regression)."""
    if not dataset.lookup_columns or dataset.task != "regression":
        raise InputError(f"central_lookup needs a regression dataset with lookup columns; "
                         f"{dataset.name!r} has none")
    columns = list(dataset.lookup_columns)
    means: dict[tuple[float, ...], list[float]] = {}
    for key, target in zip(map(tuple, pooled.X_train[:, columns]), pooled.y_train,
                           strict=True):
        means.setdefault(key, []).append(float(target))
    overall = float(pooled.y_train.mean())
    predictions = np.array([np.mean(means[key]) if key in means else overall
                            for key in map(tuple, pooled.X_test[:, columns])])
    return regression_scores(pooled.y_test.read(), predictions, scale)


FITTED: dict[str, FittedScores] = {"linear": linear_scores, "majority": majority_scores,
                                   "lookup": lookup_scores}
