"""Party key material and the party side of every collective operation.

A :class:`PartyKeys` holds one party's secret key share and is the only object that
ever touches it: every party-side step (public-key share, relinearization shares,
rotation share, decryption share, bootstrapping share) is a method that returns
*public* material. The object refuses pickling and copying, and no function returns
secret-key material. The operation classes of :mod:`.collective` call these methods in
their ``generate_share`` and hold the server side (aggregate, finalize).

Key tags: OpenFHE looks evaluation keys up by the ciphertext's key tag. All joint
material carries :func:`joint_tag_for` (lead tag) — a tag no single party's key has, so a
ciphertext encrypted under one party's own key is told apart from a joint one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import openfhe

from fednorm.engine.ckks import ring
from fednorm.engine.ckks.context import KEY_MAP_LOCK, CkksContext
from fednorm.engine.ckks.flooding import Flooding, flood_share, flooded_share
from fednorm.engine.ckks.serial import deserialize
from fednorm.engine.errors import InputError, ProtocolError

DECRYPT_SHARE_TOWERS = 2
"""Towers a decryption share is compressed to before it is sent.

``Compress`` rescales first, so the share keeps scale ~2^50 whatever the ciphertext's
scale: two towers (110 bits) hold values with |x| < 2^58. Shrinks a fresh share 5-6x
(ring 2^14: 1.31 MB -> 0.26 MB; ring 2^15, depth 11: 3.15 MB -> 0.53 MB) and leaves the
decryption error unchanged (paper preset, P=10: 2.4e-6 uncompressed, 2.1e-6 compressed).
"""


def joint_tag_for(lead_tag: str) -> str:
    """The key tag of the joint keys of the federation whose lead key has ``lead_tag``."""
    return f"fednorm-joint-{lead_tag}"


def decrypt_share_towers(ctx: CkksContext, ct: openfhe.Ciphertext) -> int:
    """Towers every party compresses its decryption share of ``ct`` to (same rule for all)."""
    return min(DECRYPT_SHARE_TOWERS, ctx.towers(ct))


@dataclass(frozen=True)
class JointKeys:
    """The federation's public key material, as the server (and every party) knows it.

    ``party_tags`` lists each party's own key tag, lead first; the server learns them from
    the public-key shares and uses them to check who made a share.
    """

    public_key: openfhe.PublicKey
    tag: str
    party_tags: tuple[str, ...]

    @property
    def n_parties(self) -> int:
        """Number of parties (all of them must take part in every collective operation)."""
        return len(self.party_tags)


@dataclass
class HeldKeys:
    """What a role keeps of its federation's joint keys between the steps of a session
    (``RoleContext.held_keys``): the context, the joint public material, the evaluation
    keys installed, and the index of the next bootstrap's common element.  No network
    handle: each step makes its own facade over them (``ServerCrypto`` / ``PartyCrypto``
    in :mod:`fednorm.protocols.collective`).  A party's holds more (its secret share)."""

    ckks: CkksContext
    joint: JointKeys
    relinearized: bool = True
    rotations: tuple[int, ...] = ()
    boot_index: int = 0  # bootstraps under these keys so far: the next common element

    def covers(self, preset: str, relinearize: bool, rotations: Sequence[int]) -> bool:
        """Whether these keys serve a step at ``preset`` that needs the relinearization
        key (``relinearize``) and ``rotations``: then the step reuses them."""
        return (self.ckks.preset.name == preset and (self.relinearized or not relinearize)
                and set(rotations) <= set(self.rotations))


