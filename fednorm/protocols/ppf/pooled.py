"""Pooled sums, the default PPF protocols' one way to learn anything: each party uploads a
vector as a signed sum upload, the server adds the P uploads, and the parties decrypt the
sum collectively, each recomputing it from the relayed uploads and flooding its share
(:mod:`fednorm.protocols.collective.sums`).  What the server learns is the sum of the
parties' vectors and nothing else; a party checks that it decrypts exactly that.
"""

from __future__ import annotations

import math

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import PartyCrypto, ServerCrypto
from fednorm.protocols.collective.sums import SumUpload
from fednorm.protocols.ledger import Allowance

POOLED_SUM = Allowance(sums=1)
"""One flooded decryption of one pooled sum."""

PLAINTEXT = {"ppf.sum_upload": ("width",)}
"""The ledger's entry: each upload says how many values it carries."""


@message("ppf.sum_upload")
class EncryptedSum(Message):
    """A party's vector, encrypted under the joint key and signed, for one pooled sum."""

    values: SumUpload
    width: int


async def pooled_sum(crypto: ServerCrypto, width: int | None = None) -> np.ndarray:
    """Server: every party's vector added up and decrypted collectively (flooded).

    ``width`` None: the first party's, which every other party must match.
    """
    replies = await crypto.rc.gather(EncryptedSum)
    width = width if width is not None else replies[crypto.rc.parties[0]].width
    for party, reply in replies.items():
        if reply.width != width:
            raise ProtocolError(f"party {party} sent {reply.width} values, expected {width}")
    total = await crypto.add_all({p: r.values for p, r in replies.items()})
    return await crypto.decrypt_sum(total, width)


async def send_sum(crypto: PartyCrypto, values: np.ndarray) -> None:
    """Party: this party's ``values`` to the server, as its next signed sum upload."""
    upload = await crypto.encrypt_for_sum(np.asarray(values, dtype=np.float64))
    await crypto.rc.send(SERVER, EncryptedSum(values=upload, width=len(values)))


def noise_bound(context: ckks.CkksContext, parties: int, options: FitOptions) -> float:
    """What flooding may add to each value of a decrypted pooled sum, in its units: 8σ of
    the P shares' noise per slot (a sum upload is encoded at scale Δ²)."""
    flooding = ckks.Flooding(context.preset.ring_dim, parties, parties,
                             options.flooding_bits, options.flooding_decryptions)
    scale = 2.0 ** (2 * context.preset.scaling_mod_bits)
    return ckks.flooding.TAIL * math.sqrt(parties) * flooding.slot_sigma(scale)
