"""From a dataset to the study's clients: skewed partition, then per-client splits.

As in the paper, the *whole* dataset is partitioned among the clients with the chosen
skew (feature noise included, so test rows are as noisy as their client's training
rows); each client then keeps 20% of its rows for testing and 10% of the rest for
validation. Every client normalizes its own three parts (with its own or the federated
parameters) before the validation and test parts are merged on the server, which
evaluates the global model on them.

Torch-free: the normalization modes and the report use this without the train extra.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import Dataset
from fednorm.sim.partition import Partition, SplitSpec, partition

TEST_SHARE = 0.2
VAL_SHARE = 0.1  # of what is left after the test rows

# Dirichlet quantity skew with small β hands some clients a handful of rows; two is the
# least that still lets such a client train (it then has no test or validation rows).
MIN_CLIENT_ROWS = 2


@dataclass
class ClientData:
    """One client's rows, split for training, server-side validation and testing."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray

    def with_features(self, transform: Callable[[np.ndarray], np.ndarray]) -> ClientData:
        """The same client with ``transform`` applied to all three feature matrices."""
        return replace(
            self,
            X_train=transform(self.X_train),
            X_val=transform(self.X_val),
            X_test=transform(self.X_test),
        )


@dataclass
class EvalSet:
    """The server's merged validation or test rows."""

    X: np.ndarray
    y: np.ndarray


def make_clients(
    dataset: Dataset, clients: int, skew: SplitSpec | str, seed: int
) -> list[ClientData]:
    """Partition ``dataset`` over ``clients`` with ``skew``, then split each client's rows.

    The seed drives both the partition and the per-client splits, so it names the run's
    data exactly.
    """
    if dataset.y is None:
        raise InputError(f"dataset {dataset.name!r} has no target to train on")
    parts = partition(dataset.X, dataset.y, clients, skew, seed=seed, min_samples=MIN_CLIENT_ROWS)
    rng = np.random.default_rng([seed, clients, 0x5EED])
    result = [split_client(part, rng) for part in parts]
    if not sum(len(c.y_val) for c in result) or not sum(len(c.y_test) for c in result):
        raise InputError(
            f"{dataset.name}: {clients} clients leave no validation or test rows; use fewer"
        )
    return result


def split_client(part: Partition, rng: np.random.Generator) -> ClientData:
    """Shuffle one client's rows into test (20%), validation (10% of the rest) and train.

    Shares are rounded to the nearest row, so a client too small for a test or
    validation row (Dirichlet quantity skew makes some) keeps all its rows for training.
    """
    assert part.y is not None
    n_rows = len(part.y)
    n_test = int(np.rint(TEST_SHARE * n_rows))
    n_val = int(np.rint(VAL_SHARE * (n_rows - n_test)))
    order = rng.permutation(n_rows)
    test, val, train = np.split(order, [n_test, n_test + n_val])
    X = np.asarray(part.X, dtype=np.float64)
    return ClientData(X[train], part.y[train], X[val], part.y[val], X[test], part.y[test])


def merge_eval(clients: list[ClientData]) -> tuple[EvalSet, EvalSet]:
    """The validation and test rows of all clients, moved to the server after normalizing."""
    val = EvalSet(np.concatenate([c.X_val for c in clients]),
                  np.concatenate([c.y_val for c in clients]))
    test = EvalSet(np.concatenate([c.X_test for c in clients]),
                   np.concatenate([c.y_test for c in clients]))
    return val, test
