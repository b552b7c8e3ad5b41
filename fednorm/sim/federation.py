"""Run a whole federation — server and P parties — in one trio run, in memory.

Every role gets its own :class:`RoleContext` over in-memory links, so the
simulation runs exactly the code a multi-host run would, through the real codec.
All roles live in one nursery: if any role fails, the others are cancelled and
the first real cause (not the dropouts it triggered) is raised.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine.errors import InputError, PartyDropped
from fednorm.engine.runtime import SERVER, Link, RoleContext, TrafficStats, role_name
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol, check_party_data
from fednorm.transport.memory import star_links
from fednorm.transport.trace import TracedLink, Tracer


@dataclass
class SimulationReport:
    """Cost of one run: protocol rounds, bytes per role, wall time."""

    rounds: int
    seconds: float
    traffic: dict[str, TrafficStats] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        """Bytes put on the wire by all roles together (each frame counted once)."""
        return sum(stats.bytes_sent for stats in self.traffic.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "rounds": self.rounds,
            "seconds": self.seconds,
            "bytes": self.bytes_total,
            "bytes_per_role": {
                role: {"sent": s.bytes_sent, "received": s.bytes_received}
                for role, s in self.traffic.items()
            },
        }


@dataclass
class SimulationResult:
    """The server's fitted normalizer, each party's, and the cost report."""

    normalizer: Normalizer
    party_normalizers: dict[int, Normalizer]
    report: SimulationReport


VABS_METHODS = ("minmax", "robust", "yeojohnson")  # their PPF protocols need V_abs


def check_real(X: object) -> None:
    """Refuse complex data: a float conversion would silently drop the imaginary part."""
    if np.iscomplexobj(X):
        raise InputError("party data is complex; fednorm normalizes real numbers only")


def check_fit_options(options: FitOptions) -> FitOptions:
    """What :class:`FitOptions` lets through but no run can use.

    An infinite ε ends every rank search at once and returns the midpoints of the
    ranges; a bound V_abs must be a positive finite number.
    """
    if options.epsilon is not None and not math.isfinite(options.epsilon):
        raise InputError(f"epsilon must be a finite positive number, got {options.epsilon}")
    if options.vabs is not None:
        vabs = np.asarray(options.vabs, dtype=np.float64).ravel()
        if vabs.size == 0 or not np.all(np.isfinite(vabs) & (vabs > 0)):
            raise InputError(f"vabs values must be positive and finite, got {list(vabs)}")
    return options


def feature_labels(width: int, features: Sequence[str] | None = None) -> list[str]:
    """Names for messages: the columns' own, else "feature 1".."feature N"."""
    if features is not None and len(features) == width:
        return [repr(name) for name in features]
    return [f"feature {j + 1}" for j in range(width)]


def check_within_vabs(X: np.ndarray, protocol: Protocol, options: FitOptions,
                      features: Sequence[str] | None = None) -> None:
    """A party's values against the agreed V_abs, before anything is encrypted, with the
    offending features named (the protocols' own check can only number them)."""
    if protocol.privacy != "mhe" or protocol.method not in VABS_METHODS:
        return
    width = X.shape[1]
    if options.vabs is None:
        raise InputError(f"{protocol.name} needs vabs: a bound on |x| the parties agree on")
    vabs = np.asarray(options.vabs, dtype=np.float64).ravel()
    if vabs.size not in (1, width):
        return  # a count that does not fit is the bound's fault: the server names it
    vabs = np.broadcast_to(vabs, (width,))
    largest = np.nanmax(np.abs(X), axis=0, initial=0.0)
    names = feature_labels(width, features)
    beyond = [f"{names[j]} (|x| up to {largest[j]:.6g}, bound {vabs[j]:.6g})"
              for j in np.flatnonzero(largest > vabs)]
    if beyond:
        raise InputError("values beyond the agreed bound vabs: " + ", ".join(beyond))


LOCATION_PARAMS = ("mean", "median", "min")  # NaN exactly when a feature has no values


def overflowed_features(normalizer: Normalizer) -> list[int]:
    """Features whose fit overflowed float64: a parameter is infinite, or one is NaN
    although the feature has values (its location — mean, median or min — is finite;
    a feature without any value has a NaN location, and Yeo-Johnson's λ is 1 there)."""
    params = normalizer.params()
    values = np.array(list(params.values()), dtype=np.float64)
    location = next(np.asarray(params[name], dtype=np.float64)
                    for name in LOCATION_PARAMS if name in params)
    infinite = np.isinf(values).any(axis=0)
    undefined = np.isfinite(location) & np.isnan(values).any(axis=0)
    return np.flatnonzero(infinite | undefined).tolist()


def check_no_overflow(normalizer: Normalizer, method: str,
                      features: Sequence[str] | None = None) -> Normalizer:
    """Refuse a fit that overflowed instead of reporting its parameters as null."""
    overflowed = overflowed_features(normalizer)
    if overflowed:
        names = feature_labels(normalizer.n_features, features)
        raise InputError(f"the {method} fit overflows float64 for "
                         f"{', '.join(names[j] for j in overflowed)}: values this large "
                         "(beyond about 1e150) cannot be squared or summed; rescale them")
    return normalizer


