"""The collective sub-protocols' messages: each carries the typed shares of the engine's
operations (what they are shares of) and refuses a share the setup needs but lacks."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import trio
from tcp_federation import connected_pair

from fednorm.engine import ckks
from fednorm.engine.codec import Header, decode_received, encode_frame
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.collective import shared_context


def test_setup_shares_are_the_messages_and_the_engine_types_them() -> None:
    """A key setup's round-one shares are the lead's or another party's message as it
    crosses the wire (signed when sent); the setup types each operation's share from
    it, and refuses a bundle that lacks one it needs.  Round two is the
    relinearization share alone, as its own message."""
    ctx = shared_context("test")
    setup = ckks.KeySetup(ctx, relinearize=True, rotations=(1,))
    lead = setup.generate_keys(None)
    shares = setup.generate_share(lead, 1, None)
    assert type(shares) is ckks.LeadKeys
    assert list(shares.fields()) == ["signature", "certificate", "public_key", "relin_share",
                                     "rotation_share"]
    assert (shares.signature, shares.certificate) == (b"", b"")  # signed when sent
    public_key, relin, rotation = setup.typed(shares)
    assert public_key.key is shares.public_key
    assert (relin.round, relin.key) == (1, shares.relin_share)
    assert (rotation.indices, rotation.keys) == ((1,), shares.rotation_share)
    other = setup.generate_keys(shares)
    assert type(setup.generate_share(other, 1, shares)) is ckks.KeyShares
    without_relin = ckks.KeyShares(public_key=shares.public_key, relin_share=None,
                                   rotation_share=shares.rotation_share)
    with pytest.raises(ProtocolError, match="relin-key share is missing"):
        setup.typed(without_relin)
    plain = ckks.KeySetup(ctx, relinearize=False)
    assert plain.typed(shares)[1:] == (None, None)

    total = setup.running_sum(1)
    for shares_of_party in (shares, setup.generate_share(other, 1, shares)):
        total.add(shares_of_party)
    round_one = total.result()
    received = decode_received(encode_frame(Header("ppf", "s", 0, 0, round_one.KIND),
                                            round_one))[1]
    assert (received.joint.tag, received.joint.party_tags) == \
        (round_one.joint.tag, round_one.joint.party_tags)
    assert ckks.object_digest(received.public_key, parsed=True) == \
        ckks.object_digest(round_one.public_key)
    round_two = setup.generate_share(other, 2, received)
    assert type(round_two) is ckks.RelinRound2 and list(round_two.fields())[2:] == ["share"]
    with pytest.raises(ProtocolError, match="round-2 share expected, not a KeyShares"):
        setup.running_sum(2, round_one.joint).add(without_relin)


def test_a_share_is_its_own_message() -> None:
    """The engine's shares cross the wire as they are: a decryption share and a
    bootstrap share, framed and parsed, are the engine's types with the same fields."""
    ctx = shared_context("test")
    parties, joint = ckks.setup_locally(ctx, 2)
    ct = ctx.encrypt(joint.public_key, [1.0, 2.0])
    boot = ckks.Bootstrap(ctx)
    made = [ckks.Decryption(ctx).generate_share(parties[0], ct),
            boot.generate_share(parties[0], joint.public_key, boot.prepare(joint, ct, 0).c1, 0)]
    for share in made:
        arrived = decode_received(encode_frame(Header("ppf", "s", 1, 0, share.KIND), share))[1]
        assert type(arrived) is type(share)
        assert [_digest(v, True) for v in arrived.fields().values()] == \
            [_digest(v, False) for v in share.fields().values()]


def _digest(value: object, parsed: bool) -> object:
    """A field as a receiver compares it: an OpenFHE object by the digest of its parse."""
    if isinstance(value, bytes | int):
        return value
    return ckks.object_digest(value, parsed=True) if parsed else \
        ckks.serial.ciphertext_digest_as_received(value)


