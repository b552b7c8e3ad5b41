"""The default PPF MinMax (fednorm.protocols.ppf.extremes): exact pooled extremes from a
threshold search over encrypted bits, each round's AND a flooded sum of masked zeros.

Against numpy bit for bit on hostile data; the search itself in plaintext; masked sums
read as the AND of the parties' bits; a deviating server refused through the real party
roles (test preset throughout); what the server reads of a masked sum is in
tests/test_masked_zeros.py.
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytest
import trio
from deviating import deviating, forging_server, is_forgery_refusal, signed_by_a_stranger
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import federations

from fednorm.engine import ckks
from fednorm.engine.ckks import CoefficientFlooding, CoefficientSumDecryption, in_process_run
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import (
    CoefficientDecryptRequest,
    ProductDecryptRequest,
    SumDecryptRequest,
    setup_server,
)
from fednorm.protocols.collective.sums import CoefficientUpload, total_of
from fednorm.protocols.ppf import extremes
from fednorm.protocols.ppf.keys import key_needs
from fednorm.sim.federation import run_federation, simulate

TEST = FitOptions(preset="test")
PARTS = [np.array([[1.0, -2.0], [3.0, 0.5]]) * (k + 1) for k in range(3)]


def _pooled_extremes(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    pooled = np.vstack(parts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        return np.nanmin(pooled, axis=0), np.nanmax(pooled, axis=0)


def _assert_numpys(parts: list[np.ndarray], low: np.ndarray, high: np.ndarray) -> None:
    """Equal to numpy's pooled extremes bit for bit (NaN where no party has a value; a
    zero of either sign, as numpy's depends on the order of the values)."""
    want_low, want_high = _pooled_extremes(parts)
    np.testing.assert_array_equal(low, want_low)
    np.testing.assert_array_equal(high, want_high)


# -- the search in plaintext ----------------------------------------------------------------
def _search_in_the_clear(parts: list[np.ndarray], slots: int
                         ) -> tuple[np.ndarray, np.ndarray, int]:
    """The protocol's search with the product of the parties' bits taken in numpy:
    (min, max, rounds)."""
    width = parts[0].shape[1]
    layout = extremes.Layout(width, slots)
    brackets = extremes.Brackets.start(layout.brackets)
    tops = [extremes.local_tops(X) for X in parts]
    rounds = 0
    while rounds == 0 or brackets.rounds_left(layout.count):
        thresholds = brackets.thresholds(layout.count)
        bits = np.prod([extremes.threshold_bits(t, thresholds) for t in tops], axis=0)
        brackets = brackets.narrowed(thresholds, bits.reshape(layout.brackets, -1))
        rounds += 1
    low, high = brackets.extremes(width)
    return low, high, rounds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations(max_parties=6, max_features=4), st.sampled_from([64, 1024, 8192]))
def test_the_search_ends_on_numpys_extremes(federation, slots) -> None:
    """In the clear, for any split and slot count (chunks and T ≥ 15 included): the
    search ends on the pooled extremes, within the rounds a party allows."""
    low, high, rounds = _search_in_the_clear(federation.parts, slots)
    _assert_numpys(federation.parts, low, high)
    layout = extremes.Layout(federation.parts[0].shape[1], slots)
    assert rounds <= extremes.Brackets.start(1).rounds_left(layout.count)


def test_signed_zeros_follow_the_float_order() -> None:
    """max(−0, +0) is +0 and min(−0, +0) is −0 whichever party holds which; a lone zero
    keeps its sign."""
    parts = [np.array([[-0.0, -0.0, 0.0]]), np.array([[0.0, -0.0, 0.0]])]
    low, high, _ = _search_in_the_clear(parts, 64)
    assert list(np.signbit(high)) == [False, True, False]
    assert list(np.signbit(low)) == [True, True, False]


# -- the protocol against numpy --------------------------------------------------------------
def _hostile_parts() -> list[np.ndarray]:
    """Four parties, one with a single row: mean exactly 0, 1e-6 beside 1e9, subnormals,
    ties, a constant feature, a feature nobody has, one only party 3 has, signed zeros."""
    nan, tiny = np.nan, 5e-324
    columns = np.array([
        # mean 0   scales      subnormal  ties  constant  empty  party 3  zeros
        [-1.5,     1e-6,       tiny,      2.0,  7.25,     nan,   nan,     -0.0],
        [1.5,      1e9,        -tiny,     2.0,  7.25,     nan,   nan,     0.0],
        [-0.25,    -1e9,       2 * tiny,  -3.0, 7.25,     nan,   nan,     -0.0],
        [0.25,     -1e-6,      -2.2e-308, 2.0,  7.25,     nan,   nan,     -0.0],
        [3.0,      1e-6,       tiny,      -3.0, 7.25,     nan,   4.5,     0.0],
        [-3.0,     5e8,        0.0,       2.0,  7.25,     nan,   -4.5,    -0.0],
        [0.0,      -5e-7,      tiny,      2.0,  7.25,     nan,   nan,     0.0],
    ])
    assert columns[:, 0].sum() == 0.0
    return [columns[:2], columns[2:4], columns[4:6], columns[6:]]


