"""Server side of the collective operations: aggregate shares, then finalize.

Lattigo-style shape: a party makes a share from its secret (:class:`.keys.PartyKeys`),
the server *aggregates* the shares (it never holds a secret), then *finalizes*. Shares
are checked before OpenFHE combines them (key tag, level, element count, context, one
share per party) so a wrong or foreign share is a :class:`ProtocolError`, never garbage.
Shares are passed in party order, lead first.

Collective decryption noise (``bench/bench_ppf.py --errors``; max |error| over all slots of a
fresh encryption of x in [-1, 1], shares compressed to 2 towers — compression changes
nothing measurable):

    ======  =========================  =================  ==================
    preset  parties                    scale 2^50         doubled scale
    ======  =========================  =================  ==================
    test    P=3                        7.6e-7             4.0e-10
    test    P=10                       1.6e-6             7.5e-10
    paper   P=3                        1.2e-6             1.0e-9
    paper   P=10                       2.1e-6             1.7e-9
    ======  =========================  =================  ==================

OpenFHE adds a fixed Gaussian (σ = 2^20, in the ring) to each share, so the error is
absolute, grows roughly like sqrt(P), and shrinks by ~2^50 when the scale is doubled:
:meth:`CkksContext.double_scale` (or decrypting right after a multiplication) leaves
only the ciphertext's own noise. That fixed noise is *not* flooding: the server sees
the ciphertext's noise through such decryptions. Flooded decryptions of sums are
:func:`fuse_sum_decryption` (see :mod:`.flooding` and docs/LEAKAGE.md). Decoding also
adds noise sized by the *largest* slot, so decrypt values of very different magnitudes
apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import openfhe

from fednorm.engine.ckks.context import CkksContext
from fednorm.engine.ckks.crs import common_element
from fednorm.engine.ckks.keys import JointKeys, decrypt_share_towers, joint_tag_for
from fednorm.engine.ckks.levels import require_consumed_at_most
from fednorm.engine.errors import ProtocolError


# -- validation helpers ------------------------------------------------------------------
def _require_count(shares: Sequence, joint: JointKeys, what: str) -> None:
    if len(shares) != joint.n_parties:
        raise ProtocolError(f"{len(shares)} {what} for {joint.n_parties} parties")


def _require_tags(shares: Sequence[Any], expected: Sequence[str], what: str) -> None:
    """Share ``i`` must carry key tag ``expected[i]``."""
    for i, (share, want) in enumerate(zip(shares, expected, strict=True)):
        _require_tag(share, want, f"{what} #{i}")


def _require_tag(obj: Any, want: str, what: str) -> None:
    if obj.GetKeyTag() != want:
        raise ProtocolError(f"{what} has key tag {obj.GetKeyTag()!r}, expected {want!r}")


def _require_like(ctx: CkksContext, ct: openfhe.Ciphertext, like: openfhe.Ciphertext,
                  what: str) -> None:
    """``ct`` must match ``like`` in context, element count, level and scale."""
    ctx.check_same_context(ct, what)
    got = (ct.NumberCiphertextElements(), ct.GetLevel(), ct.GetNoiseScaleDeg(),
           ct.GetScalingFactor())
    want = (like.NumberCiphertextElements(), like.GetLevel(), like.GetNoiseScaleDeg(),
            like.GetScalingFactor())
    if got != want:
        raise ProtocolError(f"{what}: (elements, level, noise degree, scale) = {got}, "
                            f"expected {want}")


# -- joint public key: one round ---------------------------------------------------------
def aggregate_public_key(ctx: CkksContext, shares: Sequence[openfhe.PublicKey]) -> JointKeys:
    """Fold public-key shares (lead first) into the joint key (``MultiAddPubKeys``)."""
    if not shares:
        raise ProtocolError("no public-key shares")
    for i, share in enumerate(shares):
        ctx.check_same_context(share, f"public-key share #{i}")
    party_tags = tuple(s.GetKeyTag() for s in shares)
    if len(set(party_tags)) != len(party_tags):
        raise ProtocolError("two public-key shares carry the same key tag")
    tag = joint_tag_for(party_tags[0])
    joint = _fold(shares, lambda acc, s: ctx.raw.MultiAddPubKeys(acc, s, tag),
                  lambda lone: _retagged_copy(lone, tag, openfhe.DeserializePublicKeyString))
    return JointKeys(public_key=joint, tag=tag, party_tags=party_tags)


def _fold(shares: Sequence[Any], add: Callable[[Any, Any], Any],
          lone: Callable[[Any], Any] = lambda share: share) -> Any:
    """Sum shares with OpenFHE's pairwise ``add``; a single share goes through ``lone``."""
    if len(shares) == 1:
        return lone(shares[0])
    return reduce(add, shares[1:], shares[0])


def _retagged_copy(obj: Any, tag: str, load: Callable[[bytes, Any], Any]) -> Any:
    """A copy of a lone share carrying the joint ``tag`` (never retag a caller's object)."""
    copied = load(openfhe.Serialize(obj, openfhe.BINARY), openfhe.BINARY)
    copied.SetKeyTag(tag)
    return copied


