"""Multiparty CKKS layer: keys, collective operations, levels, bytes, inverse.

Everything runs at the fast ``test`` preset (ring 2^14, depth 9, budget 5) with keys
made once per module, except one ``slow`` test of the whole chain at the paper preset.
Tolerances: a collective decryption at scale 2^50 carries ~1e-6 absolute smudging noise
(P=3); after a multiplication (doubled scale) ~1e-9.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import openfhe
import pytest
import trio
from ckks_federation import PARTIES as P
from ckks_federation import SUM_WIDTH, CkksFederation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine.ckks import (
    COUNT_RANGE,
    Bootstrap,
    BootstrapShare,
    CkksContext,
    CkksPreset,
    DecodeOverflow,
    Decryption,
    DecryptionShare,
    Flooding,
    KeySetup,
    LevelBudgetError,
    PartyKeys,
    PublicKeyGen,
    PublicKeyShare,
    RelinKeyGen,
    RelinShare,
    RotationKeyGen,
    RotationShare,
    SumDecryption,
    bootstrap_locally,
    decrypt_locally,
    ensure_levels,
    get_preset,
    in_process_run,
    inverse,
    local_refresh,
    plan_inverse,
    serial,
    setup_locally,
)
from fednorm.engine.errors import InputError, ProtocolError

FRESH_ABS_TOL = 1e-5     # scale 2^50 decryption: ~1e-6 smudging noise at P=3, with margin
DOUBLED_ABS_TOL = 1e-7   # after a multiplication: the ciphertext's own noise only
CRYPTO = settings(max_examples=3, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def foreign() -> CkksContext:
    """A context with other parameters: its objects must be rejected by ours."""
    return CkksContext(CkksPreset(name="foreign", ring_dim=1 << 13,
                                  security="HEStd_NotSet", depth=6))


vectors = st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=64).map(np.array)


# -- presets -----------------------------------------------------------------------------
def test_presets() -> None:
    paper = get_preset("paper")
    assert (paper.ring_dim, paper.security, paper.depth) == (1 << 15, "HEStd_128_classic", 11)
    assert (paper.scaling_mod_bits, paper.first_mod_bits) == (50, 60)
    assert paper.level_budget == 7 and get_preset("test").level_budget == 5
    assert paper.fingerprint != get_preset("test").fingerprint
    with pytest.raises(InputError, match="unknown CKKS preset"):
        get_preset("nope")


# -- keys --------------------------------------------------------------------------------
def test_party_keys_refuse_pickling_and_copying(fed: CkksFederation) -> None:
    keys = fed.parties[1]
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="secret key"):
            attempt(keys)
    with pytest.raises(InputError, match="never serialized"):
        fed.ctx.to_bytes(keys._sk)  # even reaching in, the secret does not become bytes
    assert "tag=" in repr(keys) and keys.joint_tag == fed.joint.tag


@CRYPTO
@given(parts=st.lists(vectors, min_size=P, max_size=P))
def test_joint_encryption_aggregates_and_decrypts(fed: CkksFederation,
                                                  parts: list[np.ndarray]) -> None:
    """Each party encrypts under the joint key; the server adds; all decrypt the sum."""
    n = max(len(p) for p in parts)
    padded = [np.pad(p, (0, n - len(p))) for p in parts]
    total = fed.encrypt(padded[0])
    for values in padded[1:]:
        total = fed.ctx.add(total, fed.encrypt(values))
    np.testing.assert_allclose(fed.decrypt(total, n), sum(padded), atol=FRESH_ABS_TOL)


def test_an_upload_at_a_reduced_level_is_smaller_and_still_multiplies(fed: CkksFederation) -> None:
    """A ciphertext encrypted at ``upload_level(k)`` takes k products, then decrypts."""
    ctx, rng = fed.ctx, np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, 16), rng.uniform(1, 2, 16)
    level = ctx.upload_level(2)
    ca = ctx.encrypt(fed.joint.public_key, a, level)
    assert ctx.consumed(ca) == level == ctx.depth - 4
    assert len(ctx.to_bytes(ca)) < 0.6 * len(ctx.to_bytes(fed.encrypt(a)))  # 5 of 10 towers
    product = ctx.mul(ctx.mul(ca, fed.consume(fed.encrypt(b), 2)), 0.5)
    np.testing.assert_allclose(fed.decrypt(ctx.double_scale(product), 16), a * b / 2,
                               atol=DOUBLED_ABS_TOL)
    summed = ctx.encrypt(fed.joint.public_key, a, ctx.upload_level(0))
    np.testing.assert_allclose(fed.decrypt(ctx.double_scale(summed), 16), a,
                               atol=DOUBLED_ABS_TOL)
    with pytest.raises(InputError, match="encryption level"):
        ctx.encrypt(fed.joint.public_key, a, ctx.depth)
    with pytest.raises(InputError, match="no level for decryption"):
        ctx.upload_level(ctx.depth - 1)


def test_a_product_too_large_to_decode_is_a_decode_overflow(fed: CkksFederation) -> None:
    """OpenFHE's decoding check fails on large products: a distinct ProtocolError, so a
    protocol can decrypt again at a smaller public scale."""
    ctx = fed.ctx
    big = fed.encrypt(np.full(4, 2.0**30))  # measured: 2^26 squared decodes, 2^28 not
    with pytest.raises(DecodeOverflow, match="too large"):
        fed.decrypt(ctx.mul(big, big), 4)
    scaled = ctx.mul(ctx.mul(big, 2.0**-30), big)
    np.testing.assert_allclose(fed.decrypt(scaled, 4), 2.0**30, rtol=1e-6)


@CRYPTO
@given(a=vectors, b=vectors, s=st.floats(-100, 100))
def test_relinearized_multiplication(fed: CkksFederation, a: np.ndarray, b: np.ndarray,
                                     s: float) -> None:
    n = min(len(a), len(b))
    a, b = a[:n] / 1e3, b[:n] / 1e3  # |x| <= 1 keeps the doubled-scale tolerance absolute
    ca, cb = fed.encrypt(a), fed.encrypt(b)
    product = fed.ctx.mul(ca, cb)
    assert fed.ctx.consumed(product) == 1 and product.NumberCiphertextElements() == 2
    np.testing.assert_allclose(fed.decrypt(product, n), a * b, atol=DOUBLED_ABS_TOL)
    np.testing.assert_allclose(fed.decrypt(fed.ctx.mul(ca, b), n), a * b, atol=DOUBLED_ABS_TOL)
    np.testing.assert_allclose(fed.decrypt(fed.ctx.mul(ca, s), n), a * s,
                               atol=DOUBLED_ABS_TOL * 100)


def test_rotations_sum_slots(fed: CkksFederation) -> None:
    values = np.arange(1.0, 2 * SUM_WIDTH + 1)
    summed = fed.decrypt(fed.ctx.sum_slots(fed.encrypt(values), SUM_WIDTH), SUM_WIDTH + 1)
    assert summed[0] == pytest.approx(values[:SUM_WIDTH].sum(), abs=FRESH_ABS_TOL)
    assert summed[SUM_WIDTH] == pytest.approx(values[SUM_WIDTH:].sum(), abs=FRESH_ABS_TOL)


@CRYPTO
@given(values=vectors, used=st.integers(0, 5))
def test_bootstrap_restores_levels_and_keeps_values(fed: CkksFederation, values: np.ndarray,
                                                    used: int) -> None:
    ct = fed.consume(fed.encrypt(values), used)
    assert fed.ctx.consumed(ct) == used
    fresh = bootstrap_locally(fed.ctx, fed.joint, fed.parties, ct)
    assert fed.ctx.consumed(fresh) == 0 and fed.ctx.levels_left(fresh) == 5
    assert fresh.GetKeyTag() == fed.joint.tag
    np.testing.assert_allclose(fed.decrypt(fresh, len(values)), values, atol=FRESH_ABS_TOL)
    product = fed.ctx.mul(fresh, 0.5)  # and it multiplies on
    np.testing.assert_allclose(fed.decrypt(product, len(values)), values / 2,
                               atol=FRESH_ABS_TOL)


def test_shares_made_in_threads(fed: CkksFederation) -> None:
    """Party-side calls on independent objects run concurrently (OpenFHE drops the GIL)."""
    values = np.linspace(-1, 1, 100)
    cts = [fed.encrypt(values * (i + 1)) for i in range(4)]
    decryption = Decryption(fed.ctx)
    with ThreadPoolExecutor(4) as pool:
        shares = list(pool.map(
            lambda ct: [decryption.generate_share(p, ct) for p in fed.parties], cts))
    for i, (ct, ct_shares) in enumerate(zip(cts, shares, strict=True)):
        out = decryption.finalize(decryption.aggregate_shares(fed.joint, ct, ct_shares), 100)
        np.testing.assert_allclose(out, values * (i + 1), atol=FRESH_ABS_TOL)


# -- levels ------------------------------------------------------------------------------
def test_level_budget_is_tracked(fed: CkksFederation) -> None:
    ctx = fed.ctx
    at_budget = fed.consume(fed.encrypt(np.ones(4)), ctx.level_budget)
    assert ctx.levels_left(at_budget) == 0
    Bootstrap(ctx).prepare(fed.joint, at_budget, 0)  # still allowed
    past = fed.ctx.mul(at_budget, 1.0)
    assert ctx.levels_left(past) == -1
    with pytest.raises(LevelBudgetError, match="collective bootstrap"):
        Bootstrap(ctx).prepare(fed.joint, past, 1)
    deepest = fed.consume(past, ctx.depth - ctx.consumed(past))
    np.testing.assert_allclose(fed.decrypt(deepest, 4), 1.0, atol=1e-3)  # decryptable...
    with pytest.raises(LevelBudgetError, match="depth"):
        ctx.mul(deepest, 1.0)  # ...but no deeper


async def test_ensure_levels_refreshes_only_when_needed(fed: CkksFederation) -> None:
    ctx = fed.ctx
    refresh = local_refresh(ctx, fed.joint, fed.parties)
    ct = fed.consume(fed.encrypt(np.full(4, 3.0)), 3)
    assert await ensure_levels(ctx, ct, 2, refresh) is ct and refresh.calls == 0
    fresh = await ensure_levels(ctx, ct, 3, refresh)
    assert refresh.calls == 1 and ctx.levels_left(fresh) == ctx.level_budget
    np.testing.assert_allclose(fed.decrypt(fresh, 4), 3.0, atol=FRESH_ABS_TOL)
    with pytest.raises(LevelBudgetError, match="can no longer be refreshed"):
        await ensure_levels(ctx, fed.consume(ct, 3), 1, refresh)
    with pytest.raises(InputError):
        await ensure_levels(ctx, ct, ctx.level_budget + 1, refresh)


# -- validation of shares ----------------------------------------------------------------
def test_decryption_shares_are_validated(fed: CkksFederation, foreign: CkksContext) -> None:
    ctx, joint, parties = fed.ctx, fed.joint, fed.parties
    decryption = Decryption(ctx)
    ct = fed.encrypt(np.ones(4))
    good = [decryption.generate_share(p, ct) for p in parties]
    deeper = fed.consume(ct, 2)
    wrong_level = [*good[:2], decryption.generate_share(parties[2], deeper)]
    with pytest.raises(ProtocolError, match="decryption share #2"):
        decryption.aggregate_shares(joint, ct, wrong_level)
    with pytest.raises(ProtocolError, match="3 parties"):
        decryption.aggregate_shares(joint, ct, good[:2])
    own = ctx.encrypt(parties[1].public_key_share, np.ones(4))  # not a joint ciphertext
    with pytest.raises(ProtocolError, match="key tag"):
        decryption.generate_share(parties[1], own)
    forged = ctx.raw.MultipartyDecryptMain([own], _sk(fed, 2))[0]
    retagged = [*good[:2], DecryptionShare(False, ctx.raw.Compress(forged, 2))]
    with pytest.raises(ProtocolError, match="key tag"):
        decryption.aggregate_shares(joint, ct, retagged)
    alien_keys = foreign.raw.KeyGen()
    alien_ct = foreign.encrypt(alien_keys.publicKey, np.ones(4))
    alien = foreign.raw.MultipartyDecryptMain([alien_ct], alien_keys.secretKey)[0]
    with pytest.raises(ProtocolError, match="another crypto context"):
        decryption.aggregate_shares(joint, ct, [*good[:2], DecryptionShare(False, alien)])
    with pytest.raises(ProtocolError, match="decryption share #0 is not flooded"):
        SumDecryption(ctx).aggregate_shares(joint, ct, good)  # shares of another operation
    with pytest.raises(ProtocolError, match="not a DecryptionShare"):
        decryption.aggregate_shares(joint, ct, [*good[:2], good[2].ciphertext])
    np.testing.assert_allclose(
        decryption.finalize(decryption.aggregate_shares(joint, ct, good), 4), 1.0,
        atol=FRESH_ABS_TOL)


def _sk(fed: CkksFederation, i: int) -> openfhe.PrivateKey:
    """Test-only access to a secret, to forge a share the API would never make."""
    return fed.parties[i]._sk


def test_bootstrap_shares_are_validated(fed: CkksFederation, foreign: CkksContext) -> None:
    ctx, joint, parties = fed.ctx, fed.joint, fed.parties
    boot = Bootstrap(ctx)
    rnd = boot.prepare(joint, fed.encrypt(np.ones(4)), 2)
    good = [boot.generate_share(p, joint.public_key, rnd.c1, rnd.index) for p in parties]
    outsider = PartyKeys.generate(ctx, parties[0].public_key_share)  # not in the federation
    with pytest.raises(ProtocolError, match="bootstrap share #2 has key tag"):
        boot.aggregate_shares(joint, rnd, [
            *good[:2], boot.generate_share(outsider, joint.public_key, rnd.c1, rnd.index)])
    with pytest.raises(ProtocolError, match="key tag"):
        boot.aggregate_shares(joint, rnd, [good[1], good[0], good[2]])  # out of order
    alien_keys = foreign.raw.KeyGen()
    alien_ct = foreign.encrypt(alien_keys.publicKey, np.ones(4))
    with pytest.raises(ProtocolError, match="another crypto context"):
        boot.aggregate_shares(joint, rnd, [*good[:2], BootstrapShare(2, alien_ct, alien_ct)])
    other = boot.generate_share(parties[2], joint.public_key, rnd.c1, 3)  # another element
    with pytest.raises(ProtocolError, match="bootstrap share #2 is for bootstrap #3"):
        boot.aggregate_shares(joint, rnd, [*good[:2], other])
    uncompressed = fed.encrypt(np.ones(4))
    uncompressed.RemoveElement(0)
    with pytest.raises(ProtocolError, match="wrong level"):
        parties[0].boot_share(uncompressed, rnd.a)
    with pytest.raises(ProtocolError, match="elements"):
        parties[0].boot_share(rnd.adjusted, rnd.a)


def test_key_shares_are_validated(fed: CkksFederation, foreign: CkksContext) -> None:
    ctx, parties = fed.ctx, fed.parties
    joint, relin = fed.joint, RelinKeyGen(ctx)
    lead_share = relin.generate_share(parties[0])
    round1 = [lead_share] + [relin.generate_share(p, lead_share) for p in parties[1:]]
    with pytest.raises(ProtocolError, match="round-1 relinearization share #1"):
        relin.aggregate_shares(joint, [round1[0], round1[2], round1[1]])
    joint1 = relin.aggregate_shares(joint, round1)
    round2 = [relin.generate_round_two_share(p, joint1) for p in parties]
    with pytest.raises(ProtocolError, match="rounds \\[1, 2\\] aggregated together"):
        relin.aggregate_shares(joint, [*round2[:2], round1[2]])
    with pytest.raises(ProtocolError, match="key tag"):  # a round-1 share claiming round 2
        relin.aggregate_shares(joint, [*round2[:2], RelinShare(2, round1[2].key)])
    with pytest.raises(ProtocolError, match="not a round-2 one"):
        relin.generate_share(parties[1], round2[0])
    with pytest.raises(ProtocolError, match="key tag"):
        relin.generate_round_two_share(parties[1], round1[1].key)
    public = PublicKeyGen(ctx)
    with pytest.raises(ProtocolError, match="same key tag"):
        public.aggregate_shares([public.generate_share(parties[0])] * 2)
    with pytest.raises(ProtocolError, match="another crypto context"):
        public.aggregate_shares([public.generate_share(parties[0]),
                                 PublicKeyShare(foreign.raw.KeyGen().publicKey)])


def test_rotation_key_shares_are_tag_checked(fed: CkksFederation) -> None:
    ctx, joint, parties = fed.ctx, fed.joint, fed.parties
    rotation = RotationKeyGen(ctx, [1])
    lead_share = rotation.generate_share(parties[0])
    shares = [lead_share] + [rotation.generate_share(p, lead_share) for p in parties[1:]]
    rotation.aggregate_shares(joint, shares)  # in order: accepted
    with pytest.raises(ProtocolError, match="rotation-key share #0 does not carry"):
        rotation.aggregate_shares(joint, [shares[1], shares[0], shares[2]])
    outsider = PartyKeys.generate(CkksContext("test"))  # another federation's lead
    with pytest.raises(ProtocolError, match="rotation-key share #1 does not carry"):
        rotation.aggregate_shares(joint, [lead_share, rotation.generate_share(outsider),
                                          shares[2]])
    with pytest.raises(ProtocolError, match="share #1 is for offsets \\[1, 3\\]"):
        rotation.aggregate_shares(joint, [lead_share, RotationShare((1, 3), shares[1].keys),
                                          shares[2]])


# -- the uniform verbs ---------------------------------------------------------------------
def test_every_operation_matches_a_single_key(fed: CkksFederation) -> None:
    """Each operation class, run generate_share -> aggregate_shares -> finalize for three
    parties in memory, gives what one ordinary key pair gives on the same computation
    (product, rotation, decryption, bootstrap, flooded sum) within CKKS tolerance."""
    ctx = CkksContext("test")
    public, relin, rotation = PublicKeyGen(ctx), RelinKeyGen(ctx), RotationKeyGen(ctx, [1, 2])
    lead = PartyKeys.generate(ctx)
    parties = [lead] + [PartyKeys.generate(ctx, lead.public_key_share) for _ in range(2)]
    joint = public.finalize(public.aggregate_shares([public.generate_share(p) for p in parties]))
    lead_relin, lead_rotation = relin.generate_share(lead), rotation.generate_share(lead)
    round1 = relin.aggregate_shares(
        joint, [lead_relin] + [relin.generate_share(p, lead_relin) for p in parties[1:]])
    relin.finalize(joint, relin.aggregate_shares(
        joint, [relin.generate_round_two_share(p, round1) for p in parties]))
    rotation.finalize(joint, rotation.aggregate_shares(
        joint, [lead_rotation] + [rotation.generate_share(p, lead_rotation)
                                  for p in parties[1:]]))
    single = ctx.raw.KeyGen()
    ctx.raw.EvalMultKeyGen(single.secretKey)
    ctx.raw.EvalRotateKeyGen(single.secretKey, [1, 2])

    rng = np.random.default_rng(11)
    x, y = rng.uniform(-1, 1, 32), rng.uniform(-1, 1, 32)

    def compute(public_key: openfhe.PublicKey) -> openfhe.Ciphertext:
        product = ctx.mul(ctx.encrypt(public_key, x), ctx.encrypt(public_key, y))
        return ctx.rotate(ctx.rotate(product, 1), 2)

    def single_key(ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        return ctx.decode(ctx.raw.Decrypt(single.secretKey, ct), n)

    def collective(operation: Decryption, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        shares = [operation.generate_share(p, ct) for p in parties]
        return operation.finalize(operation.aggregate_shares(joint, ct, shares), n)

    reference = single_key(compute(single.publicKey), 29)
    np.testing.assert_allclose(reference, (x * y)[3:], atol=DOUBLED_ABS_TOL)
    ct = compute(joint.public_key)
    np.testing.assert_allclose(collective(Decryption(ctx), ct, 29), reference,
                               atol=DOUBLED_ABS_TOL)
    boot = Bootstrap(ctx)
    rnd = boot.prepare(joint, ct, 0)
    shares = [boot.generate_share(p, joint.public_key, rnd.c1, 0) for p in parties]
    fresh = boot.finalize(joint, rnd, boot.aggregate_shares(joint, rnd, shares))
    assert ctx.consumed(fresh) == 0
    np.testing.assert_allclose(collective(Decryption(ctx), fresh, 29), reference,
                               atol=FRESH_ABS_TOL)
    uploads = [ctx.encrypt_sum(joint.public_key, x) for _ in parties]
    total = ctx.add(ctx.add(uploads[0], uploads[1]), uploads[2])
    flooding = Flooding(ctx.preset.ring_dim, P, P)
    single_sum = ctx.encrypt_sum(single.publicKey, 3 * x)
    np.testing.assert_allclose(collective(SumDecryption(ctx, flooding), total, 32),
                               single_key(single_sum, 32), atol=1e-9)


def serialize(obj: object) -> bytes:
    return openfhe.Serialize(obj, openfhe.BINARY)


def test_key_setup_composes_the_key_operations() -> None:
    """KeySetup's three steps give working joint keys (products, rotations), and a
    party's shares must cover every operation the setup needs."""
    ctx = CkksContext("test")
    setup = KeySetup(ctx, relinearize=True, rotations=(4,))
    lead = setup.generate_keys(None)
    lead_shares = setup.generate_shares(lead, None)
    assert (lead_shares.relin.round, lead_shares.rotation.indices) == (1, (4,))
    others = [setup.generate_keys(lead_shares) for _ in range(2)]
    shares = [lead_shares] + [setup.generate_shares(p, lead_shares) for p in others]
    total = setup.round_one_sum()  # as a server adds them up: one party at a time
    for share in shares[:2]:
        total.add(share)
    with pytest.raises(ProtocolError, match="rotation-key share is missing"):
        total.add(replace(shares[2], rotation=None))
    with pytest.raises(ProtocolError, match="round-1 relinearization share #2 has key tag"):
        total.add(replace(shares[2], relin=shares[1].relin))  # party 2's under party 3's
    with pytest.raises(ProtocolError, match="same key tag"):
        total.add(shares[1])
    total.add(shares[2])  # the refused ones left every sum as it was
    round_one = total.result()
    # The running sums equal OpenFHE's pairwise folds of all the shares, lead first.
    raw, tag = ctx.raw, round_one.joint.tag
    assert round_one.joint.party_tags == tuple(s.public_key.key.GetKeyTag() for s in shares)
    assert serialize(round_one.joint.public_key) == serialize(functools.reduce(
        lambda acc, key: raw.MultiAddPubKeys(acc, key, tag), [s.public_key.key for s in shares]))
    assert serialize(round_one.relin) == serialize(functools.reduce(
        lambda acc, key: raw.MultiAddEvalKeys(acc, key, tag), [s.relin.key for s in shares]))
    total.finalize_rotations(round_one.joint)
    parties = [lead, *others]
    round_two = setup.round_two_sum(round_one.joint)
    for party in parties:
        round_two.add(setup.generate_round_two_share(party, round_one), round_one.joint.tag)
    with pytest.raises(ProtocolError, match="round-2 relinearization share #3 is of round 1"):
        round_two.add(lead_shares.relin, round_one.joint.tag)
    setup.install_relin(round_one.joint, round_two)
    x = np.arange(1.0, 9.0) / 8
    ct = ctx.encrypt(round_one.joint.public_key, x)
    got = decrypt_locally(ctx, round_one.joint, parties, ctx.rotate(ctx.mul(ct, ct), 4), 4)
    np.testing.assert_allclose(got, (x * x)[4:], atol=DOUBLED_ABS_TOL)
    without = KeySetup(ctx, relinearize=False)
    assert without.generate_shares(lead, None).relin is None
    assert without.generate_round_two_share(lead, round_one) is None


