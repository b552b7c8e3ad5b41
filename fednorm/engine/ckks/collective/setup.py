"""Key setup: the key operations one protocol needs, composed into three rounds.

:class:`KeySetup` runs :class:`PublicKeyGen`, :class:`RelinKeyGen` (if the protocol
multiplies ciphertexts) and :class:`RotationKeyGen` (if it rotates) side by side, so the
parties send the shares of all of them together:

1. the lead party generates its keys and its first share of every operation
   (:meth:`KeySetup.generate_shares` with ``lead=None``); those are the common elements
   every other party's shares are made on;
2. every other party generates its keys and shares on the lead's; the server aggregates
   the public-key and round-1 relinearization shares (:meth:`KeySetup.aggregate_shares`)
   and finalizes the rotation keys (:meth:`KeySetup.finalize_rotations`);
3. every party generates its round-2 relinearization share on the round-1 aggregate,
   the server aggregates and finalizes them (:meth:`KeySetup.finalize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import openfhe

from fednorm.engine.ckks.collective.keygen import (
    PublicKeyGen,
    PublicKeyShare,
    RelinKeyGen,
    RelinShare,
    RotationKeyGen,
    RotationShare,
)
from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys, PartyKeys
from fednorm.engine.errors import ProtocolError


@dataclass(frozen=True)
class SetupShares:
    """One party's first share of each key operation of a setup (None: not needed)."""

    public_key: PublicKeyShare
    relin: RelinShare | None
    rotation: RotationShare | None


@dataclass(frozen=True)
class JointRoundOne:
    """What the server sends every party after round one: the joint keys and, with
    relinearization, the aggregate of round 1 that round-2 shares are made on."""

    joint: JointKeys
    relin: openfhe.EvalKey | None


class KeySetup:
    """Collective key generation for one protocol: which key operations, run together."""

    def __init__(self, ctx: CkksContext, *, relinearize: bool = True,
                 rotations: Sequence[int] = ()) -> None:
        self.ctx = ctx
        self.public_key = PublicKeyGen(ctx)
        self.relin = RelinKeyGen(ctx) if relinearize else None
        self.rotation = RotationKeyGen(ctx, rotations) if rotations else None

    def generate_keys(self, lead: SetupShares | None) -> PartyKeys:
        """This party's secret (kept inside the returned object) and public-key share:
        the lead's from scratch, every other party's on the lead's public key."""
        return PartyKeys.generate(self.ctx, lead.public_key.key if lead else None)

    def generate_shares(self, keys: PartyKeys, lead: SetupShares | None) -> SetupShares:
        """This party's first share of every operation (on the lead's, unless it is it)."""
        if lead is not None:
            self.require_complete(lead)
        return SetupShares(
            public_key=self.public_key.generate_share(keys),
            relin=self.relin.generate_share(keys, lead.relin if lead else None)
            if self.relin else None,
            rotation=self.rotation.generate_share(keys, lead.rotation if lead else None)
            if self.rotation else None)

    def require_complete(self, shares: SetupShares) -> None:
        """ProtocolError unless ``shares`` holds a share of every operation of this setup."""
        for name, needed in (("relin", self.relin), ("rotation", self.rotation)):
            if needed is not None and getattr(shares, name) is None:
                raise ProtocolError(f"a {name}-key share is missing")

    def aggregate_shares(self, shares: Sequence[SetupShares]) -> JointRoundOne:
        """Server: the joint keys and the round-1 relinearization aggregate."""
        for share in shares:
            self.require_complete(share)
        joint = self.public_key.finalize(
            self.public_key.aggregate_shares([s.public_key for s in shares]))
        relin = self.relin.aggregate_shares(joint, [s.relin for s in shares]) \
            if self.relin else None
        return JointRoundOne(joint, relin)

    def finalize_rotations(self, joint: JointKeys, shares: Sequence[SetupShares]) -> None:
        """Server: aggregate and install the rotation keys (none: nothing to do)."""
        if self.rotation:
            self.rotation.finalize(joint, self.rotation.aggregate_shares(
                joint, [s.rotation for s in shares]))

    def generate_round_two_share(self, keys: PartyKeys,
                                 round_one: JointRoundOne) -> RelinShare | None:
        """This party's round-2 relinearization share (None without relinearization)."""
        if not self.relin:
            return None
        if round_one.relin is None:
            raise ProtocolError("a relin-key share is missing")
        return self.relin.generate_round_two_share(keys, round_one.relin)

    def finalize(self, joint: JointKeys, round_two: Sequence[RelinShare]) -> None:
        """Server: aggregate the round-2 shares and install the relinearization key."""
        if self.relin:
            self.relin.finalize(joint, self.relin.aggregate_shares(joint, round_two))
