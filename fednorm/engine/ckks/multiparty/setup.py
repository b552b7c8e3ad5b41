"""Key setup: the key operations one protocol needs, composed into three rounds.

:class:`KeySetup` runs :class:`PublicKeyGen`, :class:`RelinKeyGen` (if the protocol
multiplies ciphertexts) and :class:`RotationKeyGen` (if it rotates) side by side, so the
parties send the shares of all of them together:

1. the lead party generates its keys and its first share of every operation
   (:meth:`KeySetup.generate_shares` with ``lead=None``); those are the common elements
   every other party's shares are made on;
2. every other party generates its keys and shares on the lead's; the server adds up
   the public-key, round-1 relinearization and rotation-key shares as they arrive
   (:meth:`KeySetup.round_one_sum`), sends the joint keys and installs the rotation keys;
3. every party generates its round-2 relinearization share on the round-1 aggregate,
   the server adds them up and installs the relinearization key
   (:meth:`KeySetup.round_two_sum`, :meth:`KeySetup.install_relin`).

A server adds each party's shares to running sums as they arrive, so it never holds every
party's shares at once (at ring 2^15, ~31 MB a party in round one, 25 MB in round two).

Every party adds up every party's shares too, with the same running sums
(:class:`KeyCheck`), and refuses to go on unless the joint keys the server sends or
installs are its own aggregates: a server that deviates cannot make a party encrypt
under a key whose secret it knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys, PartyKeys, joint_tag_for
from fednorm.engine.ckks.multiparty.keygen import (
    PublicKeyGen,
    PublicKeyShare,
    RelinKeyGen,
    RelinShare,
    RelinSum,
    RotationKeyGen,
    RotationShare,
    RotationSum,
)
from fednorm.engine.ckks.serial import object_digest
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
            relin=self.relin.generate_share(keys, 1, lead.relin if lead else None)
            if self.relin else None,
            rotation=self.rotation.generate_share(keys, lead.rotation if lead else None)
            if self.rotation else None)

    def require_complete(self, shares: SetupShares) -> None:
        """ProtocolError unless ``shares`` holds a share of every operation of this setup."""
        for name, needed in (("relin", self.relin), ("rotation", self.rotation)):
            if needed is not None and getattr(shares, name) is None:
                raise ProtocolError(f"a {name}-key share is missing")

    def round_one_sum(self) -> RoundOneSum:
        """Server: round one's shares added up as they arrive (lead first)."""
        return RoundOneSum(self)

    def round_two_sum(self, joint: JointKeys) -> RelinSum | None:
        """Server: the round-2 relinearization shares added as they arrive (None
        without relinearization); :meth:`install_relin` installs the sum."""
        return self.relin.running_sum(joint.tag, 2) if self.relin else None

    def install_relin(self, joint: JointKeys,
                      relin_sum: RelinSum | None) -> openfhe.EvalKey | None:
        """Server: install the relinearization key summed by :meth:`round_two_sum` (and
        return it; None without relinearization)."""
        if self.relin and relin_sum is not None:
            return self.relin.finalize(joint, relin_sum.result())
        return None

    def generate_round_two_share(self, keys: PartyKeys,
                                 round_one: JointRoundOne) -> RelinShare | None:
        """This party's round-2 relinearization share (None without relinearization)."""
        if not self.relin:
            return None
        if round_one.relin is None:
            raise ProtocolError("a relin-key share is missing")
        return self.relin.generate_share(keys, 2, round_one.relin)


class RoundOneSum:
    """Round one added up as the parties' shares arrive: the joint public key, the
    round-1 relinearization aggregate and the rotation keys, each share checked as it
    comes (every operation's share present; the relinearization share under the key tag
    of the same party's public-key share)."""

    def __init__(self, setup: KeySetup) -> None:
        self.setup = setup
        self.public_key = setup.public_key.running_sum()
        self.relin: RelinSum | None = None
        self.rotation: RotationSum | None = None

    def add(self, shares: SetupShares) -> None:
        """Check one party's shares of every operation, then add them (a refused share
        leaves every sum as it was)."""
        setup = self.setup
        setup.require_complete(shares)
        tag = self.public_key.check(shares.public_key)
        lead_tag = (self.public_key.party_tags or [tag])[0]
        joint_tag = joint_tag_for(lead_tag)
        if setup.relin is not None and shares.relin is not None:
            self.relin = self.relin or setup.relin.running_sum(joint_tag, 1)
            self.relin.check(shares.relin, tag)
        if setup.rotation is not None and shares.rotation is not None:
            self.rotation = self.rotation or setup.rotation.running_sum(joint_tag, lead_tag)
            self.rotation.check(shares.rotation)
        self.public_key.include(shares.public_key, tag)
        if self.relin is not None and shares.relin is not None:
            self.relin.include(shares.relin)
        if self.rotation is not None and shares.rotation is not None:
            self.rotation.include(shares.rotation)

    def result(self) -> JointRoundOne:
        """The joint keys and the round-1 relinearization aggregate, to send the parties."""
        joint = self.setup.public_key.finalize(self.public_key.result())
        return JointRoundOne(joint, self.relin.result() if self.relin else None)

    def rotation_result(self) -> openfhe.EvalKeyMap | None:
        """The summed rotation keys (None: the setup makes none)."""
        if self.setup.rotation is None or self.rotation is None:
            return None
        return self.rotation.result()

    def finalize_rotations(self, joint: JointKeys) -> openfhe.EvalKeyMap | None:
        """Install the rotation keys, and return them (none: nothing to do)."""
        keys = self.rotation_result()
        if self.setup.rotation is not None and keys is not None:
            self.setup.rotation.finalize(joint, keys)
        return keys


