"""A server that deviates, against the real party roles: each party refuses the request
the ledger does not allow, and the wire shows that the server got no share of it.  Each
attack runs over memory channels and over TCP + TLS (the ``links`` fixture).

Each deviating server is the honest one with its collective calls made by a
:class:`~fednorm.protocols.collective.ServerCrypto` subclass (:func:`deviating_crypto`)
that adds one request: the parties must refuse that request, and only that one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import openfhe
import pytest
from deviating import deviating, deviating_crypto, zscore_server_with

from fednorm.engine import ckks
from fednorm.engine.ckks import DecryptionShare
from fednorm.engine.errors import ProtocolError
from fednorm.engine.tracing import FrameEvent, Tracer
from fednorm.protocols import FitOptions
from fednorm.protocols.collective import (
    DecryptRequest,
    ServerCrypto,
    setup_server,
)
from fednorm.protocols.collective.decryption import decryption_of
from fednorm.protocols.collective.rounds import request_shares
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.ppf.minmax_layout import setup_arguments
from fednorm.sim.federation import run_federation
from fednorm.transport.memory import StarLinks

TEST = FitOptions(algorithm="paper", preset="test")
ONE_CHEAP_PASS = FitOptions(algorithm="paper",
                            preset="test", vabs=(20.0,), minmax_bits=4, minmax_passes=1)
REQUEST_SHARE = {"ckks.boot_request": "ckks.boot_share",
                 "ckks.decrypt_request": "ckks.decrypt_share"}
ANSWERED_ALIKE = {"ckks.decrypt_request": ("ckks.decrypt_sum_request",
                                           "ckks.decrypt_product_request",
                                           "ckks.decrypt_coefficients_request")}
"""Requests answered by the same kind of share (a flooded sum or product decryption's)."""


@dataclass
class Frames(Tracer):
    """Every frame a role (or every party, as a party tracer) sends or receives."""

    events: list[FrameEvent] = field(default_factory=list)

    def frame(self, event: FrameEvent) -> None:
        self.events.append(event)

    def count(self, role: str, direction: str, kind: str, peer: str | None = None) -> int:
        return sum(e.role == role and e.direction == direction and e.kind == kind
                   and (peer is None or e.peer == peer) for e in self.events)


def _parts(rows: int = 6, features: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(21)
    return [rng.normal(1, 2, size=(rows, features)) for _ in range(3)]


async def _refused(server, method: str, options: FitOptions, match: str, links: StarLinks
                   ) -> tuple[Frames, Frames]:
    """Run ``server`` against the real parties over ``links``; the run must fail with a
    ProtocolError matching ``match``.  The server's frames and the parties' frames."""
    at_server, at_parties = Frames(), Frames()
    with pytest.raises(ProtocolError, match=match):
        await run_federation(deviating(method, server=server), _parts(), options,
                             timeout=300, tracer=at_server, party_tracer=at_parties,
                             links=links)
    return at_server, at_parties


def assert_last_request_unanswered(at_server: Frames, at_parties: Frames,
                                   request: str) -> None:
    """Every party answered every ``request`` the server sent it but the last (the
    deviating one): it sent no share of that one, and the server received none.

    The server sends the deviating request party by party; the first refusal ends the
    run, so over TCP a party may never receive it (it was then sent one request fewer
    than the others, and answered every one it got)."""
    share = REQUEST_SHARE[request]
    parties = [f"party {p}" for p in (1, 2, 3)]
    deviating = max(at_server.count("server", "sent", request, peer=p) for p in parties)
    for party in parties:
        asked = at_server.count("server", "sent", request, peer=party)
        alike = sum(at_server.count("server", "sent", kind, peer=party)
                    for kind in ANSWERED_ALIKE.get(request, ()))
        sent = at_parties.count(party, "sent", share)
        received = at_server.count("server", "received", share, peer=party)
        assert asked >= 1, f"the server never sent {request} to {party}"
        assert asked >= deviating - 1, (party, asked, deviating)
        unanswered = 1 if asked == deviating else 0
        assert sent == received == asked + alike - unanswered, (
            party, asked, alike, sent, received)


# -- (a) one bootstrap more than a MinMax pass declares ------------------------------------
class ExtraBootstrap(ServerCrypto):
    """Before the pass's decryption, one more bootstrap: of a fresh ciphertext, so it is
    neither a repeat nor past the level budget — only more than the pass needs."""

    async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                      noise: ckks.DecryptionNoise | None) -> np.ndarray:
        await self.bootstrap(self.encrypt(np.zeros(4)))
        return await super().decrypt(ct, n, noise)


async def test_a_bootstrap_beyond_a_minmax_pass_is_refused(links: StarLinks) -> None:
    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, **setup_arguments(options))
        low, high = await ppf_minmax.minmax_server(
            deviating_crypto(crypto, ExtraBootstrap), None, options)
        return MinMaxNormalizer(low, high)

    at_server, at_parties = await _refused(
        server, "minmax", ONE_CHEAP_PASS, "more bootstraps than the protocol step declares",
        links)
    assert_last_request_unanswered(at_server, at_parties, "ckks.boot_request")
    assert at_server.count("server", "sent", "ckks.decrypt_request") == 0


