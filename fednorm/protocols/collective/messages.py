"""The messages of the collective sub-protocols, and the shares they carry.

Each share message says what it is a share of: its kind names the operation and round
(``ckks.relin_round2``, ``ckks.boot_share``, ...), its fields the parts; ``shares`` /
``of`` turn it into the engine's typed share (:mod:`fednorm.engine.ckks.collective`)
and back.  Kinds and fields are the wire format: changing one changes the bytes sent.
"""

from __future__ import annotations

import dataclasses

import openfhe

from fednorm.engine import ckks
from fednorm.engine.messages import Message, message


# -- key setup -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class _SetupShareFields(Message):
    """A party's first share of each key operation of the setup (None: not needed)."""

    public_key: openfhe.PublicKey
    relin_share: openfhe.EvalKey | None
    rotation_share: openfhe.EvalKeyMap | None

    def shares(self, setup: ckks.KeySetup) -> ckks.SetupShares:
        """The typed shares; ProtocolError if one the setup needs is missing."""
        shares = ckks.SetupShares(
            public_key=ckks.PublicKeyShare(self.public_key),
            relin=None if self.relin_share is None or setup.relin is None
            else ckks.RelinShare(1, self.relin_share),
            rotation=None if self.rotation_share is None or setup.rotation is None
            else ckks.RotationShare(setup.rotation.indices, self.rotation_share))
        setup.require_complete(shares)
        return shares

    @classmethod
    def of(cls, shares: ckks.SetupShares) -> _SetupShareFields:
        return cls(public_key=shares.public_key.key,
                   relin_share=shares.relin.key if shares.relin else None,
                   rotation_share=shares.rotation.keys if shares.rotation else None)


@message("ckks.lead_keys")
class LeadKeys(_SetupShareFields):
    """The lead's shares: the common elements every other party's shares are made on
    (the server forwards them)."""


@message("ckks.key_shares")
class KeyShares(_SetupShareFields):
    """Another party's shares, made on the lead's."""


@message("ckks.joint_round1")
class JointRound1(Message):
    """The joint public key, whose shares it sums (party tags, lead first) and, with
    relinearization, the sum of the round-1 relinearization shares."""

    public_key: openfhe.PublicKey
    party_tags: list[str]
    relin_round1: openfhe.EvalKey | None

    def round_one(self) -> ckks.JointRoundOne:
        joint = ckks.JointKeys(public_key=self.public_key, tag=self.public_key.GetKeyTag(),
                               party_tags=tuple(self.party_tags))
        return ckks.JointRoundOne(joint, self.relin_round1)

    @classmethod
    def of(cls, round_one: ckks.JointRoundOne) -> JointRound1:
        joint = round_one.joint
        return cls(public_key=joint.public_key, party_tags=list(joint.party_tags),
                   relin_round1=round_one.relin)


@message("ckks.relin_round2")
class RelinRound2(Message):
    """A party's round-2 relinearization share."""

    share: openfhe.EvalKey

    def as_share(self) -> ckks.RelinShare:
        return ckks.RelinShare(2, self.share)


@message("ckks.setup_done")
class SetupDone(Message):
    """The joint keys are ready: the protocol proper may start."""


# -- decryption ----------------------------------------------------------------------------
@message("ckks.decrypt_request")
class DecryptRequest(Message):
    """Decrypt this (prepared) ciphertext: every party answers a :class:`DecryptShare`."""

    ciphertext: openfhe.Ciphertext


@message("ckks.decrypt_sum_request")
class SumDecryptRequest(Message):
    """Decrypt a sum of fresh uploads: every party floods its share (docs/LEAKAGE.md)."""

    ciphertext: openfhe.Ciphertext


@message("ckks.decrypt_share")
class DecryptShare(Message):
    """A party's decryption share; flooded or not is told by the request it answers
    (its sub-protocol, ``decrypt`` or ``decrypt_sum``)."""

    share: openfhe.Ciphertext

    def as_share(self, decryption: ckks.Decryption) -> ckks.DecryptionShare:
        return ckks.DecryptionShare(decryption.flooded, self.share)

    @classmethod
    def of(cls, share: ckks.DecryptionShare) -> DecryptShare:
        return cls(share=share.ciphertext)


# -- bootstrapping -------------------------------------------------------------------------
@message("ckks.boot_request")
class BootRequest(Message):
    """Bootstrap ``c1``; the common random element is the joint key's ``index``-th, which
    every party derives itself (:meth:`fednorm.engine.ckks.Bootstrap.common_element`): a
    server cannot pick it, and a party refuses an index it did not expect."""

    c1: openfhe.Ciphertext
    index: int


@message("ckks.boot_share")
class BootShare(Message):
    """A party's bootstrap share (h0, h1) of the request it answers."""

    h0: openfhe.Ciphertext
    h1: openfhe.Ciphertext

    def as_share(self, index: int) -> ckks.BootstrapShare:
        return ckks.BootstrapShare(index, self.h0, self.h1)

    @classmethod
    def of(cls, share: ckks.BootstrapShare) -> BootShare:
        return cls(h0=share.h0, h1=share.h1)
