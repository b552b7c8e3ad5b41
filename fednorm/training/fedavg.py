"""FedAvg: one local epoch of Adam per client per round, sample-weighted averaging, and
early stopping on the server's validation loss.

A round is computed by one of the round implementations in :mod:`fednorm.training.rounds`
(all clients at once, several runs stacked, or the textbook client-after-client loop);
this module holds what they share and the loop that runs them.

Adam's state is **reset for every client at every round** by default: a client is a
stateless participant that receives the global model and returns an update, as in
Flower's client model (the paper's framework) and in cross-device FL, where the same
client rarely returns; moment estimates made for last round's local model would also be
stale for the new global one. ``persist_optimizer=True`` keeps each client's Adam state
across rounds instead.

Mini-batch order comes from :func:`batch_plan`, seeded by (seed, round, client), so both
paths see identical batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fednorm.engine.errors import InputError
from fednorm.training.grid import RegressionLoss, Selection
from fednorm.training.mlp_step import row_weights
from fednorm.training.models import FedNet

if TYPE_CHECKING:
    from fednorm.training.rounds import StackedRound

State = dict[str, Tensor]
Task = str  # "classification" | "regression"
RoundFn = Callable[[State, int], tuple[State, float]]

EVAL_CHUNK = 4096  # rows per forward pass when evaluating (bounds memory on images)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one federated training run."""

    batch_size: int = 8
    max_rounds: int = 150
    patience: int = 7
    # Early stopping may not end a run before this many rounds (0: from the first round).
    # Why: on HCV the validation loss is lowest after ~10 rounds, while the network
    # still predicts the majority class, so patience alone stops it there.
    min_rounds: int = 0
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    min_delta: float = 1e-5  # a validation loss must improve by this much to count
    persist_optimizer: bool = False
    seed: int = 0
    regression_loss: RegressionLoss = "mae"
    # Per-class weights of the cross-entropy (None: every row counts 1), see task_loss.
    class_weights: tuple[float, ...] | None = None
    # Which validation round's weights are kept: the lowest loss, or (classification)
    # the highest F1; stopping always follows the validation loss (see EarlyStopping).
    select: Selection = "loss"


@dataclass
class ClientTensors:
    """All clients' training rows, concatenated client after client."""

    X: Tensor
    y: Tensor
    sizes: list[int]

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)


@dataclass
class TrainOutcome:
    """Best-validation global weights and the history that chose them."""

    state: State
    best_val_loss: float  # the lowest validation loss seen (what stopping follows)
    best_round: int  # the kept weights' round; 0 = the initial weights were never beaten
    rounds: int
    val_losses: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    val_scores: list[float] = field(default_factory=list)  # validation F1 (select="f1")


def batch_plan(sizes: list[int], batch_size: int, seed: int, round_index: int) -> list[list]:
    """Each client's mini-batches (local row indices) for one epoch of ``round_index``."""
    plan = []
    for client, n_rows in enumerate(sizes):
        order = np.random.default_rng([seed, round_index, client]).permutation(n_rows)
        plan.append([order[i : i + batch_size] for i in range(0, n_rows, batch_size)])
    return plan


def task_loss(output: Tensor, target: Tensor, task: Task, config: TrainConfig) -> Tensor:
    """Per-row loss: cross-entropy for classification (times the row's class weight when
    ``config.class_weights`` is set), absolute or squared error for regression."""
    if task == "classification":
        losses = F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1),
                                 reduction="none").reshape(target.shape)
        return losses * row_weights(target, config)
    error = output.squeeze(-1) - target
    return error.abs() if config.regression_loss == "mae" else error**2



def clone_state(state: State) -> State:
    return {name: tensor.detach().clone() for name, tensor in state.items()}


@torch.no_grad()
def predict(model: FedNet, state: State, X: Tensor) -> Tensor:
    """The global model's outputs on ``X`` (evaluation mode, in chunks)."""
    model.eval()
    try:
        chunks = [functional_call(model, state, (X[i : i + EVAL_CHUNK],))[0]
                  for i in range(0, len(X), EVAL_CHUNK)]
    finally:
        model.train()
    return torch.cat(chunks)


def mean_loss(output: Tensor, target: Tensor, task: Task, config: TrainConfig) -> float:
    return float(task_loss(output, target, task, config).mean()) if len(target) else math.nan


