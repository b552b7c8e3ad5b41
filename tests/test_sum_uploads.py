"""Signed sum uploads against a deviating server, through the real party roles.

A flooded sum decryption request relays every party's signed upload; each party checks
the signatures, that its own entry is what it sent, and decrypts the sum it recomputes.
A server that substitutes a party's own upload for the sum, forges an upload in another
party's name, or asks for one set twice is refused, and receives no share.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import ed25519
from deviating import deviating

from fednorm.engine import ckks, signing
from fednorm.engine.ckks import DecryptionShare
from fednorm.engine.errors import ProtocolError
from fednorm.engine.tracing import CryptoEvent, Tracer
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import SumDecryptRequest, setup_server
from fednorm.protocols.collective.rounds import request_shares
from fednorm.protocols.collective.sums import SumUpload, sign_upload
from fednorm.protocols.ppf import pooled
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.sim.federation import run_federation, simulate
from fednorm.transport.memory import StarLinks

DEFAULT = FitOptions(preset="test")
REVEALED_COUNTS = FitOptions(preset="test", algorithm="paper", reveal_counts=True)
"""The paper's z-score with revealed counts: its counts and Σx travel as sum uploads (the
default z-score's as coefficient uploads, attacked in tests/test_ppf_extremes.py)."""
PARTS = [np.arange(8.0).reshape(4, 2) * (k + 1) for k in range(3)]

Forge = Callable[[object, dict[int, SumUpload]], tuple[int, list[SumUpload]]]


def _attack(forge: Forge, links: StarLinks) -> tuple[BaseException, list[int]]:
    """Run PPF z-score (:data:`REVEALED_COUNTS`) with a server that, after the first sums
    arrive, asks for the decryption ``forge`` builds from the parties' count uploads; returns the
    refusal and the parties whose shares the server received (over ``links``)."""
    received: list[int] = []

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)
        sums = await rc.gather(ppf_zscore.EncryptedSums)
        index, uploads = forge(crypto, {p: m.count for p, m in sums.items()})
        replies = await request_shares(rc, "decrypt_sum", SumDecryptRequest(index=index),
                                       DecryptionShare, (index, uploads))
        received.extend(p for p, _ in zip(rc.parties, replies, strict=True))
        raise ProtocolError("the attacking server stops here")

    with pytest.raises(ProtocolError) as refusal:
        trio.run(partial(run_federation, deviating("zscore", server=server), PARTS,
                         REVEALED_COUNTS, timeout=60, links=links))
    return refusal.value, received


def test_an_honest_run_decrypts_the_pooled_sums() -> None:
    fitted = simulate(PARTS, "zscore", "mhe", DEFAULT).normalizer
    np.testing.assert_allclose(fitted.mean, np.vstack(PARTS).mean(axis=0), rtol=1e-12)


def test_a_partys_own_upload_in_place_of_the_sum_is_refused(links: StarLinks) -> None:
    """Party 1's upload thrice: the others see, as theirs, an upload they did not sign."""
    refusal, received = _attack(lambda crypto, ups: (ups[1].index, [ups[1]] * 3),
                                links)
    assert "sum decryption request" in str(refusal)
    assert received == []


def test_an_upload_forged_in_another_partys_name_is_refused(links: StarLinks) -> None:
    """The server encrypts zeros as 'party 2's upload' and signs with a key of its own:
    the sum would be party 1's and party 3's alone."""
    def forge(crypto, counts):
        zeros = crypto.ckks.encrypt_sum(crypto.joint.public_key, np.zeros(2))
        own_key = signing.Keyring(signing.Signer(2, ed25519.Ed25519PrivateKey.generate()),
                                  signing.TrustedKeys({}))
        forged, _ = sign_upload(own_key, crypto.rc.session, counts[2].index, zeros)
        return counts[1].index, [counts[1], forged, counts[3]]

    refusal, received = _attack(forge, links)
    # Parties 1 and 3 find the signature wrong, party 2 its own entry not its own: the
    # run ends with whichever refusal comes first.
    assert ("a forged upload" in str(refusal) and "signature" in str(refusal)) \
        or "as this party's upload" in str(refusal)
    assert received == []


def test_a_set_of_uploads_is_decrypted_once(links: StarLinks) -> None:
    """The honest request answered, then the same set again: refused."""
    received: list[int] = []

    async def server(rc, options):
        crypto = await setup_server(rc, options.preset, relinearize=False)
        sums = await rc.gather(ppf_zscore.EncryptedSums)
        total = await crypto.add_all({p: m.count for p, m in sums.items()})
        await crypto.decrypt_sum(total, 2)
        replies = await request_shares(rc, "decrypt_sum", SumDecryptRequest(index=total.index),
                                       DecryptionShare, (total.index, total.uploads))
        received.extend(rc.parties[:len(replies)])

    # The paper's z-score with revealed counts: its first phase allows two sums (n_g and
    # the coarse mean), so the second request meets the set check, not the allowance.
    with pytest.raises(ProtocolError, match="already decrypted"):
        trio.run(partial(run_federation, deviating("zscore", server=server), PARTS,
                         FitOptions(preset="test", algorithm="paper", reveal_counts=True),
                         timeout=60, links=links))
    assert received == []


