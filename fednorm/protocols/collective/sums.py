"""Signed uploads that every party can recompute: signed by their makers, pooled in public.

A flooded decryption reveals a sum of one value per party (counts, Σx, ...), the AND of
one bit vector per party (a sum of masked zeros, :mod:`fednorm.protocols.ppf.extremes`)
or a product of them (the paper z-score's presence bits).  Its request used to
carry the ciphertext to decrypt, which a party could only check for shape: a server could
ask for a party's *own* upload in place of the sum and read it.  So an upload is signed
by the party that made it (:class:`SignedUpload`: its index among this party's uploads of
that kind under the session's keys, the digest of the ciphertext), the request relays
every party's upload of one index, and each party checks every signature, checks that
its own entry is what it sent, and decrypts the combination *it computes itself* (in
party order, as the server does: :meth:`PooledUploads.combined`).  A set of uploads is
decrypted once.

The statement a party signs names the kind of its upload (:attr:`SignedUpload.KIND`), and
each kind has its own combination (:meth:`SignedUpload.combined`): a sum upload
(:class:`SumUpload`) is only ever added, a product upload (:class:`ProductUpload`) only
ever multiplied with the other parties', a coefficient upload (:class:`CoefficientUpload`)
only added and read coefficient by coefficient, so none can be decrypted as another, nor alone.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, TypeVar

import msgpack
import openfhe

from fednorm.engine import ckks, signing
from fednorm.engine.ckks.context import PRODUCT_TOWERS
from fednorm.engine.errors import InputError, ProtocolError


@dataclass(frozen=True, eq=False)
class SignedUpload(ABC):
    """A party's ciphertext that the server only combines with the other parties' of the
    same kind and index, signed by the party (``signature``; ``certificate`` its
    federation certificate, or empty)."""

    KIND: ClassVar[str]  # what the signature says it signs
    NOUN: ClassVar[str]  # the upload in a refusal: "sum", "product"
    EXT: ClassVar[int]  # the codec's ext code

    index: int
    ciphertext: openfhe.Ciphertext
    signature: bytes
    certificate: bytes

    @staticmethod
    @abstractmethod
    def combined(context: ckks.CkksContext, ciphertexts: Sequence[openfhe.Ciphertext]
                 ) -> openfhe.Ciphertext:
        """The one deterministic combination of the parties' ciphertexts, in party order."""


@dataclass(frozen=True, eq=False)
class _AddedUp(SignedUpload):
    """An upload the server only adds up with the other parties' of its kind."""

    @staticmethod
    def combined(context: ckks.CkksContext, ciphertexts: Sequence[openfhe.Ciphertext]
                 ) -> openfhe.Ciphertext:
        return total_of(context, ciphertexts)


@dataclass(frozen=True, eq=False)
class SumUpload(_AddedUp):
    """An upload the server only adds up and decrypts as a sum."""

    KIND = "ckks.sum_upload"
    NOUN = "sum"
    EXT = 24


@dataclass(frozen=True, eq=False)
class ProductUpload(SignedUpload):
    """An upload the server only multiplies with the other parties' (bits: the product is
    1 exactly where every party's bit is) and decrypts as a product."""

    KIND = "ckks.product_upload"
    NOUN = "product"
    EXT = 25

    @staticmethod
    def combined(context: ckks.CkksContext, ciphertexts: Sequence[openfhe.Ciphertext]
                 ) -> openfhe.Ciphertext:
        return product_of(context, ciphertexts)


@dataclass(frozen=True, eq=False)
class InputUpload(_AddedUp):
    """An input of the server's encrypted computation (the paper's algorithms: a count
    to invert, a numerator to divide): added up like a sum upload, but never decrypted
    as one.  The server relays every party's (:class:`~.messages.RelayedUpload`), so each
    party recomputes the pooled input, and from it every ciphertext the server will ask
    it to decrypt or refresh (:class:`~fednorm.protocols.ppf.driver.Replay`)."""

    KIND = "ckks.input_upload"
    NOUN = "input"
    EXT = 26


