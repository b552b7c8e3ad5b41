"""Signatures on what a party makes, so that every other party can tell it from what the
server made up.

All traffic passes through the server.  An unsigned "key share of party 2" could be the
server's own, chosen so that the joint public key becomes one whose secret it knows; it
would then decrypt every upload.  So a party signs each key share it makes with a key
the server does not hold, and every party checks every signature with a key it did not
get from the server alone:

- across hosts (TCP, Flower): the private key of the party's federation certificate
  signs; the certificate travels with the signature, through the server, and every
  party checks it against the federation CA it already trusts
  (:class:`CertificateAuthority`), so the server cannot forge one;
- in one process (simulations, the bench, tests): a fresh Ed25519 key per party, whose
  public halves the harness hands every party itself (:func:`trusted_setup`), never
  through the server role.

What is signed is a :class:`Statement`: the session, protocol, round, message kind and
party, and a digest of the share's bytes, so a signature vouches for one share in one
place of one run and cannot be replayed in another.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgpack
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from fednorm.engine.errors import InputError, ProtocolError

DOMAIN = "fednorm/signed-share/1"
PARTY_CN = re.compile(r"party-([1-9][0-9]{0,8})")

SigningKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
VerifyingKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


def party_name(party: int) -> str:
    """The certificate CN (and file stem) of party ``party``."""
    return f"party-{party}"


def party_from_cn(common_name: str | None) -> int | None:
    """The party id in a CN such as ``party-3``; None for anything else."""
    match = PARTY_CN.fullmatch(common_name or "")
    return int(match.group(1)) if match else None


def certificate_party(cert: x509.Certificate) -> int | None:
    """The party id a certificate was issued to (its CN), None if it names no party."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return party_from_cn(str(names[0].value)) if names else None


@dataclass(frozen=True)
class Statement:
    """What a signature vouches for: party ``party`` made the share whose bytes have
    ``digest``, as message ``kind`` of round ``round`` of ``protocol`` in ``session``."""

    session: str
    protocol: str
    round: int
    kind: str
    party: int
    digest: bytes

    def encode(self) -> bytes:
        """The signed bytes (msgpack of a fixed list: unambiguous, the same everywhere)."""
        return msgpack.packb([DOMAIN, self.session, self.protocol, self.round, self.kind,
                              self.party, self.digest], use_bin_type=True)

    def describe(self) -> str:
        return f"the {self.kind!r} share of party {self.party}"


class Signer:
    """A party's signing key (never sent) and what lets others check it: its certificate
    (DER), or nothing when the verification keys were handed out directly."""

    __slots__ = ("_key", "certificate", "party")

    def __init__(self, party: int, key: SigningKey, certificate: bytes = b"") -> None:
        if not isinstance(key, SigningKey):
            raise InputError(f"party {party}'s signing key is a {type(key).__name__}: "
                             "fednorm signs with ECDSA or Ed25519 keys")
        self.party = party
        self._key = key
        self.certificate = certificate

    @classmethod
    def of_certificate(cls, party: int, key: object, cert: x509.Certificate) -> Signer:
        """Sign with the private key of ``cert``, which must be party ``party``'s."""
        named = certificate_party(cert)
        if named != party:
            raise InputError(f"the certificate is not party {party}'s (its CN names "
                             f"{'party ' + str(named) if named else 'no party'})")
        signer = cls(party, key, cert.public_bytes(serialization.Encoding.DER))  # type: ignore[arg-type]
        if _public_bytes(signer._key.public_key()) != _public_bytes(cert.public_key()):
            raise InputError(f"party {party}'s private key does not belong to its certificate")
        return signer

    def sign(self, statement: Statement) -> bytes:
        if statement.party != self.party:
            raise InputError(f"party {self.party} cannot sign for party {statement.party}")
        if isinstance(self._key, ec.EllipticCurvePrivateKey):
            return self._key.sign(statement.encode(), ec.ECDSA(hashes.SHA256()))
        return self._key.sign(statement.encode())

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Signer holds a private key and cannot be pickled or copied")


