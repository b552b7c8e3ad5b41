"""Noise flooding read from the ring: the coefficients a server would see.

A flooded decryption share is compared with the same share before flooding, tower by
tower, carried back to the coefficient domain with fednorm's NTT (itself checked
against OpenFHE on a secret key, whose coefficients are ternary): the difference must be
one integer polynomial, the same in every tower, whose N coefficients are independent
Gaussians of the documented σ, on no sublattice, and the fused decryption must keep the
stated precision.  ``test`` preset; one paper-preset check of the NTT convention.
"""

from __future__ import annotations

import math
from functools import partial, reduce

import numpy as np
import openfhe
import pytest
import trio
from ckks_federation import PARTIES as P
from ckks_federation import CkksFederation
from deviating import deviating
from ring_reading import coefficients, flooding_noise, towers_of

from fednorm.engine.ckks import (
    CkksContext,
    Flooding,
    ProductFlooding,
    SumDecryption,
    ring,
    setup_locally,
)
from fednorm.engine.ckks.flooding import flood_share
from fednorm.engine.ckks.multiparty import DecryptionShare
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import setup_server
from fednorm.protocols.collective.sums import product_decryptions
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.sim.federation import run_federation, simulate


def test_the_ntt_is_openfhes(fed: CkksFederation) -> None:
    """Forward and inverse agree, and a secret key reads back ternary in every tower."""
    q, n = fed.ctx.moduli[1], fed.n
    values = np.random.default_rng(0).integers(0, q, n, dtype=np.uint64)
    transform = ring.ntt(q, n)
    assert np.array_equal(transform.inverse(transform.forward(values)), values)
    key = openfhe.Serialize(fed.parties[1]._sk, openfhe.BINARY)
    ring.check_convention(key, fed.ctx.moduli, n)
    with pytest.raises(ProtocolError, match="not the one"):  # a wrong root is caught
        shifted = bytearray(key)
        layout = ring.locate_towers(shifted, n, len(fed.ctx.moduli), fed.ctx.moduli)
        layout.write(shifted, 0, np.roll(layout.read(key, 0), 1))
        ring.check_convention(bytes(shifted), fed.ctx.moduli, n)


