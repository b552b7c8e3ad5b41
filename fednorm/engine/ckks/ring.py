"""Ring elements as numbers: the RNS towers of a serialized OpenFHE polynomial, and the
negacyclic number-theoretic transform (NTT) OpenFHE keeps them in.

OpenFHE 1.6.1's Python API treats a ring element (``DCRTPoly``) as opaque, so fednorm
reads and writes its coefficients in the serialized bytes (as :mod:`.crs` builds common
random elements): each tower is N little-endian 64-bit residues mod ``q_i``, in the
evaluation domain.  Noise that must be small and independent *per coefficient* (noise
flooding, :mod:`.flooding`) is drawn in the coefficient domain and carried to the
evaluation domain with :meth:`Ntt.forward`.

The transform is OpenFHE's: ``ψ`` is the smallest primitive 2N-th root of unity mod
``q_i``, and the evaluation of ``a`` at ``ψ^(2·rev(i)+1)`` is stored at position ``i``
(``rev`` reverses the bits of ``i``).  :func:`check_convention` confirms it on a secret
key, whose coefficients are ternary only under the right transform.
"""

from __future__ import annotations

import secrets
import struct
import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import openfhe

from fednorm.engine.errors import ProtocolError

_LOW32 = np.uint64(0xFFFF_FFFF)
_32 = np.uint64(32)


