"""What the benchmarks run on: BCW split over P parties, Table VI's synthetic data, and
the CKKS context, built and warmed up before any timing starts."""

from __future__ import annotations

import time

import numpy as np

from fednorm.bench.paper import TABLE_VI_DATA, TABLE_VI_SHAPE
from fednorm.engine import ckks
from fednorm.sim.datasets import load_dataset
from fednorm.sim.partition import partition


def bcw_split(parties: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """BCW split IID over ``parties``; also the pooled rows (for the numpy oracle)."""
    ds = load_dataset("bcw")
    parts = [p.X for p in partition(ds.X, ds.y, parties, "iid", seed=seed)]
    return parts, np.vstack(parts)


def synthetic(kind: str, seed: int, shape: tuple[int, int] = TABLE_VI_SHAPE) -> np.ndarray:
    """Table VI's stand-in data: small-valued or large-valued normal draws."""
    loc, scale = TABLE_VI_DATA[kind]
    return np.random.default_rng(seed).normal(loc, scale, size=shape)


def synthetic_split(kind: str, seed: int, parties: int) -> tuple[list[np.ndarray], np.ndarray]:
    """:func:`synthetic` data split IID over ``parties``, and the pooled rows."""
    X = synthetic(kind, seed)
    return [p.X for p in partition(X, None, parties, "iid", seed=seed)], X


WARMUP_S: dict[str, float] = {}
"""Seconds the first :func:`col_context` call of each preset took (context + codec)."""


def col_context(preset: str) -> ckks.CkksContext:
    """The process-wide context the protocols use (built once, cached by the library).

    The first call also warms the process up: it parses one object of each kind the
    protocols send, so the codec's one-time template checks (throwaway keys, ~1 s per
    kind at ring 2^15) are not charged to the first measured run. A long-running party
    or server process pays this once, at start-up.
    """
    from fednorm.protocols.collective import shared_context

    if preset in WARMUP_S:
        return shared_context(preset)
    started = time.perf_counter()
    ctx = shared_context(preset)
    lead = ckks.PartyKeys.generate(ctx)
    ctx.from_bytes("public_key", ctx.to_bytes(lead.public_key_share))
    ctx.from_bytes("ciphertext", ctx.to_bytes(ctx.encrypt(lead.public_key_share, [0.5])))
    ctx.from_bytes("eval_key", ctx.to_bytes(lead.relin_share()))
    WARMUP_S[preset] = time.perf_counter() - started
    return ctx
