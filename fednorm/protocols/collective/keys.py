"""Collective key setup over the network: :class:`~fednorm.engine.ckks.KeySetup` in three
rounds, every share signed by the party that made it and checked by every other party.

1. the lead party (party 1) generates its keys and its shares of every key operation
   (:class:`~fednorm.engine.ckks.LeadKeys`); the server forwards them to the other
   parties;
2. every other party generates its keys and shares on the lead's
   (:class:`~fednorm.engine.ckks.KeyShares`); the server forwards each party's to every
   other party, aggregates the joint public key and the round-1 relinearization key and
   sends both to all parties (:class:`~fednorm.engine.ckks.JointRoundOne`), then
   finalizes the rotation keys;
3. every party sends its round-2 relinearization share
   (:class:`~fednorm.engine.ckks.RelinRound2`), which the server forwards too; it
   aggregates and finalizes the relinearization key and tells the parties digests of
   the evaluation keys it installed (:class:`~fednorm.engine.ckks.KeyDigests`).

Every party checks the signature of every share it is forwarded (:mod:`.signatures`),
adds the shares up itself (:class:`~fednorm.engine.ckks.KeyCheck`, the server's running
sums) and stops with a :class:`ProtocolError` unless the server's joint public key,
round-1 aggregate and installed evaluation keys are its own aggregates; it encrypts
under its own.  A server that deviates cannot make it use a key whose secret it knows.

The server reads the parties in order, forwarding each party's shares before reading the
next, so it parses and holds one party's shares at a time, not P.  A party sends its
shares as soon as it has made them and reads what the server forwards while they go
(:func:`_sending`): it never waits on a link its peer is busy sending on (over TCP, both
would block), and the parties' shares queue in their links (a simulation's in-memory
links hold every unread frame) instead of each party waiting for the one before.

Without relinearization (a protocol that never multiplies two ciphertexts) the third
round and its 25 MB-per-party shares are skipped.  Secret keys never leave
:class:`~fednorm.engine.ckks.PartyKeys`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, TypeVar

import openfhe

from fednorm.engine import ckks
from fednorm.engine.messages import Message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.collective.bootstrap import BOOTSTRAP
from fednorm.protocols.collective.decryption import DECRYPT, DECRYPT_PRODUCT, DECRYPT_SUM
from fednorm.protocols.collective.roles import (
    PartyCrypto,
    PartyKeyState,
    ServerCrypto,
    shared_context,
)
from fednorm.protocols.collective.signatures import (
    keyring_of,
    signed_with_digest,
    verified_digest,
)

LEAD = 1
SETUP = "setup"
COLLECTIVE_REQUESTS = (DECRYPT, DECRYPT_SUM, DECRYPT_PRODUCT, BOOTSTRAP)


class FloodingOptions(Protocol):
    """What key setup reads of a fit's options: s and τ of the flooded decryptions, and
    whether to flood at all."""

    flooding_bits: int
    flooding_decryptions: int
    flood: bool

M = TypeVar("M", bound=Message)


async def setup_server(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = ()
) -> ServerCrypto:
    """Server side of collective key generation (see the module doc).

    If ``rc.held_keys`` already holds keys of this federation that cover the request
    (an earlier protocol of the same session, see :func:`reusable`), they are reused and
    nothing is sent.
    """
    held = reusable(rc, ckks.HeldKeys, preset, relinearize, rotations)
    if held is not None:
        return ServerCrypto(rc, held)
    context = shared_context(preset)
    setup = ckks.KeySetup(context, relinearize=relinearize, rotations=rotations)
    with rc.subprotocol(SETUP):
        round_one, rotation_keys = await _round_one(rc, setup)
        joint = round_one.joint
        round_two = setup.running_sum(2, joint)
        relin_key = None
        if setup.relin is not None:
            rc.stats.rounds += 1
            await _relay(rc, rc.parties, ckks.RelinRound2, round_two.add)
            relin_key = await rc.run_sync(round_two.finalize)
        await rc.broadcast(await rc.run_sync(ckks.KeyDigests.of, relin_key, rotation_keys))
    rc.held_keys = ckks.HeldKeys(context, joint, relinearized=relinearize,
                                 rotations=tuple(rotations))
    return ServerCrypto(rc, rc.held_keys)


async def _round_one(rc: RoleContext, setup: ckks.KeySetup
                     ) -> tuple[ckks.JointRoundOne, openfhe.EvalKeyMap | None]:
    """Server: every party's shares (the lead's first) added up and forwarded as they
    arrive, the joint keys of round one broadcast, the rotation keys finalized (and
    returned)."""
    total = setup.running_sum(1)
    rc.stats.rounds += 1
    await _relay(rc, [LEAD], ckks.LeadKeys, total.add)
    await _relay(rc, rc.parties[1:], ckks.KeyShares, total.add)
    round_one = await rc.run_sync(total.result)
    await rc.broadcast(round_one)
    return round_one, await rc.run_sync(total.finalize, round_one.joint)


def flooding_arguments(options: FloodingOptions) -> dict[str, int | bool]:
    """The flooding choices of a fit's options (s, τ, and whether to flood at all), as
    :func:`setup_party` takes them."""
    return {"flooding_bits": options.flooding_bits,
            "flooding_decryptions": options.flooding_decryptions,
            "flood": options.flood}


async def setup_party(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = (),
    flooding_bits: int = ckks.flooding.DEFAULT_SECURITY_BITS,
    flooding_decryptions: int = ckks.flooding.DEFAULT_DECRYPTIONS, flood: bool = True,
) -> PartyCrypto:
    """Party side of collective key generation; the secret key stays in ``PartyKeys``.

    Reuses the keys in ``rc.held_keys`` under the same rule as :func:`setup_server`.
    ``flooding_bits`` is s of the flooded (sum) decryptions this party answers and
    ``flooding_decryptions`` τ, how many the new keys serve; reused keys keep the τ (and
    the count) they were made with.  ``flood`` False leaves the noise out of every share
    (``FitOptions.flood``: only to measure what flooding costs).
    """
    ckks.check_security_bits(flooding_bits)
    ckks.check_decryptions(flooding_decryptions)
    # Key setup forwards each party's shares to the others (a different view each);
    # requests relay what a party checks itself.  Every other message is a broadcast.
    rc.leave_out_of_transcript(SETUP, *COLLECTIVE_REQUESTS)
    held = reusable(rc, PartyKeyState, preset, relinearize, rotations)
    if held is not None:
        held.flooding_bits, held.flooding_enabled = flooding_bits, flood
        return PartyCrypto(rc, held)
    keyring_of(rc)  # without one nothing could be checked: stop before any work
    context = shared_context(preset)
    setup = ckks.KeySetup(context, relinearize=relinearize, rotations=rotations)
    check = ckks.KeyCheck(setup)
    with rc.subprotocol(SETUP):
        keys, announced = await _party_round_one(rc, setup, check)
        round_one = await rc.run_sync(check.check_round_one, announced)
        if setup.relin:
            await _party_round_two(rc, setup, keys, round_one, check)
        done = await rc.receive(SERVER, ckks.KeyDigests)
        await rc.run_sync(check.check_final, done)
    await rc.run_sync(check.install)
    joint = round_one.joint  # this party's own aggregate, equal to the server's
    rc.held_keys = PartyKeyState(ckks=context, joint=joint, relinearized=relinearize,
                                 rotations=tuple(rotations), keys=keys,
                                 n_parties=joint.n_parties, flooding_bits=flooding_bits,
                                 flooding_decryptions=flooding_decryptions,
                                 flooding_enabled=flood)
    return PartyCrypto(rc, rc.held_keys)


async def _party_round_one(rc: RoleContext, setup: ckks.KeySetup, check: ckks.KeyCheck
                           ) -> tuple[ckks.PartyKeys, ckks.JointRoundOne]:
    """Party: every party's round-one shares added up in party order, its own among
    them, every other one signature-checked first; its own sent at once (:func:`_sending`).
    Returns its keys and the server's round one, which ends the forwarded shares."""
    lead, lead_digest = None, b""
    if rc.me != LEAD:
        lead = await rc.receive(SERVER, ckks.LeadKeys)
        lead_digest = await verified_digest(rc, LEAD, lead)
    keys = await rc.run_sync(setup.generate_keys, lead)
    mine = await rc.run_sync(setup.generate_share, keys, 1, lead)
    mine, digest = await signed_with_digest(rc, mine)
    async with _sending(rc, mine):
        if lead is not None:
            await rc.run_sync(check.add, lead, lead_digest)
        for party in range(LEAD + 1, rc.me):
            await _add_round_one(rc, party, await rc.receive(SERVER, ckks.KeyShares), check)
    await rc.run_sync(check.add, mine, digest)
    del mine  # ~31 MB a party at ring 2^15, and a simulation holds P parties
    party = rc.me
    while not isinstance(msg := await rc.receive(SERVER, (ckks.KeyShares,
                                                           ckks.JointRoundOne)),
                         ckks.JointRoundOne):
        party += 1
        await _add_round_one(rc, party, msg, check)
    return keys, msg


