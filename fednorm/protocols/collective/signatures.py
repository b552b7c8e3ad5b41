"""Key shares signed by the party that made them, checked by every other party.

The server forwards every party's key shares to every other party; since all traffic
passes through it, a share is only taken as party ``p``'s if party ``p`` signed it, for
this session, sub-protocol, round and message kind (:class:`~fednorm.engine.signing.
Statement`).  The party's :class:`~fednorm.engine.signing.Keyring` (``rc.keyring``) holds
its signing key and the means to check the others'.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from fednorm.engine import signing
from fednorm.engine.errors import FednormError, InputError, ProtocolError
from fednorm.engine.messages import Signed
from fednorm.engine.runtime import RoleContext, role_name

S = TypeVar("S", bound=Signed)


def keyring_of(rc: RoleContext) -> signing.Keyring:
    """This party's keyring; a party without one cannot check the joint keys, and stops."""
    keyring = rc.keyring
    if keyring is None:
        raise FednormError(f"{role_name(rc.me)} has no signing key, so it cannot check the "
                           "joint keys: a PPF key setup needs one (the party's federation "
                           "certificate and its key)")
    if keyring.party != rc.me:
        raise FednormError(f"{role_name(rc.me)} holds party {keyring.party}'s signing key")
    return keyring


async def signed(rc: RoleContext, msg: S) -> S:
    """``msg`` signed by this party, with its certificate (if it has one)."""
    return (await signed_with_digest(rc, msg))[0]


async def signed_with_digest(rc: RoleContext, msg: S) -> tuple[S, bytes]:
    """:func:`signed`, and the digest of the shares it signed."""
    signer = keyring_of(rc).signer
    digest = await rc.run_sync(msg.share_digest)
    signature = signer.sign(_statement(rc, msg, rc.me, digest))
    return (dataclasses.replace(msg, signature=signature, certificate=signer.certificate),
            digest)


async def verified(rc: RoleContext, party: int, msg: S) -> S:
    """``msg``, forwarded by the server, once checked to be signed by party ``party``
    (for this session, sub-protocol, round and kind): else ProtocolError naming it."""
    await verified_digest(rc, party, msg)
    return msg


async def verified_digest(rc: RoleContext, party: int, msg: Signed) -> bytes:
    """:func:`verified`, returning the digest of the shares party ``party`` signed: the
    same as its own :func:`signed_with_digest` gave it."""
    try:
        digest = await rc.run_sync(msg.share_digest, True)  # it came off the wire
    except InputError as exc:  # a field that is no OpenFHE object
        raise ProtocolError(f"party {party}'s {msg.KIND!r} is malformed: {exc}") from None
    signing.verify(keyring_of(rc).verifier, _statement(rc, msg, party, digest),
                   msg.signature, msg.certificate)
    return digest


def _statement(rc: RoleContext, msg: Signed, party: int, digest: bytes) -> signing.Statement:
    return signing.Statement(rc.session, rc.protocol, msg.ROUND, msg.KIND, party, digest)
