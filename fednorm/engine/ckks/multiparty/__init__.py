"""Collective operations: one class each, with the same verbs (as Lattigo's ``multiparty``).

=====================  ======================  ==============================================
operation              class                   verbs
=====================  ======================  ==============================================
joint public key       :class:`PublicKeyGen`   generate_share, aggregate_shares, finalize
relinearization key    :class:`RelinKeyGen`    generate_share, aggregate_shares (either
                                               of its two rounds), finalize
rotation keys          :class:`RotationKeyGen` generate_share, aggregate_shares, finalize
decryption             :class:`Decryption`     prepare, generate_share, aggregate_shares,
                                               finalize
flooded sum decryption :class:`SumDecryption`  the same
flooded product        :class:`ProductDecryption` the same
decryption
flooded masked sum     :class:`CoefficientSumDecryption` the same (bits: :mod:`..masking`)
flooded decryption of  :class:`FloodedDecryption` the same
a computed ciphertext
bootstrapping          :class:`Bootstrap`      prepare, generate_share, aggregate_shares,
                                               finalize (common_element: the seeded CRS)
key setup              :class:`KeySetup`       the three key operations, composed in two
                                               rounds: generate_share, running_sum, finalize
                       :class:`KeyCheck`       a party's own aggregate of a setup, compared
                                               with the server's
=====================  ======================  ==============================================

A party *generates a share* from its secret (a :class:`~fednorm.engine.ckks.keys.
PartyKeys`, which never hands the secret out), the server — anyone holding no secret —
*aggregates shares* and *finalizes* (the key installed, the plaintext decoded, the
ciphertext re-encrypted). The key operations also aggregate one share at a time
(``running_sum``: :class:`PublicKeySum`, :class:`RelinSum`, :class:`RotationSum`; for a
key setup :class:`RoundOneSum` and :class:`RoundTwoSum`), so a server
adds each party's shares as they arrive instead of holding all P of them. An operation
on a ciphertext starts with the server's *prepare*: what it sends the parties to make
shares of. Each share is a dataclass that says what it is a share of
(:class:`RelinShare` its round, :class:`BootstrapShare` its bootstrap index). What a
party sends is the message itself, signed where the server forwards it: a key setup's
round one (:class:`LeadKeys`, :class:`KeyShares`, which :meth:`KeySetup.typed` types
per operation) and round two (:class:`RelinRound2`), a :class:`DecryptionShare`, a
:class:`BootstrapShare`; so the checks run on what arrived. Every aggregation checks shares
before OpenFHE combines them (:mod:`.checks`), so a wrong or foreign share is a
:class:`ProtocolError`, never garbage. Synchronous, no I/O: the network rounds are in
:mod:`fednorm.protocols.collective`, the in-process ones in :mod:`..local`.
"""

from fednorm.engine.ckks.multiparty.bootstrap import BootRound, Bootstrap, BootstrapShare
from fednorm.engine.ckks.multiparty.decryption import (
    CoefficientSumDecryption,
    DecodeOverflow,
    Decryption,
    DecryptionShare,
    FloodedDecryption,
    ProductDecryption,
    SumDecryption,
)
from fednorm.engine.ckks.multiparty.keygen import (
    PublicKeyAggregate,
    PublicKeyGen,
    PublicKeyShare,
    PublicKeySum,
    RelinKeyGen,
    RelinShare,
    RelinSum,
    RotationKeyGen,
    RotationShare,
    RotationSum,
)
from fednorm.engine.ckks.multiparty.setup import (
    JointRoundOne,
    KeyCheck,
    KeyDigests,
    KeySetup,
    KeyShares,
    LeadKeys,
    RelinRound2,
    RoundOneSum,
    RoundTwoSum,
    SetupShares,
)

__all__ = [
    "BootRound",
    "Bootstrap",
    "BootstrapShare",
    "CoefficientSumDecryption",
    "DecodeOverflow",
    "Decryption",
    "DecryptionShare",
    "FloodedDecryption",
    "JointRoundOne",
    "KeyCheck",
    "KeyDigests",
    "KeySetup",
    "KeyShares",
    "LeadKeys",
    "ProductDecryption",
    "PublicKeyAggregate",
    "PublicKeyGen",
    "PublicKeyShare",
    "PublicKeySum",
    "RelinKeyGen",
    "RelinRound2",
    "RelinShare",
    "RelinSum",
    "RotationKeyGen",
    "RotationShare",
    "RotationSum",
    "RoundOneSum",
    "RoundTwoSum",
    "SetupShares",
    "SumDecryption",
]