async def _over_tcp(certs, sent: list) -> list:
    """``sent``, each framed and sent by party 1 over a TLS link on the loopback, as the
    server's end parses them."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server_end, party_end = await connected_pair(listeners[0], certs, 1)
    arrived = []

    async def send_all() -> None:
        for share in sent:
            await party_end.send(encode_frame(Header("ppf", "s", 1, 0, share.KIND), share))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_all)
        for _ in sent:
            arrived.append(decode_received(await server_end.receive())[1])
    for link in (server_end, party_end):
        await trio.aclose_forcefully(link.stream)
    await listeners[0].aclose()
    return arrived


async def test_the_engine_checks_the_shares_that_arrive_over_tcp(certs) -> None:
    """Shares sent over TCP reach the engine's checks as they were sent: a bootstrap
    share made for bootstrap #1 in answer to #0, and a decryption share of another
    ciphertext's shape, are refused by name (the server used to relabel each reply with
    what it expected, so the index check never saw network input)."""
    ctx = shared_context("test")
    parties, joint = ckks.setup_locally(ctx, 2)
    boot, decryption = ckks.Bootstrap(ctx), ckks.Decryption(ctx)
    ct = ctx.encrypt(joint.public_key, [1.0, 2.0])
    rnd = boot.prepare(joint, ct, 0)
    prepared = decryption.prepare(ct)
    arrived = await _over_tcp(certs, [
        boot.generate_share(parties[0], joint.public_key, rnd.c1, 0),
        boot.generate_share(parties[1], joint.public_key, rnd.c1, 1),
        boot.generate_share(parties[1], joint.public_key, rnd.c1, 0),
        decryption.generate_share(parties[0], prepared),
        decryption.generate_share(parties[1], ct),  # not prepared: other towers
        decryption.generate_share(parties[1], prepared)])
    with pytest.raises(ProtocolError, match=r"share #1 is for bootstrap #1, expected #0"):
        boot.aggregate_shares(joint, rnd, arrived[:2])
    with pytest.raises(ProtocolError, match=r"decryption share #1"):
        decryption.aggregate_shares(joint, prepared, arrived[3:5])
    assert boot.aggregate_shares(joint, rnd, [arrived[0], arrived[2]])  # the same link
    assert decryption.aggregate_shares(joint, prepared, [arrived[3], arrived[5]])


async def test_the_key_setup_checks_the_shares_that_arrive_over_tcp(certs) -> None:
    """A key setup's round-one shares sent over TCP are checked as they arrived: one
    lacking the relinearization share, or carrying another party's, is refused by name
    and leaves the running sums as they were."""
    ctx = shared_context("test")
    setup, _, shares = _round_one(ctx)
    lacking = dataclasses.replace(shares[1], relin_share=None)
    borrowed = dataclasses.replace(shares[2], relin_share=shares[1].relin_share)
    arrived = await _over_tcp(certs, [shares[0], lacking, shares[1], borrowed, shares[2]])
    total = setup.running_sum(1)
    total.add(arrived[0])
    with pytest.raises(ProtocolError, match="relin-key share is missing"):
        total.add(arrived[1])
    total.add(arrived[2])
    with pytest.raises(ProtocolError, match="round-1 relinearization share #2 has key tag"):
        total.add(arrived[3])
    total.add(arrived[4])
    assert total.result().party_tags == [s.public_key.GetKeyTag() for s in shares]


def test_the_server_adds_each_party_s_key_shares_before_reading_the_next() -> None:
    """What the server holds during key setup: one party's shares (31 MB at ring 2^15)
    and the running sums, never all P parties' — each share is added (and so checked)
    and forwarded to the other parties before the next party's message is read."""
    import numpy as np

    from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
    from fednorm.protocols import FitOptions
    from fednorm.sim.federation import simulate

    class Order(Tracer):
        def __init__(self) -> None:
            self.events: list[str] = []

        def frame(self, event: FrameEvent) -> None:
            shares = ("ckks.lead_keys", "ckks.key_shares", "ckks.relin_round2")
            if event.kind in shares:
                self.events.append("read" if event.direction == "received" else "forward")

        def crypto_call(self, event: CryptoEvent) -> None:
            if event.call in ("RoundOneSum.add", "RoundTwoSum.add"):
                self.events.append("add")

    seen = Order()
    parts = [np.random.default_rng(p).normal(size=(5, 2)) for p in range(4)]
    # the paper's z-score: its encrypted inverse needs the relinearization key's two rounds
    simulate(parts, "zscore", "mhe", FitOptions(preset="test", algorithm="paper"), tracer=seen)
    # round one: the lead's shares, then parties 2..4's; round two: all 4; each read,
    # added, then forwarded to the 3 other parties
    assert seen.events == ["read", "add"] + ["forward"] * 3 + (
        ["read", "add"] + ["forward"] * 3) * 3 + (["read", "add"] + ["forward"] * 3) * 4


