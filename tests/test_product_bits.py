"""Flooded products of the parties' bit encryptions: what the paper's z-score (hidden
count) decrypts to learn which features hold any value (its presence bits).

The noise of a product of P fresh bit encryptions read in the coefficient domain against
the flooding bound, the flooded bits' deviation, how many decryptions a product of many
parties' bits may be flooded for, and a deviating server refused through the real party
roles of the paper's z-score (test preset throughout).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import trio
from deviating import deviating, forging_server, is_forgery_refusal, signed_by_a_stranger

from fednorm.bench.decryption_noise import joint_phase
from fednorm.engine import ckks
from fednorm.engine.ckks import ProductDecryption, ProductFlooding
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import ProductDecryptRequest, SumDecryptRequest
from fednorm.protocols.collective.sums import (
    ProductUpload,
    product_decryptions,
    product_level,
    product_of,
    readable_product_decryptions,
)
from fednorm.protocols.ppf import checks
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.sim.federation import run_federation, simulate

PAPER_ZSCORE = FitOptions(preset="test", algorithm="paper")
PARTS = [np.array([[1.0, -2.0], [3.0, 0.5]]) * (k + 1) for k in range(3)]


def test_more_parties_than_the_preset_multiplies_are_refused() -> None:
    preset = ckks.get_preset("test")  # depth 9: products of at most 2^7 parties
    assert product_level(preset, 128) == 0
    with pytest.raises(InputError, match="multiplies at most 128 parties"):
        checks.require_product_for(preset, 129, 30)


def test_many_parties_products_are_flooded_for_the_decryptions_their_bits_allow() -> None:
    """Paper preset, s = 30: a product of 100 parties' bits flooded for the default
    τ = 1024 would carry σ ≈ 0.24 per bit, where a bit reads wrong at 0.5. It is flooded
    for the most decryptions that keep σ within 0.25/7 instead; 27 parties' products keep
    the whole τ, 28 do not (docs/LEAKAGE.md).  Refused before anything is sent only where
    not even one decryption keeps the bits readable."""
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


def test_a_paper_zscore_whose_presence_bits_no_flooding_leaves_readable_stops_first(
) -> None:
    """10 parties at the test preset and s = 60: the server refuses before key setup and
    every role reports that cause."""
    kinds: list[str] = []
    parts = [np.arange(4.0).reshape(2, 2) + p for p in range(10)]
    options = FitOptions(preset="test", algorithm="paper", flooding_bits=60)
    with pytest.raises(InputError, match="even flooded for a single decryption"):
        simulate(parts, "zscore", "mhe", options,
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


def test_decrypted_products_must_be_bits() -> None:
    """The presence bits as decrypted are rounded to bits within the tolerance; values
    farther from 0 and 1 are refused (a party sent something other than bits)."""
    assert checks.product_bits(np.array([0.02, 0.98, 1.01]), "bits").tolist() == [0, 1, 1]
    for wrong in ([0.0, 0.5, 1.0], [0.0, 1.0, 2.0]):
        with pytest.raises(ProtocolError, match="are not bits"):
            checks.product_bits(np.array(wrong), "the pooled bits")


# -- a deviating server: the paper z-score's presence product -----------------------------
async def _presence_start(rc, options):
    """The honest paper z-score server up to its presence product: key setup, the sums
    (the inputs relayed); returns (crypto, each party's "empty here" upload)."""
    crypto = await ppf_zscore.setup_server(rc, options.preset,
                                           **ppf_zscore.setup_arguments(options))
    sums = await rc.gather(ppf_zscore.EncryptedSums)
    await crypto.add_all({p: m.total for p, m in sums.items()})
    await crypto.add_all({p: m.count for p, m in sums.items()})
    return crypto, {p: m.empty for p, m in sums.items()}


def _attack(server) -> BaseException:
    """Run the paper z-score on :data:`PARTS` with ``server``; the refusal."""
    with pytest.raises(ProtocolError) as refusal:
        trio.run(partial(run_federation, deviating("zscore", server=server), PARTS,
                         PAPER_ZSCORE, timeout=120))
    return refusal.value


def _forging(forge, request=ProductDecryptRequest, subprotocol="decrypt_product"):
    """A server that asks, in place of the presence product, for the decryption of what
    ``forge`` builds from the uploads; it records the parties whose shares it receives."""
    return forging_server(_presence_start, forge, request, subprotocol)


def test_a_partys_own_upload_in_place_of_the_product_is_refused() -> None:
    server, received = _forging(lambda crypto, empty: (0, [empty[1]] * 3))
    assert "product decryption request" in str(_attack(server))
    assert received == []


def test_an_upload_forged_in_another_partys_name_is_refused() -> None:
    """The server encrypts ones as 'party 2's bits' (the product would be parties 1 and
    3 alone) and signs with a key of its own."""
    def forge(crypto, empty):
        ones = crypto.ckks.encrypt(crypto.joint.public_key, np.ones(4),
                                   product_level(crypto.ckks.preset, 3))
        return 0, [empty[1], signed_by_a_stranger(crypto, 2, ones, ProductUpload), empty[3]]

    server, received = _forging(forge)
    assert is_forgery_refusal(_attack(server))
    assert received == []


def test_product_uploads_are_not_decrypted_as_a_sum() -> None:
    """The same uploads relayed in a sum decryption request: refused."""
    server, received = _forging(lambda crypto, empty: (0, [empty[p] for p in (1, 2, 3)]),
                                SumDecryptRequest, "decrypt_sum")
    assert "sum" in str(_attack(server))
    assert received == []


def test_a_second_product_decryption_is_refused() -> None:
    async def server(rc, options):
        crypto, empty = await _presence_start(rc, options)
        pooled = await crypto.multiply_all(empty)
        await crypto.decrypt_product(pooled, 2)
        await crypto.decrypt_product(pooled, 2)

    assert "more product decryptions" in str(_attack(server))
