"""Collective bootstrapping over the network: the server's round, a party's answer.

The common random element is never sent: both sides derive the ``index``-th of the
joint key (:meth:`~fednorm.engine.ckks.Bootstrap.common_element`), and both count the
bootstraps run under these keys, so a party refuses an index it did not expect, and
a ``c1`` it made a share of before.

Where the parties recompute the server's computation (the paper's z-score,
:class:`~fednorm.protocols.ppf.driver.Replay`), the server also forwards every party's
share, signed by its maker, to every party: each checks the signatures and aggregates
them itself, so the refreshed ciphertext it goes on from is the one the shares make, not
one the server chose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.runtime import SERVER
from fednorm.protocols.collective.messages import BootRequest
from fednorm.protocols.collective.rounds import request_shares
from fednorm.protocols.collective.signatures import signed, verified

if TYPE_CHECKING:
    from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto

BOOTSTRAP = "bootstrap"  # the sub-protocol


async def bootstrap(crypto: ServerCrypto, ct: openfhe.Ciphertext, forward: bool = False
                    ) -> openfhe.Ciphertext:
    """Server: the next bootstrap under the joint key; same values, full level budget;
    ``forward``: every party's signed share to every party, once all have arrived."""
    crypto.bootstraps += 1
    index = crypto.held.boot_index  # the next common element of these keys
    crypto.held.boot_index += 1
    operation = ckks.Bootstrap(crypto.ckks)
    rnd = await crypto.rc.run_sync(operation.prepare, crypto.joint, ct, index)
    replies = await request_shares(crypto.rc, BOOTSTRAP, BootRequest(c1=rnd.c1, index=index),
                                   ckks.BootstrapShare)
    if forward:
        with crypto.rc.subprotocol(BOOTSTRAP):
            for reply in replies:
                await crypto.rc.broadcast(reply)
    aggregate = await crypto.rc.run_sync(operation.aggregate_shares, crypto.joint, rnd,
                                         replies)
    return await crypto.rc.run_sync(operation.finalize, crypto.joint, rnd, aggregate)


async def answer_bootstrap(crypto: PartyCrypto, request: BootRequest, forwarded: bool = False
                           ) -> list[ckks.BootstrapShare]:
    """Party: a bootstrap share, signed, on the common element this party derives itself,
    of a ``c1`` it never made a share of; ``forwarded``: then every party's share, each
    checked to be signed by its party for this bootstrap (this party's own the one it
    sent), returned in party order to aggregate."""
    if request.index != crypto.held.boot_index:
        raise ProtocolError(f"bootstrap request for common element #{request.index}, "
                            f"expected #{crypto.held.boot_index} (reused or skipped)")
    crypto.held.boot_index += 1
    await crypto.claim_share("bootstrap request", request.c1)
    share = await crypto.rc.run_sync(ckks.Bootstrap(crypto.ckks).generate_share, crypto.keys,
                                     crypto.public_key, request.c1, request.index)
    with crypto.rc.subprotocol(BOOTSTRAP):  # what the signature names
        mine = await signed(crypto.rc, share)
        await crypto.rc.send(SERVER, mine)
        return await _forwarded_shares(crypto, mine) if forwarded else []


async def _forwarded_shares(crypto: PartyCrypto, mine: ckks.BootstrapShare
                            ) -> list[ckks.BootstrapShare]:
    rc, shares = crypto.rc, []
    for party in range(1, crypto.n_parties + 1):
        forwarded = await verified(rc, party, await rc.receive(SERVER, ckks.BootstrapShare))
        if forwarded.index != mine.index:
            raise ProtocolError(f"the server forwarded party {party}'s share of bootstrap "
                                f"#{forwarded.index}, not of #{mine.index}")
        if party == rc.me and forwarded.signature != mine.signature:
            raise ProtocolError("the server forwarded, as this party's bootstrap "
                                "share, one it did not send")
        shares.append(forwarded)
    return shares
