"""CKKS parameter presets.

Every role (server, each party) rebuilds the same crypto context from a preset *name*,
so objects serialized in one process load in another. A preset is plain data (hashable,
picklable); :class:`~fednorm.engine.ckks.context.CkksContext` turns it into OpenFHE calls.
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass

from fednorm.engine.errors import InputError

_FEATURES = ("PKE", "KEYSWITCH", "LEVELEDSHE", "ADVANCEDSHE", "MULTIPARTY")

# Extra RNS towers IntMPBootAdjustScale keeps beyond the message tower, per compression
# level (OpenFHE's COMPRESSION_LEVEL values): SLACK keeps 3, COMPACT keeps 2.
_BOOT_COMPRESSION_TOWERS = {"SLACK": 3, "COMPACT": 2}


@dataclass(frozen=True)
class CkksPreset:
    """Parameters of a multiparty CKKS context (threshold, N-out-of-N).

    ``level_budget`` is the number of multiplicative levels a ciphertext may consume
    between two collective bootstraps: ``depth - 4`` with FLEXIBLEAUTO and SLACK
    compression (7 at depth 11, 5 at depth 9). Measured on openfhe 1.6.1, rings 2^14 and
    2^15: up to ``depth - 4`` every bootstrap was right; at ``depth - 3`` most were right
    but some runs failed OpenFHE's decoding check (wrong values); at ``depth - 2``
    ``IntMPBootAdjustScale`` always throws (too few towers). So the budget keeps one level
    of margin, and :mod:`~fednorm.engine.ckks.levels` refuses to go past it.
    """

    name: str
    ring_dim: int
    security: str
    depth: int
    scaling_mod_bits: int = 50
    first_mod_bits: int = 60
    scaling_technique: str = "FLEXIBLEAUTO"
    key_switching: str = "HYBRID"
    secret_key_dist: str = "UNIFORM_TERNARY"
    boot_compression: str = "SLACK"
    features: tuple[str, ...] = _FEATURES

    def __post_init__(self) -> None:
        if self.ring_dim < 1024 or self.ring_dim & (self.ring_dim - 1):
            raise InputError(f"ring_dim must be a power of two >= 1024, got {self.ring_dim}")
        if self.scaling_technique != "FLEXIBLEAUTO":
            raise InputError("only FLEXIBLEAUTO is supported (the level budget assumes it)")
        if self.boot_compression not in _BOOT_COMPRESSION_TOWERS:
            raise InputError(f"boot_compression must be one of {sorted(_BOOT_COMPRESSION_TOWERS)}")
        if self.level_budget < 1:
            raise InputError(f"depth {self.depth} leaves no levels between bootstraps")

    @property
    def slots(self) -> int:
        """Packed real slots per ciphertext (full packing)."""
        return self.ring_dim // 2

    @property
    def towers(self) -> int:
        """RNS towers of a fresh ciphertext (FLEXIBLEAUTO: depth + 1)."""
        return self.depth + 1

    @property
    def boot_towers(self) -> int:
        """Towers a ciphertext must still have when it enters collective bootstrapping."""
        return 1 + _BOOT_COMPRESSION_TOWERS[self.boot_compression] + 1

    @property
    def level_budget(self) -> int:
        """Levels a ciphertext may consume between collective bootstraps (depth - 4)."""
        return self.towers - self.boot_towers

    @property
    def fingerprint(self) -> bytes:
        """8 bytes naming these exact parameters; stamped on every serialized object."""
        return hashlib.blake2b(repr(astuple(self)).encode(), digest_size=8).digest()


PAPER = CkksPreset(name="paper", ring_dim=1 << 15, security="HEStd_128_classic", depth=11)
"""The paper's parameters: 128-bit classic security, ring 2^15, depth 11 (budget 7)."""

TEST = CkksPreset(name="test", ring_dim=1 << 14, security="HEStd_NotSet", depth=9)
"""Fast, *insecure* parameters for tests: ring 2^14, depth 9 (budget 5)."""

PRESETS: dict[str, CkksPreset] = {p.name: p for p in (PAPER, TEST)}


def get_preset(name: str) -> CkksPreset:
    """The preset called ``name``; an unknown name is an :class:`InputError`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(f"unknown CKKS preset {name!r}; known: {sorted(PRESETS)}") from None
