"""A multi-host party: validates its data, connects, learns the protocol and options
from the server's welcome, and runs its role; its outputs are written by the caller
only once the run succeeded (:mod:`fednorm.multihost.files`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import FednormError, InputError, ProtocolError
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
from fednorm.protocols import FitOptions, Normalizer, get_protocol
from fednorm.protocols.base import Protocol, check_party_data
from fednorm.session import (
    check_no_overflow,
    check_real,
    check_within_vabs,
    input_rejected,
    options_from_wire,
    play,
    role_context,
    run_role,
)
from fednorm.transport.tcp import TcpLink
from fednorm.transport.tls import party_context


@dataclass(frozen=True)
class PartyRun:
    """A party's successful run: what the server told it, and its fitted normalizer."""

    welcome: Welcome
    protocol: Protocol
    normalizer: Normalizer


class Party:
    """One party: connect, be admitted, run the role the server chose."""

    def __init__(self, config: PartyConfig, log: Log = quiet,
                 tracer: Tracer | None = None) -> None:
        if config.party < 1:
            raise InputError(f"party ids are 1..N, got {config.party}")
        self.config = config
        self.context = party_context(config.certs, config.party)
        self.tracer = tracer
        self._log = log

    async def run(self, X: np.ndarray, features: Sequence[str]) -> PartyRun:
        check_real(X)
        X = check_party_data(X)
        config, timeouts = self.config, self.config.timeouts
        hello = Hello(NET_VERSION, WIRE_VERSION, config.party, tuple(features))
        link, welcome = await connect_party(
            config.host, config.port, self.context, hello, connect_timeout=timeouts.join,
            handshake_timeout=timeouts.handshake, max_frame=config.max_frame,
        )
        try:
            protocol, options = _agreed_protocol(welcome)
            await _check_or_withdraw(link, welcome.session, config.party, X, features,
                                     protocol, options)
            self._log(f"admitted to session {welcome.session} ({protocol.name}, "
                      f"{welcome.parties} parties); waiting for the start")
            await wait_start(link, welcome.session, timeouts.join + timeouts.handshake)
            ctx = role_context(config.party, {SERVER: link}, welcome.session, protocol,
                               timeout=timeouts.protocol, tracer=self.tracer)
            with np.errstate(over="ignore", invalid="ignore"):  # reported just below
                normalizer = await run_role(ctx, play(ctx, protocol, options, X))
            check_no_overflow(normalizer, protocol.method, features)
        finally:
            await link.aclose()
        return PartyRun(welcome, protocol, normalizer)


async def _check_or_withdraw(link: TcpLink, session: str, party: int, X: np.ndarray,
                             features: Sequence[str], protocol: Protocol,
                             options: FitOptions) -> None:
    """Check the data against what the welcome announced (V_abs); if it does not fit,
    tell the server so (the category, not which values) before leaving, so that every
    role stops with this cause; the detail stays on this party's console."""
    try:
        check_within_vabs(X, protocol, options, features)
    except InputError as exc:
        cause = input_rejected(party, "values beyond the agreed V_abs")
        with trio.move_on_after(1.0), suppress(FednormError):
            await send_handshake(link, Withdraw(cause))
        raise InputError(f"{cause}: {exc}") from None
    await send_handshake(link, Ready(session))


def _agreed_protocol(welcome: Welcome) -> tuple[Protocol, FitOptions]:
    try:
        protocol = get_protocol(welcome.method, welcome.privacy)
    except InputError as exc:
        raise ProtocolError(f"the server runs a protocol this party lacks: {exc}") from None
    return protocol, options_from_wire(welcome.options)


