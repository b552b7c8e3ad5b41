"""The errors a federation can raise.

Every failure a user can meet is one of these, so that a command-line run or an
embedding application can tell bad input (nothing started) from a protocol
violation (a peer misbehaved) from a dropout (a peer went away).
"""

from __future__ import annotations


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
    """Bad input, detected before any protocol work starts."""


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
    """A peer did not send the expected message within the receive timeout."""

    def __init__(self, peer: str, seconds: float, waiting_for: str) -> None:
        super().__init__(peer, f"no {waiting_for!r} within {seconds:g} s")
        self.seconds = seconds
        self.waiting_for = waiting_for
