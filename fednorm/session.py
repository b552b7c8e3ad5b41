"""One role of one session: its role context, its run, and the checks around the run.

Every way fednorm runs a protocol — the in-process simulation (:mod:`fednorm.sim`), the
multi-host server and party (:mod:`fednorm.multihost`), Flower's ServerApp and party
worker (:mod:`fednorm.flower`) — builds its :class:`RoleContext` with
:func:`role_context` and runs the role with :func:`play`, so a role behaves the same over
every transport, and a tracer reaches it the same way.  What a run checks before it
starts (the data, the options) and after it ends (overflow) lives here for the same
reason: each runner refuses the same input with the same message.

A role that fails tells its peers why (:func:`run_role`): the run is N-out-of-N, so
everyone stops promptly and names the same culprit.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import trio
from exceptiongroup import BaseExceptionGroup

from fednorm.engine.ckks.keys import HeldKeys
from fednorm.engine.errors import FednormError, InputError, InputRefused, root_cause
from fednorm.engine.runtime import SERVER, Link, RoleContext, role_name
from fednorm.engine.signing import Keyring
from fednorm.engine.tracing import Tracer
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import (
    BEYOND_VABS,
    FINER_EPSILON,
    Protocol,
    check_party_data,
    input_rejected,
)
from fednorm.protocols.methods import check_methods
from fednorm.protocols.ppf.keys import setup_protocol

T = TypeVar("T")
LOCATION_PARAMS = ("mean", "median", "min")  # NaN exactly when a feature has no values


# -- the role context and the run of a role -------------------------------------------
def role_context(
    me: int,
    links: Mapping[int, Link],
    session: str,
    protocol: Protocol,
    *,
    timeout: float | None,
    tracer: Tracer | Sequence[Tracer] | None = None,
    held_keys: HeldKeys | None = None,
    worker_limiter: trio.CapacityLimiter | None = None,
    keyring: Keyring | None = None,
) -> RoleContext:
    """The context role ``me`` of ``protocol`` talks through in ``session``.

    ``tracer`` watches this role (its phases, its crypto calls, every frame it sends or
    receives); ``held_keys`` are the joint keys the role kept from an earlier step;
    ``keyring`` is a party's signing key and its peers' verification keys (a PPF key
    setup needs them, :mod:`fednorm.engine.signing`).
    """
    return RoleContext(me, links, session, protocol=protocol.name, timeout=timeout,
                       held_keys=held_keys, worker_limiter=worker_limiter, tracer=tracer,
                       keyring=keyring)


async def play(ctx: RoleContext, protocol: Protocol, options: FitOptions,
               X: np.ndarray | None = None) -> Normalizer:
    """Run the role of ``ctx`` in ``protocol``: the server's, or a party's over its ``X``."""
    if ctx.is_server:
        return await protocol.server(ctx, options)
    if X is None:
        raise ValueError(f"{role_name(ctx.me)} needs its data to play its role")
    return await protocol.party(ctx, X, options)


ProtocolLookup = Callable[[str, str], Protocol]
"""(method, privacy) -> its protocol, as :func:`~fednorm.protocols.get_protocol`."""


@dataclass(frozen=True)
class SessionPlan:
    """What one session of a federation fits: one or several methods, one privacy mode.

    Several PPF methods share one collective key setup (:mod:`fednorm.protocols.ppf.keys`),
    its own first step, so no protocol of the session generates keys again; a single
    method runs as its protocol alone, keys included.
    """

    methods: tuple[str, ...]  # given as a sequence or as "a,b": kept as a tuple, checked
    privacy: str
    lookup: ProtocolLookup = field(default=get_protocol, compare=False, repr=False)
    """Where each method's protocol comes from: the registry; a test's deviating server
    plays its own server role through it."""

    def __post_init__(self) -> None:
        """The one check of the methods a run was asked for (``"a,b"`` or a sequence of
        names, kept as a tuple) and of their protocols."""
        object.__setattr__(self, "methods", check_methods(self.methods))
        for method in self.methods:  # an unknown mode fails here, not mid-run
            self.lookup(method, self.privacy)

    @classmethod
    def of(cls, protocol: Protocol) -> SessionPlan:
        """A session of ``protocol`` alone, keys included: its roles as given (a test's
        deviating or failing role), not the registry's."""
        return cls((protocol.method,), protocol.privacy, lambda method, privacy: protocol)

    @property
    def protocols(self) -> tuple[Protocol, ...]:
        return tuple(self.lookup(method, self.privacy) for method in self.methods)

    @property
    def key_setup(self) -> Protocol | None:
        """The session's own key-setup step, when several PPF methods share the keys."""
        if self.privacy != "mhe" or len(self.methods) == 1:
            return None
        return setup_protocol(self.methods)

    @property
    def steps(self) -> tuple[Protocol, ...]:
        """What the session runs, in order: the key setup (if any), then each protocol."""
        setup = self.key_setup
        return self.protocols if setup is None else (setup, *self.protocols)

    @property
    def name(self) -> str:
        """The session's protocols as a party may pin them (``zscore-mhe+minmax-mhe``)."""
        return "+".join(protocol.name for protocol in self.protocols)