# -- relinearization key: two rounds -----------------------------------------------------
def aggregate_relin_round1(ctx: CkksContext, joint: JointKeys,
                           shares: Sequence[openfhe.EvalKey]) -> openfhe.EvalKey:
    """Fold round-1 shares (each tagged with its party's key) with ``MultiAddEvalKeys``."""
    _require_count(shares, joint, "round-1 relinearization shares")
    _require_tags(shares, joint.party_tags, "round-1 relinearization share")
    return _fold(shares, lambda acc, s: ctx.raw.MultiAddEvalKeys(acc, s, joint.tag),
                 lambda lone: _retagged_copy(lone, joint.tag, openfhe.DeserializeEvalKeyString))


def aggregate_relin_round2(ctx: CkksContext, joint: JointKeys,
                           shares: Sequence[openfhe.EvalKey]) -> openfhe.EvalKey:
    """Fold round-2 shares into the joint relinearization key (``MultiAddEvalMultKeys``).

    Finalize with :meth:`CkksContext.install_relin_key` on every evaluator.
    """
    _require_count(shares, joint, "round-2 relinearization shares")
    _require_tags(shares, [joint.tag] * len(shares), "round-2 relinearization share")
    return _fold(shares, lambda acc, s: ctx.raw.MultiAddEvalMultKeys(acc, s, joint.tag))


# -- rotation keys: one round ------------------------------------------------------------
def aggregate_rotation_shares(ctx: CkksContext, joint: JointKeys,
                              shares: Sequence[openfhe.EvalKeyMap]) -> openfhe.EvalKeyMap:
    """Fold rotation-key shares with ``MultiAddEvalAutomorphismKeys``.

    OpenFHE keeps only indices present in every share; finalize with
    :meth:`CkksContext.install_rotation_keys`, which checks that none went missing.
    """
    _require_count(shares, joint, "rotation-key shares")
    for i, share in enumerate(shares):
        _require_map_tag(share, joint.party_tags[0] if i == 0 else joint.tag,
                         f"rotation-key share #{i}")
    return _fold(shares,
                 lambda acc, s: ctx.raw.MultiAddEvalAutomorphismKeys(acc, s, joint.tag))


def _require_map_tag(keys: openfhe.EvalKeyMap, want: str, what: str) -> None:
    """An eval-key map must carry key tag ``want`` (the lead's share is made under the
    lead's own key, every other share under the joint tag).  OpenFHE's Python API does
    not expose a map's entries, so the tag is read from its serialization."""
    if not isinstance(keys, openfhe.EvalKeyMap):
        raise ProtocolError(f"{what} is a {type(keys).__name__}, not an eval-key map")
    data = openfhe.Serialize(keys, openfhe.BINARY)
    # The joint tag contains the lead's tag, so "lead's tag only" means: not the joint one.
    tags = (want.encode() in data, joint_tag_for(want).encode() in data)
    if not tags[0] or (not want.startswith("fednorm-joint-") and tags[1]):
        raise ProtocolError(f"{what} does not carry key tag {want!r}")


# -- collective decryption ---------------------------------------------------------------
def aggregate_decrypt_shares(ctx: CkksContext, joint: JointKeys, ct: openfhe.Ciphertext,
                             shares: Sequence[openfhe.Ciphertext], *,
                             compressed: bool = True) -> openfhe.Plaintext:
    """Check the parties' shares of ``ct`` and fuse them (``MultipartyDecryptFusion``).

    Finalize with :meth:`CkksContext.decode`. A share of another ciphertext at the same
    level and scale cannot be told apart here; fusion then fails its CKKS sanity check
    (ProtocolError) or returns wrong values.
    """
    _require_count(shares, joint, "decryption shares")
    _require_tag(ct, joint.tag, "ciphertext to decrypt")
    like = _one_element(ctx.raw.Compress(ct, decrypt_share_towers(ctx, ct)) if compressed
                        else ct)
    for i, share in enumerate(shares):
        _require_like(ctx, share, like, f"decryption share #{i}")
    _require_tags(shares, [joint.tag] * len(shares), "decryption share")
    try:
        return ctx.raw.MultipartyDecryptFusion(list(shares))
    except RuntimeError as exc:
        if _DECODE_OVERFLOW in str(exc):
            raise DecodeOverflow(f"decrypted values too large to decode: {exc}") from None
        raise ProtocolError(f"decryption shares do not fuse: {exc}") from None


_DECODE_OVERFLOW = "approximation error is too high"


class DecodeOverflow(ProtocolError):
    """The shares fused, but OpenFHE's decoding check failed: the ciphertext's noise is
    too large for its scale. Measured after a ciphertext-ciphertext product: quotients of
    2^42 and above (test preset; the noise grows with the values), so the caller may
    decrypt again at a public smaller scale; nothing else was learned.
    """


