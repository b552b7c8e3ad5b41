"""Certificates and TLS contexts of a multi-host federation: one CA, one server, N parties.

``fednorm certs init --parties N --out DIR`` writes this layout::

    DIR/ca.pem                  the federation's CA certificate: every host needs it
    DIR/ca.key                  the CA's private key: only for issuing, keep it offline
    DIR/server.pem, server.key  the server's certificate (SAN localhost, 127.0.0.1, ::1,
                                and every --host) and key
    DIR/party-<i>.pem, .key     party i's client certificate (CN "party-<i>") and key,
                                which also signs its key shares (:func:`party_keyring`)

Keys are written 0600.  The server's host needs ``ca.pem`` and ``server.*``; party i's
host needs ``ca.pem`` and ``party-<i>.*``.  Both sides require the peer's certificate
(mutual TLS, TLS 1.2 or later), and the server takes a party's id from the CN of its
client certificate: the CA, not the party, decides who is party 3.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fednorm.engine import signing
from fednorm.engine.errors import InputError
from fednorm.engine.signing import (
    CertificateAuthority,
    Keyring,
    Signer,
    party_from_cn,
    party_name,
)

CA_NAME = "ca"
SERVER_NAME = "server"
DEFAULT_SAN = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path

    @classmethod
    def named(cls, directory: Path, stem: str) -> CertPair:
        return cls(directory / f"{stem}.pem", directory / f"{stem}.key")

    def check(self, what: str) -> None:
        """Fail early, before any connection, when a file is missing."""
        for path in (self.cert, self.key):
            if not path.is_file():
                raise InputError(f"no {what} certificate: {path} is missing")


@dataclass(frozen=True)
class PartyFiles:
    """A party's PEM files under any names: the federation's CA certificate, the party's
    certificate and its private key (what a certs directory holds as ``ca.pem``,
    ``party-<i>.pem`` and ``party-<i>.key``)."""

    ca: Path
    cert: Path
    key: Path

    def __post_init__(self) -> None:
        for name in ("ca", "cert", "key"):  # str paths are welcome too
            object.__setattr__(self, name, Path(getattr(self, name)))

    @classmethod
    def of(cls, where: Credentials, party: int) -> PartyFiles:
        """``where`` itself, or party ``party``'s files in a certs directory."""
        if isinstance(where, PartyFiles):
            if not where.ca.is_file():
                raise InputError(f"no CA certificate: {where.ca} is missing")
            return where
        pair = CertPair.named(Path(where), party_name(party))
        return cls(ca_file(Path(where)), pair.cert, pair.key)

    @property
    def pair(self) -> CertPair:
        return CertPair(self.cert, self.key)


Credentials = Path | PartyFiles
"""Where a party's certificates are: a certs directory (``fednorm certs init``), or the
files themselves (:class:`PartyFiles`)."""


def ca_file(directory: Path) -> Path:
    path = Path(directory) / f"{CA_NAME}.pem"
    if not path.is_file():
        raise InputError(f"{directory} is not a certs directory: {path.name} is missing "
                         "(create one with 'fednorm certs init')")
    return path


# -- contexts -------------------------------------------------------------------------
def _context(server_side: bool, ca: Path, pair: CertPair) -> ssl.SSLContext:
    """A context that requires a peer certificate from our CA, TLS 1.2 or later."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        context.load_verify_locations(cafile=str(ca))
        context.load_cert_chain(str(pair.cert), str(pair.key))
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"cannot load certificates {pair.cert.name}/{pair.key.name} "
                         f"with {ca.name}: {exc}") from None
    return context


def server_context(directory: Path) -> ssl.SSLContext:
    """The server's side of mutual TLS: it presents server.pem and verifies parties."""
    directory = Path(directory)
    ca = ca_file(directory)
    pair = CertPair.named(directory, SERVER_NAME)
    pair.check("server")
    return _context(True, ca, pair)


def party_context(where: Credentials, party: int) -> ssl.SSLContext:
    """Party ``party``'s side: it presents its own certificate and checks the server's name.

    The certificate's CN is checked here too, so a renamed file fails before connecting
    instead of being refused by the server.
    """
    files = PartyFiles.of(where, party)
    pair = files.pair
    pair.check(f"party {party}")
    holder = certificate_party(pair.cert)
    if holder != party:
        raise InputError(f"{pair.cert} is not party {party}'s certificate (CN names "
                         f"{'party ' + str(holder) if holder else 'no party'})")
    return _context(False, files.ca, pair)


