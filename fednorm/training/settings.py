"""How to run the study's cells (not what to run): the per-dataset training defaults
of :data:`fednorm.training.grid.DATASETS` with a run's overrides."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fednorm.protocols import FitOptions
from fednorm.sim.datasets import Dataset
from fednorm.training.data import ClientData
from fednorm.training.fedavg import TrainConfig
from fednorm.training.grid import DATASETS, RegressionLoss, Selection
from fednorm.training.tensors import class_weights, n_outputs

Trainer = Literal["batched", "sequential"]


@dataclass(frozen=True)
class RunSettings:
    """How to run cells (not what to run): overrides of the per-dataset training defaults."""

    data_dir: str | None = None
    max_rounds: int | None = None
    patience: int | None = None
    min_rounds: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    trainer: Trainer = "batched"
    persist_optimizer: bool | None = None  # None: the dataset's default
    threads: int = 1
    stack: bool = True  # train a partition's same-architecture runs together
    fit_options: FitOptions | None = None  # protocol options of federated_<m> (ε, CKKS preset…)
    class_weighted: bool | None = None  # None: the dataset's default
    regression_loss: RegressionLoss | None = None
    select: Selection | None = None
    # Score on the tuning view (fednorm.training.tuning) instead of the test rows.
    tuning: bool = False

    def train_config(self, dataset: Dataset, seed: int,
                     clients: list[ClientData] | None = None) -> TrainConfig:
        """The dataset's training settings with this run's overrides; class weights
        (when on) from ``clients``' training rows."""
        defaults = DATASETS.get(dataset.name)
        base = TrainConfig() if defaults is None else TrainConfig(
            batch_size=defaults.batch_size, max_rounds=defaults.max_rounds,
            patience=defaults.patience, min_rounds=defaults.min_rounds, lr=defaults.lr,
            select=defaults.select, regression_loss=defaults.regression_loss,
            persist_optimizer=defaults.persist_optimizer)
        overrides = {"batch_size": self.batch_size, "max_rounds": self.max_rounds,
                     "patience": self.patience, "min_rounds": self.min_rounds,
                     "lr": self.lr, "select": self.select,
                     "regression_loss": self.regression_loss,
                     "persist_optimizer": self.persist_optimizer}
        config = replace(base, seed=seed, **{k: v for k, v in overrides.items() if v is not None})
        weighted = self.class_weighted
        if weighted is None:
            weighted = defaults is not None and defaults.class_weighted
        if weighted and clients is not None and dataset.task == "classification":
            config = replace(config, class_weights=class_weights(clients, n_outputs(dataset)))
        return config
