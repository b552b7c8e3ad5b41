"""The study's models, with a choice of activation normalization layer.

Architectures follow the paper's supplementary model table as realized in the authors'
published scripts:

* BCW: MLP 30-12-8-out; HCV: MLP 12-16-8-8-out; Parkinson's: MLP 19-128-64-32-16-1 with
  dropout 0.2. The activation normalization sits after the first hidden layer;
* digits and MNIST: LeNet-5 style (conv 6, pool, conv 16, pool, dense 120-84-out), the
  normalization after each convolution; digits' 8×8 images use 3×3 "same" convolutions;
* CIFAR-10: a small VGG-style CNN (conv blocks 32 | 64 | 128-128, each closed by the
  normalization and 2×2 max pooling, then dense 256-out). The paper's network is wider
  (64 | 128 | 256-256 | 512-512, dense 1024); this one keeps the shape and fits a CPU.

Activation normalizations: ``batch`` (batch statistics in training, running averages at
evaluation), ``layer`` (per sample over all units; on feature maps GroupNorm with one
group), ``group`` (GroupNorm; 4 groups on MLPs as in the scripts), ``instance`` (per
sample and channel on feature maps; on an MLP there are no spatial positions, so it is
GroupNorm with one group, as the scripts did, which makes it layer norm up to its
affine parameters).

Every model is a :class:`FedNet`: ``forward(x, mask)`` takes flat feature rows and
returns ``(output, batch_stats)``. Its layers also accept **stacked** parameters (a
leading client dimension, swapped in with ``torch.func.functional_call``) and then map
stacked rows (clients, B, features) for all clients at once: linear layers as batched
matrix products, convolutions as one grouped convolution, normalizations per client.
On these small models that grouped computation is about 4× faster than
``torch.func.vmap`` over ``functional_call`` (measured: 1.1 vs 4.1 ms per forward and
backward step of the Parkinson's MLP for 10 clients), whose per-call overhead dominates.
Several runs of one architecture can share the stack as well (client-major slots,
``forward(x, mask, runs)``); see :class:`fednorm.training.rounds.StackedRound`.
The mask marks real rows in a padded batch, and batch normalization computes its
statistics over real rows only; the statistics come back as outputs (instead of
updating buffers in place) so that stacked and single-model runs share one code path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fednorm.engine.errors import InputError

if TYPE_CHECKING:  # slots imports this module (through fedavg)
    from fednorm.training.slots import DropoutDraws

ActivationNorm = Literal["none", "batch", "layer", "group", "instance"]
ACTIVATION_NORMS: tuple[ActivationNorm, ...] = ("none", "batch", "layer", "group", "instance")

BatchStats = tuple[Tensor, Tensor, Tensor]  # mean, biased variance, number of values


@dataclass(frozen=True)
class MLPSpec:
    """A fully connected network; the activation normalization follows hidden layer 0."""

    hidden: tuple[int, ...]
    groups: int = 4
    dropout: float = 0.0  # after every hidden layer but the last


@dataclass(frozen=True)
class CNNSpec:
    """Conv blocks (channels per conv), each closed by ReLU, normalization and 2×2 pooling."""

    blocks: tuple[tuple[int, ...], ...]
    kernel: int
    padding: int
    groups: tuple[int, ...]  # GroupNorm groups per block
    dense: tuple[int, ...]


ModelSpec = MLPSpec | CNNSpec

MODEL_SPECS: dict[str, ModelSpec] = {
    "bcw": MLPSpec(hidden=(12, 8)),
    "hcv": MLPSpec(hidden=(16, 8, 8)),
    "parkinsons": MLPSpec(hidden=(128, 64, 32, 16), dropout=0.2),
    "digits": CNNSpec(blocks=((6,), (16,)), kernel=3, padding=1, groups=(3, 4),
                      dense=(120, 84)),
    "mnist": CNNSpec(blocks=((6,), (16,)), kernel=5, padding=0, groups=(3, 4),
                     dense=(120, 84)),
    "cifar10": CNNSpec(blocks=((32,), (64,), (128, 128)), kernel=3, padding=1,
                       groups=(8, 8, 8), dense=(256,)),
}
MODEL_SPECS["mnist_idx"] = MODEL_SPECS["mnist"]
MODEL_SPECS["parkinsons_patients"] = MODEL_SPECS["parkinsons"]  # the same table, split by patient
DEFAULT_TABULAR = MLPSpec(hidden=(32, 16))
DEFAULT_IMAGE = MODEL_SPECS["mnist"]


def _broadcast(param: Tensor, spatial: bool) -> Tensor:
    """A per-channel vector (C) or stacked per-client vectors (clients, C), shaped to
    broadcast over rows (B, C[, H, W]) or stacked rows (clients, B, C[, H, W])."""
    lead = (param.shape[0], 1) if param.dim() == 2 else ()
    return param.reshape(*lead, param.shape[-1], *((1, 1) if spatial else ()))


class Dense(nn.Linear):
    """``nn.Linear``; with stacked weights (clients, out, in) it maps (clients, B, in).

    The stacked product is x·Wᵀ in one ``baddbmm``. The trainer keeps each stacked weight
    stored as (clients, in, out) and hands in its transposed view, so that product reads
    contiguous matrices and the weight gradient comes out contiguous: measured 1.5-2×
    faster for a forward and backward step of the Parkinson's MLP than W·xᵀ over
    feature-major activations, or than x·Wᵀ with (out, in) storage.
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 2:
            return F.linear(x, self.weight, self.bias)
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))