def check_federation_data(party_data: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Validate all parties' arrays together, before any protocol work starts."""
    if len(party_data) == 0:
        raise InputError("a federation needs at least one party")
    for X in party_data:
        check_real(X)
    arrays = [check_party_data(X) for X in party_data]
    widths = {X.shape[1] for X in arrays}
    if len(widths) != 1:
        raise InputError(f"parties disagree on the number of features: {sorted(widths)}")
    return arrays


def root_cause(group: BaseExceptionGroup) -> BaseException:
    """The error that started a failure: a dropout is only a consequence of another."""
    leaves: list[BaseException] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                collect(inner)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)

    collect(group)
    causes = [exc for exc in leaves if not isinstance(exc, PartyDropped)]
    return (causes or leaves or [group])[0]


@dataclass
class FederationKeys:
    """What each role kept from earlier protocol runs of one federation: its joint CKKS
    keys (``RoleContext.crypto``), so a PPF protocol run after another reuses them
    instead of generating new ones (:func:`fednorm.protocols.collective.reusable`)."""

    by_role: dict[int, Any] = field(default_factory=dict)


async def run_federation(
    protocol: Protocol,
    party_data: Sequence[np.ndarray],
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
    session: str | None = None,
    keys: FederationKeys | None = None,
    features: Sequence[str] | None = None,
    tracer: Tracer | None = None,
) -> SimulationResult:
    """Run ``protocol`` with one party per array, all in this trio run.

    With ``keys`` (shared by several runs over the same party arrays) every role starts
    with what it kept from the previous run and keeps what it holds after this one.
    ``features`` names the columns in error messages; ``tracer`` sees every frame the
    server sends or receives (which is every frame of the run).
    """
    arrays = check_federation_data(party_data)
    options = check_fit_options(options or FitOptions())
    if features is not None:  # named here; unnamed, the protocol's own check numbers them
        for X in arrays:
            check_within_vabs(X, protocol, options, features)
    session = session or secrets.token_hex(8)
    party_ids = list(range(1, len(arrays) + 1))
    server_links, party_links = star_links(party_ids)
    limiter = trio.CapacityLimiter(2)

    def context(me: int, links: dict) -> RoleContext:
        return RoleContext(me, links, session, protocol=protocol.name, timeout=timeout,
                           worker_limiter=limiter,
                           crypto=keys.by_role.get(me) if keys is not None else None)

    traced: dict[int, Link] = dict(server_links) if tracer is None else {
        p: TracedLink(link, tracer, role_name(p)) for p, link in server_links.items()}
    server_ctx = context(SERVER, traced)
    party_ctxs = {p: context(p, {SERVER: party_links[p]}) for p in party_ids}
    results: dict[int, Normalizer] = {}

    async def run_server() -> None:
        results[SERVER] = await protocol.server(server_ctx, options)

    async def run_party(party: int) -> None:
        results[party] = await protocol.party(party_ctxs[party], arrays[party - 1], options)

    started = time.perf_counter()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_server)
            for party in party_ids:
                nursery.start_soon(run_party, party)
    except BaseExceptionGroup as group:
        raise root_cause(group) from None
    seconds = time.perf_counter() - started
    if keys is not None:
        keys.by_role[SERVER] = server_ctx.crypto
        keys.by_role.update({p: party_ctxs[p].crypto for p in party_ids})

    traffic = {role_name(SERVER): server_ctx.stats}
    traffic.update({role_name(p): party_ctxs[p].stats for p in party_ids})
    report = SimulationReport(server_ctx.stats.rounds, seconds, traffic)
    check_no_overflow(results[SERVER], protocol.method, features)
    return SimulationResult(results[SERVER], {p: results[p] for p in party_ids}, report)


def simulate(
    party_data: Sequence[np.ndarray],
    method: str = "zscore",
    privacy: str = "plain",
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
    features: Sequence[str] | None = None,
    tracer: Tracer | None = None,
) -> SimulationResult:
    """Synchronous entry point: fit ``method`` federatedly over the given party arrays
    (``features`` names the columns in errors; ``tracer`` sees every frame)."""
    protocol = get_protocol(method, privacy)
    check_federation_data(party_data)
    return trio.run(lambda: run_federation(protocol, party_data, options, timeout=timeout,
                                           features=features, tracer=tracer))


def simulate_session(
    party_data: Sequence[np.ndarray],
    methods: Sequence[str],
    privacy: str = "mhe",
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
) -> list[SimulationResult]:
    """Fit several methods in turn over the same federation, generating the joint keys
    once: a later PPF protocol reuses them when they cover its needs (put the method
    needing the most keys first, e.g. ``robust`` or ``minmax`` before ``zscore``)."""
    protocols = [get_protocol(method, privacy) for method in methods]
    check_federation_data(party_data)
    keys = FederationKeys()

    async def run_all() -> list[SimulationResult]:
        return [await run_federation(protocol, party_data, options, timeout=timeout, keys=keys)
                for protocol in protocols]

    return trio.run(run_all)
