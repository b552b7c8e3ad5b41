"""Test metrics as the paper reports them.

Classification: accuracy and F1 / precision / recall, support-weighted over classes
(binary, positive class 1, for two-class tasks such as BCW's malignant = 1), and how
many classes the predictions use (1: a constant predictor, e.g. the majority class).
``test_macro_f1`` is the unweighted mean of every class's F1, the study's main
reading: on HCV (87 % one class) the support-weighted F1 gives 0.81 to the majority
predictor, so every difference between normalizations is squeezed into the top fifth
of the scale, while its macro-F1 is 0.19.
Regression: mean absolute error and R². A model whose predictions are not finite
(training diverged) scores NaN rather than raising, so the run is still recorded.
"""

from __future__ import annotations

import math

import numpy as np

CLASSIFICATION_METRICS = ("test_accuracy", "test_f1", "test_macro_f1", "test_precision",
                          "test_recall", "test_predicted_classes")
REGRESSION_METRICS = ("test_mae", "test_r2")


def classification_metrics(y_true: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Metrics of the arg-max class of ``scores`` (rows × classes)."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    n_classes = scores.shape[1]
    y_pred = np.argmax(np.nan_to_num(scores, nan=-np.inf), axis=1)
    average = "binary" if n_classes == 2 else "weighted"
    precision, recall, f1, _ = precision_recall_fscore_support(
        y_true, y_pred, average=average, zero_division=0,
        labels=None if average == "binary" else np.arange(n_classes),
    )
    # Over the classes the test rows hold or the model predicts (sklearn's default): a
    # class absent from both has no F1 to average.
    _, _, macro_f1, _ = precision_recall_fscore_support(y_true, y_pred, average="macro",
                                                        zero_division=0)
    return {
        "test_accuracy": float(accuracy_score(y_true, y_pred)),
        "test_f1": float(f1),
        "test_macro_f1": float(macro_f1),
        "test_precision": float(precision),
        "test_recall": float(recall),
        "test_predicted_classes": len(np.unique(y_pred)),
    }


def f1(y_true: np.ndarray, scores: np.ndarray, macro: bool = False) -> float:
    """The F1 (or, with ``macro``, the macro-F1) of :func:`classification_metrics`
    alone (validation checkpoint selection)."""
    from sklearn.metrics import f1_score

    n_classes = scores.shape[1]
    y_pred = np.argmax(np.nan_to_num(scores, nan=-np.inf), axis=1)
    if macro:
        return float(f1_score(y_true, y_pred, average="macro", zero_division=0))
    if n_classes == 2:
        return float(f1_score(y_true, y_pred, zero_division=0))
    return float(f1_score(y_true, y_pred, average="weighted", zero_division=0,
                          labels=np.arange(n_classes)))


def regression_metrics(y_true: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import mean_absolute_error, r2_score

    predictions = predictions.reshape(-1)
    if not np.all(np.isfinite(predictions)):
        return {"test_mae": math.nan, "test_r2": math.nan}
    return {
        "test_mae": float(mean_absolute_error(y_true, predictions)),
        "test_r2": float(r2_score(y_true, predictions)),
    }
