"""Run every collective operation of a federation inside one process.

For tests, benchmarks and single-process simulations: each helper plays all parties and
the server, calling exactly the generate / aggregate / finalize verbs a networked
protocol calls (:mod:`.multiparty`), just without messages in between.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys, PartyKeys
from fednorm.engine.ckks.multiparty import Bootstrap, Decryption, KeySetup
from fednorm.engine.errors import InputError

_BOOTSTRAP_INDEX = itertools.count()


def setup_locally(ctx: CkksContext, n_parties: int,
                  rotations: Sequence[int] = ()) -> tuple[list[PartyKeys], JointKeys]:
    """Make keys for ``n_parties``, the joint public and relinearization keys and joint
    rotation keys for ``rotations``; install the evaluation keys on ``ctx``."""
    if n_parties < 1:
        raise InputError("need at least one party")
    setup = KeySetup(ctx, relinearize=True, rotations=rotations)
    lead = setup.generate_keys(None)
    lead_shares = setup.generate_share(lead, 1, None)
    parties = [lead] + [setup.generate_keys(lead_shares) for _ in range(n_parties - 1)]
    shares = [lead_shares] + [setup.generate_share(p, 1, lead_shares) for p in parties[1:]]
    total = setup.running_sum(1)
    for share in shares:
        total.add(share)
    round_one = total.result()
    total.finalize(round_one.joint)
    round_two = setup.running_sum(2, round_one.joint)
    for party in parties:
        if (relin := setup.generate_share(party, 2, round_one)) is not None:
            round_two.add(relin)
    round_two.finalize()
    return parties, round_one.joint


def decrypt_locally(ctx: CkksContext, joint: JointKeys, parties: Sequence[PartyKeys],
                    ct: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Collective decryption of ``ct`` as it is (no :meth:`Decryption.prepare`): the
    first ``n`` slot values."""
    decryption = Decryption(ctx)
    shares = [decryption.generate_share(p, ct) for p in parties]
    return decryption.finalize(decryption.aggregate_shares(joint, ct, shares), n)


def bootstrap_locally(ctx: CkksContext, joint: JointKeys, parties: Sequence[PartyKeys],
                      ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """Collective bootstrap of ``ct``: same values, full level budget (each call takes the
    next common random element of this process, so none is used twice)."""
    bootstrap = Bootstrap(ctx)
    rnd = bootstrap.prepare(joint, ct, next(_BOOTSTRAP_INDEX))
    shares = [bootstrap.generate_share(p, joint.public_key, rnd.c1, rnd.index)
              for p in parties]
    return bootstrap.finalize(joint, rnd, bootstrap.aggregate_shares(joint, rnd, shares))


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