class EarlyStopping:
    """One run's best-validation bookkeeping: stops after ``patience`` rounds without a
    validation-loss improvement of at least ``min_delta`` (the paper's rule), but not
    before round ``config.min_rounds``, and keeps
    the weights of the round with the lowest validation loss or, with
    ``config.select`` ``"f1"`` or ``"macro_f1"``, the highest validation F1 or macro-F1
    (ties: the earlier round).

    Why F1 selection exists: on HCV (87% one class) the validation loss reaches its
    minimum while the network still predicts the majority class for every row (it
    overfits the few rows of the rare classes soon after), so the lowest-loss weights
    are a majority-class predictor even where later rounds separate the classes.
    """

    def __init__(self, initial: State, config: TrainConfig) -> None:
        self.outcome = TrainOutcome(clone_state(initial), math.inf, 0, 0)
        self.config = config
        self.waited = 0
        self.stopped = False
        self.best_score = -math.inf

    def record(self, round_index: int, state: State, train_loss: float, val_loss: float,
               val_score: float | None = None) -> None:
        outcome = self.outcome
        outcome.rounds = round_index + 1
        outcome.train_losses.append(train_loss)
        outcome.val_losses.append(val_loss)
        improved = val_loss < outcome.best_val_loss - self.config.min_delta
        if improved:
            outcome.best_val_loss, self.waited = val_loss, 0
        else:
            self.waited += 1
        self.stopped = (self.waited >= self.config.patience
                        and outcome.rounds >= self.config.min_rounds)
        if val_score is not None:
            outcome.val_scores.append(val_score)
            keep = val_score > self.best_score
            self.best_score = max(self.best_score, val_score)
        else:
            keep = improved
        if keep:
            outcome.state, outcome.best_round = clone_state(state), round_index + 1


def validation_score(output: Tensor, target: Tensor, task: Task, config: TrainConfig
                     ) -> float | None:
    """The validation F1 (``select="f1"``) or macro-F1 (``"macro_f1"``) that selects the
    kept weights; None when selecting by loss."""
    if config.select == "loss" or task != "classification":
        return None
    from fednorm.training.metrics import f1

    return f1(target.numpy(), output.numpy(), macro=config.select == "macro_f1")


def validate(model: FedNet, state: State, val: tuple[Tensor, Tensor], task: Task,
             config: TrainConfig) -> tuple[float, float | None]:
    """Validation loss and (if selecting by it) validation F1 of ``state``."""
    output = predict(model, state, val[0])
    return mean_loss(output, val[1], task, config), validation_score(output, val[1], task,
                                                                       config)


def train_federated(
    model: FedNet,
    round_fn: RoundFn,
    val: tuple[Tensor, Tensor],
    task: Task,
    config: TrainConfig,
) -> TrainOutcome:
    """Run FedAvg rounds until the validation loss stops improving for ``patience`` rounds.

    Returns the global weights of the best validation round (see :class:`EarlyStopping`),
    which the test set is evaluated on.
    """
    state = clone_state(model.state_dict())
    stopping = EarlyStopping(state, config)
    for round_index in range(config.max_rounds):
        state, train_loss = round_fn(state, round_index)
        stopping.record(round_index, state, train_loss, *validate(model, state, val, task,
                                                                   config))
        if stopping.stopped:
            break
    return stopping.outcome


def train_stacked(
    models: Sequence[FedNet],
    stack: StackedRound,
    initial: Sequence[State],
    vals: Sequence[tuple[Tensor, Tensor]],
    task: Task,
    config: TrainConfig,
) -> list[TrainOutcome]:
    """:func:`train_federated` for every run of ``stack`` at once, each run with its own
    initial weights, validation rows and early stopping; a run that has stopped leaves
    the stack, so the others' rounds get cheaper. ``models`` (one per run) evaluate the
    runs' validation loss."""
    if not len(models) == len(initial) == len(vals) == stack.n_runs:
        raise InputError("one network, initial state and validation set per stacked run")
    states = [clone_state(state) for state in initial]
    stoppings = [EarlyStopping(state, config) for state in states]
    for round_index in range(config.max_rounds):
        running = [run for run, stopping in enumerate(stoppings) if not stopping.stopped]
        if not running:
            break
        new_states, train_losses = stack([states[r] for r in running], round_index, running)
        for run, state, train_loss in zip(running, new_states, train_losses, strict=True):
            states[run] = state
            stoppings[run].record(round_index, state, train_loss,
                                  *validate(models[run], state, vals[run], task, config))
    return [stopping.outcome for stopping in stoppings]
