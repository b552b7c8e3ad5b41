"""A federation across hosts, over TCP and mutual TLS: the server, or one party.

The server (:mod:`~fednorm.multihost.server`) listens, admits exactly parties 1..N
(:mod:`~fednorm.multihost.lobby`, through the handshake of
:mod:`~fednorm.multihost.handshake`), starts the protocol when all are in, and can serve
further sessions on the same listener.  A party (:mod:`~fednorm.multihost.party`)
validates its data, connects, learns the protocol and options from the server's
welcome, runs its role, and only then are its outputs written
(:mod:`~fednorm.multihost.files`).

Failure is all-or-nothing, because the run is N-out-of-N: a role that fails sends an
Abort carrying the cause to its peers (:func:`fednorm.session.run_role`), so everyone
stops promptly and names the same culprit, and nobody writes a partial result.
"""
