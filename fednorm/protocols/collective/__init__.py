"""Collective sub-protocols every PPF protocol runs: key setup, decryption, bootstrapping.

Each collective operation is one class of :mod:`fednorm.engine.ckks.multiparty` with the
same verbs — parties *generate shares* from their secret keys, the server *aggregates*
them and *finalizes* — and the crypto math there; here is only the message flow:

- :mod:`.keys`: key setup (:func:`setup_server`, :func:`setup_party`), the key
  operations composed into three rounds;
- :mod:`.decryption`, :mod:`.bootstrap`: one round each, run by the server through
  :class:`ServerCrypto` and answered by a party;
- :mod:`.service`: the party's loop answering them (:func:`serve_until`), with the
  per-phase caps of the leakage ledger;
- :mod:`.messages`: what crosses the wire; :mod:`.roles`: what each role holds.
"""

from fednorm.protocols.collective.keys import (
    LEAD,
    flooding_arguments,
    reusable,
    setup_party,
    setup_server,
)
from fednorm.protocols.collective.messages import (
    BootRequest,
    CoefficientDecryptRequest,
    DecryptRequest,
    ProductDecryptRequest,
    SumDecryptRequest,
)
from fednorm.protocols.collective.roles import (
    PartyCrypto,
    PartyKeyState,
    ServerCrypto,
    shared_context,
)
from fednorm.protocols.collective.service import serve_until

__all__ = [
    "LEAD",
    "BootRequest",
    "CoefficientDecryptRequest",
    "DecryptRequest",
    "PartyCrypto",
    "PartyKeyState",
    "ProductDecryptRequest",
    "ServerCrypto",
    "SumDecryptRequest",
    "flooding_arguments",
    "reusable",
    "serve_until",
    "setup_party",
    "setup_server",
    "shared_context",
]
