"""A server that deviates in the key setup, against the real party roles: every party
checks the joint keys against its own aggregate of shares signed by the parties that made
them, and refuses to encrypt anything otherwise.  In memory (keys handed out by the
harness) and over TCP (the parties' federation certificates).

The deviating servers run the real server role and only edit what it receives or sends
(:func:`tamper`), so each attack is exactly one substitution on the wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trio
from deviating import deviating
from tcp_federation import TEST, UPLOAD, PartyWatch, parts, tcp_run

from fednorm.engine.ckks import JointRoundOne, KeyShares
from fednorm.engine.errors import FednormError, ProtocolError
from fednorm.engine.messages import Message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols import FitOptions, get_protocol
from fednorm.protocols.collective import shared_context
from fednorm.protocols.ppf import moments as ppf
from fednorm.sim.federation import run_federation

Edit = Callable[[int, Message], Message]


def tamper(rc: RoleContext, *, received: Edit | None = None, sent: Edit | None = None
           ) -> None:
    """Make this server role see ``received(peer, msg)`` instead of what ``peer`` sent,
    and send ``sent(peer, msg)`` instead of what it meant to (re-encoded)."""
    receive, send = rc.receive, rc.send

    async def receiving(peer: int, expected: object) -> Message:
        msg = await receive(peer, expected)
        return received(peer, msg) if received else msg

    async def sending(peer: int, msg: Message, body: bytes | None = None,
                      frames: dict[int, bytes] | None = None) -> None:
        edited = sent(peer, msg) if sent else msg
        if edited is msg:
            return await send(peer, msg, body, frames)
        return await send(peer, edited)

    rc.receive, rc.send = receiving, sending  # this role object only


async def run(server, watch: PartyWatch, refusing: set[int]) -> dict[int, BaseException]:
    """A PPF z-score federation with ``server`` in place of the server role: the error of
    each party's (honest) role, by party.  In one process the first failure cancels the
    rest, so each party's error is held back until all of ``refusing`` have reached
    their own verdict."""
    errors: dict[int, BaseException] = {}

    async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> object:
        try:
            return await ppf.party(rc, X, options)
        except FednormError as exc:
            errors[rc.me] = exc
            if not refusing <= set(errors):
                await trio.sleep_forever()
            raise

    protocol = deviating("zscore", server=server, party=party)
    with pytest.raises(ProtocolError):
        await run_federation(protocol, parts(), TEST, timeout=120, party_tracer=watch)
    return errors


# -- (a) a joint public key of the server's own ---------------------------------------------
def own_joint_key(msg: Message) -> Message:
    """JointRoundOne with a public key the server made (it keeps the secret), under the
    joint tag the parties expect, and the honest party tags and round-1 aggregate."""
    if not isinstance(msg, JointRoundOne):
        return msg
    pair = shared_context("test").raw.KeyGen()
    pair.publicKey.SetKeyTag(msg.public_key.GetKeyTag())
    return dataclasses.replace(msg, public_key=pair.publicKey)


async def fake_joint_key_server(rc: RoleContext, options: FitOptions) -> object:
    cache: dict[str, Message] = {}  # one fake key, the same to every party

    def sent(peer: int, msg: Message) -> Message:
        if isinstance(msg, JointRoundOne):
            return cache.setdefault("joint", own_joint_key(msg))
        return msg

    tamper(rc, sent=sent)
    return await ppf.server(rc, options)


async def test_a_joint_key_of_the_server_s_own_is_refused_by_every_party() -> None:
    watch = PartyWatch()
    errors = await run(fake_joint_key_server, watch, {1, 2, 3})
    assert sorted(errors) == [1, 2, 3]
    for error in errors.values():
        assert isinstance(error, ProtocolError) and "joint public key" in str(error), error
    watch.assert_nothing_encrypted()


# -- (b) a key share "of party 2" that party 2 did not make ---------------------------------
Sign = Callable[[KeyShares, RoleContext], KeyShares]


def forged_shares(lead: Message) -> KeyShares:
    """Shares the server made itself on the lead's: valid shares, which only a signature
    can tell apart from party 2's."""
    from fednorm.engine import ckks

    setup = ckks.KeySetup(shared_context("test"), **ppf.setup_arguments(TEST))
    return setup.generate_share(setup.generate_keys(lead), 1, lead)


def unsigned(msg: KeyShares, rc: RoleContext) -> KeyShares:
    return msg


def signed_for_party_2(key: object, certificate: bytes = b"") -> Sign:
    """Sign the forged shares in party 2's name with ``key``, a key of the server's."""
    def sign(msg: KeyShares, rc: RoleContext) -> KeyShares:
        from fednorm.engine import signing

        signer = signing.Signer(2, key, certificate)
        statement = signing.Statement(rc.session, rc.protocol, msg.ROUND, msg.KIND, 2,
                                      msg.share_digest())
        return dataclasses.replace(msg, signature=signer.sign(statement),
                                   certificate=certificate)
    return sign