class Conv(nn.Conv2d):
    """``nn.Conv2d``; stacked weights run all clients as one grouped convolution."""

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 4:
            return super().forward(x)
        clients, rows = x.shape[:2]
        grouped = x.transpose(0, 1).reshape(rows, -1, *x.shape[-2:])  # (B, clients·C, H, W)
        out = F.conv2d(grouped, self.weight.flatten(0, 1), self.bias.flatten(), self.stride,
                       self.padding, groups=clients)
        return out.reshape(rows, clients, -1, *out.shape[-2:]).transpose(0, 1)


class MaxPool(nn.MaxPool2d):
    """``nn.MaxPool2d`` over the last three dims, whatever leads them."""

    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x.reshape(-1, *x.shape[-3:]))
        return out.reshape(*x.shape[:-3], *out.shape[-3:])


class SharedDropout(nn.Dropout):
    """``nn.Dropout``, whose stacked form takes its masks from the stack.

    Stacked rows (slots, B, units) are multiplied by the step's keep masks
    (:class:`fednorm.training.slots.DropoutDraws`: one per client, shared by the runs of
    a federation, the draws each run would make alone). Rows without draws are plain
    ``F.dropout``.
    """

    def forward(self, x: Tensor, draws: DropoutDraws | None = None) -> Tensor:
        if not self.training or self.p == 0.0 or draws is None:
            return super().forward(x)
        return x * draws.keep(self.p, x.shape[1:], x.dtype)


class Flatten(nn.Module):
    """Feature maps (C, H, W) to vectors, whatever leads them."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(-3)


class ChannelNorm(nn.Module):
    """Per-sample normalization over channel groups (and positions), with per-channel affine.

    groups = 1 is layer norm, groups = channels on feature maps is instance norm, and
    anything between is group norm (Wu & He, 2018), all one ``F.group_norm`` call.
    """

    def __init__(self, channels: int, groups: int, spatial: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.groups, self.spatial, self.eps = groups, spatial, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        sample_dims = 3 if self.spatial else 1
        flat = x.reshape(-1, *x.shape[-sample_dims:])
        normalized = F.group_norm(flat, self.groups, eps=self.eps).reshape(x.shape)
        return (normalized * _broadcast(self.weight, self.spatial)
                + _broadcast(self.bias, self.spatial))


class MaskedBatchNorm(nn.Module):
    """Batch normalization whose statistics skip padded rows and are returned, not stored.

    In training the output is normalized with the statistics of the rows where ``mask``
    is 1 (per client when stacked); the caller folds the returned (mean, var, count)
    into the running buffers with :func:`update_running_stats`. In evaluation the
    running buffers are used.
    """

    def __init__(self, channels: int, spatial: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.spatial, self.eps = spatial, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, BatchStats | None]:
        stats = None
        if not self.training:
            mean, var = self.running_mean, self.running_var
        else:
            channel_dim = 2 if self.weight.dim() == 2 else 1
            rows = torch.ones(x.shape[:channel_dim], dtype=x.dtype) if mask is None else mask
            weights = rows.reshape(*rows.shape, *(1,) * (x.dim() - rows.dim()))
            dims = [channel_dim - 1, *range(channel_dim + 1, x.dim())]  # rows and positions
            count = (rows.sum(-1) * math.prod(x.shape[channel_dim + 1 :])).clamp(min=1.0)
            per_channel = count.unsqueeze(-1) if count.dim() else count
            mean = (x * weights).sum(dims) / per_channel
            centered = x - _broadcast(mean, self.spatial)
            var = (centered**2 * weights).sum(dims) / per_channel
            stats = (mean.detach(), var.detach(), count.detach())
        scale = _broadcast(self.weight, self.spatial) / torch.sqrt(
            _broadcast(var, self.spatial) + self.eps)
        shift = _broadcast(self.bias, self.spatial) - _broadcast(mean, self.spatial) * scale
        return x * scale + shift, stats


class FedNet(nn.Module):
    """A stack of layers over flat feature rows; images are reshaped to (C, H, W) first.

    Given stacked parameters (through ``torch.func.functional_call``) and rows stacked
    as (clients, B, features), every layer computes all clients at once.
    """

    def __init__(self, layers: list[nn.Module], image_shape: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.image_shape = image_shape

    def forward(
        self, x: Tensor, mask: Tensor | None = None, dropout: DropoutDraws | None = None
    ) -> tuple[Tensor, tuple]:
        """Stacked rows take their dropout masks from ``dropout`` (see
        :class:`SharedDropout`)."""
        if self.image_shape is not None:
            x = x.reshape(*x.shape[:-1], *self.image_shape)
        stats: list[BatchStats] = []
        for layer in self.layers:
            if isinstance(layer, MaskedBatchNorm):
                x, batch_stats = layer(x, mask)
                if batch_stats is not None:
                    stats.append(batch_stats)
            elif isinstance(layer, SharedDropout):
                x = layer(x, dropout)
            else:
                x = layer(x)
        return x, tuple(stats)

    def running_stat_names(self) -> list[tuple[str, str]]:
        """(mean, var) buffer names of the batch norms, in the order forward reports them."""
        return [
            (f"{name}.running_mean", f"{name}.running_var")
            for name, module in self.named_modules()
            if isinstance(module, MaskedBatchNorm)
        ]


@torch.no_grad()
def update_running_stats(
    buffers: dict[str, Tensor], names: list[tuple[str, str]], stats: tuple, momentum: float = 0.1
) -> None:
    """Fold batch statistics into running buffers, in place, as ``nn.BatchNorm`` does.

    Works on one model's buffers or on stacked per-client buffers (a leading client
    dimension on both buffers and statistics). The running variance is unbiased.
    """
    for (mean_name, var_name), (mean, var, count) in zip(names, stats, strict=True):
        count = count.reshape(count.shape + (1,) * (var.dim() - count.dim()))
        unbiased = var * count / (count - 1).clamp(min=1.0)
        buffers[mean_name].lerp_(mean, momentum)
        buffers[var_name].lerp_(unbiased, momentum)


def model_spec(dataset: str, image_shape: tuple[int, int, int] | None) -> ModelSpec:
    """The paper's model for a built-in dataset, or a generic one for other data."""
    if dataset in MODEL_SPECS:
        return MODEL_SPECS[dataset]
    return DEFAULT_TABULAR if image_shape is None else DEFAULT_IMAGE


