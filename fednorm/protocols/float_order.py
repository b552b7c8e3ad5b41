"""The total order of float64 values as integers, for searches that end on one float.

Reinterpreting a double's bits as a signed 64-bit integer and flipping the magnitude bits
of negative values gives a key that orders like the values themselves: −inf < … < −0.0 <
+0.0 < … < +inf, every finite double (subnormals included) one integer apart from its
neighbours.  A bracket search over keys therefore ends on a single float after at most
⌈log_{T+1}(2^64)⌉ rounds of T thresholds, whatever the magnitudes, where halving in
floating point stalls on subnormals or at the float spacing.
"""

from __future__ import annotations

import numpy as np

_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)


def keys(values: np.ndarray) -> np.ndarray:
    """The order keys (int64) of float64 ``values`` (NaN has none: the caller drops it)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    return np.where(bits < 0, bits ^ _MAGNITUDE, bits)


def values(order_keys: np.ndarray) -> np.ndarray:
    """The float64 values of order keys (the inverse of :func:`keys`)."""
    k = np.asarray(order_keys, dtype=np.int64)
    return np.where(k < 0, k ^ _MAGNITUDE, k).view(np.float64)


def gap(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``high − low`` of keys with ``low ≤ high`` as uint64 (the difference may exceed
    int64: −inf to +inf is about 2^64)."""
    return np.asarray(high, dtype=np.int64).view(np.uint64) \
        - np.asarray(low, dtype=np.int64).view(np.uint64)


def thresholds(low: np.ndarray, high: np.ndarray, count: int) -> np.ndarray:
    """(targets, ``count``) keys that cut each open bracket (low, high] into at most
    ``count`` + 1 cells of near-equal numbers of floats: low + ⌈i·(high − low)/(count + 1)⌉,
    i = 1 … count.  Where a bracket holds fewer floats than that, thresholds repeat
    ``high``, which the search reads as an empty cell."""
    span = gap(low, high)
    parts = np.uint64(count + 1)
    quotient, remainder = span // parts, span % parts
    steps = np.arange(1, count + 1, dtype=np.uint64)
    # i·span/(T+1) = i·quotient + i·remainder/(T+1), without overflowing 64 bits
    offsets = steps * quotient[:, None] \
        + (steps * remainder[:, None] + parts - np.uint64(1)) // parts
    cuts = np.asarray(low, dtype=np.int64).view(np.uint64)[:, None] + offsets
    return cuts.view(np.int64)


def rounds_to_single(low: np.ndarray, high: np.ndarray, count: int) -> int:
    """Rounds of ``count`` thresholds until every bracket (low, high] holds one float:
    each round leaves a cell of at most ⌈span/(count + 1)⌉ keys."""
    widest = int(gap(low, high).max(initial=np.uint64(0)))
    rounds = 0
    while widest > 1:
        widest = -(-widest // (count + 1))
        rounds += 1
    return rounds

