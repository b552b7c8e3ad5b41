"""FedAvg round implementations: each takes the global weights and a round index and
returns the sample-weighted average of every client's weights after one local epoch.

A round can be computed three ways that give the same result:

* :class:`BatchedRound` trains **all clients at once**: their parameters are stacked
  along a leading client dimension (one row per client, in segments:
  :mod:`fednorm.training.stack_params`) and the model's layers compute all clients
  together (see :mod:`fednorm.training.models`). MLPs take a
  hand-written forward and backward pass (:mod:`fednorm.training.mlp_step`); other
  networks get their stacked parameters swapped in with ``torch.func.functional_call``
  and ordinary autograd on the sum of the per-client losses, which yields every
  client's own gradient (clients share nothing). One call of torch's fused Adam kernel
  updates every client's row, segment by segment. Clients with fewer rows get padded
  batches whose padded rows are masked out of the loss and of batch-norm statistics;
  clients are ordered by their number of batches, so at each step the clients that
  still have a batch are a prefix of the stack and finished ones cost nothing.
* :class:`StackedRound`, which :class:`BatchedRound` is one run of, also stacks
  **several runs** that share an architecture and trains them as one batch, each with
  its own weights, features and (in :func:`train_stacked`) early stopping: the runs of
  one federation (the study's input normalizations of one partition) share its clients,
  and several federations (the partitions of one dataset and seed, their central
  models) can share a stack (:mod:`fednorm.training.slots`).
  The products are so small that their fixed costs dominate: a step of nine stacked
  runs took about three times one run's (13 vs 4.2 ms of CPU, Parkinson's MLP, 10
  clients; see ``bench/RESULTS.md``).
* :class:`SequentialRound` is the textbook loop, one client after another with an
  ``nn.Module`` and ``torch.optim.Adam``. It is the reference the batched path is tested
  against, and the baseline of :mod:`fednorm.bench.training`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call

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
from fednorm.training.models import FedNet, SharedDropout, update_running_stats
from fednorm.training.slots import Federation, SlotPlan, StepSlots
from fednorm.training.stack_params import AdamState, ParamLayout, Segments


class BatchedRound:
    """One FedAvg round with every client's local epoch computed together (see module doc):
    a :class:`StackedRound` of one run."""

    def __init__(self, model: FedNet, data: ClientTensors, task: Task, config: TrainConfig):
        self.stack = StackedRound(model, [data], task, config)

    def __call__(self, state: State, round_index: int) -> tuple[State, float]:
        states, losses = self.stack([state], round_index)
        return states[0], losses[0]


class StackedRound:
    """One FedAvg round of several **runs** at once, every client of every run together.

    Each run has its own weights and features; runs of one federation share their
    clients' row counts, targets and batch plan (the study's input normalizations of one
    partition), runs of different federations share nothing but the network's shape
    (the partitions of one dataset and seed, and their central models). One slot per
    client and run, laid out as :mod:`fednorm.training.slots` describes, so the slots that
    still have a batch at a step are a prefix of the stack. Runs share nothing but their
    federation's dropout masks (the draws each would make alone). A call trains any
    subset of the runs, so runs that stopped early cost nothing.

    ``model`` is the runs' network, or one network per run: MLPs may then differ in
    their activation norm (see :class:`fednorm.training.mlp_step.MixedRuns`), other
    networks must be identical. ``federations`` names each run's federation (default:
    all one).
    """

    def __init__(self, model: FedNet | Sequence[FedNet], runs: Sequence[ClientTensors],
                 task: Task, config: TrainConfig, federations: Sequence[int] | None = None):
        models = [model] * len(runs) if isinstance(model, FedNet) else list(model)
        names = [0] * len(runs) if federations is None else list(federations)
        if not len(models) == len(names) == len(runs):
            raise InputError("one network and one federation per stacked run are needed")
        self.mixed = MixedRuns(models) if all(map(mlp_step.supports, models)) else None
        model = self.mixed.reference if self.mixed is not None else models[0]
        members: dict[int, list[int]] = {}
        for run, name in enumerate(names):
            members.setdefault(name, []).append(run)
        for fed_runs in members.values():
            first = runs[fed_runs[0]]
            if any(runs[r].sizes != first.sizes or not torch.equal(runs[r].y, first.y)
                   for r in fed_runs[1:]):
                raise InputError("stacked runs must share their clients' rows and targets")
        self.model, self.task, self.config = model, task, config
        self.federations = [Federation.of(runs[fed_runs[0]], fed_runs, config)
                            for fed_runs in members.values()]
        self.features = torch.cat([run.X for run in runs])  # run after run
        self.targets = torch.cat([run.y for run in runs])  # the same rows' targets
        self.row_offsets = np.cumsum([0, *(len(run.X) for run in runs)])[:-1].tolist()
        self.n_runs = len(runs)
        self.layout = ParamLayout(model, split=not config.persist_optimizer)
        self.manual = MLPStep(model, self.mixed) if self.mixed is not None else None
        self.has_dropout = any(isinstance(layer, SharedDropout) and layer.p
                               for layer in model.layers)
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self.stat_names = model.running_stat_names()
        self.saved_adam: dict[int, tuple[Tensor, ...]] = {}

    def __call__(self, states: Sequence[State], round_index: int,
                 runs: Sequence[int] | None = None) -> tuple[list[State], list[float]]:
        """Train ``runs`` (default all) from their global ``states``; returns each run's
        merged state and mean training loss."""
        runs = list(range(self.n_runs)) if runs is None else list(runs)
        if len(states) != len(runs):
            raise InputError("one global state per stacked run is needed")
        self.model.train()
        plan = SlotPlan(self.federations, runs, self.row_offsets, self.config, round_index,
                        self.features.dtype)
        states = [self._to_union(run, state) for run, state in zip(runs, states, strict=True)]
        segments = self.layout.stack([self.layout.flatten(s) for s in states], plan.slot_run)
        buffers = {n: torch.stack([s[n] for s in states])[plan.slot_run]
                   for n in self.buffer_names}
        adam_state = self._adam_state(plan, segments)
        norm_slots = (self.mixed.norm_slots(np.asarray(runs)[plan.slot_run.numpy()])
                      if self.manual is not None and self.manual.mixed is not None else [])
        loss_sum = torch.zeros(len(plan.slot_run), dtype=segments[0].dtype)
        for step, count in enumerate(plan.active):
            slots = StepSlots(count, plan.dropout(step, count) if self.has_dropout else None,
                              [(norm, torch.from_numpy(index[: np.searchsorted(index, count)]))
                               for norm, index in norm_slots])
            loss_sum[:count] += self._step(segments, adam_state, buffers, plan.rows(step, count),
                                           slots)
        self._keep_adam(plan, adam_state)
        return self._merge(plan, segments, buffers, loss_sum)

    def _merge(self, plan: SlotPlan, segments: Segments, buffers: State, loss_sum: Tensor
               ) -> tuple[list[State], list[float]]:
        """FedAvg within each federation: its clients' rows, weighted by their sizes."""
        merged: dict[int, tuple[State, float]] = {}
        for block in plan.blocks:
            fed, slots, shape = block.federation, block.slots, block.shape
            weights = [torch.tensordot(fed.weights, b[slots].view(*shape, -1), dims=1)
                       for b in segments]
            averaged = {n: torch.tensordot(fed.weights, b[slots].view(*shape, *b.shape[1:]),
                                           dims=1) for n, b in buffers.items()}
            losses = loss_sum[slots].view(shape).sum(0) / sum(fed.sizes)
            for i, run in enumerate(block.runs):
                state = {**self.layout.unflatten([w[i] for w in weights]),
                         **{n: b[i] for n, b in averaged.items()}}
                merged[run] = (self._from_union(run, state), float(losses[i]))
        return [merged[run][0] for run in plan.runs], [merged[run][1] for run in plan.runs]

    def _to_union(self, run: int, state: State) -> State:
        return state if self.mixed is None else self.mixed.to_union(run, state)

    def _from_union(self, run: int, state: State) -> State:
        return state if self.mixed is None else self.mixed.from_union(run, state)

    def _step(self, segments: Segments, adam_state: AdamState, buffers: State,
              rows: tuple[Tensor, Tensor], slots: StepSlots) -> Tensor:
        """One mini-batch of the first ``slots.count`` slots; returns each slot's summed
        loss."""
        count = slots.count
        index, slot_mask = rows
        batch, targets = self.features[index], self.targets[index]
        head = {n: b[:count] for n, b in buffers.items()}
        params = [segment[:count] for segment in segments]
        if self.manual is not None:
            losses, stats, grads = self.manual(self.layout.storage_views(params), batch,
                                               slot_mask, targets, self.task, slots,
                                               self.config)
            grad = self.layout.gradient_segments(grads)
        else:
            losses, stats, grad = self._autograd_step(params, head, batch, slot_mask,
                                                      targets, slots)
        with torch.no_grad():
            adam_state.step(params, grad, count, self.config)
            update_running_stats(head, self.stat_names, stats)
        return losses.sum(1)

    def _autograd_step(self, params: Segments, head: State, batch: Tensor, slot_mask: Tensor,
                       targets: Tensor, slots: StepSlots) -> tuple[Tensor, tuple, Tensor]:
        """Masked per-row losses, batch statistics and the gradient segments, through
        ``functional_call`` and autograd (any :class:`FedNet`)."""
        # One leaf per parameter (views of the segments): a leaf that is a slice would
        # make backward build a full-size gradient for every parameter.
        leaves = {n: p.detach().requires_grad_() for n, p in
                  self.layout.storage_views(params).items()}
        output, stats = functional_call(
            self.model, {**self.layout.model_views(leaves), **head},
            (batch, slot_mask, slots.dropout))
        losses = task_loss(output, targets, self.task, self.config) * slot_mask
        grads = torch.autograd.grad((losses.sum(1) / slot_mask.sum(1)).sum(),
                                    list(leaves.values()))
        return losses.detach(), stats, self.layout.gradient_segments(grads)

    def _adam_state(self, plan: SlotPlan, segments: Segments) -> AdamState:
        """Fresh moments, or (``persist_optimizer``) the runs' own from earlier rounds."""
        state = AdamState.fresh(segments, per_slot=self.config.persist_optimizer)
        if self.config.persist_optimizer and all(r in self.saved_adam for r in plan.runs):
            for block in plan.blocks:
                for index, tensor in enumerate(state.slot_tensors()):
                    saved = torch.stack([self.saved_adam[r][index] for r in block.runs], dim=1)
                    tensor[block.slots] = saved.reshape(len(block.slots), *saved.shape[2:])
        return state

    def _keep_adam(self, plan: SlotPlan, state: AdamState) -> None:
        if not self.config.persist_optimizer:
            return
        for block in plan.blocks:
            views = [t[block.slots].view(*block.shape, *t.shape[1:])
                     for t in state.slot_tensors()]
            for position, run in enumerate(block.runs):
                self.saved_adam[run] = tuple(v[:, position].clone() for v in views)


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
