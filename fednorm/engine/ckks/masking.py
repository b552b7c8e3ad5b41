"""Masked zeros: an AND of the parties' bits from a flooded *sum*, no product, no keys
beyond the joint public key.

Each party encrypts, per coefficient of the ring, 0 where its bit is 1 and an element
drawn uniformly from Z_Q (Q the product of the upload's tower moduli) where its bit is
0.  The sum of the P uploads decrypts, coefficient by coefficient, to 0 where every
party's bit is 1 — plus the ciphertexts' noise and the parties' flooding, a few bits
over 2^40 — and elsewhere to a uniform element of Z_Q: one party's uniform mask makes
the sum uniform whatever the others added, so it tells nothing about how many parties
had a 0, or which.  The server reads each coefficient as a bit: 1 where the centered
value lies within Q·2^-:data:`ZERO_MARGIN_BITS`, which a uniform element does with
probability 2^-63 and the largest flooding noise the sampler draws (σ < 2^56, eight σ,
√P parties) never leaves for fewer than 2^70 parties.

This replaces a product of P bit encryptions (a tree of relinearized products, so a
relinearization key and its two-round collective setup) with one addition per party:
the default MinMax's threshold search (:mod:`fednorm.protocols.ppf.extremes`) reveals the
same bits.  The mask lives in the coefficient embedding, where decryption is exact mod Q;
CKKS's slot encoding cannot carry it (it encodes reals at a scale), so it is written into
the ciphertext's first ring element, ``c0``, through the number-theoretic transform
(:mod:`.ring`), as :mod:`.flooding` writes its noise into a share.
"""

from __future__ import annotations

import math
import os

import numpy as np
import openfhe

from fednorm.engine.ckks import ring
from fednorm.engine.ckks.context import MASK_TOWERS, CkksContext
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import InputError

ZERO_MARGIN_BITS = 64
"""A decrypted coefficient is read as zero within Q·2^-64 of it (Q ≈ 2^160 at the
presets' three towers of 60, 50 and 50 bits: within 2^96)."""


def encrypt_masked(ctx: CkksContext, public_key: openfhe.PublicKey,
                   zero_here: np.ndarray) -> openfhe.Ciphertext:
    """A fresh encryption under ``public_key``, at :data:`~.context.MASK_TOWERS` towers,
    of the polynomial whose coefficient j is 0 where ``zero_here[j]`` (and past its end)
    and uniform in Z_Q elsewhere."""
    zero_here = np.asarray(zero_here, dtype=bool)
    n = ctx.preset.ring_dim
    if zero_here.ndim != 1 or zero_here.size > n:
        raise InputError(f"a masked upload holds at most {n} positions, got "
                         f"{zero_here.shape}")
    ct = ctx.encrypt(public_key, np.zeros(0), ctx.mask_level)
    data = bytearray(openfhe.Serialize(ct, openfhe.BINARY))
    moduli = ctx.moduli[:MASK_TOWERS]
    c0 = ring.locate_first_element(data, n, MASK_TOWERS, moduli)
    masked = np.flatnonzero(~zero_here)
    for i, q in enumerate(moduli):
        mask = np.zeros(n, dtype=np.uint64)
        mask[masked] = uniform_residues(masked.size, q)
        spread = ring.ntt(q, n).forward(mask)
        c0.write(data, i, ring.add_mod(c0.read(data, i), spread, q))
    return deserialize(openfhe.DeserializeCiphertextString, bytes(data))


def uniform_residues(count: int, modulus: int) -> np.ndarray:
    """``count`` residues drawn uniformly from [0, ``modulus``) by rejection from the
    operating system's CSPRNG (no modulo bias: the mask must be exactly uniform)."""
    bits = modulus.bit_length()
    out = np.empty(0, dtype=np.uint64)
    while out.size < count:  # each word is kept with probability > 1/2
        words = np.frombuffer(os.urandom(16 * (count - out.size) + 64), dtype=np.uint64)
        candidates = words >> np.uint64(64 - bits)
        out = np.concatenate([out, candidates[candidates < np.uint64(modulus)]])
    return out[:count]


def zero_bits(coefficients: np.ndarray, moduli: tuple[int, ...]) -> np.ndarray:
    """1.0 where a centered coefficient (Python integers, :func:`~.decoding.
    exact_coefficients`) lies within Q·2^-:data:`ZERO_MARGIN_BITS`, else 0.0."""
    bound = math.prod(moduli) >> ZERO_MARGIN_BITS
    return (np.abs(coefficients) <= bound).astype(np.float64)
