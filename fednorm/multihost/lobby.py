"""Who may join one multi-host session: parties 1..N, once each, with the same columns."""

from __future__ import annotations

from collections import Counter

import trio

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import FednormError
from fednorm.multihost.handshake import NET_VERSION, Hello, PartyWithdrew, Welcome
from fednorm.protocols.columns import column_difference
from fednorm.transport.tcp import HandshakeRefused, TcpLink


class SchemaMismatch(HandshakeRefused):
    """Parties do not hold the federation's columns; the session cannot run.

    ``party`` is the one refused for it at admission (None: found once all were in)."""

    def __init__(self, message: str, party: int | None = None) -> None:
        super().__init__(message)
        self.party = party


class Lobby:
    """Who may join one session: parties 1..N, once each, with the same features.

    :meth:`reserve` checks and claims a slot without awaiting, so two connections
    claiming the same id cannot both pass; :meth:`admit` fills it once the party has
    been welcomed.  The columns are the configured ``schema`` when there is one (a
    party that differs is refused at once), otherwise those of the majority once all N
    are in (:meth:`agree`): never those of whoever came first.  A cause that dooms the
    session (:meth:`abandon`) ends the wait for everyone at once.
    """

    def __init__(self, welcome: Welcome, protocol: str,
                 schema: tuple[str, ...] | None = None) -> None:
        self.welcome = welcome
        self.protocol = protocol
        self.schema = schema
        self.links: dict[int, TcpLink] = {}
        self._claims: dict[int, Hello] = {}
        self.agreed: tuple[str, ...] | None = schema
        self.failure: FednormError | None = None
        self.told: set[int] = set()  # parties told why a doomed session will not run
        self.first_joined = trio.Event()  # a party is in, or the session is doomed
        self.settled = trio.Event()  # all parties are in, or the session is doomed
        self.all_told = trio.Event()  # every party of a doomed session knows the cause

    @property
    def session(self) -> str:
        return self.welcome.session

    @property
    def features(self) -> tuple[str, ...] | None:
        """The federation's columns: configured, or agreed by :meth:`agree`."""
        return self.agreed

    @property
    def full(self) -> bool:
        return not self.missing()

    def missing(self) -> list[int]:
        return [p for p in range(1, self.welcome.parties + 1) if p not in self.links]

    def reserve(self, hello: Hello, cert_party: int | None) -> None:
        """Claim ``hello.party``'s slot, or raise :class:`HandshakeRefused` saying why.

        Once the session is doomed, a party of the federation that arrives late is
        refused with the cause everyone else was given.  A party that only comes to
        withdraw (it refused its own data) dooms it: :class:`PartyWithdrew`.
        """
        self._check(hello, cert_party)
        if self.failure is not None:
            self.tell(hello.party)
            raise HandshakeRefused(f"session abandoned: {self.failure}")
        if hello.withdraw is not None:
            raise PartyWithdrew(hello.party, hello.withdraw)
        if self.schema is not None and hello.features != self.schema:
            raise SchemaMismatch(column_difference(hello.party, hello.features, self.schema),
                                 hello.party)
        self._claims[hello.party] = hello

    def release(self, party: int) -> None:
        self._claims.pop(party, None)
        self.links.pop(party, None)

    def admit(self, party: int, link: TcpLink) -> None:
        self.links[party] = link
        self.first_joined.set()
        if self.full:
            self.settled.set()

    def abandon(self, cause: FednormError, party: int | None = None) -> None:
        """The session cannot run: the first cause is the one everyone is told
        (``party``, whose fault it is, already knows)."""
        if self.failure is None:
            self.failure = cause
        if party is not None:
            self.tell(party)
        self.first_joined.set()
        self.settled.set()

    def tell(self, party: int) -> None:
        """Note that ``party`` knows the cause of the session's failure."""
        self.told.add(party)
        if len(self.told) >= self.welcome.parties:
            self.all_told.set()

    def agree(self) -> tuple[str, ...]:
        """With every party in: the majority's columns; :class:`SchemaMismatch` naming
        the columns of each party that differs (everyone, if no schema has a majority)."""
        if self.agreed is not None:
            return self.agreed
        schemas = {p: self._claims[p].features for p in sorted(self.links)}
        votes = Counter(schemas.values())
        leader, count = votes.most_common(1)[0]
        if count * 2 > len(schemas):
            differ = [column_difference(p, have, leader) for p, have in schemas.items()
                      if have != leader]
            if differ:
                raise SchemaMismatch("; ".join(differ))
            self.agreed = leader
            return leader
        held = "; ".join(f"party {p}: {', '.join(have)}" for p, have in schemas.items())
        raise SchemaMismatch(f"the parties disagree on the columns and no set has a "
                             f"majority ({held}); give the server --features")

    def _check(self, hello: Hello, cert_party: int | None) -> None:
        party, n = hello.party, self.welcome.parties
        refusals = [
            (hello.version != NET_VERSION,
             f"handshake version {hello.version}, the server speaks {NET_VERSION}"),
            (hello.wire != WIRE_VERSION,
             f"wire version {hello.wire}, the server speaks {WIRE_VERSION}"),
            (cert_party is None, "the client certificate names no party"),
            (cert_party is not None and cert_party != party,
             f"the certificate is party {cert_party}'s but the handshake claims party {party}"),
            (not 1 <= party <= n, f"party {party} is not expected: parties are 1..{n}"),
            (party in self._claims, f"party {party} is already connected"),
            (hello.session is not None and hello.session != self.session,
             f"the party wants session {hello.session!r}, this is session {self.session!r}"),
            (hello.protocol is not None and hello.protocol != self.protocol,
             f"the party wants protocol {hello.protocol!r}, the server runs {self.protocol!r}"),
            (not hello.features and hello.withdraw is None, "the party has no features"),
        ]
        for refused, reason in refusals:
            if refused:
                raise HandshakeRefused(reason)
