"""The leakage ledger as code: which message fields each protocol sends in plaintext.

Everything else a protocol sends is CKKS material (ciphertexts, keys, shares).  One
table per protocol (method, privacy), keyed by message kind; the parametrized ledger
test runs every protocol over a recording transport and fails on any plaintext field
not declared here, and ``docs/LEAKAGE.md`` is checked against these tables.  What the
*decryptions* reveal is capped where the party answers them
(:func:`fednorm.protocols.collective.serve_until`).
"""

from __future__ import annotations

from collections.abc import Mapping

# Every PPF protocol: the key setup names each party's key tag (random identifiers);
# a bootstrap request names the index of the common random element (a counter).
COLLECTIVE: Mapping[str, frozenset[str]] = {
    "ckks.joint_round1": frozenset({"party_tags"}),
    "ckks.boot_request": frozenset({"index"}),
}

_PPF_ZSCORE: Mapping[str, frozenset[str]] = {
    "ppf_zscore.encrypted_sums": frozenset({"width"}),
    "ppf_zscore.scales": frozenset({"scales"}),
    "ppf_zscore.mean": frozenset({"mean"}),
    "ppf_zscore.result": frozenset({"mean", "var"}),
}

PLAINTEXT: Mapping[tuple[str, str], Mapping[str, frozenset[str]]] = {
    ("zscore", "plain"): {
        "zscore.local_sums": frozenset({"count", "total"}),
        "zscore.global_mean": frozenset({"mean"}),
        "zscore.local_deviations": frozenset({"squared", "linear"}),
        "zscore.result": frozenset({"mean", "var", "count"}),
    },
    ("minmax", "plain"): {
        "minmax.local_extremes": frozenset({"min", "max"}),
        "minmax.result": frozenset({"min", "max"}),
    },
    ("robust", "plain"): {
        "robust.local_summary": frozenset({"count", "min", "max"}),
        "rank.probe": frozenset({"features", "points"}),
        "rank.counts": frozenset({"at_most"}),
        "robust.result": frozenset({"q1", "median", "q3"}),
    },
    ("yeojohnson", "plain"): {
        "yeojohnson.local_summary": frozenset(
            {"count", "max_abs", "scaled_mean", "scaled_m2", "negatives", "log_sum"}),
        "yeojohnson.candidates": frozenset({"features", "lambdas"}),
        "yeojohnson.moments": frozenset({"mean", "m2"}),
        "yeojohnson.lambdas": frozenset({"lambdas"}),
        "zscore.local_sums": frozenset({"count", "total"}),
        "zscore.global_mean": frozenset({"mean"}),
        "zscore.local_deviations": frozenset({"squared", "linear"}),
        "zscore.result": frozenset({"mean", "var", "count"}),
    },
    ("zscore", "mhe"): {**COLLECTIVE, **_PPF_ZSCORE},
    ("minmax", "mhe"): {
        **COLLECTIVE,
        "ppf_minmax.encrypted_extremes": frozenset({"width"}),
        "ppf_minmax.window": frozenset({"low", "high"}),
        "ppf_minmax.result": frozenset({"min", "max"}),
    },
    ("robust", "mhe"): {
        **COLLECTIVE,
        "ppf_robust.encrypted_counts": frozenset({"width"}),
        "ppf_robust.pooled_counts": frozenset({"count"}),
        "ppf_minmax.encrypted_extremes": frozenset({"width"}),
        "ppf_minmax.window": frozenset({"low", "high"}),
        "ppf_minmax.result": frozenset({"min", "max"}),
        "rank.probe": frozenset({"features", "points"}),
        "robust.result": frozenset({"q1", "median", "q3"}),
    },
    ("yeojohnson", "mhe"): {
        **COLLECTIVE,
        **{kind: _PPF_ZSCORE[kind] for kind in
           ("ppf_zscore.scales", "ppf_zscore.mean", "ppf_zscore.result")},
        "ppf_yeojohnson.start": frozenset({"width"}),
        "ppf_yeojohnson.flags": frozenset({"empty", "negative", "positive"}),
        "ppf_yeojohnson.probes": frozenset({"lambdas"}),
        "ppf_yeojohnson.lambdas": frozenset({"lambdas"}),
        "ppf_yeojohnson.result": frozenset({"lambdas", "mean", "var"}),
    },
}
"""(method, privacy) → message kind → the fields it may carry in plaintext."""

ABORT_KIND = "abort"  # a failing role's reason, sent to its peers (see docs/LEAKAGE.md)


def undeclared(method: str, privacy: str, kind: str, fields: set[str]) -> set[str]:
    """The plaintext ``fields`` of a ``kind`` message that this protocol does not declare."""
    if kind == ABORT_KIND:
        return fields - {"reason"}
    return fields - PLAINTEXT[method, privacy].get(kind, frozenset())


def markdown() -> str:
    """The declarations as the table ``docs/LEAKAGE.md`` carries (a test keeps them equal)."""
    lines = ["| protocol | message kind | plaintext fields |", "| --- | --- | --- |"]
    for (method, privacy), kinds in PLAINTEXT.items():
        for kind, fields in sorted(kinds.items()):
            names = ", ".join(sorted(fields)) or "–"
            lines.append(f"| {method}-{privacy} | `{kind}` | {names} |")
    return "\n".join(lines) + "\n"
