"""One multiparty CKKS federation in this process: the ``fed`` fixture of conftest.py.

Three parties at the fast ``test`` preset (ring 2^14, depth 9, budget 5), their secret
keys, the joint public and relinearization keys, and joint rotation keys for
:meth:`CkksContext.sum_slots` over ``SUM_WIDTH`` slots and for a rotation by one
``BLOCK`` (the homomorphic maximum folds blocks of slots).
"""

from __future__ import annotations

from functools import reduce

import numpy as np
import openfhe

from fednorm.engine.ckks import (
    TEST,
    CkksContext,
    decrypt_locally,
    setup_locally,
    sum_rotation_indices,
)

PARTIES = 3
SUM_WIDTH = 8
FRESH_ABS_TOL = 1e-5  # scale 2^50 decryption: ~1e-6 smudging noise at P=3, with margin
DOUBLED_ABS_TOL = 1e-7  # after a multiplication: the ciphertext's own noise only
BLOCK = TEST.slots // 16


class CkksFederation:
    """Context, parties and joint keys of one federation, with collective shortcuts."""

    def __init__(self) -> None:
        self.ctx = CkksContext("test")
        self.n = self.ctx.preset.ring_dim
        rotations = (*sum_rotation_indices(SUM_WIDTH), BLOCK)
        self.parties, self.joint = setup_locally(self.ctx, PARTIES, rotations=rotations)

    def encrypt(self, values: np.ndarray) -> openfhe.Ciphertext:
        return self.ctx.encrypt(self.joint.public_key, values)

    def decrypt(self, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        """The first ``n`` slots of ``ct``, decrypted by every party."""
        return decrypt_locally(self.ctx, self.joint, self.parties, ct, n)

    def consume(self, ct: openfhe.Ciphertext, levels: int) -> openfhe.Ciphertext:
        """``ct`` after ``levels`` multiplications by one."""
        for _ in range(levels):
            ct = self.ctx.mul(ct, 1.0)
        return ct

    def sum_of_uploads(self, values: np.ndarray) -> openfhe.Ciphertext:
        """Every party's sum upload of ``values``, added: a ciphertext of P · values."""
        cts = [self.ctx.encrypt_sum(self.joint.public_key, values) for _ in self.parties]
        return reduce(self.ctx.add, cts)

    def raw_shares(self, ct: openfhe.Ciphertext) -> list[openfhe.Ciphertext]:
        """Every party's share of ``ct`` as OpenFHE makes it, before fednorm floods it."""
        raw = self.ctx.raw
        return [(raw.MultipartyDecryptLead if i == 0 else raw.MultipartyDecryptMain)(
            [ct], party._sk)[0] for i, party in enumerate(self.parties)]
