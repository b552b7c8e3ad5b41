"""Sum uploads that every party can recompute: signed by their makers, pooled in public.

A flooded sum decryption reveals the sum of one value per party (counts, Σx, ...).  Its
request used to carry the ciphertext to decrypt, which a party could only check for
shape: a server could ask for a party's *own* upload in place of the sum and read it.  So
a sum upload is signed by the party that made it (:class:`SumUpload`: its index among this
party's sum uploads under the session's keys, the digest of the ciphertext), the request
relays every party's upload of one index, and each party checks every signature, checks
that its own entry is what it sent, and decrypts the sum *it computes itself*
(:func:`pool`, in party order, as the server does).  A set of uploads is decrypted once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgpack
import openfhe

from fednorm.engine import ckks, signing
from fednorm.engine.errors import ProtocolError

SUM_UPLOAD_EXT = 24  # the codec's ext code for a SumUpload
KIND = "ckks.sum_upload"  # what a sum upload's signature says it signs


@dataclass(frozen=True, eq=False)
class SumUpload:
    """A party's ciphertext that the server only adds up and decrypts as a sum, signed
    by the party (``signature``; ``certificate`` its federation certificate, or empty)."""

    index: int
    ciphertext: openfhe.Ciphertext
    signature: bytes
    certificate: bytes


@dataclass(frozen=True)
class PooledSum:
    """The server's sum of one index's uploads, and the uploads it relays to have it
    decrypted (every party recomputes the sum from them)."""

    index: int
    uploads: tuple[SumUpload, ...]  # in party order
    total: openfhe.Ciphertext


def statement(session: str, party: int, index: int, digest: bytes) -> signing.Statement:
    """What party ``party`` signs for its ``index``-th sum upload of ``session``."""
    return signing.Statement(session, KIND, index, KIND, party, digest)


def upload_digest(ciphertext: openfhe.Ciphertext) -> bytes:
    """The digest a party signs its sum upload with: of the ciphertext as a receiver will
    parse it (a ciphertext made in this process serializes other bytes than its parsed
    copy, see :func:`fednorm.engine.ckks.serial.object_digest`); a receiver holds the
    parsed copy and digests it as it is."""
    parsed = ckks.serial.deserialize(openfhe.DeserializeCiphertextString,
                                     openfhe.Serialize(ciphertext, openfhe.BINARY))
    return ckks.object_digest(parsed)


def sign_upload(keyring: signing.Keyring, session: str, index: int,
                ciphertext: openfhe.Ciphertext) -> tuple[SumUpload, bytes]:
    """This party's ``index``-th sum upload, signed, and the digest it signed."""
    digest = upload_digest(ciphertext)
    signature = keyring.signer.sign(statement(session, keyring.party, index, digest))
    return SumUpload(index, ciphertext, signature, keyring.signer.certificate), digest


def pool(context: ckks.CkksContext, uploads: Mapping[int, object]) -> PooledSum:
    """Server: the sum of every party's upload of one index (ProtocolError naming the
    party that sent something else)."""
    ordered = []
    for party in sorted(uploads):
        upload = uploads[party]
        if not isinstance(upload, SumUpload):
            raise ProtocolError(f"party {party} sent a {type(upload).__name__}, not a signed "
                                "sum upload")
        ordered.append(upload)
    indices = {upload.index for upload in ordered}
    if len(indices) != 1:
        raise ProtocolError(f"the parties' sum uploads are of different indices {indices}")
    return PooledSum(indices.pop(), tuple(ordered), total_of(context, ordered))


def total_of(context: ckks.CkksContext, uploads: Sequence[SumUpload]) -> openfhe.Ciphertext:
    """Σ of the uploads' ciphertexts, in the order given (party order on both sides)."""
    total = uploads[0].ciphertext
    for upload in uploads[1:]:
        total = context.add(total, upload.ciphertext)
    return total


def verified_total(context: ckks.CkksContext, keyring: signing.Keyring, session: str,
                   parties: Sequence[int], index: int, uploads: Sequence[object],
                   own_digest: bytes) -> openfhe.Ciphertext:
    """Party: the sum to decrypt, recomputed from the relayed ``uploads`` after checking
    that there is one per party, each signed by its party for ``index`` of this session,
    and this party's own entry is the one it sent (digest ``own_digest``)."""
    if len(uploads) != len(parties):
        raise ProtocolError(f"a sum decryption request relays {len(uploads)} uploads for "
                            f"{len(parties)} parties")
    checked = []
    for party, upload in zip(parties, uploads, strict=True):
        if not isinstance(upload, SumUpload) or upload.index != index:
            raise ProtocolError(f"a sum decryption request relays, as party {party}'s, "
                                f"something other than its sum upload #{index}")
        digest = ckks.object_digest(upload.ciphertext)  # parsed from the request
        if party == keyring.party and digest != own_digest:
            raise ProtocolError(f"a sum decryption request relays, as this party's upload "
                                f"#{index}, a ciphertext it did not send")
        try:
            signing.verify(keyring.verifier, statement(session, party, index, digest),
                           upload.signature, upload.certificate)
        except ProtocolError as exc:
            raise ProtocolError(f"a sum decryption request relays a forged upload: {exc}"
                                ) from None
        checked.append(upload)
    return total_of(context, checked)


def register_codec(context: ckks.CkksContext, register) -> None:  # type: ignore[no-untyped-def]
    """Teach the codec to carry :class:`SumUpload` (its ciphertext as the context frames
    it)."""
    def encode(upload: SumUpload) -> bytes:
        return msgpack.packb([upload.index, context.to_bytes(upload.ciphertext),
                              upload.signature, upload.certificate], use_bin_type=True)

    def decode(data: bytes) -> SumUpload:
        try:
            index, body, signature, certificate = msgpack.unpackb(data, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            raise ProtocolError("malformed sum upload in frame") from None
        if not isinstance(index, int) or not all(
                isinstance(b, bytes) for b in (body, signature, certificate)):
            raise ProtocolError("malformed sum upload in frame")
        return SumUpload(index, context.from_bytes("ciphertext", body), signature,
                         certificate)

    register(SUM_UPLOAD_EXT, SumUpload, encode, decode)
