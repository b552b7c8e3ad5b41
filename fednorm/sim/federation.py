"""Run a whole federation — server and P parties — in one trio run, in memory.

Every role gets its own :class:`RoleContext` over in-memory links, so the
simulation runs exactly the code a multi-host run would, through the real codec.
All roles live in one nursery: if any role fails, the others are cancelled and
the first real cause (not the dropouts it triggered) is raised.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Any, ParamSpec, TypeVar

import numpy as np
import sniffio
import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine.ckks import in_process_run
from fednorm.engine.clock import run_trio
from fednorm.engine.errors import InputError, root_cause
from fednorm.engine.runtime import SERVER, role_name
from fednorm.engine.signing import Keyring, trusted_setup
from fednorm.engine.tracing import Tracer
from fednorm.engine.traffic import TrafficStats
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol
from fednorm.protocols.decryptions import require_decryptions_within
from fednorm.session import (
    SessionPlan,
    StepContexts,
    check_federation_data,
    check_party_inputs,
    play_session,
)
from fednorm.sim.tables import party_tables
from fednorm.transport.memory import StarLinks, memory_star

P = ParamSpec("P")
R = TypeVar("R")


def worker_threads() -> int:
    """Crypto calls a simulation runs at once, in worker threads: ``FEDNORM_WORKER_THREADS``,
    default 2 (the layout docs/PERFORMANCE.md measured fastest on a 2-core machine)."""
    value = os.environ.get("FEDNORM_WORKER_THREADS", "2")
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"FEDNORM_WORKER_THREADS must be a positive integer, got {value!r}")
    return int(value)


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


async def run_federation(
    protocol: Protocol,
    party_data: Sequence[np.ndarray],
    options: FitOptions | None = None,
    **run: Any,
) -> SimulationResult:
    """Run ``protocol`` alone (its key setup included) with one party per array: a
    :func:`play_federation` of :meth:`SessionPlan.of <fednorm.session.SessionPlan.of>`
    ``protocol``, so its roles run as given (a test's deviating server, a bench's
    protocol); ``run`` takes :func:`play_federation`'s keywords."""
    session = await play_federation(SessionPlan.of(protocol), party_data, options, **run)
    return session.results[0]


async def play_federation(
    plan: SessionPlan,
    party_data: Sequence[np.ndarray],
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
    session: str | None = None,
    features: Sequence[str] | None = None,
    tracer: Tracer | None = None,
    party_tracer: Tracer | None = None,
    keyrings: Mapping[int, Keyring] | None = None,
    links: StarLinks = memory_star,
) -> SessionResult:
    """Play ``plan`` with one party per array, all in this trio run, over ``links``
    (memory channels by default; any transport a :data:`~fednorm.transport.memory.
    StarLinks` opens, e.g. TCP + TLS on the loopback in tests).

    Every role plays :func:`~fednorm.session.play_session`, as a multi-host or Flower
    role does, over one set of links for the whole session.  The data and options are
    checked here, once, before any role starts.  ``features`` names the columns in error
    messages; ``tracer`` sees what the server does (its phases, crypto calls, and every
    frame it sends or receives, which is every frame of the run), ``party_tracer`` what
    every party does.  Each party signs its key shares with its ``keyrings`` entry (by
    default a fresh key each, every verification key handed to every party here, not
    through the server: :func:`~fednorm.engine.signing.trusted_setup`).
    """
    arrays = check_federation_data(party_data)
    options = options or FitOptions()
    check_party_inputs(arrays, plan.protocols, options, features)
    require_decryptions_within(plan.protocols, options, arrays[0].shape[1], len(arrays))
    session = session or secrets.token_hex(8)
    party_ids = list(range(1, len(arrays) + 1))
    limiter = trio.CapacityLimiter(worker_threads())
    keyrings = trusted_setup(party_ids) if keyrings is None else keyrings
    fitted: dict[int, list[Normalizer]] = {}
    ended: dict[int, float] = {}

    async def play_role(contexts: StepContexts, X: np.ndarray | None = None) -> None:
        fitted[contexts.me] = await play_session(contexts, plan, options, X, features)
        ended[contexts.me] = time.perf_counter()

    async with links(party_ids) as (server_links, party_links):
        roles = {SERVER: StepContexts(SERVER, dict(server_links), session, timeout, tracer,
                                      worker_limiter=limiter)}
        roles.update({p: StepContexts(p, {SERVER: party_links[p]}, session, timeout,
                                      party_tracer, keyrings.get(p), limiter)
                      for p in party_ids})
        try:
            with in_process_run():  # a broadcast's readers share one parse of its bytes
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(play_role, roles[SERVER])
                    for party in party_ids:
                        nursery.start_soon(play_role, roles[party], arrays[party - 1])
        except BaseExceptionGroup as group:
            raise root_cause(group) from None
    reports = step_reports(roles, ended)
    setup = reports.pop(0) if plan.key_setup is not None else None
    results = [SimulationResult(fitted[SERVER][i], {p: fitted[p][i] for p in party_ids},
                                report) for i, report in enumerate(reports)]
    return SessionResult(setup, results)