@dataclass(frozen=True, eq=False)
class CoefficientUpload(_AddedUp):
    """Integers written into the ring's coefficients (:mod:`fednorm.engine.ckks.masking`),
    which the server only adds up and whose sum decrypts exactly, coefficient by
    coefficient, up to the flooding: bits as masked zeros (0 where the bit is 1, uniform
    in Z_Q where it is 0: the sum is 0 exactly where every party's bit is 1, an AND from
    a sum, no product) or sums at public powers of two (no slot decoding, so no value's
    precision depends on another's)."""

    KIND = "ckks.coefficient_upload"
    NOUN = "coefficient"
    EXT = 27


AnUpload = TypeVar("AnUpload", bound=SignedUpload)
UPLOAD_KINDS: tuple[type[SignedUpload], ...] = (SumUpload, ProductUpload, InputUpload,
                                                CoefficientUpload)


@dataclass(frozen=True)
class PooledUploads:
    """One index's uploads of every party, checked, which the server relays to have their
    combination decrypted (every party recomputes it from them)."""

    index: int
    uploads: tuple[SignedUpload, ...]  # in party order

    @property
    def kind(self) -> type[SignedUpload]:
        return type(self.uploads[0])

    def combined(self, context: ckks.CkksContext) -> openfhe.Ciphertext:
        """The server's own combination, the shape the parties' shares must have: made
        while the parties make theirs (a product takes a while; :func:`combination`)."""
        return combination(context, self.kind, [u.ciphertext for u in self.uploads])


def combination(context: ckks.CkksContext, kind: type[SignedUpload],
                ciphertexts: Sequence[openfhe.Ciphertext],
                digests: Sequence[bytes] | None = None) -> openfhe.Ciphertext:
    """``kind``'s combination of ``ciphertexts`` (party order), deterministic.  While every
    role runs in this process (a simulation) it is made once for the server and all the
    parties, keyed by the uploads' digests (``digests``, where the caller has them), as
    each host makes its own at the same time in a deployment."""
    def key() -> tuple[object, ...]:
        return (kind.KIND, *(digests if digests is not None
                             else [parsed_digest(context, ct) for ct in ciphertexts]))

    return context.computed_once(key, lambda: kind.combined(context, ciphertexts))


def parsed_digest(context: ckks.CkksContext, ciphertext: openfhe.Ciphertext) -> bytes:
    """:func:`~fednorm.engine.ckks.object_digest` of a ciphertext parsed off the wire
    (once per parsed object in a simulation, whose parties share a broadcast's parse)."""
    return context.computed_once(("object_digest", ciphertext),
                                 partial(ckks.object_digest, ciphertext))


def statement(session: str, party: int, index: int, digest: bytes,
              kind: str = SumUpload.KIND) -> signing.Statement:
    """What party ``party`` signs for its ``index``-th upload of ``kind`` in ``session``."""
    return signing.Statement(session, kind, index, kind, party, digest)


@dataclass(frozen=True)
class OwnUpload:
    """What a party keeps of an upload it sent: its ciphertext's digest, and the digest
    of the server's messages it had received when it made it (its step's transcript)."""

    digest: bytes
    transcript: bytes = b""


def signed_digest(digest: bytes, transcript: bytes) -> bytes:
    """What a party's signature on an upload covers: the ciphertext's digest bound to its
    transcript, so that an upload verifies only for a party that was told the same."""
    return hashlib.sha256(b"fednorm.upload\0" + digest + transcript).digest()


def sign_upload(keyring: signing.Keyring, session: str, index: int,
                ciphertext: openfhe.Ciphertext, kind: type[AnUpload] = SumUpload,  # type: ignore[assignment]
                transcript: bytes = b"") -> tuple[AnUpload, OwnUpload]:
    """This party's ``index``-th upload of ``kind``, signed with ``transcript`` (the
    server's messages so far, :meth:`~fednorm.engine.runtime.RoleContext.transcript`),
    and what the party keeps of it."""
    own = OwnUpload(ckks.serial.ciphertext_digest_as_received(ciphertext), transcript)
    signature = keyring.signer.sign(statement(session, keyring.party, index,
                                              signed_digest(own.digest, transcript), kind.KIND))
    return kind(index, ciphertext, signature, keyring.signer.certificate), own


