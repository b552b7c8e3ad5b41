"""FedAvg round implementations: each takes the global weights and a round index and
returns the sample-weighted average of every client's weights after one local epoch.

A round can be computed three ways that give the same result:

* :class:`BatchedRound` trains **all clients at once**: their parameters are stacked
  along a leading client dimension (one flat row per client) and the model's layers
  compute all clients together (see :mod:`fednorm.training.models`). MLPs take a
  hand-written forward and backward pass (:mod:`fednorm.training.mlp_step`); other
  networks get their stacked parameters swapped in with ``torch.func.functional_call``
  and ordinary autograd on the sum of the per-client losses, which yields every
  client's own gradient (clients share nothing). One call of torch's fused Adam kernel
  updates every client's row. Clients with fewer rows get padded batches whose padded
  rows are masked out of the loss and of batch-norm statistics; clients are ordered by
  their number of batches, so at each step the clients that still have a batch are a
  prefix of the stack and finished ones cost nothing.
* :class:`StackedRound`, which :class:`BatchedRound` is one run of, also stacks
  **several runs** that share a partition and an architecture (the study's input
  normalizations of one skew, client count and seed) and trains them as one batch,
  each with its own weights, features and (in :func:`train_stacked`) early stopping.
  The products are so small that their fixed costs dominate: a step of nine stacked
  runs took about three times one run's (13 vs 4.2 ms of CPU, Parkinson's MLP, 10
  clients; see ``bench/RESULTS.md``).
* :class:`SequentialRound` is the textbook loop, one client after another with an
  ``nn.Module`` and ``torch.optim.Adam``. It is the reference the batched path is tested
  against, and the baseline of :mod:`fednorm.bench.training`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call
from torch.optim.adam import adam

from fednorm.engine.errors import InputError
from fednorm.training import mlp_step
from fednorm.training.fedavg import (
    ClientTensors,
    State,
    Task,
    TrainConfig,
    batch_plan,
    task_loss,
)
from fednorm.training.mlp_step import MixedRuns, MLPStep
from fednorm.training.models import Dense, FedNet, update_running_stats


class BatchedRound:
    """One FedAvg round with every client's local epoch computed together (see module doc):
    a :class:`StackedRound` of one run."""

    def __init__(self, model: FedNet, data: ClientTensors, task: Task, config: TrainConfig):
        self.stack = StackedRound(model, [data], task, config)

    def __call__(self, state: State, round_index: int) -> tuple[State, float]:
        states, losses = self.stack([state], round_index)
        return states[0], losses[0]


class ParamLayout:
    """Where each parameter sits in a flat row of stacked parameters.

    Dense weights are stored transposed, (in, out), and handed to the model as the
    transposed view (see :class:`fednorm.training.models.Dense`); everything else is
    stored in its own shape.
    """

    def __init__(self, model: FedNet) -> None:
        dense = {f"{name}.weight" for name, module in model.named_modules()
                 if isinstance(module, Dense)}
        self.shapes = {name: (p.shape[::-1] if name in dense else p.shape)
                       for name, p in model.named_parameters()}
        self.transposed = dense & set(self.shapes)

    def flatten(self, state: State) -> Tensor:
        return torch.cat([self._stored(name, state[name].detach()).reshape(-1)
                          for name in self.shapes])

    def storage_views(self, flat: Tensor) -> State:
        """Views into flat rows: (slots, P) -> (slots, *stored shape), or P -> stored shape."""
        lead = flat.shape[:-1]
        views, offset = {}, 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            views[name] = flat[..., offset : offset + size].view(*lead, *shape)
            offset += size
        return views

    def model_views(self, stored: State) -> State:
        """Stored tensors as the model's parameters (Dense weights transposed back)."""
        return {name: self._stored(name, t) for name, t in stored.items()}

    def unflatten(self, flat: Tensor) -> State:
        """One flat row as an ordinary (contiguous) parameter dict."""
        return {name: t.contiguous() for name, t in
                self.model_views(self.storage_views(flat)).items()}

    def _stored(self, name: str, tensor: Tensor) -> Tensor:
        return tensor.transpose(-1, -2) if name in self.transposed else tensor