# -- bytes -------------------------------------------------------------------------------
def test_serialization_round_trips(fed: CkksFederation) -> None:
    ctx, parties = fed.ctx, fed.parties
    values = np.linspace(-5, 5, 10)
    lead_relin, lead_rot = parties[0].relin_share(), parties[0].rotation_share([1, 3])
    relin = RelinKeyGen(ctx)
    round1 = relin.aggregate_shares(fed.joint, [RelinShare(1, lead_relin)] + [
        relin.generate_share(p, RelinShare(1, lead_relin)) for p in parties[1:]])
    objects = [
        ("ciphertext", fed.encrypt(values)),
        ("public_key", fed.joint.public_key),
        ("eval_key", lead_relin),
        ("eval_key", parties[1].relin_mult_share(round1)),
        ("eval_key_map", lead_rot),
        ("eval_key_map", parties[2].rotation_share([1, 3], lead_rot)),
    ]
    for kind, obj in objects:
        back = ctx.from_bytes(kind, ctx.to_bytes(obj))
        assert isinstance(back, type(obj))
        if hasattr(obj, "GetKeyTag"):
            assert back.GetKeyTag() == obj.GetKeyTag()
        if hasattr(back, "GetCryptoContext"):
            # Parsing skips the CRT tables of the payload's copy of the parameters: the
            # object must resolve to the context this process built, tables and all.
            assert back.GetCryptoContext() == ctx.raw
    ct = ctx.from_bytes("ciphertext", ctx.to_bytes(objects[0][1]))
    np.testing.assert_allclose(fed.decrypt(ct, 10), values, atol=FRESH_ABS_TOL)
    halved = ctx.raw.EvalMult(ct, 0.5)  # rescales: uses the context's CRT tables
    np.testing.assert_allclose(fed.decrypt(halved, 10), values / 2, atol=FRESH_ABS_TOL)
    share = parties[1].decrypt_share(ct)
    assert len(ctx.to_bytes(share)) * 4 < len(ctx.to_bytes(ct))  # shares are compressed
    rnd = Bootstrap(ctx).prepare(fed.joint, ct, 3)
    h0, h1 = (ctx.from_bytes("ciphertext", ctx.to_bytes(h))
              for h in parties[0].boot_share(rnd.c1, rnd.a))
    assert h0.GetKeyTag() == h1.GetKeyTag() == parties[0].tag


