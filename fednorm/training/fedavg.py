"""FedAvg: one local epoch of Adam per client per round, sample-weighted averaging, and
early stopping on the server's validation loss.

A round can be computed two ways that give the same result:

* :class:`BatchedRound` trains **all clients at once**: their parameters are stacked
  along a leading client dimension (one flat row per client) and swapped into the model
  with ``torch.func.functional_call``; the model's layers compute all clients together
  (see :mod:`fednorm.training.models`). Ordinary autograd on the sum of the per-client
  losses yields every client's own gradient (clients share nothing), and one call of
  torch's fused Adam kernel updates every client's row. Clients with fewer rows get
  padded batches whose padded rows are masked out of the loss and of batch-norm
  statistics; clients are ordered by their number of batches, so at each step the
  clients that still have a batch are a prefix of the stack and finished ones cost
  nothing (Adam skips rows without a gradient).
* :class:`SequentialRound` is the textbook loop, one client after another with an
  ``nn.Module`` and ``torch.optim.Adam``. It is the reference the batched path is tested
  against, and the baseline of ``bench/bench_training.py``.

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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call
from torch.optim.adam import adam

from fednorm.training.models import FedNet, update_running_stats

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
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    min_delta: float = 1e-5  # a validation loss must improve by this much to count
    persist_optimizer: bool = False
    seed: int = 0


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
    best_val_loss: float
    best_round: int  # 0 = the initial weights were never beaten
    rounds: int
    val_losses: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)


def batch_plan(sizes: list[int], batch_size: int, seed: int, round_index: int) -> list[list]:
    """Each client's mini-batches (local row indices) for one epoch of ``round_index``."""
    plan = []
    for client, n_rows in enumerate(sizes):
        order = np.random.default_rng([seed, round_index, client]).permutation(n_rows)
        plan.append([order[i : i + batch_size] for i in range(0, n_rows, batch_size)])
    return plan


def task_loss(output: Tensor, target: Tensor, task: Task) -> Tensor:
    """Per-row loss: cross-entropy for classification, absolute error for regression."""
    if task == "classification":
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1),
                               reduction="none").reshape(target.shape)
    return (output.squeeze(-1) - target).abs()


def clone_state(state: State) -> State:
    return {name: tensor.detach().clone() for name, tensor in state.items()}


class BatchedRound:
    """One FedAvg round with every client's local epoch computed together (see module doc)."""

    def __init__(self, model: FedNet, data: ClientTensors, task: Task, config: TrainConfig):
        self.model, self.data, self.task, self.config = model, data, task, config
        n_batches = np.array([math.ceil(n / config.batch_size) for n in data.sizes])
        self.order = np.argsort(-n_batches, kind="stable")  # most batches first
        sizes = np.asarray(data.sizes, dtype=np.float64)[self.order]
        self.weights = torch.tensor(sizes / sizes.sum(), dtype=data.X.dtype)
        self.shapes = {name: p.shape for name, p in model.named_parameters()}
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self.stat_names = model.running_stat_names()
        # Every client's parameters as one row of a flat matrix, with Adam's two moments
        # and step count beside it; torch's fused Adam kernel updates all rows in one call.
        n_params = sum(math.prod(shape) for shape in self.shapes.values())
        self.flat = torch.zeros(len(self.order), n_params, dtype=data.X.dtype)
        self.moments = torch.zeros(2, *self.flat.shape, dtype=data.X.dtype)
        self.steps = torch.zeros(len(self.order), dtype=torch.float32)
        self.rows, self.m_rows, self.v_rows, self.step_rows = (
            list(t.unbind(0)) for t in (self.flat, *self.moments, self.steps))
        self.adam_started = False

    def __call__(self, state: State, round_index: int) -> tuple[State, float]:
        self.model.train()
        rows, mask, active = self._padded_plan(round_index)
        self.flat.copy_(self._flatten(state).expand_as(self.flat))
        buffers = {n: torch.stack([state[n]] * len(self.order)) for n in self.buffer_names}
        self._reset_adam()
        loss_sum = torch.zeros(len(self.order), dtype=self.flat.dtype)
        for step, k in enumerate(active):
            loss_sum[:k] += self._step(k, rows[:k, step], mask[:k, step], buffers)
        merged = self._unflatten(self.weights @ self.flat)
        merged.update({n: torch.tensordot(self.weights, b, dims=1) for n, b in buffers.items()})
        return merged, float(loss_sum.sum()) / sum(self.data.sizes)

    def _step(self, k: int, rows: Tensor, mask: Tensor, buffers: State) -> Tensor:
        """One mini-batch of the first ``k`` clients; returns each one's summed loss."""
        # One leaf per parameter (views of the flat rows): a leaf that is a slice would
        # make backward build a full-size gradient for every parameter.
        leaves = {n: p.detach().requires_grad_() for n, p in
                  self._unflatten(self.flat[:k]).items()}
        head = {n: b[:k] for n, b in buffers.items()}
        output, stats = functional_call(self.model, {**leaves, **head},
                                        (self.data.X[rows], mask))
        losses = task_loss(output, self.data.y[rows], self.task) * mask
        client_losses = losses.sum(1) / mask.sum(1)
        grads = torch.autograd.grad(client_losses.sum(), list(leaves.values()))
        with torch.no_grad():
            self._adam_step(k, torch.cat([g.reshape(k, -1) for g in grads], dim=1))
            update_running_stats(head, self.stat_names, stats)
        return losses.detach().sum(1)

    def _reset_adam(self) -> None:
        """Fresh moments every round, or once (the first round) when they persist."""
        if not self.adam_started or not self.config.persist_optimizer:
            self.moments.zero_()
            self.steps.zero_()
            self.adam_started = True

    def _adam_step(self, k: int, grad: Tensor) -> None:
        """``torch.optim.Adam``'s update of the first ``k`` clients' rows, each with its own
        moments and step count, through torch's functional Adam (the optimizer object's
        bookkeeping costs more than the update itself here)."""
        config = self.config
        adam(self.rows[:k], list(grad.unbind(0)), self.m_rows[:k], self.v_rows[:k], [],
             self.step_rows[:k], fused=True, amsgrad=False, maximize=False, weight_decay=0.0,
             lr=config.lr, beta1=config.betas[0], beta2=config.betas[1], eps=config.eps)

    def _flatten(self, state: State) -> Tensor:
        return torch.cat([state[name].detach().reshape(-1) for name in self.shapes])

    def _unflatten(self, flat: Tensor) -> State:
        """Parameter views into flat rows: (clients, P) -> (clients, *shape), or P -> shape."""
        lead = flat.shape[:-1]
        views, offset = {}, 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            views[name] = flat[..., offset : offset + size].view(*lead, *shape)
            offset += size
        return views

    def _padded_plan(self, round_index: int) -> tuple[Tensor, Tensor, list[int]]:
        """Global row indices (client, step, slot), the real-row mask, and active counts.

        ``active[s]`` is how many clients (a prefix, by the batch-count order) have a
        batch at step ``s``.
        """
        config = self.config
        plan = batch_plan(self.data.sizes, config.batch_size, config.seed, round_index)
        steps = len(plan[self.order[0]])
        rows = np.zeros((len(plan), steps, config.batch_size), dtype=np.int64)
        mask = np.zeros(rows.shape, dtype=np.float32)
        offsets = self.data.offsets
        for slot, client in enumerate(self.order):
            for step, batch in enumerate(plan[client]):
                rows[slot, step, : len(batch)] = offsets[client] + batch
                mask[slot, step, : len(batch)] = 1.0
        active = [int(n) for n in (mask.sum(axis=2) > 0).sum(axis=0)]
        return torch.from_numpy(rows), torch.from_numpy(mask).to(self.data.X.dtype), active