@dataclass(frozen=True)
class KeyDigests:
    """Digests of the evaluation keys a setup finalized (None: the setup makes none):
    what the server says it installed, and what a party compares with its own."""

    relin: bytes | None
    rotation: bytes | None

    @classmethod
    def of(cls, relin: openfhe.EvalKey | None,
           rotation: openfhe.EvalKeyMap | None) -> KeyDigests:
        return cls(None if relin is None else object_digest(relin),
                   None if rotation is None else object_digest(rotation))


class KeyCheck:
    """A party's own aggregate of every party's shares, made with the server's running
    sums, and its comparison with what the server says it holds.

    The server could send a joint public key of its own, or a round-1 relinearization
    aggregate of its choosing (a round-2 share made on it can reveal the secret), and
    nothing in those objects tells them apart from the real ones.  So each party adds up
    the shares itself (each signed by the party that made it: the caller checks that
    before :meth:`add`), refuses to go on when the server's keys differ from its own
    (:meth:`check_round_one`, :meth:`check_final`: digests of the serialized objects),
    and keeps its own: it never encrypts under, or makes a share on, the server's.
    """

    def __init__(self, setup: KeySetup) -> None:
        self.setup = setup
        self.round_one = setup.round_one_sum()
        self.joint: JointKeys | None = None
        self.round_two: RelinSum | None = None

    def add(self, shares: SetupShares) -> None:
        """Add one party's round-one shares (lead first), checked as the server does."""
        self.round_one.add(shares)

    def check_round_one(self, theirs: JointRoundOne) -> JointRoundOne:
        """This party's own round one, once the server's equals it; else ProtocolError
        naming what differs."""
        ours = self.round_one.result()
        if tuple(theirs.joint.party_tags) != ours.joint.party_tags:
            raise ProtocolError(f"the joint public key the server sent sums "
                                f"{len(theirs.joint.party_tags)} key shares under other tags "
                                f"than the {ours.joint.n_parties} signed public-key shares")
        _require_same("joint public key", theirs.joint.public_key, ours.joint.public_key,
                      "signed public-key shares: refusing to encrypt under it")
        if (theirs.relin is None) != (ours.relin is None):
            raise ProtocolError("the server's round one and this party's disagree on "
                                "whether there is a relinearization key")
        if ours.relin is not None:
            _require_same("round-1 relinearization aggregate", theirs.relin, ours.relin,
                          "signed round-1 shares: refusing to make a round-2 share on it")
        self.joint = ours.joint
        self.round_two = self.setup.round_two_sum(ours.joint)
        return ours

    def add_round_two(self, share: RelinShare) -> None:
        """Add one party's round-2 relinearization share (party order)."""
        if self.joint is None or self.round_two is None:
            raise ProtocolError("a round-2 relinearization share before round one, or "
                                "without relinearization")
        self.round_two.add(share, self.joint.tag)

    def check_final(self, theirs: KeyDigests) -> None:
        """ProtocolError unless the evaluation keys the server installed are this
        party's own aggregates (the relinearization key of round 2, the rotation keys)."""
        relin = self.round_two.result() if self.round_two is not None else None
        ours = KeyDigests.of(relin, self.round_one.rotation_result())
        for what, mine, server in (("relinearization key", ours.relin, theirs.relin),
                                   ("rotation keys", ours.rotation, theirs.rotation)):
            if mine != server:
                raise ProtocolError(f"the {what} the server installed "
                                    f"{'differ' if what.endswith('s') else 'differs'} from "
                                    "this party's own aggregate of the signed shares")

    def install(self) -> None:
        """Install this party's own evaluation keys, checked equal to the server's
        (:meth:`check_final`): a party recomputing the server's products and rotations
        needs them."""
        if self.joint is None:
            return
        if self.round_two is not None:
            self.setup.install_relin(self.joint, self.round_two)
        self.round_one.finalize_rotations(self.joint)


def _require_same(what: str, theirs: object, ours: object, why: str) -> None:
    if type(theirs) is not type(ours) or object_digest(theirs) != object_digest(ours):
        raise ProtocolError(f"the {what} the server sent differs from this party's own "
                            f"aggregate of the {why}")