# -- what a party checks of the joint keys --------------------------------------------------
def _parsed(ctx: ckks.CkksContext, shares: ckks.SetupShares) -> ckks.SetupShares:
    """The shares as a party reads them off the wire."""
    def back(obj: object, kind: str) -> object:
        return ctx.from_bytes(kind, ctx.to_bytes(obj))
    return type(shares)(public_key=back(shares.public_key, "public_key"),
                        relin_share=back(shares.relin_share, "eval_key"),
                        rotation_share=back(shares.rotation_share, "eval_key_map"))


def _round_one(ctx: ckks.CkksContext, parties: int = 3) -> tuple[
        ckks.KeySetup, list[ckks.PartyKeys], list[ckks.SetupShares]]:
    setup = ckks.KeySetup(ctx, relinearize=True, rotations=(1,))
    lead = setup.generate_keys(None)
    lead_shares = setup.generate_share(lead, 1, None)
    keys = [lead] + [setup.generate_keys(lead_shares) for _ in range(parties - 1)]
    return setup, keys, [lead_shares] + [setup.generate_share(k, 1, lead_shares)
                                         for k in keys[1:]]


def test_equal_keys_have_equal_digests_however_they_were_made() -> None:
    """Parties compare the server's keys with their own by digest: the sum of the shares
    as made (the lead's own view) and as parsed off the wire (everyone else's) must
    digest alike, though a parsed public key serializes longer; another key must not."""
    import openfhe

    ctx = shared_context("test")
    setup, _, shares = _round_one(ctx)
    made, parsed = setup.running_sum(1), setup.running_sum(1)
    for share in shares:
        made.add(share)
        parsed.add(_parsed(ctx, share))
    ours, theirs = made.result(), parsed.result()
    key, their_key = ours.joint.public_key, theirs.joint.public_key
    assert len(openfhe.Serialize(key, openfhe.BINARY)) != \
        len(openfhe.Serialize(their_key, openfhe.BINARY))  # why the digest parses first
    assert ckks.object_digest(key) == ckks.object_digest(their_key)
    assert ckks.object_digest(ours.relin_round1) == ckks.object_digest(theirs.relin_round1)
    assert ckks.object_digest(made.rotation_result()) == \
        ckks.object_digest(parsed.rotation_result())
    assert ckks.object_digest(shares[1].public_key) == \
        ckks.object_digest(_parsed(ctx, shares[1]).public_key)
    # A party checks a share's signature against the digest of what it parsed: taken of
    # the payload for evaluation keys (no serialization), it must be the maker's.
    received = _parsed(ctx, shares[1])
    assert ckks.object_digest(received.relin_share, parsed=True) == \
        ckks.object_digest(shares[1].relin_share)
    assert ckks.object_digest(received.rotation_share, parsed=True) == \
        ckks.object_digest(shares[1].rotation_share)
    assert ckks.object_digest(received.public_key, parsed=True) == \
        ckks.object_digest(shares[1].public_key)
    assert ckks.object_digest(key) != ckks.object_digest(shares[0].public_key)
    assert ckks.object_digest(ours.relin_round1) != ckks.object_digest(shares[0].relin_share)
    with pytest.raises(InputError, match="never serialized"):
        ckks.object_digest(ctx.raw.KeyGen().secretKey)


