"""The rank search's counts packed several to a slot: the pooled counts come out exactly,
and a round carries more of them, so the default PPF robust search takes fewer rounds."""

from __future__ import annotations

import numpy as np
import pytest
from deviating import deviating
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.engine.errors import ProtocolError
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import setup_party, setup_server
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.ppf import kth, pooled
from fednorm.protocols.ppf.phases import serve_phase
from fednorm.protocols.ppf.pooled import PACKED_BITS, CountPacking
from fednorm.sim.federation import run_federation, simulate


@st.composite
def party_counts(draw: st.DrawFn) -> tuple[list[np.ndarray], int]:
    """Each party's counts at the same points, and a bound on their pooled counts: from 0
    (every count 0) to past 2^PACKED_BITS (one count a slot), often exactly 2^b − 1 (every
    digit full)."""
    parties = draw(st.integers(1, 5))
    points = draw(st.integers(0, 40))
    bits = draw(st.integers(0, PACKED_BITS + 4))
    bound = draw(st.sampled_from([2**bits - 1, 2**bits, max(0, 2**bits - 2)]))
    share = bound // parties
    counts = [np.array(draw(st.lists(st.integers(0, share), min_size=points,
                                      max_size=points)), dtype=np.int64)
              for _ in range(parties)]
    if draw(st.booleans()) and points:  # the pooled count at the bound itself
        counts[0][draw(st.integers(0, points - 1))] += bound - sum(c.max() for c in counts)
        counts[0] = np.maximum(counts[0], 0)
    return counts, bound


@settings(max_examples=300, deadline=None)
@given(party_counts())
def test_the_sum_of_packed_counts_unpacks_to_the_pooled_counts(
    drawn: tuple[list[np.ndarray], int],
) -> None:
    counts, bound = drawn
    pooled = np.sum(counts, axis=0)
    assert pooled.max(initial=0) <= bound
    packing = CountPacking.for_bound(bound)
    packed = [packing.pack(c) for c in counts]
    assert all(np.abs(p).max(initial=0) < 2.0**max(PACKED_BITS, bound.bit_length())
               for p in packed)
    assert len(packed[0]) == packing.slots(len(pooled))
    np.testing.assert_array_equal(packing.unpack(np.sum(packed, axis=0), len(pooled)), pooled)


def test_a_count_slot_holds_as_many_counts_as_their_bound_allows() -> None:
    assert CountPacking.for_bound(0).per_slot == PACKED_BITS
    assert CountPacking.for_bound(511).per_slot == PACKED_BITS // 9
    assert CountPacking.for_bound(512).per_slot == PACKED_BITS // 10
    assert CountPacking.for_bound(2.0**45).per_slot == 1


def test_a_count_above_the_announced_bound_is_refused() -> None:
    """A server that announces an n_g below a party's own count would have the digits
    carry into each other: the party refuses to pack."""
    with pytest.raises(ProtocolError, match="below this party's own"):
        CountPacking.for_bound(100).pack(np.array([3, 128]))


def test_full_digits_through_the_real_roles_give_numpy_s_quartiles() -> None:
    """n_g = 511 = 2^9 − 1: every count at a probe above a constant column is 511, all
    nine bits of each digit set; a carry would move the quartiles."""
    rng = np.random.default_rng(3)
    pooled = np.column_stack([np.full(511, 2.5), rng.normal(size=511),
                              rng.integers(0, 4, size=511).astype(np.float64)])
    parts = np.split(pooled, [170, 340])
    fitted = simulate(parts, "robust", "mhe", FitOptions(preset="test")).normalizer
    expected = np.percentile(pooled, [25, 50, 75], axis=0)
    for got, want in zip((fitted.q1, fitted.median, fitted.q3), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_bcw_s_default_ppf_robust_search_takes_fewer_rounds(bcw) -> None:
    """BCW over 10 parties: 30 features, 90 targets (each quartile falls on one order
    statistic of 569 values), n_g 569 (10 bits, 4 counts a slot): 255 points per target
    and round where one count a slot gave 91, so 17 rounds in all where there were 21."""
    parts = np.array_split(bcw.X, 10)
    result = simulate(parts, "robust", "mhe", FitOptions(preset="test"))
    expected = np.percentile(bcw.X, [25, 50, 75], axis=0)
    fitted = result.normalizer
    for got, want in zip((fitted.q1, fitted.median, fitted.q3), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert result.report.rounds <= 17, result.report.rounds


async def test_a_pooled_sum_below_2_to_the_packed_bits_decrypts_to_its_integer() -> None:
    """PACKED_BITS's margin, read where the server reads it: three parties upload
    integers whose sum lies just below 2^40 in every slot; the flooded decryption is
    within 1e-2 of it (a packed slot is rounded to the nearest integer, so 0.5 would be
    wrong)."""
    rng = np.random.default_rng(5)
    slots = 2**13  # the test preset's
    top = 2**PACKED_BITS
    values = [rng.integers(top // 4, top // 3, size=slots).astype(np.float64)
              for _ in range(3)]
    read: list[np.ndarray] = []
    nothing = RobustNormalizer(np.zeros(1), np.zeros(1), np.ones(1))

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)
        read.append(await pooled.pooled_sum(crypto))
        await rc.broadcast(kth.PooledCounts(count=np.zeros(1)))
        return nothing

    async def party(rc, X, options):
        crypto = await setup_party(rc, options.preset, relinearize=False)
        await pooled.send_sum(crypto, values[rc.me - 1])
        await serve_phase(crypto, kth.PooledCounts, kth.POOLED_COUNT)
        return nothing

    await run_federation(deviating("robust", server=server, party=party),
                         [np.ones((2, 1))] * 3, FitOptions(preset="test"), timeout=300)
    exact = np.sum(values, axis=0)
    assert exact.max() < top
    error = np.abs(read[0] - exact).max()
    assert error < 1e-2, error
