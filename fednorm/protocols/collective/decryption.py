"""Collective decryption over the network: the server's round, a party's answer.

Two kinds share one flow: a plain decryption (:class:`~fednorm.engine.ckks.Decryption`,
sub-protocol ``decrypt``) and a flooded decryption of a sum of uploads
(:class:`~fednorm.engine.ckks.SumDecryption`, sub-protocol ``decrypt_sum``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.protocols.collective import sums
from fednorm.protocols.collective.messages import (
    DecryptRequest,
    DecryptShare,
    SumDecryptRequest,
)
from fednorm.protocols.collective.rounds import request_shares, send_share
from fednorm.protocols.collective.signatures import keyring_of
from fednorm.protocols.collective.sums import PooledSum

if TYPE_CHECKING:
    from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto

DECRYPT, DECRYPT_SUM = "decrypt", "decrypt_sum"  # the sub-protocols


async def decrypt(crypto: ServerCrypto, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Server: the plain decryption of ``ct``, first ``n`` slots."""
    decryption = ckks.Decryption(crypto.ckks)
    prepared = await crypto.rc.run_sync(decryption.prepare, ct)
    return await _decryption_round(crypto, decryption, DECRYPT,
                                   DecryptRequest(ciphertext=prepared), prepared, n)


async def decrypt_sum(crypto: ServerCrypto, pooled: PooledSum, n: int) -> np.ndarray:
    """Server: the flooded decryption of a sum of signed sum uploads, first ``n`` slots;
    the request relays the uploads, from which each party recomputes the sum."""
    request = SumDecryptRequest(index=pooled.index, uploads=list(pooled.uploads))
    return await _decryption_round(crypto, ckks.SumDecryption(crypto.ckks), DECRYPT_SUM,
                                   request, pooled.total, n)


async def _decryption_round(crypto: ServerCrypto, decryption: ckks.Decryption, name: str,
                            request: DecryptRequest | SumDecryptRequest,
                            prepared: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Ask every party for a share of ``prepared``, aggregate and finalize."""
    crypto.decryptions += 1
    replies = await request_shares(crypto.rc, name, request, DecryptShare)
    shares = [reply.as_share(decryption) for reply in replies]
    plaintext = await crypto.rc.run_sync(decryption.aggregate_shares, crypto.joint, prepared,
                                         shares)
    return await crypto.rc.run_sync(decryption.finalize, plaintext, n)


async def answer_decryption(crypto: PartyCrypto, request: DecryptRequest) -> None:
    """Party: a decryption share of the requested ciphertext."""
    await _answer(crypto, ckks.Decryption(crypto.ckks), DECRYPT, request.ciphertext)


async def answer_sum_decryption(crypto: PartyCrypto, request: SumDecryptRequest) -> None:
    """Party: a flooded decryption share (this party's s and τ) of the sum it recomputes
    from the relayed uploads, each checked (:func:`.sums.verified_total`); one decryption
    per set of uploads."""
    index = request.index
    if not isinstance(index, int) or not 0 <= index < len(crypto.own_sums):
        raise ProtocolError(f"a sum decryption request names sum upload #{index!r}, which "
                            "this party never sent")
    if index in crypto.decrypted_sums:
        raise ProtocolError(f"a sum decryption request asks again for sum uploads #{index}, "
                            "already decrypted")
    uploads = request.uploads if isinstance(request.uploads, list) else []
    total = await crypto.rc.run_sync(
        sums.verified_total, crypto.ckks, keyring_of(crypto.rc), crypto.rc.session,
        range(1, crypto.n_parties + 1), index, uploads, crypto.own_sums[index])
    crypto.count_flooded_share()
    crypto.decrypted_sums.add(index)
    await _answer(crypto, ckks.SumDecryption(crypto.ckks, crypto.flooding()), DECRYPT_SUM,
                  total)


async def _answer(crypto: PartyCrypto, decryption: ckks.Decryption, name: str,
                  ct: openfhe.Ciphertext) -> None:
    share = await crypto.rc.run_sync(decryption.generate_share, crypto.keys, ct)
    await send_share(crypto.rc, name, DecryptShare.of(share))
