"""Runtime vs ε of PPF k-th (paper Algorithm 4, the supplementary figure).

The search runs through the protocol's own entry points (:mod:`fednorm.protocols.ppf.
kth`: the pooled count n_g, then the encrypted search), so the benchmark measures the
messages PPF robust really sends; the search's time is the server's ``kth`` phase, read
from its tracer hooks (:class:`~fednorm.bench.timeline.Timeline`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednorm.bench.inputs import bcw_split
from fednorm.bench.measure import (
    Section,
    finish,
    foreign_load,
    load_average,
    median,
    now,
    sci,
    section_meta,
    step,
)
from fednorm.bench.oracle import estimate_errors
from fednorm.bench.protocols import RunRecord, run_protocol
from fednorm.bench.timeline import Timeline
from fednorm.engine.runtime import RoleContext
from fednorm.protocols import FitOptions
from fednorm.protocols.base import Protocol, feature_counts
from fednorm.protocols.collective import setup_party, setup_server
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.ppf import kth as ppf_kth
from fednorm.protocols.quantiles import plan_quantiles
from fednorm.protocols.rank import SortedColumns, probe_limit, start_search
from fednorm.protocols.rank_rounds import options_probes

MEDIAN = (0.5,)  # the k-th timing searches the median alone


@dataclass
class KthRounds:
    """Search rounds the server of :func:`kth_protocol` took."""

    rounds: int = 0


def kth_protocol(low: np.ndarray, high: np.ndarray, found: KthRounds) -> Protocol:
    """PPF k-th (Algorithm 4) of the median alone, on public bounds [low, high], driven
    through the protocol's own entry points (:mod:`fednorm.protocols.ppf.kth`).

    Algorithm 4 takes the bounds as inputs (Algorithm 3 gets them from PPF MinMax); here
    they are given, so the run times the search itself: key generation without a
    relinearization key (the search never multiplies ciphertexts), the pooled count n_g,
    then one encrypted count per party and one collective decryption per round.
    """

    async def server(rc: RoleContext, options: FitOptions) -> RobustNormalizer:
        crypto = await setup_server(rc, options.preset, relinearize=False)
        count = await ppf_kth.reveal_pooled_counts(crypto)
        plan = plan_quantiles(count, MEDIAN, options.quantile_rule)
        search = start_search(plan, count, low, high, options,
                              max_points=ppf_kth.probe_capacity(crypto, count))
        values = await ppf_kth.kth_server(crypto, search, count)
        found.rounds = search.rounds
        median = plan.combine(values)[0]
        return RobustNormalizer(q1=median, median=median, q3=median)

    async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> RobustNormalizer:
        crypto = await setup_party(rc, options.preset, relinearize=False)
        count = await ppf_kth.share_pooled_counts(crypto, feature_counts(X))
        limit = probe_limit(options_probes(options), MEDIAN)
        await ppf_kth.kth_party(crypto, SortedColumns(X, limit), count)
        nothing = np.full(X.shape[1], np.nan)
        return RobustNormalizer(q1=nothing, median=nothing, q3=nothing)

    return Protocol.single("kth-mhe", "robust", "mhe", server, party)


def _kth_run(parts: list[np.ndarray], pooled: np.ndarray, low: np.ndarray, high: np.ndarray,
             eps: float, preset: str, widest: float) -> RunRecord:
    """One measured search at ``eps``: its rounds, the server's time in it, its errors
    against numpy and the paper's round count X for the widest feature."""
    found, timeline = KthRounds(), Timeline()
    result, rec = run_protocol(kth_protocol(low, high, found), "kth", parts,
                               FitOptions(preset=preset, epsilon=eps), timeline)
    rec.errors, rec.abs_errors = estimate_errors("kth", result.normalizer, pooled)
    rec.extra = {"epsilon": eps, "error_over_epsilon": rec.abs_errors["median"] / eps,
                 "kth_s": timeline.inclusive.get("kth", 0.0), "kth_rounds": found.rounds,
                 "paper_x": math.ceil(math.log2(widest / eps))}
    return rec


def _kth_row(eps: float, recs: list[RunRecord]) -> dict[str, Any]:
    """One ε's row: medians over its runs, its worst errors."""
    row = {"epsilon": eps, "kth_s": median([r.extra["kth_s"] for r in recs]),
           "total_s": median([r.seconds for r in recs]),
           "rounds": recs[0].extra["kth_rounds"], "paper_x": recs[0].extra["paper_x"],
           "bytes_protocol": recs[0].bytes_protocol,
           "foreign_load": foreign_load([r.sample for r in recs]),
           "median_rel_error": max(r.errors["median"] for r in recs),
           "error_over_epsilon": max(r.extra["error_over_epsilon"] for r in recs)}
    row["s_per_round"] = row["kth_s"] / max(row["rounds"], 1)
    return row


def kth_vs_epsilon(epsilons: Sequence[float], parties: int = 10, preset: str = "paper",
                   repeats: int = 1, command: str = "",
                   parts: list[np.ndarray] | None = None) -> tuple[Section, list[RunRecord]]:
    """Runtime and rounds of the PPF k-th search against ε (the paper's supplementary
    figure), on BCW over ``parties`` unless ``parts`` are given."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    data = "BCW"
    if parts is None:
        parts, pooled = bcw_split(parties)
    else:
        parts, pooled, data = list(parts), np.vstack(parts), "the given data"
        parties = len(parts)
    low, high = np.nanmin(pooled, axis=0), np.nanmax(pooled, axis=0)
    widest = float(np.max(high - low))
    records = []
    for rep in range(repeats):
        for eps in epsilons:
            records.append(_kth_run(parts, pooled, low, high, eps, preset, widest))
            step(f"k-th ε={eps:g} run {rep + 1}/{repeats}: "
                 f"{records[-1].extra['kth_rounds']} rounds", records[-1].seconds)
    rows = [_kth_row(eps, [r for r in records if r.extra["epsilon"] == eps])
            for eps in epsilons]
    cells = [[f"{row['epsilon']:g}", f"{row['kth_s']:.1f}", str(row["rounds"]),
              str(row["paper_x"]), f"{row['s_per_round']:.2f}",
              f"{row['total_s']:.1f}", f"{row['bytes_protocol'] / 1e6:.0f}",
              f"{row['error_over_epsilon']:.2f}", sci(row["median_rel_error"]),
              f"{row['foreign_load']:.2f}"] for row in rows]
    notes = [f"{data} over {parties} parties (IID, seed 0), preset `{preset}`, the median of "
             "every feature searched at once; bounds [min, max] of each feature given to "
             "the search (Algorithm 4's inputs; in PPF robust they come from PPF MinMax). "
             "'k-th s' is the server's time in the search (its `kth` sub-protocol, as its "
             "role context reports it); "
             "'total s' adds key generation and the encrypted pooled count. X = "
             f"⌈log2(max_j range_j / ε)⌉ with max_j range_j = {widest:.4g} is the paper's "
             "round count; ours stops a feature as soon as its bracket is narrower than ε. "
             "Errors of the medians against numpy: absolute (at most ε/2 by design, so the "
             "ratio stays ≤ 0.5) and relative (large for features whose values are small "
             "against an absolute ε)."]
    header = ["ε", "k-th s", "rounds", "paper's X", "s per round", "total s",
              "MB after key setup", "max abs. error / ε", "max rel. error", "foreign load"]
    section = Section("kth_epsilon", f"Runtime vs ε — PPF k-th element, {parties} parties",
                      rows, [("", header, cells)], notes, meta)
    return finish(section, t0), records
