"""The messages of the collective sub-protocols that the engine does not define: the
server's requests (decrypt, bootstrap) and its relays of the parties' uploads.

Shares, and the server's announcements of the joint keys, are the engine's own messages
(:mod:`fednorm.engine.ckks.multiparty`: a key setup's :class:`~fednorm.engine.ckks.
LeadKeys`, :class:`~fednorm.engine.ckks.KeyShares`, :class:`~fednorm.engine.ckks.
JointRoundOne`, :class:`~fednorm.engine.ckks.RelinRound2` and :class:`~fednorm.engine.
ckks.KeyDigests`, a :class:`~fednorm.engine.ckks.DecryptionShare`, a
:class:`~fednorm.engine.ckks.BootstrapShare`), so what arrives is what the engine
checks.  Kinds and fields are the wire format: changing one changes the
bytes sent.
"""

from __future__ import annotations

import math

import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.protocols.collective.sums import InputUpload, ProductUpload, SumUpload


# -- decryption ----------------------------------------------------------------------------
@message("ckks.decrypt_request")
class DecryptRequest(Message):
    """Decrypt this (prepared) ciphertext: every party answers a
    :class:`~fednorm.engine.ckks.DecryptionShare`, flooded by the noise the step
    declares (``noise_kind`` empty: not flooded; :class:`~fednorm.engine.ckks.
    DecryptionNoise`), which a party replaying the step
    checks against its own (:class:`~fednorm.protocols.ppf.driver.Replay`)."""

    ciphertext: openfhe.Ciphertext
    noise_kind: str = ""
    noise_log2: float = 0.0
    noise_parties: int = 0

    @classmethod
    def of(cls, ciphertext: openfhe.Ciphertext, noise: ckks.DecryptionNoise | None
           ) -> DecryptRequest:
        if noise is None:
            return cls(ciphertext=ciphertext)
        return cls(ciphertext=ciphertext, noise_kind=noise.kind, noise_log2=noise.log2_sigma,
                   noise_parties=noise.calibrated_parties)

    def declared_noise(self) -> ckks.DecryptionNoise | None:
        """The noise the request declares; ProtocolError if its fields are malformed."""
        if self.noise_kind == "":
            return None
        if (not isinstance(self.noise_kind, str) or not isinstance(self.noise_log2, float)
                or not math.isfinite(self.noise_log2) or isinstance(self.noise_parties, bool)
                or not isinstance(self.noise_parties, int) or self.noise_parties < 1):
            raise ProtocolError("decryption request refused: its declared noise is malformed")
        return ckks.DecryptionNoise(self.noise_kind, self.noise_log2, self.noise_parties)


@message("ckks.decrypt_sum_request")
class SumDecryptRequest(Message):
    """Decrypt the sum of every party's sum upload #``index``, whose P uploads follow in
    this sub-protocol, one :class:`RelayedUpload` a frame, in party order: every party
    checks their signatures, recomputes the sum and floods its share (docs/LEAKAGE.md)."""

    index: int


@message("ckks.decrypt_product_request")
class ProductDecryptRequest(Message):
    """Decrypt the product of every party's product upload #``index``, whose P uploads
    follow as for a sum (:class:`SumDecryptRequest`): every party checks their
    signatures, recomputes the product by the same tree and floods its share
    (docs/LEAKAGE.md)."""

    index: int


@message("ckks.decrypt_coefficients_request")
class CoefficientDecryptRequest(Message):
    """Decrypt the sum of every party's coefficient upload #``index`` (masked bits, exact
    sums), whose P uploads follow as for a sum (:class:`SumDecryptRequest`): every party checks
    their signatures, recomputes the sum and floods its share (docs/LEAKAGE.md)."""

    index: int


# -- bootstrapping -------------------------------------------------------------------------
@message("ckks.boot_request")
class BootRequest(Message):
    """Bootstrap ``c1``; the common random element is the joint key's ``index``-th, which
    every party derives itself (:meth:`fednorm.engine.ckks.Bootstrap.common_element`): a
    server cannot pick it, and a party refuses an index it did not expect."""

    c1: openfhe.Ciphertext
    index: int


# -- relays --------------------------------------------------------------------------------
@message("ckks.relayed_upload")
class RelayedUpload(Message):
    """One party's signed upload #``index`` (of any kind), relayed to every party: the
    server relays each party's in party order, one a frame, so a frame stays the size of
    one upload at any P, within a TCP link's frame limit.  Each party checks every
    signature and combines the uploads itself (:mod:`.sums`): the inputs of the server's
    encrypted computation, and what a sum or product decryption request decrypts."""

    index: int
    upload: InputUpload | SumUpload | ProductUpload