def step_reports(roles: Mapping[int, StepContexts],
                 ended: Mapping[int, float]) -> list[SimulationReport]:
    """Each step's cost: the server's rounds, every role's traffic, and the wall time
    from the first role starting the step to the last one done with it."""
    server = roles[SERVER]
    reports = []
    for step, server_ctx in enumerate(server.made):
        begun = min(role.started[step] for role in roles.values())
        done = max(role.started[step + 1] if step + 1 < len(role.started) else ended[me]
                   for me, role in roles.items())
        traffic = {role_name(me): role.made[step].stats for me, role in roles.items()}
        reports.append(SimulationReport(server_ctx.stats.rounds, done - begun, traffic))
    return reports


async def fit_federation(
    party_data: Sequence[np.ndarray],
    method: str = "zscore",
    privacy: str = "plain",
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
    features: Sequence[str] | None = None,
    tracer: Tracer | None = None,
    party_tracer: Tracer | None = None,
) -> SimulationResult:
    """Fit ``method`` over a federation whose server and parties all run in this process,
    inside the caller's trio run (:func:`simulate` blocks until fitted,
    :func:`simulate_async` is awaited under trio or asyncio).

    Args:
        party_data: one per party: an array (rows × features, NaN = missing), a list of
            rows or a pandas DataFrame (nullable dtypes' ``<NA>`` count as missing).
            DataFrames are matched by column name, in any order; a party that lacks or
            adds a column is refused, naming it.
        method: ``"zscore"``, ``"minmax"``, ``"robust"`` or ``"yeojohnson"``
            (:data:`~fednorm.METHODS`).
        privacy: ``"plain"`` (the parties' aggregate statistics reach the server in the
            clear) or ``"mhe"`` (multiparty CKKS; what each protocol reveals, to whom, is
            listed in docs/LEAKAGE.md).
        options: the fit's :class:`~fednorm.FitOptions` (algorithm, ε, V_abs, CKKS preset,
            flooding); ``None``: the defaults.
        timeout: seconds each role waits for its next message (``None``: no limit).
        features: the columns' names for arrays, or their order for DataFrames.
        tracer: a :class:`~fednorm.engine.tracing.Tracer` of the server's role: its
            phases, crypto calls and every frame it sends or receives (every frame of
            the run goes through it).
        party_tracer: a tracer of every party's role (its phases and crypto calls).

    Returns:
        A :class:`SimulationResult`: the server's fitted normalizer (carrying the columns'
        names when there are any), each party's (the same parameters), and the cost.

    Raises:
        InputError: bad input, before any work starts (an unknown method, columns that
            differ between parties, values beyond V_abs, an option out of range).
        ProtocolError: a role broke the protocol.
        PartyDropped: a role went away or stalled past ``timeout``.
    """
    plan = SessionPlan.of(get_protocol(method, privacy))
    tables = party_tables(party_data, features)
    session = await play_federation(plan, tables.arrays, options, timeout=timeout,
                                    features=tables.features, tracer=tracer,
                                    party_tracer=party_tracer)
    return session.results[0]


@dataclass
class SessionResult:
    """Several protocols over one federation: the key setup's cost (None in plain
    mode or for one method), then each protocol's result, in the order asked."""

    setup: SimulationReport | None
    results: list[SimulationResult]