async def _add_round_one(rc: RoleContext, party: int, msg: ckks.KeyShares,
                         check: ckks.KeyCheck) -> None:
    digest = await verified_digest(rc, party, msg)
    await rc.run_sync(check.add, msg, digest)


async def _party_round_two(rc: RoleContext, setup: ckks.KeySetup, keys: ckks.PartyKeys,
                           round_one: ckks.JointRoundOne, check: ckks.KeyCheck) -> None:
    """Party: its round-two relinearization share, made on its own round-one aggregate
    and sent at once (:func:`_sending`); every party's added up in party order, every
    other one signature-checked first."""
    share = await rc.run_sync(setup.generate_share, keys, 2, round_one)
    share, digest = await signed_with_digest(rc, share)
    async with _sending(rc, share):
        for party in range(LEAD, rc.me):
            await _add_round_two(rc, party, check)
    await rc.run_sync(check.add, share, digest)
    for party in range(rc.me + 1, round_one.joint.n_parties + 1):
        await _add_round_two(rc, party, check)


async def _add_round_two(rc: RoleContext, party: int, check: ckks.KeyCheck) -> None:
    other = await rc.receive(SERVER, ckks.RelinRound2)
    await rc.run_sync(check.add, other, await verified_digest(rc, party, other))


def _sending(rc: RoleContext, share: Message) -> AbstractAsyncContextManager[None]:
    """``share`` sent to the server while the block reads the earlier parties' shares,
    which the server forwards before it reads this one (:meth:`~fednorm.engine.runtime.
    RoleContext.sending`); over a link that moves in rounds (a Flower node) sent before
    the block, since reading an empty inbox there ends the party's turn."""
    if rc.moves_in_rounds(SERVER):
        return _sent_first(rc, share)
    return rc.sending(SERVER, share)