def pool(uploads: Mapping[int, object], kind: type[SignedUpload] = SumUpload
         ) -> PooledUploads:
    """Server: every party's upload of one index, in party order (ProtocolError naming
    the party that sent something else)."""
    ordered = []
    for party in sorted(uploads):
        upload = uploads[party]
        if type(upload) is not kind:
            raise ProtocolError(f"party {party} sent a {type(upload).__name__}, not a signed "
                                f"{kind.NOUN} upload")
        ordered.append(upload)
    indices = {upload.index for upload in ordered}
    if len(indices) != 1:
        raise ProtocolError(f"the parties' {kind.NOUN} uploads are of different indices "
                            f"{indices}")
    return PooledUploads(indices.pop(), tuple(ordered))


def total_of(context: ckks.CkksContext, ciphertexts: Sequence[openfhe.Ciphertext]
             ) -> openfhe.Ciphertext:
    """Σ of the ciphertexts, in the order given (party order on both sides)."""
    total = ciphertexts[0]
    for ct in ciphertexts[1:]:
        total = context.add(total, ct)
    return total


def product_of(context: ckks.CkksContext, ciphertexts: Sequence[openfhe.Ciphertext]
               ) -> openfhe.Ciphertext:
    """Π of the ciphertexts by a fixed tree: neighbours multiplied pairwise in the order
    given (an odd one out carried up), ⌈log2 P⌉ levels, each product relinearized and
    rescaled (lazily, by OpenFHE), then rescaled to :data:`~fednorm.engine.ckks.context.
    PRODUCT_TOWERS` towers at scale ≈ Δ, where its flooding noise fits the sampler
    (:mod:`fednorm.engine.ckks.flooding`) — deterministic, so server and parties get the
    same bytes.  A single ciphertext is multiplied by 1.0, so that every product takes
    the same path (:func:`product_level`)."""
    layer = list(ciphertexts)
    if len(layer) == 1:
        layer = [context.mul(layer[0], 1.0)]
    while len(layer) > 1:
        pairs = [context.mul(layer[i], layer[i + 1]) for i in range(0, len(layer) - 1, 2)]
        layer = pairs + layer[len(pairs) * 2:]
    return context.raw.Compress(layer[0], PRODUCT_TOWERS)


def product_levels(factors: int) -> int:
    """Levels the tree of :func:`product_of` takes: ⌈log2 P⌉, and 1 for a single factor."""
    return max(1, math.ceil(math.log2(factors)))


def product_level(preset: ckks.CkksPreset, factors: int) -> int:
    """The level parties encrypt product uploads at (scale Δ²): each is rescaled once
    before its first product, each of the tree's ⌈log2 P⌉ levels takes a tower, and the
    product ends one rescale above the decrypted :data:`~fednorm.engine.ckks.context.
    PRODUCT_TOWERS` (the smallest uploads and products that hold the flooded bits).
    InputError when the preset has too few levels for so many parties."""
    level = preset.towers - PRODUCT_TOWERS - 1 - product_levels(factors)
    if level < 0:
        most = 2 ** (preset.towers - PRODUCT_TOWERS - 1)
        raise InputError(f"a product of {factors} parties' uploads needs "
                         f"{product_levels(factors)} levels; preset "
                         f"{preset.name!r} multiplies at most {most} parties")
    return level


BIT_TOLERANCE = 0.25
"""How far a decrypted product of bits may lie from 0 or 1 (flooded, honest: within
~0.02 at P = 10)."""

BIT_MARGIN = 7.0
"""Standard deviations of the flooded product's noise that must fit in
:data:`BIT_TOLERANCE`: a value lands past it with probability ~3e-12 (a search reads
~10^5 of them)."""


def product_bit_noise(preset: ckks.CkksPreset, parties: int, flooding_bits: int,
                      flooding_decryptions: int) -> float:
    """σ of the noise all parties' flooding adds to each bit of a product of their bit
    uploads (scale Δ² each, the product decrypted at scale Δ), flooded for τ =
    ``flooding_decryptions`` decryptions.  It grows as P^1.5 (each party's σ is
    proportional to the product's noise bound, which grows as P) and as √τ: at the paper
    preset and s = 30, σ ≈ 0.008 at P = 10 and 0.24 at P = 100 for τ = 1024."""
    scale = 2.0 ** preset.scaling_mod_bits
    flooding = ckks.ProductFlooding(preset.ring_dim, parties, parties, flooding_bits,
                                    flooding_decryptions, growth=1 / scale)
    return flooding.slot_sigma(scale) * math.sqrt(parties)


