"""Bytes on the wire per role and protocol, beside the paper's communication formulas.

The paper (Section VI-A, ``tab:theoretical_analysis``) counts, per protocol, ciphertexts
|c|, plaintexts |p| and collective operations S_cdecrypt = S_cbootstrap = (P−1)|c|:

- z-score: 3P|c| + 3 S_cdecrypt + K_inv S_cbootstrap
- MinMax (γ): 2P|c| + 2 S_cdecrypt + 2P K_mm S_cbootstrap
- k-th (β): X (2P|c| + 2 S_cdecrypt + P|p|), X = log2(max_j range_j / ε)
- robust: P|c| + S_cdecrypt + S_γ + 3 S_β

:func:`paper_bytes` evaluates them at our parameters: |c| is the size of a fresh
ciphertext of the preset as it goes on the wire (ring dimension N, depth + 1 RNS towers
of 64-bit words, two ring elements), |p| half of it (one ring element). The formulas
leave out key generation; the measured bytes are shown with and without it. The formulas
are the paper's algorithms'; beside a default-algorithm case (fednorm/bench/cases.py) they
show what the paper's algorithm of the same method would send.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednorm.bench.cases import CASES, base_method, display_name
from fednorm.bench.inputs import bcw_split, col_context
from fednorm.bench.measure import Section, finish, load_average, now, section_meta
from fednorm.bench.paper import PAPER_K_INV, PAPER_K_MM, TABLE_V_ROBUST_EPSILON
from fednorm.bench.protocols import RunRecord
from fednorm.engine import ckks


@dataclass(frozen=True)
class WireParams:
    """The sizes the paper's formulas need, for one CKKS preset."""

    preset: str
    ring_dim: int
    towers: int
    log_q: int  # bits of the fresh ciphertext modulus Q
    ciphertext: int  # bytes of a fresh ciphertext as sent
    k_inv: int  # collective bootstraps of our inverse on [1, 2^20]

    @property
    def plaintext(self) -> int:
        return self.ciphertext // 2

    @property
    def ciphertext_exact(self) -> int:
        """2·N·log2 Q bits, in bytes: the information-theoretic |c|."""
        return 2 * self.ring_dim * self.log_q // 8


@functools.cache
def wire_params(preset: str) -> WireParams:
    ctx = col_context(preset)
    p = ckks.get_preset(preset)
    lead = ckks.PartyKeys.generate(ctx)
    fresh = ctx.encrypt(lead.public_key_share, np.zeros(1))
    return WireParams(preset=preset, ring_dim=p.ring_dim, towers=p.towers,
                      log_q=p.first_mod_bits + p.depth * p.scaling_mod_bits,
                      ciphertext=len(ctx.to_bytes(fresh)),
                      k_inv=ckks.plan_inverse(ctx.level_budget).bootstraps)


def search_rounds(pooled: np.ndarray, epsilon: float) -> int:
    """The paper's X: ⌈log2(max_j (max_j − min_j) / ε)⌉."""
    widest = float(np.nanmax(np.nanmax(pooled, axis=0) - np.nanmin(pooled, axis=0)))
    return max(1, math.ceil(math.log2(widest / epsilon)))


def paper_bytes(method: str, parties: int, c: float, p: float, *, k_inv: float = PAPER_K_INV,
                k_mm: float = PAPER_K_MM, x: int = 0) -> float:
    """The paper's communication complexity of ``method`` in bytes."""
    collective = (parties - 1) * c  # S_cdecrypt = S_cbootstrap
    minmax = 2 * parties * c + 2 * collective + 2 * parties * k_mm * collective
    kth = x * (2 * parties * c + 2 * collective + parties * p)
    if method == "zscore":
        return 3 * parties * c + 3 * collective + k_inv * collective
    if method == "minmax":
        return minmax
    if method == "kth":
        return kth
    if method == "robust":
        return parties * c + collective + minmax + 3 * kth
    return math.nan


def formula_for(rec: RunRecord, wire: WireParams, x: int) -> tuple[float, float]:
    """The paper's bytes for this run: with the paper's K_inv, and with ours (none when
    the counts are revealed: no encrypted inverse)."""
    c, p = wire.ciphertext, wire.plaintext
    x = int(rec.extra.get("kth_rounds", x))
    method = base_method(rec.method)
    our_k = 0 if reveals_counts(rec.method) else wire.k_inv
    return (paper_bytes(method, rec.parties, c, p, x=x),
            paper_bytes(method, rec.parties, c, p, k_inv=our_k, x=x))


def reveals_counts(name: str) -> bool:
    """Whether the z-score case decrypts the pooled count (no encrypted inverse)."""
    case = CASES.get(name)
    return case is not None and case.method == "zscore" and (
        case.algorithm == "default" or bool(case.options.get("reveal_counts")))


def _mb(value: float) -> str:
    return "–" if math.isnan(value) else f"{value / 1e6:.0f}"


