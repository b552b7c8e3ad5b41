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
:class:`fednorm.training.fedavg.StackedRound` keeps ``functional_call`` and autograd.
The results equal autograd's within float rounding (``tests/test_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fednorm.training.models import (
    ChannelNorm,
    Dense,
    FedNet,
    MaskedBatchNorm,
    SharedDropout,
)

NORM_LAYERS = (ChannelNorm, MaskedBatchNorm)


def supports(model: FedNet) -> bool:
    """Whether ``model`` is an MLP this module can differentiate by hand."""
    allowed = (Dense, nn.ReLU, SharedDropout, *NORM_LAYERS)
    return model.image_shape is None and all(isinstance(layer, allowed)
                                             for layer in model.layers)


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

    def __init__(self, model: FedNet) -> None:
        self.layers = [(f"layers.{i}", layer) for i, layer in enumerate(model.layers)]
        self.first_dense = next(name for name, layer in self.layers if isinstance(layer, Dense))

    def __call__(
        self,
        params: dict[str, Tensor],
        x: Tensor,
        mask: Tensor,
        targets: Tensor,
        task: str,
        runs: int,
    ) -> tuple[Tensor, tuple, Tensor]:
        """Each slot's per-row losses (masked), the batch-norm statistics, and the flat
        gradient rows of Σ_slots (mean masked loss) with respect to ``params`` (given and
        returned in the stored layout: Dense weights (slots, in, out))."""
        saved, stats, output = self._forward(params, x, mask, runs)
        losses, delta = loss_and_gradient(output, targets, mask, task)
        grads = self._backward(saved, params, delta)
        slots = len(x)
        # One concatenation: bmm into strided views of the flat rows copies anyway.
        return losses, tuple(stats), torch.cat([grads[n].reshape(slots, -1) for n in params], 1)

    def _forward(self, params: dict[str, Tensor], x: Tensor, mask: Tensor, runs: int
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
                if layer.p:
                    keep = layer.keep_mask(x, runs)
                    record.tensor = keep
                    x = (x.view(keep.shape[0], runs, *x.shape[1:]) * keep).view(x.shape)
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
                delta = delta * (record.tensor > 0)
            elif isinstance(layer, SharedDropout):
                if record.tensor is not None:
                    keep = record.tensor
                    delta = (delta.view(keep.shape[0], -1, *delta.shape[1:]) * keep
                             ).view(delta.shape)
            else:
                assert record.norm_input is not None and record.norm_params is not None
                d_input, d_weight, d_bias = torch.autograd.grad(
                    record.tensor, [record.norm_input, *record.norm_params], delta)
                grads[f"{name}.weight"], grads[f"{name}.bias"] = d_weight, d_bias
                delta = d_input
        return grads


def loss_and_gradient(output: Tensor, targets: Tensor, mask: Tensor, task: str
                      ) -> tuple[Tensor, Tensor]:
    """Masked per-row losses and d(Σ_slots mean masked loss)/d``output``.

    Cross-entropy's gradient is softmax minus one-hot; absolute error's is the sign of
    the error (0 where it is 0, as torch's ``abs`` backward gives).
    """
    rows = mask.sum(1, keepdim=True)
    if task == "classification":
        log_probs = F.log_softmax(output, dim=-1)
        losses = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
        delta = log_probs.exp()
        delta.scatter_add_(-1, targets.unsqueeze(-1),
                           torch.full_like(delta[..., :1], -1.0))
    else:
        error = output.squeeze(-1) - targets
        losses = error.abs() * mask
        delta = torch.sign(error).unsqueeze(-1)
    delta = delta * (mask / rows).unsqueeze(-1)
    return losses, delta
