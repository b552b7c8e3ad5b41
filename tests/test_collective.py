"""The collective sub-protocols' messages: each carries the typed shares of the engine's
operations (what they are shares of) and refuses a share the setup needs but lacks."""

from __future__ import annotations

import pytest

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.protocols.collective import (
    BootShare,
    DecryptShare,
    JointRound1,
    KeyShares,
    LeadKeys,
    RelinRound2,
    shared_context,
)


def test_setup_messages_carry_the_shares_of_every_key_operation() -> None:
    ctx = shared_context("test")
    setup = ckks.KeySetup(ctx, relinearize=True, rotations=(1,))
    lead = setup.generate_keys(None)
    shares = setup.generate_shares(lead, None)
    message = LeadKeys.of(shares)
    assert list(message.fields()) == ["public_key", "relin_share", "rotation_share"]
    back = message.shares(setup)
    assert back.public_key.key is shares.public_key.key
    assert (back.relin.round, back.relin.key) == (1, shares.relin.key)
    assert (back.rotation.indices, back.rotation.keys) == ((1,), shares.rotation.keys)
    other = setup.generate_keys(back)
    assert isinstance(KeyShares.of(setup.generate_shares(other, back)), KeyShares)
    without_relin = KeyShares(public_key=message.public_key, relin_share=None,
                              rotation_share=message.rotation_share)
    with pytest.raises(ProtocolError, match="relin-key share is missing"):
        without_relin.shares(setup)
    plain = ckks.KeySetup(ctx, relinearize=False)
    assert (message.shares(plain).relin, message.shares(plain).rotation) == (None, None)

    total = setup.round_one_sum()
    for shares_of_party in (back, setup.generate_shares(other, back)):
        total.add(shares_of_party)
    round_one = total.result()
    received = JointRound1.of(round_one).round_one()
    assert received.joint == round_one.joint and received.relin is round_one.relin
    round_two = setup.generate_round_two_share(other, received)
    assert RelinRound2(share=round_two.key).as_share() == round_two


def test_share_replies_say_which_operation_they_answer() -> None:
    ctx = shared_context("test")
    parties, joint = ckks.setup_locally(ctx, 2)
    ct = ctx.encrypt(joint.public_key, [1.0, 2.0])
    share = ckks.Decryption(ctx).generate_share(parties[0], ct)
    reply = DecryptShare.of(share)
    assert reply.as_share(ckks.Decryption(ctx)) == share
    assert reply.as_share(ckks.SumDecryption(ctx)).flooded  # the request it answers tells
    boot = ckks.Bootstrap(ctx)
    rnd = boot.prepare(joint, ct, 0)
    boot_share = boot.generate_share(parties[0], joint.public_key, rnd.c1, 0)
    assert BootShare.of(boot_share).as_share(0) == boot_share


def test_the_server_adds_each_party_s_key_shares_before_reading_the_next() -> None:
    """What the server holds during key setup: one party's shares (31 MB at ring 2^15)
    and the running sums, never all P parties' — each share is added before the next
    party's message is read; the lead's shares are added (and so checked) before they
    are forwarded to the other parties."""
    import numpy as np

    from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
    from fednorm.protocols import FitOptions
    from fednorm.sim.federation import simulate

    class Order(Tracer):
        def __init__(self) -> None:
            self.events: list[str] = []

        def frame(self, event: FrameEvent) -> None:
            if event.direction == "received" and event.kind in ("ckks.key_shares",
                                                                "ckks.relin_round2"):
                self.events.append("read")
            if event.direction == "sent" and event.kind == "ckks.lead_keys":
                self.events.append("forward")

        def crypto_call(self, event: CryptoEvent) -> None:
            if event.call in ("RoundOneSum.add", "RelinSum.add"):
                self.events.append("add")

    seen = Order()
    parts = [np.random.default_rng(p).normal(size=(5, 2)) for p in range(4)]
    simulate(parts, "zscore", "mhe", FitOptions(preset="test"), tracer=seen)
    # round one: the lead's shares added, then forwarded to parties 2..4, then theirs;
    # round two: all 4
    assert seen.events == ["add"] + ["forward"] * 3 + ["read", "add"] * 3 + ["read", "add"] * 4