def forging_server(sign: Sign):
    """A server that takes forged shares for party 2's, sums them into the joint key it
    sends and forwards them to the others: a party adding up what it was sent would get
    exactly the server's joint key."""
    async def server(rc: RoleContext, options: FitOptions) -> object:
        lead: list[Message] = []

        def received(peer: int, msg: Message) -> Message:
            if peer == 1 and not lead:
                lead.append(msg)
            if peer != 2 or not isinstance(msg, KeyShares):
                return msg
            return sign(forged_shares(lead[0]), rc)

        tamper(rc, received=received)
        return await ppf.server(rc, options)

    return server


def own_ed25519_key() -> object:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519.Ed25519PrivateKey.generate()


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed-by-the-server"])
async def test_a_key_share_the_server_made_for_party_2_is_refused(signed: bool) -> None:
    watch = PartyWatch()
    sign = signed_for_party_2(own_ed25519_key()) if signed else unsigned
    errors = await run(forging_server(sign), watch, {1, 3})
    for party in (1, 3):  # sent the forged share in party 2's place
        error = errors[party]
        assert isinstance(error, ProtocolError), error
        assert "share of party 2" in str(error), error
        assert ("signature does not verify" if signed else "is unsigned") in str(error)
    watch.assert_nothing_encrypted()


# -- (c) an honest server ------------------------------------------------------------------
async def test_an_honest_run_passes_and_every_party_checked_every_share() -> None:
    watch = PartyWatch()
    data = parts(4)
    # the paper's z-score: its encrypted inverse needs both relinearization rounds
    result = await run_federation(get_protocol("zscore", "mhe"), data,
                                  FitOptions(preset="test", algorithm="paper"), timeout=120,
                                  party_tracer=watch)
    pooled = np.vstack(data)
    np.testing.assert_allclose(result.normalizer.mean, pooled.mean(axis=0), rtol=1e-6)
    for party in range(1, 5):  # every other party's shares of both rounds, signed
        received = watch.received[f"party {party}"]
        round_one = received.count("ckks.key_shares") + received.count("ckks.lead_keys")
        assert (round_one, received.count("ckks.relin_round2")) == (3, 3)
    assert UPLOAD in watch.sent["party 1"]


# -- over TCP, with the federation's certificates -----------------------------------------
def test_over_tcp_a_joint_key_of_the_server_s_own_is_refused(
    certs: Path,
) -> None:
    errors, watch, outcome = tcp_run(certs, fake_joint_key_server)
    assert sorted(errors) == [1, 2, 3] and outcome.error is not None
    for error in errors.values():  # each checked the others' certificates first
        assert isinstance(error, ProtocolError) and "joint public key" in str(error), error
    watch.assert_nothing_encrypted()


def test_over_tcp_a_share_signed_with_the_server_s_certificate_is_refused(
    certs: Path,
) -> None:
    """The server's own certificate is CA-signed too, but names no party."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    key = serialization.load_pem_private_key((certs / "server.key").read_bytes(), None)
    sign = signed_for_party_2(key, cert.public_bytes(serialization.Encoding.DER))
    errors, watch, _ = tcp_run(certs, forging_server(sign))
    for party in (1, 3):
        assert isinstance(errors[party], ProtocolError), errors
        assert "certificate sent for party 2 is no party's" in str(errors[party])
    watch.assert_nothing_encrypted()


def test_over_tcp_a_default_party_refuses_to_decrypt_its_own_upload(
    certs: Path,
) -> None:
    """The substitution attack over TCP and TLS against the default z-score: the server
    asks every party for a plain decryption share of party 1's own Σx upload; each party
    refuses (its phases declare only decryptions of pooled uploads it recomputes) and the
    server receives no share."""
    from fednorm.engine.ckks import DecryptionShare
    from fednorm.protocols.collective import DecryptRequest, setup_server
    from fednorm.protocols.collective.rounds import request_shares
    from fednorm.protocols.ppf import moments, pooled

    received: list[object] = []

    async def server(rc, options):
        await setup_server(rc, options.preset, **moments.setup_arguments(options))
        own = (await rc.gather(pooled.EncryptedCoefficients))[1].values.ciphertext
        received.extend(await request_shares(rc, "decrypt", DecryptRequest(ciphertext=own),
                                             DecryptionShare))
        raise ProtocolError("the attacking server stops here")

    errors, _, outcome = tcp_run(certs, server)
    assert sorted(errors) == [1, 2, 3] and outcome.error is not None
    for error in errors.values():  # each party's own refusal, not the server's word
        assert isinstance(error, ProtocolError), error
        assert "asked for more decryptions than the protocol step declares" in str(error)
    assert received == []