# -- (a') a decryption declared less noisy than the step's --------------------------------
def declaring(change: Callable[[ckks.DecryptionNoise], ckks.DecryptionNoise | None]
              ) -> type[ServerCrypto]:
    class MisDeclared(ServerCrypto):
        """Each flooded decryption declared as ``change`` makes it: with less noise (the
        parties would flood less than the values' noise), or none at all."""

        async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                          noise: ckks.DecryptionNoise | None) -> np.ndarray:
            return await super().decrypt(ct, n, None if noise is None else change(noise))

    return MisDeclared


QUIETER = declaring(lambda noise: replace(noise, log2_sigma=noise.log2_sigma - 20))
PLAIN = declaring(lambda noise: None)


@pytest.mark.parametrize("crypto", [QUIETER, PLAIN], ids=["quieter", "plain"])
async def test_a_decryption_declared_with_less_noise_than_its_step_is_refused(
    crypto, links: StarLinks,
) -> None:
    """A MinMax pass's decryption declared 2^-20 as noisy (so the parties would flood
    2^20 too little), or not flooded at all: every party refuses it against its own run
    of the pass, and sends no share."""
    async def server(rc, options):
        made = await setup_server(rc, options.preset, **setup_arguments(options))
        low, high = await ppf_minmax.minmax_server(deviating_crypto(made, crypto), None,
                                                   options)
        return MinMaxNormalizer(low, high)

    at_server, at_parties = await _refused(
        server, "minmax", ONE_CHEAP_PASS, "it declares another noise", links)
    assert_last_request_unanswered(at_server, at_parties, "ckks.decrypt_request")
    assert at_server.count("server", "sent", "ckks.decrypt_request", "party 1") == 1


# -- (b) a second decryption of the same ciphertext ----------------------------------------
Variant = Callable[[ckks.CkksContext, openfhe.Ciphertext], openfhe.Ciphertext]
SAME: Variant = lambda context, prepared: prepared  # noqa: E731
PLUS_ONE: Variant = lambda context, prepared: context.add(prepared, 1.0)  # noqa: E731


def repeating(variant: Variant) -> type[ServerCrypto]:
    class RepeatFirstDecryption(ServerCrypto):
        """The first decryption (the mean's coarse pass) honest; in the precise pass, its
        request again first, as ``variant`` makes it: fresh shares of the same
        ciphertext."""

        first: openfhe.Ciphertext | None = None

        async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                          noise: ckks.DecryptionNoise | None) -> np.ndarray:
            if self.first is not None:
                await request_shares(self.rc, "decrypt", DecryptRequest.of(
                    variant(self.ckks, self.first), noise), DecryptionShare)
            values = await super().decrypt(ct, n, noise)
            self.first = decryption_of(self.ckks, noise).prepare(ct)
            return values

    return RepeatFirstDecryption