class PartyKeys:
    """One party's secret key share (never leaves this object) and its share makers."""

    __slots__ = ("_ctx", "_joint_tag", "_lead", "_pk", "_secret", "_sk")

    def __init__(self, ctx: CkksContext, pair: openfhe.KeyPair, lead_tag: str, lead: bool):
        self._ctx = ctx
        self._sk = pair.secretKey
        self._pk = pair.publicKey
        self._lead = lead
        self._joint_tag = joint_tag_for(lead_tag)
        self._secret: ring.Multiplier | None = None

    @classmethod
    def generate(cls, ctx: CkksContext,
                 lead_public_key: openfhe.PublicKey | None = None) -> PartyKeys:
        """Make a key share: the lead (``lead_public_key=None``) runs ordinary KeyGen;
        every other party a fresh share on the lead key's common element
        (``MultipartyKeyGen(pk0, False, True)``), so the joint key takes one round.
        """
        if lead_public_key is None:
            pair = ctx.raw.KeyGen()
            return cls(ctx, pair, pair.publicKey.GetKeyTag(), lead=True)
        ctx.check_same_context(lead_public_key, "lead public key")
        pair = ctx.raw.MultipartyKeyGen(lead_public_key, False, True)
        return cls(ctx, pair, lead_public_key.GetKeyTag(), lead=False)

    # Secrets stay in this process and this object.
    def __reduce__(self) -> NoReturn:
        raise TypeError("PartyKeys holds a secret key and cannot be pickled or copied")

    def __getstate__(self) -> NoReturn:
        raise TypeError("PartyKeys holds a secret key and cannot be pickled or copied")

    def __copy__(self) -> NoReturn:
        raise TypeError("PartyKeys holds a secret key and cannot be pickled or copied")

    def __deepcopy__(self, memo: dict) -> NoReturn:
        raise TypeError("PartyKeys holds a secret key and cannot be pickled or copied")

    def __repr__(self) -> str:
        role = "lead" if self._lead else "party"
        return f"PartyKeys({role}, tag={self.tag[:12]}..., preset={self._ctx.preset.name!r})"

    @property
    def is_lead(self) -> bool:
        """Whether this party made the lead key (and leads decryption by default)."""
        return self._lead

    @property
    def tag(self) -> str:
        """This party's own key tag (public)."""
        return self._pk.GetKeyTag()

    @property
    def joint_tag(self) -> str:
        """The tag of the joint keys this party takes part in."""
        return self._joint_tag

    @property
    def public_key_share(self) -> openfhe.PublicKey:
        """This party's public-key share; the server folds them into the joint key."""
        return self._pk

    # -- relinearization key, two rounds -------------------------------------------------
    def relin_share(self, lead_share: openfhe.EvalKey | None = None) -> openfhe.EvalKey:
        """Round 1: lead ``KeySwitchGen(s0, s0)``; others ``MultiKeySwitchGen`` on it."""
        if self._lead:
            return self._ctx.raw.KeySwitchGen(self._sk, self._sk)
        if lead_share is None:
            raise InputError("a non-lead party needs the lead's round-1 relinearization share")
        return self._ctx.raw.MultiKeySwitchGen(self._sk, self._sk, lead_share)

    def relin_mult_share(self, joint_round1: openfhe.EvalKey) -> openfhe.EvalKey:
        """Round 2: ``MultiMultEvalKey(s_i, joint round-1 key)`` under the joint tag."""
        self._require_tag(joint_round1.GetKeyTag(), "joint round-1 relinearization key")
        return self._ctx.raw.MultiMultEvalKey(self._sk, joint_round1, self._joint_tag)

    # -- rotation keys, one round --------------------------------------------------------
    def rotation_share(self, indices: Sequence[int],
                       lead_share: openfhe.EvalKeyMap | None = None) -> openfhe.EvalKeyMap:
        """Rotation-key share for slot offsets ``indices`` (lead first, others on it).

        Measured on openfhe 1.6.1: the lead's ``EvalAutomorphismKeyGen`` also stores the
        keys in OpenFHE's process-wide cache under the lead's own tag and returns only
        keys not cached before. So the lead's share is a copy of everything cached for its
        tag (a superset of ``indices`` if it made rotation keys before; extra indices are
        dropped in aggregation), and the lead's process keeps its own keys cached.
        """
        indices = list(indices)
        raw = self._ctx.raw
        if self._lead:
            with KEY_MAP_LOCK:
                raw.EvalAutomorphismKeyGen(self._sk, raw.FindAutomorphismIndices(indices))
                cached = openfhe.Serialize(raw.GetEvalAutomorphismKeyMap(self.tag),
                                           openfhe.BINARY)
            return deserialize(openfhe.DeserializeEvalKeyMapString, cached)
        if lead_share is None:
            raise InputError("a non-lead party needs the lead's rotation-key share")
        return raw.MultiEvalAtIndexKeyGen(self._sk, lead_share, indices, self._joint_tag)

    # -- collective decryption -----------------------------------------------------------
    def decrypt_share(self, ct: openfhe.Ciphertext, *,
                      lead: bool | None = None) -> openfhe.Ciphertext:
        """Partial decryption of a joint ciphertext, compressed for sending.

        Exactly one party per decryption must be ``lead`` (default: the key lead).
        OpenFHE adds a fixed Gaussian (σ = 2^20) to each share; it is *not* noise
        flooding (docs/LEAKAGE.md, "Decryption noise").
        """
        self._check_joint_ciphertext(ct, "ciphertext to decrypt", elements=2)
        is_lead = self._lead if lead is None else lead
        make = self._ctx.raw.MultipartyDecryptLead if is_lead else \
            self._ctx.raw.MultipartyDecryptMain
        share = make([ct], self._sk)[0]
        return self._ctx.raw.Compress(share, decrypt_share_towers(self._ctx, ct))

    def decrypt_sum_share(self, ct: openfhe.Ciphertext, flooding: Flooding) -> openfhe.Ciphertext:
        """Flooded partial decryption of a sum of fresh uploads (:meth:`CkksContext.
        encrypt_sum`): the share at the sum's own towers and scale Δ², plus Gaussian noise
        √(12τ)·2^(s/2) times the sum's noise bound (:mod:`.flooding`): the server learns the
        sum, not the noise that depends on this party's secret.

        Only a ciphertext shaped like such a sum (two elements, scale Δ², the sum towers)
        is accepted: the bound holds for nothing else.  A product of bit uploads is
        decrypted here too, with ``flooding`` sized for it
        (:class:`~.flooding.ProductFlooding`, which names a product's shape).  The share is
        made here (:func:`~.flooding.flooded_share`); with flooding off (only to measure
        its cost) it is OpenFHE's, as unflooded shares are.
        """
        self._check_joint_ciphertext(ct, "sum to decrypt", elements=2)
        ctx = self._ctx
        name, degree, towers = flooding.decrypted_shape
        if ct.GetNoiseScaleDeg() != degree or ctx.towers(ct) != towers:
            raise ProtocolError(f"sum to decrypt has scale degree {ct.GetNoiseScaleDeg()} and "
                                f"{ctx.towers(ct)} towers, not {name}'s {degree} and {towers}")
        if flooding.enabled:
            return flooded_share(ctx, ct, self._secret_towers(towers), self._lead, flooding)
        make = ctx.raw.MultipartyDecryptLead if self._lead else ctx.raw.MultipartyDecryptMain
        return flood_share(ctx, make([ct], self._sk)[0], flooding)

    def _secret_towers(self, towers: int) -> ring.Multiplier:
        """This party's secret key share, its first ``towers`` towers (evaluation domain),
        kept in this object for the shares it makes."""
        if self._secret is None or len(self._secret.moduli) < towers:
            ctx = self._ctx
            self._secret = ring.Multiplier.of(openfhe.Serialize(self._sk, openfhe.BINARY),
                                              ctx.preset.ring_dim, towers, ctx.moduli)
        return self._secret

    # -- collective bootstrapping --------------------------------------------------------
    def boot_share(self, c1: openfhe.Ciphertext,
                   a: openfhe.Ciphertext) -> tuple[openfhe.Ciphertext, openfhe.Ciphertext]:
        """``IntMPBootDecrypt(s_i, c1, a)``: masked-decryption and re-encryption shares.

        Checks first that ``c1`` is a compressed joint ciphertext (one element at the
        bootstrap level) and ``a`` a full-level common random element.
        """
        ctx = self._ctx
        self._check_joint_ciphertext(c1, "bootstrap input c1", elements=1)
        self._check_joint_ciphertext(a, "bootstrap random element", elements=1)
        if ctx.towers(c1) != ctx.preset.boot_towers - 1 or a.GetLevel() != 0:
            raise ProtocolError(f"bootstrap request at the wrong level: c1 has "
                                f"{ctx.towers(c1)} towers, a is at level {a.GetLevel()}")
        h0, h1 = ctx.raw.IntMPBootDecrypt(self._sk, c1, a)
        return h0, h1

    def _check_joint_ciphertext(self, ct: openfhe.Ciphertext, what: str,
                                elements: int | None = None) -> None:
        self._ctx.check_same_context(ct, what)
        self._require_tag(ct.GetKeyTag(), what)
        if elements is not None and ct.NumberCiphertextElements() != elements:
            raise ProtocolError(f"{what} has {ct.NumberCiphertextElements()} elements, "
                                f"expected {elements}")

    def _require_tag(self, tag: str, what: str) -> None:
        if tag != self._joint_tag:
            raise ProtocolError(f"{what} has key tag {tag!r}, not this federation's "
                                f"{self._joint_tag!r}")
