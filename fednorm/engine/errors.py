"""The errors a federation can raise.

Every failure a user can meet is one of these, so that a command-line run or an
embedding application can tell bad input (nothing started) from a protocol
violation (a peer misbehaved) from a dropout (a peer went away).
"""

from __future__ import annotations

import re

import trio
from exceptiongroup import BaseExceptionGroup


class FednormError(Exception):
    """Base class of every error fednorm raises on purpose."""

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuilt from its message and attributes, not its constructor's arguments:
        errors cross process boundaries (a study grid's worker pool), and pickle's default
        calls the constructor with the message alone, which subclasses that take other
        arguments refuse (the pool's result thread then died and the grid hung)."""
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[FednormError], args: tuple[object, ...],
             state: dict[str, object]) -> FednormError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InputError(FednormError, ValueError):
    """Bad input, detected before any protocol work starts.

    ``about_data``: its message may describe a party's data (which feature, how large a
    value), so a party tells its peers only the category."""

    about_data = True


class InputRefused(InputError):
    """A party refused its own input for a reason it can name: ``cause`` is what every
    other role hears (the kind of input and its remedy); the message adds the detail
    (which columns, how large a value), which stays on the party's own log."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


class SessionRefused(InputError):
    """A party will not take part in what the server announced (e.g. protocols whose
    decryptions it does not flood).  Its reason is about the session, not the party's data,
    so every role reports it as it is."""

    about_data = False


class ProtocolError(FednormError):
    """A peer sent something the protocol does not allow at this point.

    Out-of-order, unknown-kind, wrong-sender, wrong-session and malformed frames
    all end up here: a misbehaving peer is an error, never a crash.
    """


class PartyDropped(FednormError):
    """A peer went away (closed its link) or did not answer in time."""

    def __init__(self, peer: str, reason: str) -> None:
        super().__init__(f"{peer} dropped: {reason}")
        self.peer = peer
        self.reason = reason


class ProtocolTimeout(PartyDropped):
    """A peer did not send the expected message within the receive timeout.

    The message names the peer and the time only: which frame kinds were awaited
    (``waiting_for``) is the protocol's inner working, kept for tracers and tests.
    """

    def __init__(self, peer: str, seconds: float, waiting_for: str) -> None:
        reason = f"sent nothing for {seconds:g} s"
        FednormError.__init__(self, f"{peer} stalled: {reason}")
        self.peer = peer
        self.reason = reason
        self.seconds = seconds
        self.waiting_for = waiting_for


class RunAborted(PartyDropped):
    """A peer stopped the run and said why (an abort frame): the cause is its reason.

    A reason that names the role it started at ("party 3 was interrupted", "party 2
    dropped: connection lost") is the message as it is: a server relays a party's reason
    verbatim, so every role of a run reports one and the same cause, never "server
    dropped" when the server is fine.  Any other reason gets the name of the peer that
    sent it in front.
    """

    def __init__(self, peer: str, reason: str) -> None:
        names_a_role = re.match(r"(server|party \d+)\b", reason) is not None
        FednormError.__init__(self, reason if names_a_role
                              else f"{peer} stopped the run: {reason}")
        self.peer = peer
        self.reason = reason


def root_cause(group: BaseExceptionGroup) -> BaseException:
    """The error that started a failure: a dropout is only a consequence of another, a
    cancellation of the failure itself (the group, if it holds nothing else)."""
    leaves: list[BaseException] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                collect(inner)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)

    collect(group)
    causes = [exc for exc in leaves if not isinstance(exc, PartyDropped)]
    return (causes or leaves or [group])[0]
