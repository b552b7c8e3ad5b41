"""Collective decryption, plain and flooded (a sum of uploads).

Noise of a plain collective decryption (``fednorm bench --sections noise`` with the
table's ``--preset`` and ``--parties``, :mod:`fednorm.bench.noise`; max |error| over all
slots of a fresh encryption of x in [-1, 1], shares compressed to 2 towers — compression
changes nothing measurable):

    ======  =========================  =================  ==================
    preset  parties                    scale 2^50         doubled scale
    ======  =========================  =================  ==================
    test    P=3                        7.6e-7             4.0e-10
    test    P=10                       1.6e-6             7.5e-10
    paper   P=3                        1.2e-6             1.0e-9
    paper   P=10                       2.1e-6             1.7e-9
    ======  =========================  =================  ==================

OpenFHE adds a fixed Gaussian (σ = 2^20, in the ring) to each share, so the error is
absolute, grows roughly like sqrt(P), and shrinks by ~2^50 when the scale is doubled
(:meth:`Decryption.prepare`, or decrypting right after a multiplication), leaving only
the ciphertext's own noise.  That fixed noise is *not* flooding: the server sees the
ciphertext's noise through such decryptions.  Flooded decryptions of sums are
:class:`SumDecryption`, of computed ciphertexts :class:`FloodedDecryption` (see
:mod:`..flooding` and docs/LEAKAGE.md).  Decoding also adds
noise sized by the *largest* slot, so decrypt values of very different magnitudes apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.decoding import exact_coefficients, fused_residues, fused_slots
from fednorm.engine.ckks.flooding import (
    FLOODED_TOWERS,
    DecryptionNoise,
    Flooding,
    MeasuredFlooding,
)
from fednorm.engine.ckks.keys import (
    DECRYPT_SHARE_TOWERS,
    JointKeys,
    PartyKeys,
    decrypt_share_towers,
)
from fednorm.engine.ckks.multiparty.checks import (
    require_like,
    require_shares,
    require_tag,
    require_tags,
)
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, message

_DECODE_OVERFLOW = "approximation error is too high"


@message("ckks.decrypt_share")
class DecryptionShare(Message):
    """A party's partial decryption of one joint ciphertext, the message itself: the
    server checks what arrived (:meth:`Decryption.aggregate_shares`).  Whether it is
    flooded no share can show (its noise is the party's to add): the decryption that
    asked for it says, and a share of the wrong shape for it is refused."""

    share: openfhe.Ciphertext


class DecodeOverflow(ProtocolError):
    """The shares fused, but OpenFHE's decoding check failed: the ciphertext's noise is
    too large for its scale. Measured after a ciphertext-ciphertext product: quotients of
    2^42 and above (test preset; the noise grows with the values), so the caller may
    decrypt again at a public smaller scale; nothing else was learned.
    """


class Decryption:
    """Collective decryption of a joint ciphertext, revealing its slots to the server.

    Not flooded (docs/LEAKAGE.md, "Decryption noise"): for sums use :class:`SumDecryption`.
    """

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx

    def prepare(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        """Server, before asking for shares: compress ``ct`` to the towers a share keeps
        anyway (so the request is as small as the shares), then double its scale (one
        level), which cuts OpenFHE's fixed share noise from ~1e-6 to ~1e-9 absolute.

        Compress first: compressing after the doubling would rescale it away (measured
        2.3e-6 instead of 1.6e-9 absolute error).
        """
        compressed = self.ctx.raw.Compress(ct, DECRYPT_SHARE_TOWERS + 1)
        return self.ctx.double_scale(compressed)

    def generate_share(self, keys: PartyKeys, ct: openfhe.Ciphertext) -> DecryptionShare:
        return DecryptionShare(keys.decrypt_share(ct))

    def aggregate_shares(self, joint: JointKeys, ct: openfhe.Ciphertext,
                         shares: Sequence[DecryptionShare]) -> openfhe.Plaintext:
        """Check the parties' shares of ``ct`` and fuse them (``MultipartyDecryptFusion``).

        A share of another ciphertext at the same level and scale cannot be told apart
        here; fusion then fails its CKKS sanity check (ProtocolError) or returns wrong
        values.
        """
        self._check_shares(joint, ct, shares)
        try:
            return self.ctx.raw.MultipartyDecryptFusion([share.share for share in shares])
        except RuntimeError as exc:
            if _DECODE_OVERFLOW in str(exc):
                raise DecodeOverflow(f"decrypted values too large to decode: {exc}") from None
            raise ProtocolError(f"decryption shares do not fuse: {exc}") from None

    def _check_shares(self, joint: JointKeys, ct: openfhe.Ciphertext,
                      shares: Sequence[DecryptionShare]) -> None:
        """ProtocolError unless ``shares`` are one per party, under the joint key, each
        shaped as a share of ``ct`` for this decryption (a flooded share is sent at other
        towers than a plain one)."""
        require_shares(shares, DecryptionShare, joint, "decryption share")
        require_tag(ct, joint.tag, "ciphertext to decrypt")
        like = _one_element(self._share_shape(ct))
        parts = [share.share for share in shares]
        for i, part in enumerate(parts):
            require_like(self.ctx, part, like, f"decryption share #{i}")
        require_tags(parts, [joint.tag] * len(parts), "decryption share")

    def finalize(self, plaintext: openfhe.Plaintext, n: int) -> np.ndarray:
        """The first ``n`` slot values: what the decryption reveals."""
        return self.ctx.decode(plaintext, n)

    def _share_shape(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        """``ct`` at the towers its shares are sent at (plain shares are compressed)."""
        return self.ctx.raw.Compress(ct, decrypt_share_towers(self.ctx, ct))


class _DecodedHere(Decryption):
    """A flooded decryption whose shares the server fuses and decodes itself
    (:mod:`..decoding`), not through OpenFHE: OpenFHE refuses slots whose noise exceeds
    2^-5, which flooding by design may, and its decoding adds a Gaussian as large as the
    noise it estimates, which would double the variance the flooding was sized for."""

    def aggregate_shares(self, joint: JointKeys, ct: openfhe.Ciphertext,  # type: ignore[override]
                         shares: Sequence[DecryptionShare]) -> np.ndarray:
        """Check the shares as :meth:`Decryption.aggregate_shares` does, then add them up
        and decode every slot here (:func:`~..decoding.fused_slots`)."""
        self._check_shares(joint, ct, shares)
        return fused_slots(self.ctx, [share.share for share in shares],
                           ct.GetScalingFactor())

    @property
    def positions(self) -> int:
        """Values one decryption holds: the slots."""
        return self.ctx.slots

    def finalize(self, plaintext: openfhe.Plaintext | np.ndarray, n: int) -> np.ndarray:
        """The first ``n`` values: what the decryption reveals."""
        if not 0 <= n <= self.positions:
            raise InputError(f"n={n} outside [0, {self.positions}]")
        return np.asarray(plaintext)[:n]


class _Flooded(Decryption):
    """A decryption whose shares each party floods, at the ciphertext's own towers.

    ``flooding`` (the party's s and τ, sized for what is decrypted) is needed only to
    generate shares; the server aggregates without it.
    """

    def __init__(self, ctx: CkksContext, flooding: Flooding | None = None) -> None:
        super().__init__(ctx)
        self.flooding = flooding

    def generate_share(self, keys: PartyKeys, ct: openfhe.Ciphertext) -> DecryptionShare:
        if self.flooding is None:
            raise InputError("a flooded decryption share needs the party's flooding")
        return DecryptionShare(keys.decrypt_sum_share(ct, self.flooding))

    def _share_shape(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        return ct


class SumDecryption(_Flooded):
    """Flooded collective decryption of a sum of the parties' sum uploads
    (:meth:`CkksContext.encrypt_sum`): shares at the sum's own towers and scale, each
    with noise √(12τ)·2^(s/2) times the sum's noise bound (:mod:`..flooding`).
    """

    def prepare(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        """A sum upload is decrypted as it is (its scale is already Δ²)."""
        return ct


class FloodedDecryption(_DecodedHere, _Flooded):
    """Flooded collective decryption of a computed ciphertext (the paper's algorithms: a
    comparison, a product of flags), sized by the noise its step declares, as measured
    (:class:`~..flooding.DecryptionNoise`).

    The request is the ciphertext compressed to :data:`~..flooding.FLOODED_TOWERS`
    towers at scale ≈ Δ, where the flooding fits the sampler; the shares are fused and
    decoded here (:class:`_DecodedHere`).
    """

    def __init__(self, ctx: CkksContext, noise: DecryptionNoise,
                 flooding: MeasuredFlooding | None = None) -> None:
        super().__init__(ctx, flooding)
        self.noise = noise

    def prepare(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        """``ct`` compressed (and so rescaled) to the flooded request's towers:
        deterministic, so every party recomputes the same bytes."""
        if self.ctx.towers(ct) - (ct.GetNoiseScaleDeg() - 1) < FLOODED_TOWERS:
            raise ProtocolError("a flooded decryption needs the ciphertext at 2 towers or "
                                "more after its rescale")
        return self.ctx.raw.Compress(ct, FLOODED_TOWERS)


class ProductDecryption(_DecodedHere, SumDecryption):
    """Flooded collective decryption of a product of the parties' product uploads: shares
    as a sum's, each flooded for the product's own noise bound
    (:class:`~..flooding.ProductFlooding`), decoded here (:class:`_DecodedHere`): the
    bits' noise is then the parties' flooding alone, whose σ is what decides how many
    decryptions a product may be flooded for and still read as bits (through OpenFHE's
    decoding it was √2 times that σ, read from the decoded slots of a real run in
    ``tests/test_flooding.py``)."""


class CoefficientSumDecryption(_DecodedHere, SumDecryption):
    """Flooded collective decryption of a sum of the parties' coefficient uploads
    (:mod:`..masking`): shares flooded as a sum's (:class:`~..flooding.
    CoefficientFlooding`); the server fuses them and reads the first coefficients as
    exact integers (no slot decoding, so each is off by the flooding alone, whatever
    the others hold); masked bits read them with :func:`~..masking.zero_bits`."""

    def aggregate_shares(self, joint: JointKeys, ct: openfhe.Ciphertext,  # type: ignore[override]
                         shares: Sequence[DecryptionShare]) -> list[np.ndarray]:
        """The fused shares' coefficient residues, tower by tower."""
        self._check_shares(joint, ct, shares)
        return fused_residues(self.ctx, [share.share for share in shares],
                              self.ctx.moduli[:self.ctx.towers(ct)])

    @property
    def positions(self) -> int:
        """Integers one decryption holds: one per coefficient of the ring."""
        return self.ctx.preset.ring_dim

    def finalize(self, plaintext: openfhe.Plaintext | list[np.ndarray], n: int  # type: ignore[override]
                 ) -> np.ndarray:
        """The first ``n`` coefficients, centered (Python integers, an object array)."""
        if not 0 <= n <= self.positions:
            raise InputError(f"n={n} outside [0, {self.positions}]")
        residues = list(plaintext)  # type: ignore[arg-type]
        return exact_coefficients(self.ctx.moduli[:len(residues)],
                                  [tower[:n] for tower in residues])


def _one_element(ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """``ct`` without its second element: the shape of a decryption share."""
    out = ct.Clone()
    if out.NumberCiphertextElements() > 1:
        out.RemoveElement(1)
    return out
