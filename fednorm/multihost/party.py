"""A multi-host party: validates its data, connects, learns the session's methods and
options from the server's welcome, and runs its role in each; its outputs are written by the caller
only once the run succeeded (:mod:`fednorm.multihost.files`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import (
    FednormError,
    InputError,
    InputRefused,
    ProtocolError,
    SessionRefused,
)
from fednorm.engine.runtime import SERVER
from fednorm.engine.tracing import Tracer
from fednorm.multihost.config import Log, PartyConfig, quiet
from fednorm.multihost.handshake import (
    NET_VERSION,
    Hello,
    Ready,
    Welcome,
    Withdraw,
    connect_party,
    send_handshake,
    wait_start,
)
from fednorm.protocols import FitOptions, Normalizer
from fednorm.protocols.base import (
    UNUSABLE_DATA,
    RejectedInput,
    check_party_data,
    options_from_wire,
    refuse_unflooded,
)
from fednorm.protocols.decryptions import refuse_decryptions_beyond
from fednorm.session import (
    SessionPlan,
    StepContexts,
    check_real,
    check_session_inputs,
    play_session,
)
from fednorm.transport.tcp import TcpLink
from fednorm.transport.tls import party_context, party_keyring

REFUSAL_CONNECT = 1.0  # a server not up yet has no session to abandon: do not wait for it


@dataclass(frozen=True)
class PartyRun:
    """A party's successful run: what the server told it, and a fitted normalizer per
    method of the session, in order."""

    welcome: Welcome
    plan: SessionPlan
    normalizers: list[Normalizer]


class Party:
    """One party: connect, be admitted, run its role in the protocols the server chose."""

    def __init__(self, config: PartyConfig, log: Log = quiet,
                 tracer: Tracer | None = None) -> None:
        if config.party < 1:
            raise InputError(f"party ids are 1..N, got {config.party}")
        if config.certs is None and config.tls is None:
            raise InputError("a party needs its certificates (certs) or a TLS context (tls)")
        self.config = config
        self.context = config.tls or party_context(config.certs, config.party)
        # Without certificate files a PPF session stops at the key setup, saying so.
        self.keyring = None if config.certs is None else party_keyring(config.certs,
                                                                       config.party)
        self.tracer = tracer
        self._log = log

    async def run(self, X: np.ndarray, features: Sequence[str]) -> PartyRun:
        """Join the server's next session with this party's rows ``X`` (rows × features,
        NaN = missing; an array or a DataFrame) whose columns are named ``features``, play
        every protocol the server announced, and return the fitted normalizers.

        Raises:
            InputError: this party's data cannot be used, or fails the session's checks
                (columns the federation does not share, values beyond V_abs); the server
                learns only the category, before any protocol message.
            SessionRefused: the session runs the paper's PPF algorithms and
                ``allow_unflooded`` is off (refused before any key is made).
            ProtocolError: the server broke the protocol.
            PartyDropped: the server went away or stalled.
            RunAborted: another role stopped the run; the message says why.
        """
        try:
            check_real(X)
            X = check_party_data(X)
        except InputError as exc:
            raise await self.refuse(UNUSABLE_DATA, exc) from None
        config, timeouts = self.config, self.config.timeouts
        hello = Hello(NET_VERSION, WIRE_VERSION, config.party, tuple(features))
        link, welcome = await connect_party(
            config.host, config.port, self.context, hello, connect_timeout=timeouts.join,
            handshake_timeout=timeouts.handshake, max_frame=config.max_frame,
        )
        try:
            plan, options = _agreed_plan(welcome)
            try:
                refuse_unflooded(config.party, plan.protocols, options, config.allow_unflooded)
                refuse_decryptions_beyond(config.party, plan.protocols, options, X.shape[1],
                                          welcome.parties)
            except SessionRefused as exc:
                await _withdraw(link, str(exc), exc)
            await _check_or_withdraw(link, welcome.session, config.party, X, features,
                                     plan, options)
            self._log(f"admitted to session {welcome.session} ({plan.name}, "
                      f"{welcome.parties} parties); waiting for the start")
            await wait_start(link, welcome.session, timeouts.join + timeouts.handshake)
            contexts = StepContexts(config.party, {SERVER: link}, welcome.session,
                                    timeouts.party_protocol, self.tracer,
                                    self.keyring)
            normalizers = await play_session(contexts, plan, options, X, features)
        finally:
            await link.aclose()
        return PartyRun(welcome, plan, normalizers)


    async def refuse(self, kind: RejectedInput, error: InputError) -> InputRefused:
        """This party cannot use its own data: tell the server before any join completes
        (the kind and its remedy only: the detail is data the ledger does not list), so
        that the session is abandoned and every other role stops at once with this cause,
        instead of waiting out the join timeout for a party that will not come.  Best
        effort, within the handshake timeout; returns the error for this console (cause
        and detail)."""
        config = self.config
        refusal = kind.refusal(config.party, error)
        hello = Hello(NET_VERSION, WIRE_VERSION, config.party, (), withdraw=refusal.cause)
        with trio.move_on_after(config.timeouts.handshake), suppress(FednormError):
            link, _ = await connect_party(
                config.host, config.port, self.context, hello,
                connect_timeout=REFUSAL_CONNECT, handshake_timeout=config.timeouts.handshake)
            await link.aclose()  # an accepting server answers with a refusal, not this
        return refusal


async def _check_or_withdraw(link: TcpLink, session: str, party: int, X: np.ndarray,
                             features: Sequence[str], plan: SessionPlan,
                             options: FitOptions) -> None:
    """Check the data against what the welcome announced (V_abs); if it does not fit,
    tell the server so (the kind and its remedy, not which values) before leaving, so
    that every role stops with this cause; the detail stays on this party's console."""
    try:
        check_session_inputs(party, X, plan.protocols, options, features)
    except InputRefused as exc:
        await _withdraw(link, exc.cause, exc)
    await send_handshake(link, Ready(session))


async def _withdraw(link: TcpLink, cause: str, error: InputError) -> NoReturn:
    """Tell the server this party will not take part (``cause``, what every role
    reports), best effort, then stop with ``error`` (this console's, which may name
    data)."""
    with trio.move_on_after(1.0), suppress(FednormError):
        await send_handshake(link, Withdraw(cause))
    raise error from None


def _agreed_plan(welcome: Welcome) -> tuple[SessionPlan, FitOptions]:
    try:
        plan = SessionPlan(tuple(welcome.methods), welcome.privacy)
    except InputError as exc:
        raise ProtocolError(f"the server runs a protocol this party lacks: {exc}") from None
    return plan, options_from_wire(welcome.options)