@pytest.mark.parametrize("preset", ["test", "paper"])
def test_the_forward_ntt_is_undone_by_the_inverse_on_every_modulus(preset: str) -> None:
    """Every tower modulus of the preset, the moduli below 2^51 on the float64 quotient
    path, the first on Shoup's (the inverse takes Shoup's on all): random residues and
    the extremes 0, 1, q − 2, q − 1 come back exactly, and the forward transform lands
    below q."""
    ctx = CkksContext(preset)
    n = ctx.preset.ring_dim
    paths = {q < 1 << ring.FLOAT_QUOTIENT_BITS for q in ctx.moduli}
    assert paths == {True, False}  # both multiplications are exercised
    for q in ctx.moduli:
        values = np.random.default_rng(q % 2**32).integers(0, q, n, dtype=np.uint64)
        values[:6] = [0, 1, q - 2, q - 1, q - 1, 0]
        transform = ring.ntt(q, n)
        spread = transform.forward(values)
        assert spread.max() < q
        assert np.array_equal(transform.inverse(spread), values), q
        for support in (1, 90, n // 2 + 1):  # a short vector: the copied stages agree
            short = np.where(np.arange(n) < support, values, 0).astype(np.uint64)
            assert np.array_equal(transform.forward(short, support), transform.forward(short))


@pytest.mark.parametrize("preset", ["test", "paper"])
def test_the_ntt_tables_follow_their_definitions(preset: str) -> None:
    """The vectorized tables against Python integers on every modulus: ψ the smallest
    odd power of a primitive 2N-th root, its powers, and Shoup's ⌊w·2^64/q⌋ (edges too)."""
    ctx = CkksContext(preset)
    n = ctx.preset.ring_dim
    for q in ctx.moduli:
        transform = ring.ntt(q, n)
        psi = int(transform.psi_powers[ring._bit_reversed(n)][1])
        assert pow(psi, n, q) == q - 1
        assert psi == min(pow(psi, k, q) for k in range(1, 2 * n, 2))
        rng = np.random.default_rng(q % 2**32)
        probe = np.append(rng.integers(0, q, 500, dtype=np.uint64), [0, 1, q - 2, q - 1])
        assert [int(v) for v in ring._powers(psi, 40, q)] == [pow(psi, k, q) for k in range(40)]
        assert [int(v) for v in ring._shoup(probe, q)] == [(int(w) << 64) // q for w in probe]


@pytest.mark.slow
def test_the_ntt_is_openfhes_at_the_paper_preset() -> None:
    ctx = CkksContext("paper")
    parties, _ = setup_locally(ctx, 2)
    ring.check_convention(openfhe.Serialize(parties[1]._sk, openfhe.BINARY), ctx.moduli,
                          ctx.preset.ring_dim)


def test_flooding_fills_every_coefficient_with_independent_noise(fed: CkksFederation) -> None:
    """Read from the ring: the added noise has gcd 1 (no sublattice), coefficients i and
    N−i independent, and σ within 5 % of the documented √(12τ)·2^(s/2)·t."""
    total = fed.sum_of_uploads(np.linspace(-1.0, 1.0, 64))
    flooding = Flooding(fed.n, P, P)
    before = fed.raw_shares(total)[1]
    drawn = [flooding_noise(fed.ctx, before, flood_share(fed.ctx, before, flooding))
             for _ in range(2)]
    assert reduce(math.gcd, drawn[0]) == 1
    noise = np.array(drawn[0] + drawn[1], dtype=np.float64)
    assert flooding.sigma == pytest.approx(
        math.sqrt(12 * flooding.decryptions) * 2**15 * flooding.ciphertext_noise_bound)
    assert abs(np.std(noise) / flooding.sigma - 1) < 0.05
    assert abs(np.mean(noise)) < 5 * flooding.sigma / math.sqrt(noise.size)
    one = noise[:fed.n]
    mirrored = one[1:][::-1]  # coefficient N−i beside coefficient i
    assert not np.array_equal(one[1:], -mirrored)
    correlation = np.corrcoef(one[1:], mirrored)[0, 1]
    assert abs(correlation) < 5 / math.sqrt(fed.n)


def test_the_fused_residue_is_not_the_unflooded_one(fed: CkksFederation) -> None:
    """A server that reduces the fused polynomial modulo the scaling factor (or anything
    else) does not recover the unflooded residue, and the decryption keeps its
    precision."""
    values = np.linspace(-1.0, 1.0, 64)
    total = fed.sum_of_uploads(values)
    flooding = Flooding(fed.n, P, P)
    raw = fed.raw_shares(total)
    flooded = [flood_share(fed.ctx, share, flooding) for share in raw]
    moduli = fed.ctx.moduli[:fed.ctx.towers(total)]

    def fused(shares: list[openfhe.Ciphertext]) -> list[int]:
        towers = [towers_of(fed.ctx, s) for s in shares]
        summed = [reduce(lambda a, b: ring.add_mod(a, b, q), (t[i] for t in towers))
                  for i, q in enumerate(moduli)]
        return coefficients(fed.ctx, summed)

    scale = round(math.sqrt(total.GetScalingFactor()))
    plain, noisy = fused(raw), fused(flooded)
    assert [c % scale for c in plain] != [c % scale for c in noisy]
    decryption = SumDecryption(fed.ctx)
    out = decryption.finalize(decryption.aggregate_shares(
        fed.joint, total, [DecryptionShare(s) for s in flooded]), values.size)
    np.testing.assert_allclose(out, P * values, rtol=0, atol=1e-11)


def test_flooded_decryptions_keep_their_precision(fed: CkksFederation) -> None:
    """Through the engine's verbs: two flooded decryptions of one sum agree to the
    decoder's precision at the default s = 30 (the flooding, ~1e-18 per slot here, is
    far below it), and both equal the pooled sum."""
    values = np.linspace(-1e3, 1e3, 512)
    total = fed.sum_of_uploads(values)
    decryption = SumDecryption(fed.ctx, Flooding(fed.n, P, P))
    for _ in range(2):
        shares = [decryption.generate_share(p, total) for p in fed.parties]
        out = decryption.finalize(decryption.aggregate_shares(fed.joint, total, shares),
                                  values.size)
        np.testing.assert_allclose(out, P * values, rtol=0, atol=1e-9)


def test_flooding_is_refused_below_twenty_bits_and_on_other_ciphertexts(
        fed: CkksFederation) -> None:
    with pytest.raises(InputError, match=">= 20 bits"):
        Flooding(fed.n, P, P, security_bits=19)
    with pytest.raises(InputError, match="positive integer"):
        Flooding(fed.n, P, P, decryptions=0)
    flooding = Flooding(fed.n, P, P)
    fresh = fed.ctx.encrypt(fed.joint.public_key, np.ones(4))
    with pytest.raises(ProtocolError, match="not a sum upload"):
        SumDecryption(fed.ctx, flooding).generate_share(fed.parties[0], fresh)
    with pytest.raises(InputError, match="needs the party's flooding"):
        SumDecryption(fed.ctx).generate_share(fed.parties[0], fed.sum_of_uploads(np.ones(4)))
    with pytest.raises(ProtocolError, match="one-element"):
        flood_share(fed.ctx, fresh, flooding)


def test_flooding_off_leaves_a_share_as_openfhe_made_it(fed: CkksFederation) -> None:
    """``enabled=False`` (``FitOptions.flood`` off, for measuring its cost) changes no byte
    of the share, where the same flooding enabled changes every tower."""
    total = fed.sum_of_uploads(np.linspace(-1.0, 1.0, 64))
    before = fed.raw_shares(total)[1]
    raw = openfhe.Serialize(before, openfhe.BINARY)
    off = flood_share(fed.ctx, before, Flooding(fed.n, P, P, enabled=False))
    on = flood_share(fed.ctx, before, Flooding(fed.n, P, P))
    assert openfhe.Serialize(off, openfhe.BINARY) == raw
    assert all(np.any(a != b) for a, b in zip(towers_of(fed.ctx, on),
                                              towers_of(fed.ctx, before), strict=True))


def test_flood_and_replay_never_travel_to_a_party() -> None:
    """Both are a party's own choice: a server's options never carry them, and options
    that do (a deviating server's welcome) leave the party flooding and replaying."""
    from fednorm.protocols.base import options_from_wire, options_to_wire

    wire = options_to_wire(FitOptions(preset="test", flood=False, replay=False))
    assert "flood" not in wire and "replay" not in wire
    party = options_from_wire({**wire, "flood": False, "replay": False})
    assert party.flood and party.replay


def test_without_flooding_the_protocols_still_fit_the_pooled_data() -> None:
    """The measuring case runs the same protocol: the same pooled statistics."""
    parts = [np.arange(6.0).reshape(3, 2) + k for k in range(P)]
    fitted = simulate(parts, "zscore", "mhe", FitOptions(preset="test", flood=False))
    np.testing.assert_allclose(fitted.normalizer.mean, np.vstack(parts).mean(axis=0),
                               rtol=1e-12)


class _ProductRead(Exception):
    """Raised by the reading server once it holds what it reads (ends the run)."""


def test_a_product_share_carries_the_noise_of_the_decryptions_its_bits_allow() -> None:
    """Ten parties' bits at s = 42 (test preset, τ = 1024): through the real party roles,
    a server plays the paper z-score's presence product (its only product decryption)
    and reads every slot of the fused shares.  What lies off the bits (value − nearest
    bit) is the P parties' flooding alone: σ within 5 % of √P times the per-slot σ of a
    product flooded for τ_p = 21 (√(12·21)·2^21·t), the σ that τ_p was chosen to keep
    readable; not the 7× larger noise of τ = 1024, nor none.  Before products were
    flooded for τ_p the run was refused before key setup; while the server decoded
    products through OpenFHE (which adds a Gaussian as large as the noise it estimates),
    σ was √2 times this."""
    parts = [np.arange(4.0).reshape(2, 2) * (p + 1) - p for p in range(10)]
    options = FitOptions(preset="test", algorithm="paper", flooding_bits=42)
    read: dict[str, object] = {}

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset,
                                    **ppf_zscore.setup_arguments(options))
        sums = await rc.gather(ppf_zscore.EncryptedSums)
        await crypto.add_all({p: m.total for p, m in sums.items()})  # the inputs relayed
        await crypto.add_all({p: m.count for p, m in sums.items()})
        pooled = await crypto.multiply_all({p: m.empty for p, m in sums.items()})
        read["values"] = await crypto.decrypt_product(pooled, crypto.ckks.slots)
        read["scales"] = (pooled.combined(crypto.ckks).GetScalingFactor(),
                          pooled.uploads[0].ciphertext.GetScalingFactor())
        raise _ProductRead

    with pytest.raises(_ProductRead):
        trio.run(partial(run_federation, deviating("zscore", server=server), parts, options,
                         timeout=120))
    preset = CkksContext("test").preset
    tau_p = product_decryptions(preset, 10, 42, 1024)
    product, factor = read["scales"]
    flooding = ProductFlooding(preset.ring_dim, 10, 10, 42, tau_p, growth=product / factor)
    off = read["values"] - np.round(read["values"])
    expected = flooding.slot_sigma(product) * math.sqrt(10)
    assert tau_p == 21 and np.abs(off).max() < 0.25
    assert abs(np.std(off) / expected - 1) < 0.05
    assert abs(np.mean(off)) < 5 * expected / math.sqrt(off.size)