def test_a_party_refuses_joint_keys_other_than_its_own_aggregate() -> None:
    ctx = shared_context("test")
    setup, keys, shares = _round_one(ctx)
    honest = setup.running_sum(1)
    for share in shares:
        honest.add(share)
    server = honest.result()

    def check() -> ckks.KeyCheck:
        mine = ckks.KeyCheck(setup)
        for share in shares:
            mine.add(share)
        return mine

    other_setup, _, other_shares = _round_one(ctx)  # a key pair of the server's own
    fake = other_setup.running_sum(1)
    for share in other_shares:
        fake.add(share)
    forged = fake.result()
    with pytest.raises(ProtocolError, match="other tags"):
        check().check_round_one(forged)
    with pytest.raises(ProtocolError, match="joint public key the server sent differs"):
        check().check_round_one(dataclasses.replace(server, public_key=forged.public_key))
    with pytest.raises(ProtocolError, match="round-1 relinearization aggregate"):
        check().check_round_one(dataclasses.replace(server,
                                                    relin_round1=shares[1].relin_share))
    with pytest.raises(ProtocolError, match="sums no key shares under other tags"):
        check().check_round_one(dataclasses.replace(server, party_tags="fednorm"))

    mine = check()
    round_one = mine.check_round_one(server)
    round_two = setup.running_sum(2, round_one.joint)
    for party in keys:
        share = setup.generate_share(party, 2, round_one)
        round_two.add(share)
        mine.add(share)
    installed = ckks.KeyDigests.of(round_two.result(), honest.rotation_result())
    mine.check_final(installed)
    with pytest.raises(ProtocolError, match="relinearization key the server installed"):
        mine.check_final(ckks.KeyDigests(b"\0" * 32, installed.rotation_keys))
    with pytest.raises(ProtocolError, match="rotation keys the server installed differ"):
        mine.check_final(ckks.KeyDigests(installed.relin_key, None))
    with pytest.raises(ProtocolError, match="server's relin_key digest is malformed"):
        mine.check_final(ckks.KeyDigests("a digest", installed.rotation_keys))


def test_a_parsed_evaluation_key_serializes_to_the_payload_it_was_parsed_from() -> None:
    """Why a received evaluation-key share's digest is the SHA-256 of its payload
    (``serial.SERIALIZED_AS_PARSED``): parsed, it serializes to those very bytes.  (The
    server forwards the share with the body it came in: tests/test_shared_parses.py.)"""
    import openfhe

    ctx = shared_context("test")
    _, _, shares = _round_one(ctx)
    for share, kind in ((shares[1].relin_share, "eval_key"),
                        (shares[1].rotation_share, "eval_key_map")):
        framed = ctx.to_bytes(share)
        parsed = ctx.from_bytes(kind, framed)
        payload = openfhe.Serialize(parsed, openfhe.BINARY)
        assert ctx.to_bytes(parsed) == framed
        assert framed.endswith(payload)
        assert ckks.object_digest(parsed) == hashlib.sha256(payload).digest()


def test_the_parties_of_a_simulation_share_each_step_of_their_key_checks() -> None:
    """Every party adds every party's signed shares to check the joint keys; in one
    process the first to reach a step of an evaluation-key sum makes it and the others
    take it (the same object, made once), by the trail of signed digests that led there:
    a party sent other shares makes its own sums, and outside a simulation each party
    makes its own.  (The joint public key is each party's own: the wire's bytes depend on
    its form, tests/test_pinned_wire.py.)"""
    ctx = shared_context("test")
    setup, _, shares = _round_one(ctx)

    def checked(received: list[ckks.SetupShares]) -> ckks.JointRoundOne:
        check = ckks.KeyCheck(setup)
        for share in received:  # each with the digest its maker signed
            check.add(share, ckks.wire_digests(
                (share.public_key, share.relin_share, share.rotation_share)))
        return check.round_one.result()

    with ckks.in_process_run():
        first, second = checked(shares), checked(shares)
        other = setup.generate_share(setup.generate_keys(shares[0]), 1, shares[0])
        split = checked([shares[0], other, shares[2]])
    alone = checked(shares)
    assert first.relin_round1 is second.relin_round1
    assert split.relin_round1 is not first.relin_round1
    assert ckks.object_digest(split.relin_round1) != ckks.object_digest(first.relin_round1)
    assert alone.relin_round1 is not first.relin_round1
    assert ckks.object_digest(alone.relin_round1) == ckks.object_digest(first.relin_round1)
