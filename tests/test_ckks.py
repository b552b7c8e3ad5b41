"""Multiparty CKKS layer: keys, collective operations, levels, inverse.

Everything runs at the fast ``test`` preset (ring 2^14, depth 9, budget 5) with keys
made once per module, except one ``slow`` test of the whole chain at the paper preset.
Tolerances: a collective decryption at scale 2^50 carries ~1e-6 absolute smudging noise
(P=3); after a multiplication (doubled scale) ~1e-9. Shares are checked in
test_ckks_shares.py, bytes in test_ckks_bytes.py.
"""

from __future__ import annotations

import copy
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openfhe
import pytest
import trio
from ckks_federation import DOUBLED_ABS_TOL, FRESH_ABS_TOL, SUM_WIDTH, CkksFederation
from ckks_federation import PARTIES as P
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine.ckks import (
    COUNT_RANGE,
    Bootstrap,
    CkksContext,
    DecodeOverflow,
    Decryption,
    LevelBudgetError,
    bootstrap_locally,
    decrypt_locally,
    ensure_levels,
    get_preset,
    inverse,
    local_refresh,
    plan_inverse,
    setup_locally,
)
from fednorm.engine.errors import InputError

CRYPTO = settings(max_examples=3, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
vectors = st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=64).map(np.array)







# -- presets -----------------------------------------------------------------------------
def test_presets() -> None:
    paper = get_preset("paper")
    assert (paper.ring_dim, paper.security, paper.depth) == (1 << 15, "HEStd_128_classic", 11)
    assert (paper.scaling_mod_bits, paper.first_mod_bits) == (50, 60)
    assert paper.level_budget == 7 and get_preset("test").level_budget == 5
    assert paper.fingerprint != get_preset("test").fingerprint
    with pytest.raises(InputError, match="unknown CKKS preset"):
        get_preset("nope")


# -- keys --------------------------------------------------------------------------------
def test_party_keys_refuse_pickling_and_copying(fed: CkksFederation) -> None:
    keys = fed.parties[1]
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="secret key"):
            attempt(keys)
    with pytest.raises(InputError, match="never serialized"):
        fed.ctx.to_bytes(keys._sk)  # even reaching in, the secret does not become bytes
    assert "tag=" in repr(keys) and keys.joint_tag == fed.joint.tag


@CRYPTO
@given(parts=st.lists(vectors, min_size=P, max_size=P))
def test_joint_encryption_aggregates_and_decrypts(fed: CkksFederation,
                                                  parts: list[np.ndarray]) -> None:
    """Each party encrypts under the joint key; the server adds; all decrypt the sum."""
    n = max(len(p) for p in parts)
    padded = [np.pad(p, (0, n - len(p))) for p in parts]
    total = fed.encrypt(padded[0])
    for values in padded[1:]:
        total = fed.ctx.add(total, fed.encrypt(values))
    np.testing.assert_allclose(fed.decrypt(total, n), sum(padded), atol=FRESH_ABS_TOL)


def test_an_upload_at_a_reduced_level_is_smaller_and_still_multiplies(fed: CkksFederation) -> None:
    """A ciphertext encrypted at ``upload_level(k)`` takes k products, then decrypts."""
    ctx, rng = fed.ctx, np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, 16), rng.uniform(1, 2, 16)
    level = ctx.upload_level(2)
    ca = ctx.encrypt(fed.joint.public_key, a, level)
    assert ctx.consumed(ca) == level == ctx.depth - 4
    assert len(ctx.to_bytes(ca)) < 0.6 * len(ctx.to_bytes(fed.encrypt(a)))  # 5 of 10 towers
    product = ctx.mul(ctx.mul(ca, fed.consume(fed.encrypt(b), 2)), 0.5)
    np.testing.assert_allclose(fed.decrypt(ctx.double_scale(product), 16), a * b / 2,
                               atol=DOUBLED_ABS_TOL)
    summed = ctx.encrypt(fed.joint.public_key, a, ctx.upload_level(0))
    np.testing.assert_allclose(fed.decrypt(ctx.double_scale(summed), 16), a,
                               atol=DOUBLED_ABS_TOL)
    with pytest.raises(InputError, match="encryption level"):
        ctx.encrypt(fed.joint.public_key, a, ctx.depth)
    with pytest.raises(InputError, match="no level for decryption"):
        ctx.upload_level(ctx.depth - 1)


def test_a_product_too_large_to_decode_is_a_decode_overflow(fed: CkksFederation) -> None:
    """OpenFHE's decoding check fails on large products: a distinct ProtocolError, so a
    protocol can decrypt again at a smaller public scale."""
    ctx = fed.ctx
    big = fed.encrypt(np.full(4, 2.0**30))  # measured: 2^26 squared decodes, 2^28 not
    with pytest.raises(DecodeOverflow, match="too large"):
        fed.decrypt(ctx.mul(big, big), 4)
    scaled = ctx.mul(ctx.mul(big, 2.0**-30), big)
    np.testing.assert_allclose(fed.decrypt(scaled, 4), 2.0**30, rtol=1e-6)