def architecture_key(spec: ModelSpec, norm: ActivationNorm) -> tuple[ModelSpec, str]:
    """Runs whose keys are equal build identical networks (and can train stacked).

    On an MLP, instance norm is layer norm (one group over all units, see above).
    """
    if isinstance(spec, MLPSpec) and norm == "instance":
        return spec, "layer"
    return spec, norm


def build_model(
    spec: ModelSpec,
    n_features: int,
    n_outputs: int,
    norm: ActivationNorm = "none",
    image_shape: tuple[int, int, int] | None = None,
) -> FedNet:
    """Instantiate ``spec`` (initialized from torch's global RNG: seed it first)."""
    if norm not in ACTIVATION_NORMS:
        raise InputError(f"unknown activation norm {norm!r}; use {', '.join(ACTIVATION_NORMS)}")
    if isinstance(spec, MLPSpec):
        return FedNet(_mlp_layers(spec, n_features, n_outputs, norm), None)
    if image_shape is None:
        raise InputError("a convolutional model needs images (a dataset with image_shape)")
    return FedNet(_cnn_layers(spec, image_shape, n_outputs, norm), image_shape)


def _norm_layer(norm: ActivationNorm, channels: int, groups: int, spatial: bool) -> list[nn.Module]:
    if norm == "none":
        return []
    if norm == "batch":
        return [MaskedBatchNorm(channels, spatial)]
    groups = {"layer": 1, "group": groups, "instance": channels if spatial else 1}[norm]
    return [ChannelNorm(channels, groups, spatial)]


def _mlp_layers(spec: MLPSpec, n_features: int, n_outputs: int, norm: ActivationNorm) -> list:
    layers: list[nn.Module] = []
    width = n_features
    for position, units in enumerate(spec.hidden):
        layers += [Dense(width, units), nn.ReLU()]
        if position == 0:
            layers += _norm_layer(norm, units, spec.groups, spatial=False)
        if spec.dropout and position < len(spec.hidden) - 1:
            layers.append(SharedDropout(spec.dropout))
        width = units
    return [*layers, Dense(width, n_outputs)]


def _cnn_layers(
    spec: CNNSpec, image_shape: tuple[int, int, int], n_outputs: int, norm: ActivationNorm
) -> list:
    channels, height, width = image_shape
    layers: list[nn.Module] = []
    for block, groups in zip(spec.blocks, spec.groups, strict=True):
        for out_channels in block:
            layers += [Conv(channels, out_channels, spec.kernel, padding=spec.padding), nn.ReLU()]
            channels = out_channels
            height, width = (s + 2 * spec.padding - spec.kernel + 1 for s in (height, width))
        layers += [*_norm_layer(norm, channels, groups, spatial=True), MaxPool(2)]
        height, width = height // 2, width // 2
    if min(height, width) < 1:
        raise InputError(f"images of shape {image_shape} are too small for this network")
    layers.append(Flatten())
    units = channels * height * width
    for dense in spec.dense:
        layers += [Dense(units, dense), nn.ReLU()]
        units = dense
    return [*layers, Dense(units, n_outputs)]