@dataclass
class AdamState:
    """Adam's moments (one row per slot) and step counts for a stacked round.

    Fresh moments every round give every slot that has a batch at step ``s`` the same
    step count (active slots are a prefix, see :class:`StackedRound`), so one shared step
    count and one fused-Adam call over the whole flat prefix suffice. Moments kept across
    rounds (``per_slot``) need a step count per slot, and a list of rows.
    """

    m: Tensor
    v: Tensor
    steps: Tensor
    per_slot: bool

    @classmethod
    def fresh(cls, flat: Tensor, per_slot: bool) -> AdamState:
        steps = torch.zeros(len(flat) if per_slot else 1, dtype=torch.float32)
        return cls(torch.zeros_like(flat), torch.zeros_like(flat), steps, per_slot)

    def step(self, params: Tensor, grad: Tensor, slots: int, config: TrainConfig) -> None:
        """``torch.optim.Adam``'s update of the first ``slots`` rows, through torch's
        functional fused Adam (the optimizer object's bookkeeping costs more than the
        update itself here)."""
        if self.per_slot:
            lists = [list(t.unbind(0)) for t in (params, grad, self.m[:slots],
                                                  self.v[:slots], self.steps[:slots])]
        else:
            lists = [[params], [grad], [self.m[:slots]], [self.v[:slots]], [self.steps]]
        param_list, grad_list, m_list, v_list, step_list = lists
        adam(param_list, grad_list, m_list, v_list, [], step_list, fused=True, amsgrad=False,
             maximize=False, weight_decay=0.0, lr=config.lr, beta1=config.betas[0],
             beta2=config.betas[1], eps=config.eps)


def _tile(per_run: Tensor, clients: int) -> Tensor:
    """(runs, ...) -> (clients · runs, ...), client-major."""
    return per_run.repeat(clients, *[1] * (per_run.dim() - 1))


