"""Running the grid: each cell goes data → normalization → FedAvg → test metrics → CSV row.

Cells are independent, so ``jobs > 1`` runs them in worker processes (spawned, one
torch thread each: the models are small, and two processes keep two cores busier than
two threads inside tiny matrix products). Only the parent writes the results file.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from multiprocessing import get_context
from typing import Literal, TextIO

import numpy as np
import torch

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import Dataset, load_dataset
from fednorm.training.data import ClientData, EvalSet, make_clients, merge_eval
from fednorm.training.fedavg import (
    BatchedRound,
    ClientTensors,
    SequentialRound,
    TrainConfig,
    TrainOutcome,
    mean_loss,
    predict,
    train_federated,
)
from fednorm.training.grid import COLUMNS, DATASETS, Cell, ResultStore
from fednorm.training.metrics import classification_metrics, regression_metrics
from fednorm.training.models import build_model, model_spec
from fednorm.training.normalization import NormalizationSpec, normalize_clients
from fednorm.training.progress import Progress

Trainer = Literal["batched", "sequential"]

# Training needs finite inputs: a local Yeo-Johnson fitted on a handful of rows can map
# another client's test rows to huge values, and NaN (missing) has no learned meaning.
FEATURE_LIMIT = 1e6


@dataclass(frozen=True)
class RunSettings:
    """How to run cells (not what to run): overrides of the per-dataset training defaults."""

    data_dir: str | None = None
    max_rounds: int | None = None
    patience: int | None = None
    batch_size: int | None = None
    trainer: Trainer = "batched"
    persist_optimizer: bool = False
    threads: int = 1

    def train_config(self, dataset: str, seed: int) -> TrainConfig:
        defaults = DATASETS.get(dataset)
        base = TrainConfig() if defaults is None else TrainConfig(
            batch_size=defaults.batch_size, max_rounds=defaults.max_rounds,
            patience=defaults.patience)
        overrides = {"batch_size": self.batch_size, "max_rounds": self.max_rounds,
                     "patience": self.patience}
        return replace(base, seed=seed, persist_optimizer=self.persist_optimizer,
                       **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class GridSummary:
    ran: int
    skipped: int
    failed: int


@lru_cache(maxsize=4)
def cached_dataset(name: str, data_dir: str | None) -> Dataset:
    return load_dataset(name, data_dir=data_dir)


def run_cell(cell: Cell, settings: RunSettings) -> dict[str, object]:
    """Run one cell and return its results row; bad data for this cell is a failed row."""
    started = time.perf_counter()
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    row.update(zip(("dataset", "skew", "clients", "normalization", "seed", "privacy"),
                   cell.key(), strict=True))
    dataset = cached_dataset(cell.dataset, settings.data_dir)
    row["task"] = dataset.task
    spec = NormalizationSpec.parse(cell.normalization)
    try:
        clients = make_clients(dataset, cell.clients, cell.skew, cell.seed)
        normalized = normalize_clients(clients, spec, cell.privacy)
    except InputError as exc:  # e.g. a skew that cannot give every client two rows
        row.update(status="error", error=" ".join(str(exc).split()),
                   seconds=round(time.perf_counter() - started, 3))
        return row
    config = settings.train_config(cell.dataset, cell.seed)
    outcome, metrics = train_and_test(dataset, normalized.clients, spec.activation, config,
                                      settings.trainer)
    row.update(metrics)
    row.update(
        status="ok", best_val_loss=outcome.best_val_loss, rounds=outcome.rounds,
        best_round=outcome.best_round, norm_seconds=round(normalized.seconds, 3),
        norm_bytes=normalized.bytes, seconds=round(time.perf_counter() - started, 3),
    )
    return row


def train_and_test(
    dataset: Dataset,
    clients: list[ClientData],
    activation: str,
    config: TrainConfig,
    trainer: Trainer = "batched",
) -> tuple[TrainOutcome, dict[str, float]]:
    """Train the dataset's model with FedAvg and score the best-validation weights."""
    assert dataset.task is not None and dataset.y is not None
    task = dataset.task
    val, test = merge_eval(clients)
    data = client_tensors(clients, task)
    torch.manual_seed(config.seed)
    model = build_model(model_spec(dataset.name, dataset.image_shape), data.X.shape[1],
                        n_outputs(dataset), activation, dataset.image_shape)
    round_type = BatchedRound if trainer == "batched" else SequentialRound
    outcome = train_federated(model, round_type(model, data, task, config),
                              eval_tensors(val, task), task, config)
    test_X, test_y = eval_tensors(test, task)
    test_output = predict(model, outcome.state, test_X)
    metrics = {"test_loss": mean_loss(test_output, test_y, task)}
    scores = test_output.numpy().astype(np.float64)
    if task == "classification":
        metrics.update(classification_metrics(test.y, scores))
    else:
        metrics.update(regression_metrics(test.y, scores))
    return outcome, metrics


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
    finite = np.clip(np.nan_to_num(X, nan=0.0), -FEATURE_LIMIT, FEATURE_LIMIT)
    return torch.from_numpy(finite.astype(np.float32))


def _targets(y: np.ndarray, task: str) -> torch.Tensor:
    return torch.from_numpy(y.astype(np.int64 if task == "classification" else np.float32))


def run_grid(
    cells: list[Cell],
    store: ResultStore,
    settings: RunSettings,
    jobs: int = 1,
    stream: TextIO | None = None,
) -> GridSummary:
    """Run every cell not yet in ``store``, appending one row per finished run."""
    pending = store.pending(cells)
    for name in dict.fromkeys(cell.dataset for cell in pending):
        cached_dataset(name, settings.data_dir)  # a missing file fails before any training
    progress = Progress(len(pending), len(cells) - len(pending), stream or sys.stderr)
    progress.start()
    failed = 0
    for cell, row in _results(pending, settings, jobs):
        store.append(row)
        failed += row["status"] != "ok"
        progress.advance(cell.label(), float(row["seconds"] or math.nan), row["status"] != "ok")
    progress.close()
    return GridSummary(len(pending), len(cells) - len(pending), failed)


def _results(
    cells: list[Cell], settings: RunSettings, jobs: int
) -> Iterator[tuple[Cell, dict[str, object]]]:
    """(cell, row) pairs as runs finish, in this process or in ``jobs`` workers.

    Leaving early (an error, Ctrl-C, or SIGTERM turned into SystemExit by the CLI)
    terminates the workers instead of letting them finish cells nobody will record.
    """
    if jobs <= 1 or len(cells) <= 1:
        torch.set_num_threads(settings.threads)
        for cell in cells:
            yield cell, run_cell(cell, settings)
        return
    context = get_context("spawn")
    with context.Pool(jobs, initializer=torch.set_num_threads, initargs=(settings.threads,),
                      maxtasksperchild=None) as pool:
        yield from pool.imap_unordered(_run_cell_pair, [(c, settings) for c in cells])


def _run_cell_pair(job: tuple[Cell, RunSettings]) -> tuple[Cell, dict[str, object]]:
    cell, settings = job
    return cell, run_cell(cell, settings)
