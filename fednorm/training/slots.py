"""Where every client of every stacked run sits in a step: a stack's federations and slots.

A stack (:class:`fednorm.training.rounds.StackedRound`) trains runs that may belong to
different **federations**: the runs of one federation share its clients (row counts,
targets, batch plan), as the input normalizations of one partition do, while runs of
different federations share nothing but the network's shape (the partitions of one
dataset and seed, a central model's single client). A **slot** is one client of one run;
its parameters are one row of the stack.

Slots are ordered by the number of batches their client has, most first (ties keep the
federation order, then the client order, then the run order), so that the slots that
still have a batch at a step are always a prefix of the stack and the others cost
nothing. Within a federation that order is its clients' own (client-major, then run),
so gathering a federation's slots gives back the ``(clients, runs)`` block it would have
alone, and FedAvg averages it in the same order.

Every federation draws its dropout masks from a generator of its own, one mask per
client and step shared by its runs: the draws its runs would make alone. Each stream
starts where torch's global generator is when the stack is built, as a run's would
when its network is built from its seed just before (the study builds every network of
a stack from the same seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from fednorm.training.fedavg import ClientTensors, TrainConfig, batch_plan


@dataclass
class Federation:
    """One federation's clients as a stack holds them (clients in batch-count order)."""

    sizes: list[int]
    order: np.ndarray  # client indices, most batches first
    n_batches: np.ndarray  # per client, in ``order``
    offsets: np.ndarray  # each client's first row among the federation's rows
    weights: Tensor  # FedAvg weights, in ``order``
    runs: list[int]  # the stack's runs on these clients
    dropout: torch.Generator

    @classmethod
    def of(cls, data: ClientTensors, runs: list[int], config: TrainConfig) -> Federation:
        n_batches = np.array([math.ceil(n / config.batch_size) for n in data.sizes])
        order = np.argsort(-n_batches, kind="stable")
        sizes = np.asarray(data.sizes, dtype=np.float64)[order]
        dropout = torch.Generator()
        dropout.set_state(torch.get_rng_state())
        return cls(list(data.sizes), order, n_batches[order], data.offsets,
                   torch.tensor(sizes / sizes.sum(), dtype=data.X.dtype), runs, dropout)

    def padded_plan(self, config: TrainConfig, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        """This round's batches as federation rows (clients in order, steps, batch size)
        and the real-row mask; padding rows point at the federation's first row, mask 0."""
        plan = batch_plan(self.sizes, config.batch_size, config.seed, round_index)
        steps, size = int(self.n_batches[0]), config.batch_size
        rows = np.zeros((len(self.order), steps, size), dtype=np.int64)
        mask = np.zeros(rows.shape, dtype=np.float32)
        for rank, client in enumerate(self.order):
            if not plan[client]:
                continue
            # Only a client's last batch is short, so its padding is at the end.
            permutation = np.concatenate(plan[client])
            rows[rank].reshape(-1)[: len(permutation)] = permutation + self.offsets[client]
            mask[rank].reshape(-1)[: len(permutation)] = 1.0
        return rows, mask


class DropoutDraws:
    """One step's dropout keep masks: each federation draws one mask per active client
    from its own generator, and every slot takes its client's mask."""

    def __init__(self, streams: list[tuple[torch.Generator, int]], index: Tensor) -> None:
        self.streams, self.index = streams, index

    def keep(self, p: float, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        """The scaled keep mask (slots, *shape) of a dropout layer of rate ``p``."""
        draws = [torch.empty(count, *shape, dtype=dtype).bernoulli_(1.0 - p, generator=stream)
                 for stream, count in self.streams]
        return torch.cat(draws).div_(1.0 - p)[self.index]


@dataclass
class StepSlots:
    """What a step's layers know of its slots (the first ``count`` of the round)."""

    count: int
    dropout: DropoutDraws | None
    norm_groups: list[tuple[nn.Module | None, Tensor]]  # each norm and its slots


@dataclass
class Block:
    """A federation's active runs and their slots, client-major then run: the
    ``(clients, runs)`` block the federation has alone (its FedAvg, losses, Adam state)."""

    federation: Federation
    runs: list[int]
    slots: Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.federation.order), len(self.runs)


class SlotPlan:
    """One round's slots for a set of active runs (see the module doc)."""

    def __init__(self, federations: Sequence[Federation], runs: Sequence[int],
                 row_offsets: Sequence[int], config: TrainConfig, round_index: int,
                 dtype: torch.dtype) -> None:
        position = {run: i for i, run in enumerate(runs)}
        active = [(fed, [r for r in fed.runs if r in position]) for fed in federations]
        active = [(fed, fed_runs) for fed, fed_runs in active if fed_runs]
        self.runs = list(runs)
        # (client, federation) pairs, most batches first (ties: federation, then client)
        ranked = sorted((-int(fed.n_batches[rank]), order, rank)
                        for order, (fed, _) in enumerate(active)
                        for rank in range(len(fed.order)))
        pairs = [(order, rank, -negative) for negative, order, rank in ranked]
        self._lay_out_batches(active, pairs, config, round_index, dtype)
        self._lay_out_slots(active, pairs, position, row_offsets)

    def _lay_out_batches(self, active: list[tuple[Federation, list[int]]],
                         pairs: list[tuple[int, int, int]], config: TrainConfig,
                         round_index: int, dtype: torch.dtype) -> None:
        """Each pair's batches of the round, and how many clients of each federation
        (and slots in all) have a batch at each step."""
        plans = [fed.padded_plan(config, round_index) for fed, _ in active]
        steps = max(batches for _, _, batches in pairs)
        pair_rows = np.zeros((len(pairs), steps, config.batch_size), dtype=np.int64)
        pair_mask = np.zeros(pair_rows.shape, dtype=np.float32)
        self.active_clients = np.zeros((len(active), steps), dtype=np.int64)
        for p, (order, rank, batches) in enumerate(pairs):
            rows, mask = plans[order]
            pair_rows[p, :batches] = rows[rank, :batches]
            pair_mask[p, :batches] = mask[rank, :batches]
            self.active_clients[order, :batches] += 1
        self.pair_rows = torch.from_numpy(pair_rows)
        self.pair_mask = torch.from_numpy(pair_mask).to(dtype)
        batches = np.array([batches for _, _, batches in pairs])
        slot_end = np.cumsum([len(active[order][1]) for order, _, _ in pairs])
        self.active = [int(slot_end[(batches > s).sum() - 1]) for s in range(steps)]

    def _lay_out_slots(self, active: list[tuple[Federation, list[int]]],
                       pairs: list[tuple[int, int, int]], position: dict[int, int],
                       row_offsets: Sequence[int]) -> None:
        """Every pair's slots, one per active run of its federation."""
        slots = [(p, position[run], row_offsets[run], order, rank)
                 for p, (order, rank, _) in enumerate(pairs) for run in active[order][1]]
        columns = (torch.tensor(column) for column in zip(*slots, strict=True))
        pair, run, offset, federation, rank = columns
        self.slot_pair, self.slot_run, self.slot_offset = pair, run, offset.unsqueeze(1)
        self.slot_fed, self.slot_rank = federation, rank
        self.blocks = [Block(fed, fed_runs, torch.nonzero(federation == order).squeeze(1))
                       for order, (fed, fed_runs) in enumerate(active)]

    def rows(self, step: int, count: int) -> tuple[Tensor, Tensor]:
        """The first ``count`` slots' rows in the stack's tables and their real-row mask."""
        pairs = self.slot_pair[:count]
        return (self.pair_rows[pairs, step] + self.slot_offset[:count],
                self.pair_mask[pairs, step])

    def dropout(self, step: int, count: int) -> DropoutDraws:
        counts = self.active_clients[:, step]
        starts = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)[:-1]]))
        index = starts[self.slot_fed[:count]] + self.slot_rank[:count]
        streams = [(block.federation.dropout, int(n))
                   for block, n in zip(self.blocks, counts, strict=True) if n]
        return DropoutDraws(streams, index)