def test_hostile_data_gives_numpys_extremes_bit_for_bit() -> None:
    parts = _hostile_parts()
    fitted = simulate(parts, "minmax", "mhe", TEST).normalizer
    _assert_numpys(parts, fitted.min, fitted.max)
    assert not np.signbit(fitted.max[-1]) and np.signbit(fitted.min[-1])


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(federations(max_parties=4, max_features=3))
def test_random_federations_give_numpys_extremes(federation) -> None:
    fitted = simulate(federation.parts, "minmax", "mhe", TEST).normalizer
    _assert_numpys(federation.parts, fitted.min, fitted.max)


def test_the_default_minmax_needs_the_joint_public_key_only() -> None:
    assert key_needs(["minmax"], TEST) == {"relinearize": False, "rotations": ()}
    paper = key_needs(["minmax"], FitOptions(preset="test", algorithm="paper"))
    assert paper["rotations"], "the paper's MinMax rotates by its slot block"


def test_many_parties_at_a_large_flooding_keep_their_bits() -> None:
    """No product, so no limit on parties from the flooding (a product of 10 parties'
    bits was refused at s = 60, tests/test_product_bits.py): at s = 60 the default
    MinMax of 12 parties still ends on numpy's extremes."""
    parts = [np.array([[float(p), -p / 7.0]]) for p in range(12)]
    fitted = simulate(parts, "minmax", "mhe", FitOptions(preset="test", flooding_bits=60))
    _assert_numpys(parts, fitted.normalizer.min, fitted.normalizer.max)


# -- masked zeros: an AND from a flooded sum -----------------------------------------------
MASK_PARTIES = 4


class Masked:
    """Masked uploads of :data:`MASK_PARTIES` parties under locally made joint keys."""

    def __init__(self) -> None:
        self.ctx = ckks.CkksContext("test")
        self.parties, self.joint = ckks.setup_locally(self.ctx, MASK_PARTIES)

    def decrypted(self, bits: np.ndarray) -> np.ndarray:
        """The flooded decryption of the sum of each party's row of ``bits`` as masked
        zeros, read as bits (s = 30, τ = 1024)."""
        cts = [ckks.encrypt_masked(self.ctx, self.joint.public_key, row == 1) for row in bits]
        total = total_of(self.ctx, cts)
        decryption = CoefficientSumDecryption(self.ctx, CoefficientFlooding(
            self.ctx.preset.ring_dim, MASK_PARTIES, MASK_PARTIES))
        shares = [decryption.generate_share(p, total) for p in self.parties]
        coefficients = decryption.finalize(
            decryption.aggregate_shares(self.joint, total, shares), bits.shape[1])
        return ckks.zero_bits(coefficients, self.ctx.moduli[:ckks.COEFFICIENT_TOWERS])


@pytest.fixture(scope="module")
def masked() -> Masked:
    return Masked()


@settings(max_examples=8, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       st.sampled_from([1, 300, 16384]))
def test_a_masked_sum_reads_as_the_and_of_the_parties_bits(masked: Masked, seed: int,
                                                          zeros: float, size: int) -> None:
    """Any bits (none, few, half or all zeros; one position up to the whole ring): the
    flooded sum reads 1 exactly where every party's bit is 1."""
    bits = (np.random.default_rng(seed).random((MASK_PARTIES, size)) >= zeros).astype(float)
    np.testing.assert_array_equal(masked.decrypted(bits), bits.min(axis=0))


def test_a_masked_upload_refuses_more_positions_than_the_ring() -> None:
    ctx = ckks.CkksContext("test")
    with pytest.raises(InputError, match="at most 16384 positions"):
        ckks.encrypt_masked(ctx, None, np.ones(ctx.preset.ring_dim + 1, dtype=bool))


# -- a deviating server ------------------------------------------------------------------
async def _setup(rc, options):
    return await setup_server(rc, options.preset, **extremes.setup_arguments(options))


def _attack(server) -> BaseException:
    """Run the default MinMax on :data:`PARTS` with ``server``; the refusal."""
    with pytest.raises(ProtocolError) as refusal:
        trio.run(partial(run_federation, deviating("minmax", server=server), PARTS, TEST,
                         timeout=120))
    return refusal.value


async def _first_bits(rc, options):
    """The honest start: key setup, then every party's first masked upload."""
    crypto = await _setup(rc, options)
    with rc.subprotocol("extremes"):
        replies = await rc.gather(extremes.EncryptedBits)
    return crypto, {p: r.chunks[0] for p, r in replies.items()}


def _forging(forge, request=CoefficientDecryptRequest, subprotocol="decrypt_coefficients"):
    """A server that, once the first bits arrive, asks for the decryption ``forge`` builds
    from them; it records the parties whose shares it receives."""
    return forging_server(_first_bits, forge, request, subprotocol, scope="extremes")


