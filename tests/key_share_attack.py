"""The ``c1 = a + K`` bootstrap attack of a deviating server, and how it reads a party's
secret-key share from the share pair the party sends back (``h0 + h1 = K·s_i`` plus
small noise, ``a`` being the common random element every role derives)."""

from __future__ import annotations

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.ckks import BootstrapShare, ring
from fednorm.engine.errors import ProtocolError
from fednorm.protocols.collective import BootRequest
from fednorm.protocols.collective.rounds import request_shares

K = 2**40


class KeyShareRead(AssertionError):
    """The server read a party's secret-key share from its bootstrap share."""


def _towers(ctx: ckks.CkksContext, ct: openfhe.Ciphertext, count: int
            ) -> tuple[ring.Towers, bytes]:
    data = openfhe.Serialize(ct, openfhe.BINARY)
    return ring.locate_towers(data, ctx.preset.ring_dim, count, ctx.moduli[:count]), data


def crafted_c1(ctx: ckks.CkksContext, honest_c1: openfhe.Ciphertext,
               a: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """``a + K`` in the towers (and the shape) of an honest request's ``c1``: a constant
    is the same residue in every evaluation slot."""
    count = ctx.towers(honest_c1)
    layout, data = _towers(ctx, honest_c1, count)
    a_layout, a_data = _towers(ctx, a, ctx.preset.towers)
    out = bytearray(data)
    for i, q in enumerate(ctx.moduli[:count]):
        shifted = ring.add_mod(a_layout.read(a_data, i), np.full(ctx.preset.ring_dim,
                                                                 K % q, dtype=np.uint64), q)
        layout.write(out, i, shifted)
    return ckks.serial.deserialize(openfhe.DeserializeCiphertextString, bytes(out))


def read_secret(ctx: ckks.CkksContext, share: BootstrapShare, towers: int) -> np.ndarray | None:
    """round((h0 + h1) / K) in every tower c1 has, if it is one ternary polynomial with a
    residual far below K (what the attack gives); None otherwise."""
    h0, h0_data = _towers(ctx, share.h0, towers)
    h1_all = openfhe.Serialize(share.h1, openfhe.BINARY)
    h1 = ring.locate_towers(h1_all, ctx.preset.ring_dim, ctx.preset.towers, ctx.moduli)
    found = None
    for i, q in enumerate(ctx.moduli[:towers]):
        both = ring.add_mod(h0.read(h0_data, i), h1.read(h1_all, i), q)
        values = ring.centered(ring.ntt(q, ctx.preset.ring_dim).inverse(both), q)
        secret = np.rint(values / K).astype(np.int64)
        residual = values - secret * K
        if np.abs(secret).max() > 1 or np.abs(residual).max() > K // 2**8:
            return None
        if found is not None and not np.array_equal(found, secret):
            return None
        found = secret
    return found


async def attack(read: dict[int, np.ndarray], crypto, rc, base: openfhe.Ciphertext) -> None:
    """Send the crafted request built on ``base``'s shape; record what the shares give."""
    operation = ckks.Bootstrap(crypto.ckks)
    honest = await rc.run_sync(operation.prepare, crypto.joint, base, 0)
    c1 = crafted_c1(crypto.ckks, honest.c1, honest.a)
    shares = await request_shares(rc, "bootstrap", BootRequest(c1=c1, index=0), BootstrapShare)
    for party, share in zip(rc.parties, shares, strict=True):
        secret = read_secret(crypto.ckks, share, crypto.ckks.towers(c1))
        if secret is not None:
            read[party] = secret
    raise ProtocolError("the attacking server stops here")


