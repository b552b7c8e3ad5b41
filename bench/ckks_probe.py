"""Time and measure the multiparty CKKS layer (scratch probe, not a test).

    .venv/bin/python bench/ckks_probe.py --preset paper --parties 10
    .venv/bin/python bench/ckks_probe.py --preset test --parties 3 --errors-only

Party-side times are summed over all parties (as if one machine played them all).
Wall-clock numbers depend on load: OpenMP uses every core, so another busy process on a
2-core machine can double them. ``process_time`` is printed alongside.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
import trio

from fednorm.engine import ckks
from fednorm.engine.ckks import collective as col

ROWS: list[tuple[str, float, float]] = []


@contextmanager
def timed(label: str):
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    ROWS.append((label, time.perf_counter() - wall, time.process_time() - cpu))


def each(label: str, items: list, fn: Callable[[Any], Any]) -> list:
    with timed(label):
        return [fn(item) for item in items]


def setup(ctx: ckks.CkksContext, n: int) -> tuple[list[ckks.PartyKeys], ckks.JointKeys]:
    """The key protocols step by step, timing share / aggregate / finalize."""
    with timed("keygen: lead KeyGen"):
        lead = ckks.PartyKeys.generate(ctx)
    others = each("keygen: other parties (sum)", list(range(n - 1)),
                  lambda _: ckks.PartyKeys.generate(ctx, lead.public_key_share))
    parties = [lead, *others]
    with timed("keygen: server MultiAddPubKeys"):
        joint = col.aggregate_public_key(ctx, [p.public_key_share for p in parties])
    with timed("relin r1: lead share"):
        lead_share = lead.relin_share()
    rest = each("relin r1: other shares (sum)", others, lambda p: p.relin_share(lead_share))
    with timed("relin r1: server aggregate"):
        round1 = col.aggregate_relin_round1(ctx, joint, [lead_share, *rest])
    round2 = each("relin r2: shares (sum)", parties, lambda p: p.relin_mult_share(round1))
    with timed("relin r2: server aggregate"):
        relin = col.aggregate_relin_round2(ctx, joint, round2)
    with timed("relin: install"):
        ctx.install_relin_key(relin, joint.tag)
    print(f"  sizes: public key {len(ctx.to_bytes(joint.public_key)) / 1e6:.1f} MB, "
          f"relin share {len(ctx.to_bytes(round2[0])) / 1e6:.1f} MB")
    return parties, joint


def decrypt(ctx, joint, parties, ct, n: int, label: str) -> np.ndarray:
    shares = each(f"{label}: shares (sum)", parties, lambda p: p.decrypt_share(ct))
    with timed(f"{label}: server fusion"):
        return col.fuse_decryption(ctx, joint, ct, shares, n)


def bootstrap(ctx, joint, parties, ct):
    with timed("bootstrap: server adjust + random element"):
        rnd = col.start_bootstrap(ctx, joint, ct)
    shares = each("bootstrap: shares (sum)", parties, lambda p: p.boot_share(rnd.c1, rnd.a))
    with timed("bootstrap: server add + encrypt"):
        return col.finish_bootstrap(ctx, joint, rnd,
                                    col.aggregate_boot_shares(ctx, joint, rnd, shares))


def decryption_errors(ctx, joint, parties) -> None:
    x = np.random.default_rng(1).uniform(-1, 1, ctx.slots)
    ct = ctx.encrypt(joint.public_key, x)
    fresh = ckks.decrypt_locally(ctx, joint, parties, ct, ctx.slots)
    doubled = ckks.decrypt_locally(ctx, joint, parties, ctx.double_scale(ct), ctx.slots)
    raw = [p._sk for p in parties]  # probe only: the uncompressed shares, for comparison
    full = [ctx.raw.MultipartyDecryptLead([ct], raw[0])[0]] + [
        ctx.raw.MultipartyDecryptMain([ct], sk)[0] for sk in raw[1:]]
    uncompressed = ctx.decode(ctx.raw.MultipartyDecryptFusion(full), ctx.slots)
    print(f"  decrypt |err| max, x in [-1,1], P={len(parties)}: scale 2^50 "
          f"{np.abs(fresh - x).max():.2e} (uncompressed shares "
          f"{np.abs(uncompressed - x).max():.2e}),"
          f" doubled scale {np.abs(doubled - x).max():.2e}")
    print(f"  share bytes: full {len(ctx.to_bytes(full[1])) / 1e6:.2f} MB, "
          f"compressed {len(ctx.to_bytes(parties[1].decrypt_share(ct))) / 1e6:.2f} MB")


async def inverse_errors(ctx, joint, parties) -> None:
    x = np.geomspace(*ckks.COUNT_RANGE, ctx.slots)
    ct = ctx.encrypt(joint.public_key, x)
    for out_scale in (1.0, ckks.COUNT_RANGE[1]):
        refresh = ckks.local_refresh(ctx, joint, parties)
        with timed(f"inverse [1, 2^20], out_scale={out_scale:g}"):
            out = await ckks.inverse(ctx, ct, *ckks.COUNT_RANGE, refresh, out_scale=out_scale)
        bands = []
        for e in (5, 10, 15, 20):  # one decryption per band: decoding noise follows the
            band = (x <= 2.0**e) & (x > 2.0**(e - 5))  # largest slot, so keep them apart
            check = ckks.decrypt_locally(ctx, joint, parties,
                                         ctx.mul(out, np.where(band, x / out_scale, 0.0)),
                                         ctx.slots)
            bands.append((e, np.abs(check[band] - 1).max()))
        text = ", ".join(f"(2^{e - 5}, 2^{e}]: {err:.1e}" for e, err in bands)
        print(f"  inverse out_scale={out_scale:g}: {refresh.calls} bootstraps, max rel err "
              f"{max(err for _, err in bands):.2e} ({text})")
    print(f"  plan: {ckks.plan_inverse(ctx.level_budget)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--errors-only", action="store_true")
    args = parser.parse_args()
    ctx = ckks.CkksContext(args.preset)
    print(f"preset {args.preset}: ring {ctx.preset.ring_dim}, depth {ctx.depth}, "
          f"budget {ctx.level_budget}, P={args.parties}")
    parties, joint = setup(ctx, args.parties)
    decryption_errors(ctx, joint, parties)
    if not args.errors_only:
        x = np.random.default_rng(2).uniform(0, 1, ctx.slots)
        with timed("encrypt"):
            ct = ctx.encrypt(joint.public_key, x)
        with timed("mult ct x ct (fresh)"):
            sq = ctx.mul(ct, ct)
        with timed("mult ct x scalar"):
            ctx.mul(ct, 0.5)
        with timed("serialize + load ciphertext"):
            ctx.from_bytes("ciphertext", ctx.to_bytes(ct))
        fresh = bootstrap(ctx, joint, parties, sq)
        decrypt(ctx, joint, parties, fresh, ctx.slots, "decrypt")
    trio.run(inverse_errors, ctx, joint, parties)
    print(f"\n{'step':48s} {'wall s':>8s} {'cpu s':>8s}")
    for label, wall, cpu in ROWS:
        print(f"{label:48s} {wall:8.3f} {cpu:8.3f}")


if __name__ == "__main__":
    main()