@CRYPTO
@given(a=vectors, b=vectors, s=st.floats(-100, 100))
def test_relinearized_multiplication(fed: CkksFederation, a: np.ndarray, b: np.ndarray,
                                     s: float) -> None:
    n = min(len(a), len(b))
    a, b = a[:n] / 1e3, b[:n] / 1e3  # |x| <= 1 keeps the doubled-scale tolerance absolute
    ca, cb = fed.encrypt(a), fed.encrypt(b)
    product = fed.ctx.mul(ca, cb)
    assert fed.ctx.consumed(product) == 1 and product.NumberCiphertextElements() == 2
    np.testing.assert_allclose(fed.decrypt(product, n), a * b, atol=DOUBLED_ABS_TOL)
    np.testing.assert_allclose(fed.decrypt(fed.ctx.mul(ca, b), n), a * b, atol=DOUBLED_ABS_TOL)
    np.testing.assert_allclose(fed.decrypt(fed.ctx.mul(ca, s), n), a * s,
                               atol=DOUBLED_ABS_TOL * 100)


def test_rotations_sum_slots(fed: CkksFederation) -> None:
    values = np.arange(1.0, 2 * SUM_WIDTH + 1)
    summed = fed.decrypt(fed.ctx.sum_slots(fed.encrypt(values), SUM_WIDTH), SUM_WIDTH + 1)
    assert summed[0] == pytest.approx(values[:SUM_WIDTH].sum(), abs=FRESH_ABS_TOL)
    assert summed[SUM_WIDTH] == pytest.approx(values[SUM_WIDTH:].sum(), abs=FRESH_ABS_TOL)


@CRYPTO
@given(values=vectors, used=st.integers(0, 5))
def test_bootstrap_restores_levels_and_keeps_values(fed: CkksFederation, values: np.ndarray,
                                                    used: int) -> None:
    ct = fed.consume(fed.encrypt(values), used)
    assert fed.ctx.consumed(ct) == used
    fresh = bootstrap_locally(fed.ctx, fed.joint, fed.parties, ct)
    assert fed.ctx.consumed(fresh) == 0 and fed.ctx.levels_left(fresh) == 5
    assert fresh.GetKeyTag() == fed.joint.tag
    np.testing.assert_allclose(fed.decrypt(fresh, len(values)), values, atol=FRESH_ABS_TOL)
    product = fed.ctx.mul(fresh, 0.5)  # and it multiplies on
    np.testing.assert_allclose(fed.decrypt(product, len(values)), values / 2,
                               atol=FRESH_ABS_TOL)


def test_shares_made_in_threads(fed: CkksFederation) -> None:
    """Party-side calls on independent objects run concurrently (OpenFHE drops the GIL)."""
    values = np.linspace(-1, 1, 100)
    cts = [fed.encrypt(values * (i + 1)) for i in range(4)]
    decryption = Decryption(fed.ctx)
    with ThreadPoolExecutor(4) as pool:
        shares = list(pool.map(
            lambda ct: [decryption.generate_share(p, ct) for p in fed.parties], cts))
    for i, (ct, ct_shares) in enumerate(zip(cts, shares, strict=True)):
        out = decryption.finalize(decryption.aggregate_shares(fed.joint, ct, ct_shares), 100)
        np.testing.assert_allclose(out, values * (i + 1), atol=FRESH_ABS_TOL)


# -- levels ------------------------------------------------------------------------------
def test_level_budget_is_tracked(fed: CkksFederation) -> None:
    ctx = fed.ctx
    at_budget = fed.consume(fed.encrypt(np.ones(4)), ctx.level_budget)
    assert ctx.levels_left(at_budget) == 0
    Bootstrap(ctx).prepare(fed.joint, at_budget, 0)  # still allowed
    past = fed.ctx.mul(at_budget, 1.0)
    assert ctx.levels_left(past) == -1
    with pytest.raises(LevelBudgetError, match="collective bootstrap"):
        Bootstrap(ctx).prepare(fed.joint, past, 1)
    deepest = fed.consume(past, ctx.depth - ctx.consumed(past))
    np.testing.assert_allclose(fed.decrypt(deepest, 4), 1.0, atol=1e-3)  # decryptable...
    with pytest.raises(LevelBudgetError, match="depth"):
        ctx.mul(deepest, 1.0)  # ...but no deeper


async def test_ensure_levels_refreshes_only_when_needed(fed: CkksFederation) -> None:
    ctx = fed.ctx
    refresh = local_refresh(ctx, fed.joint, fed.parties)
    ct = fed.consume(fed.encrypt(np.full(4, 3.0)), 3)
    assert await ensure_levels(ctx, ct, 2, refresh) is ct and refresh.calls == 0
    fresh = await ensure_levels(ctx, ct, 3, refresh)
    assert refresh.calls == 1 and ctx.levels_left(fresh) == ctx.level_budget
    np.testing.assert_allclose(fed.decrypt(fresh, 4), 3.0, atol=FRESH_ABS_TOL)
    with pytest.raises(LevelBudgetError, match="can no longer be refreshed"):
        await ensure_levels(ctx, fed.consume(ct, 3), 1, refresh)
    with pytest.raises(InputError):
        await ensure_levels(ctx, ct, ctx.level_budget + 1, refresh)