async def fit_session(
    party_data: Sequence[np.ndarray],
    methods: Sequence[str],
    privacy: str = "mhe",
    options: FitOptions | None = None,
    *,
    timeout: float | None = 120.0,
    features: Sequence[str] | None = None,
    tracer: Tracer | None = None,
    party_tracer: Tracer | None = None,
) -> SessionResult:
    """Fit several methods in turn over one federation whose roles all run in this
    process, inside the caller's trio run (:func:`simulate_session` blocks until fitted,
    :func:`simulate_session_async` is awaited under trio or asyncio).

    The session is the one a multi-host or Flower run of ``methods`` plays
    (:class:`~fednorm.session.SessionPlan`): with several methods in ``mhe`` mode the
    joint keys are generated once, first, covering every method, and each protocol
    reuses them, so its report holds its own cost only; a single method generates its
    keys in its own run.  The arguments, and the errors raised, are
    :func:`fit_federation`'s, with ``methods`` (method names, or one string of them
    separated by commas) in place of ``method``.

    Returns:
        A :class:`SessionResult`: the key setup's cost (``None`` in plain mode or for one
        method), then one :class:`SimulationResult` per method, in the order asked.
    """
    plan = SessionPlan(methods, privacy)
    tables = party_tables(party_data, features)
    return await play_federation(plan, tables.arrays, options, timeout=timeout,
                                 features=tables.features, tracer=tracer,
                                 party_tracer=party_tracer)


def blocking(trio_native: Callable[P, Awaitable[R]], name: str) -> Callable[P, R]:
    """``trio_native`` as a call that blocks until done (its own trio run), refused
    inside a running event loop, which it would stop."""
    @wraps(trio_native)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        refuse_inside_event_loop(name)
        return run_trio(partial(trio_native, *args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = _with_first_paragraph(trio_native, "Fits in a trio run of its own and "
                                         "blocks until done; inside a running event loop it "
                                         f"refuses, naming `await {name}_async(...)`.")
    return call


def _with_first_paragraph(documented: Callable[..., Any], first: str) -> str:
    """``documented``'s docstring with its first paragraph (how the call runs) replaced:
    the wrappers share the arguments, results and errors, not the way they run."""
    rest = (documented.__doc__ or "").partition("\n\n")[2]
    return f"{first}\n\n{rest}"


def any_loop(trio_native: Callable[P, Awaitable[R]], blocking_call: Callable[P, R],
             name: str) -> Callable[P, Awaitable[R]]:
    """``trio_native`` awaitable from trio or asyncio (:func:`in_caller_loop`)."""
    @wraps(trio_native)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return await in_caller_loop(partial(trio_native, *args, **kwargs),
                                    partial(blocking_call, *args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = _with_first_paragraph(trio_native, "Awaited from trio or asyncio: the "
                                         "fit runs while the caller's event loop keeps "
                                         "running.")
    return call


simulate = blocking(fit_federation, "simulate")
simulate_async = any_loop(fit_federation, simulate, "simulate_async")
simulate_session = blocking(fit_session, "simulate_session")
simulate_session_async = any_loop(fit_session, simulate_session, "simulate_session_async")


def refuse_inside_event_loop(name: str) -> None:
    """A synchronous fit called from a coroutine would stop the caller's event loop (or,
    under trio, fail inside ``trio.run``): say what to call instead."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return
    raise InputError(f"{name}() blocks until the federation is fitted and cannot run inside "
                     f"the running {library} event loop: use `await {name}_async(...)`")


async def in_caller_loop(trio_native: Callable[[], Awaitable[R]],
                         blocking_call: Callable[[], R]) -> R:
    """Run a fit in the caller's event loop: under trio, the trio-native coroutine in the
    caller's own run (its crypto already runs in worker threads); under asyncio, the
    blocking call in a worker thread, with a trio run of its own."""
    library = sniffio.current_async_library()
    if library == "trio":
        return await trio_native()
    if library == "asyncio":
        import asyncio

        return await asyncio.to_thread(blocking_call)
    raise InputError(f"fednorm's async API runs under trio or asyncio, not {library}")
