"""A hand-written forward and backward pass of the study's MLPs over stacked parameters.

Autograd spends most of a stacked MLP step on bookkeeping, not arithmetic: the
Parkinson's network is a few thousand parameters per client and a batch is eight rows,
so every product is tiny (profiled: ``run_backward`` took three times the forward's
time). This module computes the same gradients directly: each Dense layer's input is
kept, the loss gradient comes in closed form (softmax minus one-hot for cross-entropy,
the sign for absolute error), and the backward pass is two batched products and a sum
per layer. The
activation normalization layer (one per MLP) is differentiated by autograd on its own,
a graph of a handful of operations.

It applies to :class:`FedNet` MLPs only (Dense, ReLU, dropout, at most the norm layers
the study uses); :func:`supports` says whether a model qualifies, otherwise
:class:`fednorm.training.rounds.StackedRound` keeps ``functional_call`` and autograd.
The results equal autograd's within float rounding (``tests/test_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fednorm.engine.errors import InputError

if TYPE_CHECKING:  # fedavg imports this module, slots imports fedavg
    from fednorm.training.fedavg import TrainConfig
    from fednorm.training.slots import StepSlots
from fednorm.training.models import (
    ChannelNorm,
    Dense,
    FedNet,
    MaskedBatchNorm,
    SharedDropout,
)

State = dict[str, Tensor]
NORM_LAYERS = (ChannelNorm, MaskedBatchNorm)
Role = tuple  # ("dense", ordinal, attribute) or ("norm", attribute)


def supports(model: FedNet) -> bool:
    """Whether ``model`` is an MLP this module can differentiate by hand."""
    allowed = (Dense, nn.ReLU, SharedDropout, *NORM_LAYERS)
    norms = [layer for layer in model.layers if isinstance(layer, NORM_LAYERS)]
    return (model.image_shape is None and len(norms) <= 1
            and all(isinstance(layer, allowed) for layer in model.layers))


class MixedRuns:
    """Stacked MLP runs whose networks differ at most in their activation norm.

    The stack is laid out by a *reference* network (one with a batch norm if any run
    has one, else one with any norm); a run without some of its parameters or buffers
    (no norm, or a norm without running statistics) carries the reference's initial
    values there, which its zero gradients leave untouched and which are dropped again
    on the way out. Each run's norm is applied to its own slots (:meth:`norm_slots`).
    """

    def __init__(self, models: list[FedNet]) -> None:
        if not all(supports(model) for model in models):
            raise InputError("only MLPs that differ in their activation norm can be mixed")
        skeletons = {_skeleton(model) for model in models}
        norm_positions = {p for p in map(_norm_position, models) if p is not None}
        if len(skeletons) != 1 or len(norm_positions) > 1:
            raise InputError("stacked runs must share their network but for the norm")
        self.reference = max(models, key=_reference_rank)
        reference_roles = _roles(self.reference)
        self.defaults = {name: tensor.detach().clone()
                         for name, tensor in self.reference.state_dict().items()}
        self.names = []  # per run: union name -> the run's own name, or None
        for model in models:
            own = _roles(model)
            self.names.append({name: own.get(role) for role, name in reference_roles.items()})
        self.norms = [next((layer for layer in model.layers if isinstance(layer, NORM_LAYERS)),
                           None) for model in models]

    @property
    def mixed(self) -> bool:
        """Whether the runs' norms differ (else the reference's layers serve every run)."""
        return len({_norm_kind(norm) for norm in self.norms}) > 1

    def to_union(self, run: int, state: State) -> State:
        return {name: state[own] if own is not None else self.defaults[name]
                for name, own in self.names[run].items()}

    def from_union(self, run: int, state: State) -> State:
        return {own: state[name] for name, own in self.names[run].items() if own is not None}

    def norm_slots(self, slot_runs: np.ndarray) -> list[tuple[nn.Module | None, np.ndarray]]:
        """Each norm of the stacked runs with its slots (ascending), given every slot's run."""
        kinds: dict[tuple, tuple[nn.Module | None, list[int]]] = {}
        for slot, run in enumerate(slot_runs):
            norm = self.norms[run]
            kinds.setdefault(_norm_kind(norm), (norm, []))[1].append(slot)
        return [(norm, np.asarray(slots, dtype=np.int64)) for norm, slots in kinds.values()]


def _norm_kind(norm: nn.Module | None) -> tuple:
    return (type(norm).__name__, getattr(norm, "groups", None))


def _reference_rank(model: FedNet) -> int:
    kinds = {type(layer) for layer in model.layers}
    return 2 if MaskedBatchNorm in kinds else 1 if kinds & set(NORM_LAYERS) else 0


def _skeleton(model: FedNet) -> tuple:
    """The network without its norm: layer types, parameter shapes, dropout rates."""
    return tuple((type(layer).__name__, tuple(tuple(p.shape) for p in layer.parameters()),
                  getattr(layer, "p", None))
                 for layer in model.layers if not isinstance(layer, NORM_LAYERS))