# -- inverse -----------------------------------------------------------------------------
async def _inverse_errors(fed: CkksFederation, x: np.ndarray, lo: float, hi: float,
                          out_scale: float) -> tuple[np.ndarray, openfhe.Ciphertext]:
    """Relative errors of ``out_scale / x`` (and the result); checks the dry-run plan held."""
    ctx = fed.ctx
    refresh = local_refresh(ctx, fed.joint, fed.parties)
    out = await inverse(ctx, fed.encrypt(x), lo, hi, refresh, out_scale=out_scale)
    plan = plan_inverse(ctx.level_budget, lo, hi)
    assert (refresh.calls, ctx.consumed(out)) == (plan.bootstraps, plan.output_consumed)
    return _relative_errors(fed, out, x / out_scale), out


def _relative_errors(fed: CkksFederation, out: openfhe.Ciphertext, x: np.ndarray) -> np.ndarray:
    """|out * x - 1|: one magnitude in every slot, so decoding adds little noise."""
    return np.abs(fed.decrypt(fed.ctx.mul(out, x), len(x)) - 1.0)


async def test_inverse_over_count_range(fed: CkksFederation) -> None:
    x = np.geomspace(*COUNT_RANGE, 4096)
    hi = COUNT_RANGE[1]
    scaled, out = await _inverse_errors(fed, x, *COUNT_RANGE, out_scale=hi)
    assert scaled.max() < 1e-6  # measured 3.2e-7; approximation bound 2.25e-7
    direct = _relative_errors(fed, fed.ctx.mul(out, 1 / hi), x)  # 1/x itself
    assert direct.max() < 1e-4  # outputs ~1e-6 carry ~4e-11 absolute noise


@settings(max_examples=2, deadline=None)
@given(lo_exp=st.floats(-10, 10), width=st.floats(1, 12), data=st.data())
def test_inverse_on_random_ranges(fed: CkksFederation, lo_exp: float, width: float,
                                  data: st.DataObject) -> None:
    lo, hi = 2.0**lo_exp, 2.0 ** (lo_exp + width)
    exps = data.draw(st.lists(st.floats(lo_exp, lo_exp + width), min_size=1, max_size=32))
    x = np.clip(np.exp2(np.array(exps)), lo, hi)
    errors, _ = trio.run(_inverse_errors, fed, x, lo, hi, hi)
    assert errors.max() < 1e-6


def test_inverse_plan() -> None:
    paper = plan_inverse(7)
    assert (paper.doublings, paper.bootstraps, paper.output_consumed) == (13, 2, 5)
    assert paper.error_bound < 2.3e-7
    assert plan_inverse(7, keep_levels=2).output_consumed <= 5
    assert plan_inverse(7, 1.0, 64.0).bootstraps == 0
    with pytest.raises(InputError):
        plan_inverse(7, 2.0, 1.0)


async def test_inverse_without_refresh_is_refused_up_front(fed: CkksFederation) -> None:
    with pytest.raises(InputError, match="refresh"):
        await inverse(fed.ctx, fed.encrypt(np.ones(2)))


# -- the paper preset, whole chain ---------------------------------------------------------
@pytest.mark.slow
async def test_paper_preset_whole_chain() -> None:
    """Keys for P=10 -> encrypt -> aggregate -> multiply -> bootstrap -> inverse -> decrypt."""
    ctx = CkksContext("paper")
    parties, joint = setup_locally(ctx, 10)
    rng = np.random.default_rng(7)
    parts = [rng.uniform(0, 10, 256) for _ in parties]
    counts = [rng.integers(1, 5000, 256).astype(float) for _ in parties]
    total = ctx.encrypt(joint.public_key, parts[0])
    n = ctx.encrypt(joint.public_key, counts[0])
    for values, cnt in zip(parts[1:], counts[1:], strict=True):
        total = ctx.add(total, ctx.encrypt(joint.public_key, values))
        n = ctx.add(n, ctx.encrypt(joint.public_key, cnt))
    squared = ctx.mul(total, total)
    fresh = bootstrap_locally(ctx, joint, parties, squared)
    assert ctx.consumed(fresh) == 0
    refresh = local_refresh(ctx, joint, parties)
    inv = await inverse(ctx, n, *COUNT_RANGE, refresh, out_scale=COUNT_RANGE[1], keep_levels=1)
    mean_sq = ctx.mul(fresh, ctx.mul(inv, 1.0 / COUNT_RANGE[1]))
    expected = sum(parts) ** 2 / sum(counts)
    got = decrypt_locally(ctx, joint, parties, mean_sq, 256)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert refresh.calls == plan_inverse(7).bootstraps


