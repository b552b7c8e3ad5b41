"""Running a job's cells: each cell goes data → normalization → FedAvg → test metrics → CSV row.

Two choices keep the networks' numbers meaningful:

* **Regression targets are standardized with federated statistics**
  (:mod:`fednorm.training.tensors`): the plain z-score
  protocol (:func:`fednorm.sim.federation.simulate`) fits the mean and standard
  deviation of the clients' training targets, every client scales its targets with
  them, and the model's predictions are mapped back, so test MAE and R² are in the
  target's own units (losses stay in standardized units). Parkinson's total_UPDRS
  (mean 29, sd 10.7) otherwise asks an MLP to move its output by ~30 with sign-only
  MAE gradients, and it stopped at the round cap far from converged.
* **Checkpoint selection by validation F1** for classification (per dataset,
  :class:`fednorm.training.grid.DatasetDefaults`; see
  :class:`fednorm.training.fedavg.EarlyStopping`). Class-weighted cross-entropy (a row
  of class k weighs n / (K · n_k), from the sum of the clients' per-class training
  counts, the same kind of aggregate FedAvg's sample weights reveal) is available as
  the alternative; measured on HCV it did worse (``results/README.md``).

How cells are grouped into jobs and run in worker processes: :mod:`fednorm.training.jobs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.sim.datasets import Dataset, load_dataset
from fednorm.training.baselines import FITTED
from fednorm.training.data import ClientData, make_clients, merge_test, merge_val
from fednorm.training.fedavg import (
    ClientTensors,
    TrainConfig,
    TrainOutcome,
    train_federated,
    train_stacked,
)
from fednorm.training.grid import (
    COLUMNS,
    Cell,
)
from fednorm.training.models import (
    FedNet,
    MLPSpec,
    ModelSpec,
    architecture_key,
    build_model,
    model_spec,
)
from fednorm.training.normalization import (
    NormalizationSpec,
    NormalizedFederation,
    normalize_clients,
)
from fednorm.training.rounds import BatchedRound, SequentialRound, StackedRound
from fednorm.training.settings import RunSettings, Trainer
from fednorm.training.tensors import (
    TargetScale,
    client_tensors,
    eval_tensors,
    n_outputs,
    score_on_test,
    standardize_targets,
)
from fednorm.training.tuning import tuning_clients

# Called with a training group's cells once their training has ended, before any of
# them is scored: the one point after which test labels may be read.
TrainedHook = Callable[[list[Cell]], None]


@lru_cache(maxsize=4)
def cached_dataset(name: str, data_dir: str | None) -> Dataset:
    return load_dataset(name, data_dir=data_dir)


@dataclass
class PreparedRun:
    """A cell whose clients are normalized (or whose row already records its error)."""

    cell: Cell
    row: dict[str, object]
    normalized: NormalizedFederation | None
    activation: str = "none"
    fitted: str | None = None  # a fitted reference (baselines.FITTED), not trained


@dataclass
class TrainedRun:
    """A prepared run as a stack trains it: its federation and its partition's setting."""

    prepared: PreparedRun
    federation: tuple[int, bool]  # (partition, pooled): runs that share their clients
    config: TrainConfig
    scale: TargetScale | None

    @property
    def clients(self) -> list[ClientData]:
        assert self.prepared.normalized is not None
        return self.prepared.normalized.clients


def run_cell(cell: Cell, settings: RunSettings) -> dict[str, object]:
    """Run one cell and return its results row; bad data for this cell is a failed row."""
    return run_cells([cell], settings)[0][1]


def run_cells(cells: list[Cell], settings: RunSettings) -> list[tuple[Cell, dict[str, object]]]:
    """Run cells of one dataset, seed and privacy, of one or more partitions: the runs
    whose networks can stack train together (see :func:`run_partitions`).

    A stacked run's ``seconds`` is its own normalization time plus its share of the
    stack's training time.
    """
    first = cells[0]
    if any((c.dataset, c.seed, c.privacy) != (first.dataset, first.seed, first.privacy)
           for c in cells):
        raise InputError("cells run together must share dataset, seed and privacy")
    dataset = cached_dataset(first.dataset, settings.data_dir)
    partitions, failed = [], []
    for group in partition_groups(cells):
        started = time.perf_counter()
        try:
            clients = make_clients(dataset, group[0].clients, group[0].skew, group[0].seed)
            if settings.tuning:
                clients = tuning_clients(clients, group[0].seed)
        except InputError as exc:  # e.g. more clients than the rows allow
            seconds = time.perf_counter() - started
            failed += [(c, _error_row(c, dataset, exc, seconds)) for c in group]
            continue
        partitions.append((clients, group))
    return failed + (run_partitions(dataset, partitions, settings) if partitions else [])


