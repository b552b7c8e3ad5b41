"""The default PPF MinMax (fednorm.protocols.ppf.extremes): exact pooled extremes from a
threshold search over products of encrypted bits.

Against numpy bit for bit on hostile data; the search itself in plaintext; the noise of a
product of P fresh bit encryptions read in the coefficient domain against the flooding
bound, and the flooded bits' deviation; a deviating server refused through the real
party roles (test preset throughout).
"""

from __future__ import annotations

import warnings
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import ed25519
from deviating import deviating
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import federations

from fednorm.bench.decryption_noise import joint_phase
from fednorm.engine import ckks, signing
from fednorm.engine.ckks import ProductDecryption, ProductFlooding, in_process_run
from fednorm.engine.ckks.multiparty import DecryptionShare
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import (
    ProductDecryptRequest,
    SumDecryptRequest,
    setup_server,
)
from fednorm.protocols.collective.rounds import request_shares
from fednorm.protocols.collective.sums import (
    ProductUpload,
    product_decryptions,
    product_level,
    product_of,
    readable_product_decryptions,
    sign_upload,
)
from fednorm.protocols.ppf import checks, extremes
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


def test_the_default_minmax_needs_the_relinearization_key_only() -> None:
    assert key_needs(["minmax"], TEST) == {"relinearize": True, "rotations": ()}
    paper = key_needs(["minmax"], FitOptions(preset="test", algorithm="paper"))
    assert paper["rotations"], "the paper's MinMax rotates by its slot block"


def test_more_parties_than_the_preset_multiplies_are_refused() -> None:
    preset = ckks.get_preset("test")  # depth 9: products of at most 2^7 parties
    assert product_level(preset, 128) == 0
    with pytest.raises(InputError, match="multiplies at most 128 parties"):
        checks.require_product_for(preset, 129, 30)


def test_many_parties_products_are_flooded_for_the_decryptions_their_bits_allow() -> None:
    """Paper preset, s = 30: a product of 100 parties' bits flooded for the default
    τ = 1024 would carry σ ≈ 0.24 per bit, where a bit reads wrong at 0.5 (a default
    MinMax of 100 parties once stopped after key setup: "the pooled bits are not bits").
    It is flooded for the most decryptions that keep σ within 0.25/7 instead; 27 parties'
    products keep the whole τ, 28 do not (docs/LEAKAGE.md).  Refused before anything is
    sent only where not even one decryption keeps the bits readable."""
    paper, limit = ckks.get_preset("paper"), checks.BIT_TOLERANCE / checks.BIT_MARGIN
    assert checks.product_bit_noise(paper, 100, 30, 1024) > 0.2
    most = readable_product_decryptions(paper, 100, 30)
    assert checks.product_bit_noise(paper, 100, 30, most) <= limit \
        < checks.product_bit_noise(paper, 100, 30, most + 1)
    assert product_decryptions(paper, 100, 30, 1024) == most < 1024
    assert product_decryptions(paper, 100, 30, 5) == 5
    assert product_decryptions(paper, 27, 30, 1024) == 1024
    assert product_decryptions(paper, 28, 30, 1024) < 1024
    checks.require_product_for(paper, 100, 30)
    with pytest.raises(InputError, match="even flooded for a single decryption"):
        checks.require_product_for(paper, 100, 60)


def test_a_default_minmax_whose_bits_no_flooding_leaves_readable_stops_before_key_setup(
) -> None:
    """10 parties at the test preset and s = 60: the server refuses before key setup and
    every role reports that cause."""
    kinds: list[str] = []
    parts = [np.arange(4.0).reshape(2, 2) + p for p in range(10)]
    with pytest.raises(InputError, match="even flooded for a single decryption"):
        simulate(parts, "minmax", "mhe", FitOptions(preset="test", flooding_bits=60),
                 tracer=SimpleNamespace(frame=lambda event: kinds.append(event.kind)))
    assert kinds == []


# -- the noise of a product, and the flooded bits ------------------------------------------
PRODUCT_PARTIES = 10


class Product:
    """A product of P fresh encryptions under locally made joint keys (test preset)."""

    def __init__(self) -> None:
        self.ctx = ckks.CkksContext("test")
        self.parties, self.joint = ckks.setup_locally(self.ctx, PRODUCT_PARTIES)
        self.level = product_level(self.ctx.preset, PRODUCT_PARTIES)

    def of(self, bits: list[np.ndarray]) -> tuple[object, object]:
        """(the product, one factor)."""
        cts = [self.ctx.encrypt(self.joint.public_key, b, self.level, 2) for b in bits]
        return product_of(self.ctx, cts), cts[0]

    def flooding(self, product, factor) -> ProductFlooding:
        return ProductFlooding(self.ctx.preset.ring_dim, PRODUCT_PARTIES, PRODUCT_PARTIES,
                               growth=product.GetScalingFactor() / factor.GetScalingFactor())


@pytest.fixture(scope="module")
def product() -> Product:
    return Product()


def test_a_products_noise_is_below_the_flooding_bound(product: Product) -> None:
    """Every slot 1 (the largest noise: each factor's noise is multiplied by the others'
    slots): the product as decrypted, read with the joint secret in the coefficient
    domain, is its scale at coefficient 0 plus noise; the largest noise coefficient is
    below the bound t, whose σ (t/8) is the measured std within a factor 1.5."""
    ctx = product.ctx
    ct, factor = product.of([np.ones(ctx.slots)] * PRODUCT_PARTIES)
    noise = joint_phase(ctx, ct, product.parties)
    noise[0] -= round(ct.GetScalingFactor())
    bound = product.flooding(ct, factor).ciphertext_noise_bound
    assert np.abs(noise).max() < bound
    assert bound / 8 / 1.5 < noise.std() < bound / 8 * 1.5


