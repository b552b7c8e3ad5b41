"""Whole PPF protocols: totals (Table V), precision (Table VI), scaling in P.

Runs are named by benchmark case (:data:`fednorm.bench.cases.CASES`: a method with
options, e.g. ``minmax`` and its ``--algorithm paper`` counterpart ``minmax_paper``).
Every run is one federation in this process (:func:`fednorm.sim.federation.run_federation`):
collective key generation, every party and the server, through the real codec. A run
records its wall and CPU time, rounds, and the bytes each role sent and received
(:class:`RunRecord`), so the same runs feed the communication section
(:mod:`fednorm.bench.communication`).

The oracle of every error is numpy (scikit-learn for Yeo-Johnson's λ, scipy for its
log-likelihood) on the pooled rows, never the library's own plaintext fit.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednorm.bench.cases import CASES, display_name, refusal, with_counterparts
from fednorm.bench.inputs import bcw_split, col_context
from fednorm.bench.measure import (
    Sample,
    Section,
    finish,
    fmt_or_dash,
    foreign_load,
    load_average,
    measure,
    median,
    met,
    now,
    section_meta,
    step,
)
from fednorm.bench.oracle import errors_text, estimate_errors
from fednorm.bench.paper import (
    TABLE_V_ROBUST_EPSILON,
)
from fednorm.bench.timeline import Timeline
from fednorm.engine.clock import run_trio
from fednorm.engine.runtime import SERVER, role_name
from fednorm.protocols import FitOptions, get_protocol
from fednorm.protocols.base import Protocol
from fednorm.sim.federation import SimulationResult, run_federation, worker_threads

SETUP_KINDS = frozenset({"ckks.lead_keys", "ckks.key_shares", "ckks.joint_round1",
                         "ckks.relin_round2", "ckks.setup_done"})
"""Message kinds of collective key generation (the paper's formulas leave it out)."""


# -- one run ------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """Time, traffic and errors of one federation run."""

    method: str  # the benchmark case (fednorm.bench.cases), or "kth"
    parties: int
    preset: str
    sample: Sample
    rounds: int
    bytes_total: int
    bytes_setup: int
    by_kind: dict[str, int]
    sent: dict[str, int]  # per role name
    received: dict[str, int]
    errors: dict[str, float] = field(default_factory=dict)  # relative, per statistic
    abs_errors: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.sample.wall

    @property
    def bytes_protocol(self) -> int:
        """Bytes after key generation: what the paper's communication formulas count."""
        return self.bytes_total - self.bytes_setup

    def role_bytes(self) -> dict[str, float]:
        """Server sent/received, and the median and largest party sent/received."""
        server = role_name(SERVER)
        parties = [r for r in self.sent if r != server]
        return {
            "server_sent": self.sent[server], "server_received": self.received[server],
            "party_sent_median": statistics.median(self.sent[r] for r in parties),
            "party_received_median": statistics.median(self.received[r] for r in parties),
            "party_sent_max": max(self.sent[r] for r in parties),
            "party_received_max": max(self.received[r] for r in parties),
        }

    def as_row(self) -> dict[str, Any]:
        return {"method": self.method, "parties": self.parties, "preset": self.preset,
                "seconds": self.seconds, "cpu_s": self.sample.cpu,
                "foreign_load": foreign_load([self.sample]), "rounds": self.rounds,
                "bytes_total": self.bytes_total, "bytes_setup": self.bytes_setup,
                "bytes_protocol": self.bytes_protocol, "by_kind": self.by_kind,
                **self.role_bytes(), "errors": self.errors, "abs_errors": self.abs_errors,
                **self.extra}


def record(method: str, preset: str, result: SimulationResult, sample: Sample) -> RunRecord:
    traffic = result.report.traffic
    by_kind: dict[str, int] = {}
    for stats in traffic.values():
        for kind, size in stats.by_kind.items():
            by_kind[kind] = by_kind.get(kind, 0) + size
    return RunRecord(
        method=method, parties=len(traffic) - 1, preset=preset, sample=sample,
        rounds=result.report.rounds, bytes_total=result.report.bytes_total,
        bytes_setup=sum(size for kind, size in by_kind.items() if kind in SETUP_KINDS),
        by_kind=by_kind, sent={r: s.bytes_sent for r, s in traffic.items()},
        received={r: s.bytes_received for r, s in traffic.items()})


def run_protocol(protocol: Protocol, method: str, parts: Sequence[np.ndarray],
                 options: FitOptions, timeline: Timeline | None = None
                 ) -> tuple[SimulationResult, RunRecord]:
    """One federation run of ``protocol``, measured (``timeline``: the server's phases and
    every role's calls); errors are filled in by the caller."""
    col_context(options.preset)  # context and codec warm-up stay outside the timing
    result, sample = measure(lambda: run_trio(lambda: run_federation(
        protocol, parts, options, timeout=None, tracer=timeline, party_tracer=timeline)))
    return result, record(method, options.preset, result, sample)


def run_case(name: str, parts: list[np.ndarray], pooled: np.ndarray, preset: str,
             **overrides: Any) -> RunRecord:
    """One measured run of benchmark case ``name`` (``overrides``: FitOptions fields
    replacing the case's, e.g. another ε), its errors against the oracle and its limit."""
    case = CASES[name]
    protocol = get_protocol(case.method, "mhe")
    timeline = Timeline()
    result, rec = run_protocol(protocol, name, parts,
                               case.fit_options(pooled, preset, **overrides), timeline)
    rec.errors, rec.abs_errors = estimate_errors(name, result.normalizer, pooled)
    cores = worker_threads()
    rec.extra["limit_s"] = timeline.limit_seconds(cores)
    beyond = timeline.beyond_limit(rec.sample.wall, rec.sample.cpu, cores)
    rec.extra.update({f"beyond_{cost}_core_s": s for cost, s in beyond.items()})
    return rec


def present_cases(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The cases this tree can run, and a note for each it cannot."""
    present, notes = [], []
    for name in names:
        why = refusal(name)
        if why is None:
            present.append(name)
        else:
            notes.append(f"{display_name(name)} (`{name}`): not measured — {why}.")
    return present, notes


def attempt(label: str, failures: list[str], run: Callable[[], RunRecord]
            ) -> RunRecord | None:
    """One measured run; a failure is noted (and counted as a step), not raised, so one
    broken protocol or an exhausted machine at one point costs only that point."""
    t = time.perf_counter()
    try:
        rec = run()
    except Exception as exc:  # reported in the section's notes, and in the log at once
        cause = f"{type(exc).__name__}: {exc}"
        failures.append(f"{label} failed after {time.perf_counter() - t:.0f} s: `{cause}`.")
        # The notes are written when the section ends; a process killed before that (the
        # OOM killer, 2026-11-29) would lose the cause, so the progress line names it.
        step(f"{label} FAILED: {cause[:300]}", time.perf_counter() - t)
        return None
    step(f"{label}, {rec.bytes_total / 1e6:.0f} MB", rec.seconds)
    return rec


# -- Table V: totals at P=10 --------------------------------------------------------------
TOTALS_HEADER = ["protocol, P={parties}", "algorithm", "median s", "runs s", "CPU s",
                 "rounds", "MB on the wire", "limit s", "total / limit",
                 "beyond the limit, core-s: serialization / idle", "paper s (Table V)",
                 "target s", "meets target", "× faster than `--algorithm paper`", "× paper",
                 "foreign load (cores)", "max error: relative (absolute)",
                 "error target met"]


def totals(cases: Sequence[str], repeats: int, parties: int = 10, preset: str = "paper",
           command: str = "") -> tuple[Section, list[RunRecord]]:
    """The benchmark ``cases`` on BCW (IID, ``parties``), each with the case it is compared
    with (a default algorithm beside its ``--algorithm paper`` case), interleaved run by
    run, so a ratio of medians compares runs under the same load."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    parts, pooled = bcw_split(parties)
    present, missing = present_cases(with_counterparts(cases))
    failures: list[str] = []
    runs: dict[str, list[RunRecord]] = {name: [] for name in present}
    for rep in range(repeats):
        for name in present:
            rec = attempt(f"Table V {display_name(name)} run {rep + 1}/{repeats}", failures,
                          functools.partial(run_case, name, parts, pooled, preset))
            runs[name] += [rec] if rec else []
    comparable = preset == "paper" and parties == 10
    measured = {name: median([r.seconds for r in recs]) for name, recs in runs.items() if recs}
    rows = [_totals_row(name, recs, measured, parties, preset, comparable)
            for name, recs in runs.items() if recs]
    notes = [TOTALS_NOTE.format(rows=pooled.shape[0], features=pooled.shape[1],
                                parties=parties, preset=preset, repeats=repeats,
                                epsilon=TABLE_V_ROBUST_EPSILON, cores=worker_threads()),
             *missing, *failures]
    header = [TOTALS_HEADER[0].format(parties=parties), *TOTALS_HEADER[1:]]
    cells = [_totals_cells(row, comparable) for row in rows]
    section = Section("totals", f"Table V — PPF protocols, total runtime, {parties} parties",
                      rows, [("", header, cells)], notes, meta)
    return finish(section, t0), [r for recs in runs.values() for r in recs]


def _totals_row(name: str, recs: list[RunRecord], measured: dict[str, float], parties: int,
                preset: str, comparable: bool) -> dict[str, Any]:
    """One case's row of Table V: medians over its runs, its counterpart's median beside
    it, the paper's figure and the targets (``comparable``: paper preset, P = 10)."""
    case = CASES[name]
    versus = measured.get(case.versus, math.nan) if case.versus else math.nan
    row = {"method": name, "base_method": case.method, "algorithm": case.algorithm,
           "name": case.display, "parties": parties, "preset": preset, **_summary(recs),
           "cpu_s": median([r.sample.cpu for r in recs]), "paper_s": case.paper_s,
           "target_s": case.target_s if comparable else math.nan,
           "stretch_s": case.stretch_s, "versus": case.versus, "versus_median_s": versus,
           "x_faster": versus / measured[name],
           "speedup_target": case.speedup_target if comparable else math.nan,
           "error_targets": case.error_targets,
           "limit_s": median([r.extra["limit_s"] for r in recs]),
           "beyond_limit_core_s": {cost: median([r.extra[f"beyond_{cost}_core_s"]
                                                 for r in recs]) for cost in BEYOND}}
    row["errors_met"] = _errors_met(row["errors"], row["error_targets"])
    return row


def _totals_cells(row: dict[str, Any], comparable: bool) -> list[str]:
    """The row as the cells of :data:`TOTALS_HEADER`."""
    return [row["name"], f"`{row['algorithm']}`", f"{row['median_s']:.1f}",
            ", ".join(f"{s:.1f}" for s in row["runs_s"]), f"{row['cpu_s']:.1f}",
            str(row["rounds"]), f"{row['bytes_total'] / 1e6:.0f}",
            f"{row['limit_s']:.1f}", f"{row['median_s'] / row['limit_s']:.1f}",
            _beyond_text(row["beyond_limit_core_s"]),
            fmt_or_dash(row["paper_s"], ".0f"), fmt_or_dash(row["target_s"], ".1f"),
            met(row["median_s"], row["target_s"]), _speedup_text(row),
            _ratio(row["paper_s"], row["median_s"]) if comparable else "–",
            f"{row['foreign_load']:.2f}",
            errors_text(row["errors"], row["abs_errors"]),
            _errors_met_text(row["errors_met"], row["error_targets"])]


TOTALS_NOTE = (
    "BCW ({rows} rows, {features} features) split IID over {parties} "
    "parties (seed 0), preset `{preset}`, {repeats} run(s) per case, the cases "
    "alternating run by run. Each run is one federation in this process: collective key "
    "generation, every party and the server, through the real codec. The paper's "
    "figures count ciphertext computation only (no key generation, communication or "
    "serialization). Cases (fednorm/bench/cases.py): algorithm `default` decrypts only "
    "flooded sums and exact bits (no V_abs, no bootstraps; its z-score reveals the "
    "pooled count); `paper` is `--algorithm paper`: the paper's Algorithms 1, 3–5 and "
    "the encrypted Yeo-Johnson search, with V_abs = max |x| of each feature rounded up "
    "to a power of two, each party recomputing the server's steps to check its "
    "requests; `paper, parties on trust` is the same without those checks "
    "(`fednorm simulate --no-replay`, every role in one process), so its × faster "
    "than its replayed counterpart is their cost; `flooding off` is a default "
    "protocol whose parties leave the flooding noise out of their shares "
    "(`FitOptions(flood=False)`; the same wire), and `paper, flooding off and parties "
    "on trust` the paper's with both off: beside the protected case, what the "
    "protections against a deviating server cost in time (bytes stay the same). "
    "Robust at ε = {epsilon:g} (absolute, as the "
    "paper) or exact (ε None: the float order searched to one float). × faster than "
    "`--algorithm paper`: the median of the case's paper counterpart (named in the "
    "cell) over its own median, both measured in this run, against the target ratio. "
    "Errors: max over features of |PPF − numpy| / |numpy| on the pooled rows (numpy; "
    "scikit-learn for Yeo-Johnson's λ, and `llf`: scipy's Yeo-Johnson log-likelihood "
    "at our λ against it at scikit-learn's), worst run, and the max absolute error; "
    "error target: the bound per statistic (0: equal to numpy's). Paper figures, "
    "targets and × paper apply at the paper preset and P=10 only. Limit: the "
    "run's crypto calls (every role's key and decryption shares, encryptions, the "
    "server's aggregations, homomorphic operations and bootstrap steps; no "
    "serialization, transport or waiting), summed and spread over {cores} "
    "cores (the simulation's worker threads), median over the runs; total / limit is "
    "how far the wall time is from it. Beyond the limit, median over the runs: "
    "serialization (every role's encoding and parsing of frames in worker threads, "
    "OpenFHE's included, timed as the calls ran; frames under 64 KiB are parsed inline "
    "and not timed) and idle cores (worker threads × wall time minus the "
    "process's CPU time: cores waiting on the one role whose turn it is), in "
    "core-seconds; the larger, in bold, is the cost that stands between the wall time "
    "and the limit.")
"""Table V's note (``str.format`` fields: the data, the run and the limit's cores)."""


def _speedup_text(row: dict[str, Any]) -> str:
    """'4.1x (vs `minmax_paper`; target ≥ 3x: yes)', or '–' without a counterpart."""
    if not row["versus"]:
        return "–"
    if math.isnan(row["x_faster"]):
        return f"– (`{row['versus']}` not measured)"
    text = f"{row['x_faster']:.1f}x (vs `{row['versus']}`"
    target = row["speedup_target"]
    if math.isnan(target):
        return text + ")"
    verdict = "yes" if row["x_faster"] >= target else "**no**"
    return text + f"; target ≥ {target:g}x: {verdict})"


def _errors_met(errors: dict[str, float], targets: dict[str, float]) -> bool | None:
    """Whether every statistic with a bound is within it (None: no bound)."""
    bounded = [k for k in targets if k in errors]
    return all(errors[k] <= targets[k] for k in bounded) if bounded else None


def _errors_met_text(verdict: bool | None, targets: dict[str, float]) -> str:
    if verdict is None:
        return "–"
    bounds = ", ".join(f"{k} {'= numpy' if v == 0 else f'≤ {v:g}'}"
                       for k, v in targets.items())
    return f"{'yes' if verdict else '**no**'} ({bounds})"


BEYOND = ("serialization", "idle")
"""Costs between a run's wall time and its limit (:meth:`Timeline.beyond_limit`)."""


def _beyond_text(core_s: dict[str, float]) -> str:
    """The costs in :data:`BEYOND` order, core-seconds separated by ``/``, the larger in bold."""
    largest = max(BEYOND, key=core_s.__getitem__)
    return " / ".join(f"**{core_s[c]:.1f}**" if c == largest else f"{core_s[c]:.1f}"
                      for c in BEYOND)


def _ratio(paper: float, ours: float) -> str:
    return "–" if math.isnan(paper) else f"{paper / ours:.1f}x"


def _worst_errors(recs: list[RunRecord]) -> dict[str, dict[str, float]]:
    return {"errors": {k: max(r.errors[k] for r in recs) for k in recs[0].errors},
            "abs_errors": {k: max(r.abs_errors[k] for r in recs) for k in recs[0].abs_errors}}


# -- totals vs P -------------------------------------------------------------------------
def scaling(cases: Sequence[str], parties: Sequence[int], preset: str = "paper",
            repeats: int = 1, command: str = "") -> tuple[Section, list[RunRecord]]:
    """Whole protocols (benchmark ``cases``) on BCW split over each P in ``parties``
    (time and bytes vs P)."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    present, missing = present_cases(cases)
    records: list[RunRecord] = []
    failures: list[str] = []
    for rep in range(repeats):
        for n in parties:
            parts, pooled = bcw_split(n)
            for name in present:
                rec = attempt(f"scaling {display_name(name)} P={n} run {rep + 1}/{repeats}",
                              failures,
                              functools.partial(run_case, name, parts, pooled, preset))
                records += [rec] if rec else []
    rows = [_scaling_row(method, n, preset, recs) for method in present for n in parties
            if (recs := [r for r in records if r.method == method and r.parties == n])]
    notes = [f"BCW split IID over P parties (seed 0), preset `{preset}`, {repeats} run(s) "
             "per point; key generation included. 'MB after key setup' leaves out the "
             "collective key generation's messages, as the paper's formulas do. Cases as in "
             "Table V (fednorm/bench/cases.py).", *missing, *failures]
    header = ["protocol", "P", "median s", "s per party", "rounds", "MB on the wire",
              "MB after key setup", "foreign load", "max error: relative (absolute)"]
    cells = [[display_name(row["method"]), str(row["parties"]), f"{row['median_s']:.1f}",
              f"{row['median_s'] / row['parties']:.2f}", str(row["rounds"]),
              f"{row['bytes_total'] / 1e6:.0f}", f"{row['bytes_protocol'] / 1e6:.0f}",
              f"{row['foreign_load']:.2f}", errors_text(row["errors"], row["abs_errors"])]
             for row in rows]
    section = Section("scaling", "Totals vs the number of parties", rows,
                      [("", header, cells)], notes, meta)
    return finish(section, t0), records


def _scaling_row(method: str, parties: int, preset: str, recs: list[RunRecord]
                 ) -> dict[str, Any]:
    """One (case, P) point: medians over its runs, bytes by role, worst errors."""
    return {"method": method, "parties": parties, "preset": preset, **_summary(recs),
            **recs[0].role_bytes()}


def _summary(recs: list[RunRecord]) -> dict[str, Any]:
    """What every row over a case's runs holds: the median and each run's seconds, the
    rounds and bytes (the same in every run), the foreign load, the worst errors."""
    return {"median_s": median([r.seconds for r in recs]),
            "runs_s": [r.seconds for r in recs], "rounds": recs[0].rounds,
            "bytes_total": recs[0].bytes_total, "bytes_protocol": recs[0].bytes_protocol,
            "foreign_load": foreign_load([r.sample for r in recs]), **_worst_errors(recs)}
