"""Common random elements from a seed every role can recompute (a CRS, as in Lattigo).

Collective bootstrapping needs a uniformly random ring element ``a``: each party's
re-encryption share is ``-s_i·a + M_i + e_i``.  If the server could choose ``a`` — say
``a = 0``, or ``a`` from the public key, where it knows ``s·a`` up to small noise — the
sum of a party's two shares would be an unflooded decryption share of the target, and
the server alone could decrypt it (demonstrated on ``EvalSub(a, a)``).  So ``a`` is never
sent: server and parties each expand it from a public seed they derive alike
(:func:`bootstrap_seed`), and a party refuses a request for any other seed.

OpenFHE 1.6.1's Python API cannot seed its sampler or build a ring element from
numbers, so the element is written into a serialized template: the byte layout of a
random element (made once per joint key with ``IntMPBootRandomElementGen``) is found by
comparing two random elements, the tower moduli from ``a + (-a) = q``, and each tower's
coefficients are then drawn uniformly mod ``q_i`` from SHAKE-256(seed) by rejection
sampling.  Uniform coefficients in the evaluation (NTT) domain are uniform ring
elements, as OpenFHE's own sampler draws them.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from dataclasses import dataclass

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import ProtocolError

_DOMAIN = b"fednorm/bootstrap-crs/v1"
_RECENT_ELEMENTS = 4


def bootstrap_seed(joint_tag: str, index: int) -> bytes:
    """The seed of the ``index``-th collective bootstrap under the joint key ``joint_tag``.

    The joint tag is fresh for every key setup, and both sides count bootstraps over the
    keys' lifetime, so no seed (hence no ``a``) is ever used twice.
    """
    if index < 0:
        raise ProtocolError(f"bootstrap index {index} is negative")
    return hashlib.sha256(_DOMAIN + joint_tag.encode() + struct.pack("<Q", index)).digest()


@dataclass(frozen=True)
class _Tower:
    offset: int  # byte offset of the tower's N little-endian uint64 coefficients
    modulus: int


class CommonRandomElements:
    """Expands seeds into full-level random elements under one joint key."""

    def __init__(self, ctx: CkksContext, joint_public_key: openfhe.PublicKey) -> None:
        first = ctx.raw.IntMPBootRandomElementGen(joint_public_key)
        second = ctx.raw.IntMPBootRandomElementGen(joint_public_key)
        self._ring_dim = ctx.preset.ring_dim
        self._template = openfhe.Serialize(first, openfhe.BINARY)
        other = openfhe.Serialize(second, openfhe.BINARY)
        negated = openfhe.Serialize(ctx.raw.EvalNegate(first), openfhe.BINARY)
        self._towers = _locate_towers(self._template, other, negated, self._ring_dim,
                                      ctx.preset.towers)
        self._recent: dict[bytes, openfhe.Ciphertext] = {}
        self._lock = threading.Lock()

    def element(self, seed: bytes) -> openfhe.Ciphertext:
        """The random element for ``seed``: same seed, same element, in every process.

        The last few are kept: every role of a simulation derives the same element, and
        OpenFHE only reads it (nobody mutates ``a``), so one object serves them all.
        """
        with self._lock:
            cached = self._recent.get(seed)
        if cached is None:
            cached = self._expand(seed)
            with self._lock:
                self._recent[seed] = cached
                while len(self._recent) > _RECENT_ELEMENTS:
                    self._recent.pop(next(iter(self._recent)))
        return cached

    def _expand(self, seed: bytes) -> openfhe.Ciphertext:
        data = bytearray(self._template)
        width = 8 * self._ring_dim
        for i, tower in enumerate(self._towers):
            values = _uniform_mod(seed, i, tower.modulus, self._ring_dim)
            data[tower.offset:tower.offset + width] = values.astype("<u8").tobytes()
        return deserialize(openfhe.DeserializeCiphertextString, bytes(data))


def _locate_towers(template: bytes, other: bytes, negated: bytes, ring_dim: int,
                   towers: int) -> list[_Tower]:
    """Where each tower's coefficients sit in a serialized random element, and its modulus.

    Raises ProtocolError if the layout is not the expected one (towers × N coefficients,
    every other byte identical between two random elements).
    """
    if not len(template) == len(other) == len(negated):
        raise ProtocolError("random elements serialize to different lengths")
    size_field = struct.pack("<Q", ring_dim)
    width = 8 * ring_dim
    found: list[_Tower] = []
    position = 0
    while len(found) < towers:
        offset = template.find(size_field, position) + 8
        if offset < 8 or offset + width > len(template):
            raise ProtocolError("cannot find the coefficient layout of a random element")
        first, last = slice(offset, offset + 8), slice(offset + width - 8, offset + width)
        if other[offset - 8:offset] != size_field or template[first] == other[first] \
                or template[last] == other[last]:  # random coefficients differ at both ends
            position = offset - 7
            continue
        region = slice(offset, offset + width)
        found.append(_Tower(offset, _modulus(template[region], negated[region])))
        position = offset + width
    _require_only_coefficients_differ(template, other, found, width)
    return found


def _modulus(values: bytes, negated: bytes) -> int:
    """q from a tower of ``a`` and the same tower of ``-a`` (a + (-a) = q where a ≠ 0)."""
    a = np.frombuffer(values, dtype="<u8")
    minus_a = np.frombuffer(negated, dtype="<u8")
    sums = (a + minus_a)[a != 0]
    if sums.size == 0 or not np.all(sums == sums[0]):
        raise ProtocolError("cannot read a tower modulus of the random element")
    modulus = int(sums[0])
    if not 2**20 < modulus < 2**62 or np.any(a >= modulus):
        raise ProtocolError(f"implausible tower modulus {modulus}")
    return modulus


def _require_only_coefficients_differ(template: bytes, other: bytes, towers: list[_Tower],
                                      width: int) -> None:
    start = 0
    for tower in towers:
        if template[start:tower.offset] != other[start:tower.offset]:
            raise ProtocolError("random elements differ outside their coefficients")
        start = tower.offset + width
    if template[start:] != other[start:]:
        raise ProtocolError("random elements differ outside their coefficients")


def _uniform_mod(seed: bytes, tower: int, modulus: int, count: int) -> np.ndarray:
    """``count`` values uniform in [0, modulus), by rejection from SHAKE-256(seed, tower)."""
    mask = np.uint64((1 << modulus.bit_length()) - 1)
    draws = 2 * count + 4096  # acceptance is above 1/2: short only with negligible chance
    stream = hashlib.shake_256(seed + struct.pack("<H", tower)).digest(8 * draws)
    candidates = np.frombuffer(stream, dtype="<u8") & mask
    accepted = candidates[candidates < np.uint64(modulus)]
    if accepted.size < count:
        raise ProtocolError("common random element: seed stream too short (retry the run)")
    return accepted[:count]


_CACHE_SIZE = 4
_cache: dict[tuple[str, str], CommonRandomElements] = {}
_cache_lock = threading.Lock()


def common_element(ctx: CkksContext, joint_public_key: openfhe.PublicKey,
                   index: int) -> openfhe.Ciphertext:
    """The random element of the ``index``-th collective bootstrap under this joint key
    (the same in every process: server and parties derive it, nobody sends it)."""
    tag = joint_public_key.GetKeyTag()
    key = (ctx.preset.name, tag)
    with _cache_lock:
        elements = _cache.get(key)
        if elements is None:
            elements = _cache[key] = CommonRandomElements(ctx, joint_public_key)
            while len(_cache) > _CACHE_SIZE:
                _cache.pop(next(iter(_cache)))
    return elements.element(bootstrap_seed(tag, index))
