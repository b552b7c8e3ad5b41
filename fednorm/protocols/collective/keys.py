"""Collective key setup over the network: :class:`~fednorm.engine.ckks.KeySetup` in three
rounds.

1. the lead party (party 1) generates its keys and its shares of every key operation
   (:class:`LeadKeys`); the server forwards them to the other parties;
2. every other party generates its keys and shares on the lead's (:class:`KeyShares`);
   the server aggregates the joint public key and the round-1 relinearization key and
   sends both to all parties (:class:`JointRound1`), then finalizes the rotation keys;
3. every party sends its round-2 relinearization share (:class:`RelinRound2`); the
   server aggregates and finalizes the relinearization key (:class:`SetupDone`).

The server adds each party's shares to running sums as it reads them, and lets them go
before reading the next party's: it holds one party's shares at a time, not P.

Without relinearization (a protocol that never multiplies two ciphertexts) the third
round and its 25 MB-per-party shares are skipped.  Secret keys never leave
:class:`~fednorm.engine.ckks.PartyKeys`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Protocol, TypeVar

from fednorm.engine import ckks
from fednorm.engine.messages import Message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.collective.messages import (
    JointRound1,
    KeyShares,
    LeadKeys,
    RelinRound2,
    SetupDone,
)
from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto, shared_context

LEAD = 1


class FloodingOptions(Protocol):
    """What key setup reads of a fit's options: s and τ of the flooded decryptions."""

    flooding_bits: int
    flooding_decryptions: int

M = TypeVar("M", bound=Message)
S = TypeVar("S")


async def setup_server(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = ()
) -> ServerCrypto:
    """Server side of collective key generation (see the module doc).

    If ``rc.crypto`` already holds keys of this federation that cover the request (an
    earlier protocol of the same session, see :func:`reusable`), they are reused and
    nothing is sent.
    """
    held = reusable(rc, ServerCrypto, preset, relinearize, rotations)
    if held is not None:
        rc.crypto = replace(held, rc=rc, bootstraps=0, decryptions=0)
        return rc.crypto
    context = shared_context(preset)
    setup = ckks.KeySetup(context, relinearize=relinearize, rotations=rotations)
    with rc.subprotocol("setup"):
        round_one = await _round_one(rc, setup)
        joint = round_one.joint
        relin_sum = setup.round_two_sum(joint)
        if relin_sum is not None:
            await _add_from(rc, rc.parties, RelinRound2, RelinRound2.as_share,
                            partial(relin_sum.add, tag=joint.tag))
            await rc.run_sync(setup.install_relin, joint, relin_sum)
        await rc.broadcast(SetupDone())
    rc.crypto = ServerCrypto(rc, context, joint, relinearized=relinearize,
                             rotations=tuple(rotations))
    return rc.crypto


async def _round_one(rc: RoleContext, setup: ckks.KeySetup) -> ckks.JointRoundOne:
    """Server: the lead's keys checked and forwarded to the others, every party's shares
    added up as they arrive, the joint keys of round one broadcast, rotation keys
    finalized."""
    lead = await rc.receive(LEAD, LeadKeys)
    total = setup.round_one_sum()
    await rc.run_sync(total.add, lead.shares(setup))
    await rc.forward(lead, rc.parties[1:])
    del lead  # added and forwarded: not held through the round
    await _add_from(rc, rc.parties[1:], KeyShares, partial(KeyShares.shares, setup=setup),
                    total.add)
    round_one = await rc.run_sync(total.result)
    await rc.broadcast(JointRound1.of(round_one))
    await rc.run_sync(total.finalize_rotations, round_one.joint)
    return round_one


def flooding_arguments(options: FloodingOptions) -> dict[str, int]:
    """The flooding choices of a fit's options (s and τ), as :func:`setup_party` takes
    them."""
    return {"flooding_bits": options.flooding_bits,
            "flooding_decryptions": options.flooding_decryptions}


