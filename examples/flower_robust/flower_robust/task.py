"""Each node's data and the model: BCW rows split over the nodes, logistic regression.

A node finds its rows from its node config: ``partition-id`` and ``num-partitions``
select an IID share of the Breast Cancer Wisconsin data shipped with fednorm, or
``data-csv`` (with ``target``) names a CSV file of its own.  A quarter of the node's
rows are held out for evaluation; the normalizer is fitted on the training rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import load_dataset
from fednorm.sim.partition import partition

SPLIT_SEED = 0
HELD_OUT = 0.25


@dataclass(frozen=True)
class NodeData:
    """A node's training and held-out rows (features, 0/1 labels)."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_partition(partition_id: int, num_partitions: int) -> NodeData:
    """The IID share ``partition_id`` of BCW over ``num_partitions`` nodes."""
    if not 0 <= partition_id < num_partitions:
        raise InputError(f"partition-id must be in [0, {num_partitions}), got {partition_id}")
    dataset = load_dataset("bcw")
    share = partition(dataset.X, dataset.y, num_partitions, "iid", seed=SPLIT_SEED)
    return hold_out(share[partition_id].X, share[partition_id].y)


def bcw_features() -> list[str]:
    """The names of the BCW columns every partition holds, in order."""
    return list(load_dataset("bcw").feature_names)


def load_node_data(node_config: dict[str, object]) -> NodeData:
    """This node's data, as its node config says."""
    if "data-csv" in node_config:
        target = node_config.get("target")
        dataset = load_dataset(str(node_config["data-csv"]), None if target is None
                               else str(target))
        if dataset.y is None:
            raise InputError("data-csv needs a target column for training (node config "
                             "'target')")
        return hold_out(dataset.X, dataset.y)
    try:
        return load_partition(int(node_config["partition-id"]),  # type: ignore[arg-type]
                              int(node_config["num-partitions"]))  # type: ignore[arg-type]
    except KeyError as missing:
        raise InputError(f"node config needs {missing} (or data-csv)") from None


def hold_out(X: np.ndarray, y: np.ndarray) -> NodeData:
    """A fixed shuffle, then the last quarter of the rows for evaluation."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(X))
    cut = len(X) - round(HELD_OUT * len(X))
    train, test = order[:cut], order[cut:]
    labels = np.asarray(y, dtype=np.float64)
    return NodeData(X[train], labels[train], X[test], labels[test])


# -- logistic regression in numpy ---------------------------------------------------------
def initial_model(n_features: int) -> list[np.ndarray]:
    return [np.zeros(n_features), np.zeros(1)]


def _probabilities(model: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    weights, bias = model
    logits = np.nan_to_num(X) @ weights + bias[0]  # a missing value sits at the center
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -30, 30)))


def log_loss(model: list[np.ndarray], X: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(_probabilities(model, X), 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def accuracy(model: list[np.ndarray], X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((_probabilities(model, X) >= 0.5) == (y == 1)))


def train(model: list[np.ndarray], X: np.ndarray, y: np.ndarray, epochs: int,
          learning_rate: float) -> list[np.ndarray]:
    """Full-batch gradient descent on the log loss."""
    weights, bias = model[0].copy(), model[1].copy()
    for _ in range(epochs):
        error = _probabilities([weights, bias], X) - y
        weights -= learning_rate * np.nan_to_num(X).T @ error / len(X)
        bias -= learning_rate * np.mean(error)
    return [weights, bias]