def test_a_partys_own_upload_in_place_of_the_sum_is_refused() -> None:
    """Decrypted alone, party 1's masked upload would show its own bits."""
    server, received = _forging(lambda crypto, bits: (0, [bits[1]] * 3))
    assert "coefficient decryption request" in str(_attack(server))
    assert received == []


def test_an_upload_forged_in_another_partys_name_is_refused() -> None:
    """The server masks nothing as 'party 2's bits' (the sum would be parties 1 and 3
    alone) and signs with a key of its own."""
    def forge(crypto, bits):
        zeros = ckks.encrypt_masked(crypto.ckks, crypto.joint.public_key, np.ones(4, bool))
        return 0, [bits[1], signed_by_a_stranger(crypto, 2, zeros, CoefficientUpload), bits[3]]

    server, received = _forging(forge)
    assert is_forgery_refusal(_attack(server))
    assert received == []


def test_masked_uploads_are_not_decrypted_as_a_sum_or_a_product() -> None:
    """The same uploads relayed in a sum or a product decryption request: refused."""
    for request, subprotocol in ((SumDecryptRequest, "decrypt_sum"),
                                 (ProductDecryptRequest, "decrypt_product")):
        server, received = _forging(lambda crypto, bits: (0, [bits[p] for p in (1, 2, 3)]),
                                    request, subprotocol)
        assert subprotocol.removeprefix("decrypt_") in str(_attack(server))
        assert received == []


def _first_round(crypto, replies):
    """The honest first round's pooled uploads."""
    return crypto.pool_coefficients({p: r.chunks[0] for p, r in replies.items()})


def test_a_second_decryption_in_a_round_is_refused() -> None:
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            pooled = await _first_round(crypto, await rc.gather(extremes.EncryptedBits))
            await crypto.decrypt_masked(pooled, 8)
            await crypto.decrypt_masked(pooled, 8)

    assert "more coefficient decryptions" in str(_attack(server))


def test_a_decrypted_round_is_not_decrypted_again_later() -> None:
    """Round 1's uploads asked for again in round 2 (within that round's allowance)."""
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            layout = extremes.Layout(2, crypto.ckks.preset.ring_dim)
            pooled = await _first_round(crypto, replies)
            await crypto.decrypt_masked(pooled, 8)
            start = extremes.Brackets.start(layout.brackets)
            await rc.broadcast(extremes.Thresholds(thresholds=start.thresholds(layout.count)))
            await rc.gather(extremes.EncryptedBits)
            await crypto.decrypt_masked(pooled, 8)

    assert "already decrypted" in str(_attack(server))


def test_rounds_beyond_the_search_are_refused() -> None:
    """A server that keeps publishing thresholds once every bracket holds one float
    (each round would spend a flooded decryption of the keys' τ)."""
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            layout = extremes.Layout(2, crypto.ckks.preset.ring_dim)
            brackets = extremes.Brackets.start(layout.brackets)
            while True:
                thresholds = brackets.thresholds(layout.count)
                bits = await extremes._pooled_bits(crypto, layout, replies)
                brackets = brackets.narrowed(thresholds, bits)
                await rc.broadcast(extremes.Thresholds(
                    thresholds=brackets.thresholds(layout.count)))
                replies = await rc.gather(extremes.EncryptedBits)

    assert "more threshold rounds" in str(_attack(server))


def test_roles_of_one_process_compute_a_verified_combination_once() -> None:
    """While every role runs in this process, a second request with the same key gets
    the first result; elsewhere each role computes its own."""
    context, calls = ckks.CkksContext("test"), []

    def compute() -> object:
        calls.append(1)
        return object()

    assert context.computed_once(("k",), compute) is not context.computed_once(("k",), compute)
    with in_process_run():
        first = context.computed_once(("k",), compute)
        assert context.computed_once(("k",), compute) is first
        assert context.computed_once(("other",), compute) is not first
    assert len(calls) == 4


def test_pooled_bits_must_be_a_threshold_pattern_and_thresholds_their_shape() -> None:
    """The server refuses decrypted bits that are not 0…0 1…1 per bracket (a party sent
    something else); a party refuses thresholds of another shape or type."""
    assert extremes._as_bits(np.array([[0.0, 1.0, 1.0]])).tolist() == [[0, 1, 1]]
    with pytest.raises(ProtocolError, match="not a threshold pattern"):
        extremes._as_bits(np.array([[0.0, 1.0, 0.0]]))
    layout = extremes.Layout(1, 64)
    good = extremes.Brackets.start(layout.brackets).thresholds(layout.count)
    assert extremes._received_thresholds(good, layout) is good
    for wrong in (good[:1], good.astype(np.float64), good.tolist()):
        with pytest.raises(ProtocolError, match="thresholds"):
            extremes._received_thresholds(wrong, layout)
