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
from collections.abc import Callable, Sequence

import numpy as np
import openfhe

from fednorm.engine.ckks import ring
from fednorm.engine.ckks.context import COEFFICIENT_TOWERS, CkksContext
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import InputError

CAPACITY_MARGIN_BITS = 2
"""Integers of a pooled coefficient upload stay below Q/2^(2+this): room for the noise."""

ZERO_MARGIN_BITS = 64
"""A decrypted coefficient is read as zero within Q·2^-64 of it (Q ≈ 2^160 at the
presets' three towers of 60, 50 and 50 bits: within 2^96)."""


def encrypt_masked(ctx: CkksContext, public_key: openfhe.PublicKey,
                   zero_here: np.ndarray) -> openfhe.Ciphertext:
    """A fresh encryption under ``public_key``, at :data:`~.context.COEFFICIENT_TOWERS`
    towers, of the polynomial whose coefficient j is 0 where ``zero_here[j]`` (and past its
    end) and uniform in Z_Q elsewhere."""
    zero_here = np.asarray(zero_here, dtype=bool)
    _require_positions(ctx, zero_here.shape)
    masked = np.flatnonzero(~zero_here)

    def mask(q: int) -> np.ndarray:
        residues = np.zeros(ctx.preset.ring_dim, dtype=np.uint64)
        residues[masked] = uniform_residues(masked.size, q)
        return residues
    return _with_coefficients(ctx, public_key, mask)


def encrypt_coefficients(ctx: CkksContext, public_key: openfhe.PublicKey,
                         integers: Sequence[int]) -> openfhe.Ciphertext:
    """A fresh encryption under ``public_key``, at :data:`~.context.COEFFICIENT_TOWERS`
    towers, of the polynomial whose coefficients are ``integers`` (signed, then zeros):
    the sum of such uploads decrypts to the sum of the integers, coefficient by
    coefficient, exactly up to the ciphertexts' noise and the flooding.  Each |integer|
    must stay below :func:`coefficient_capacity` for the P parties' sum not to wrap."""
    values = [int(v) for v in integers]
    _require_positions(ctx, (len(values),))
    limit = coefficient_capacity(ctx)
    if any(abs(v) >= limit for v in values):
        raise InputError(f"a coefficient upload holds integers below 2^{limit.bit_length() - 1}")

    def residues(q: int) -> np.ndarray:
        out = np.zeros(ctx.preset.ring_dim, dtype=np.uint64)
        out[:len(values)] = np.array([v % q for v in values], dtype=np.uint64)
        return out
    return _with_coefficients(ctx, public_key, residues, support=len(values))


def coefficient_capacity(ctx: CkksContext) -> int:
    """2^k, k the bits below Q/2 (Q: the coefficient towers' moduli) less
    :data:`CAPACITY_MARGIN_BITS`: a pooled coefficient below it decrypts without wrapping
    around Q, flooding included (its 8σ bound: ~2^42 at P = 10, ~2^47 at P = 100, s = 30)."""
    q = math.prod(ctx.moduli[:COEFFICIENT_TOWERS])
    return 1 << (q.bit_length() - 2 - CAPACITY_MARGIN_BITS)


def _require_positions(ctx: CkksContext, shape: tuple[int, ...]) -> None:
    n = ctx.preset.ring_dim
    if len(shape) != 1 or shape[0] > n:
        raise InputError(f"a coefficient upload holds at most {n} positions, got {shape}")


def _with_coefficients(ctx: CkksContext, public_key: openfhe.PublicKey,
                       residues: Callable[[int], np.ndarray], support: int | None = None
                       ) -> openfhe.Ciphertext:
    """A fresh encryption of zero at the coefficient towers, ``residues(q)`` (coefficient
    domain, mod each tower's q; nonzero in the first ``support`` only, if given) added to
    its ``c0`` through the NTT."""
    n = ctx.preset.ring_dim
    ct = ctx.encrypt(public_key, np.zeros(0), ctx.coefficient_level)
    data = bytearray(openfhe.Serialize(ct, openfhe.BINARY))
    moduli = ctx.moduli[:COEFFICIENT_TOWERS]
    c0 = ring.locate_first_element(data, n, COEFFICIENT_TOWERS, moduli)
    for i, q in enumerate(moduli):
        spread = ring.ntt(q, n).forward(residues(q), support)
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
