"""What a server reads of a masked sum: the AND of the parties' bits and nothing else.

The default MinMax decrypts, each round, the sum of the parties' bits as masked zeros
(fednorm.engine.ckks.masking).  Here the server is the attacker: it runs the real first
round with the real party roles, fuses the parties' flooded shares itself and reads the
ring coefficients of the sum.  Where every party's bit is 1 it reads noise; where one, two
or all three parties' bits are 0 it must read a uniform element of Z_Q, the same however
many parties had a 0 (else the sum would show how many parties hold values above a
threshold: per-party information beyond the pooled extreme).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import trio
from deviating import deviating
from scipy import stats

from fednorm.engine.ckks.decoding import fused_coefficients
from fednorm.engine.ckks.multiparty import DecryptionShare
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import CoefficientDecryptRequest, setup_server
from fednorm.protocols.collective.rounds import request_shares
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.ppf import extremes
from fednorm.protocols.ppf.minmax import MinMaxExtremes
from fednorm.sim.federation import run_federation

TEST = FitOptions(preset="test")
# One feature whose parties' largest values lie hundreds of binades apart, so that many
# thresholds of the first round fall between them: 1, 2 or 3 parties above each.
PARTS = [np.array([[1e-200]]), np.array([[1e-50]]), np.array([[1e150]])]


def _reading_server(read: dict[str, object]):
    """An honest first round whose shares the server fuses itself; it records the
    coefficients and the moduli, and ends the run."""
    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **extremes.setup_arguments(options))
        with rc.subprotocol("extremes"):
            replies = await rc.gather(extremes.EncryptedBits)
            pooled = await crypto.pool_coefficients({p: r.chunks[0] for p, r in replies.items()})
            shares = await request_shares(rc, "decrypt_coefficients", CoefficientDecryptRequest(
                index=pooled.index), DecryptionShare, (pooled.index, pooled.uploads))
            read["coefficients"] = fused_coefficients(crypto.ckks, [s.share for s in shares])
            read["moduli"] = crypto.ckks.moduli[:crypto.ckks.towers(shares[0].share)]
            read["ring_dim"] = crypto.ckks.preset.ring_dim
            found = np.array([0.0])
            await rc.broadcast(MinMaxExtremes(min=found, max=found))
        return MinMaxNormalizer(found, found)

    return server


def _zeros_per_position(ring_dim: int) -> np.ndarray:
    """How many parties' first-round bits are 0 at each position of the layout."""
    layout = extremes.Layout(1, ring_dim)
    thresholds = extremes.Brackets.start(layout.brackets).thresholds(layout.count)
    bits = [extremes.threshold_bits(extremes.local_tops(X), thresholds) for X in PARTS]
    return len(PARTS) - np.sum(bits, axis=0).astype(int)


def test_the_server_reads_noise_where_all_bits_are_1_and_uniform_elements_elsewhere(
) -> None:
    read: dict[str, object] = {}
    trio.run(partial(run_federation, deviating("minmax", server=_reading_server(read)),
                     PARTS, TEST, timeout=120))
    big_q = math.prod(read["moduli"])
    coefficients = read["coefficients"]
    zeros = _zeros_per_position(read["ring_dim"])
    values = coefficients[:len(zeros)]
    assert max(abs(int(c)) for c in values[zeros == 0]) < 2**60  # flooding noise only
    for modulus in (big_q, *read["moduli"]):  # Z_Q, and each tower's Z_q by CRT
        uniform = {k: np.array([(int(c) % modulus) / modulus for c in values[zeros == k]])
                   for k in (1, 2, 3)}
        for k, sample in uniform.items():
            assert sample.size > 300, (k, sample.size)  # every count of zeros occurs often
            assert stats.kstest(sample, "uniform").pvalue > 1e-6, (k, modulus)
        assert stats.ks_2samp(uniform[1], uniform[3]).pvalue > 1e-6
