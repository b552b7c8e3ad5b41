"""From a dataset to the study's clients: skewed partition, then per-client splits.

As in the paper, the *whole* dataset is partitioned among the clients with the chosen
skew (feature noise included, so test rows are as noisy as their client's training
rows); each client then keeps 20% of its rows for testing and 20% of the rest for
validation (the paper: 10%; see below). Every client normalizes its own three parts
(with its own or the federated parameters) before the validation and test parts are
merged on the server, which evaluates the global model on them.

The per-client splits are **stratified**: a client's rows are ordered by target (class,
or value for regression) and the test and validation rows are taken at evenly spaced
positions from a random start, so every part holds each class (or target range) in
the client's proportions, up to one row. A validation share of 10% leaves HCV's merged
validation set at ~48 rows with 0-1 of its rarest class; 20% doubles it, so the
validation F1 that selects a run's weights has rare-class rows to see.

Feature-skew noise is in units of each feature's standard deviation over the whole
dataset, and categorical columns get none (:func:`fednorm.sim.partition.feature_spread`);
image pixels, already in [0, 1], take the noise in pixel units.

Every client keeps at least :data:`MIN_TRAIN_ROWS` training rows (NIID-Bench's rule);
a request that cannot give that (too many clients for the rows) is an ``InputError``.

**Split by subject.** A dataset whose rows come in groups (``Dataset.groups``: the
Parkinson's recordings of one patient) is split by group, so that every recording of a
subject is on one side: the seed deals whole subjects to the test (20 %), validation
(20 % of the rest) and training sides, the training subjects' rows are partitioned over
the clients with the skew, and the held-out subjects' rows likewise (a second draw, so a
client's test rows under label or quantity skew follow their own proportions; feature
noise is the client's own, as its index sets it). A row-random split lets a model score
by recognizing the patient, whose recordings sit on both sides.

**Test labels are held out** (:class:`HeldOutLabels`): nothing but scoring, once per
run after training, reads them; every choice (weights, stopping round, step size...)
sees the training and validation rows only.

Torch-free: the normalization modes and the report use this without the train extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import Dataset
from fednorm.sim.partition import Partition, SplitSpec, feature_spread, partition

TEST_SHARE = 0.2
VAL_SHARE = 0.2  # of what is left after the test rows
MIN_TRAIN_ROWS = 10


@dataclass(frozen=True, eq=False)
class HeldOutLabels:
    """Test labels that only :meth:`read` gives out (see the module doc).

    ``on_read`` hooks run on every read: how a test sees when labels are read, without
    patching the code that reads them.
    """

    parts: tuple[np.ndarray, ...]
    on_read: tuple[Callable[[], None], ...] = ()

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def read(self) -> np.ndarray:
        for hook in self.on_read:
            hook()
        return np.concatenate(self.parts)

    def traced(self, hook: Callable[[], None]) -> HeldOutLabels:
        """The same labels, with ``hook`` run on every read."""
        return replace(self, on_read=(*self.on_read, hook))

    @classmethod
    def pool(cls, labels: Sequence[HeldOutLabels]) -> HeldOutLabels:
        """Several clients' labels as one, unread."""
        return cls(tuple(p for lab in labels for p in lab.parts),
                   tuple(h for lab in labels for h in lab.on_read))


