"""Run every collective operation of a federation inside one process.

For tests, benchmarks and single-process simulations: each helper plays all parties and
the server, calling exactly the share / aggregate / finalize functions a networked
protocol would call, just without messages in between.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import openfhe

from fednorm.engine.ckks import collective as col
from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys, PartyKeys
from fednorm.engine.errors import InputError

_BOOTSTRAP_INDEX = itertools.count()


def setup_locally(ctx: CkksContext, n_parties: int,
                  rotations: Sequence[int] = ()) -> tuple[list[PartyKeys], JointKeys]:
    """Make keys for ``n_parties``, the joint public and relinearization keys and joint
    rotation keys for ``rotations``; install the evaluation keys on ``ctx``."""
    if n_parties < 1:
        raise InputError("need at least one party")
    lead = PartyKeys.generate(ctx)
    parties = [lead] + [PartyKeys.generate(ctx, lead.public_key_share)
                        for _ in range(n_parties - 1)]
    joint = col.aggregate_public_key(ctx, [p.public_key_share for p in parties])
    lead_relin = lead.relin_share()
    round1 = col.aggregate_relin_round1(
        ctx, joint, [lead_relin] + [p.relin_share(lead_relin) for p in parties[1:]])
    relin = col.aggregate_relin_round2(ctx, joint, [p.relin_mult_share(round1) for p in parties])
    ctx.install_relin_key(relin, joint.tag)
    if rotations:
        lead_rot = lead.rotation_share(rotations)
        shares = [lead_rot] + [p.rotation_share(rotations, lead_rot) for p in parties[1:]]
        keys = col.aggregate_rotation_shares(ctx, joint, shares)
        ctx.install_rotation_keys(keys, joint.tag, rotations)
    return parties, joint


def decrypt_locally(ctx: CkksContext, joint: JointKeys, parties: Sequence[PartyKeys],
                    ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Collective decryption of ``ct``: the first ``n`` slot values."""
    shares = [p.decrypt_share(ct) for p in parties]
    return col.fuse_decryption(ctx, joint, ct, shares, n)


def bootstrap_locally(ctx: CkksContext, joint: JointKeys, parties: Sequence[PartyKeys],
                      ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """Collective bootstrap of ``ct``: same values, full level budget (each call takes the
    next common random element of this process, so none is used twice)."""
    rnd = col.start_bootstrap(ctx, joint, ct, next(_BOOTSTRAP_INDEX))
    shares = [p.boot_share(rnd.c1, rnd.a) for p in parties]
    return col.finish_bootstrap(ctx, joint, rnd, col.aggregate_boot_shares(ctx, joint, rnd,
                                                                          shares))


class LocalRefresh:
    """An async ``refresh`` callback (for :func:`.ensure_levels`, :func:`.inverse`) that
    bootstraps in-process; ``calls`` counts the bootstraps."""

    def __init__(self, ctx: CkksContext, joint: JointKeys, parties: Sequence[PartyKeys]):
        self._args = (ctx, joint, parties)
        self.calls = 0

    async def __call__(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        self.calls += 1
        return bootstrap_locally(*self._args, ct)


def local_refresh(ctx: CkksContext, joint: JointKeys,
                  parties: Sequence[PartyKeys]) -> LocalRefresh:
    """A :class:`LocalRefresh` for this federation."""
    return LocalRefresh(ctx, joint, parties)