_EMBEDDING_CODE = """
import json, openfhe
from fednorm.engine.ckks.context import CkksContext
ctx = CkksContext("test")
keys = ctx.raw.KeyGen()
ct = ctx.raw.Encrypt(keys.publicKey, ctx.raw.MakeCKKSPackedPlaintext([1.0]))
ctx.from_bytes("ciphertext", ctx.to_bytes(ct))  # fednorm parses
# Code embedding fednorm loads a context of its own, in a fresh context registry.
blob = openfhe.Serialize(ctx.raw, openfhe.BINARY)
openfhe.ReleaseAllContexts()
cc = openfhe.DeserializeCryptoContextString(blob, openfhe.BINARY)
mine = cc.KeyGen()
product = cc.EvalMult(cc.Encrypt(mine.publicKey, cc.MakeCKKSPackedPlaintext([1.0, 2.0])), 3.0)
plain = cc.Decrypt(product, mine.secretKey)
plain.SetLength(2)
print(json.dumps(plain.GetRealPackedValue()))
"""


def test_code_embedding_fednorm_still_loads_contexts_that_compute() -> None:
    """fednorm skips OpenFHE's CRT precomputation only while it parses its own payloads:
    a context that the embedding code deserializes afterwards gets its tables (without
    them it computes NaN, as it did when fednorm turned the precomputation off for the
    whole process). In a subprocess: the check empties OpenFHE's context registry."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _EMBEDDING_CODE], capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == pytest.approx([3.0, 6.0], abs=1e-6)


def test_malformed_bytes_are_protocol_errors(fed: CkksFederation, foreign: CkksContext) -> None:
    ctx = fed.ctx
    data = ctx.to_bytes(fed.encrypt(np.ones(3)))
    header = 29  # magic 4 + kind 1 + fingerprint 8 + digest 16
    flipped = bytearray(data)
    flipped[header + 100] ^= 0xFF  # inside the crypto parameters: would crash OpenFHE
    payload = bytes(flipped[header:])
    # a peer that recomputes the digest still cannot get odd parameters past the template
    forged = data[:13] + serial.payload_digest(payload) + payload
    cases = [
        ("ciphertext", data[:10], "too short"),
        ("ciphertext", b"XXXX" + data[4:], "bad magic"),
        ("ciphertext", data[:-1000], "digest"),
        ("ciphertext", bytes(flipped), "digest"),
        ("ciphertext", forged, "crypto parameters"),
        ("ciphertext", os.urandom(5000), "malformed"),
        ("public_key", data, "expected a public_key"),
        ("public_key", foreign.to_bytes(foreign.raw.KeyGen().publicKey), "another CKKS preset"),
    ]
    for kind, blob, message in cases:
        with pytest.raises(ProtocolError, match=message):
            ctx.from_bytes(kind, blob)


def test_a_broadcasts_readers_in_one_process_share_one_parse(fed: CkksFederation) -> None:
    """In a simulation every reader of a broadcast gets one parse of its bytes; outside
    one (a role per process) nothing is kept."""
    ctx = fed.ctx
    values = np.array([1.5, -2.0, 3.25])
    data = ctx.to_bytes(fed.encrypt(values))
    ctx.from_bytes("ciphertext", data)
    assert ctx.kept_bytes == 0  # one role per process: nobody here reads a frame twice
    with in_process_run():
        first = ctx.from_bytes("ciphertext", data)
        assert ctx.kept_bytes == len(data)
        assert ctx.from_bytes("ciphertext", bytes(data)) is first  # equal bytes, no parse
        fresh = serial.load("ciphertext", serial.unframe("ciphertext", data,
                                                          ctx.preset.fingerprint))
        framed = ctx.to_bytes(fresh)
        assert ctx.to_bytes(first) == framed  # as a parse of its own would serialize
        # ... which is not the sender's bytes: a parse serializes longer than the original
        # (why readers get a parse, never the sender's object; see from_bytes).
        assert len(framed) > len(data)
        np.testing.assert_allclose(fed.decrypt(first, 3), values, atol=FRESH_ABS_TOL)
        # The same bytes with one payload byte flipped are parsed, and refused.
        flipped = bytearray(data)
        flipped[-100] ^= 0xFF
        with pytest.raises(ProtocolError, match="digest"):
            ctx.from_bytes("ciphertext", bytes(flipped))
    assert ctx.kept_bytes == 0  # the last run's objects are let go


def test_codec_registration(fed: CkksFederation) -> None:
    registered = {}

    def register(code, cls, encode, decode) -> None:
        registered[code] = (cls, encode, decode)

    fed.ctx.register_codec_types(register)
    assert sorted(registered) == [16, 17, 18, 19]
    cls, encode, decode = registered[16]
    ct = fed.encrypt(np.ones(2))
    assert cls is type(ct) and isinstance(decode(encode(ct)), cls)
    with pytest.raises(ProtocolError):
        registered[17][2](encode(ct))  # a ciphertext is not a public key


# -- inverse -----------------------------------------------------------------------------
async def _inverse_errors(fed: CkksFederation, x: np.ndarray, lo: float, hi: float,
                          out_scale: float) -> tuple[np.ndarray, openfhe.Ciphertext]:
    """Relative errors of ``out_scale / x`` (and the result); checks the dry-run plan held."""
    ctx = fed.ctx
    refresh = local_refresh(ctx, fed.joint, fed.parties)
    out = await inverse(ctx, fed.encrypt(x), lo, hi, refresh, out_scale=out_scale)
    plan = plan_inverse(ctx.level_budget, lo, hi)
    assert (refresh.calls, ctx.consumed(out)) == (plan.bootstraps, plan.output_consumed)
    return _relative_errors(fed, out, x / out_scale), out


def _relative_errors(fed: CkksFederation, out: openfhe.Ciphertext, x: np.ndarray) -> np.ndarray:
    """|out * x - 1|: one magnitude in every slot, so decoding adds little noise."""
    return np.abs(fed.decrypt(fed.ctx.mul(out, x), len(x)) - 1.0)


async def test_inverse_over_count_range(fed: CkksFederation) -> None:
    x = np.geomspace(*COUNT_RANGE, 4096)
    hi = COUNT_RANGE[1]
    scaled, out = await _inverse_errors(fed, x, *COUNT_RANGE, out_scale=hi)
    assert scaled.max() < 1e-6  # measured 3.2e-7; approximation bound 2.25e-7
    direct = _relative_errors(fed, fed.ctx.mul(out, 1 / hi), x)  # 1/x itself
    assert direct.max() < 1e-4  # outputs ~1e-6 carry ~4e-11 absolute noise


@settings(max_examples=2, deadline=None)
@given(lo_exp=st.floats(-10, 10), width=st.floats(1, 12), data=st.data())
def test_inverse_on_random_ranges(fed: CkksFederation, lo_exp: float, width: float,
                                  data: st.DataObject) -> None:
    lo, hi = 2.0**lo_exp, 2.0 ** (lo_exp + width)
    exps = data.draw(st.lists(st.floats(lo_exp, lo_exp + width), min_size=1, max_size=32))
    x = np.clip(np.exp2(np.array(exps)), lo, hi)
    errors, _ = trio.run(_inverse_errors, fed, x, lo, hi, hi)
    assert errors.max() < 1e-6


def test_inverse_plan() -> None:
    paper = plan_inverse(7)
    assert (paper.doublings, paper.bootstraps, paper.output_consumed) == (13, 2, 5)
    assert paper.error_bound < 2.3e-7
    assert plan_inverse(7, keep_levels=2).output_consumed <= 5
    assert plan_inverse(7, 1.0, 64.0).bootstraps == 0
    with pytest.raises(InputError):
        plan_inverse(7, 2.0, 1.0)


async def test_inverse_without_refresh_is_refused_up_front(fed: CkksFederation) -> None:
    with pytest.raises(InputError, match="refresh"):
        await inverse(fed.ctx, fed.encrypt(np.ones(2)))


# -- the paper preset, whole chain ---------------------------------------------------------
@pytest.mark.slow
async def test_paper_preset_whole_chain() -> None:
    """Keys for P=10 -> encrypt -> aggregate -> multiply -> bootstrap -> inverse -> decrypt."""
    ctx = CkksContext("paper")
    parties, joint = setup_locally(ctx, 10)
    rng = np.random.default_rng(7)
    parts = [rng.uniform(0, 10, 256) for _ in parties]
    counts = [rng.integers(1, 5000, 256).astype(float) for _ in parties]
    total = ctx.encrypt(joint.public_key, parts[0])
    n = ctx.encrypt(joint.public_key, counts[0])
    for values, cnt in zip(parts[1:], counts[1:], strict=True):
        total = ctx.add(total, ctx.encrypt(joint.public_key, values))
        n = ctx.add(n, ctx.encrypt(joint.public_key, cnt))
    squared = ctx.mul(total, total)
    fresh = bootstrap_locally(ctx, joint, parties, squared)
    assert ctx.consumed(fresh) == 0
    refresh = local_refresh(ctx, joint, parties)
    inv = await inverse(ctx, n, *COUNT_RANGE, refresh, out_scale=COUNT_RANGE[1], keep_levels=1)
    mean_sq = ctx.mul(fresh, ctx.mul(inv, 1.0 / COUNT_RANGE[1]))
    expected = sum(parts) ** 2 / sum(counts)
    got = decrypt_locally(ctx, joint, parties, mean_sq, 256)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert refresh.calls == plan_inverse(7).bootstraps


def test_malformed_shares_are_protocol_errors(fed: CkksFederation) -> None:
    ctx, joint, parties = fed.ctx, fed.joint, fed.parties
    one_element = fed.encrypt(np.ones(4))
    one_element.RemoveElement(1)
    with pytest.raises(ProtocolError, match="1 elements, expected 2"):
        parties[0].decrypt_share(one_element)
    boot = Bootstrap(ctx)
    rnd = boot.prepare(joint, fed.encrypt(np.ones(4)), 4)
    good = [boot.generate_share(p, joint.public_key, rnd.c1, rnd.index) for p in parties]
    short = ctx.raw.Compress(good[1].h1, 3)  # right tag and element count, too few towers
    with pytest.raises(ProtocolError, match="bootstrap share #1 has a part with 3 towers"):
        boot.aggregate_shares(joint, rnd, [good[0], BootstrapShare(4, good[1].h0, short),
                                           good[2]])