def run_partition(dataset: Dataset, clients: list[ClientData], cells: list[Cell],
                  settings: RunSettings, on_trained: TrainedHook | None = None
                  ) -> list[tuple[Cell, dict[str, object]]]:
    """:func:`run_partitions` of one partition."""
    return run_partitions(dataset, [(clients, cells)], settings, on_trained)


def run_partitions(dataset: Dataset, partitions: list[tuple[list[ClientData], list[Cell]]],
                   settings: RunSettings, on_trained: TrainedHook | None = None
                   ) -> list[tuple[Cell, dict[str, object]]]:
    """Cells of partitions whose clients are made: every partition's runs are
    normalized, the runs whose networks stack (all MLPs of the partitions, each
    partition's runs and its central model a federation of their own; identical networks
    otherwise) train as one stack, and the fitted references are fitted. ``on_trained``
    is told when each training group has finished, before it is scored (see
    :data:`TrainedHook`)."""
    spec = model_spec(dataset.name, dataset.image_shape)
    prepared, groups = [], {}
    for index, (clients, cells) in enumerate(partitions):
        scale = None
        if dataset.task == "regression":
            clients, scale = standardize_targets(clients)
        config = settings.train_config(dataset, cells[0].seed, clients)
        runs = [_prepare(cell, dataset, clients, settings.fit_options) for cell in cells]
        prepared += [(run, scale) for run in runs]
        for run in runs:
            if run.normalized is None or run.fitted is not None:
                continue
            trained = TrainedRun(run, (index, len(run.normalized.clients) != len(clients)),
                                 config, scale)
            key = ((_stack_key(spec, run.activation), repr(config)) if stacking(settings)
                   else id(run))
            groups.setdefault(key, []).append(trained)
    for group in groups.values():
        _train_group(dataset, group, settings, on_trained)
    for run, scale in prepared:
        if run.normalized is not None and run.fitted is not None:
            _fit_reference(dataset, run, scale, on_trained)
    return [(run.cell, run.row) for run, _ in prepared]


def _stack_key(spec: ModelSpec, activation: str) -> object:
    """Runs with equal keys (and settings) train in one stack: all MLPs of a job (they
    differ at most in their activation norm), identical networks otherwise."""
    return spec if isinstance(spec, MLPSpec) else architecture_key(spec, activation)


def stacking(settings: RunSettings) -> bool:
    return settings.stack and settings.trainer == "batched"


def _prepare(cell: Cell, dataset: Dataset, clients: list[ClientData],
             options: FitOptions | None) -> PreparedRun:
    started = time.perf_counter()
    spec = NormalizationSpec.parse(cell.normalization)
    try:
        normalized = normalize_clients(clients, spec, cell.privacy, options)
    except InputError as exc:
        return PreparedRun(cell, _error_row(cell, dataset, exc, time.perf_counter() - started),
                           None)
    row = _base_row(cell, dataset)
    row.update(norm_seconds=round(normalized.seconds, 3), norm_bytes=normalized.bytes)
    return PreparedRun(cell, row, normalized, spec.activation,
                       fitted=spec.method if spec.is_reference and spec.method in FITTED
                       else None)


def _base_row(cell: Cell, dataset: Dataset) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    row.update(zip(("dataset", "skew", "clients", "normalization", "seed", "privacy"),
                   cell.key(), strict=True))
    row["task"] = dataset.task
    return row


def _error_row(cell: Cell, dataset: Dataset, exc: InputError, seconds: float
               ) -> dict[str, object]:
    row = _base_row(cell, dataset)
    row.update(status="error", error=" ".join(str(exc).split()), seconds=round(seconds, 3))
    return row


