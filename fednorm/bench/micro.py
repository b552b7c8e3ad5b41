"""The primitives beside Table IV (and its 20/30/50-party supplements), and wire sizes.

Collective operations are timed share by share in one process, so their time is the sum
over all parties plus the server, as the paper's figures are.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednorm.bench.inputs import col_context
from fednorm.bench.measure import (
    Sample,
    Section,
    finish,
    fmt_ms,
    fmt_or_dash,
    foreign_load,
    load_average,
    measure,
    median,
    now,
    section_meta,
    step,
)
from fednorm.bench.noise import prepare_decryption
from fednorm.bench.paper import PAPER_TABLE_IV_MS, PAPER_TABLE_IV_NAMES
from fednorm.engine import ckks
from fednorm.engine.ckks import multiparty as col
from fednorm.engine.clock import run_trio


# -- Table IV: primitives at P parties ---------------------------------------------------
@dataclass
class OpSamples:
    """Samples of one primitive: totals, plus party-side and server-side parts."""

    total: list[Sample] = field(default_factory=list)
    party_each: list[float] = field(default_factory=list)  # one party's share, seconds
    server: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def _keygen(ctx: ckks.CkksContext, n: int, ops: dict[str, OpSamples]
            ) -> tuple[list[ckks.PartyKeys], ckks.JointKeys]:
    """Collective key generation, every share timed on its own."""
    keys, per_party = [], []
    lead, s = measure(lambda: ckks.PartyKeys.generate(ctx))
    keys.append(lead)
    per_party.append(s)
    for _ in range(n - 1):
        k, s = measure(lambda: ckks.PartyKeys.generate(ctx, lead.public_key_share))
        keys.append(k)
        per_party.append(s)
    public = col.PublicKeyGen(ctx)
    joint, fold = measure(lambda: public.finalize(public.aggregate_shares(
        [public.generate_share(p) for p in keys])))
    ops["skgen"].total += per_party
    ops["pkgen"].total.append(sum(per_party, Sample()) + fold)
    ops["pkgen"].party_each += [s.wall for s in per_party]
    ops["pkgen"].server.append(fold.wall)

    share_time = [Sample() for _ in keys]
    relin_gen = col.RelinKeyGen(ctx)
    lead_share, s = measure(lambda: relin_gen.generate_share(lead))
    share_time[0] += s
    round1 = [lead_share]
    for i, party in enumerate(keys[1:], 1):
        share, s = measure(lambda p=party: relin_gen.generate_share(p, 1, lead_share))
        round1.append(share)
        share_time[i] += s
    agg1, s1 = measure(lambda: relin_gen.aggregate_shares(joint, round1))
    round1.clear()
    round2 = []
    for i, party in enumerate(keys):
        share, s = measure(lambda p=party: relin_gen.generate_share(p, 2, agg1))
        round2.append(share)
        share_time[i] += s
    relin, s2 = measure(lambda: relin_gen.aggregate_shares(joint, round2))
    round2.clear()
    _, s3 = measure(lambda: relin_gen.finalize(joint, relin))
    ops["relkgen"].total.append(sum(share_time, Sample()) + s1 + s2 + s3)
    ops["relkgen"].party_each += [s.wall for s in share_time]
    ops["relkgen"].server.append(s1.wall + s2.wall + s3.wall)
    return keys, joint


def _decrypt(ctx, joint, keys, ct, ops: dict[str, OpSamples]) -> None:
    ct, prep = measure(lambda: prepare_decryption(ctx, ct))
    decryption = col.Decryption(ctx)
    shares, times = [], []
    for party in keys:
        share, s = measure(lambda p=party: decryption.generate_share(p, ct))
        shares.append(share)
        times.append(s)
    _, fuse = measure(lambda: decryption.finalize(
        decryption.aggregate_shares(joint, ct, shares), ctx.slots))
    ops["decrypt"].total.append(sum(times, Sample()) + prep + fuse)
    ops["decrypt"].party_each += [s.wall for s in times]
    ops["decrypt"].server.append(prep.wall + fuse.wall)


def _bootstrap(ctx, joint, keys, ct, ops: dict[str, OpSamples]) -> None:
    boot = col.Bootstrap(ctx)
    rnd, start = measure(lambda: boot.prepare(joint, ct, next(_BOOTSTRAP_INDEX)))
    shares, times = [], []
    for party in keys:
        share, s = measure(lambda p=party: boot.generate_share(p, joint.public_key, rnd.c1,
                                                               rnd.index))
        shares.append(share)
        times.append(s)
    _, finish = measure(lambda: boot.finalize(joint, rnd,
                                              boot.aggregate_shares(joint, rnd, shares)))
    ops["bootstrap"].total.append(sum(times, Sample()) + start + finish)
    ops["bootstrap"].party_each += [s.wall for s in times]
    ops["bootstrap"].server.append(start.wall + finish.wall)


class _TimedRefresh:
    """An in-process collective bootstrap for the inverse that times itself."""

    def __init__(self, ctx, joint, keys) -> None:
        self.args = (ctx, joint, keys)
        self.seconds = 0.0
        self.calls = 0

    async def __call__(self, ct):
        t = time.perf_counter()
        out = ckks.bootstrap_locally(*self.args, ct)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out


def _inverse(ctx, joint, keys, ct, ops: dict[str, OpSamples]) -> None:
    refresh = _TimedRefresh(ctx, joint, keys)
    hi = ckks.COUNT_RANGE[1]
    _, s = measure(lambda: run_trio(functools.partial(
        ckks.inverse, ctx, ct, 1.0, hi, refresh, out_scale=hi, keep_levels=2)))
    ops["inv"].total.append(s)
    ops["inv"].server.append(s.wall - refresh.seconds)
    ops["inv"].extra["bootstraps"].append(refresh.calls)
    ops["inv"].extra["bootstrap_s"].append(refresh.seconds)


def primitives_at(ctx: ckks.CkksContext, n: int, repeats: int, fast: int,
                  slow: int) -> dict[str, OpSamples]:
    """Time every Table IV primitive with ``n`` parties."""
    ops: dict[str, OpSamples] = defaultdict(OpSamples)
    for _ in range(repeats):
        keys, joint = _keygen(ctx, n, ops)
    rng = np.random.default_rng(n)
    values = [rng.uniform(-1, 1, ctx.slots) for _ in range(2)]
    for _ in range(fast):
        _, s = measure(lambda: ctx.encrypt(joint.public_key, values[0]))
        ops["encrypt"].total.append(s)
    a, b = (ctx.encrypt(joint.public_key, v) for v in values)
    for _ in range(fast):
        ops["mul"].total.append(measure(lambda: ctx.mul(a, b))[1])
        ops["sum"].total.append(measure(lambda: ctx.add(a, b))[1])
    deep = a  # bootstrap input at the level budget, as the inverse hands it over
    while ctx.consumed(deep) < ctx.level_budget:
        deep = ctx.mul(deep, 1.0)
    counts = ctx.encrypt(joint.public_key, np.geomspace(*ckks.COUNT_RANGE, ctx.slots))
    for _ in range(slow):
        _decrypt(ctx, joint, keys, a, ops)
        _bootstrap(ctx, joint, keys, deep, ops)
    for _ in range(repeats):
        _inverse(ctx, joint, keys, counts, ops)
    return ops


_PARTY_INDEPENDENT = {"skgen", "encrypt", "mul", "sum"}
_BOOTSTRAP_INDEX = itertools.count()  # a fresh common random element per bootstrap


def table_iv(parties: tuple[int, ...] = (10, 20, 30, 50), repeats: int = 3, fast: int = 9,
             slow: int = 5, preset: str = "paper", command: str = "") -> Section:
    """Table IV and its 20/30/50-party supplements, measured here."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    ctx = col_context(preset)
    rows = []
    for n in parties:
        load_1m = os.getloadavg()[0]
        t_n = time.perf_counter()
        ops = primitives_at(ctx, n, repeats, fast, slow)
        step(f"Table IV P={n}", time.perf_counter() - t_n)
        for key in PAPER_TABLE_IV_NAMES:
            samples = ops[key]
            walls = [s.wall for s in samples.total]
            paper = PAPER_TABLE_IV_MS.get(n, {}).get(key, float("nan")) / 1e3
            row = {
                "op": key, "name": PAPER_TABLE_IV_NAMES[key], "parties": n, "preset": preset,
                "median_s": median(walls), "min_s": min(walls), "max_s": max(walls),
                "samples": len(walls),
                "cpu_over_wall": sum(s.cpu for s in samples.total) / sum(walls),
                "foreign_load": foreign_load(samples.total), "load_1m": load_1m,
                "party_each_s": median(samples.party_each),
                "server_s": median(samples.server), "paper_s": paper,
                "speedup": paper / median(walls),
            }
            for name, values in samples.extra.items():
                row[name] = median(values)
            rows.append(row)
    return finish(_table_iv_section(rows, parties, repeats, fast, slow, preset, meta,
                                     ctx.slots), t0)


