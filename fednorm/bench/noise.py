"""Noise of collective decryption, of the encrypted inverse and of PPF z-score's quotients.

:func:`noise_probe` measures the collective-decryption error (fresh, uncompressed shares,
doubled scale, as :meth:`~fednorm.engine.ckks.Decryption.prepare` prepares it, flooded
sums), the inverse's relative error per octave band, the error of an encrypted quotient
as PPF z-score forms it, and the two passes of a real PPF z-score run (what its server's
decryptions revealed, read from a :class:`~fednorm.bench.timeline.Timeline` tracer).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fednorm.bench.inputs import col_context, synthetic_split
from fednorm.bench.measure import Section, finish, load_average, now, sci, section_meta
from fednorm.bench.timeline import Timeline
from fednorm.bench.zscore import run_ppf_zscore
from fednorm.engine import ckks
from fednorm.engine.clock import run_trio


def prepare_decryption(ctx: ckks.CkksContext, ct):
    """What the server does to a ciphertext before it asks for decryption shares."""
    return ckks.Decryption(ctx).prepare(ct)


def noise_probe(preset: str = "paper", parties: int = 10, command: str = "") -> Section:
    """Collective-decryption error (fresh / uncompressed shares / doubled scale) and the
    inverse's relative error per octave band, for both output scalings."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    ctx = col_context(preset)
    keys, joint = ckks.setup_locally(ctx, parties)
    x = np.random.default_rng(1).uniform(-1, 1, ctx.slots)
    rows = _decryption_noise(ctx, joint, keys, x)
    rows += _flooded_sum_noise(ctx, joint, keys, x)
    rows += _inverse_noise(ctx, joint, keys)
    rows += _quotient_noise(ctx, joint, keys)
    cells = [[r["what"], sci(r.get("max_abs_error", float("nan"))),
              sci(r.get("max_rel_error", float("nan")))] for r in rows]
    coarse_rows, coarse_cells = _coarse_pass(preset, parties)
    rows += coarse_rows
    plan = ckks.plan_inverse(ctx.level_budget)
    notes = [f"Preset `{preset}`, P={parties}. Decryption: x uniform in [-1, 1] in every "
             f"slot. Inverse: x = geomspace(1, 2^20) over all slots, one decryption per "
             f"octave band (decoding noise follows the largest slot). Plan: {plan}.",
             "Quotient rows: numerator 1.4e-4 and count 569 in 30 slots (a small-valued "
             "variance numerator), the product formed as PPF z-score forms "
             "it (numerator x 1/max_count, then x the encrypted max_count/n) and with "
             "1/max_count applied last; the inverse's input with the unused count slots "
             "left at 0 (as the protocol does) or set to 1.",
             "Coarse-pass rows: one PPF z-score run (`--algorithm paper`, hidden count) on "
             "small-valued data (seed 0), "
             "the values each of the server's decryptions revealed, read from its tracer "
             "hooks; 'precise quotient' is the magnitude the second pass actually works at "
             "(the design aims at 2^16)."]
    return finish(Section("noise", "Noise of collective decryption and the inverse", rows,
                           [("", ["measurement", "max abs. error", "max rel. error"],
                             cells),
                            ("PPF z-score's two passes on small-valued data.",
                             ["quantity", "mean", "variance"], coarse_cells)],
                           notes, meta), t0)