@pytest.mark.parametrize("variant", [SAME, PLUS_ONE], ids=["same", "plus-a-constant"])
async def test_a_second_decryption_of_the_same_ciphertext_is_refused(
    variant, links: StarLinks,
) -> None:
    """Within the precise pass's count (its one decryption, spent on the repeat), so only
    the repeat itself is refused; a public constant added changes c0 only, and a
    non-lead party's share depends on c1 alone."""
    async def server(rc, options):
        return await zscore_server_with(rc, options, repeating(variant))

    at_server, at_parties = await _refused(
        server, "zscore", TEST, "decryption request refused: this party already", links)
    assert_last_request_unanswered(at_server, at_parties, "ckks.decrypt_request")
    assert at_server.count("server", "sent", "ckks.decrypt_request", "party 1") == 2


class RepeatFirstBootstrap(ServerCrypto):
    """The inverse's first bootstrap, then the same ciphertext again on the next common
    element (within the phase's count): a fresh share of the same c1."""

    first: openfhe.Ciphertext | None = None

    async def bootstrap(self, ct: openfhe.Ciphertext, forward: bool = False
                        ) -> openfhe.Ciphertext:
        if self.first is None:
            self.first = ct
        elif self.bootstraps == 1:
            await super().bootstrap(self.first, forward)
        return await super().bootstrap(ct, forward)


async def test_a_second_bootstrap_of_the_same_ciphertext_is_refused(links: StarLinks) -> None:
    async def server(rc, options):
        return await zscore_server_with(rc, options, RepeatFirstBootstrap)

    at_server, at_parties = await _refused(
        server, "zscore", TEST, "bootstrap request refused: this party already", links)
    assert_last_request_unanswered(at_server, at_parties, "ckks.boot_request")
    assert at_server.count("server", "sent", "ckks.boot_request", "party 1") == 2


# -- (c) the coarse pass's retry spent on ⟨n_g⟩ ----------------------------------------------
class CountOnRetry(ServerCrypto):
    """The mean's coarse pass decrypted honestly, then its spare decryption (meant for
    a retry at 2^-40) spent on ⟨n_g⟩, which hidden-count mode never reveals."""

    count: openfhe.Ciphertext

    async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                      noise: ckks.DecryptionNoise | None) -> np.ndarray:
        values = await super().decrypt(ct, n, noise)
        if self.decryptions == 2:  # the presence product, then the mean's coarse pass
            await super().decrypt(self.count, n, None)
        return values


async def test_the_coarse_retry_spent_on_the_pooled_count_is_refused(links: StarLinks) -> None:
    async def server(rc, options):
        return await zscore_server_with(rc, options, CountOnRetry)

    at_server, at_parties = await _refused(server, "zscore", TEST,
                                           "decryption retry refused", links)
    assert_last_request_unanswered(at_server, at_parties, "ckks.decrypt_request")
    # the presence product, the coarse pass, then the "retry": n_g
    assert at_server.count("server", "sent", "ckks.decrypt_product_request", "party 1") == 1
    assert at_server.count("server", "sent", "ckks.decrypt_request", "party 1") == 2


def test_a_party_keeps_its_share_digests_when_a_session_reuses_its_keys() -> None:
    """A later protocol of a session reuses the party's held keys as ``setup_party``
    does (the same :class:`PartyKeyState` behind the new step's facade): the digests go
    along, so a repeat across protocols is refused too."""
    from types import SimpleNamespace

    from fednorm.protocols.collective import (
        PartyCrypto,
        PartyKeyState,
        reusable,
        shared_context,
    )

    held = PartyKeyState(ckks=shared_context("test"), joint=None, keys=None,
                         relinearized=False)
    PartyCrypto(None, held).held.shared[b"digest"] = "decryption request"
    later = reusable(SimpleNamespace(held_keys=held), PartyKeyState, "test", False, ())
    assert PartyCrypto(None, later).held.shared == {b"digest": "decryption request"}
