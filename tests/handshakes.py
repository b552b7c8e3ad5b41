"""What the TCP and TLS tests share: a party's hello and a server's lobby."""

from __future__ import annotations

from fednorm.engine.codec import WIRE_VERSION
from fednorm.multihost.handshake import NET_VERSION, Hello, Welcome
from fednorm.multihost.lobby import Lobby

FEATURES = ("a", "b")


def hello(party: int = 1, **changes: object) -> Hello:
    """Party ``party``'s hello with ``changes``."""
    fields = {"version": NET_VERSION, "wire": WIRE_VERSION, "party": party,
              "features": FEATURES, **changes}
    return Hello(**fields)  # type: ignore[arg-type]


def lobby(parties: int = 3) -> Lobby:
    """A plain z-score session's lobby for ``parties`` parties."""
    return Lobby(Welcome(NET_VERSION, "session-1", ("zscore",), "plain", parties, {}),
                 "zscore-plain")
