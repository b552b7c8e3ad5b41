"""Typed protocol messages.

A message is a frozen dataclass with a class-level ``KIND`` string; the ``@message``
decorator registers it so the codec can rebuild it from a frame.  Keeping the
registry here (and not in each protocol) is what lets an unknown kind be a
``ProtocolError`` at decode time instead of a crash later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np

from fednorm.engine.errors import ProtocolError

_REGISTRY: dict[str, type[Message]] = {}

M = TypeVar("M", bound="Message")


class Message:
    """Base of every message; subclasses are made with :func:`message`."""

    KIND: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        """The message body as a plain dict, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False)
class Signed(Message):
    """A share message signed by the party that made it (:mod:`fednorm.engine.signing`):
    the server forwards it to every other party, who checks the signature before it adds
    the share.  ``certificate`` is the signer's federation certificate (DER), empty when
    the verification keys were handed out directly; both empty until the maker signs it
    (:func:`fednorm.protocols.collective.signatures.signed`).  They come first on the
    wire; keyword-only here, so a share is made with its own fields alone."""

    ROUND: ClassVar[int] = 0  # the setup round the share belongs to

    signature: bytes = dataclasses.field(default=b"", kw_only=True)
    certificate: bytes = dataclasses.field(default=b"", kw_only=True)

    def share_digest(self, parsed: bool = False) -> bytes:
        """A digest of the share's bytes: what the signature covers with its place
        (``parsed``: the share came off the wire, see :func:`~fednorm.engine.ckks.
        serial.object_digest`)."""
        raise NotImplementedError


def message(kind: str) -> Callable[[type[M]], type[M]]:
    """Class decorator: make ``cls`` a frozen dataclass message of kind ``kind``."""

    def register(cls: type[M]) -> type[M]:
        if kind in _REGISTRY:
            raise RuntimeError(f"message kind {kind!r} registered twice")
        data_cls = dataclasses.dataclass(frozen=True, eq=False)(cls)
        data_cls.KIND = kind
        _REGISTRY[kind] = data_cls
        return data_cls

    return register


def message_class(kind: str) -> type[Message]:
    """The registered class for ``kind``; an unknown kind is a protocol error."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ProtocolError(f"unknown message kind {kind!r}") from None


def build_message(kind: str, body: dict[str, Any]) -> Message:
    """Rebuild a message from a decoded body, rejecting missing or extra fields."""
    cls = message_class(kind)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if set(body) != names:
        missing, extra = sorted(names - set(body)), sorted(set(body) - names)
        raise ProtocolError(f"{kind!r} message has missing {missing} / unexpected {extra} fields")
    return cls(**body)


def as_float_vector(value: Any, length: int, what: str) -> np.ndarray:
    """Check that a received field is a float vector of the agreed length.

    Protocols call this on every array a peer sends them, so that a wrongly
    shaped share is reported as the peer's fault, not as a numpy broadcast error.
    """
    if not isinstance(value, np.ndarray) or value.ndim != 1 or len(value) != length:
        shape = getattr(value, "shape", type(value).__name__)
        raise ProtocolError(f"{what}: expected a vector of length {length}, got {shape}")
    return value.astype(np.float64, copy=False)


@message("abort")
class Abort(Message):
    """Sent by a role that fails, so its peers stop with a reason instead of a timeout."""

    reason: str
