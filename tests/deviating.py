"""Protocols with one role replaced: a deviating server or party, for refusal tests."""

from __future__ import annotations

from dataclasses import replace

from fednorm.protocols import get_protocol
from fednorm.protocols.base import PartyRole, Protocol, ServerRole


def deviating(method: str, privacy: str = "mhe", *, server: ServerRole | None = None,
              party: PartyRole | None = None) -> Protocol:
    """The registered protocol with ``server`` and/or ``party`` in place of its roles."""
    protocol = get_protocol(method, privacy)
    return replace(protocol, server=server or protocol.server, party=party or protocol.party)


async def zscore_server_start(rc, options):
    """A PPF z-score server's honest start: key setup, the sums, ⟨n_g⟩; returns
    (crypto, ⟨n_g⟩) for a deviating server to continue from."""
    from fednorm.protocols.ppf import zscore as ppf_zscore

    crypto = await ppf_zscore.setup_server(rc, options.preset)
    sums = await rc.gather(ppf_zscore.EncryptedSums)
    return crypto, await crypto.add_all({p: m.count for p, m in sums.items()})
