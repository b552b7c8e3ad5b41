"""Collective key generation: the joint public key, relinearization key and rotation keys.

Each is one class with the verbs of every collective operation: a party *generates a
share* from its :class:`~fednorm.engine.ckks.keys.PartyKeys`, the server *aggregates
shares* (it holds no secret), and *finalize* makes the key usable.

The common random element: in Lattigo each key is made on a polynomial drawn from a
common reference string.  OpenFHE 1.6.1's key generation cannot be seeded; it draws the
element in the lead party's first share (its public key, its round-1 relinearization
share, its rotation-key share), and every other party makes its share on that one.  So
the lead's share comes first and is forwarded to the others, and each aggregation
checks that share ``i`` was made by party ``i`` (the lead's under its own key tag).
Only the bootstrap's element comes from a seed (:mod:`..crs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.keys import JointKeys, PartyKeys, joint_tag_for
from fednorm.engine.ckks.multiparty.checks import (
    RunningSum,
    require_shares,
    require_tag,
    retagged_copy,
)
from fednorm.engine.errors import ProtocolError


# -- joint public key: one round -----------------------------------------------------------
@dataclass(frozen=True)
class PublicKeyShare:
    """A party's share of the joint public key: its own public key, made on the lead's."""

    key: openfhe.PublicKey


@dataclass(frozen=True)
class PublicKeyAggregate:
    """The folded public-key shares, and whose they were (each party's own key tag)."""

    key: openfhe.PublicKey
    party_tags: tuple[str, ...]


class PublicKeyGen:
    """The joint public key (``MultiAddPubKeys``).

    A party's secret and its public-key share are made together
    (:meth:`PartyKeys.generate`, on the lead's public key), so generating the share
    only hands out the public half.
    """

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx

    def generate_share(self, keys: PartyKeys) -> PublicKeyShare:
        return PublicKeyShare(keys.public_key_share)

    def aggregate_shares(self, shares: Sequence[PublicKeyShare]) -> PublicKeyAggregate:
        """Fold the shares (lead first) under the joint tag; refuse duplicates."""
        require_shares(shares, PublicKeyShare, None, "public-key share")
        total = self.running_sum()
        for share in shares:
            total.add(share)
        return total.result()

    def running_sum(self) -> PublicKeySum:
        """:meth:`aggregate_shares` one share at a time, as they arrive."""
        return PublicKeySum(self.ctx)

    def finalize(self, aggregate: PublicKeyAggregate) -> JointKeys:
        """The federation's joint keys: what every party encrypts under."""
        return JointKeys(public_key=aggregate.key, tag=joint_tag_for(aggregate.party_tags[0]),
                         party_tags=aggregate.party_tags)


class PublicKeySum:
    """Public-key shares added up as they arrive, in party order (the lead's first: its
    key tag names the joint keys); each share checked as it comes."""

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx
        self.party_tags: list[str] = []
        self._sum: RunningSum | None = None

    def add(self, share: PublicKeyShare) -> None:
        self.include(share, self.check(share))

    def check(self, share: PublicKeyShare) -> str:
        """The next party's share, checked (its key tag returned); nothing is added."""
        what = f"public-key share #{len(self.party_tags)}"
        if not isinstance(share, PublicKeyShare):
            raise ProtocolError(f"{what} is a {type(share).__name__}, not a PublicKeyShare")
        self.ctx.check_same_context(share.key, what)
        tag = share.key.GetKeyTag()
        if tag in self.party_tags:
            raise ProtocolError("two public-key shares carry the same key tag")
        return tag

    def include(self, share: PublicKeyShare, tag: str) -> None:
        """Add a share :meth:`check` accepted (with the tag it returned).

        Unlike the evaluation keys' sums, this one is never shared between the parties of
        a simulation (:class:`~.checks.RunningSum`'s ``chain``): a ciphertext encrypted
        under the joint key serializes in the form of the key's towers (made in this
        process or parsed), so a shared key would make the bytes on the wire depend on
        which party made a step first."""
        if self._sum is None:
            joint = joint_tag_for(tag)
            self._sum = RunningSum(
                lambda acc, key: self.ctx.raw.MultiAddPubKeys(acc, key, joint),
                lambda lone: retagged_copy(lone, joint, openfhe.DeserializePublicKeyString))
        self.party_tags.append(tag)
        self._sum.add(share.key)

    def result(self) -> PublicKeyAggregate:
        if self._sum is None:
            raise ProtocolError("no public-key shares")
        return PublicKeyAggregate(self._sum.result(), tuple(self.party_tags))


# -- relinearization key: two rounds -------------------------------------------------------
@dataclass(frozen=True)
class RelinShare:
    """A party's share of round ``round`` (1 or 2) of the relinearization key."""

    round: int
    key: openfhe.EvalKey


class RelinKeyGen:
    """The joint relinearization key, in two share rounds (as Lattigo's, whose round-1
    shares are also made on a common element): round 1 on the lead's share, round 2 on
    the sum of round 1."""

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx

    def generate_share(self, keys: PartyKeys, round_: int = 1,
                       on: RelinShare | openfhe.EvalKey | None = None) -> RelinShare:
        """This party's share of round ``round_``: in round 1 the lead's (``on`` None) or
        another party's on the lead's round-1 share; in round 2 on ``on``, the aggregate
        of round 1 (under the joint tag)."""
        if round_ == 1:
            if on is not None and not (isinstance(on, RelinShare) and on.round == 1):
                raise ProtocolError("round-1 relinearization shares are made on the lead's "
                                    f"round-1 share, not on {_described(on)}")
            return RelinShare(1, keys.relin_share(on.key if on else None))
        if round_ == 2:
            if not isinstance(on, openfhe.EvalKey):
                raise ProtocolError("round-2 relinearization shares are made on the "
                                    f"round-1 aggregate, not on {_described(on)}")
            return RelinShare(2, keys.relin_mult_share(on))
        raise ProtocolError(f"the relinearization key has rounds 1 and 2, not {round_}")

    def aggregate_shares(self, joint: JointKeys,
                         shares: Sequence[RelinShare]) -> openfhe.EvalKey:
        """Fold one round's shares: round 1 each under its party's tag
        (``MultiAddEvalKeys``), round 2 all under the joint tag (``MultiAddEvalMultKeys``)."""
        require_shares(shares, RelinShare, joint, "relinearization share")
        round_ = shares[0].round
        if any(share.round != round_ for share in shares) or round_ not in (1, 2):
            raise ProtocolError(f"relinearization shares of rounds "
                                f"{sorted({s.round for s in shares})} aggregated together")
        total = self.running_sum(joint.tag, round_)
        for share, tag in zip(shares, joint.party_tags, strict=True):
            total.add(share, tag if round_ == 1 else joint.tag)
        return total.result()

    def running_sum(self, joint_tag: str, round_: int) -> RelinSum:
        """:meth:`aggregate_shares` of round ``round_``, one share at a time."""
        return RelinSum(self.ctx, joint_tag, round_)

    def finalize(self, joint: JointKeys, round_two: openfhe.EvalKey) -> openfhe.EvalKey:
        """Install the aggregate of round 2 on this evaluator: products relinearize."""
        self.ctx.install_relin_key(round_two, joint.tag)
        return round_two


class RelinSum:
    """One round's relinearization shares added up as they arrive: round 1 each under
    its party's tag (``MultiAddEvalKeys``), round 2 all under the joint tag
    (``MultiAddEvalMultKeys``)."""

    def __init__(self, ctx: CkksContext, joint_tag: str, round_: int) -> None:
        if round_ not in (1, 2):
            raise ProtocolError(f"the relinearization key has rounds 1 and 2, not {round_}")
        raw = ctx.raw
        self.round = round_
        chain = ("relinearization", joint_tag, round_)
        self._sum = RunningSum(
            lambda acc, key: raw.MultiAddEvalKeys(acc, key, joint_tag),
            lambda lone: retagged_copy(lone, joint_tag, openfhe.DeserializeEvalKeyString),
            chain,
        ) if round_ == 1 else RunningSum(
            lambda acc, key: raw.MultiAddEvalMultKeys(acc, key, joint_tag), chain=chain)

    def add(self, share: RelinShare, tag: str, step: bytes = b"") -> None:
        """Add one party's share, which must carry key ``tag`` (its own in round 1, the
        joint one in round 2)."""
        self.check(share, tag)
        self.include(share, step)

    def check(self, share: RelinShare, tag: str) -> None:
        what = f"round-{self.round} relinearization share #{self._sum.count}"
        if not isinstance(share, RelinShare):
            raise ProtocolError(f"{what} is a {type(share).__name__}, not a RelinShare")
        if share.round != self.round:
            raise ProtocolError(f"{what} is of round {share.round}")
        require_tag(share.key, tag, what)

    def include(self, share: RelinShare, step: bytes = b"") -> None:
        """Add a share :meth:`check` accepted."""
        self._sum.add(share.key, step)

    def result(self) -> openfhe.EvalKey:
        return self._sum.result()


# -- rotation keys: one round --------------------------------------------------------------
@dataclass(frozen=True)
class RotationShare:
    """A party's share of the rotation keys for slot offsets ``indices``."""

    indices: tuple[int, ...]
    keys: openfhe.EvalKeyMap


class RotationKeyGen:
    """Joint rotation keys for a fixed set of slot offsets (``MultiAddEvalAutomorphismKeys``)."""

    def __init__(self, ctx: CkksContext, indices: Sequence[int]) -> None:
        self.ctx = ctx
        self.indices = tuple(indices)

    def generate_share(self, keys: PartyKeys,
                       lead: RotationShare | None = None) -> RotationShare:
        """The lead's share (``lead=None``), or another party's on the lead's."""
        if lead is not None:
            self.require_indices(lead, "the lead's rotation-key share")
        return RotationShare(self.indices,
                             keys.rotation_share(self.indices, lead.keys if lead else None))

    def aggregate_shares(self, joint: JointKeys,
                         shares: Sequence[RotationShare]) -> openfhe.EvalKeyMap:
        """Fold the shares; the lead's carries its own tag, every other the joint one.

        OpenFHE keeps only indices present in every share; :meth:`finalize` checks that
        none went missing.
        """
        require_shares(shares, RotationShare, joint, "rotation-key share")
        total = self.running_sum(joint.tag, joint.party_tags[0])
        for share in shares:
            total.add(share)
        return total.result()

    def running_sum(self, joint_tag: str, lead_tag: str) -> RotationSum:
        """:meth:`aggregate_shares` one share at a time (the lead's, under ``lead_tag``,
        first)."""
        return RotationSum(self, joint_tag, lead_tag)

    def finalize(self, joint: JointKeys, aggregate: openfhe.EvalKeyMap) -> None:
        """Install the joint rotation keys; ProtocolError if an index is not covered."""
        self.ctx.install_rotation_keys(aggregate, joint.tag, self.indices)

    def require_indices(self, share: RotationShare, what: str) -> None:
        if tuple(share.indices) != self.indices:
            raise ProtocolError(f"{what} is for offsets {list(share.indices)}, "
                                f"expected {list(self.indices)}")


class RotationSum:
    """Rotation-key shares added up as they arrive: the lead's under its own tag, every
    other under the joint one."""

    def __init__(self, gen: RotationKeyGen, joint_tag: str, lead_tag: str) -> None:
        self._gen = gen
        self._tags = (lead_tag, joint_tag)
        self._sum = RunningSum(lambda acc, keys: gen.ctx.raw.MultiAddEvalAutomorphismKeys(
            acc, keys, joint_tag), chain=("rotation", joint_tag))

    def add(self, share: RotationShare) -> None:
        self.check(share)
        self.include(share)

    def check(self, share: RotationShare) -> None:
        i = self._sum.count
        what = f"rotation-key share #{i}"
        if not isinstance(share, RotationShare):
            raise ProtocolError(f"{what} is a {type(share).__name__}, not a RotationShare")
        self._gen.require_indices(share, what)
        _require_map_tag(share.keys, self._tags[0] if i == 0 else self._tags[1], what)

    def include(self, share: RotationShare, step: bytes = b"") -> None:
        """Add a share :meth:`check` accepted."""
        self._sum.add(share.keys, step)

    def result(self) -> openfhe.EvalKeyMap:
        return self._sum.result()


def _require_map_tag(keys: openfhe.EvalKeyMap, want: str, what: str) -> None:
    """An eval-key map must carry key tag ``want``.  OpenFHE's Python API does not
    expose a map's entries, so the tag is read from its serialization."""
    if not isinstance(keys, openfhe.EvalKeyMap):
        raise ProtocolError(f"{what} is a {type(keys).__name__}, not an eval-key map")
    data = openfhe.Serialize(keys, openfhe.BINARY)
    # The joint tag contains the lead's tag, so "lead's tag only" means: not the joint one.
    tags = (want.encode() in data, joint_tag_for(want).encode() in data)
    if not tags[0] or (not want.startswith("fednorm-joint-") and tags[1]):
        raise ProtocolError(f"{what} does not carry key tag {want!r}")


def _described(value: object) -> str:
    if isinstance(value, RelinShare):
        return f"a round-{value.round} share"
    return "nothing" if value is None else f"a {type(value).__name__}"
