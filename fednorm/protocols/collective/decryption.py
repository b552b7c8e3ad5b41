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
from fednorm.protocols.collective.messages import (
    DecryptRequest,
    DecryptShare,
    SumDecryptRequest,
)
from fednorm.protocols.collective.rounds import request_shares, send_share

if TYPE_CHECKING:
    from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto

DECRYPT, DECRYPT_SUM = "decrypt", "decrypt_sum"  # the sub-protocols


async def decrypt(crypto: ServerCrypto, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Server: the plain decryption of ``ct``, first ``n`` slots."""
    return await _decryption_round(crypto, ckks.Decryption(crypto.ckks), DECRYPT,
                                   DecryptRequest, ct, n)


async def decrypt_sum(crypto: ServerCrypto, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Server: the flooded decryption of a sum of sum uploads, first ``n`` slots."""
    return await _decryption_round(crypto, ckks.SumDecryption(crypto.ckks), DECRYPT_SUM,
                                   SumDecryptRequest, ct, n)


async def _decryption_round(crypto: ServerCrypto, decryption: ckks.Decryption, name: str,
                            request: type[DecryptRequest | SumDecryptRequest],
                            ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Prepare ``ct``, ask every party for a share of it, aggregate and finalize."""
    crypto.decryptions += 1
    prepared = await crypto.rc.run_sync(decryption.prepare, ct)
    replies = await request_shares(crypto.rc, name, request(ciphertext=prepared), DecryptShare)
    shares = [reply.as_share(decryption) for reply in replies]
    plaintext = await crypto.rc.run_sync(decryption.aggregate_shares, crypto.joint, prepared,
                                         shares)
    return await crypto.rc.run_sync(decryption.finalize, plaintext, n)


async def answer_decryption(crypto: PartyCrypto, request: DecryptRequest) -> None:
    """Party: a decryption share of the requested ciphertext (never a second one)."""
    await _answer(crypto, ckks.Decryption(crypto.ckks), DECRYPT, request.ciphertext)


async def answer_sum_decryption(crypto: PartyCrypto, request: SumDecryptRequest) -> None:
    """Party: a flooded decryption share of the requested sum (this party's s)."""
    await _answer(crypto, ckks.SumDecryption(crypto.ckks, crypto.flooding()), DECRYPT_SUM,
                  request.ciphertext)


_REQUESTS = {DECRYPT: "decryption request", DECRYPT_SUM: "sum decryption request"}


async def _answer(crypto: PartyCrypto, decryption: ckks.Decryption, name: str,
                  ct: openfhe.Ciphertext) -> None:
    await crypto.claim_share(_REQUESTS[name], ct)
    share = await crypto.rc.run_sync(decryption.generate_share, crypto.keys, ct)
    await send_share(crypto.rc, name, DecryptShare.of(share))
