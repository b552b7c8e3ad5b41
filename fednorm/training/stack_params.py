"""A stack's parameters and Adam state, stored as **segments** of per-slot rows.

A stack (:class:`fednorm.training.rounds.StackedRound`) keeps every slot's parameters
(one client of one run) as rows. They are split into segments: a parameter whose size is a
multiple of :data:`ROW_ALIGN` values is a segment of its own, ``(slots, size)``; the others
share one segment, each row ending in zeros up to a multiple of :data:`ROW_ALIGN`. Why:

* A segment of its own holds that parameter's gradient exactly as the batched product
  makes it, ``(slots, in, out)`` contiguous, so a step hands it to Adam as it is instead
  of copying every gradient into one row per slot first (that copy was 9 % of a
  Parkinson's step with the other concatenations; ``bench/runs/2026-12-07-segments.md``).
* Every segment's width is a multiple of :data:`ROW_ALIGN`, because torch's fused Adam
  rounds the last values of a tensor (its tail, after the vectorized body) differently:
  without it, the last parameter of the last slot would move by an ulp depending on how
  many slots a step has, and a run would not give the same result alone and inside a
  stack. The zeros' gradients are zero and stay zero.

A stack's parameters are a list of segments (:data:`Segments`), every segment with the same
leading slot dimension; one run's are the same list without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.optim.adam import adam

from fednorm.training.fedavg import State, TrainConfig
from fednorm.training.models import Dense, FedNet

ROW_ALIGN = 64  # values; a multiple of every vector width torch's CPU kernels use
Segments = list[Tensor]  # (slots, width) per segment, or (width,) for one run


class ParamLayout:
    """Where each parameter sits among a stack's segments.

    Dense weights are stored transposed, (in, out), and handed to the model as the
    transposed view (see :class:`fednorm.training.models.Dense`); everything else is
    stored in its own shape.
    """

    def __init__(self, model: FedNet, split: bool = True) -> None:
        """``split=False`` keeps one segment: Adam state kept across rounds steps a list
        of rows, one per slot, which more segments would lengthen (measured slower on
        HCV)."""
        dense = {f"{name}.weight" for name, module in model.named_modules()
                 if isinstance(module, Dense)}
        self.shapes = {name: (p.shape[::-1] if name in dense else p.shape)
                       for name, p in model.named_parameters()}
        self.transposed = dense & set(self.shapes)
        sizes = {name: math.prod(shape) for name, shape in self.shapes.items()}
        own = [[name] for name, size in sizes.items() if split and size % ROW_ALIGN == 0]
        rest = [name for name in sizes if [name] not in own]
        self.segment_names: list[list[str]] = own + ([rest] if rest else [])
        self.own = {names[0] for names in own}  # parameters that are a segment of their own
        self.padding = -sum(sizes[name] for name in rest) % ROW_ALIGN
        self._place = {name: (index, offset, sizes[name])
                       for index, names in enumerate(self.segment_names)
                       for offset, name in zip(_offsets([sizes[n] for n in names]), names,
                                               strict=True)}

    def flatten(self, state: State) -> Segments:
        """One run's parameters as segments."""
        values = {name: self._stored(name, state[name].detach()).reshape(-1)
                  for name in self.shapes}
        return self._join(values, lambda width: next(iter(values.values())).new_zeros(width))

    def stack(self, rows: Sequence[Segments], index: Tensor) -> Segments:
        """Runs' segments stacked, then the rows ``index`` picks (one per slot)."""
        return [torch.stack([row[segment] for row in rows])[index]
                for segment in range(len(self.segment_names))]

    def gradient_segments(self, gradients: Sequence[Tensor]) -> Segments:
        """Each parameter's gradients (slots, *stored shape), in layout order, as segments:
        a segment of its own is its gradient, unchanged."""
        slots = len(gradients[0])
        values = {name: g.reshape(slots, -1) for name, g in zip(self.shapes, gradients,
                                                                  strict=True)}
        return self._join(values, lambda width: gradients[0].new_zeros(slots, width))

    def storage_views(self, segments: Sequence[Tensor]) -> State:
        """Views into segments, in layout order: (slots, *stored shape), or one run's stored
        shapes."""
        lead = segments[0].shape[:-1]
        views = {}
        for name, shape in self.shapes.items():
            index, offset, size = self._place[name]
            views[name] = segments[index][..., offset : offset + size].view(*lead, *shape)
        return views

    def model_views(self, stored: State) -> State:
        """Stored tensors as the model's parameters (Dense weights transposed back)."""
        return {name: self._stored(name, t) for name, t in stored.items()}

    def unflatten(self, segments: Sequence[Tensor]) -> State:
        """One run's segments as an ordinary (contiguous) parameter dict."""
        return {name: t.contiguous() for name, t in
                self.model_views(self.storage_views(segments)).items()}

    def _join(self, values: dict[str, Tensor], zeros: Callable[[int], Tensor]) -> Segments:
        """Per-parameter values (leading dims, size) as segments; the shared segment ends in
        ``zeros(padding)``."""
        segments = []
        for names in self.segment_names:
            if names[0] in self.own:
                segments.append(values[names[0]])
            else:
                padding = [zeros(self.padding)] if self.padding else []
                segments.append(torch.cat([*(values[name] for name in names), *padding], -1))
        return segments

    def _stored(self, name: str, tensor: Tensor) -> Tensor:
        return tensor.transpose(-1, -2) if name in self.transposed else tensor


def _offsets(sizes: list[int]) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]


@dataclass
class AdamState:
    """Adam's moments (segments like the parameters') and step counts for a stacked round.

    Fresh moments every round give every slot that has a batch at step ``s`` the same
    step count (active slots are a prefix, see
    :class:`fednorm.training.rounds.StackedRound`), so one step count per segment and one
    fused-Adam call over the segments' prefixes suffice. Moments kept across rounds
    (``per_slot``) need a step count per slot and segment, and a list of rows.
    """

    m: Segments
    v: Segments
    steps: Tensor  # (segments,), or (slots, segments) per slot
    per_slot: bool

    @classmethod
    def fresh(cls, segments: Segments, per_slot: bool) -> AdamState:
        shape = (len(segments[0]), len(segments)) if per_slot else (len(segments),)
        return cls([torch.zeros_like(s) for s in segments], [torch.zeros_like(s) for s in segments],
                   torch.zeros(shape, dtype=torch.float32), per_slot)

    def slot_tensors(self) -> list[Tensor]:
        """Every tensor of the state, each with its leading slot dimension (``per_slot``)."""
        return [*self.m, *self.v, self.steps]

    def step(self, params: Segments, grads: Segments, slots: int, config: TrainConfig) -> None:
        """``torch.optim.Adam``'s update of the first ``slots`` rows of ``params`` (the
        segments' prefixes), through torch's functional fused Adam (the optimizer object's
        bookkeeping costs more than the update itself here)."""
        moments = [[t[:slots] for t in self.m], [t[:slots] for t in self.v]]
        if self.per_slot:
            lists = [[segment[s] for s in range(slots) for segment in segments]
                     for segments in (params, grads, *moments)]
            steps = list(self.steps[:slots].reshape(-1).unbind())
        else:
            lists = [list(params), list(grads), *moments]
            steps = list(self.steps.unbind())
        param_list, grad_list, m_list, v_list = lists
        adam(param_list, grad_list, m_list, v_list, [], steps, fused=True, amsgrad=False,
             maximize=False, weight_decay=0.0, lr=config.lr, beta1=config.betas[0],
             beta2=config.betas[1], eps=config.eps)
