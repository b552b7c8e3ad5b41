"""The leakage ledger as code: what each protocol sends in plaintext, and what its
parties help decrypt and bootstrap in each phase.

Each protocol module declares its own entry beside its roles: the plaintext fields per
message kind (:func:`declare`, its ``LEDGER``) and, for a PPF protocol, the
:class:`Allowance` of every phase a party serves (module constants for decryptions;
bootstraps from the public plan of the server's step,
:func:`fednorm.protocols.ppf.driver.planned_requests`), which the party's roles hand to
:func:`fednorm.protocols.ppf.phases.serve_phase`: a server asking for more is refused.
Everything else a protocol sends is CKKS material (ciphertexts, keys, shares).  This
module holds the machinery and assembles the declarations: the parametrized ledger test
runs every protocol over a recording transport and fails on any plaintext field not
declared (:func:`undeclared`), and ``docs/LEAKAGE.md`` carries :func:`markdown`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from fednorm.protocols.base import METHODS, PRIVACY_MODES

Fields = Mapping[str, frozenset[str]]
"""Message kind → the fields it may carry in plaintext."""

# Every PPF protocol: the key setup names each party's key tag (random identifiers),
# each share carries its maker's signature and certificate (public), and the server
# names digests of the evaluation keys it installed; a bootstrap request and its
# shares name the index of the common random element (a counter); a relayed upload and
# a sum or product decryption request name the uploads' index (a counter); a decryption
# request names the noise its step
# declares (the kind of computation, its measured noise, the P it was measured at).
_SIGNED = frozenset({"signature", "certificate"})
COLLECTIVE: Fields = {
    "ckks.lead_keys": _SIGNED,
    "ckks.key_shares": _SIGNED,
    "ckks.joint_round1": frozenset({"party_tags"}),
    "ckks.relin_round2": _SIGNED,
    "ckks.setup_done": frozenset({"relin_key", "rotation_keys"}),
    "ckks.boot_request": frozenset({"index"}),
    "ckks.decrypt_request": frozenset({"noise_kind", "noise_log2", "noise_parties"}),
    "ckks.boot_share": _SIGNED | {"index"},
    "ckks.relayed_upload": frozenset({"index"}),
    "ckks.decrypt_sum_request": frozenset({"index"}),
    "ckks.decrypt_product_request": frozenset({"index"}),
    "ckks.decrypt_coefficients_request": frozenset({"index"}),
}

ABORT_KIND = "abort"  # a failing role's reason, sent to its peers (see docs/LEAKAGE.md)


@dataclass(frozen=True)
class Allowance:
    """What a party helps compute in one phase, at most: decryptions, flooded decryptions
    of sum uploads, of product uploads and of coefficient uploads (masked bits, exact
    sums), collective
    bootstraps (each on the next common element), and ``retries``: once the decryptions
    are spent, decryptions of the request just before times the public 2^-40, for values
    too large to decode
    (:func:`fednorm.protocols.collective.decryption.shifted`).

    Bootstraps are declared like decryptions (none unless declared): a phase that
    bootstraps declares exactly how many, from the same public plan the server follows
    (the comparison schedule, the inverse's, the slot layout), so one more is refused."""

    decryptions: int = 0
    sums: int = 0
    bootstraps: int = 0
    retries: int = 0
    products: int = 0
    coefficients: int = 0

    def times(self, n: int) -> Allowance:
        """The allowance of ``n`` such phases in a row (one per ciphertext chunk, ...)."""
        return Allowance(self.decryptions * n, self.sums * n, self.bootstraps * n,
                         self.retries * n, self.products * n, self.coefficients * n)

    def __add__(self, other: Allowance) -> Allowance:
        return Allowance(self.decryptions + other.decryptions, self.sums + other.sums,
                         self.bootstraps + other.bootstraps, self.retries + other.retries,
                         self.products + other.products, self.coefficients + other.coefficients)

    def as_sums(self) -> Allowance:
        """The same number of decryptions, of sum uploads (flooded) instead (a sum upload
        always decodes: no retries)."""
        return Allowance(0, self.sums + self.decryptions, self.bootstraps,
                         products=self.products, coefficients=self.coefficients)

    def with_bootstraps(self, bootstraps: int) -> Allowance:
        return replace(self, bootstraps=bootstraps)


NOTHING = Allowance()
"""A phase that asks for nothing: no decryption, no bootstrap."""


@dataclass(frozen=True)
class Declaration:
    """One protocol's ledger entry: the plaintext fields of each message kind it sends."""

    method: str
    privacy: str
    plaintext: Fields
    algorithm: str = "default"

    @property
    def label(self) -> str:
        """``zscore-mhe``, ``zscore-mhe (paper)``."""
        kind = "" if self.algorithm == "default" else f" ({self.algorithm})"
        return f"{self.method}-{self.privacy}{kind}"


Key = tuple[str, str, str]  # (method, privacy, algorithm)

PLAINTEXT: dict[Key, Fields] = {}
"""(method, privacy, algorithm) → message kind → the fields it may carry in plaintext;
filled by the protocol modules' :func:`declare` as :mod:`fednorm.protocols` imports
them."""

DECLARATIONS: dict[Key, Declaration] = {}


def declare(method: str, privacy: str, plaintext: Mapping[str, Iterable[str]],
            algorithm: str = "default") -> Declaration:
    """Record a protocol's ledger entry (once per protocol and algorithm): ``plaintext``
    maps each message kind it sends to the names of its plaintext fields."""
    key = (method, privacy, algorithm)
    if key in DECLARATIONS:
        raise ValueError(f"{method}-{privacy} ({algorithm}) is declared twice")
    declared = {kind: frozenset(names) for kind, names in plaintext.items()}
    declaration = Declaration(method, privacy, declared, algorithm)
    DECLARATIONS[key] = declaration
    PLAINTEXT[key] = declaration.plaintext
    return declaration


def undeclared(method: str, privacy: str, kind: str, fields: set[str],
               algorithm: str = "default") -> set[str]:
    """The plaintext ``fields`` of a ``kind`` message that this protocol does not declare."""
    if kind == ABORT_KIND:
        return fields - {"reason"}
    return fields - PLAINTEXT[method, privacy, algorithm].get(kind, frozenset())


def _in_order() -> list[Declaration]:
    """Plain protocols first, then PPF (default, then paper); each in the order of
    :data:`METHODS`."""
    return sorted(DECLARATIONS.values(), key=lambda d: (
        PRIVACY_MODES.index(d.privacy), d.algorithm != "default", METHODS.index(d.method)))


def markdown() -> str:
    """The plaintext declarations as the table ``docs/LEAKAGE.md`` carries (a test keeps
    them equal)."""
    lines = ["| protocol | message kind | plaintext fields |", "| --- | --- | --- |"]
    for declaration in _in_order():
        for kind, names in sorted(declaration.plaintext.items()):
            listed = ", ".join(sorted(names)) or "–"
            lines.append(f"| {declaration.label} | `{kind}` | {listed} |")
    return "\n".join(lines) + "\n"
