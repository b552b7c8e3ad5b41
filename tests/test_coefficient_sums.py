"""Coefficient uploads as exact sums: integers written into the ring's coefficients add
up, coefficient by coefficient, and decrypt to the exact sum up to the flooding alone —
a coefficient near the capacity does not cost its neighbour near 0 any precision, as a
slot beside a large one does under CKKS decoding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fednorm.engine import ckks
from fednorm.engine.ckks.multiparty import CoefficientSumDecryption
from fednorm.engine.errors import InputError
from fednorm.protocols.collective.sums import total_of

PARTIES = 4


@pytest.fixture(scope="module")
def federation() -> tuple[ckks.CkksContext, list[ckks.PartyKeys], ckks.JointKeys]:
    ctx = ckks.CkksContext("test")
    parties, joint = ckks.setup_locally(ctx, PARTIES)
    return ctx, parties, joint


def _decrypted_sum(federation, rows: list[list[int]]) -> tuple[np.ndarray, float]:
    """The flooded decryption of the parties' rows as coefficient uploads, and the
    flooding's 8σ bound on each decrypted integer."""
    ctx, parties, joint = federation
    cts = [ckks.encrypt_coefficients(ctx, joint.public_key, row) for row in rows]
    flooding = ckks.CoefficientFlooding(ctx.preset.ring_dim, PARTIES, PARTIES)
    decryption = CoefficientSumDecryption(ctx, flooding)
    total = total_of(ctx, cts)
    shares = [decryption.generate_share(p, total) for p in parties]
    decrypted = decryption.finalize(decryption.aggregate_shares(joint, total, shares),
                                    len(rows[0]))
    return decrypted, 8 * flooding.sigma * math.sqrt(PARTIES)


def test_the_sum_of_coefficient_uploads_is_exact_up_to_the_flooding(federation) -> None:
    """Integers near the capacity beside 0, ±1 and mid-sized ones, of both signs."""
    ctx = federation[0]
    limit = ckks.coefficient_capacity(ctx) // PARTIES
    rng = np.random.default_rng(3)
    rows = [[limit - 1, -(limit - 1), 0, 1, -1, int(rng.integers(-2**62, 2**62)) << 40,
             int(rng.integers(0, 2**40))] for _ in range(PARTIES)]
    decrypted, bound = _decrypted_sum(federation, rows)
    exact = [sum(column) for column in zip(*rows, strict=True)]
    errors = [abs(int(d) - e) for d, e in zip(decrypted, exact, strict=True)]
    assert max(errors) < bound


def test_a_coefficient_upload_refuses_integers_beyond_its_capacity(federation) -> None:
    ctx, _, joint = federation
    limit = ckks.coefficient_capacity(ctx)
    with pytest.raises(InputError, match="below 2\\^"):
        ckks.encrypt_coefficients(ctx, joint.public_key, [0, -limit])
    with pytest.raises(InputError, match="at most"):
        ckks.encrypt_coefficients(ctx, joint.public_key, [0] * (ctx.preset.ring_dim + 1))
