"""Collective (interactive) bootstrapping: same values, full level budget, nothing revealed.

The refresh of Lattigo's ``mpckks``, on OpenFHE's ``IntMPBoot*``: the server *prepares*
the ciphertext (compresses it, keeps ``c0``, sends ``c1``), each party *generates* a
masked-decryption and re-encryption share ``(h0, h1)`` on a common random element
``a``, the server *aggregates* them and *finalizes*: re-encrypts under the joint key.

``a`` is never sent: the ``index``-th bootstrap under a joint key uses the element every
role expands from the same public seed (:mod:`..crs`), so a server cannot choose it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.crs import common_element
from fednorm.engine.ckks.keys import JointKeys, PartyKeys
from fednorm.engine.ckks.levels import require_consumed_at_most
from fednorm.engine.ckks.multiparty.checks import require_shares, require_tag
from fednorm.engine.ckks.serial import ciphertext_digest_as_received, object_digest
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Signed, message


@dataclass(frozen=True)
class BootRound:
    """Server state of one collective bootstrap; parties get ``c1`` and ``index``."""

    adjusted: openfhe.Ciphertext
    c1: openfhe.Ciphertext
    a: openfhe.Ciphertext
    index: int


@message("ckks.boot_share")
class BootstrapShare(Signed):
    """A party's share of the ``index``-th bootstrap: masked decryption ``h0`` of ``c1``
    and re-encryption ``h1`` on the common element.  The message itself: it crosses the
    wire as it is, signed by its maker, so :meth:`Bootstrap.aggregate_shares` checks the
    index and parts that arrived."""

    index: int
    h0: openfhe.Ciphertext
    h1: openfhe.Ciphertext

    def share_digest(self, parsed: bool = False) -> bytes:
        """Of the index and both parts, each as a receiver parses it."""
        if not isinstance(self.index, int) or isinstance(self.index, bool):
            raise InputError("its bootstrap index is not an integer")
        digest = object_digest if parsed else ciphertext_digest_as_received
        return hashlib.sha256(b"%d\0" % self.index + digest(self.h0) + digest(self.h1)
                              ).digest()


class Bootstrap:
    """Collective bootstrapping of joint ciphertexts."""

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx

    def common_element(self, public_key: openfhe.PublicKey,
                       index: int) -> openfhe.Ciphertext:
        """The ``index``-th common random element of the joint key ``public_key``: the
        same in every process, derived, never sent."""
        return common_element(self.ctx, public_key, index)

    def prepare(self, joint: JointKeys, ct: openfhe.Ciphertext, index: int) -> BootRound:
        """Server: compress ``ct`` (``IntMPBootAdjustScale``), cut off ``c1`` for the
        parties and derive the ``index``-th common element.

        ``ct`` must not be past the level budget: OpenFHE would fail or return garbage.
        """
        self.ctx.check_same_context(ct, "ciphertext to bootstrap")
        if ct.GetKeyTag() != joint.tag or ct.NumberCiphertextElements() != 2:
            raise ProtocolError("can only bootstrap a relinearized joint ciphertext")
        require_consumed_at_most(ct, self.ctx.level_budget, "collective bootstrap")
        adjusted = self.ctx.raw.IntMPBootAdjustScale(ct)
        c1 = adjusted.Clone()
        c1.RemoveElement(0)
        return BootRound(adjusted=adjusted, c1=c1,
                         a=self.common_element(joint.public_key, index), index=index)

    def generate_share(self, keys: PartyKeys, public_key: openfhe.PublicKey,
                       c1: openfhe.Ciphertext, index: int) -> BootstrapShare:
        """``IntMPBootDecrypt`` on ``c1`` and the common element this party derives
        itself from ``index``."""
        h0, h1 = keys.boot_share(c1, self.common_element(public_key, index))
        return BootstrapShare(index=index, h0=h0, h1=h1)

    def aggregate_shares(self, joint: JointKeys, rnd: BootRound,
                         shares: Sequence[BootstrapShare]) -> list[openfhe.Ciphertext]:
        """Check each party's (h0, h1) and sum them (``IntMPBootAdd``).

        OpenFHE leaves level and scale of these shares at defaults, so the checks are
        index, context, element count, towers and key tag: each pair carries its own
        party's key tag, so a share made with keys outside this federation (or out of
        order) is caught.
        """
        require_shares(shares, BootstrapShare, joint, "bootstrap share")
        expected = (self._towers(rnd.c1), self._towers(rnd.a))  # h0 as c1, h1 as a
        for i, share in enumerate(shares):
            what = f"bootstrap share #{i}"
            if share.index != rnd.index:
                raise ProtocolError(f"{what} is for bootstrap #{share.index}, "
                                    f"expected #{rnd.index}")
            for part, towers in zip((share.h0, share.h1), expected, strict=True):
                self._check_part(part, towers, joint.party_tags[i], what)
        # IntMPBootAdd adds into the first pair in place: a copy, so the parties' shares
        # stay as they were sent (every party aggregates them too, in the paper's z-score).
        pairs = [[share.h0, share.h1] for share in shares]
        pairs[0] = [part.Clone() for part in pairs[0]]
        return self.ctx.raw.IntMPBootAdd(pairs)

    def finalize(self, joint: JointKeys, rnd: BootRound,
                 aggregate: Sequence[openfhe.Ciphertext]) -> openfhe.Ciphertext:
        """Re-encrypt under the joint key (``IntMPBootEncrypt``): full level budget again."""
        out = self.ctx.raw.IntMPBootEncrypt(joint.public_key, list(aggregate), rnd.a,
                                            rnd.adjusted)
        if self.ctx.consumed(out) != 0 or out.GetKeyTag() != joint.tag:
            raise ProtocolError("collective bootstrap did not return a fresh joint ciphertext")
        return out

    def _check_part(self, part: openfhe.Ciphertext, towers: int, tag: str,
                    what: str) -> None:
        self.ctx.check_same_context(part, what)
        if part.NumberCiphertextElements() != 1:
            raise ProtocolError(f"{what} has a part with "
                                f"{part.NumberCiphertextElements()} elements")
        require_tag(part, tag, what)
        if self._towers(part) != towers:
            raise ProtocolError(f"{what} has a part with {self._towers(part)} "
                                f"towers, expected {towers}")

    def _towers(self, ct: openfhe.Ciphertext) -> int:
        """RNS towers a one-element ciphertext's polynomial really holds.

        OpenFHE leaves the level of bootstrap shares at its default, so it does not tell;
        the serialized size does (N 64-bit coefficients per tower, plus a small header).
        """
        return len(openfhe.Serialize(ct, openfhe.BINARY)) // (8 * self.ctx.preset.ring_dim)
