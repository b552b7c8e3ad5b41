"""A ciphertext read as ring elements: its RNS towers and the integer polynomial they
stand for (what a server holding the bytes could compute), for the flooding tests."""

from __future__ import annotations

import numpy as np
import openfhe

from fednorm.engine.ckks import CkksContext, ring
from fednorm.engine.ckks.decoding import exact_coefficients


def towers_of(ctx: CkksContext, share: openfhe.Ciphertext) -> list[np.ndarray]:
    """The share's residues per tower, in OpenFHE's evaluation domain."""
    data = openfhe.Serialize(share, openfhe.BINARY)
    moduli = ctx.moduli[:ctx.towers(share)]
    layout = ring.locate_towers(data, ctx.preset.ring_dim, len(moduli), moduli)
    return [layout.read(data, i) for i in range(len(moduli))]


def coefficients(ctx: CkksContext, towers: list[np.ndarray]) -> list[int]:
    """The integer polynomial (centered mod Q = Π q_i) whose residues are ``towers``."""
    moduli = ctx.moduli[:len(towers)]
    n = ctx.preset.ring_dim
    residues = [ring.ntt(q, n).inverse(t) for q, t in zip(moduli, towers, strict=True)]
    return exact_coefficients(moduli, residues).tolist()


def flooding_noise(ctx: CkksContext, before: openfhe.Ciphertext,
                   after: openfhe.Ciphertext) -> list[int]:
    """What flooding added to a share: the integer polynomial (centered mod Π q_i) whose
    residues are the towers' differences."""
    moduli = ctx.moduli[:ctx.towers(before)]
    return coefficients(ctx, [ring.add_mod(a, np.uint64(q) - b, q) for q, a, b in
                              zip(moduli, towers_of(ctx, after), towers_of(ctx, before),
                                  strict=True)])
