"""Key setup: the key operations one protocol needs, composed into three rounds.

:class:`KeySetup` runs :class:`PublicKeyGen`, :class:`RelinKeyGen` (if the protocol
multiplies ciphertexts) and :class:`RotationKeyGen` (if it rotates) side by side, so the
parties send the shares of all of them together:

1. the lead party generates its keys and its first share of every operation
   (:meth:`KeySetup.generate_share` of round 1 on ``None``); those are the common elements
   every other party's shares are made on;
2. every other party generates its keys and shares on the lead's; the server adds up
   the public-key, round-1 relinearization and rotation-key shares as they arrive
   (:meth:`KeySetup.running_sum` of round 1), sends the joint keys and installs the
   rotation keys (:meth:`RoundOneSum.finalize`);
3. every party generates its round-2 relinearization share on the round-1 aggregate,
   the server adds them up and installs the relinearization key
   (:meth:`KeySetup.running_sum` of round 2, :meth:`RoundTwoSum.finalize`).

Every round has the same verbs: :meth:`KeySetup.generate_share` (a party),
:meth:`KeySetup.running_sum` and its ``add`` (the server, and each party's
:class:`KeyCheck`), ``finalize`` (install the round's evaluation keys).

A server adds each party's shares to running sums as they arrive, so it never holds every
party's shares at once (at ring 2^15, ~31 MB a party in round one, 25 MB in round two).

Every party adds up every party's shares too, with the same running sums
(:class:`KeyCheck`), and refuses to go on unless the joint keys the server sends or
installs are its own aggregates: a server that deviates cannot make a party encrypt
under a key whose secret it knows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Literal, overload

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
from fednorm.engine.ckks.serial import object_digest, wire_digest, wire_digests
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, Signed, message


@dataclasses.dataclass(frozen=True, eq=False)
class SetupShares(Signed):
    """One party's first share of each key operation of a setup (None: not needed), as
    it crosses the wire: the lead's (:class:`LeadKeys`) or another party's
    (:class:`KeyShares`), signed by its maker, forwarded by the server to every other
    party; the server's and every party's running sums check what arrived
    (:meth:`RoundOneSum.add`)."""

    ROUND = 1

    public_key: openfhe.PublicKey
    relin_share: openfhe.EvalKey | None
    rotation_share: openfhe.EvalKeyMap | None

    def share_digest(self, parsed: bool = False) -> bytes:
        return wire_digests((self.public_key, self.relin_share, self.rotation_share),
                            received=parsed)


@message("ckks.lead_keys")
class LeadKeys(SetupShares):
    """The lead's round-one shares: the common elements every other party's are made on."""


@message("ckks.key_shares")
class KeyShares(SetupShares):
    """Another party's round-one shares, made on the lead's."""


@message("ckks.relin_round2")
class RelinRound2(Signed):
    """A party's round-two share: of the relinearization key, the one operation with a
    second round, made on round one's aggregate (forwarded, signed, as round one's)."""

    ROUND = 2

    share: openfhe.EvalKey

    def share_digest(self, parsed: bool = False) -> bytes:
        return wire_digest(self.share, received=parsed)


@message("ckks.joint_round1")
class JointRoundOne(Message):
    """What the server sends every party after round one: the joint public key, whose
    shares it sums (party tags, lead first), and, with relinearization, the aggregate of
    round 1 that round-2 shares are made on; each party compares it with its own
    (:meth:`KeyCheck.check_round_one`)."""

    public_key: openfhe.PublicKey
    party_tags: list[str]
    relin_round1: openfhe.EvalKey | None

    @functools.cached_property
    def joint(self) -> JointKeys:
        """The joint keys it names (under the public key's own tag)."""
        return JointKeys(public_key=self.public_key, tag=self.public_key.GetKeyTag(),
                         party_tags=tuple(self.party_tags))


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
        return PartyKeys.generate(self.ctx, lead.public_key if lead else None)

    def _round_one_shares(self, keys: PartyKeys, lead: SetupShares | None) -> SetupShares:
        """This party's first share of every operation (on the lead's, unless it is it)."""
        _, lead_relin, lead_rotation = self.typed(lead) if lead else (None, None, None)
        relin = self.relin.generate_share(keys, 1, lead_relin) if self.relin else None
        rotation = self.rotation.generate_share(keys, lead_rotation) if self.rotation else None
        return (KeyShares if lead else LeadKeys)(
            public_key=self.public_key.generate_share(keys).key,
            relin_share=relin.key if relin else None,
            rotation_share=rotation.keys if rotation else None)

    def typed(self, shares: SetupShares
              ) -> tuple[PublicKeyShare, RelinShare | None, RotationShare | None]:
        """Each operation's share in ``shares``, as that operation takes it (a round-1
        relinearization share; a rotation share for this setup's offsets); ProtocolError
        if ``shares`` is no round-one bundle or lacks a share this setup needs (the
        running sums check each share itself)."""
        if not isinstance(shares, SetupShares):
            raise ProtocolError(f"round-one shares expected, not a {type(shares).__name__}")
        for name, needed in (("relin", self.relin), ("rotation", self.rotation)):
            if needed is not None and getattr(shares, f"{name}_share") is None:
                raise ProtocolError(f"a {name}-key share is missing")
        relin = None if self.relin is None or shares.relin_share is None \
            else RelinShare(1, shares.relin_share)
        rotation = None if self.rotation is None or shares.rotation_share is None \
            else RotationShare(self.rotation.indices, shares.rotation_share)
        return PublicKeyShare(shares.public_key), relin, rotation

    @overload
    def running_sum(self, round_: Literal[1], joint: None = None) -> RoundOneSum: ...

    @overload
    def running_sum(self, round_: Literal[2], joint: JointKeys) -> RoundTwoSum: ...

    def running_sum(self, round_: int, joint: JointKeys | None = None
                    ) -> RoundOneSum | RoundTwoSum:
        """A round's shares added up as they arrive (round 1: lead first; round 2: on the
        ``joint`` keys of round 1), as each key operation's ``running_sum``."""
        if round_ == 1:
            return RoundOneSum(self)
        if round_ == 2 and joint is not None:
            return RoundTwoSum(self, joint)
        raise ProtocolError(f"a key setup has rounds 1 and 2 (round 2 on the joint keys), "
                            f"not {round_}")

    @overload
    def generate_share(self, keys: PartyKeys, round_: Literal[1],
                       on: SetupShares | None) -> SetupShares: ...

    @overload
    def generate_share(self, keys: PartyKeys, round_: Literal[2],
                       on: JointRoundOne) -> RelinRound2 | None: ...

    def generate_share(self, keys: PartyKeys, round_: int,
                       on: SetupShares | JointRoundOne | None) -> SetupShares | RelinRound2 | None:
        """This party's share of round ``round_``: round 1, its first share of every
        operation, made on the lead's (``on``; None for the lead itself); round 2, its
        relinearization share on round one's aggregate (None without relinearization)."""
        if round_ == 1 and not isinstance(on, JointRoundOne):
            return self._round_one_shares(keys, on)
        if round_ == 2 and isinstance(on, JointRoundOne):
            if not self.relin:
                return None
            if on.relin_round1 is None:
                raise ProtocolError("a relin-key share is missing")
            return RelinRound2(share=self.relin.generate_share(keys, 2, on.relin_round1).key)
        raise ProtocolError(f"a round-{round_} key-setup share cannot be made on "
                            f"{type(on).__name__}")


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

    def add(self, shares: SetupShares, step: bytes = b"") -> None:
        """Check one party's shares of every operation, then add them (a refused share
        leaves every sum as it was); ``step``: the digest their maker signed, which lets
        the parties of a simulation share each step (:class:`~.checks.RunningSum`)."""
        setup = self.setup
        public_key, relin, rotation = setup.typed(shares)
        tag = self.public_key.check(public_key)
        lead_tag = (self.public_key.party_tags or [tag])[0]
        joint_tag = joint_tag_for(lead_tag)
        if setup.relin is not None and relin is not None:
            self.relin = self.relin or setup.relin.running_sum(joint_tag, 1)
            self.relin.check(relin, tag)
        if setup.rotation is not None and rotation is not None:
            self.rotation = self.rotation or setup.rotation.running_sum(joint_tag, lead_tag)
            self.rotation.check(rotation)
        self.public_key.include(public_key, tag)
        if self.relin is not None and relin is not None:
            self.relin.include(relin, step)
        if self.rotation is not None and rotation is not None:
            self.rotation.include(rotation, step)

    def result(self) -> JointRoundOne:
        """The joint keys and the round-1 relinearization aggregate, to send the parties."""
        joint = self.setup.public_key.finalize(self.public_key.result())
        return JointRoundOne(public_key=joint.public_key, party_tags=list(joint.party_tags),
                             relin_round1=self.relin.result() if self.relin else None)

    def rotation_result(self) -> openfhe.EvalKeyMap | None:
        """The summed rotation keys (None: the setup makes none)."""
        if self.setup.rotation is None or self.rotation is None:
            return None
        return self.rotation.result()

    def finalize(self, joint: JointKeys) -> openfhe.EvalKeyMap | None:
        """Install the rotation keys, and return them (none: nothing to do)."""
        keys = self.rotation_result()
        if self.setup.rotation is not None and keys is not None:
            self.setup.rotation.finalize(joint, keys)
        return keys


class RoundTwoSum:
    """Round two added up as the parties' relinearization shares arrive, each under the
    joint tag (nothing to add without relinearization)."""

    def __init__(self, setup: KeySetup, joint: JointKeys) -> None:
        self.setup, self.joint = setup, joint
        self.relin = setup.relin.running_sum(joint.tag, 2) if setup.relin else None

    def add(self, share: RelinRound2, step: bytes = b"") -> None:
        """Add one party's round-2 share (party order), as it arrived."""
        if self.relin is None:
            raise ProtocolError("a round-2 relinearization share without relinearization")
        if not isinstance(share, RelinRound2):
            raise ProtocolError(f"a round-2 share expected, not a {type(share).__name__}")
        self.relin.add(RelinShare(2, share.share), self.joint.tag, step)

    def result(self) -> openfhe.EvalKey | None:
        """The summed relinearization key (None: the setup makes none)."""
        return self.relin.result() if self.relin is not None else None

    def finalize(self) -> openfhe.EvalKey | None:
        """Install the relinearization key, and return it (None: nothing to do)."""
        key = self.result()
        if self.setup.relin is not None and key is not None:
            self.setup.relin.finalize(self.joint, key)
        return key


@message("ckks.setup_done")
class KeyDigests(Message):
    """Digests of the evaluation keys a setup finalized (None: the setup makes none):
    what the server says it installed (sent when the joint keys are ready, so the
    protocol proper may start), and what a party compares with its own."""

    relin_key: bytes | None
    rotation_keys: bytes | None

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
        self.round_one = setup.running_sum(1)
        self.round_two: RoundTwoSum | None = None

    def add(self, shares: SetupShares | RelinRound2, step: bytes = b"") -> None:
        """Add one party's shares, checked as the server does: round one's (lead first),
        then, once :meth:`check_round_one` passed, round two's (party order); ``step``:
        the digest their maker signed (:meth:`RoundOneSum.add`)."""
        if isinstance(shares, SetupShares):
            self.round_one.add(shares, step)
        elif self.round_two is not None:
            self.round_two.add(shares, step)
        else:
            raise ProtocolError("a round-2 relinearization share before round one")

    def check_round_one(self, theirs: JointRoundOne) -> JointRoundOne:
        """This party's own round one, once the server's equals it; else ProtocolError
        naming what differs."""
        ours = self.round_one.result()
        tags = theirs.party_tags
        if not isinstance(tags, list) or tuple(tags) != ours.joint.party_tags:
            raise ProtocolError(f"the joint public key the server sent sums "
                                f"{len(tags) if isinstance(tags, list) else 'no'} key shares "
                                f"under other tags than the {ours.joint.n_parties} signed "
                                "public-key shares")
        _require_same("joint public key", theirs.public_key, ours.public_key,
                      "signed public-key shares: refusing to encrypt under it")
        if (theirs.relin_round1 is None) != (ours.relin_round1 is None):
            raise ProtocolError("the server's round one and this party's disagree on "
                                "whether there is a relinearization key")
        if ours.relin_round1 is not None:
            _require_same("round-1 relinearization aggregate", theirs.relin_round1,
                          ours.relin_round1,
                          "signed round-1 shares: refusing to make a round-2 share on it")
        self.round_two = self.setup.running_sum(2, ours.joint)
        return ours

    def check_final(self, theirs: KeyDigests) -> None:
        """ProtocolError unless the evaluation keys the server installed are this
        party's own aggregates (the relinearization key of round 2, the rotation keys)."""
        relin = self.round_two.result() if self.round_two is not None else None
        ours = KeyDigests.of(relin, self.round_one.rotation_result())
        for name in ("relin_key", "rotation_keys"):
            if not isinstance(getattr(theirs, name), bytes | None):
                raise ProtocolError(f"the server's {name} digest is malformed")
        for what, mine, server in (
                ("relinearization key", ours.relin_key, theirs.relin_key),
                ("rotation keys", ours.rotation_keys, theirs.rotation_keys)):
            if mine != server:
                raise ProtocolError(f"the {what} the server installed "
                                    f"{'differ' if what.endswith('s') else 'differs'} from "
                                    "this party's own aggregate of the signed shares")

    def install(self) -> None:
        """Install this party's own evaluation keys, checked equal to the server's
        (:meth:`check_final`): a party recomputing the server's products and rotations
        needs them."""
        if self.round_two is None:
            return
        self.round_two.finalize()
        self.round_one.finalize(self.round_two.joint)


def _require_same(what: str, theirs: object, ours: object, why: str) -> None:
    if type(theirs) is not type(ours) or object_digest(theirs) != object_digest(ours):
        raise ProtocolError(f"the {what} the server sent differs from this party's own "
                            f"aggregate of the {why}")