class StackedRound:
    """One FedAvg round of several **runs** at once, every client of every run together.

    The runs share their clients' row counts, targets and batch plan and the model's
    architecture (the study's input normalizations of one partition, for instance) and
    differ in their features and weights. Slots are client-major: slot ``c · R + r`` is
    client ``c`` (in batch-count order) of run ``r``, so the slots that still have a batch
    at a step are a prefix of the stack, as in :class:`BatchedRound`. Runs share nothing
    but the dropout masks, which are drawn once per client and step (the same draws each
    run would make alone: every run starts from the same seed and draws the same shapes).
    A call trains any subset of the runs, so runs that stopped early cost nothing.

    ``model`` is the runs' network, or one network per run: MLPs may then differ in
    their activation norm (one stack for all the study's normalizations of a partition;
    see :class:`fednorm.training.mlp_step.MixedRuns`), other networks must be identical.
    """

    def __init__(self, model: FedNet | Sequence[FedNet], runs: Sequence[ClientTensors],
                 task: Task, config: TrainConfig):
        models = [model] * len(runs) if isinstance(model, FedNet) else list(model)
        if len(models) != len(runs):
            raise InputError("one network per stacked run is needed")
        self.mixed = MixedRuns(models) if all(map(mlp_step.supports, models)) else None
        model = self.mixed.reference if self.mixed is not None else models[0]
        first = runs[0]
        for other in runs[1:]:
            if other.sizes != first.sizes or not torch.equal(other.y, first.y):
                raise InputError("stacked runs must share their clients' rows and targets")
        self.model, self.task, self.config = model, task, config
        self.sizes, self.y = first.sizes, first.y
        self.features = torch.stack([run.X for run in runs], dim=1)  # (rows, runs, features)
        n_batches = np.array([math.ceil(n / config.batch_size) for n in self.sizes])
        self.order = np.argsort(-n_batches, kind="stable")  # most batches first
        sizes = np.asarray(self.sizes, dtype=np.float64)[self.order]
        self.weights = torch.tensor(sizes / sizes.sum(), dtype=first.X.dtype)
        self.offsets = first.offsets
        self.layout = ParamLayout(model)
        self.manual = MLPStep(model, self.mixed) if self.mixed is not None else None
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self.stat_names = model.running_stat_names()
        self.saved_adam: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    @property
    def n_runs(self) -> int:
        return self.features.shape[1]

    def __call__(self, states: Sequence[State], round_index: int,
                 runs: Sequence[int] | None = None) -> tuple[list[State], list[float]]:
        """Train ``runs`` (default all) from their global ``states``; returns each run's
        merged state and mean training loss."""
        runs = list(range(self.n_runs)) if runs is None else list(runs)
        if len(states) != len(runs):
            raise InputError("one global state per stacked run is needed")
        self.model.train()
        clients, width = len(self.order), len(runs)
        rows, mask, active = self._padded_plan(round_index)
        features = self.features[:, runs] if width < self.n_runs else self.features
        states = [self._to_union(run, state) for run, state in zip(runs, states, strict=True)]
        flat = torch.stack([self.layout.flatten(s) for s in states])
        flat = flat.expand(clients, *flat.shape).reshape(clients * width, -1).contiguous()
        buffers = {n: _tile(torch.stack([s[n] for s in states]), clients)
                   for n in self.buffer_names}
        adam_state = self._adam_state(runs, flat)
        loss_sum = torch.zeros(clients * width, dtype=flat.dtype)
        for step, k in enumerate(active):
            loss_sum[: k * width] += self._step(
                flat, adam_state, buffers, features, rows[:k, step], mask[:k, step], runs)
        self._keep_adam(runs, adam_state)
        merged = torch.tensordot(self.weights, flat.view(clients, width, -1), dims=1)
        merged_buffers = {n: torch.tensordot(self.weights, b.view(clients, width, *b.shape[1:]),
                                             dims=1) for n, b in buffers.items()}
        run_losses = loss_sum.view(clients, width).sum(0) / sum(self.sizes)
        return ([self._from_union(run, {**self.layout.unflatten(merged[i]),
                                        **{n: b[i] for n, b in merged_buffers.items()}})
                 for i, run in enumerate(runs)], [float(loss) for loss in run_losses])

    def _to_union(self, run: int, state: State) -> State:
        return state if self.mixed is None else self.mixed.to_union(run, state)

    def _from_union(self, run: int, state: State) -> State:
        return state if self.mixed is None else self.mixed.from_union(run, state)

    def _step(self, flat: Tensor, adam_state: AdamState, buffers: State, features: Tensor,
              rows: Tensor, mask: Tensor, runs: list[int]) -> Tensor:
        """One mini-batch of the first ``k`` clients of every run; returns each slot's
        summed loss."""
        k, width = len(rows), len(runs)
        slots = k * width
        batch = features[rows].transpose(1, 2).reshape(slots, rows.shape[1], -1)
        slot_mask = mask.repeat_interleave(width, dim=0)
        targets = self.y[rows].repeat_interleave(width, dim=0)
        head = {n: b[:slots] for n, b in buffers.items()}
        if self.manual is not None:
            losses, stats, grad = self.manual(self.layout.storage_views(flat[:slots]), batch,
                                              slot_mask, targets, self.task, runs, self.config)
        else:
            losses, stats, grad = self._autograd_step(flat[:slots], head, batch, slot_mask,
                                                      targets, width)
        with torch.no_grad():
            adam_state.step(flat[:slots], grad, slots, self.config)
            update_running_stats(head, self.stat_names, stats)
        return losses.sum(1)

    def _autograd_step(self, flat: Tensor, head: State, batch: Tensor, slot_mask: Tensor,
                       targets: Tensor, width: int) -> tuple[Tensor, tuple, Tensor]:
        """Masked per-row losses, batch statistics and the flat gradient rows, through
        ``functional_call`` and autograd (any :class:`FedNet`)."""
        slots = len(flat)
        # One leaf per parameter (views of the flat rows): a leaf that is a slice would
        # make backward build a full-size gradient for every parameter.
        leaves = {n: p.detach().requires_grad_() for n, p in
                  self.layout.storage_views(flat).items()}
        output, stats = functional_call(
            self.model, {**self.layout.model_views(leaves), **head}, (batch, slot_mask, width))
        losses = task_loss(output, targets, self.task, self.config) * slot_mask
        grads = torch.autograd.grad((losses.sum(1) / slot_mask.sum(1)).sum(),
                                    list(leaves.values()))
        return (losses.detach(), stats,
                torch.cat([g.reshape(slots, -1) for g in grads], 1))

    def _adam_state(self, runs: list[int], flat: Tensor) -> AdamState:
        """Fresh moments, or (``persist_optimizer``) the runs' own from earlier rounds."""
        state = AdamState.fresh(flat, per_slot=self.config.persist_optimizer)
        if self.config.persist_optimizer and all(r in self.saved_adam for r in runs):
            clients = len(self.order)
            for index, tensor in enumerate((state.m, state.v, state.steps)):
                saved = torch.stack([self.saved_adam[r][index] for r in runs], dim=1)
                tensor.copy_(saved.reshape(clients * len(runs), *saved.shape[2:]))
        return state

    def _keep_adam(self, runs: list[int], state: AdamState) -> None:
        if not self.config.persist_optimizer:
            return
        clients = len(self.order)
        views = [t.view(clients, len(runs), *t.shape[1:]) for t in (state.m, state.v, state.steps)]
        for position, run in enumerate(runs):
            self.saved_adam[run] = tuple(v[:, position].clone() for v in views)

    def _padded_plan(self, round_index: int) -> tuple[Tensor, Tensor, list[int]]:
        """Global row indices (client, step, slot), the real-row mask, and active counts.

        ``active[s]`` is how many clients (a prefix, by the batch-count order) have a
        batch at step ``s``.
        """
        config = self.config
        plan = batch_plan(self.sizes, config.batch_size, config.seed, round_index)
        steps = len(plan[self.order[0]])
        rows = np.zeros((len(plan), steps, config.batch_size), dtype=np.int64)
        mask = np.zeros(rows.shape, dtype=np.float32)
        for slot, client in enumerate(self.order):
            for step, batch in enumerate(plan[client]):
                rows[slot, step, : len(batch)] = self.offsets[client] + batch
                mask[slot, step, : len(batch)] = 1.0
        active = [int(n) for n in (mask.sum(axis=2) > 0).sum(axis=0)]
        return torch.from_numpy(rows), torch.from_numpy(mask).to(self.features.dtype), active


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
                losses = task_loss(output, data.y[rows], self.task, config)
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
