"""Homomorphic max / min: the plan's error bound holds on ciphertexts, levels stay in budget."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from ckks_federation import BLOCK, CkksFederation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.engine import ckks
from fednorm.engine.ckks import compare
from fednorm.engine.errors import InputError

NOISE = 1e-7  # CKKS noise allowance relative to the bound (bootstraps cost ~6e-9 each)


# -- plans, in plaintext ---------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8, 12, 16, 20])
def test_a_plan_meets_its_bits_with_the_fewest_stages(bits) -> None:
    plan = ckks.plan_compare(bits)
    assert plan.error_bound <= 2.0**-bits
    fewer = [ckks.ComparePlan(plan.stages_count - 1 - f, f)
             for f in range(1, plan.stages_count)]
    assert all(p.error_bound > 2.0**-bits for p in fewer)


@given(st.integers(0, 8), st.integers(1, 3))
@settings(max_examples=20, deadline=None)
def test_the_error_bound_covers_a_dense_sample(g, f) -> None:
    t = np.random.default_rng(g * 7 + f).uniform(-1, 1, 50_000)
    p = compare.composite_sign(g, f, t)
    assert np.all(np.abs(p) <= 1 + 1e-12)
    assert np.max(np.abs(t) * np.abs(np.sign(t) - p)) <= ckks.comparison_error(g, f) * 1.001


def test_more_stages_buy_precision() -> None:
    bounds = [ckks.plan_compare(b).error_bound for b in range(4, 30, 2)]
    assert bounds == sorted(bounds, reverse=True)
    with pytest.raises(InputError):
        ckks.plan_compare(60)


@given(st.integers(1, 12), st.sampled_from([5, 7]), st.integers(0, 8), st.integers(3, 8))
def test_the_refresh_schedule_refreshes_only_when_a_stage_would_not_fit(
        stages, budget, start, end) -> None:
    if start > budget or end > budget:
        with pytest.raises((InputError, ckks.LevelBudgetError)):
            compare.refresh_schedule(stages, budget, start, end)
        return
    level = start
    for index, refresh in enumerate(compare.refresh_schedule(stages, budget, start, end)):
        limit = end if index == stages - 1 else budget
        assert refresh == (level + compare.STAGE_LEVELS > limit)
        level = (0 if refresh else level) + compare.STAGE_LEVELS
        assert level <= limit


def test_rotations_compose_from_the_available_keys() -> None:
    assert ckks.rotation_plan(8 * BLOCK, (BLOCK,)) == (BLOCK,) * 8
    assert ckks.rotation_plan(6 * BLOCK, (BLOCK, 4 * BLOCK)) == (4 * BLOCK, BLOCK, BLOCK)
    with pytest.raises(InputError):
        ckks.rotation_plan(3, (2,))


# -- ciphertexts ---------------------------------------------------------------------------
def _pairs(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Random pairs, a third of them near-ties (where the sign is least precise)."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    near = slice(0, n // 3)
    b[near] = np.clip(a[near] + rng.uniform(-1, 1, n // 3) * 10.0 ** rng.uniform(-8, -1),
                      -1, 1)
    b[-1] = a[-1]  # an exact tie
    return a, b


@given(st.integers(0, 2**31), st.sampled_from([4, 6]), st.sampled_from([1.0, 128.0]))
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
def test_maximum_and_minimum_are_within_the_bound(fed: CkksFederation, seed, bits,
                                                  bound) -> None:
    ctx = fed.ctx
    plan = ckks.plan_compare(bits)
    a, b = _pairs(seed, 600)
    ca, cb = fed.encrypt(a * bound), fed.encrypt(b * bound)
    refresh = ckks.local_refresh(ctx, fed.joint, fed.parties)

    async def both():
        return await ckks.max_and_min(ctx, ca, cb, refresh, plan, bound=bound)

    high, low = trio.run(both)
    assert max(ctx.consumed(high), ctx.consumed(low)) <= ctx.level_budget
    tolerance = (plan.error_bound + NOISE) * bound
    got_high, got_low = fed.decrypt(high, a.size), fed.decrypt(low, a.size)
    true_high, true_low = np.maximum(a, b) * bound, np.minimum(a, b) * bound
    assert np.all(np.abs(got_high - true_high) <= tolerance)
    assert np.all(np.abs(got_low - true_low) <= tolerance)
    # the result stays between the inputs: max errs downwards, min upwards
    assert np.all(got_high <= true_high + NOISE * bound)
    assert np.all(got_low >= true_low - NOISE * bound)


def test_fold_and_tree_take_the_maximum_of_blocks_and_ciphertexts(fed: CkksFederation) -> None:
    ctx = fed.ctx
    plan = ckks.plan_compare(4)
    rng = np.random.default_rng(3)
    rows = rng.uniform(-1, 1, (2, 4 * BLOCK))
    refresh = ckks.local_refresh(ctx, fed.joint, fed.parties)

    async def run():
        top = await ckks.tree_maximum(ctx, [fed.encrypt(row) for row in rows], refresh, plan)
        return await ckks.fold_maximum(ctx, top, BLOCK, 2, refresh, plan, keys=(BLOCK,))

    folded = fed.decrypt(trio.run(run), BLOCK)
    want = rows.reshape(8, BLOCK).max(axis=0)
    rounds = 1 + 2  # one across the ciphertexts, two inside one (rotations by 1, 2 blocks)
    assert np.all(np.abs(folded - want) <= rounds * (plan.error_bound + NOISE))
    assert np.all(folded <= want + NOISE)


def test_a_ciphertext_past_the_budget_is_refused(fed: CkksFederation) -> None:
    ctx = fed.ctx
    ct = fed.consume(fed.encrypt(np.ones(4) * 0.5), ctx.level_budget + 1)
    refresh = ckks.local_refresh(ctx, fed.joint, fed.parties)
    with pytest.raises(ckks.LevelBudgetError):
        trio.run(lambda: ckks.maximum(ctx, ct, ct, refresh, ckks.plan_compare(4)))