@asynccontextmanager
async def _sent_first(rc: RoleContext, share: Message) -> AsyncIterator[None]:
    await rc.send(SERVER, share)
    yield


H = TypeVar("H", bound=ckks.HeldKeys)


def reusable(rc: RoleContext, kind: type[H], preset: str, relinearize: bool,
             rotations: Sequence[int]) -> H | None:
    """The keys ``rc.held_keys`` holds, if they are exactly ``kind`` (the server's
    :class:`~fednorm.engine.ckks.HeldKeys`, a party's :class:`PartyKeyState`) and cover
    ``preset``, the relinearization key and the rotations asked for; else None (run the
    setup).

    Collective key generation is the most expensive step of a short protocol (37% of
    PPF z-score at P=10), and the joint keys do not depend on the data: a federation
    that runs several protocols in one session (:func:`fednorm.sim.federation.
    simulate_session`) generates them once.  Server and parties decide alike, since they
    ran the same earlier protocols.
    """
    held = rc.held_keys
    if type(held) is not kind or not held.covers(preset, relinearize, rotations):
        return None
    return held


async def _relay(rc: RoleContext, parties: Sequence[int], expected: type[M],
                 add: Callable[[M], None]) -> None:
    """Server: one share message from each of ``parties``, in order, added to a running
    sum (in a worker thread) as it arrived and forwarded to every other party, then let
    go before the next is read."""
    for party in parties:
        msg = await rc.receive(party, expected)
        await rc.run_sync(add, msg)
        await rc.forward(msg, [peer for peer in rc.parties if peer != party])
        del msg