ContextFor = Callable[[Protocol, HeldKeys | None], RoleContext]  # (step, keys held) -> context


@dataclass
class StepContexts:
    """The :data:`ContextFor` of role ``me`` over the same links for a whole session:
    each step's context, made on the keys the previous step left (and, for a party,
    its ``keyring``); ``made`` keeps them, in order (their traffic), ``started`` when
    each step began (``time.perf_counter``)."""

    me: int
    links: Mapping[int, Link]
    session: str
    timeout: float | None
    tracer: Tracer | Sequence[Tracer] | None = None
    keyring: Keyring | None = None
    worker_limiter: trio.CapacityLimiter | None = None
    made: list[RoleContext] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    def __call__(self, protocol: Protocol, held_keys: HeldKeys | None) -> RoleContext:
        self.started.append(time.perf_counter())
        self.made.append(role_context(self.me, self.links, self.session, protocol,
                                      timeout=self.timeout, tracer=self.tracer,
                                      held_keys=held_keys, worker_limiter=self.worker_limiter,
                                      keyring=self.keyring))
        return self.made[-1]


async def play_session(context_for: ContextFor, plan: SessionPlan, options: FitOptions,
                       X: np.ndarray | None = None,
                       features: Sequence[str] | None = None) -> list[Normalizer]:
    """Play one role through every step of ``plan`` over the same links, in order.

    Each step gets a context of its own (its frames carry its protocol's name, its rounds
    count from 0) holding what the previous step left in ``RoleContext.held_keys``: the
    joint keys.  A failing step tells the peers why (:func:`run_role`).  The server refuses an
    overflowed fit inside the run, so that every party gets the cause as an Abort; a
    party refuses it after its run, on its own console (inside, its refusal would reach
    the others as "refused its input").
    """
    held_keys = None
    fitted: list[Normalizer] = []
    for step in plan.steps:
        ctx = context_for(step, held_keys)
        normalizer = await run_role(ctx, _fit(ctx, step, options, X, features))
        held_keys = ctx.held_keys
        if normalizer is None:  # the key-setup step fits nothing
            continue
        if not ctx.is_server:  # the server checked inside the run
            check_no_overflow(normalizer, step.method, features)
        fitted.append(normalizer.with_names(features))
    return fitted


async def _fit(ctx: RoleContext, step: Protocol, options: FitOptions,
               X: np.ndarray | None, features: Sequence[str] | None) -> Normalizer | None:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported just below
        normalizer = await play(ctx, step, options, X)
    if normalizer is None or not ctx.is_server:
        return normalizer
    return check_no_overflow(normalizer, step.method, features)


async def run_role(ctx: RoleContext, role: Awaitable[T]) -> T:
    """Await a protocol role; if it fails, tell every peer why before the error propagates.

    Peers would notice a closed link anyway, but only an Abort carries the cause
    ("party 2 dropped: ...") to them, and it stops them before their own timeouts.
    """
    try:
        return await role
    except BaseException as exc:
        reason = abort_reason(ctx.me, exc)
        with trio.CancelScope(shield=True):
            await ctx.send_abort(reason)
        if isinstance(exc, InputError) and not isinstance(exc, InputRefused) \
                and reason != str(exc):
            # Only the category went out: this console gets it and the detail.
            raise InputError(f"{reason}: {exc}") from exc
        raise


def abort_reason(me: int, exc: BaseException) -> str:
    """What a failing role tells its peers.

    A party's rejected input is sent as a category only ("party 3 refused its input"):
    its detail (which feature, how large a value, how many rows) is data the ledger
    does not list, so it stays on the party's own console (docs/LEAKAGE.md).
    """
    if isinstance(exc, BaseExceptionGroup):
        exc = root_cause(exc)
    if isinstance(exc, BaseExceptionGroup | trio.Cancelled | KeyboardInterrupt):
        return f"{role_name(me)} was interrupted"  # nothing but cancellations: a signal
    if isinstance(exc, InputRefused) and me != SERVER:
        return exc.cause
    if isinstance(exc, InputError) and exc.about_data and me != SERVER:
        return input_rejected(me)
    if isinstance(exc, FednormError):
        return str(exc)
    return f"{role_name(me)} failed: {type(exc).__name__}: {exc}"


