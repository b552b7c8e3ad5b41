"""What every protocol module shares: options, the registry, and small helpers.

A protocol is a pair of roles, ``server(ctx, options)`` and
``party(ctx, X, options)``, each returning the fitted normalizer.  Modules
register themselves with :func:`register`, keyed by method and privacy mode, so
the simulator, the TCP runner and the CLI pick protocols by name.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import msgpack
import numpy as np

from fednorm.engine.ckks.flooding import (
    DEFAULT_DECRYPTIONS,
    DEFAULT_SECURITY_BITS,
    check_decryptions,
    check_security_bits,
)
from fednorm.engine.errors import InputError, InputRefused, ProtocolError, SessionRefused
from fednorm.engine.messages import as_float_vector
from fednorm.engine.runtime import RoleContext, role_name
from fednorm.protocols.normalizers import Normalizer

if TYPE_CHECKING:
    from fednorm.protocols.ledger import Allowance

METHODS = ("zscore", "minmax", "robust", "yeojohnson")
PRIVACY_MODES = ("plain", "mhe")
QuantileRule = Literal["interpolate", "gap"]
Algorithm = Literal["default", "paper"]
ALGORITHMS = ("default", "paper")


MAX_RANK_PROBES = 255  # 8 bits of bracket per round; more buys little and costs many counts


@dataclass(frozen=True)
class FitOptions:
    """Knobs shared by the protocols; each protocol reads only the ones it needs.

    ``epsilon`` is the absolute precision of the rank search (the paper's ε); when
    it is None, each feature gets ``relative_epsilon`` times its own range, so a
    feature near 1e-3 is found as precisely as one near 1e6 (0: exact, the search runs
    in the float order until one float is left, at most 64 rounds of bisection).

    ``rank_probes`` is the number of points the rank search probes per target and round
    (1: the paper's bisection). K probes cut a bracket into K + 1 cells, so the search
    needs log(K + 1) / log 2 times fewer rounds, and reveals K pooled counts per target
    and round instead of one.

    ``algorithm`` picks a PPF (``mhe``) protocol's kind: ``"default"``, built from flooded
    decryptions of sums and of exact bits only (no V_abs, no bootstraps), or ``"paper"``,
    the paper's Algorithms 1, 3–5 and fednorm's encrypted Yeo-Johnson search
    (docs/LEAKAGE.md compares them).  Plain protocols have one kind.

    PPF (``mhe``) protocols use ``preset`` (CKKS parameters), ``max_count`` (the largest
    pooled per-feature count the encrypted inverse supports) and ``reveal_counts``.
    Their comparison precisions default (None) to each protocol's own: ``minmax_bits``
    and ``minmax_passes`` (PPF MinMax: bits per comparison, passes over narrowing
    windows), ``yeojohnson_sign_bits`` (PPF Yeo-Johnson: the sign of the derivative).
    ``flooding_bits`` is the statistical security s of flooded decryptions (at least 20)
    and ``flooding_decryptions`` the number τ of flooded decryptions one joint key may
    serve: each party's share of a decrypted sum carries an integer Gaussian of std
    √(12τ)·2^(s/2)·t per coefficient, t the sum's noise bound, and a party refuses a
    decryption past τ (docs/LEAKAGE.md, "Decryption noise").

    ``replay``: whether a party of the paper's algorithms recomputes each step of the
    server's from the relayed uploads and refuses a request its own run does not make
    (docs/LEAKAGE.md).  It is a party's own choice and never travels (:data:`LOCAL`):
    a party that takes its options from a server (multi-host, Flower) always replays,
    whatever the server says; a simulation, whose roles share one process and so one
    trust, may turn it off to save the parties' repeat of the server's arithmetic (the
    wire stays the same: uploads are still relayed, shares still forwarded).

    ``flood``: whether a party floods its decryption shares (every size is computed
    either way).  Also a party's own choice that never travels (:data:`LOCAL`), so a party
    that takes its options from a server always floods; off, it exists only to measure
    what flooding costs beside the same run with it (``fednorm bench``, the ``_unflooded``
    and ``_paper_unprotected`` cases): never turn it off where the server is not trusted.
    """

    algorithm: Algorithm = "default"
    epsilon: float | None = None
    relative_epsilon: float = 1e-9
    quantile_rule: QuantileRule = "interpolate"
    rank_probes: int | None = None
    vabs: tuple[float, ...] | None = None
    reveal_counts: bool = False
    max_count: int = 2**20
    preset: str = "paper"
    minmax_bits: float | None = None
    minmax_passes: int | None = None
    yeojohnson_sign_bits: float | None = None
    flooding_bits: int = DEFAULT_SECURITY_BITS
    flooding_decryptions: int = DEFAULT_DECRYPTIONS
    replay: bool = True
    flood: bool = True

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise InputError(f"algorithm must be 'default' or 'paper', not {self.algorithm!r}")
        if self.epsilon is not None and not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InputError(f"epsilon must be a finite positive number, got {self.epsilon}")
        if self.vabs is not None:
            object.__setattr__(self, "vabs", vabs_bounds(self.vabs))
        if not 0 <= self.relative_epsilon < 1:
            raise InputError(f"relative_epsilon must be in [0, 1), got {self.relative_epsilon}")
        if self.rank_probes is not None and not 1 <= self.rank_probes <= MAX_RANK_PROBES:
            raise InputError(
                f"rank_probes must be in [1, {MAX_RANK_PROBES}], got {self.rank_probes}"
            )
        check_security_bits(self.flooding_bits)
        check_decryptions(self.flooding_decryptions)
        if not 1 <= self.max_count <= 2**40:
            raise InputError(f"max_count must be in [1, 2^40], got {self.max_count}")
        if self.quantile_rule not in ("interpolate", "gap"):
            raise InputError(
                f"quantile_rule must be 'interpolate' or 'gap', not {self.quantile_rule!r}"
            )


LOCAL = frozenset({"replay", "flood"})
"""Options each role decides for itself: never sent, ignored if a server sends them."""


def options_to_wire(options: FitOptions) -> dict[str, Any]:
    """The server's options as a welcome carries them; unsendable options are bad input."""
    wire = {f.name: getattr(options, f.name) for f in fields(FitOptions)
            if f.name not in LOCAL}
    try:
        msgpack.packb(wire, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"fit options cannot be sent to the parties: {exc}") from None
    return wire


def options_from_wire(wire: Mapping[str, Any]) -> FitOptions:
    """The options a server sent, each :data:`LOCAL` one this party's default."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in wire.items()
              if k not in LOCAL}
    try:
        return FitOptions(**values)
    except (TypeError, InputError) as exc:
        raise ProtocolError(f"the server sent unusable options: {exc}") from None


def vabs_bounds(vabs: object) -> tuple[float, ...]:
    """V_abs as FitOptions holds it: one bound for every feature (a number) or one per
    feature (a sequence of numbers), each finite and positive."""
    bounds = (vabs,) if isinstance(vabs, numbers.Real) else vabs
    if isinstance(bounds, str | bytes) or not isinstance(bounds, Iterable):
        raise InputError(f"vabs must be a number or a sequence of numbers, got {vabs!r}")
    bounds = tuple(bounds)
    if not bounds or not all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                             and math.isfinite(v) and v > 0 for v in bounds):
        raise InputError(f"vabs bounds must be finite positive numbers, got {vabs!r}")
    return tuple(float(v) for v in bounds)


ServerRole = Callable[[RoleContext, FitOptions], Awaitable[Normalizer]]
PartyRole = Callable[[RoleContext, np.ndarray, FitOptions], Awaitable[Normalizer]]
LocalFit = Callable[[np.ndarray, FitOptions], Normalizer]


KeyNeeds = Callable[[FitOptions], dict[str, object]]


def no_keys(options: FitOptions) -> dict[str, object]:
    """The key needs of a protocol that needs no joint keys (plain)."""
    return {}


Unflooded = Callable[[FitOptions], bool]
FloodedDecryptions = Callable[[FitOptions, int], "Allowance"]
"""(options, features) -> the most flooded sums, masked sums and products a run makes,
as allowed."""


def every_decryption_flooded(options: FitOptions) -> bool:
    """False: every decryption this kind's parties help with is one they flood."""
    return False


def some_decryptions_unflooded(options: FitOptions) -> bool:
    """True: this kind's parties help with plain decryptions which they check against
    their own run of the server's step but do not flood (docs/LEAKAGE.md)."""
    return True


@dataclass(frozen=True)
class Kind:
    """One algorithm of a protocol, declared in one place: its two roles, the joint keys
    it needs (for a PPF session's one key setup), whether it needs an agreed V_abs, and
    whether, with given options, its parties help with decryptions they do not flood
    (``unflooded``: each is checked against the party's own run of the server's step, but
    the server sees the ciphertext's own noise, so a multi-host party joins such a
    session only if its operator allows it), and the most flooded decryptions it makes
    on a number of features, where public numbers fix it (:mod:`.decryptions`)."""

    server: ServerRole
    party: PartyRole
    key_needs: KeyNeeds = no_keys
    needs_vabs: bool = False
    unflooded: Unflooded = every_decryption_flooded
    flooded_decryptions: FloodedDecryptions | None = None


@dataclass(frozen=True)
class Protocol:
    """A registered protocol: its id on the wire and its algorithms (plain protocols have
    one, "default"); its roles run the kind ``FitOptions.algorithm`` names (the server
    sends its options to the parties, so all roles run the same kind)."""

    name: str
    method: str
    privacy: str
    kinds: Mapping[str, Kind]

    @classmethod
    def single(cls, name: str, method: str, privacy: str, server: ServerRole,
               party: PartyRole, key_needs: KeyNeeds = no_keys) -> Protocol:
        """A protocol whose every algorithm runs the same two roles (a key-setup step,
        a test's or a benchmark's own protocol)."""
        kind = Kind(server, party, key_needs)
        return cls(name, method, privacy, {"default": kind, "paper": kind})

    def with_roles(self, server: ServerRole | None = None, party: PartyRole | None = None
                   ) -> Protocol:
        """The same protocol with its server's or parties' role replaced in every kind."""
        kinds = {name: replace(kind, server=server or kind.server, party=party or kind.party)
                 for name, kind in self.kinds.items()}
        return replace(self, kinds=kinds)

    def kind(self, options: FitOptions) -> Kind:
        return self.kinds[options.algorithm if self.privacy == "mhe" else "default"]

    def unflooded(self, options: FitOptions) -> bool:
        """Whether, with ``options``, a party helps with decryptions it does not flood."""
        return self.kind(options).unflooded(options)

    async def server(self, ctx: RoleContext, options: FitOptions) -> Normalizer:
        return await self.kind(options).server(ctx, options)

    async def party(self, ctx: RoleContext, X: np.ndarray, options: FitOptions
                    ) -> Normalizer:
        return await self.kind(options).party(ctx, X, options)


ALLOW_UNFLOODED = "--allow-paper-algorithms"
"""How a party's operator accepts protocols whose decryptions it does not flood."""


def refuse_unflooded(party: int, protocols: Sequence[Protocol], options: FitOptions,
                     allowed: bool) -> None:
    """:class:`SessionRefused` if ``party`` may not join a run of ``protocols``.

    A party decides this, not the server: with the paper's algorithms a party helps with
    decryptions it does not flood (it recomputes each request, so a deviating server
    gets no other ciphertext decrypted, but the values carry the ciphertext's own noise,
    or flooding that a measured noise estimate sizes, not a proven bound: docs/LEAKAGE.md).
    The reason names no data, so every role may report it."""
    names = [p.name for p in protocols if p.unflooded(options)]
    if names and not allowed:
        raise SessionRefused(
            f"{role_name(party)} refused the session: {', '.join(names)} with --algorithm "
            f"{options.algorithm} decrypts without a proven flooding bound (docs/LEAKAGE.md); "
            "a party "
            f"joins it only if its operator allows it (fednorm party {ALLOW_UNFLOODED}, "
            "PartyConfig(allow_unflooded=True), or a Flower node's "
            "fednorm-allow-paper-algorithms)")


def input_rejected(party: int, what: str = "") -> str:
    """The category a party's refusal of its own input is known by to everyone else."""
    return f"{role_name(party)} refused its input" + (f": {what}" if what else "")


@dataclass(frozen=True)
class RejectedInput:
    """A kind of input a party refuses, worded once for every runner (``fednorm party``,
    a Flower node): what the other roles hear, and the remedy, which they need too."""

    what: str
    remedy: str

    def refusal(self, party: int, detail: Exception) -> InputRefused:
        """The error: its cause names this kind and the remedy, as every role reports it;
        its message adds the detail after the cause, for the party's own log (a detail
        that already ends in the remedy, as the edge checks word it, is not repeated)."""
        cause = f"{input_rejected(party, self.what)}; {self.remedy}"
        return InputRefused(cause, f"{cause}: {str(detail).removesuffix(f'; {self.remedy}')}")


UNUSABLE_DATA = RejectedInput("its data cannot be used", "fix its data: that party's own "
                              "log names the columns and the cause")
BEYOND_VABS = RejectedInput("values beyond the agreed V_abs",
                            "agree on a larger V_abs (vabs), one that bounds every party's values")
FINER_EPSILON = RejectedInput("an ε finer than its values' float64 spacing",
                              "use a larger ε, or none (exact)")


_PROTOCOLS: dict[tuple[str, str], Protocol] = {}
_LOCAL_FITS: dict[str, LocalFit] = {}


def register(method: str, privacy: str, default: Kind, paper: Kind | None = None
             ) -> Protocol:
    """Make a protocol available by (method, privacy): a PPF one with both algorithms, a
    plain one with its one."""
    kinds = {"default": default} if paper is None else {"default": default, "paper": paper}
    if privacy == "mhe" and paper is None:
        raise ValueError(f"{method}-mhe needs both algorithms, default and paper")
    protocol = Protocol(f"{method}-{privacy}", method, privacy, kinds)
    _PROTOCOLS[method, privacy] = protocol
    return protocol


def register_local(method: str, fit: LocalFit) -> None:
    """Register the local (no communication) baseline of ``method``."""
    _LOCAL_FITS[method] = fit


def get_protocol(method: str, privacy: str) -> Protocol:
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if privacy not in PRIVACY_MODES:
        raise InputError(f"unknown privacy mode {privacy!r}; choose from plain, mhe")
    try:
        return _PROTOCOLS[method, privacy]
    except KeyError:
        raise InputError(f"method {method!r} is not available with privacy {privacy!r}") from None


def fit_local(method: str, X: np.ndarray, options: FitOptions | None = None) -> Normalizer:
    """Local normalization: fit on this party's data alone (the paper's baseline)."""
    if method not in _LOCAL_FITS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return _LOCAL_FITS[method](check_party_data(X), options or FitOptions())


def check_party_data(X: np.ndarray) -> np.ndarray:
    """A party's data as a 2-D float array; anything else is an InputError."""
    if np.iscomplexobj(X):
        raise InputError("party data is complex; fednorm normalizes real numbers (pass the "
                         "real part explicitly if that is what you mean)")
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"party data is not numeric: {exc}") from None
    if X.ndim != 2 or X.shape[1] == 0:
        raise InputError(f"party data must be a 2-D array with features, got shape {X.shape}")
    if np.isinf(X).any():
        raise InputError("party data contains infinite values")
    return X


def feature_counts(X: np.ndarray) -> np.ndarray:
    """Per-feature number of present (non-NaN) values."""
    return np.sum(~np.isnan(X), axis=0).astype(np.float64)


def agreed_width(uploads: Mapping[int, object], expected: int | None = None) -> int:
    """The feature count every party's upload carries in its ``width`` field (the first
    party's unless ``expected`` is given); a party that differs is named."""
    width = expected
    for party, upload in uploads.items():
        value = getattr(upload, "width", None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ProtocolError(f"party {party} sent an invalid width {value!r}")
        width = value if width is None else width
        if value != width:
            raise ProtocolError(f"party {party} has {value} features, expected {width}")
    if width is None:
        raise ProtocolError("no party replied")
    return width


def gathered_vectors(replies: Mapping[int, object], name: str, width: int | None = None
                     ) -> np.ndarray:
    """Stack field ``name`` of every party's reply into a (parties, width) array.

    The width is the first party's unless given; a party whose vector differs is
    named in the error, since mismatched feature counts are that party's fault.
    """
    rows = []
    for party, reply in replies.items():
        value = getattr(reply, name)
        if width is None:
            width = len(value) if isinstance(value, np.ndarray) else -1
        rows.append(as_float_vector(value, width, f"{name} from party {party}"))
    if not rows:
        raise ProtocolError("no party replied")
    return np.vstack(rows)
