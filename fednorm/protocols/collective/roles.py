"""What each role holds once the keys are set up, and the collective calls it makes.

The server holds the context and the joint public material, never a secret; a party
holds its :class:`~fednorm.engine.ckks.PartyKeys` (secret, never sent) and the joint
public key.  :meth:`ServerCrypto.decrypt`, :meth:`~ServerCrypto.decrypt_sum`,
:meth:`~ServerCrypto.decrypt_product`, :meth:`~ServerCrypto.decrypt_coefficients` and
:meth:`~ServerCrypto.bootstrap` each run one
network round of a collective operation (:mod:`.decryption`, :mod:`.bootstrap`); a
party makes at most one share of any ciphertext (:meth:`PartyCrypto.claim_share`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.codec import register_ext_type
from fednorm.engine.errors import ProtocolError
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.collective import bootstrap, decryption, sums
from fednorm.protocols.collective.rounds import relay, relayed
from fednorm.protocols.collective.signatures import keyring_of
from fednorm.protocols.collective.sums import (
    AnUpload,
    CoefficientUpload,
    InputUpload,
    PooledUploads,
    ProductUpload,
    SignedUpload,
    SumUpload,
)


@cache
def _context(preset: str) -> ckks.CkksContext:
    return ckks.CkksContext(preset)


def shared_context(preset: str) -> ckks.CkksContext:
    """This process's CKKS context for ``preset``, its types registered with the codec.

    One context per process and preset: OpenFHE keeps evaluation keys in process-wide
    maps, so every role in a simulation shares it, as a real deployment has one per host.
    """
    context = _context(preset)
    context.register_codec_types(register_ext_type)
    sums.register_codec(context, register_ext_type)
    return context


class _OnHeldKeys:
    """A step's facade over the keys its role holds (``held``): their context and joint
    public material, read through."""

    held: ckks.HeldKeys

    @property
    def ckks(self) -> ckks.CkksContext:
        return self.held.ckks

    @property
    def joint(self) -> ckks.JointKeys:
        return self.held.joint  # a party's: its own aggregate of the signed key shares


@dataclass
class ServerCrypto(_OnHeldKeys):
    """The server's collective calls in one step, over ``rc``, on the keys it holds
    (``held``: no secret; they outlive the step in ``RoleContext.held_keys``).
    ``bootstraps`` and ``decryptions`` count this step's."""

    rc: RoleContext
    held: ckks.HeldKeys
    bootstraps: int = 0
    decryptions: int = 0

    def encrypt(self, values: np.ndarray) -> openfhe.Ciphertext:
        return self.ckks.encrypt(self.joint.public_key, values)

    async def decrypt(self, ct: openfhe.Ciphertext, n: int,
                      noise: ckks.DecryptionNoise | None) -> np.ndarray:
        """Collective decryption: the first ``n`` slots of ``ct``, revealed to the server,
        every share flooded by the ``noise`` the step declares (docs/LEAKAGE.md,
        "Decryption noise"); ``None``: not flooded, the ciphertext compressed and its
        scale doubled (:meth:`~fednorm.engine.ckks.Decryption.prepare`)."""
        return await decryption.decrypt(self, ct, n, noise)

    async def decrypt_shifted(self, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        """:meth:`decrypt` (not flooded) of ``ct`` once more, right after it failed to
        decode (values too large): its request times the public 2^-40, values scaled
        back — the one retry a phase may declare, which parties accept only bound to that
        request (:func:`~fednorm.protocols.collective.decryption.shifted`)."""
        return await decryption.decrypt_shifted(self, ct, n)

    async def decrypt_sum(self, pooled: PooledUploads, n: int) -> np.ndarray:
        """Flooded collective decryption of a sum of the parties' sum uploads
        (:meth:`PartyCrypto.encrypt_for_sum`, pooled by :meth:`add_all`): the first ``n``
        slots, to the server.  The request relays the signed uploads, from which every
        party recomputes the sum it decrypts (:mod:`.sums`).

        Each party adds noise √(12τ)·2^(s/2) times the sum's noise bound to its share
        (:mod:`~fednorm.engine.ckks.flooding`; docs/LEAKAGE.md gives the error it leaves).
        """
        return await decryption.decrypt_pooled(self, pooled, n)

    async def decrypt_product(self, pooled: PooledUploads, n: int) -> np.ndarray:
        """Flooded collective decryption of a product of the parties' product uploads
        (:meth:`PartyCrypto.encrypt_for_product`, pooled by :meth:`multiply_all`): the
        first ``n`` slots, to the server; every party recomputes the product (:mod:`.sums`).
        """
        return await decryption.decrypt_pooled(self, pooled, n)

    async def decrypt_coefficients(self, pooled: PooledUploads, n: int) -> np.ndarray:
        """Flooded collective decryption of a sum of the parties' coefficient uploads
        (pooled by :meth:`pool_coefficients`): its first ``n`` coefficients, exact
        integers up to the flooding; every party recomputes the sum (:mod:`.sums`)."""
        return await decryption.decrypt_pooled(self, pooled, n)

    async def decrypt_masked(self, pooled: PooledUploads, n: int) -> np.ndarray:
        """:meth:`decrypt_coefficients` of masked bits (:meth:`PartyCrypto.
        encrypt_masked`), read as the first ``n`` bits: 1 where every party's bit is 1
        (:func:`~fednorm.engine.ckks.masking.zero_bits`)."""
        coefficients = await self.decrypt_coefficients(pooled, n)
        return ckks.zero_bits(coefficients, self.ckks.moduli[:ckks.COEFFICIENT_TOWERS])

    async def bootstrap(self, ct: openfhe.Ciphertext, forward: bool = False
                        ) -> openfhe.Ciphertext:
        """Collective bootstrapping: same values, full level budget, nothing revealed;
        ``forward``: the parties recompute it, so they get every party's share."""
        return await bootstrap.bootstrap(self, ct, forward)

    async def add_all(self, cts: Mapping[int, openfhe.Ciphertext | SignedUpload]
                      ) -> openfhe.Ciphertext | PooledUploads:
        """⊕ over the parties' ciphertexts (by party id), each checked to be a joint one;
        over signed sum uploads, the :class:`PooledUploads` that keeps them for its
        decryption; over signed input uploads, their sum, once every party was sent them
        all (:func:`.rounds.relay`) to recompute it."""
        if any(isinstance(ct, SumUpload) for ct in cts.values()):
            return await self.rc.run_sync(self._pool, cts, SumUpload)
        if any(isinstance(ct, InputUpload) for ct in cts.values()):  # any group of parties
            pooled = await self.rc.run_sync(self._pool, cts, InputUpload, False)
            await relay(self.rc, pooled.index, pooled.uploads)
            return await self.rc.run_sync(pooled.combined, self.ckks)
        for party, ct in cts.items():
            self.check_joint(ct, f"ciphertext from party {party}")
        return await self.rc.run_sync(_sum, self.ckks, list(cts.values()))

    async def multiply_all(self, uploads: Mapping[int, object]) -> PooledUploads:
        """⊗ over every party's signed product upload of one index (by party id), by the
        fixed tree every party repeats (:func:`.sums.product_of`)."""
        return await self.rc.run_sync(self._pool, uploads, ProductUpload)

    async def pool_coefficients(self, uploads: Mapping[int, object]) -> PooledUploads:
        """Every party's signed coefficient upload of one index (by party id), checked, for
        :meth:`decrypt_coefficients`: the server only adds them up."""
        return await self.rc.run_sync(self._pool, uploads, CoefficientUpload)

    def _pool(self, uploads: Mapping[int, object], kind: type[SignedUpload],
              every_party: bool = True) -> PooledUploads:
        if every_party and sorted(uploads) != list(self.rc.parties):
            raise ProtocolError(f"a {kind.NOUN} needs one upload from every party")
        for party, upload in uploads.items():
            if isinstance(upload, SignedUpload):
                self.check_joint(upload.ciphertext, f"{kind.NOUN} upload from party {party}")
        return sums.pool(uploads, kind)

    def check_joint(self, ct: object, what: str) -> None:
        """ProtocolError unless ``ct`` is a ciphertext under this federation's joint key."""
        if not isinstance(ct, openfhe.Ciphertext):
            raise ProtocolError(f"{what} is a {type(ct).__name__}, not a ciphertext")
        self.ckks.check_same_context(ct, what)
        if ct.GetKeyTag() != self.joint.tag or ct.NumberCiphertextElements() != 2:
            raise ProtocolError(f"{what} is not encrypted under the joint public key")


@dataclass(kw_only=True)
class PartyKeyState(ckks.HeldKeys):
    """What a party holds of the joint keys between the steps of a session: its key
    share (secret, never sent), its own aggregate of the joint key, and the records
    that bind every share it makes under these keys."""

    keys: ckks.PartyKeys
    n_parties: int = 1  # P, public: the joint key's number of shares
    flooding_bits: int = ckks.flooding.DEFAULT_SECURITY_BITS  # s of every flooded share
    flooding_decryptions: int = ckks.flooding.DEFAULT_DECRYPTIONS  # τ these keys serve
    flooding_enabled: bool = True  # False only to measure its cost (FitOptions.flood)
    flooding_spent: Fraction = Fraction(0)
    """Of these keys' flooding budget (1): each flooded share spends 1/τ_k, τ_k the
    decryptions it was flooded for (:meth:`PartyCrypto.count_flooded_share`)."""
    own_uploads: dict[str, list[sums.OwnUpload]] = field(default_factory=dict)
    """Upload kind (:attr:`~.sums.SignedUpload.KIND`) → what was kept of each one sent."""
    decrypted_uploads: set[tuple[str, int]] = field(default_factory=set)
    """(upload kind, index) of every set of uploads decrypted."""
    shared: dict[bytes, str] = field(default_factory=dict)
    """:func:`share_digest` of every ciphertext this party made a share of under these
    keys (in every protocol of a session: a reuse of the keys keeps it) → the request."""

    @property
    def product_decryptions(self) -> int:
        """τ_p, what a product of the parties' bits is flooded for
        (:func:`.sums.product_decryptions`)."""
        return sums.product_decryptions(self.ckks.preset, self.n_parties, self.flooding_bits,
                                        self.flooding_decryptions)


@dataclass
class PartyCrypto(_OnHeldKeys):
    """A party's collective calls in one step, over ``rc``, on the keys it holds
    (``held``, which outlive the step in ``RoleContext.held_keys``)."""

    rc: RoleContext
    held: PartyKeyState

    @property
    def keys(self) -> ckks.PartyKeys:
        return self.held.keys

    @property
    def n_parties(self) -> int:
        return self.held.n_parties

    async def claim_share(self, request: str, ct: openfhe.Ciphertext) -> None:
        """Before making a share of ``ct`` (for ``request``, e.g. "bootstrap request"):
        ProtocolError if this party made one before, in any request.

        Two shares of one ciphertext with fresh noise let the server average that noise
        away (retrying a multiparty protocol is insecure), so each ciphertext gets one.
        """
        digest = await self.require_unshared(request, ct)
        self.held.shared[digest] = request

    async def require_unshared(self, request: str, ct: openfhe.Ciphertext) -> bytes:
        """ProtocolError if this party made a share of ``ct`` before; else its digest."""
        digest = await self.rc.run_sync(share_digest, ct)
        if digest in self.held.shared:
            raise ProtocolError(f"{request} refused: this party already made a share of "
                                f"that ciphertext (for a {self.held.shared[digest]})")
        return digest

    async def encrypt(self, values: np.ndarray, level: int = 0) -> openfhe.Ciphertext:
        """Encrypt under the joint key; ``level`` > 0 for a ciphertext the server only
        multiplies a few times (:meth:`~fednorm.engine.ckks.CkksContext.upload_level`)."""
        return await self.rc.run_sync(self.ckks.encrypt, self.public_key, values, level)

    async def encrypt_for_sum(self, values: np.ndarray) -> SumUpload:
        """Encrypt values the server only adds up and decrypts with :meth:`ServerCrypto.
        decrypt_sum` (counts, sums): scale Δ², 4 towers (2.1 MB instead of 6.3 MB at the
        paper preset), so the flooded decryption keeps its precision; signed by this
        party as its next sum upload of the session (:mod:`.sums`)."""
        ct = await self.rc.run_sync(self.ckks.encrypt_sum, self.public_key, values)
        return await self._signed(SumUpload, ct)

    async def encrypt_for_product(self, bits: np.ndarray) -> ProductUpload:
        """Encrypt bits the server only multiplies with the other parties' and decrypts
        with :meth:`ServerCrypto.decrypt_product`: at scale Δ² (so the product carries
        rescale roundings, not the ~16× larger encryption noise: :mod:`~fednorm.engine.
        ckks.flooding`), at the level whose product of P ends at the towers it is
        decrypted at (:func:`.sums.product_level`); signed by this party as its next
        product upload of the session."""
        level = sums.product_level(self.ckks.preset, self.n_parties)
        ct = await self.rc.run_sync(self.ckks.encrypt, self.public_key, bits, level, 2)
        return await self._signed(ProductUpload, ct)

    async def encrypt_masked(self, bits: np.ndarray) -> CoefficientUpload:
        """Encrypt bits as masked zeros (:func:`~fednorm.engine.ckks.masking.
        encrypt_masked`: 0 where a bit is 1, uniform in Z_Q where it is 0), which the
        server only adds up with the other parties' and decrypts with :meth:`ServerCrypto.
        decrypt_masked`; signed by this party as its next coefficient upload of the session."""
        ct = await self.rc.run_sync(ckks.encrypt_masked, self.ckks, self.public_key,
                                    np.asarray(bits) == 1.0)
        return await self._signed(CoefficientUpload, ct)

    async def encrypt_coefficients(self, integers: list[int]) -> CoefficientUpload:
        """Encrypt integers into the ring's coefficients (:func:`~fednorm.engine.ckks.
        masking.encrypt_coefficients`), which the server only adds up with the other
        parties' and decrypts with :meth:`ServerCrypto.decrypt_coefficients`; signed by
        this party as its next coefficient upload of the session."""
        ct = await self.rc.run_sync(ckks.encrypt_coefficients, self.ckks, self.public_key,
                                    integers)
        return await self._signed(CoefficientUpload, ct)

    async def encrypt_input(self, values: np.ndarray, level: int = 0) -> InputUpload:
        """Encrypt an input of the server's encrypted computation (:meth:`encrypt`), signed
        as this party's next input upload: the server relays every party's, so each can
        recompute what the server computes from them (:meth:`pooled_input`)."""
        return await self._signed(InputUpload, await self.encrypt(values, level))

    async def pooled_input(self, upload: InputUpload, parties: Sequence[int] | None = None
                           ) -> openfhe.Ciphertext:
        """The sum of every party's (or every one of ``parties``') input upload of
        ``upload``'s index, added up here from the server's relay, each checked
        (:func:`.sums.verified_combination`)."""
        parties = parties or range(1, self.n_parties + 1)
        request = "the relay of input uploads"
        uploads = await relayed(self.rc, upload.index, len(parties), request)
        return await self.recombined(InputUpload, upload.index, uploads, parties, request)

    async def recombined(self, kind: type[SignedUpload], index: int, uploads: list[object],
                         parties: Sequence[int] | None = None, request: str = ""
                         ) -> openfhe.Ciphertext:
        """The combination of the relayed ``uploads`` of ``kind`` #``index`` (of every
        party, or of ``parties``), made here once each is checked against this party's
        own upload #``index`` (:func:`.sums.verified_combination`)."""
        return await self.rc.run_sync(
            sums.verified_combination, self.ckks, keyring_of(self.rc), self.rc.session,
            parties or range(1, self.n_parties + 1), index, uploads,
            self.held.own_uploads[kind.KIND][index], kind, request)

    @property
    def public_key(self) -> openfhe.PublicKey:
        return self.joint.public_key

    async def _signed(self, kind: type[AnUpload], ct: openfhe.Ciphertext) -> AnUpload:
        """``ct`` signed as this party's next upload of ``kind``, bound to what the server
        told this party so far (:meth:`~fednorm.engine.runtime.RoleContext.transcript`),
        its digest kept."""
        sent = self.held.own_uploads.setdefault(kind.KIND, [])
        upload, own = await self.rc.run_sync(sums.sign_upload, keyring_of(self.rc),
                                             self.rc.session, len(sent), ct, kind,
                                             self.rc.transcript())
        sent.append(own)
        return upload

    def flooding(self, kind: type[ckks.Flooding] = ckks.Flooding) -> ckks.Flooding:
        """The noise this party adds to a share of a sum of the P parties' uploads (``kind``
        names the sum's shape: :class:`~fednorm.engine.ckks.CoefficientFlooding` for masked
        uploads)."""
        return kind(self.ckks.preset.ring_dim, self.n_parties, self.n_parties,
                    self.held.flooding_bits, self.held.flooding_decryptions,
                    enabled=self.held.flooding_enabled)

    def flooding_of(self, kind: type[SignedUpload], combined: openfhe.Ciphertext,
                    factor: openfhe.Ciphertext) -> ckks.Flooding:
        """The noise for a share of ``combined``, the P parties' uploads of ``kind``
        combined (``factor`` one of them): a sum's (a masked sum's at its shape), or a
        product's at its scale."""
        if kind is SumUpload:
            return self.flooding()
        if kind is CoefficientUpload:
            return self.flooding(ckks.CoefficientFlooding)
        growth = combined.GetScalingFactor() / factor.GetScalingFactor()
        return ckks.ProductFlooding(self.ckks.preset.ring_dim, self.n_parties,
                                    self.n_parties, self.held.flooding_bits,
                                    self.held.product_decryptions, growth,
                                    enabled=self.held.flooding_enabled)

    def measured_flooding(self, noise: ckks.DecryptionNoise, request: openfhe.Ciphertext
                          ) -> ckks.MeasuredFlooding:
        """The noise for a share of a computed ciphertext (``request``, as prepared),
        sized by the step's declared ``noise`` at the request's scale."""
        return ckks.MeasuredFlooding(self.ckks.preset.ring_dim, self.n_parties, 1,
                                     self.held.flooding_bits, self.held.flooding_decryptions,
                                     noise=noise, scale=request.GetScalingFactor(),
                                     enabled=self.held.flooding_enabled)

    def count_flooded_share(self, flooding: ckks.Flooding) -> None:
        """Spend 1/τ_k of these keys' flooding budget on a share flooded for τ_k =
        ``flooding.decryptions``; ProtocolError past the whole budget.  With every share
        flooded for the keys' τ that is τ shares; a product of many parties' bits,
        flooded for fewer decryptions, spends more (docs/LEAKAGE.md, "τ")."""
        spent = self.held.flooding_spent + Fraction(1, flooding.decryptions)
        if spent > 1:
            allowed, products = self.held.flooding_decryptions, self.held.product_decryptions
            weighted = (f" (a share of a product of bits counts as {allowed / products:.3g} "
                        "of them)" if products < allowed else "")
            raise ProtocolError(f"the server asked for more flooded decryptions than the "
                                f"τ = {allowed} these keys were declared for{weighted}")
        self.held.flooding_spent = spent


def share_digest(ct: openfhe.Ciphertext) -> bytes:
    """SHA-256 of what a party's share of ``ct`` depends on: its last element, c1.

    A decryption share is c1·s + e (plus c0 for the lead), a bootstrap share is made
    of c1 alone; so c1 is serialized without c0 and with the metadata that does not
    enter a share reset (scale, its degree, slots, hop level): a server cannot make a
    repeat look new by adding a constant (which changes c0 only) or relabelling it.
    """
    c1 = ct.Clone()
    while c1.NumberCiphertextElements() > 1:
        c1.RemoveElement(0)
    c1.SetNoiseScaleDeg(1)
    c1.SetScalingFactor(1.0)
    c1.SetSlots(1)
    c1.SetHopLevel(0)
    return hashlib.sha256(openfhe.Serialize(c1, openfhe.BINARY)).digest()


def _sum(context: ckks.CkksContext, cts: list[openfhe.Ciphertext]) -> openfhe.Ciphertext:
    total = cts[0]
    for ct in cts[1:]:
        total = context.add(total, ct)
    return total