def _decryption_noise(ctx, joint, keys, x: np.ndarray) -> list[dict[str, Any]]:
    """The error of a collective decryption of ``x`` as fresh, with uncompressed shares,
    at doubled scale, as ``ServerCrypto.decrypt`` prepares it, and compressed first."""
    ct = ctx.encrypt(joint.public_key, x)
    fresh = ckks.decrypt_locally(ctx, joint, keys, ct, ctx.slots)
    doubled = ckks.decrypt_locally(ctx, joint, keys, ctx.double_scale(ct), ctx.slots)
    prepared = ckks.decrypt_locally(ctx, joint, keys, prepare_decryption(ctx, ct), ctx.slots)
    three = ctx.double_scale(ctx.raw.Compress(ct, 3))  # compress first, then double
    compress_then_double = ckks.decrypt_locally(ctx, joint, keys, three, ctx.slots)
    raw = [k._sk for k in keys]  # probe only: uncompressed shares, for comparison
    full = [ctx.raw.MultipartyDecryptLead([ct], raw[0])[0]] + [
        ctx.raw.MultipartyDecryptMain([ct], sk)[0] for sk in raw[1:]]
    uncompressed = ctx.decode(ctx.raw.MultipartyDecryptFusion(full), ctx.slots)
    return [{"what": name, "max_abs_error": float(np.abs(got - x).max())}
            for name, got in (
                ("decrypt, scale 2^50, shares compressed", fresh),
                ("decrypt, scale 2^50, shares uncompressed", uncompressed),
                ("decrypt, doubled scale", doubled),
                ("decrypt as ServerCrypto.decrypt (doubled, request compressed)", prepared),
                ("decrypt, request compressed to 3 towers, then scale doubled "
                 f"({len(ctx.to_bytes(three)) / 1e6:.2f} MB request, vs "
                 f"{len(ctx.to_bytes(prepare_decryption(ctx, ct))) / 1e6:.2f} MB)",
                 compress_then_double))]


def _inverse_noise(ctx, joint, keys) -> list[dict[str, Any]]:
    """The encrypted inverse's relative error per octave band of [1, 2^20], for both
    output scalings (one decryption per band: decoding noise follows the largest slot)."""
    counts = np.geomspace(*ckks.COUNT_RANGE, ctx.slots)
    ct = ctx.encrypt(joint.public_key, counts)
    hi = ckks.COUNT_RANGE[1]
    rows = []
    for out_scale in (1.0, hi):
        refresh = ckks.local_refresh(ctx, joint, keys)
        out = run_trio(functools.partial(ckks.inverse, ctx, ct, *ckks.COUNT_RANGE, refresh,
                                         out_scale=out_scale))
        for e in (5, 10, 15, 20):
            band = (counts <= 2.0**e) & (counts > 2.0**(e - 5))
            check = ckks.decrypt_locally(
                ctx, joint, keys, ctx.mul(out, np.where(band, counts / out_scale, 0.0)),
                ctx.slots)
            rows.append({"what": f"inverse, out_scale={out_scale:g}, x in (2^{e - 5}, 2^{e}]",
                         "max_rel_error": float(np.abs(check[band] - 1).max()),
                         "bootstraps": refresh.calls})
    return rows


def _flooded_sum_noise(ctx, joint, keys, x: np.ndarray) -> list[dict[str, Any]]:
    """A sum of every party's upload of x, decrypted with flooded shares (s = 30) twice:
    the error, and how far the two decryptions lie apart (the flooding the server sees
    instead of the ciphertext's noise; OpenFHE's decoder adds a randomized rounding)."""
    total = ctx.encrypt_sum(joint.public_key, x)
    for _ in keys[1:]:
        total = ctx.add(total, ctx.encrypt_sum(joint.public_key, x))
    flooding = ckks.Flooding(ctx.preset.ring_dim, len(keys), len(keys))
    decryption = ckks.SumDecryption(ctx, flooding)

    def decrypt() -> np.ndarray:
        shares = [decryption.generate_share(k, total) for k in keys]
        return decryption.finalize(decryption.aggregate_shares(joint, total, shares),
                                   ctx.slots)

    first, second = decrypt(), decrypt()
    per_share = flooding.slot_sigma(total.GetScalingFactor())
    return [{"what": "flooded sum decryption (s=30, scale 2^100), error",
             "max_abs_error": float(np.abs(first - len(keys) * x).max())},
            {"what": f"flooded sum decryption, two decryptions apart (std; flooding "
                     f"sigma {per_share:.2g} per share and slot)",
             "max_abs_error": float(np.std(first - second))}]


