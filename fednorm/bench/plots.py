"""PNG plots of the benchmark sections (matplotlib, headless).

Each function takes a section's rows and writes one file; :func:`write_plots` draws every
plot whose section was run and returns the paths, for the report to link.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fednorm.bench.cases import display_name
from fednorm.bench.measure import Section
from fednorm.bench.paper import PAPER_TABLE_IV_MS, PAPER_TABLE_IV_NAMES

Rows = list[dict[str, Any]]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, path: str, legend_size: float | None = None) -> None:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def _by_method(rows: Rows) -> dict[str, Rows]:
    out: dict[str, Rows] = {}
    for row in rows:
        out.setdefault(row["method"], []).append(row)
    return {m: sorted(rs, key=lambda r: r["parties"]) for m, rs in out.items()}


def time_vs_parties(rows: Rows, path: str) -> None:
    """Whole-protocol wall time against P, one line per protocol."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, rs in _by_method(rows).items():
        ax.plot([r["parties"] for r in rs], [r["median_s"] for r in rs], "o-",
                label=display_name(method))
    ax.set(xlabel="parties P", ylabel="seconds (key generation included)",
           title=f"Total runtime vs P (preset {rows[0]['preset']})")
    _save(fig, ax, path)


def bytes_vs_parties(rows: Rows, path: str) -> None:
    """Bytes on the wire against P: total, after key setup, and the paper's formula."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, rs in _by_method(rows).items():
        ps = [r["parties"] for r in rs]
        name = display_name(method)
        line = ax.plot(ps, [r["bytes_total"] / 1e9 for r in rs], "o-", label=f"{name}, total")
        color = line[0].get_color()
        ax.plot(ps, [r["bytes_protocol"] / 1e9 for r in rs], "s--", color=color,
                label=f"{name}, after key setup")
        if "paper_formula" in rs[0]:
            ax.plot(ps, [r["paper_formula"] / 1e9 for r in rs], ":", color=color,
                    label=f"{name}, paper's formula")
    ax.set(xlabel="parties P", ylabel="GB on the wire (all roles)",
           title="Communication vs P")
    _save(fig, ax, path, 8)


def runtime_vs_epsilon(rows: Rows, path: str) -> None:
    """The k-th search's time and rounds against ε (log scale), as the paper's figure."""
    plt = _pyplot()
    rows = sorted(rows, key=lambda r: -r["epsilon"])
    fig, ax = plt.subplots(figsize=(6, 4))
    eps = [r["epsilon"] for r in rows]
    ax.plot(eps, [r["kth_s"] for r in rows], "o-", label="k-th search, seconds")
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set(xlabel="ε (absolute)", ylabel="seconds", title="PPF k-th element: runtime vs ε")
    ax.grid(alpha=0.3)
    rounds = ax.twinx()
    rounds.plot(eps, [r["rounds"] for r in rows], "s--", color="tab:orange",
                label="rounds")
    rounds.set_ylabel("rounds")
    handles = ax.get_legend_handles_labels()[0] + rounds.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def primitives_vs_parties(rows: Rows, path: str) -> None:
    """Collective primitives (Table IV) against P, ours solid and the paper's dotted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for op in ("relkgen", "pkgen", "decrypt", "bootstrap", "inv"):
        rs = sorted((r for r in rows if r["op"] == op), key=lambda r: r["parties"])
        if not rs:
            continue
        ps = [r["parties"] for r in rs]
        line = ax.plot(ps, [r["median_s"] for r in rs], "o-",
                       label=PAPER_TABLE_IV_NAMES[op].split(" (")[1].rstrip(")"))
        paper = [PAPER_TABLE_IV_MS.get(n, {}).get(op) for n in ps]
        if all(v is not None for v in paper):
            ax.plot(ps, [v / 1e3 for v in paper], ":", color=line[0].get_color())
    ax.set_yscale("log")
    ax.set(xlabel="parties P", ylabel="seconds (log)",
           title="Collective primitives vs P (dotted: paper)")
    _save(fig, ax, path, 8)


PLOTS = {  # file name: (section key, drawing function, caption)
    "time_vs_parties.png": ("scaling", time_vs_parties, "Total runtime vs P"),
    "bytes_vs_parties.png": ("scaling_bytes", bytes_vs_parties, "Bytes on the wire vs P"),
    "runtime_vs_epsilon.png": ("kth_epsilon", runtime_vs_epsilon,
                               "PPF k-th: runtime vs ε"),
    "primitives_vs_parties.png": ("table_iv", primitives_vs_parties,
                                  "Table IV primitives vs P"),
}


def write_plots(sections: Mapping[str, Section], directory: str) -> dict[str, str]:
    """Draw every plot whose rows exist; caption → path."""
    os.makedirs(directory, exist_ok=True)
    written = {}
    for name, (key, draw, caption) in PLOTS.items():
        rows = scaling_bytes_rows(sections) if key == "scaling_bytes" else (
            sections[key].rows if key in sections else [])
        if rows:
            path = os.path.join(directory, name)
            draw(rows, path)
            written[caption] = path
    return written


def scaling_bytes_rows(sections: Mapping[str, Section]) -> Rows:
    """The communication rows of the P sweep (they carry the formula), by method and P."""
    if "scaling" not in sections or "communication" not in sections:
        return []
    swept = {(r["method"], r["parties"]) for r in sections["scaling"].rows}
    return [r for r in sections["communication"].rows
            if (r["method"], r["parties"]) in swept]