def test_flooded_product_bits_round_correctly(product: Product) -> None:
    """Random bits of P = 10 parties, their product decrypted with every share flooded
    (s = 30, τ = 1024): within 0.25 of the exact product in every slot."""
    ctx, rng = product.ctx, np.random.default_rng(7)
    bits = [(rng.random(ctx.slots) < 0.93).astype(np.float64) for _ in range(PRODUCT_PARTIES)]
    ct, factor = product.of(bits)
    decryption = ProductDecryption(ctx, product.flooding(ct, factor))
    shares = [decryption.generate_share(p, ct) for p in product.parties]
    out = decryption.finalize(decryption.aggregate_shares(product.joint, ct, shares),
                              ctx.slots)
    exact = np.prod(bits, axis=0)
    assert 0 < exact.sum() < ctx.slots  # both bit values occur
    assert np.abs(out - exact).max() < 0.25


# -- a deviating server ------------------------------------------------------------------
async def _setup(rc, options):
    return await setup_server(rc, options.preset, **extremes.setup_arguments(options))


def _attack(server) -> BaseException:
    """Run the default MinMax on :data:`PARTS` with ``server``; the refusal."""
    with pytest.raises(ProtocolError) as refusal:
        trio.run(partial(run_federation, deviating("minmax", server=server), PARTS, TEST,
                         timeout=120))
    return refusal.value


def _forging(forge):
    """A server that, once the first bits arrive, asks for the product decryption
    ``forge`` builds from them; it records the parties whose shares it receives."""
    received: list[int] = []

    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            index, uploads = forge(crypto, {p: r.chunks[0] for p, r in replies.items()})
            shares = await request_shares(rc, "decrypt_product", ProductDecryptRequest(
                index=index), DecryptionShare, (index, uploads))
        received.extend(rc.parties[:len(shares)])

    return server, received


def test_a_partys_own_upload_in_place_of_the_product_is_refused() -> None:
    server, received = _forging(lambda crypto, bits: (0, [bits[1]] * 3))
    assert "product decryption request" in str(_attack(server))
    assert received == []


def test_an_upload_forged_in_another_partys_name_is_refused() -> None:
    """The server encrypts ones as 'party 2's bits' (the product would be parties 1 and
    3 alone) and signs with a key of its own."""
    def forge(crypto, bits):
        ones = crypto.ckks.encrypt(crypto.joint.public_key, np.ones(4),
                                   product_level(crypto.ckks.preset, 3))
        own_key = signing.Keyring(signing.Signer(2, ed25519.Ed25519PrivateKey.generate()),
                                  signing.TrustedKeys({}))
        forged, _ = sign_upload(own_key, crypto.rc.session, 0, ones, ProductUpload)
        return 0, [bits[1], forged, bits[3]]

    server, received = _forging(forge)
    refusal = str(_attack(server))
    assert ("a forged upload" in refusal and "signature" in refusal) \
        or "as this party's upload" in refusal
    assert received == []


def test_product_uploads_are_not_decrypted_as_a_sum() -> None:
    """The same uploads relayed in a sum decryption request: refused."""
    received: list[int] = []

    async def server(rc, options):
        await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            uploads = [replies[p].chunks[0] for p in rc.parties]
            shares = await request_shares(rc, "decrypt_sum", SumDecryptRequest(index=0),
                                          DecryptionShare, (0, uploads))
        received.extend(rc.parties[:len(shares)])

    assert "sum" in str(_attack(server))
    assert received == []


def _first_round(crypto, replies):
    """The honest first round's product."""
    return crypto.multiply_all({p: r.chunks[0] for p, r in replies.items()})


def test_a_second_decryption_in_a_round_is_refused() -> None:
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            pooled = await _first_round(crypto, await rc.gather(extremes.EncryptedBits))
            await crypto.decrypt_product(pooled, 8)
            await crypto.decrypt_product(pooled, 8)

    assert "more product decryptions" in str(_attack(server))


def test_a_decrypted_round_is_not_decrypted_again_later() -> None:
    """Round 1's uploads asked for again in round 2 (within that round's allowance)."""
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            layout = extremes.Layout(2, crypto.ckks.slots)
            pooled = await _first_round(crypto, replies)
            await crypto.decrypt_product(pooled, 8)
            start = extremes.Brackets.start(layout.brackets)
            await rc.broadcast(extremes.Thresholds(thresholds=start.thresholds(layout.count)))
            await rc.gather(extremes.EncryptedBits)
            await crypto.decrypt_product(pooled, 8)

    assert "already decrypted" in str(_attack(server))


def test_rounds_beyond_the_search_are_refused() -> None:
    """A server that keeps publishing thresholds once every bracket holds one float
    (each round would spend a flooded decryption of the keys' τ)."""
    async def server(rc, options):
        crypto = await _setup(rc, options)
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            layout = extremes.Layout(2, crypto.ckks.slots)
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
    assert extremes._as_bits(np.array([[0.02, 0.98, 1.01]])).tolist() == [[0, 1, 1]]
    for wrong, why in (([[0.0, 1.0, 0.0]], "not a threshold pattern"),
                       ([[0.0, 0.5, 1.0]], "are not bits"), ([[0.0, 1.0, 2.0]], "are not bits")):
        with pytest.raises(ProtocolError, match=why):
            extremes._as_bits(np.array(wrong))
    layout = extremes.Layout(1, 64)
    good = extremes.Brackets.start(layout.brackets).thresholds(layout.count)
    assert extremes._received_thresholds(good, layout) is good
    for wrong in (good[:1], good.astype(np.float64), good.tolist()):
        with pytest.raises(ProtocolError, match="thresholds"):
            extremes._received_thresholds(wrong, layout)