def _table_iv_section(rows, parties, repeats, fast, slow, preset, meta, slots) -> Section:
    by = {(r["op"], r["parties"]): r for r in rows}
    header = ["operation (ms)", *(f"P={n} {who}" for n in parties for who in ("ours", "paper"))]
    cells = [[name, *(fmt_ms(by[key, n][col]) for n in parties for col in ("median_s", "paper_s"))]
             for key, name in PAPER_TABLE_IV_NAMES.items()]
    inv = [r for r in rows if r["op"] == "inv"]
    notes = [
        f"Preset `{preset}`. Per P: collective key generation {repeats} times (T_skgen: every "
        f"party's key generation is one sample), encryption / multiplication / addition "
        f"{fast} times, collective decryption and bootstrap {slow} times, the inverse "
        f"{repeats} times; medians of wall-clock time. Collective operations run every "
        "party's share and the server's aggregation one after another in one process, so "
        "their time is the sum over all parties plus the server (as the paper's figures).",
        TABLE_IV_DEFINITIONS.format(slots=slots),
        "The inverse: " + "; ".join(
            f"P={r['parties']}: {r.get('bootstraps', 0):.0f} bootstraps taking "
            f"{r.get('bootstrap_s', 0):.1f} s of {r['median_s']:.1f} s" for r in inv)
        + ". The paper's Goldschmidt inverse needs 13 (K_inv in Section VI-A).",
        "The paper measured on a 6-core/12-thread i5-12400F with Lattigo; `paper / ours` > 1 "
        "means faster here. Its T_skgen, T_encrypt, T_mul and T_sum are the same at every P "
        "(no collaboration); ours are measured again at each P.",
    ]
    title = "Table IV — microbenchmarks at " + ", ".join(str(n) for n in parties) + " parties"
    return Section("table_iv", title,
                   rows, [("", header, cells),
                          ("Details.", TABLE_IV_DETAIL_HEADER, [_detail_cells(r) for r in rows])],
                   notes, meta)


