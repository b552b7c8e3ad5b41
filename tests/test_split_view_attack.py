"""A server that tells the parties different things, against the real party roles.

Every step of a default PPF protocol broadcasts public values that the parties' next
uploads depend on: the quotient's scales, the rank search's probe points.  A server
that sends one party other values than the rest turns a pooled sum into a lever on
that party: with party 1's scales at 2^20 and the others' at 1, the precise pass
decrypts 2^20·S_1 + (S − S_1), and with the pooled S of the coarse pass the server
solves for S_1, party 1's own sum.  Each party signs its uploads together with a digest
of every protocol message the server sent it, and checks the other parties' signatures
against its own digest: uploads made after different messages do not verify, and every
party refuses to decrypt them.  Played over memory channels and over TCP + TLS.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import trio
from deviating import deviating

from fednorm.engine.errors import ProtocolError
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import setup_server
from fednorm.protocols.plain.robust import QUARTILES
from fednorm.protocols.ppf import moments, pooled
from fednorm.protocols.ppf.kth import EncryptedCountAggregator, reveal_counts_and_opening
from fednorm.protocols.rank import RankProbe
from fednorm.sim.federation import run_federation
from fednorm.transport.memory import StarLinks

LEVER_BITS = 20
OPTIONS = FitOptions(preset="test")


def _parts() -> list[np.ndarray]:
    rng = np.random.default_rng(8)
    return [rng.normal(3.0, 1.0, size=(5, 2)) for _ in range(3)]


def _run(server, links: StarLinks, method: str = "zscore") -> None:
    trio.run(lambda: run_federation(deviating(method, server=server), _parts(), OPTIONS,
                                    timeout=60, links=links))


def test_scales_sent_to_one_party_alone_are_refused(links: StarLinks) -> None:
    """The default z-score's server, honest up to the last pass's scales, then the honest
    power of two for party 1's Σx and one 2^20 smaller for the others': with the first
    pass's pooled Σx the last would give it party 1's own Σx; every party refuses to
    decrypt it, and the server reads nothing."""
    read: dict[str, np.ndarray] = {}

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **moments.setup_arguments(options))
        first = await pooled.exact_sum(
            crypto, lambda width: moments.first_exponents(crypto.ckks, options, width // 3))
        honest = moments.precise_exponents(crypto.ckks, first, np.zeros(len(first)))
        total = np.split(first, 3)[1]
        for party in rc.parties:  # the others' Σx 2^20 smaller: party 1's stands out
            lever = 0 if party == 1 else LEVER_BITS
            await rc.send(party, replace(honest, mean=honest.mean - lever))
        powers = np.concatenate([honest.mean, honest.squares])
        scaled, _ = np.split(await pooled.exact_sum(crypto, lambda _: powers), 2)
        read["sum of party 1"] = (scaled - total * 2.0**-LEVER_BITS) / (1 - 2.0**-LEVER_BITS)
        raise ProtocolError("the attacking server stops here")

    with pytest.raises(ProtocolError) as refusal:
        _run(server, links)
    assert not read, f"the server read {read} (party 1's Σx: {_parts()[0].sum(axis=0)})"
    assert "server messages" in str(refusal.value), refusal.value


def test_probe_points_sent_to_one_party_alone_are_refused(links: StarLinks) -> None:
    """The default robust search's server sends party 1 a probe at a point of its
    choice and the others a point above every value (their counts are their row
    counts, which n_g's per-party split does not reveal but a second probe would): the
    pooled count would be party 1's own count below the point, plus known totals."""
    read: dict[str, np.ndarray] = {}

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)
        count, _, _ = await reveal_counts_and_opening(crypto, options, QUARTILES)
        counts = EncryptedCountAggregator(crypto, count)  # packed, as the parties send
        with rc.subprotocol("kth"):
            features = np.array([0, 1])
            for party in rc.parties:
                point = 3.0 if party == 1 else np.inf
                await rc.send(party, RankProbe(features=features,
                                               points=np.array([point, point])))
            read["party 1 at or below 3"] = await counts.pooled(rc, 2)
        raise ProtocolError("the attacking server stops here")

    with pytest.raises(ProtocolError) as refusal:
        _run(server, links, "robust")
    assert not read, f"the server read {read}"
    assert "server messages" in str(refusal.value), refusal.value