def party_keyring(where: Credentials, party: int) -> Keyring:
    """Party ``party``'s signing key for its key shares: the private key of its
    certificate, which goes along with each signature, and the federation CA, against
    which it checks the certificates that come with the other parties' signatures
    (:mod:`fednorm.engine.signing`)."""
    files = PartyFiles.of(where, party)
    ca = _load_certificate(files.ca)
    pair = files.pair
    pair.check(f"party {party}")
    try:
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"cannot read the private key {pair.key}: {exc}") from None
    signer = Signer.of_certificate(party, key, _load_certificate(pair.cert))
    return Keyring(signer, CertificateAuthority(ca))


def _load_certificate(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read certificate {path}: {exc}") from None


# -- identities -----------------------------------------------------------------------
def peer_party(peer_cert: Mapping[str, Any] | None) -> int | None:
    """The party id of a verified peer certificate (``SSLObject.getpeercert()``)."""
    for rdn in (peer_cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return party_from_cn(value)
    return None


def certificate_party(path: Path) -> int | None:
    """The party id a certificate file was issued to."""
    return signing.certificate_party(_load_certificate(path))


# -- issuing --------------------------------------------------------------------------
def init_certs(
    out: Path, parties: int, hosts: Sequence[str] = (), *, days: int = 365, force: bool = False
) -> list[Path]:
    """Create a CA, a server certificate and one certificate per party in ``out``.

    Refuses to overwrite an existing CA unless ``force``: reissuing it would silently
    invalidate the certificates already handed out to the other hosts.
    """
    if parties < 1:
        raise InputError(f"--parties must be at least 1, got {parties}")
    if days < 1:
        raise InputError(f"--days must be at least 1, got {days}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if (out / f"{CA_NAME}.pem").exists() and not force:
        raise InputError(f"{out} already holds a CA; pass --force to replace every certificate")
    names = [*DEFAULT_SAN, *(h for h in hosts if h not in DEFAULT_SAN)]
    out.mkdir(parents=True, exist_ok=True)
    issuer = _Issuer.create(days)
    written = issuer.write(out, CA_NAME)
    written += issuer.issue(SERVER_NAME, "fednorm server", server=True, hosts=names).write(
        out, SERVER_NAME)
    for party in range(1, parties + 1):
        name = party_name(party)
        written += issuer.issue(name, name, server=False).write(out, name)
    return written


@dataclass
class _Issued:
    """A freshly made certificate and key, not yet on disk."""

    cert: Any
    key: Any

    def write(self, directory: Path, stem: str) -> list[Path]:

        pair = CertPair.named(directory, stem)
        pair.cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key_pem = self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(pair.key, key_pem)
        return [pair.cert, pair.key]


def _write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only (0600), even if the file existed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass
class _Issuer(_Issued):
    """The federation's CA: a self-signed certificate that signs the others."""

    days: int = 365

    @classmethod
    def create(cls, days: int) -> _Issuer:

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fednorm federation CA")])
        builder = _builder(name, name, key.public_key(), days).add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True
        ).add_extension(
            _key_usage(cert_sign=True), critical=True
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        return cls(_sign(builder, key), key, days)

    def issue(self, stem: str, common_name: str, *, server: bool,
              hosts: Sequence[str] = ()) -> _Issued:

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(subject, self.cert.subject, key.public_key(), self.days).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).add_extension(
            _key_usage(cert_sign=False), critical=True
        ).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
            critical=False,
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(host) for host in hosts]), critical=False
            )
        return _Issued(_sign(builder, self.key), key)


def _builder(subject: Any, issuer: Any, public_key: Any, days: int) -> Any:

    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, cert_sign: bool) -> Any:

    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )


def _sign(builder: Any, key: Any) -> Any:

    return builder.sign(key, hashes.SHA256())


def _san(host: str) -> Any:
    """An IP address entry for an address, a DNS entry for a name."""

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
