"""What the PPF protocols check and set up alike: the agreed bound V_abs, the largest
count, comparison precisions, key-setup arguments, and slot blocks.

Every check runs on a party's own data *before* it encrypts anything, so bad input is an
:class:`~fednorm.engine.errors.InputError` at once, never a failure halfway through a
protocol run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions, feature_counts
from fednorm.protocols.collective.sums import (
    BIT_MARGIN,
    BIT_TOLERANCE,
    product_bit_noise,
    product_level,
    readable_product_decryptions,
)


def vabs_vector(options: FitOptions, width: int) -> np.ndarray:
    """The agreed per-feature bound V_abs (one value for all features, or one each)."""
    if options.vabs is None:
        raise InputError("PPF MinMax needs FitOptions(vabs=...): a bound on |x| every "
                         "party agrees on, one value for all features or one per feature")
    vabs = np.asarray(options.vabs, dtype=np.float64).ravel()
    if vabs.size not in (1, width):
        raise InputError(f"vabs has {vabs.size} values for {width} features")
    if not np.all(np.isfinite(vabs) & (vabs > 0)):
        raise InputError("vabs values must be positive and finite")
    return np.broadcast_to(vabs, (width,)).copy()


def require_counts_within(X: np.ndarray, options: FitOptions) -> None:
    """InputError if a feature of this party holds more than ``max_count`` values (the
    encrypted inverse is only right on [1, max_count])."""
    if feature_counts(X).max(initial=0) > options.max_count:
        raise InputError(f"a party holds more than max_count={options.max_count} values")


def require_product_for(preset: ckks.CkksPreset, parties: int, flooding_bits: int) -> int:
    """The most decryptions a product of ``parties``' bits may be flooded for
    (:func:`~fednorm.protocols.collective.sums.readable_product_decryptions`); InputError,
    before anything is sent, when no flooded product of ``parties``' bit
    uploads can be read at this preset: too few levels for its tree (⌈log2 P⌉), or
    flooding at s whose noise drowns the bits even when sized for a single decryption.

    Otherwise a product is flooded for τ_p = min(τ, the most that stay readable)
    decryptions (:func:`~fednorm.protocols.collective.sums.product_decryptions`): the
    noise grows as P^1.5·√τ (σ ≈ 0.24 per bit at P = 100, paper preset, s = 30,
    τ = 1024, where a bit is read wrong at ~0.5), so many parties' products are flooded
    for fewer decryptions, each spending more of the keys' budget."""
    product_level(preset, parties)
    readable = readable_product_decryptions(preset, parties, flooding_bits)
    if readable < 1:
        noise = product_bit_noise(preset, parties, flooding_bits, 1)
        raise InputError(
            f"a flooded product of {parties} parties' bits at the {preset.name!r} "
            f"preset carries noise σ = {noise:.3f} per bit with s = {flooding_bits}, even "
            f"flooded for a single decryption: too close to 0 and 1 to read every bit (σ "
            f"at most {BIT_TOLERANCE / BIT_MARGIN:.3f}). Fewer parties, or a smaller s "
            "(flooding_bits)")
    return readable


def product_bits(values: np.ndarray, what: str) -> np.ndarray:
    """A flooded product of the parties' bits, rounded to 0 or 1; ProtocolError unless
    each value lies within :data:`BIT_TOLERANCE` of one (honest parties' bits always do:
    a party sent something else)."""
    bits = np.rint(values)
    if not np.isin(bits, (0.0, 1.0)).all() \
            or np.abs(values - bits).max(initial=0.0) >= BIT_TOLERANCE:
        raise ProtocolError(f"{what} are not bits: a party sent something other than "
                            "its bits")
    return bits


def compare_plan(bits: object, default: float, option: str) -> ckks.ComparePlan:
    """The comparison of ``bits`` precision (``default`` if None), named ``option`` in
    the error a bad value gets."""
    bits = default if bits is None else bits
    if not isinstance(bits, (int, float)) or isinstance(bits, bool):
        raise InputError(f"{option} must be a number, got {bits!r}")
    return ckks.plan_compare(float(bits))


def setup_arguments(options: FitOptions, blocks: int) -> dict[str, object]:
    """Keyword arguments for ``setup_server`` / ``setup_party`` of a protocol that
    multiplies ciphertexts and rotates by one slot block (``blocks`` per ciphertext)."""
    return {"relinearize": True, "rotations": (ckks.get_preset(options.preset).slots // blocks,)}


@dataclass(frozen=True)
class BlockLayout:
    """A ciphertext's slots cut into :attr:`blocks` equal blocks, for ``width`` features
    (each protocol's layout says how many blocks and what goes where)."""

    slots: int
    width: int

    @property
    def blocks(self) -> int:
        raise NotImplementedError

    @property
    def block(self) -> int:
        """Slots per block."""
        return self.slots // self.blocks

    def first(self, n: int) -> np.ndarray:
        """1 on the first ``n`` slots, 0 elsewhere (a mask before decryption)."""
        return (np.arange(self.slots) < n).astype(np.float64)

    def placed(self, parts: dict[int, np.ndarray], length: int) -> np.ndarray:
        """A vector of ``length`` slots with ``parts[b]`` at the start of block b."""
        out = np.zeros(length)
        for b, values in parts.items():
            out[b * self.block:b * self.block + values.size] = values
        return out


def require_pooled_count_within(counts: np.ndarray, parties: int, max_count: int) -> None:
    """InputError unless ``parties`` × this party's largest count fits ``max_count``.

    An encrypted inverse is only right on [1, max_count]; no single party sees the
    pooled count, but if every party holds at most max_count / P values the pooled
    count cannot leave the range (beyond it the inverse diverges silently).
    """
    largest = float(np.max(counts, initial=0.0))
    if largest * parties > max_count:
        raise InputError(
            f"this party holds {largest:.0f} values of a feature; with {parties} "
            f"parties the pooled count could exceed max_count={max_count} (each party "
            f"may hold at most {max_count // parties}): raise max_count")