def _mulhi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The high 64 bits of the 128-bit products a·b (uint64), from 32-bit halves."""
    a_lo, a_hi, b_lo, b_hi = a & _LOW32, a >> _32, b & _LOW32, b >> _32
    lo_lo, hi_lo, lo_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi
    middle = (lo_lo >> _32) + (hi_lo & _LOW32) + (lo_hi & _LOW32)
    return a_hi * b_hi + (hi_lo >> _32) + (lo_hi >> _32) + (middle >> _32)


def _mulmod(a: np.ndarray, w: np.ndarray, w_shoup: np.ndarray, q: int) -> np.ndarray:
    """``a·w mod q`` for residues ``a`` below ``q < 2^62`` and constants ``w`` with
    ``w_shoup = ⌊w·2^64/q⌋`` (Shoup's multiplication: the quotient's estimate is off by at
    most one, so one conditional subtraction finishes it)."""
    modulus = np.uint64(q)
    rest = a * w - _mulhi(a, w_shoup) * modulus  # wraps mod 2^64 to the true value < 2q
    return np.minimum(rest, rest - modulus)  # below q, rest − q wraps above rest


FLOAT_QUOTIENT_BITS = 51
"""Below 2^51 a modulus takes :func:`_mulmod_float`: a, w < q, so the float64 quotient
a·(w/q) is within 1/2 of the true one and the remainder within (−q, 2q)."""


def _mulmod_float(a: np.ndarray, w: np.ndarray, w_over_q: np.ndarray, q: int) -> np.ndarray:
    """``a·w mod q`` for ``q < 2^51`` from the quotient estimated in float64 (``w_over_q``
    = w/q rounded): off by at most one, so the wrapped remainder a·w − ⌊a·w/q⌋·q lies in
    (−q, 2q) and two corrections finish it; a third fewer array operations than
    :func:`_mulmod`."""
    modulus = np.uint64(q)
    estimate = (a.astype(np.float64) * w_over_q).astype(np.uint64)
    rest = (a * w - estimate * modulus).view(np.int64)  # wraps to the true value
    rest = np.where(rest < 0, rest + np.int64(q), rest).view(np.uint64)
    return np.minimum(rest, rest - modulus)


def _shoup(w: np.ndarray, q: int) -> np.ndarray:
    """⌊w·2^64/q⌋ for residues ``w`` below q, vectorized: w·⌊2^64/q⌋ + ⌊w·(2^64 mod q)/q⌋,
    the second quotient by Shoup's estimate and one correction (w·⌊2^64/q⌋ stays below
    the result, so below 2^64)."""
    w = np.asarray(w, dtype=np.uint64)
    whole, rest = divmod(1 << 64, q)
    estimate = _mulhi(w, np.uint64((rest << 64) // q))
    remainder = w * np.uint64(rest) - estimate * np.uint64(q)  # wraps to a value < 2q
    return w * np.uint64(whole) + estimate + (remainder >= np.uint64(q)).astype(np.uint64)


def _bit_reversed(n: int) -> np.ndarray:
    bits = n.bit_length() - 1
    index = np.arange(n, dtype=np.uint64)
    out = np.zeros(n, dtype=np.uint64)
    for bit in range(bits):
        out |= ((index >> np.uint64(bit)) & np.uint64(1)) << np.uint64(bits - 1 - bit)
    return out.astype(np.int64)


def _smallest_primitive_root(q: int, order: int) -> int:
    """The smallest primitive ``order``-th root of unity mod the prime ``q`` (order a
    power of two dividing q - 1), as OpenFHE chooses it."""
    if (q - 1) % order:
        raise ProtocolError(f"{q} has no primitive {order}-th root of unity")
    generator = None
    for base in range(2, 1 << 16):
        candidate = pow(base, (q - 1) // order, q)
        if pow(candidate, order // 2, q) == q - 1:
            generator = candidate
            break
    if generator is None:
        raise ProtocolError(f"no primitive {order}-th root of unity found mod {q}")
    # every odd power of a primitive root is one: g·(g²)^k, k < order/2
    odd_powers = _times(_powers(generator * generator % q, order // 2, q), generator, q)
    return int(odd_powers.min())


@dataclass(frozen=True)
class Ntt:
    """The negacyclic NTT of Z_q[X]/(X^N + 1) in OpenFHE's convention (module doc)."""

    modulus: int
    ring_dim: int
    psi_powers: np.ndarray  # ψ^rev(k), k < N (bit-reversed order)
    psi_shoup: np.ndarray  # their Shoup constants
    inverse_psi_powers: np.ndarray  # ψ^-rev(k)
    inverse_psi_shoup: np.ndarray
    inverse_n: int

    @classmethod
    def make(cls, modulus: int, ring_dim: int) -> Ntt:
        psi = _smallest_primitive_root(modulus, 2 * ring_dim)
        rev = _bit_reversed(ring_dim)
        powers = _powers(psi, ring_dim, modulus)
        inverse = _powers(pow(psi, -1, modulus), ring_dim, modulus)
        powers, inverse = powers[rev], inverse[rev]
        return cls(modulus, ring_dim, powers, _shoup(powers, modulus), inverse,
                   _shoup(inverse, modulus), pow(ring_dim, -1, modulus))

    def forward(self, coefficients: np.ndarray, support: int | None = None) -> np.ndarray:
        """Evaluation-domain residues (OpenFHE's order) of residues ``coefficients``;
        ``support``: only the first that many may be nonzero (a short vector written into
        a ring element), so each stage whose lower halves are all zero is a copy."""
        a, q, n = coefficients.astype(np.uint64).copy(), self.modulus, self.ring_dim
        half, groups = n // 2, 1
        support = n if support is None else support
        while groups < n:  # Cooley–Tukey: groups of 2·half, twiddle ψ^rev(groups + g)
            view = a.reshape(groups, 2, half)
            if support <= half:  # (u + w·0, u − w·0): each half becomes the upper one
                view[:, 1, :] = view[:, 0, :]
                groups, half = groups * 2, half // 2
                continue
            upper, lower = view[:, 0, :].copy(), view[:, 1, :]
            twiddles = slice(groups, 2 * groups)
            twisted = self._times_twiddles(lower, twiddles)
            view[:, 0, :] = add_mod(upper, twisted, q)
            view[:, 1, :] = _sub(upper, twisted, q)
            groups, half = groups * 2, half // 2
        return a

    def _times_twiddles(self, values: np.ndarray, twiddles: slice) -> np.ndarray:
        """``values`` (groups × half) times ψ^rev(g) per group g of ``twiddles``, mod q."""
        powers = self.psi_powers[twiddles, None]
        if self.modulus < 1 << FLOAT_QUOTIENT_BITS:
            return _mulmod_float(values, powers, self.psi_over_q[twiddles, None],
                                 self.modulus)
        return _mulmod(values, powers, self.psi_shoup[twiddles, None], self.modulus)

    @cached_property
    def psi_over_q(self) -> np.ndarray:
        """ψ^rev(k)/q in float64, for :func:`_mulmod_float`."""
        return self.psi_powers.astype(np.float64) / self.modulus

    def inverse(self, evaluations: np.ndarray) -> np.ndarray:
        """Coefficient residues of evaluation-domain residues (OpenFHE's order)."""
        a, q, n = evaluations.astype(np.uint64).copy(), self.modulus, self.ring_dim
        half, groups = 1, n // 2
        while groups >= 1:  # Gentleman–Sande, undoing :meth:`forward` stage by stage
            view = a.reshape(groups, 2, half)
            upper, lower = view[:, 0, :].copy(), view[:, 1, :].copy()
            view[:, 0, :] = add_mod(upper, lower, q)
            twiddles = slice(groups, 2 * groups)
            view[:, 1, :] = _mulmod(_sub(upper, lower, q),
                                    self.inverse_psi_powers[twiddles, None],
                                    self.inverse_psi_shoup[twiddles, None], q)
            groups, half = groups // 2, half * 2
        scale = np.array([self.inverse_n], dtype=np.uint64)
        return _mulmod(a, scale, _shoup(scale, q), q)