TABLE_IV_DETAIL_HEADER = ["P", "operation", "median ms", "range ms", "samples",
                          "one party's share ms", "server ms", "paper ms", "paper / ours",
                          "cpu/wall", "foreign load", "load 1-min"]


def _detail_cells(r: dict[str, Any]) -> list[str]:
    """One measured operation as the cells of :data:`TABLE_IV_DETAIL_HEADER` (a party's
    share and the server's part only where the operation has them)."""
    party = "–" if r["op"] in _PARTY_INDEPENDENT | {"inv"} else fmt_ms(r["party_each_s"])
    server = fmt_ms(r["server_s"]) if r["op"] not in _PARTY_INDEPENDENT | {"skgen"} else "–"
    return [str(r["parties"]), r["op"], fmt_ms(r["median_s"]),
            f"{fmt_ms(r['min_s'])}–{fmt_ms(r['max_s'])}", str(r["samples"]), party, server,
            fmt_ms(r["paper_s"]), fmt_or_dash(r["speedup"], ".2f"), f"{r['cpu_over_wall']:.2f}",
            f"{r['foreign_load']:.2f}", f"{r['load_1m']:.2f}"]


TABLE_IV_DEFINITIONS = (
    "Definitions. T_skgen: one party's key generation — OpenFHE makes the secret key "
    "and its public-key share in one call (`KeyGen` for the lead, "
    "`MultipartyKeyGen` for the others), so this includes the public-key share. "
    "T_pkgen: all P key generations plus the server's fold (`MultiAddPubKeys`). "
    "T_relkgen: both rounds of relinearization-key shares for all P parties plus the "
    "server's two folds and installing the key. T_encrypt: a full vector "
    "({slots} slots) under the joint key. T_decrypt: as `ServerCrypto.decrypt` does "
    "it, on a fresh ciphertext: the server doubles the scale and compresses the "
    "ciphertext to the share's towers, P parties make decryption shares, the server "
    "fuses and decodes. T_mul: ct x ct with relinearization, fresh inputs. T_sum: ct + ct. "
    "T_bootstrap: the interactive bootstrap of a ciphertext at the level budget "
    "(server adjust + common random element, P shares, server aggregation and "
    "re-encryption). T_inv: `ckks.inverse` of counts in [1, 2^20] as PPF z-score "
    "calls it (out_scale 2^20, keep_levels 2), its collective bootstraps included.")
"""Table IV's definitions of the paper's operations, as measured here."""


def wire_sizes(preset: str = "paper", parties: int = 3, command: str = "") -> Section:
    """Bytes of each object the protocols send (independent of P)."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    ctx = col_context(preset)
    keys, joint = ckks.setup_locally(ctx, parties)
    ct = ctx.encrypt(joint.public_key, np.ones(ctx.slots))
    deep = ct
    while ctx.consumed(deep) < ctx.level_budget:
        deep = ctx.mul(deep, 1.0)
    rnd = col.Bootstrap(ctx).prepare(joint, deep, next(_BOOTSTRAP_INDEX))
    h0, h1 = keys[1].boot_share(rnd.c1, rnd.a)
    lead_relin = keys[0].relin_share()
    items = {
        "ciphertext, fresh (the paper's c)": ct,
        "ciphertext at the level budget": deep,
        "public-key share / joint public key": joint.public_key,
        "relinearization share, round 1": keys[1].relin_share(lead_relin),
        "decryption share (compressed)": keys[1].decrypt_share(ct),
        "bootstrap request: c1 + a": (rnd.c1, rnd.a),
        "bootstrap share: h0 + h1": (h0, h1),
    }
    rows, cells = [], []
    for name, obj in items.items():
        objs = obj if isinstance(obj, tuple) else (obj,)
        size = sum(len(ctx.to_bytes(o)) for o in objs)
        rows.append({"object": name, "bytes": size})
        cells.append([name, f"{size / 1e6:.2f}"])
    return finish(Section("sizes", "Wire sizes of CKKS objects", rows,
                           [("", ["object", "MB"], cells)],
                           [f"Preset `{preset}`, framed as sent (fednorm header + OpenFHE "
                            "BINARY serialization)."], meta), t0)


