"""Collective sub-protocols every PPF protocol runs: key setup, decryption, bootstrapping.

Each collective operation has the multiparty shape — parties *generate shares* from
their secret keys, the server *aggregates* them, the result is *finalized* — with the
crypto math in :mod:`fednorm.engine.ckks` and only the message flow here.

Key setup takes three rounds:

1. the lead party (party 1) makes an ordinary key pair and sends its public key and
   round-1 relinearization share (plus a rotation-key share if the protocol needs
   rotations); the server forwards them to the other parties;
2. every other party makes its key share on the lead key's common element, and its
   round-1 relinearization (and rotation) share; the server folds the public-key shares
   into the joint public key and the round-1 shares, and sends both to all parties;
3. every party sends its round-2 relinearization share; the server folds and installs
   the relinearization key.

Secret keys never leave :class:`~fednorm.engine.ckks.PartyKeys`.  During a PPF
protocol a party answers the server's decryption and bootstrapping requests with
:func:`serve_until`, which also caps how many decryptions the server may ask for in
each phase — so a party, not just the server, enforces the leakage ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import TypeVar

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.codec import register_ext_type
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext

LEAD = 1
M = TypeVar("M", bound=Message)
T = TypeVar("T")


@cache
def _context(preset: str) -> ckks.CkksContext:
    return ckks.CkksContext(preset)


def shared_context(preset: str) -> ckks.CkksContext:
    """This process's CKKS context for ``preset``, its types registered with the codec.

    One context per process and preset: OpenFHE keeps evaluation keys in process-wide
    maps, so every role in a simulation shares it, as a real deployment has one per host.
    """
    context = _context(preset)
    context.register_codec_types(register_ext_type)
    return context


# -- messages -----------------------------------------------------------------------------
@message("ckks.lead_keys")
class LeadKeys(Message):
    public_key: openfhe.PublicKey
    relin_share: openfhe.EvalKey | None
    rotation_share: openfhe.EvalKeyMap | None


@message("ckks.key_shares")
class KeyShares(Message):
    public_key: openfhe.PublicKey
    relin_share: openfhe.EvalKey | None
    rotation_share: openfhe.EvalKeyMap | None


@message("ckks.joint_round1")
class JointRound1(Message):
    public_key: openfhe.PublicKey
    party_tags: list[str]
    relin_round1: openfhe.EvalKey | None


@message("ckks.relin_round2")
class RelinRound2(Message):
    share: openfhe.EvalKey


@message("ckks.setup_done")
class SetupDone(Message):
    """The joint keys are ready: the protocol proper may start."""


@message("ckks.decrypt_request")
class DecryptRequest(Message):
    ciphertext: openfhe.Ciphertext


@message("ckks.decrypt_sum_request")
class SumDecryptRequest(Message):
    """Decrypt a sum of fresh uploads: every party floods its share (docs/LEAKAGE.md)."""

    ciphertext: openfhe.Ciphertext


@message("ckks.decrypt_share")
class DecryptShare(Message):
    share: openfhe.Ciphertext


@message("ckks.boot_request")
class BootRequest(Message):
    """Bootstrap ``c1``; the common random element is the joint key's ``index``-th, which
    every party derives itself (:func:`fednorm.engine.ckks.common_element`): a server
    cannot pick it, and a party refuses an index it did not expect."""

    c1: openfhe.Ciphertext
    index: int


@message("ckks.boot_share")
class BootShare(Message):
    h0: openfhe.Ciphertext
    h1: openfhe.Ciphertext


# -- role state ---------------------------------------------------------------------------
@dataclass
class ServerCrypto:
    """What the server holds: the context and the joint public material, no secret."""

    rc: RoleContext
    ckks: ckks.CkksContext
    joint: ckks.JointKeys
    bootstraps: int = 0
    decryptions: int = 0
    relinearized: bool = True
    rotations: tuple[int, ...] = ()
    boot_index: int = 0  # bootstraps under these keys so far: the next common element

    def encrypt(self, values: np.ndarray) -> openfhe.Ciphertext:
        return self.ckks.encrypt(self.joint.public_key, values)

    async def decrypt(self, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        """Collective decryption: the first ``n`` slots of ``ct``, revealed to the server.

        Not flooded (docs/LEAKAGE.md, "Decryption noise"): for sums use
        :meth:`decrypt_sum`.  The scale is doubled first (one level): it cuts the effect of
        OpenFHE's fixed share noise from ~1e-6 to ~1e-9 absolute.  The ciphertext is then
        compressed to the towers a decryption share keeps anyway, so the request sent to
        every party is as small as the shares that come back.
        """
        ct = await self.rc.run_sync(self._prepare_decryption, ct)
        return await self._decryption_round("decrypt", DecryptRequest(ciphertext=ct),
                                            ckks.fuse_decryption, n)

    async def decrypt_sum(self, ct: openfhe.Ciphertext, n: int) -> np.ndarray:
        """Flooded collective decryption of a sum of the parties' sum uploads
        (:meth:`PartyCrypto.encrypt_for_sum`): the first ``n`` slots, to the server.

        Each party adds noise 2^s·√N above the sum's noise bound to its share, so the
        fused values carry an absolute error of ~1e-11 (paper preset, P=10, s=30).
        """
        return await self._decryption_round("decrypt_sum", SumDecryptRequest(ciphertext=ct),
                                            ckks.fuse_sum_decryption, n)

    async def _decryption_round(self, name: str, request: DecryptRequest | SumDecryptRequest,
                                fuse: Callable[..., np.ndarray], n: int) -> np.ndarray:
        """Ask every party for a share of ``request``'s ciphertext, then fuse them."""
        self.decryptions += 1
        with self.rc.subprotocol(name):
            await self.rc.broadcast(request)
            replies = await self.rc.gather(DecryptShare)
        shares = [replies[p].share for p in self.rc.parties]
        return await self.rc.run_sync(fuse, self.ckks, self.joint, request.ciphertext,
                                      shares, n)

    def _prepare_decryption(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        # Compress first, then double: compressing after the doubling would rescale it
        # away (measured 2.3e-6 instead of 1.6e-9 absolute error).
        compressed = self.ckks.raw.Compress(ct, ckks.DECRYPT_SHARE_TOWERS + 1)
        return self.ckks.double_scale(compressed)

    async def bootstrap(self, ct: openfhe.Ciphertext) -> openfhe.Ciphertext:
        """Collective bootstrapping: same values, full level budget, nothing revealed."""
        self.bootstraps += 1
        index, self.boot_index = self.boot_index, self.boot_index + 1
        round_ = await self.rc.run_sync(ckks.start_bootstrap, self.ckks, self.joint, ct, index)
        with self.rc.subprotocol("bootstrap"):
            await self.rc.broadcast(BootRequest(c1=round_.c1, index=index))
            replies = await self.rc.gather(BootShare)
        shares = [(replies[p].h0, replies[p].h1) for p in self.rc.parties]
        return await self.rc.run_sync(_finish_bootstrap, self.ckks, self.joint, round_, shares)

    async def add_all(self, cts: Mapping[int, openfhe.Ciphertext]) -> openfhe.Ciphertext:
        """⊕ over the parties' ciphertexts (by party id), each checked to be a joint one."""
        for party, ct in cts.items():
            self.check_joint(ct, f"ciphertext from party {party}")
        return await self.rc.run_sync(_sum, self.ckks, list(cts.values()))

    def check_joint(self, ct: object, what: str) -> None:
        """ProtocolError unless ``ct`` is a ciphertext under this federation's joint key."""
        if not isinstance(ct, openfhe.Ciphertext):
            raise ProtocolError(f"{what} is a {type(ct).__name__}, not a ciphertext")
        self.ckks.check_same_context(ct, what)
        if ct.GetKeyTag() != self.joint.tag or ct.NumberCiphertextElements() != 2:
            raise ProtocolError(f"{what} is not encrypted under the joint public key")


@dataclass
class PartyCrypto:
    """What a party holds: its key share (secret, never sent) and the joint public key."""

    rc: RoleContext
    ckks: ckks.CkksContext
    keys: ckks.PartyKeys
    public_key: openfhe.PublicKey
    relinearized: bool = True
    rotations: tuple[int, ...] = ()
    boot_index: int = 0  # bootstraps answered under these keys: the next expected index
    n_parties: int = 1  # P, public: the joint key's number of shares
    flooding_bits: int = ckks.flooding.DEFAULT_SECURITY_BITS  # s of every flooded share

    def require_pooled_count_within(self, counts: np.ndarray, max_count: int) -> None:
        """InputError unless P × this party's largest count fits ``max_count``.

        An encrypted inverse is only right on [1, max_count]; no single party sees the
        pooled count, but if every party holds at most max_count / P values the pooled
        count cannot leave the range (beyond it the inverse diverges silently).
        """
        largest = float(np.max(counts, initial=0.0))
        if largest * self.n_parties > max_count:
            raise InputError(
                f"this party holds {largest:.0f} values of a feature; with {self.n_parties} "
                f"parties the pooled count could exceed max_count={max_count} (each party "
                f"may hold at most {max_count // self.n_parties}): raise max_count")

    async def encrypt(self, values: np.ndarray, level: int = 0) -> openfhe.Ciphertext:
        """Encrypt under the joint key; ``level`` > 0 for a ciphertext the server only
        multiplies a few times (:meth:`~fednorm.engine.ckks.CkksContext.upload_level`)."""
        return await self.rc.run_sync(self.ckks.encrypt, self.public_key, values, level)

    async def encrypt_for_sum(self, values: np.ndarray) -> openfhe.Ciphertext:
        """Encrypt values the server only adds up and decrypts with :meth:`ServerCrypto.
        decrypt_sum` (counts, sums): scale Δ², 4 towers (2.1 MB instead of 6.3 MB at the
        paper preset), so the flooded decryption keeps its precision."""
        return await self.rc.run_sync(self.ckks.encrypt_sum, self.public_key, values)

    def flooding(self) -> ckks.Flooding:
        """The noise this party adds to a share of a sum of the P parties' uploads."""
        return ckks.Flooding(self.ckks.preset.ring_dim, self.n_parties, self.n_parties,
                             self.flooding_bits)


def _finish_bootstrap(
    context: ckks.CkksContext, joint: ckks.JointKeys, round_: ckks.BootRound,
    shares: list[tuple[openfhe.Ciphertext, openfhe.Ciphertext]],
) -> openfhe.Ciphertext:
    return ckks.finish_bootstrap(context, joint, round_,
                                 ckks.aggregate_boot_shares(context, joint, round_, shares))


def _sum(context: ckks.CkksContext, cts: list[openfhe.Ciphertext]) -> openfhe.Ciphertext:
    total = cts[0]
    for ct in cts[1:]:
        total = context.add(total, ct)
    return total


# -- setup --------------------------------------------------------------------------------
async def setup_server(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = ()
) -> ServerCrypto:
    """Server side of collective key generation (see the module doc).

    Without ``relinearize`` (a protocol that never multiplies two ciphertexts) the
    third round and its 25 MB-per-party shares are skipped.  If ``rc.crypto`` already
    holds keys of this federation that cover the request (an earlier protocol of the
    same session, see :func:`reusable`), they are reused and nothing is sent.
    """
    held = reusable(rc, ServerCrypto, preset, relinearize, rotations)
    if held is not None:
        rc.crypto = replace(held, rc=rc, bootstraps=0, decryptions=0)
        return rc.crypto
    context = shared_context(preset)
    with rc.subprotocol("setup"):
        lead = await rc.receive(LEAD, LeadKeys)
        await rc.forward(lead, rc.parties[1:])
        shares = [lead, *await _gather_from(rc, rc.parties[1:], KeyShares)]
        joint = await rc.run_sync(
            ckks.aggregate_public_key, context, [s.public_key for s in shares])
        round1 = None
        if relinearize:
            round1 = await rc.run_sync(ckks.aggregate_relin_round1, context, joint,
                                       [_required(s.relin_share, "relin") for s in shares])
        await rc.broadcast(JointRound1(public_key=joint.public_key,
                                       party_tags=list(joint.party_tags), relin_round1=round1))
        if rotations:
            rotation = await rc.run_sync(ckks.aggregate_rotation_shares, context, joint,
                                         [_required(s.rotation_share, "rotation")
                                          for s in shares])
            context.install_rotation_keys(rotation, joint.tag, rotations)
        if relinearize:
            round2 = await rc.gather(RelinRound2)
            relin = await rc.run_sync(ckks.aggregate_relin_round2, context, joint,
                                      [round2[p].share for p in rc.parties])
            context.install_relin_key(relin, joint.tag)
        await rc.broadcast(SetupDone())
    rc.crypto = ServerCrypto(rc, context, joint, relinearized=relinearize,
                             rotations=tuple(rotations))
    return rc.crypto


async def setup_party(
    rc: RoleContext, preset: str, *, relinearize: bool = True, rotations: Sequence[int] = (),
    flooding_bits: int = ckks.flooding.DEFAULT_SECURITY_BITS,
) -> PartyCrypto:
    """Party side of collective key generation; the secret key stays in ``PartyKeys``.

    Reuses the keys in ``rc.crypto`` under the same rule as :func:`setup_server`.
    ``flooding_bits`` is s of the flooded (sum) decryptions this party answers.
    """
    ckks.check_security_bits(flooding_bits)
    held = reusable(rc, PartyCrypto, preset, relinearize, rotations)
    if held is not None:
        rc.crypto = replace(held, rc=rc, flooding_bits=flooding_bits)
        return rc.crypto
    context = shared_context(preset)
    with rc.subprotocol("setup"):
        lead = None if rc.me == LEAD else await rc.receive(SERVER, LeadKeys)
        keys = await rc.run_sync(
            ckks.PartyKeys.generate, context, lead.public_key if lead else None)
        relin = rotation = None
        if relinearize:
            relin = await rc.run_sync(
                keys.relin_share, _required(lead.relin_share, "relin") if lead else None)
        if rotations:
            rotation = await rc.run_sync(
                keys.rotation_share, rotations,
                _required(lead.rotation_share, "rotation") if lead else None)
        kind = KeyShares if lead else LeadKeys
        await rc.send(SERVER, kind(public_key=keys.public_key_share, relin_share=relin,
                                   rotation_share=rotation))
        joint = await rc.receive(SERVER, JointRound1)
        if relinearize:
            share = await rc.run_sync(keys.relin_mult_share,
                                      _required(joint.relin_round1, "relin"))
            await rc.send(SERVER, RelinRound2(share=share))
        await rc.receive(SERVER, SetupDone)
    rc.crypto = PartyCrypto(rc, context, keys, joint.public_key, relinearized=relinearize,
                            rotations=tuple(rotations), n_parties=len(joint.party_tags),
                            flooding_bits=flooding_bits)
    return rc.crypto


C = TypeVar("C", ServerCrypto, PartyCrypto)


def reusable(rc: RoleContext, kind: type[C], preset: str, relinearize: bool,
             rotations: Sequence[int]) -> C | None:
    """The keys ``rc.crypto`` holds, if they are ``kind`` for ``preset`` and cover the
    relinearization key and rotations asked for; else None (run the setup).

    Collective key generation is the most expensive step of a short protocol (37% of
    PPF z-score at P=10), and the joint keys do not depend on the data: a federation
    that runs several protocols in one session (:func:`fednorm.sim.federation.
    simulate_session`) generates them once.  Server and parties decide alike, since they
    ran the same earlier protocols.
    """
    held = rc.crypto
    if not isinstance(held, kind) or held.ckks.preset.name != preset:
        return None
    if relinearize and not held.relinearized:
        return None
    return held if set(rotations) <= set(held.rotations) else None


def _required(share: T | None, what: str) -> T:
    if share is None:
        raise ProtocolError(f"a {what}-key share is missing")
    return share


async def _gather_from(rc: RoleContext, parties: Sequence[int], expected: type[M]) -> list[M]:
    """One message from each of ``parties`` (a round among a subset of the parties)."""
    rc.stats.rounds += 1
    return [await rc.receive(party, expected) for party in parties]


# -- the party's service loop -------------------------------------------------------------
async def serve_until(
    crypto: PartyCrypto, expected: type[M] | tuple[type[Message], ...], *, decryptions: int,
    bootstraps: int | None = None, sums: int = 0,
) -> M:
    """Answer the server's bootstrap and decryption requests until ``expected`` arrives
    (a message type, or a tuple of them).

    At most ``decryptions`` decryption requests, ``sums`` flooded decryptions of sum
    uploads (and, if given, ``bootstraps`` bootstrap requests) are honoured in this
    phase: the ledger fixes what each protocol step may reveal and compute, and a server
    asking for more is refused.  A bootstrap request must name the next common random
    element of these keys (never one used before).
    """
    rc = crypto.rc
    kinds = expected if isinstance(expected, tuple) else (expected,)
    left = {BootRequest: bootstraps, SumDecryptRequest: sums, DecryptRequest: decryptions}
    while True:
        msg = await _next_request_or(rc, kinds)
        if isinstance(msg, kinds):
            return msg  # type: ignore[return-value]
        allowed = left[type(msg)]
        if allowed is not None:
            if allowed <= 0:
                raise ProtocolError(f"the server asked for more {_REQUESTS[type(msg)]} than "
                                    "the protocol step declares")
            left[type(msg)] = allowed - 1
        if isinstance(msg, BootRequest):
            await _answer_bootstrap(crypto, msg)
        elif isinstance(msg, SumDecryptRequest):
            share = await rc.run_sync(crypto.keys.decrypt_sum_share, msg.ciphertext,
                                      crypto.flooding())
            with rc.subprotocol("decrypt_sum"):
                await rc.send(SERVER, DecryptShare(share=share))
        else:
            share = await rc.run_sync(crypto.keys.decrypt_share, msg.ciphertext)
            with rc.subprotocol("decrypt"):
                await rc.send(SERVER, DecryptShare(share=share))


_REQUESTS = {BootRequest: "bootstraps", SumDecryptRequest: "sum decryptions",
             DecryptRequest: "decryptions"}


async def _answer_bootstrap(crypto: PartyCrypto, request: BootRequest) -> None:
    """One bootstrap share, on the common element this party derives itself."""
    if request.index != crypto.boot_index:
        raise ProtocolError(f"bootstrap request for common element #{request.index}, "
                            f"expected #{crypto.boot_index} (reused or skipped)")
    crypto.boot_index += 1
    rc = crypto.rc

    def share() -> tuple[openfhe.Ciphertext, openfhe.Ciphertext]:
        a = ckks.common_element(crypto.ckks, crypto.public_key, request.index)
        return crypto.keys.boot_share(request.c1, a)

    h0, h1 = await rc.run_sync(share)
    with rc.subprotocol("bootstrap"):
        await rc.send(SERVER, BootShare(h0=h0, h1=h1))


async def _next_request_or(rc: RoleContext, kinds: tuple[type[Message], ...]) -> Message:
    """The next server frame: a collective request (in its sub-protocol) or one of ``kinds``.

    A request's frame carries the sub-protocol id, so which scope to read it in is known
    only from the kind; the round counter is shared, so peeking does not reorder.
    """
    accepted: dict[type[Message], str] = dict.fromkeys(kinds, rc.protocol)
    accepted[BootRequest] = f"{rc.protocol}/bootstrap"
    accepted[DecryptRequest] = f"{rc.protocol}/decrypt"
    accepted[SumDecryptRequest] = f"{rc.protocol}/decrypt_sum"
    return await rc.receive_any(SERVER, accepted)