async def setup_party(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = (),
    flooding_bits: int = ckks.flooding.DEFAULT_SECURITY_BITS,
    flooding_decryptions: int = ckks.flooding.DEFAULT_DECRYPTIONS,
) -> PartyCrypto:
    """Party side of collective key generation; the secret key stays in ``PartyKeys``.

    Reuses the keys in ``rc.crypto`` under the same rule as :func:`setup_server`.
    ``flooding_bits`` is s of the flooded (sum) decryptions this party answers and
    ``flooding_decryptions`` τ, how many the new keys serve; reused keys keep the τ (and
    the count) they were made with.
    """
    ckks.check_security_bits(flooding_bits)
    ckks.check_decryptions(flooding_decryptions)
    held = reusable(rc, PartyCrypto, preset, relinearize, rotations)
    if held is not None:
        rc.crypto = replace(held, rc=rc, flooding_bits=flooding_bits)
        return rc.crypto
    context = shared_context(preset)
    setup = ckks.KeySetup(context, relinearize=relinearize, rotations=rotations)
    with rc.subprotocol("setup"):
        lead = None if rc.me == LEAD else (await rc.receive(SERVER, LeadKeys)).shares(setup)
        keys = await rc.run_sync(setup.generate_keys, lead)
        await _send_shares(rc, setup, keys, lead)
        round_one = (await rc.receive(SERVER, JointRound1)).round_one()
        if setup.relin:
            await _send_round_two_share(rc, setup, keys, round_one)
        await rc.receive(SERVER, SetupDone)
    joint = round_one.joint
    rc.crypto = PartyCrypto(rc, context, keys, joint.public_key, relinearized=relinearize,
                            rotations=tuple(rotations), n_parties=joint.n_parties,
                            flooding_bits=flooding_bits,
                            flooding_decryptions=flooding_decryptions)
    return rc.crypto


async def _send_shares(rc: RoleContext, setup: ckks.KeySetup, keys: ckks.PartyKeys,
                       lead: object) -> None:
    """Party: its shares of every key operation to the server (kept no longer: at
    ring 2^15 they are ~31 MB a party, and a simulation holds P parties)."""
    mine = await rc.run_sync(setup.generate_shares, keys, lead)
    await rc.send(SERVER, (KeyShares if lead else LeadKeys).of(mine))


async def _send_round_two_share(rc: RoleContext, setup: ckks.KeySetup, keys: ckks.PartyKeys,
                                round_one: ckks.JointRoundOne) -> None:
    """Party: its round-two relinearization share (25 MB at ring 2^15), not kept either."""
    share = await rc.run_sync(setup.generate_round_two_share, keys, round_one)
    await rc.send(SERVER, RelinRound2(share=share.key))


C = TypeVar("C", ServerCrypto, PartyCrypto)


def reusable(rc: RoleContext, kind: type[C], preset: str, relinearize: bool,
             rotations: Sequence[int]) -> C | None:
    """The keys ``rc.crypto`` holds, if they are ``kind`` for ``preset`` and cover the
    relinearization key and rotations asked for; else None (run the setup).

    Collective key generation is the most expensive step of a short protocol (37% of
    PPF z-score at P=10), and the joint keys do not depend on the data: a federation
    that runs several protocols in one session (:func:`fednorm.sim.federation.
    simulate_session`) generates them once.  Server and parties decide alike, since they
    ran the same earlier protocols.
    """
    held = rc.crypto
    if not isinstance(held, kind) or held.ckks.preset.name != preset:
        return None
    if relinearize and not held.relinearized:
        return None
    return held if set(rotations) <= set(held.rotations) else None


async def _add_from(rc: RoleContext, parties: Sequence[int], expected: type[M],
                    share_of: Callable[[M], S], add: Callable[[S], None]) -> None:
    """One message from each of ``parties``, in order (a round among them), its share
    added to a running sum (in a worker thread) and let go before the next is read."""
    rc.stats.rounds += 1
    for party in parties:
        await rc.run_sync(add, share_of(await rc.receive(party, expected)))