def test_a_relayed_upload_must_carry_its_index(links: StarLinks) -> None:
    """An upload of another index under the requested one is refused, naming it."""
    def forge(crypto, counts):
        return counts[1].index, [counts[1], replace(counts[2], index=counts[2].index + 1),
                                 counts[3]]

    refusal, received = _attack(forge, links)
    assert "sum decryption request" in str(refusal) and "sum upload #" in str(refusal)
    assert received == []


@pytest.mark.parametrize("method", ["zscore", "robust", "minmax", "yeojohnson"])
def test_a_default_protocol_refuses_any_plain_decryption(method: str, links: StarLinks
                                                         ) -> None:
    """The default protocols decrypt only pooled uploads each party recomputes: a plain
    decryption request for a party's own upload (the server's substitution of a single
    upload for the aggregate) is refused by every party, and the server gets no share."""
    from fednorm.protocols.collective import DecryptRequest
    from fednorm.protocols.ppf.keys import key_needs

    received: list[int] = []

    async def server(rc, options):
        await setup_server(rc, options.preset, **key_needs([method], options))
        with rc.subprotocol("extremes") if method in ("minmax", "yeojohnson") \
                else nullcontext():
            own = await _first_upload(rc, method)
            replies = await request_shares(rc, "decrypt", DecryptRequest(ciphertext=own),
                                           DecryptionShare)
        received.extend(p for p, _ in zip(rc.parties, replies, strict=True))
        raise ProtocolError("the attacking server stops here")

    with pytest.raises(ProtocolError, match="decrypt"):
        trio.run(partial(run_federation, deviating(method, server=server), PARTS,
                         FitOptions(preset="test"), timeout=60, links=links))
    assert received == []


async def _first_upload(rc, method: str):
    """Party 1's first upload of a default protocol, as the server receives it."""
    from fednorm.protocols.ppf import extremes, kth

    if method == "zscore":
        return (await rc.gather(pooled.EncryptedCoefficients))[1].values.ciphertext
    if method == "robust":
        return (await rc.gather(kth.CountsAndOpening))[1].values.ciphertext
    # MinMax and Yeo-Johnson start with the extremes' bits
    return (await rc.gather(extremes.EncryptedBits))[1].chunks[0].ciphertext


class ServerReads(Tracer):
    """Every integer the server's coefficient decryptions gave it (its worker calls of
    ``CoefficientSumDecryption.finalize``), in order."""

    FINALIZE = ckks.CoefficientSumDecryption.finalize.__qualname__

    def __init__(self) -> None:
        self.values: list[list[int]] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.role == "server" and event.call == self.FINALIZE:
            self.values.append([int(v) for v in event.result])


def test_what_the_server_decrypts_depends_on_the_pooled_data_alone() -> None:
    """The ledger says a sum decryption reveals the pooled sum.  So one pooled data set
    split two ways among the parties must give the server the same decrypted values, up
    to the flooding noise; an encoding whose decryption also shows how the parties' own
    values added up (per-party digits whose carries show in the digit sums, or each
    party's float64 rounding of its own sum) fails here.  The first sum's powers of two
    are public constants, so its integers are compared; the second's follow the first
    sum's noisy values (the center, the powers of two), so its outcome is."""
    X = np.random.default_rng(5).normal(3, 2, size=(9, 2)) * [1.0, 1e3]
    reads, fits = [], []
    for parts in ([X[:3], X[3:6], X[6:]], [X[:7], X[7:8], X[8:]]):
        server = ServerReads()
        fits.append(simulate(parts, "zscore", "mhe", FitOptions(preset="test"),
                             tracer=server).normalizer)
        reads.append(server.values)
    assert len(reads[0]) == len(reads[1]) == 2
    # Exact integer sums of the rows' integers, off by the flooding alone: no party's
    # float64 rounding of its own sum shows (it would, 2^40 times larger).
    flooding = 2 * pooled.exact_sum_error(ckks.CkksContext("test"), 3, FitOptions())
    first, second = reads[0][0], reads[1][0]
    assert max(abs(a - b) for a, b in zip(first, second, strict=True)) < flooding
    np.testing.assert_allclose(fits[0].mean, fits[1].mean, rtol=1e-15)
    np.testing.assert_allclose(fits[0].var, fits[1].var, rtol=1e-14)


class Combinations(Tracer):
    """Every combination of relayed uploads a role made: the server's (``PooledUploads.
    combined``) and each party's (``verified_combination``), as objects."""

    def __init__(self) -> None:
        self.made: list[tuple[str, object]] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if event.call in ("PooledUploads.combined", "verified_combination"):
            self.made.append((event.role, event.result))


def test_in_a_simulation_the_server_and_the_parties_share_each_product() -> None:
    """All roles in one process: the server's product of the bit uploads and every
    party's are one object, made once (each host makes its own in a deployment, at the
    same time), not twice one after the other on the simulation's cores; each party
    still checks every upload before it gets it."""
    made = Combinations()
    simulate(PARTS, "minmax", "mhe", FitOptions(preset="test"), tracer=made,
             party_tracer=made)
    server = [result for role, result in made.made if role == "server"]
    assert len(server) > 0
    assert {role for role, _ in made.made} == {"server", "party 1", "party 2", "party 3"}
    for role, result in made.made:
        assert any(result is ours for ours in server), role