def check_session_inputs(party: int, X: np.ndarray, protocols: Sequence[Protocol],
                         options: FitOptions, features: Sequence[str] | None = None) -> None:
    """A party's data against what the server announced, before any key or frame: an
    :class:`InputRefused` whose cause every role can report, so no one has to wait for
    the protocol to trip over the data (and name only "party 2 refused its input")."""
    for check, kind in ((check_within_vabs, BEYOND_VABS), (check_epsilon_reachable, FINER_EPSILON)):
        try:
            for protocol in protocols:
                check(X, protocol, options, features)
        except InputError as exc:
            raise kind.refusal(party, exc) from None


# -- checks before and after a run ------------------------------------------------------
def check_real(X: object) -> None:
    """Refuse complex data: a float conversion would silently drop the imaginary part."""
    if np.iscomplexobj(X):
        raise InputError("party data is complex; fednorm normalizes real numbers only")


def feature_labels(width: int, features: Sequence[str] | None = None) -> list[str]:
    """Names for messages: the columns' own, else "feature 1".."feature N"."""
    if features is not None and len(features) == width:
        return [repr(name) for name in features]
    return [f"feature {j + 1}" for j in range(width)]


def needs_vabs(protocol: Protocol, options: FitOptions) -> bool:
    """Whether the algorithm ``options`` pick runs on an agreed bound V_abs, as the
    protocol declares it (the paper's PPF MinMax, robust scaling and Yeo-Johnson)."""
    return protocol.kind(options).needs_vabs


def check_options_used(protocols: Sequence[Protocol], options: FitOptions) -> None:
    """InputError for an option the user set that no protocol of the run reads, since a
    run that silently ignores it looks like one that used it."""
    if options.vabs is not None and not any(needs_vabs(p, options) for p in protocols):
        raise InputError("--vabs bounds |x| for the paper's PPF minmax, robust and yeojohnson "
                         "only (--privacy mhe --algorithm paper); this run would ignore it")
    if options.reveal_counts and not any(
            p.privacy == "mhe" and p.method == "zscore" and options.algorithm == "paper"
            for p in protocols):
        raise InputError("--reveal-counts chooses how the paper's PPF z-score treats n_g "
                         "(--privacy mhe --algorithm paper --method zscore; the default "
                         "algorithm always reveals it); this run would ignore it")


def check_epsilon_reachable(X: np.ndarray, protocol: Protocol, options: FitOptions,
                            features: Sequence[str] | None = None) -> None:
    """InputError, naming the features, where an absolute ε is finer than float64 can
    resolve at a feature's magnitude: no search can reach it (it would go on to one float
    and call that ε)."""
    if protocol.method != "robust" or options.epsilon is None:
        return
    largest = np.nanmax(np.abs(X), axis=0, initial=0.0)
    spacing = np.spacing(largest)
    names = feature_labels(X.shape[1], features)
    finer = [f"{names[j]} (float64 spacing {spacing[j]:.3g} at |x| up to {largest[j]:.6g})"
             for j in np.flatnonzero(spacing > options.epsilon)]
    if finer:
        raise InputError(f"--epsilon {options.epsilon:g} is finer than float64 resolves for "
                         + ", ".join(finer) + f"; {FINER_EPSILON.remedy}")


def check_party_inputs(arrays: Sequence[np.ndarray], protocols: Sequence[Protocol],
                       options: FitOptions, features: Sequence[str] | None = None) -> None:
    """Every party's data against the run's options, before any work: within V_abs and
    not asking for an ε finer than its values resolve."""
    for protocol in protocols:
        for X in arrays:
            check_within_vabs(X, protocol, options, features)
            check_epsilon_reachable(X, protocol, options, features)


def check_within_vabs(X: np.ndarray, protocol: Protocol, options: FitOptions,
                      features: Sequence[str] | None = None) -> None:
    """A party's values against the agreed V_abs, before anything is encrypted, with the
    offending features named (by their columns' names, else "feature 1"..): the one
    place the values meet V_abs, run at each entry point's edge, once per session."""
    if not needs_vabs(protocol, options):
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
