"""Fusing flooded decryption shares and decoding the slots here, not in OpenFHE.

OpenFHE's ``MultipartyDecryptFusion`` decodes the fused plaintext and refuses it when the
standard deviation of the slots' imaginary parts exceeds 2^-5 in value units ("the
approximation error is too high").  A flooded decryption is noisy by design: its noise
is sized by the ciphertext's own (:mod:`.flooding`), so a MinMax pass's maxima on ±128
come out with a noise of σ ≈ 0.26 at the paper preset and 10 parties, which OpenFHE would
refuse although the pass needs no more.  So the server adds the
parties' shares up itself, tower by tower, lifts the sum to centered integers (CRT) and
evaluates it at the slots' roots of unity: slot k is the polynomial at ζ^(5^k mod 2N),
ζ = e^(iπ/N), divided by the scale (full packing, N/2 slots), as OpenFHE's encoder
places them (checked against OpenFHE's own decoding in
``tests/test_decryption_noise.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import numpy as np
import openfhe

from fednorm.engine.ckks import ring
from fednorm.engine.ckks.context import CkksContext


def fused_slots(ctx: CkksContext, shares: Sequence[openfhe.Ciphertext], scale: float
                ) -> np.ndarray:
    """The real parts of every slot of Σ shares (one-element ciphertexts of one shape)."""
    moduli = ctx.moduli[:ctx.towers(shares[0])]
    return slot_values(centered_integers(moduli, fused_residues(ctx, shares, moduli)), scale)


def fused_coefficients(ctx: CkksContext, shares: Sequence[openfhe.Ciphertext]
                       ) -> np.ndarray:
    """The exact centered coefficients (Python integers) of Σ shares: what a masked sum
    decrypts to (:mod:`.masking`)."""
    moduli = ctx.moduli[:ctx.towers(shares[0])]
    return exact_coefficients(moduli, fused_residues(ctx, shares, moduli))


def fused_residues(ctx: CkksContext, shares: Sequence[openfhe.Ciphertext],
                   moduli: Sequence[int]) -> list[np.ndarray]:
    """The coefficient-domain residues, tower by tower (``moduli``: the shares'), of
    Σ shares."""
    n = ctx.preset.ring_dim
    totals: list[np.ndarray] = []
    for share in shares:
        data = openfhe.Serialize(share, openfhe.BINARY)
        towers = ring.locate_towers(data, n, len(moduli), moduli)
        for i, q in enumerate(moduli):
            tower = towers.read(data, i)
            if len(totals) <= i:
                totals.append(tower)
            else:
                totals[i] = ring.add_mod(totals[i], tower, q)
    return [ring.ntt(q, n).inverse(t) for q, t in zip(moduli, totals, strict=True)]


def centered_integers(moduli: Sequence[int], residues: Sequence[np.ndarray]) -> np.ndarray:
    """The coefficients (float64) of the polynomial whose residues mod each modulus are
    ``residues``: :func:`exact_coefficients`, rounded to float64."""
    return exact_coefficients(moduli, residues).astype(np.float64)


def exact_coefficients(moduli: Sequence[int], residues: Sequence[np.ndarray]) -> np.ndarray:
    """The coefficients (Python integers, an object array) of the polynomial whose
    residues mod each modulus are ``residues``: CRT to [0, Q), centered to (-Q/2, Q/2]."""
    big_q = math.prod(moduli)
    total = np.zeros(len(residues[0]), dtype=object)
    for q, r in zip(moduli, residues, strict=True):
        weight = (big_q // q) * pow(big_q // q, -1, q)
        total = total + r.astype(object) * weight
    total = total % big_q
    return np.where(total > big_q // 2, total - big_q, total)


def slot_values(coefficients: np.ndarray, scale: float) -> np.ndarray:
    """The real parts of the N/2 slots of a polynomial given by its N coefficients."""
    return evaluations(coefficients)[_slot_order(len(coefficients))].real / scale


def evaluations(coefficients: np.ndarray) -> np.ndarray:
    """The polynomial at every odd power ζ^(2k+1), k = 0..N−1 (the slots and their
    conjugates): N·IFFT of the coefficients twisted by ζ^j."""
    n = len(coefficients)
    return n * np.fft.ifft(coefficients * _twist(n))


@cache
def _twist(n: int) -> np.ndarray:
    return np.exp(1j * np.pi * np.arange(n) / n)


@cache
def _slot_order(n: int) -> np.ndarray:
    """Index k of the odd power ζ^(2k+1) = ζ^(5^s mod 2N) for each slot s."""
    powers = np.empty(n // 2, dtype=np.int64)
    power = 1
    for s in range(n // 2):
        powers[s] = power
        power = power * 5 % (2 * n)
    return (powers - 1) // 2
