"""Common random elements from a seed every role can recompute (a CRS, as in Lattigo).

Collective bootstrapping needs a uniformly random ring element ``a``: each party's
re-encryption share is ``-s_i·a + M_i + e_i``.  If the server could choose ``a`` — say
``a = 0``, or ``a`` from the public key, where it knows ``s·a`` up to small noise — the
sum of a party's two shares would be an unflooded decryption share of the target, and
the server alone could decrypt it (demonstrated on ``EvalSub(a, a)``).  So ``a`` is never
sent: server and parties each expand it from a public seed they derive alike
(:func:`bootstrap_seed`), and a party refuses a request for any other seed.

OpenFHE 1.6.1's Python API cannot seed its sampler or build a ring element from
numbers, so the element is written into a serialized template: the towers of a random
element (made once per joint key with ``IntMPBootRandomElementGen``) are located by
:func:`.ring.locate_towers`, and each tower's coefficients are then drawn uniformly mod
``q_i`` (the context's moduli) from SHAKE-256(seed) by rejection sampling.  Uniform
coefficients in the evaluation (NTT) domain are uniform ring
elements, as OpenFHE's own sampler draws them.
"""

from __future__ import annotations

import hashlib
import struct
import threading

import numpy as np
import openfhe

from fednorm.engine.ckks import ring
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


class CommonRandomElements:
    """Expands seeds into full-level random elements under one joint key."""

    def __init__(self, ctx: CkksContext, joint_public_key: openfhe.PublicKey) -> None:
        template = ctx.raw.IntMPBootRandomElementGen(joint_public_key)
        self._ring_dim = ctx.preset.ring_dim
        self._template = openfhe.Serialize(template, openfhe.BINARY)
        self._moduli = ctx.moduli
        self._towers = ring.locate_towers(self._template, self._ring_dim, len(self._moduli),
                                          self._moduli)
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
        for i, modulus in enumerate(self._moduli):
            self._towers.write(data, i, _uniform_mod(seed, i, modulus, self._ring_dim))
        return deserialize(openfhe.DeserializeCiphertextString, bytes(data))


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