class SequentialRound:
    """One FedAvg round, client after client, with ``torch.optim.Adam`` (the reference)."""

    def __init__(self, model: FedNet, data: ClientTensors, task: Task, config: TrainConfig):
        self.model, self.data, self.task, self.config = model, data, task, config
        total = sum(data.sizes)
        self.weights = [n / total for n in data.sizes]
        self.stat_names = model.running_stat_names()
        self.optimizers: dict[int, torch.optim.Adam] = {}

    def __call__(self, state: State, round_index: int) -> tuple[State, float]:
        config, data, model = self.config, self.data, self.model
        model.train()
        plan = batch_plan(data.sizes, config.batch_size, config.seed, round_index)
        merged = {name: torch.zeros_like(t) for name, t in state.items()}
        loss_sum = 0.0
        for client, batches in enumerate(plan):
            model.load_state_dict(state)
            optimizer = self._optimizer(client)
            buffers = dict(model.named_buffers())
            for batch in batches:
                rows = torch.from_numpy(data.offsets[client] + batch)
                output, stats = model(data.X[rows])
                losses = task_loss(output, data.y[rows], self.task)
                optimizer.zero_grad()
                losses.mean().backward()
                optimizer.step()
                update_running_stats(buffers, self.stat_names, stats)
                loss_sum += float(losses.detach().sum())
            for name, tensor in model.state_dict().items():
                merged[name] += self.weights[client] * tensor
        return merged, loss_sum / sum(data.sizes)

    def _optimizer(self, client: int) -> torch.optim.Adam:
        """A fresh Adam, or this client's own one kept from earlier rounds.

        A kept optimizer still points at the shared model's parameters, into which each
        round loads the global weights, so only its moments carry over.
        """
        if not self.config.persist_optimizer or client not in self.optimizers:
            self.optimizers[client] = torch.optim.Adam(
                self.model.parameters(), lr=self.config.lr, betas=self.config.betas,
                eps=self.config.eps,
            )
        return self.optimizers[client]


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


def mean_loss(output: Tensor, target: Tensor, task: Task) -> float:
    return float(task_loss(output, target, task).mean()) if len(target) else math.nan


def train_federated(
    model: FedNet,
    round_fn: RoundFn,
    val: tuple[Tensor, Tensor],
    task: Task,
    config: TrainConfig,
) -> TrainOutcome:
    """Run FedAvg rounds until the validation loss stops improving for ``patience`` rounds.

    Returns the global weights of the best validation round, which the test set is
    evaluated on (not the last round's, which early stopping has let get worse).
    """
    state = clone_state(model.state_dict())
    outcome = TrainOutcome(clone_state(state), math.inf, 0, 0)
    waited = 0
    for round_index in range(config.max_rounds):
        state, train_loss = round_fn(state, round_index)
        val_loss = mean_loss(predict(model, state, val[0]), val[1], task)
        outcome.rounds = round_index + 1
        outcome.train_losses.append(train_loss)
        outcome.val_losses.append(val_loss)
        if val_loss < outcome.best_val_loss - config.min_delta:
            outcome.state, outcome.best_val_loss = clone_state(state), val_loss
            outcome.best_round, waited = round_index + 1, 0
        else:
            waited += 1
            if waited >= config.patience:
                break
    return outcome