def _norm_position(model: FedNet) -> int | None:
    """The norm's index among the layers (None without one)."""
    positions = [i for i, layer in enumerate(model.layers) if isinstance(layer, NORM_LAYERS)]
    return positions[0] if positions else None


def _roles(model: FedNet) -> dict[Role, str]:
    """Each parameter's and buffer's role (which Dense, or the norm) and its name."""
    roles: dict[Role, str] = {}
    dense = 0
    for index, layer in enumerate(model.layers):
        tensors = [*layer.named_parameters(), *layer.named_buffers()]
        if isinstance(layer, Dense):
            roles.update({("dense", dense, attr): f"layers.{index}.{attr}"
                          for attr, _ in tensors})
            dense += 1
        elif isinstance(layer, NORM_LAYERS):
            roles.update({("norm", attr): f"layers.{index}.{attr}" for attr, _ in tensors})
    return roles


@dataclass
class Saved:
    """What one layer's backward needs from its forward."""

    layer: nn.Module
    name: str  # the layer's parameter prefix, e.g. "layers.0"
    tensor: Tensor | None = None  # Dense input, ReLU output, dropout keep-mask, norm output
    norm_input: Tensor | None = None
    norm_params: tuple[Tensor, Tensor] | None = None


class MLPStep:
    """Loss, gradients and batch statistics of one stacked mini-batch, without autograd
    on the Dense layers."""

    def __init__(self, model: FedNet, mixed: MixedRuns | None = None) -> None:
        """``model`` lays the stack out; ``mixed`` (with ``model`` its reference) gives
        every run its own norm when the runs' norms differ."""
        self.layers = [(f"layers.{i}", layer) for i, layer in enumerate(model.layers)]
        self.first_dense = next(name for name, layer in self.layers if isinstance(layer, Dense))
        self.mixed = mixed if mixed is not None and mixed.mixed else None

    def __call__(
        self,
        params: dict[str, Tensor],
        x: Tensor,
        mask: Tensor,
        targets: Tensor,
        task: str,
        slots: StepSlots,
        config: TrainConfig,
    ) -> tuple[Tensor, tuple, list[Tensor]]:
        """Each slot's per-row losses (masked), the batch-norm statistics, and the
        gradients (one tensor per parameter, in ``params`` order) of Σ_slots (mean masked
        loss) with respect to ``params`` (given and returned in the stored layout: Dense
        weights (slots, in, out)). ``slots`` gives the dropout masks and which slots each
        norm takes."""
        saved, stats, output = self._forward(params, x, mask, slots)
        losses, delta = loss_and_gradient(output, targets, mask, task, config)
        grads = self._backward(saved, params, delta)
        return losses, tuple(stats), [grads[n] for n in params]

    def _forward(self, params: dict[str, Tensor], x: Tensor, mask: Tensor, slots: StepSlots
                 ) -> tuple[list[Saved], list, Tensor]:
        saved: list[Saved] = []
        stats: list = []
        for name, layer in self.layers:
            record = Saved(layer, name)
            if isinstance(layer, Dense):
                record.tensor = x
                x = torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), x,
                                  params[f"{name}.weight"])
            elif isinstance(layer, nn.ReLU):
                x = torch.relu(x)
                record.tensor = x
            elif isinstance(layer, SharedDropout):
                if layer.p and slots.dropout is not None:
                    keep = slots.dropout.keep(layer.p, x.shape[1:], x.dtype)
                    record.tensor = keep
                    x = x * keep
            elif self.mixed is not None:
                x = self._mixed_norm_forward(name, params, x, mask, record, stats, slots)
            else:
                x = self._norm_forward(layer, name, params, x, mask, record, stats)
            saved.append(record)
        return saved, stats, x

    @staticmethod
    def _norm_forward(layer: nn.Module, name: str, params: dict[str, Tensor], x: Tensor,
                      mask: Tensor, record: Saved, stats: list) -> Tensor:
        weight = params[f"{name}.weight"].detach().requires_grad_()
        bias = params[f"{name}.bias"].detach().requires_grad_()
        record.norm_input = x.detach().requires_grad_()
        record.norm_params = (weight, bias)
        with torch.enable_grad():
            if isinstance(layer, MaskedBatchNorm):
                out, batch_stats = functional_call(
                    layer, {"weight": weight, "bias": bias}, (record.norm_input, mask),
                    strict=False)
                stats.append(batch_stats)
            else:
                out = functional_call(layer, {"weight": weight, "bias": bias},
                                      (record.norm_input,))
        record.tensor = out
        return out.detach()

    def _mixed_norm_forward(self, name: str, params: dict[str, Tensor], x: Tensor,
                            mask: Tensor, record: Saved, stats: list, slots: StepSlots
                            ) -> Tensor:
        """Each run's own norm (or none) on its slots, as one autograd graph."""
        assert self.mixed is not None
        count, channels = x.shape[0], x.shape[-1]
        batch_stats = [torch.zeros(count, channels, dtype=x.dtype),
                       torch.ones(count, channels, dtype=x.dtype),
                       torch.ones(count, dtype=x.dtype)]
        groups = [(norm, index) for norm, index in slots.norm_groups if len(index)]
        if all(norm is None for norm, _ in groups):
            self._keep_batch_stats(stats, batch_stats)
            return x  # the runs with a norm have stopped: no graph (_backward: identity)
        weight = params[f"{name}.weight"].detach().requires_grad_()
        bias = params[f"{name}.bias"].detach().requires_grad_()
        record.norm_input = x.detach().requires_grad_()
        record.norm_params = (weight, bias)
        parts = []
        with torch.enable_grad():
            for norm, index in groups:
                part = record.norm_input[index]
                if norm is not None:
                    part = self._group_norm_forward(
                        norm, part, {"weight": weight[index], "bias": bias[index]},
                        mask[index], index, batch_stats)
                parts.append(part)
            order = torch.cat([index for _, index in groups])
            out = torch.cat(parts)[torch.argsort(order)]
        self._keep_batch_stats(stats, batch_stats)
        record.tensor = out
        return out.detach()

    def _keep_batch_stats(self, stats: list, batch_stats: list[Tensor]) -> None:
        """The stack's batch statistics, slot by slot, when any of its runs has batch
        norm (runs without it get mean 0, variance 1)."""
        assert self.mixed is not None
        if any(isinstance(norm, MaskedBatchNorm) for norm in self.mixed.norms):
            stats.append(tuple(batch_stats))

    @staticmethod
    def _group_norm_forward(norm: nn.Module, part: Tensor, params: dict[str, Tensor],
                            mask: Tensor, index: Tensor, batch_stats: list[Tensor]) -> Tensor:
        """One norm on its runs' slots; batch statistics land in their slots."""
        if not isinstance(norm, MaskedBatchNorm):
            return functional_call(norm, params, (part,))
        out, group_stats = functional_call(norm, params, (part, mask), strict=False)
        for full, values in zip(batch_stats, group_stats, strict=True):
            full[index] = values
        return out

    def _backward(self, saved: list[Saved], params: dict[str, Tensor], delta: Tensor
                  ) -> dict[str, Tensor]:
        grads: dict[str, Tensor] = {}
        for record in reversed(saved):
            layer, name = record.layer, record.name
            if isinstance(layer, Dense):
                grads[f"{name}.weight"] = torch.bmm(record.tensor.transpose(1, 2), delta)
                grads[f"{name}.bias"] = delta.sum(1)
                if name == self.first_dense:
                    break
                delta = torch.bmm(delta, params[f"{name}.weight"].transpose(1, 2))
            elif isinstance(layer, nn.ReLU):
                # autograd's own ReLU backward: one kernel, where delta * (out > 0)
                # promotes a bool mask and took 16x as long
                delta = torch.ops.aten.threshold_backward(delta, record.tensor, 0)
            elif isinstance(layer, SharedDropout):
                if record.tensor is not None:
                    delta = delta * record.tensor
            elif record.norm_input is None:  # a mixed stack's norm layer, no norm left
                grads[f"{name}.weight"] = torch.zeros_like(params[f"{name}.weight"])
                grads[f"{name}.bias"] = torch.zeros_like(params[f"{name}.bias"])
            else:
                assert record.norm_params is not None
                d_input, d_weight, d_bias = torch.autograd.grad(
                    record.tensor, [record.norm_input, *record.norm_params], delta)
                grads[f"{name}.weight"], grads[f"{name}.bias"] = d_weight, d_bias
                delta = d_input
        return grads