class Verifier(Protocol):
    """Where a party gets the key that checks another party's signature."""

    def key_of(self, party: int, certificate: bytes) -> VerifyingKey:
        """Party ``party``'s verification key, given the certificate sent with its
        signature; ProtocolError if it cannot be trusted."""
        ...


class TrustedKeys:
    """Verification keys handed to every party directly (a trusted setup): no
    certificate is needed, and none is accepted."""

    def __init__(self, keys: Mapping[int, VerifyingKey]) -> None:
        self._keys = dict(keys)

    def key_of(self, party: int, certificate: bytes) -> VerifyingKey:
        if certificate:
            raise ProtocolError(f"a certificate came with party {party}'s signature, but "
                                "this federation's verification keys were handed out directly")
        if party not in self._keys:
            raise ProtocolError(f"no verification key for party {party}")
        return self._keys[party]


class CertificateAuthority:
    """Verification keys from party certificates the federation CA signed: a certificate
    passes if the CA issued it, it is valid now and its CN names the party it speaks for."""

    def __init__(self, ca: x509.Certificate) -> None:
        self._ca = ca
        self._checked: dict[tuple[int, bytes], VerifyingKey] = {}

    def key_of(self, party: int, certificate: bytes) -> VerifyingKey:
        key = self._checked.get((party, certificate))
        if key is None:
            key = self._check(party, certificate)
            self._checked[party, certificate] = key
        return key

    def _check(self, party: int, certificate: bytes) -> VerifyingKey:
        what = f"the certificate sent for party {party}"
        try:
            cert = x509.load_der_x509_certificate(certificate)
        except (ValueError, TypeError):
            raise ProtocolError(f"{what} is missing or unreadable") from None
        try:
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature):
            raise ProtocolError(f"{what} is not signed by the federation CA") from None
        now = datetime.datetime.now(datetime.timezone.utc)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise ProtocolError(f"{what} is not valid now")
        named = certificate_party(cert)
        if named != party:
            raise ProtocolError(f"{what} is {'party ' + str(named) if named else 'no party'}'s")
        key = cert.public_key()
        if not isinstance(key, VerifyingKey):
            raise ProtocolError(f"{what} holds a {type(key).__name__}, not an ECDSA or "
                                "Ed25519 key")
        return key


def verify(verifier: Verifier, statement: Statement, signature: object,
           certificate: object) -> None:
    """ProtocolError, naming the party and the share, unless ``signature`` is the
    statement's party's signature of it."""
    what = statement.describe()
    if not isinstance(signature, bytes) or not isinstance(certificate, bytes):
        raise ProtocolError(f"{what} carries a malformed signature")
    if not signature:
        raise ProtocolError(f"{what} is unsigned")
    key = verifier.key_of(statement.party, certificate)
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, statement.encode(), ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, statement.encode())
    except InvalidSignature:
        raise ProtocolError(f"{what}: the signature does not verify (not made by party "
                            f"{statement.party} for this share, session and round)") from None


@dataclass(frozen=True)
class Keyring:
    """What a party signs with, and how it checks the other parties' signatures."""

    signer: Signer
    verifier: Verifier

    @property
    def party(self) -> int:
        return self.signer.party


def trusted_setup(parties: Sequence[int]) -> dict[int, Keyring]:
    """A fresh Ed25519 key for each party, every public half handed to every party:
    for federations whose roles share one process (nothing crosses the server)."""
    keys = {party: ed25519.Ed25519PrivateKey.generate() for party in parties}
    verifier = TrustedKeys({party: key.public_key() for party, key in keys.items()})
    return {party: Keyring(Signer(party, key), verifier) for party, key in keys.items()}


def _public_bytes(key: object) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,  # type: ignore[attr-defined]
                            serialization.PublicFormat.SubjectPublicKeyInfo)