def readable_product_decryptions(preset: ckks.CkksPreset, parties: int,
                                 flooding_bits: int) -> int:
    """The most decryptions a product of ``parties``' bits may be flooded for and still
    read as bits (σ at most :data:`BIT_TOLERANCE` / :data:`BIT_MARGIN`; σ grows as √τ);
    0 if not even one."""
    limit = BIT_TOLERANCE / BIT_MARGIN
    most = int((limit / product_bit_noise(preset, parties, flooding_bits, 1)) ** 2)
    while most > 0 and product_bit_noise(preset, parties, flooding_bits, most) > limit:
        most -= 1  # floating-point rounding at the boundary
    return most


def product_decryptions(preset: ckks.CkksPreset, parties: int, flooding_bits: int,
                        flooding_decryptions: int) -> int:
    """τ_p, the decryptions a product of ``parties``' bits is flooded for under keys
    declared for τ = ``flooding_decryptions``: τ, or fewer where √τ noise would drown the
    bits (:func:`readable_product_decryptions`); each such share then spends 1/τ_p of
    the keys' flooding budget instead of 1/τ (:mod:`fednorm.protocols.decryptions`)."""
    return min(flooding_decryptions,
               readable_product_decryptions(preset, parties, flooding_bits))


def verified_combination(context: ckks.CkksContext, keyring: signing.Keyring, session: str,
                         parties: Sequence[int], index: int, uploads: Sequence[object],
                         own: OwnUpload, kind: type[SignedUpload] = SumUpload,
                         request: str = ""
                         ) -> openfhe.Ciphertext:
    """Party: the combination to decrypt, recomputed from the relayed ``uploads`` after
    checking that there is one per party, each a ``kind`` upload signed by its party for
    ``index`` of this session after the server messages this party had received when it
    made its own (``own.transcript``), and this party's own entry is the one it sent
    (``own.digest``); ``request`` names what relayed them in a refusal."""
    request = request or f"a {kind.NOUN} decryption request"
    if len(uploads) != len(parties):
        raise ProtocolError(f"{request} relays {len(uploads)} uploads for "
                            f"{len(parties)} parties")
    checked, digests = [], []
    for party, upload in zip(parties, uploads, strict=True):
        if type(upload) is not kind or upload.index != index:
            raise ProtocolError(f"{request} relays, as party {party}'s, something other "
                                f"than its {kind.NOUN} upload #{index}")
        digest = parsed_digest(context, upload.ciphertext)
        if party == keyring.party and digest != own.digest:
            raise ProtocolError(f"{request} relays, as this party's upload #{index}, a "
                                "ciphertext it did not send")
        try:
            signing.verify(keyring.verifier, statement(
                session, party, index, signed_digest(digest, own.transcript), kind.KIND),
                upload.signature, upload.certificate)
        except ProtocolError as exc:
            raise ProtocolError(
                f"{request} relays a forged upload: party {party} did not sign this "
                "ciphertext after the server messages this party received (made by "
                f"another, or the server told the parties different things): {exc}"
            ) from None
        checked.append(upload.ciphertext)
        digests.append(digest)
    return combination(context, kind, checked, digests)


def register_codec(context: ckks.CkksContext, register) -> None:  # type: ignore[no-untyped-def]
    """Teach the codec to carry every kind of signed upload (its ciphertext as the context
    frames it)."""
    for kind in UPLOAD_KINDS:
        _register_kind(context, register, kind)


def _register_kind(context: ckks.CkksContext, register,  # type: ignore[no-untyped-def]
                   kind: type[SignedUpload]) -> None:
    def encode(upload: SignedUpload) -> bytes:
        return msgpack.packb([upload.index, context.to_bytes(upload.ciphertext),
                              upload.signature, upload.certificate], use_bin_type=True)

    def decode(data: bytes) -> SignedUpload:
        try:
            index, body, signature, certificate = msgpack.unpackb(data, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            raise ProtocolError(f"malformed {kind.NOUN} upload in frame") from None
        if not isinstance(index, int) or not all(
                isinstance(b, bytes) for b in (body, signature, certificate)):
            raise ProtocolError(f"malformed {kind.NOUN} upload in frame")
        return kind(index, context.from_bytes("ciphertext", body), signature, certificate)

    register(kind.EXT, kind, encode, decode, relayed=True)  # the server relays uploads