def _train_group(dataset: Dataset, group: list[TrainedRun], settings: RunSettings,
                 on_trained: TrainedHook | None) -> None:
    """Train one stack (or a single run) and fill in the rows."""
    started = time.perf_counter()
    trained = (None if on_trained is None
               else lambda: on_trained([run.prepared.cell for run in group]))
    if len(group) == 1:
        (run,) = group
        results = [train_and_test(dataset, run.clients, run.prepared.activation, run.config,
                                  settings.trainer, run.scale, trained)]
    else:
        results = train_and_test_stacked(dataset, group, trained)
    share = (time.perf_counter() - started) / len(group)
    for run, (outcome, metrics) in zip(group, results, strict=True):
        row = run.prepared.row
        row.update(metrics)
        row.update(
            status="ok", best_val_loss=outcome.best_val_loss, rounds=outcome.rounds,
            best_round=outcome.best_round, max_rounds=run.config.max_rounds,
            seconds=round(float(row["norm_seconds"]) + share, 3),
        )


def _fit_reference(dataset: Dataset, run: PreparedRun, scale: TargetScale | None,
                   on_trained: TrainedHook | None) -> None:
    """A fitted reference (:mod:`fednorm.training.baselines`) on the run's one pooled
    client, timed; one the dataset cannot have is a failed row. It has no training to
    end: it runs after every trained group of the partition."""
    started = time.perf_counter()
    assert run.normalized is not None and run.fitted is not None
    (pooled,) = run.normalized.clients
    if on_trained is not None:
        on_trained([run.cell])
    try:
        run.row.update(FITTED[run.fitted](dataset, pooled, scale))
    except InputError as exc:
        run.row.update(_error_row(run.cell, dataset, exc, time.perf_counter() - started))
        return
    run.row.update(status="ok", seconds=round(float(run.row["norm_seconds"])
                                             + time.perf_counter() - started, 3))


def train_and_test(
    dataset: Dataset,
    clients: list[ClientData],
    activation: str,
    config: TrainConfig,
    trainer: Trainer = "batched",
    scale: TargetScale | None = None,
    trained: Callable[[], None] | None = None,
) -> tuple[TrainOutcome, dict[str, float]]:
    """Train the dataset's model with FedAvg, then (after calling ``trained``) score the
    best-validation weights on the test rows, once."""
    assert dataset.task is not None and dataset.y is not None
    task = dataset.task
    data = client_tensors(clients, task)
    model = seeded_model(dataset, data, activation, config.seed)
    round_type = BatchedRound if trainer == "batched" else SequentialRound
    outcome = train_federated(model, round_type(model, data, task, config),
                              eval_tensors(merge_val(clients), task), task, config)
    if trained is not None:
        trained()
    return outcome, score_on_test(model, outcome, merge_test(clients), task, config, scale)


def train_and_test_stacked(
    dataset: Dataset,
    runs: list[TrainedRun],
    trained: Callable[[], None] | None = None,
) -> list[tuple[TrainOutcome, dict[str, float]]]:
    """:func:`train_and_test` for several runs trained as one stack (one setting, one
    seed), each with its activation norm and its federation; each gets the result it
    would get alone. The networks must be identical unless they are MLPs (see
    :class:`StackedRound`)."""
    assert dataset.task is not None
    task, config = dataset.task, runs[0].config
    data = [client_tensors(run.clients, task) for run in runs]
    # Each run's model as it would be built alone; this also leaves torch's generator
    # where a lone run's training would find it (each federation's dropout stream starts
    # there).
    models = [seeded_model(dataset, data[0], run.prepared.activation, config.seed)
              for run in runs]
    names = {federation: i for i, federation in enumerate(dict.fromkeys(
        run.federation for run in runs))}
    stack = StackedRound(models, data, task, config, [names[run.federation] for run in runs])
    outcomes = train_stacked(models, stack, [model.state_dict() for model in models],
                             [eval_tensors(merge_val(run.clients), task) for run in runs],
                             task, config)
    if trained is not None:
        trained()
    return [(outcome, score_on_test(model, outcome, merge_test(run.clients), task, config,
                                    run.scale))
            for model, outcome, run in zip(models, outcomes, runs, strict=True)]


def seeded_model(dataset: Dataset, data: ClientTensors, activation: str, seed: int) -> FedNet:
    """The dataset's network, initialized from ``seed``."""
    torch.manual_seed(seed)
    return build_model(model_spec(dataset.name, dataset.image_shape), data.X.shape[1],
                       n_outputs(dataset), activation, dataset.image_shape)


def partition_groups(cells: list[Cell]) -> list[list[Cell]]:
    """Cells grouped by partition (dataset, skew, clients, seed, privacy), in grid order."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        key = (cell.dataset, cell.skew, cell.clients, cell.seed, cell.privacy)
        groups.setdefault(key, []).append(cell)
    return list(groups.values())