def communication(records: list[RunRecord], preset: str, parties: int = 10,
                  command: str = "") -> Section:
    """Per role and protocol, measured bytes beside the formulas, for the given runs;
    the bytes by message kind at ``parties`` (Table V's P)."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    wire = wire_params(preset)
    seen: dict[tuple[str, int, float], RunRecord] = {}
    for rec in records:  # traffic does not depend on the run: one per (method, P, ε)
        seen.setdefault((rec.method, rec.parties, rec.extra.get("epsilon", 0.0)), rec)
    rows = [_communication_row(rec, method, n, preset, wire)
            for (method, n, _), rec in sorted(seen.items())]
    cells = [_communication_cells(row) for row in rows]
    header = ["protocol", "P", "MB total", "MB key setup", "MB after setup", "server sent",
              "server received", "party sent (median)", "party received (median)",
              "paper formula MB", "formula, our K_inv", "after setup / formula"]
    notes = [
        f"Preset `{preset}`: N = {wire.ring_dim}, {wire.towers} RNS towers, log2 Q = "
        f"{wire.log_q}; |c| = {wire.ciphertext / 1e6:.2f} MB (a fresh ciphertext as sent; "
        f"2·N·log2 Q bits would be {wire.ciphertext_exact / 1e6:.2f} MB), |p| = |c|/2. "
        f"S_cdecrypt = S_cbootstrap = (P−1)|c|; the paper's K_inv = {PAPER_K_INV} and "
        f"K_mm = {PAPER_K_MM}; our inverse needs K_inv = {wire.k_inv} collective bootstraps. "
        "X for robust: ⌈log2(max_j range_j / ε)⌉ on BCW at ε = "
        f"{TABLE_V_ROBUST_EPSILON:g}; for the k-th rows, the rounds the search took. All "
        "features fit one ciphertext (30 ≤ N/2 slots), as in the formulas. The formulas "
        "are the paper's algorithms': beside a default-algorithm case they show what the "
        "paper's algorithm of that method would send; 'formula, our K_inv' takes K_inv = 0 "
        "where the pooled count is decrypted (default z-score, `reveal_counts`).",
        "Bytes are frames as sent (header + message body), summed over every message a role "
        "sent or received; every frame is counted once in 'MB total'. 'Party' columns: the "
        "median over parties (party 1, the lead, sends larger key shares than the others). "
        "The server relays the lead's key material to every party, which the formulas, "
        "leaving out key generation, do not count.",
    ]
    return finish(Section("communication", "Communication — bytes per role and protocol",
                          rows, [("", header, cells), _kinds_table(seen, parties)], notes,
                          meta), t0)


def _communication_row(rec: RunRecord, method: str, parties: int, preset: str,
                       wire: WireParams) -> dict[str, Any]:
    """One run's bytes by role beside the paper's formula (X: its search's rounds)."""
    x = search_rounds(bcw_split(parties)[1], TABLE_V_ROBUST_EPSILON)
    paper_k, our_k = formula_for(rec, wire, x)
    return {"method": method, "parties": parties, "preset": preset,
            "bytes_total": rec.bytes_total, "bytes_setup": rec.bytes_setup,
            "bytes_protocol": rec.bytes_protocol, **rec.role_bytes(),
            "paper_formula": paper_k, "paper_formula_our_k": our_k,
            "x": int(rec.extra.get("kth_rounds", x)), "epsilon": rec.extra.get("epsilon")}


def _communication_cells(row: dict[str, Any]) -> list[str]:
    paper_k, our_k = row["paper_formula"], row["paper_formula_our_k"]
    name = display_name(row["method"]) + (f", ε={row['epsilon']:g}" if row["epsilon"] else "")
    return [name, str(row["parties"]), _mb(row["bytes_total"]), _mb(row["bytes_setup"]),
            _mb(row["bytes_protocol"]), _mb(row["server_sent"]), _mb(row["server_received"]),
            f"{row['party_sent_median'] / 1e6:.1f}", f"{row['party_received_median'] / 1e6:.1f}",
            _mb(paper_k), _mb(our_k) if base_method(row["method"]) == "zscore" else "–",
            "–" if math.isnan(paper_k) else f"{row['bytes_protocol'] / paper_k:.2f}"]


def _kinds_table(seen: dict[tuple[str, int, float], RunRecord], parties: int
                 ) -> tuple[str, list[str], list[list[str]]]:
    """Bytes by message kind of each protocol's first run at ``parties``."""
    at_ten: dict[str, RunRecord] = {}
    for (method, n, _), rec in seen.items():
        if n == parties:
            at_ten.setdefault(method, rec)
    kinds = sorted({k for r in at_ten.values() for k in r.by_kind},
                   key=lambda k: -max(r.by_kind.get(k, 0) for r in at_ten.values()))
    header = [f"message kind (MB, all roles, P={parties})"] + [display_name(m) for m in at_ten]
    cells = [[f"`{k}`"] + [f"{r.by_kind.get(k, 0) / 1e6:.1f}" for r in at_ten.values()]
             for k in kinds]
    return "Bytes by message kind.", header, cells
