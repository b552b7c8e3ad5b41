"""The collective operations' shares: each checks what it aggregates (context, tag,
index, towers, element count), every operation has the same verbs and matches a
single-key computation, and the key setup composes them."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import openfhe
import pytest
from ckks_federation import DOUBLED_ABS_TOL, FRESH_ABS_TOL, CkksFederation
from ckks_federation import PARTIES as P

from fednorm.engine.ckks import (
    Bootstrap,
    BootstrapShare,
    CkksContext,
    Decryption,
    DecryptionShare,
    Flooding,
    KeySetup,
    PartyKeys,
    PublicKeyGen,
    PublicKeyShare,
    RelinKeyGen,
    RelinShare,
    RotationKeyGen,
    RotationShare,
    SumDecryption,
    decrypt_locally,
)
from fednorm.engine.errors import ProtocolError


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
    retagged = [*good[:2], DecryptionShare(ctx.raw.Compress(forged, 2))]
    with pytest.raises(ProtocolError, match="key tag"):
        decryption.aggregate_shares(joint, ct, retagged)
    alien_keys = foreign.raw.KeyGen()
    alien_ct = foreign.encrypt(alien_keys.publicKey, np.ones(4))
    alien = foreign.raw.MultipartyDecryptMain([alien_ct], alien_keys.secretKey)[0]
    with pytest.raises(ProtocolError, match="another crypto context"):
        decryption.aggregate_shares(joint, ct, [*good[:2], DecryptionShare(alien)])
    with pytest.raises(ProtocolError, match=r"decryption share #0: \(elements, level"):
        SumDecryption(ctx).aggregate_shares(joint, ct, good)  # a plain share's towers
    with pytest.raises(ProtocolError, match="not a DecryptionShare"):
        decryption.aggregate_shares(joint, ct, [*good[:2], good[2].share])
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
        alien = BootstrapShare(index=2, h0=alien_ct, h1=alien_ct)
        boot.aggregate_shares(joint, rnd, [*good[:2], alien])
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
    round1 = [lead_share] + [relin.generate_share(p, 1, lead_share) for p in parties[1:]]
    with pytest.raises(ProtocolError, match="round-1 relinearization share #1"):
        relin.aggregate_shares(joint, [round1[0], round1[2], round1[1]])
    joint1 = relin.aggregate_shares(joint, round1)
    round2 = [relin.generate_share(p, 2, joint1) for p in parties]
    with pytest.raises(ProtocolError, match="rounds \\[1, 2\\] aggregated together"):
        relin.aggregate_shares(joint, [*round2[:2], round1[2]])
    with pytest.raises(ProtocolError, match="key tag"):  # a round-1 share claiming round 2
        relin.aggregate_shares(joint, [*round2[:2], RelinShare(2, round1[2].key)])
    with pytest.raises(ProtocolError, match="not on a round-2 share"):
        relin.generate_share(parties[1], 1, round2[0])
    with pytest.raises(ProtocolError, match="round-1 aggregate, not on a round-1 share"):
        relin.generate_share(parties[1], 2, round1[1])
    with pytest.raises(ProtocolError, match="key tag"):
        relin.generate_share(parties[1], 2, round1[1].key)
    with pytest.raises(ProtocolError, match="rounds 1 and 2, not 3"):
        relin.generate_share(parties[1], 3, joint1)
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
        joint, [lead_relin] + [relin.generate_share(p, 1, lead_relin) for p in parties[1:]])
    relin.finalize(joint, relin.aggregate_shares(
        joint, [relin.generate_share(p, 2, round1) for p in parties]))
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
    lead_shares = setup.generate_share(lead, 1, None)
    relin, rotation = setup.typed(lead_shares)[1:]
    assert (relin.round, rotation.indices) == (1, (4,))
    others = [setup.generate_keys(lead_shares) for _ in range(2)]
    shares = [lead_shares] + [setup.generate_share(p, 1, lead_shares) for p in others]
    total = setup.running_sum(1)  # as a server adds them up: one party at a time
    for share in shares[:2]:
        total.add(share)
    with pytest.raises(ProtocolError, match="rotation-key share is missing"):
        total.add(replace(shares[2], rotation_share=None))
    with pytest.raises(ProtocolError, match="round-1 relinearization share #2 has key tag"):
        # party 2's under party 3's:
        total.add(replace(shares[2], relin_share=shares[1].relin_share))
    with pytest.raises(ProtocolError, match="same key tag"):
        total.add(shares[1])
    total.add(shares[2])  # the refused ones left every sum as it was
    round_one = total.result()
    # The running sums equal OpenFHE's pairwise folds of all the shares, lead first.
    raw, tag = ctx.raw, round_one.joint.tag
    assert round_one.joint.party_tags == tuple(s.public_key.GetKeyTag() for s in shares)
    assert serialize(round_one.joint.public_key) == serialize(functools.reduce(
        lambda acc, key: raw.MultiAddPubKeys(acc, key, tag), [s.public_key for s in shares]))
    assert serialize(round_one.relin_round1) == serialize(functools.reduce(
        lambda acc, key: raw.MultiAddEvalKeys(acc, key, tag), [s.relin_share for s in shares]))
    total.finalize(round_one.joint)
    parties = [lead, *others]
    round_two = setup.running_sum(2, round_one.joint)
    for party in parties:
        round_two.add(setup.generate_share(party, 2, round_one))
    with pytest.raises(ProtocolError, match="round-2 share expected, not a LeadKeys"):
        round_two.add(lead_shares)
    round_two.finalize()
    x = np.arange(1.0, 9.0) / 8
    ct = ctx.encrypt(round_one.joint.public_key, x)
    got = decrypt_locally(ctx, round_one.joint, parties, ctx.rotate(ctx.mul(ct, ct), 4), 4)
    np.testing.assert_allclose(got, (x * x)[4:], atol=DOUBLED_ABS_TOL)
    without = KeySetup(ctx, relinearize=False)
    assert without.generate_share(lead, 1, None).relin_share is None
    assert without.generate_share(lead, 2, round_one) is None



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
        boot.aggregate_shares(joint, rnd, [good[0], BootstrapShare(index=4, h0=good[1].h0,
                                                                   h1=short),
                                           good[2]])