def fuse_decryption(ctx: CkksContext, joint: JointKeys, ct: openfhe.Ciphertext,
                    shares: Sequence[openfhe.Ciphertext], n: int) -> np.ndarray:
    """Aggregate and finalize a collective decryption: the first ``n`` slot values."""
    return ctx.decode(aggregate_decrypt_shares(ctx, joint, ct, shares), n)


def fuse_sum_decryption(ctx: CkksContext, joint: JointKeys, ct: openfhe.Ciphertext,
                        shares: Sequence[openfhe.Ciphertext], n: int) -> np.ndarray:
    """Aggregate and finalize a flooded decryption of a sum upload (shares at the sum's
    own towers and scale, see :meth:`PartyKeys.decrypt_sum_share`)."""
    return ctx.decode(aggregate_decrypt_shares(ctx, joint, ct, shares, compressed=False), n)


def _one_element(ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """``ct`` without its second element: the shape of a decryption share."""
    out = ct.Clone()
    if out.NumberCiphertextElements() > 1:
        out.RemoveElement(1)
    return out


# -- collective (interactive) bootstrapping ----------------------------------------------
@dataclass(frozen=True)
class BootRound:
    """Server state of one collective bootstrap; parties get ``c1`` and ``a``."""

    adjusted: openfhe.Ciphertext
    c1: openfhe.Ciphertext
    a: openfhe.Ciphertext
    index: int


def start_bootstrap(ctx: CkksContext, joint: JointKeys, ct: openfhe.Ciphertext,
                    index: int) -> BootRound:
    """Compress ``ct`` (``IntMPBootAdjustScale``) and expand the common random element.

    ``ct`` must not be past the level budget: OpenFHE would fail or return garbage.
    The random element is the ``index``-th of this joint key (:mod:`.crs`): every party
    derives the same one from the index, so the server cannot choose it.
    """
    ctx.check_same_context(ct, "ciphertext to bootstrap")
    if ct.GetKeyTag() != joint.tag or ct.NumberCiphertextElements() != 2:
        raise ProtocolError("can only bootstrap a relinearized joint ciphertext")
    require_consumed_at_most(ct, ctx.level_budget, "collective bootstrap")
    adjusted = ctx.raw.IntMPBootAdjustScale(ct)
    c1 = adjusted.Clone()
    c1.RemoveElement(0)
    return BootRound(adjusted=adjusted, c1=c1,
                     a=common_element(ctx, joint.public_key, index), index=index)


def aggregate_boot_shares(ctx: CkksContext, joint: JointKeys, rnd: BootRound,
                          shares: Sequence[Sequence[openfhe.Ciphertext]],
                          ) -> list[openfhe.Ciphertext]:
    """Check each party's (h0, h1) and sum them (``IntMPBootAdd``).

    OpenFHE leaves level and scale of these shares at defaults, so the checks are
    context, element count and key tag: each pair carries its own party's key tag, so a
    share made with keys outside this federation (or out of order) is caught.
    """
    _require_count(shares, joint, "bootstrap shares")
    expected = (_poly_towers(ctx, rnd.c1), _poly_towers(ctx, rnd.a))  # h0 as c1, h1 as a
    for i, pair in enumerate(shares):
        what = f"bootstrap share #{i}"
        if len(pair) != 2:
            raise ProtocolError(f"{what} has {len(pair)} parts, expected 2")
        for part, towers in zip(pair, expected, strict=True):
            ctx.check_same_context(part, what)
            if part.NumberCiphertextElements() != 1:
                raise ProtocolError(f"{what} has a part with "
                                    f"{part.NumberCiphertextElements()} elements")
            _require_tag(part, joint.party_tags[i], what)
            if _poly_towers(ctx, part) != towers:
                raise ProtocolError(f"{what} has a part with {_poly_towers(ctx, part)} "
                                    f"towers, expected {towers}")
    return ctx.raw.IntMPBootAdd([list(pair) for pair in shares])


def _poly_towers(ctx: CkksContext, ct: openfhe.Ciphertext) -> int:
    """RNS towers a one-element ciphertext's polynomial really holds.

    OpenFHE leaves the level of bootstrap shares at its default, so it does not tell;
    the serialized size does (N 64-bit coefficients per tower, plus a small header).
    """
    return len(openfhe.Serialize(ct, openfhe.BINARY)) // (8 * ctx.preset.ring_dim)


def finish_bootstrap(ctx: CkksContext, joint: JointKeys, rnd: BootRound,
                     aggregate: Sequence[openfhe.Ciphertext]) -> openfhe.Ciphertext:
    """Re-encrypt under the joint key (``IntMPBootEncrypt``): full level budget again."""
    out = ctx.raw.IntMPBootEncrypt(joint.public_key, list(aggregate), rnd.a, rnd.adjusted)
    if ctx.consumed(out) != 0 or out.GetKeyTag() != joint.tag:
        raise ProtocolError("collective bootstrap did not return a fresh joint ciphertext")
    return out