@dataclass
class ClientData:
    """One client's rows, split for training, server-side validation and testing."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: HeldOutLabels
    train_groups: np.ndarray | None = None  # the training rows' groups (split by group)

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


def split_sizes(n_rows: int) -> tuple[int, int, int]:
    """(test, validation, train) row counts of a client with ``n_rows`` rows."""
    n_test = int(np.rint(TEST_SHARE * n_rows))
    n_val = int(np.rint(VAL_SHARE * (n_rows - n_test)))
    return n_test, n_val, n_rows - n_test - n_val


def min_client_rows(train_rows: int = MIN_TRAIN_ROWS) -> int:
    """The fewest rows a client needs to keep ``train_rows`` after its splits."""
    n_rows = train_rows
    while split_sizes(n_rows)[2] < train_rows:
        n_rows += 1
    return n_rows


def make_clients(
    dataset: Dataset, clients: int, skew: SplitSpec | str, seed: int
) -> list[ClientData]:
    """Partition ``dataset`` over ``clients`` with ``skew``, then split each client's rows.

    The seed drives both the partition and the per-client splits, so it names the run's
    data exactly.
    """
    if dataset.y is None:
        raise InputError(f"dataset {dataset.name!r} has no target to train on")
    needed = min_client_rows()
    if clients * needed > len(dataset.y):
        raise InputError(
            f"{dataset.name}: {clients} clients cannot each keep {MIN_TRAIN_ROWS} training "
            f"rows ({needed} rows with their test and validation rows) from "
            f"{len(dataset.y)} rows; use at most {len(dataset.y) // needed} clients")
    noise_scale = (None if dataset.image_shape is not None
                   else feature_spread(dataset.X, dataset.categorical))
    if dataset.groups is not None:
        return _split_by_group(dataset, clients, skew, seed, noise_scale)
    parts = partition(dataset.X, dataset.y, clients, skew, seed=seed, min_samples=needed,
                      noise_scale=noise_scale)
    rng = np.random.default_rng([seed, clients, 0x5EED])
    return [split_client(part, rng) for part in parts]


def group_sides(groups: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The groups (subjects) dealt to the test and validation sides by ``seed``: 20 %
    of them, then 20 % of the rest, as :func:`split_sizes` counts rows."""
    names = np.random.default_rng([seed, 0x6E0]).permutation(np.unique(groups))
    n_test, n_val, _ = split_sizes(len(names))
    return names[:n_test], names[n_test : n_test + n_val]


def _split_by_group(dataset: Dataset, clients: int, skew: SplitSpec | str, seed: int,
                    noise_scale: np.ndarray | None) -> list[ClientData]:
    """:func:`make_clients` with every subject's rows on one side (see the module doc)."""
    assert dataset.groups is not None and dataset.y is not None
    test_groups, val_groups = group_sides(dataset.groups, seed)
    held = np.isin(dataset.groups, np.concatenate([test_groups, val_groups]))
    train_rows, held_rows = np.flatnonzero(~held), np.flatnonzero(held)
    trained = partition(dataset.X[train_rows], dataset.y[train_rows], clients, skew,
                        seed=seed, min_samples=MIN_TRAIN_ROWS, noise_scale=noise_scale)
    held_out = partition(dataset.X[held_rows], dataset.y[held_rows], clients, skew,
                         seed=seed + 1, min_samples=1, noise_scale=noise_scale)
    result = []
    for train, rest in zip(trained, held_out, strict=True):
        is_test = np.isin(dataset.groups[held_rows[rest.indices]], test_groups)
        assert train.y is not None and rest.y is not None
        result.append(ClientData(
            np.asarray(train.X, dtype=np.float64), train.y,
            np.asarray(rest.X[~is_test], dtype=np.float64), rest.y[~is_test],
            np.asarray(rest.X[is_test], dtype=np.float64), HeldOutLabels((rest.y[is_test],)),
            dataset.groups[train_rows[train.indices]]))
    return result


def split_client(part: Partition, rng: np.random.Generator) -> ClientData:
    """Split one client's rows into test (20%), validation (20% of the rest) and train,
    stratified by target (see the module doc)."""
    assert part.y is not None
    n_test, n_val, _ = split_sizes(len(part.y))
    by_target = np.lexsort((rng.random(len(part.y)), part.y))
    test, rest = evenly_spaced(by_target, n_test, rng)
    val, train = evenly_spaced(rest, n_val, rng)
    train = rng.permutation(train)
    X = np.asarray(part.X, dtype=np.float64)
    return ClientData(X[train], part.y[train], X[val], part.y[val], X[test],
                      HeldOutLabels((part.y[test],)))


def evenly_spaced(order: np.ndarray, count: int, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``count`` entries of ``order`` at evenly spaced positions from a random start
    (systematic sampling), and the others in their order."""
    if count == 0:
        return order[:0], order
    step = len(order) / count
    picked = np.floor((np.arange(count) + rng.random()) * step).astype(np.int64)
    chosen = np.zeros(len(order), dtype=bool)
    chosen[picked] = True
    return order[chosen], order[~chosen]


def merge_val(clients: list[ClientData]) -> EvalSet:
    """The validation rows of all clients, moved to the server after normalizing."""
    return EvalSet(np.concatenate([c.X_val for c in clients]),
                   np.concatenate([c.y_val for c in clients]))


def merge_test(clients: list[ClientData]) -> EvalSet:
    """The test rows of all clients, labels read: for scoring a trained run, only."""
    return EvalSet(np.concatenate([c.X_test for c in clients]),
                   HeldOutLabels.pool([c.y_test for c in clients]).read())