def _powers(base: int, count: int, q: int) -> np.ndarray:
    """base^k mod q for k < ``count``, by doubling: the second half of the first 2m is
    the first m times base^m."""
    out = np.ones(1, dtype=np.uint64)
    while out.size < count:
        out = np.concatenate([out, _times(out, pow(base, out.size, q), q)])
    return out[:count]


def _times(values: np.ndarray, factor: int, q: int) -> np.ndarray:
    """``values``·``factor`` mod q (residues below q, one constant factor)."""
    w = np.array([factor % q], dtype=np.uint64)
    return _mulmod(values, w, _shoup(w, q), q)


def add_mod(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """(a + b) mod q for residues below q < 2^62 (no wrap; min picks the reduced one)."""
    total = a + b
    return np.minimum(total, total - np.uint64(q))


def _sub(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    return add_mod(a, np.uint64(q) - b, q)


_transforms: dict[tuple[int, int], Ntt] = {}
_transforms_lock = threading.Lock()


def ntt(modulus: int, ring_dim: int) -> Ntt:
    """The transform for one tower, made once per process: parties in threads that ask
    at once wait for the first one's tables instead of each making its own."""
    with _transforms_lock:
        key = (modulus, ring_dim)
        if key not in _transforms:
            _transforms[key] = Ntt.make(modulus, ring_dim)
        return _transforms[key]


def residues(values: np.ndarray, modulus: int) -> np.ndarray:
    """Signed integers (int64, any magnitude) as residues mod ``modulus`` (< 2^63)."""
    return np.mod(values.astype(np.int64), np.int64(modulus)).astype(np.uint64)


def centered(values: np.ndarray, modulus: int) -> np.ndarray:
    """Residues mod ``modulus`` (below 2^62) as int64 in (-q/2, q/2]."""
    signed = values.astype(np.uint64).view(np.int64)
    return np.where(signed > modulus // 2, signed - np.int64(modulus), signed)


@dataclass(frozen=True)
class Multiplier:
    """A ring element in the evaluation domain, tower by tower, with the Shoup constants
    that multiply other elements by it pointwise (the NTT turns the ring's product into
    that): a secret key share times a ciphertext's ``c1``, for a decryption share."""

    moduli: tuple[int, ...]
    residues: tuple[np.ndarray, ...]
    shoup: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, data: bytes, ring_dim: int, towers: int, moduli: tuple[int, ...]
           ) -> Multiplier:
        """The first ``towers`` towers of the serialized polynomial ``data`` (its
        ``len(moduli)`` towers at the end of the bytes)."""
        layout = locate_towers(data, ring_dim, len(moduli), moduli)
        residues = tuple(layout.read(data, i) for i in range(towers))
        return cls(tuple(moduli[:towers]), residues,
                   tuple(_shoup(r, q) for r, q in zip(residues, moduli, strict=False)))

    def times(self, tower: int, values: np.ndarray) -> np.ndarray:
        """``values`` (residues of tower ``tower``) times this element's, pointwise."""
        return _mulmod(values, self.residues[tower], self.shoup[tower], self.moduli[tower])


# -- serialized towers ---------------------------------------------------------------------
@dataclass(frozen=True)
class Towers:
    """Where the RNS towers of a serialized polynomial sit: byte offsets of their N
    coefficients, first tower first."""

    offsets: tuple[int, ...]
    ring_dim: int

    def read(self, data: bytes | bytearray, tower: int) -> np.ndarray:
        start = self.offsets[tower]
        return np.frombuffer(bytes(data[start:start + 8 * self.ring_dim]), dtype="<u8") \
            .astype(np.uint64)

    def write(self, data: bytearray, tower: int, values: np.ndarray) -> None:
        start = self.offsets[tower]
        data[start:start + 8 * self.ring_dim] = values.astype("<u8").tobytes()


def locate_towers(data: bytes | bytearray, ring_dim: int, count: int,
                  moduli: tuple[int, ...] = ()) -> Towers:
    """The towers of a serialized polynomial (or of the last element of a serialized
    ciphertext), which must be exactly ``count``.

    Each tower is a length field N followed by N 64-bit residues, towers evenly spaced
    at the end of the bytes; if ``moduli`` are given, every residue of tower i must lie
    below ``moduli[i]``.  Raises ProtocolError if the bytes do not hold that shape.
    """
    size_field, width = struct.pack("<Q", ring_dim), 8 * ring_dim
    found, position, blob = [], 0, bytes(data)
    while (hit := blob.find(size_field, position)) >= 0:
        if hit + 8 + width <= len(blob):
            found.append(hit + 8)
        position = hit + 1
    chain = _evenly_spaced_tail(found, width)
    if len(chain) != count:
        raise ProtocolError(f"serialized polynomial has {len(chain)} towers, expected {count}")
    towers = Towers(tuple(chain), ring_dim)
    for i, modulus in enumerate(moduli[:count]):
        if np.any(towers.read(blob, i) >= np.uint64(modulus)):
            raise ProtocolError(f"tower {i} of a serialized polynomial exceeds its modulus")
    return towers


def locate_first_element(data: bytes | bytearray, ring_dim: int, count: int,
                         moduli: tuple[int, ...] = ()) -> Towers:
    """The towers of the *first* element (c0) of a serialized two-element ciphertext: the
    evenly spaced run of towers that ends before the last element's
    (:func:`locate_towers`), which must be exactly ``count``."""
    last = locate_towers(data, ring_dim, count, moduli)
    return locate_towers(bytes(data[:last.offsets[0] - 8]), ring_dim, count, moduli)


def _evenly_spaced_tail(found: list[int], width: int) -> list[int]:
    """The longest run of offsets at the end of ``found`` spaced evenly, ≥ ``width`` apart."""
    if not found:
        return []
    chain = [found[-1]]
    for offset in reversed(found[:-1]):
        gap = chain[0] - offset
        if gap < width:
            continue  # a length field's pattern inside a tower's residues
        if len(chain) > 1 and gap != chain[1] - chain[0]:
            break
        chain.insert(0, offset)
    return chain


# -- the context's moduli ------------------------------------------------------------------
_moduli_lock = threading.Lock()
_moduli: dict[bytes, tuple[int, ...]] = {}


def tower_moduli(raw: openfhe.CryptoContext, fingerprint: bytes, ring_dim: int,
                 towers: int) -> tuple[int, ...]:
    """The ciphertext moduli q_0, q_1, … of a context (cached per parameter fingerprint).

    Read from a throwaway encryption and its negation (a + (-a) = q wherever a ≠ 0);
    the throwaway key pair is made and dropped here, it encrypts nothing of anyone's.
    """
    with _moduli_lock:
        if fingerprint in _moduli:
            return _moduli[fingerprint]
    pair = raw.KeyGen()
    plaintext = raw.MakeCKKSPackedPlaintext([float(secrets.randbelow(1000) + 1)])
    ct = raw.Encrypt(pair.publicKey, plaintext)
    ct.RemoveElement(0)  # keep c1: uniform, so every tower has nonzero residues
    data = openfhe.Serialize(ct, openfhe.BINARY)
    negated = openfhe.Serialize(raw.EvalNegate(ct), openfhe.BINARY)
    layout = locate_towers(data, ring_dim, towers)
    moduli = tuple(_modulus(layout.read(data, i), layout.read(negated, i))
                   for i in range(towers))
    with _moduli_lock:
        _moduli[fingerprint] = moduli
    return moduli


def _modulus(values: np.ndarray, negated: np.ndarray) -> int:
    sums = (values + negated)[values != 0]
    if sums.size == 0 or not np.all(sums == sums[0]):
        raise ProtocolError("cannot read a tower modulus")
    return int(sums[0])


def check_convention(secret_key_bytes: bytes, moduli: tuple[int, ...], ring_dim: int) -> None:
    """ProtocolError unless :class:`Ntt` inverts OpenFHE's transform: a secret key's
    towers must come back as the same ternary polynomial in every tower."""
    layout = locate_towers(secret_key_bytes, ring_dim, len(moduli), moduli)
    first = None
    for i, modulus in enumerate(moduli):
        signed = centered(ntt(modulus, ring_dim).inverse(layout.read(secret_key_bytes, i)),
                          modulus)
        if np.any(np.abs(signed) > 1) or (first is not None and np.any(signed != first)):
            raise ProtocolError("OpenFHE's ring layout is not the one fednorm's NTT assumes")
        first = signed