def _quotient_noise(ctx, joint, keys) -> list[dict[str, Any]]:
    """Error of numerator / count formed under encryption, as the protocol forms it and
    with 1/max_count applied after the product; zero- or one-padded count slots."""
    width, hi = 30, ckks.COUNT_RANGE[1]
    numerator, counts = np.full(width, 1.4e-4), np.full(width, 569.0)
    want = numerator / counts
    num_ct = ctx.encrypt(joint.public_key, numerator)
    rows = []
    for pad_name, pad in (("unused count slots 0", 0.0), ("unused count slots 1", 1.0)):
        padded = np.concatenate([counts, np.full(ctx.slots - width, pad)])
        refresh = ckks.local_refresh(ctx, joint, keys)
        inv = run_trio(functools.partial(
            ckks.inverse, ctx, ctx.encrypt(joint.public_key, padded), 1.0, hi, refresh,
            out_scale=hi, keep_levels=2))
        for order, ct in (("1/max_count first (as the protocol)",
                           ctx.mul(ctx.mul(num_ct, 1.0 / hi), inv)),
                          ("1/max_count last", ctx.mul(ctx.mul(num_ct, inv), 1.0 / hi))):
            got = ckks.decrypt_locally(ctx, joint, keys, prepare_decryption(ctx, ct), width)
            rows.append({"what": f"quotient 2.5e-7 = 1.4e-4 / 569, {order}, {pad_name}",
                         "max_abs_error": float(np.abs(got - want).max()),
                         "max_rel_error": float(np.abs(got - want).max() / want[0])})
        if pad:  # the same, decrypted at the doubled scale without compressing the request
            got = ckks.decrypt_locally(ctx, joint, keys, ctx.double_scale(ct), width)
            rows.append({"what": f"quotient, 1/max_count last, {pad_name}, decryption "
                                 "request not compressed (doubled scale only)",
                         "max_abs_error": float(np.abs(got - want).max()),
                         "max_rel_error": float(np.abs(got - want).max() / want[0])})
    return rows


def _coarse_pass(preset: str, parties: int) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """One PPF z-score run (the paper's algorithm, hidden count) on small-valued data: the
    server's decryptions, in order, are the presence bits (a flooded product), then the
    mean's and the variance's coarse and precise passes."""
    parts, X = synthetic_split("small", 0, parties)
    timeline = Timeline()
    result, _ = run_ppf_zscore(parts, preset, "inverse", timeline)
    if len(timeline.revealed) != 5:
        raise RuntimeError(f"expected 5 decryptions in PPF z-score (presence, two passes "
                           f"each of mean and variance), saw {len(timeline.revealed)}")
    seen = timeline.revealed[1:]
    mean_coarse, mean_precise, var_coarse, var_precise = seen
    truth = {"mean": X.mean(axis=0), "var": X.var(axis=0)}
    final = {"mean": result.normalizer.mean, "var": result.normalizer.var}
    row = {"what": "coarse pass", "preset": preset}
    cells = [["true value (median over features)"], ["coarse pass: max abs. error"],
             ["coarse pass: max rel. error"], ["precise quotient, magnitude (min–max)"],
             ["final: max rel. error"]]
    for name, coarse, precise in (("mean", mean_coarse, mean_precise),
                                  ("var", var_coarse, var_precise)):
        abs_err = float(np.abs(coarse - truth[name]).max())
        rel = float(np.max(np.abs(final[name] - truth[name]) / np.abs(truth[name])))
        row |= {f"{name}_coarse_abs_error": abs_err, f"{name}_final_rel_error": rel,
                f"{name}_precise_min": float(np.abs(precise).min()),
                f"{name}_precise_max": float(np.abs(precise).max())}
        cells[0].append(sci(float(np.median(truth[name]))))
        cells[1].append(sci(abs_err))
        cells[2].append(sci(float(np.max(np.abs(coarse - truth[name]) /
                                         np.abs(truth[name])))))
        cells[3].append(f"{np.abs(precise).min():.3g}–{np.abs(precise).max():.3g}")
        cells[4].append(sci(rel))
    return [row], cells