def row_weights(target: Tensor, config: TrainConfig) -> Tensor | float:
    """Each row's class weight (1 without class weights)."""
    if config.class_weights is None:
        return 1.0
    return torch.tensor(config.class_weights, dtype=torch.float32)[target]


def loss_and_gradient(output: Tensor, targets: Tensor, mask: Tensor, task: str,
                      config: TrainConfig) -> tuple[Tensor, Tensor]:
    """Masked per-row losses and d(Σ_slots mean masked loss)/d``output``.

    Cross-entropy's gradient is softmax minus one-hot (times the row's class weight);
    absolute error's is the sign of the error (0 where it is 0, as torch's ``abs``
    backward gives), squared error's twice the error.
    """
    rows = mask.sum(1, keepdim=True)
    if task == "classification":
        log_probs = F.log_softmax(output, dim=-1)
        weights = row_weights(targets, config)
        losses = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * weights * mask
        delta = log_probs.exp()
        delta.scatter_add_(-1, targets.unsqueeze(-1),
                           torch.full_like(delta[..., :1], -1.0))
        if isinstance(weights, Tensor):
            delta = delta * weights.unsqueeze(-1)
    else:
        error = output.squeeze(-1) - targets
        if config.regression_loss == "mae":
            losses, delta = error.abs() * mask, torch.sign(error).unsqueeze(-1)
        else:
            losses, delta = error**2 * mask, 2 * error.unsqueeze(-1)
    delta = delta * (mask / rows).unsqueeze(-1)
    return losses, delta
