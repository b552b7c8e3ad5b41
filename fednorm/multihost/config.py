"""What a multi-host server and a party run with: addresses, certificates, limits."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.transport.tcp import DEFAULT_MAX_FRAME
from fednorm.transport.tls import Credentials, PartyFiles

__all__ = ["Credentials", "Log", "PartyConfig", "PartyFiles", "ServerConfig", "Timeouts"]

Log = Callable[[str], None]
STALL_MARGIN = 5.0  # seconds a party allows the server beyond twice the protocol timeout


def quiet(message: str) -> None:
    """The default log: library callers get results and errors, not chatter."""


@dataclass(frozen=True)
class Timeouts:
    """Per-phase limits in seconds.

    ``join``: the server waits this long for the rest of the parties once the first
    is in; a party keeps trying to connect, then waits for the start, this long.
    ``handshake``: TLS plus hello/welcome of one connection.  ``protocol``: each
    protocol message (the server's receive timeout); a party waits
    :attr:`party_protocol` for the server.
    """

    join: float = 120.0
    handshake: float = 10.0
    protocol: float = 60.0

    @property
    def party_protocol(self) -> float:
        """A party's wait for the server's next message: twice ``protocol`` and a margin.

        Between two of its messages the server may itself wait ``protocol`` for another
        party; with the same limit, a party waiting on the server would give up first and
        blame the server for a peer that stalled.  Longer, the server names the stalled
        peer and its abort reaches every party with that cause."""
        return 2 * self.protocol + STALL_MARGIN

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise InputError(f"the {f.name} timeout must be positive")


@dataclass(frozen=True)
class ServerConfig:
    """What ``fednorm serve`` runs: where, for whom, which methods (each session fits
    them all, in order, on one key setup), how many sessions."""

    host: str
    port: int
    parties: int
    methods: tuple[str, ...]
    certs: Path
    privacy: str = "plain"
    options: FitOptions = field(default_factory=FitOptions)
    timeouts: Timeouts = field(default_factory=Timeouts)
    sessions: int | None = 1  # None: serve until cancelled
    out: Path | None = None
    max_frame: int = DEFAULT_MAX_FRAME
    features: tuple[str, ...] | None = None  # the federation's columns; None: the majority's
    force: bool = False  # replace files in a non-empty --out


@dataclass(frozen=True)
class PartyConfig:
    """What ``fednorm party`` runs: which server, as whom.

    ``certs``: the party's certificates, a certs directory (``fednorm certs init``) or
    :class:`~fednorm.transport.tls.PartyFiles` under any names; its key signs the party's
    key shares in a PPF session.  ``tls``: a TLS context of the caller's own (their
    PKI's settings; it must present party ``party``'s certificate from the federation's
    CA) in place of the one built from ``certs``; a plain session needs nothing else.
    ``allow_unflooded``: join sessions whose protocols decrypt without a proven flooding
    bound (the paper's PPF algorithms: every request is checked, but some values reach
    the server with the ciphertexts' own noise, others flooded by a measured noise);
    by default such a session is refused before any key is made."""

    host: str
    port: int
    party: int
    certs: Credentials | None
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_frame: int = DEFAULT_MAX_FRAME
    allow_unflooded: bool = False
    tls: ssl.SSLContext | None = None
