"""Protocols with one role replaced: a deviating server or party, for refusal tests."""

from __future__ import annotations

from fednorm.protocols import get_protocol
from fednorm.protocols.base import PartyRole, Protocol, ServerRole


def deviating(method: str, privacy: str = "mhe", *, server: ServerRole | None = None,
              party: PartyRole | None = None) -> Protocol:
    """The registered protocol with ``server`` and/or ``party`` in place of its roles."""
    protocol = get_protocol(method, privacy)
    return protocol.with_roles(server, party)


async def zscore_server_start(rc, options):
    """A PPF z-score server's honest start: key setup, the sums, ⟨n_g⟩; returns
    (crypto, ⟨n_g⟩) for a deviating server to continue from."""
    from fednorm.protocols.ppf import zscore as ppf_zscore

    crypto = await ppf_zscore.setup_server(rc, options.preset,
                                           **ppf_zscore.setup_arguments(options))
    sums = await rc.gather(ppf_zscore.EncryptedSums)
    await crypto.add_all({p: m.total for p, m in sums.items()})  # relayed first
    return crypto, await crypto.add_all({p: m.count for p, m in sums.items()})


def deviating_crypto(crypto, cls):
    """``crypto`` (a role's collective state, with the real keys) as an instance of
    ``cls``, a subclass whose collective calls deviate."""
    from dataclasses import fields

    return cls(**{f.name: getattr(crypto, f.name) for f in fields(crypto)})


async def zscore_server_with(rc, options, cls):
    """The honest PPF z-score server (encrypted inverse), its collective calls made by
    ``cls`` (:func:`deviating_crypto`), which finds ⟨n_g⟩ in its ``count``."""
    import numpy as np

    from fednorm.protocols.base import agreed_width
    from fednorm.protocols.normalizers import ZScoreNormalizer
    from fednorm.protocols.ppf import zscore as ppf_zscore

    crypto = deviating_crypto(await ppf_zscore.setup_server(rc, options.preset), cls)
    sums = await rc.gather(ppf_zscore.EncryptedSums)
    width = agreed_width(sums)
    total = await crypto.add_all({p: m.total for p, m in sums.items()})
    crypto.count = await crypto.add_all({p: m.count for p, m in sums.items()})
    inverse, present = await ppf_zscore._count_inverse(crypto, sums, crypto.count, width,
                                                       options)
    mean, var = await ppf_zscore.pooled_moments(crypto, total, inverse, width, options)
    mean, var = np.where(present, mean, np.nan), np.where(present, var, np.nan)
    await rc.broadcast(ppf_zscore.PpfZScoreResult(mean=mean, var=var))
    return ZScoreNormalizer(mean, var)


def forging_server(start, forge, request, subprotocol: str, scope: str | None = None):
    """A server that runs ``start`` (its honest beginning: returns the crypto and each
    party's upload of one kind), then asks every party, in ``request`` over
    ``subprotocol`` (inside the sub-protocol ``scope``, if any), to decrypt the uploads
    ``forge(crypto, uploads)`` builds; returns
    (the server role, the parties whose shares it received)."""
    from contextlib import nullcontext

    from fednorm.engine.ckks.multiparty import DecryptionShare
    from fednorm.protocols.collective.rounds import request_shares

    received: list[int] = []

    async def server(rc, options):
        crypto, uploads = await start(rc, options)
        index, forged = forge(crypto, uploads)
        with rc.subprotocol(scope) if scope else nullcontext():
            shares = await request_shares(rc, subprotocol, request(index=index),
                                          DecryptionShare, (index, forged))
        received.extend(rc.parties[:len(shares)])

    return server, received


def signed_by_a_stranger(crypto, party: int, ciphertext, kind):
    """``ciphertext`` as ``party``'s upload #0 of ``kind``, signed with a key the server
    made itself (what a server forging a party's upload can do)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from fednorm.engine import signing
    from fednorm.protocols.collective.sums import sign_upload

    own_key = signing.Keyring(signing.Signer(party, ed25519.Ed25519PrivateKey.generate()),
                              signing.TrustedKeys({}))
    return sign_upload(own_key, crypto.rc.session, 0, ciphertext, kind)[0]


def is_forgery_refusal(refusal: BaseException) -> bool:
    """A party's refusal of a relayed upload it cannot verify as its maker's."""
    text = str(refusal)
    return ("a forged upload" in text and "signature" in text) or "as this party's upload" in text
