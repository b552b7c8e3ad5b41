"""Exact pooled sums: values as integer digits, added and rounded back, equal the exact
sum of the values at the fixed point's resolution, whatever their magnitudes."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.ppf.exact_sums import COUNTS, SUMS, lifts

FRACTION_BITS = SUMS.fraction_bits

# Hostile on purpose: exact zeros, subnormals, 1e-30 beside 1e25, opposite signs.
VALUES = st.one_of(st.just(0.0), st.floats(-1e25, 1e25, allow_nan=False),
                   st.floats(-1e-20, 1e-20, allow_nan=False),
                   st.sampled_from([5e-324, -2.0**-120, 2.0**97, -(2.0**97)]))


def fixed_point_sum(parties: list[np.ndarray], j: int) -> float:
    """The oracle: each value rounded to 2^-F, added exactly, rounded to float64 once."""
    unit = Fraction(1, 2**FRACTION_BITS)
    total = sum(round(Fraction(float(values[j])) / unit) * unit for values in parties)
    return float(total)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5).flatmap(lambda width: st.lists(
    hnp.arrays(np.float64, width, elements=VALUES), min_size=1, max_size=12)),
    st.floats(-0.2, 0.2))
def test_pooled_digits_give_the_exact_sum(parties: list[np.ndarray], noise: float) -> None:
    """Any decrypted digit within 0.25 of its integer (decoding and flooding noise)
    rounds back; a nonzero sum below 2^-65 gets a lift for a second pass, none else."""
    if sum(np.abs(v).max() for v in parties) >= SUMS.max_value:
        return  # the pooled top digit would overflow: not what a party may upload
    width = len(parties[0])
    digits = sum(SUMS.digits(values) for values in parties) + noise
    sums, bits = SUMS.pooled(digits, width)
    scales = lifts(bits)
    for j in range(width):
        assert sums[j] == fixed_point_sum(parties, j)
        short = 0 < abs(sums[j]) < 2.0 ** (45 - FRACTION_BITS)
        assert (scales is not None and scales[j] > 1) == short
        if short:  # lifted to 54 significant bits
            assert 2.0 ** (53 - FRACTION_BITS) <= abs(sums[j]) * scales[j] \
                < 2.0 ** (54 - FRACTION_BITS)


def test_a_value_beyond_what_the_digits_hold_is_refused() -> None:
    with pytest.raises(InputError, match="the largest an exact sum upload holds"):
        SUMS.digits(np.array([1.0, 2.0**99]))


def test_a_digit_that_is_no_integer_is_no_sum() -> None:
    digits = SUMS.digits(np.array([1.5, -2.0]))
    digits[3] += 0.5
    with pytest.raises(ProtocolError, match="non-integer digit"):
        SUMS.pooled(digits, 2)


@given(st.lists(st.lists(st.integers(0, 2**52), min_size=3, max_size=3), min_size=1,
                max_size=40))
def test_counts_pool_exactly_in_two_digits(counts: list[list[int]]) -> None:
    digits = sum(COUNTS.digits(np.array(c, dtype=np.float64)) for c in counts)
    pooled, _ = COUNTS.pooled(digits, 3)
    assert pooled.tolist() == [float(sum(c[j] for c in counts)) for j in range(3)]


def test_a_zero_sum_is_lifted_only_when_it_cannot_cancel() -> None:
    """A mean's pooled sum that reads as 0 may hide large local sums that cancel (lifting
    could overflow them): it stays 0.  A sum of squares that reads as 0 has every local
    sum below 2^-F·P too, so it is lifted by 2^F."""
    bits = np.array([0, 60, 20])
    np.testing.assert_array_equal(lifts(bits), [1.0, 1.0, 2.0**34])
    np.testing.assert_array_equal(lifts(bits, nonnegative=True),
                                  [2.0**FRACTION_BITS, 1.0, 2.0**34])
    assert lifts(np.array([0, 60])) is None
