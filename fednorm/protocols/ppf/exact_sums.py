"""Exact pooled sums of floats: each value travels as integer digits, which CKKS adds and
decrypts without error.

A CKKS slot decodes to about 2^-45 of the ciphertext's *largest* slot (the decoding FFT
runs in float64), so sums of features of very different magnitudes cannot all be read
precisely from one ciphertext.  Integers can: a party writes each value as the fixed-point
integer V = round(v·2^F) in balanced base-2^B digits (one slot per digit, every slot of
magnitude ≤ 2^(B−1)); the pooled slots are integers of magnitude ≤ P·2^(B−1), which the
decoding error (~P·2^(B−46)) and the flooding noise (~1e-16 at scale Δ²) cannot move by
0.5, so rounding recovers them exactly and the pooled V follows with exact integer
arithmetic.  The pooled sum is then exact in fixed point: to 2^-F absolute, each party's
value rounded to 2^-F first.  What is revealed is the pooled sum, as with a plain sum
upload, only more precisely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fednorm.engine.errors import InputError, ProtocolError

LIMB_BITS = 30  # B: a pooled digit of P ≤ 2^12 parties stays below 2^41
SIGNIFICANT_BITS = 45
"""A pooled sum with more than this many significant bits in fixed point is precise to
2^-45 relative; a smaller nonzero one (|sum| < 2^(45−F) ≈ 2^-65) is lifted by a power
of two for a second pass (:func:`lifts`).  A sum that reads as 0 is below 2^-F·P: 0 is
its value to that absolute precision, unless it is a sum of squares (lifted)."""
LIFTED_BITS = 54  # a lifted sum's significant bits in the second pass
ROUNDING_SLACK = 0.25  # a decrypted digit further than this from an integer is no sum


@dataclass(frozen=True)
class FixedPoint:
    """Values as ``limbs`` balanced base-2^B digits of round(v·2^``fraction_bits``)."""

    fraction_bits: int
    limbs: int

    @property
    def max_value(self) -> float:
        """|v| a party may upload: the top digit keeps room for the balanced carry."""
        return 2.0 ** (LIMB_BITS * self.limbs - self.fraction_bits - 2)

    def slots(self, width: int) -> int:
        """Slots that ``width`` values take as digits."""
        return width * self.limbs

    def digits(self, values: np.ndarray) -> np.ndarray:
        """``values`` as digits, digit-major: slot ``k·width + j`` holds digit k of value
        j.  NaN counts as 0 (a missing value)."""
        values = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
        if not np.all(np.abs(values) < self.max_value):
            raise InputError(f"a sum to pool exceeds 2^{int(np.log2(self.max_value))} "
                             f"({self.max_value:.3g}), the largest an exact sum upload holds")
        base, half = 1 << LIMB_BITS, 1 << (LIMB_BITS - 1)
        digits = np.zeros((self.limbs, len(values)))
        for j, value in enumerate(values):
            fixed = int(np.rint(np.ldexp(value, self.fraction_bits)))
            for k in range(self.limbs):
                digit = (fixed + half) % base - half  # balanced: in [-2^(B-1), 2^(B-1))
                digits[k, j] = digit
                fixed = (fixed - digit) >> LIMB_BITS
        return digits.ravel()

    def pooled(self, digits: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The pooled values from their decrypted digit sums, and each one's significant
        bits in fixed point (0 for a sum that reads as 0).

        ProtocolError if a decrypted digit is no integer: then it was no sum of digits."""
        pooled = np.asarray(digits, dtype=np.float64).reshape(self.limbs, width)
        rounded = np.rint(pooled)
        if not np.all(np.abs(pooled - rounded) <= ROUNDING_SLACK):
            raise ProtocolError("a pooled exact sum decrypted to a non-integer digit")
        sums, bits = np.empty(width), np.empty(width, dtype=np.int64)
        for j in range(width):
            fixed = sum(int(rounded[k, j]) << (LIMB_BITS * k) for k in range(self.limbs))
            sums[j] = fixed / (1 << self.fraction_bits)  # one correctly rounded division
            bits[j] = abs(fixed).bit_length()
        return sums, bits


SUMS = FixedPoint(fraction_bits=110, limbs=7)
"""Sums of floats: resolved to 2^-110, up to 2^98."""
COUNTS = FixedPoint(fraction_bits=0, limbs=2)
"""Counts: integers up to 2^58, two digits each."""


def lifts(bits: np.ndarray, nonnegative: bool = False) -> np.ndarray | None:
    """Per value, the power of two that gives a sum of ``bits`` significant bits
    :data:`LIFTED_BITS` in a second pass (1 where it is precise already); None when no
    value needs one.  A sum that reads as 0 stays 0, unless it is ``nonnegative`` (a sum
    of squares): then every party's own sum is below 2^-F·P too, and 2^F lifts it safely.
    """
    short = (bits > 0) & (bits <= SIGNIFICANT_BITS)
    zero = (bits == 0) & nonnegative
    if not (short.any() or zero.any()):
        return None
    return np.where(short, np.ldexp(1.0, LIFTED_BITS - bits),
                    np.where(zero, np.ldexp(1.0, SUMS.fraction_bits), 1.0))
