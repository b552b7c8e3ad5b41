"""Collective bootstrapping over the network: the server's round, a party's answer.

The common random element is never sent: both sides derive the ``index``-th of the
joint key (:meth:`~fednorm.engine.ckks.Bootstrap.common_element`), and both count the
bootstraps run under these keys, so a party refuses an index it did not expect, and
a ``c1`` it made a share of before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.protocols.collective.messages import BootRequest, BootShare
from fednorm.protocols.collective.rounds import request_shares, send_share

if TYPE_CHECKING:
    from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto

BOOTSTRAP = "bootstrap"  # the sub-protocol


async def bootstrap(crypto: ServerCrypto, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """Server: the next bootstrap under the joint key; same values, full level budget."""
    crypto.bootstraps += 1
    index, crypto.boot_index = crypto.boot_index, crypto.boot_index + 1
    operation = ckks.Bootstrap(crypto.ckks)
    rnd = await crypto.rc.run_sync(operation.prepare, crypto.joint, ct, index)
    replies = await request_shares(crypto.rc, BOOTSTRAP, BootRequest(c1=rnd.c1, index=index),
                                   BootShare)
    shares = [reply.as_share(index) for reply in replies]
    aggregate = await crypto.rc.run_sync(operation.aggregate_shares, crypto.joint, rnd, shares)
    return await crypto.rc.run_sync(operation.finalize, crypto.joint, rnd, aggregate)


async def answer_bootstrap(crypto: PartyCrypto, request: BootRequest) -> None:
    """Party: a bootstrap share, on the common element this party derives itself, of a
    ``c1`` it never made a share of."""
    if request.index != crypto.boot_index:
        raise ProtocolError(f"bootstrap request for common element #{request.index}, "
                            f"expected #{crypto.boot_index} (reused or skipped)")
    crypto.boot_index += 1
    await crypto.claim_share("bootstrap request", request.c1)
    share = await crypto.rc.run_sync(ckks.Bootstrap(crypto.ckks).generate_share, crypto.keys,
                                     crypto.public_key, request.c1, request.index)
    await send_share(crypto.rc, BOOTSTRAP, BootShare.of(share))
