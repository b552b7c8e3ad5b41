"""What the server told a party: the digest a party binds its uploads to."""

from __future__ import annotations

import hashlib

from fednorm.engine.codec import Header


class Transcript:
    """A running SHA-256 over every frame the server sent a party in one step (scope,
    kind, the body's SHA-256), but those of the scopes left out: uploads signed with its
    digest are bound to what their party was told, and a party checking another's
    signature against its own digest learns whether both were told the same (the
    server's broadcasts are the same for all)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._left_out: set[str] = set()

    def takes(self, header: Header) -> bool:
        """Whether a frame of ``header`` goes into the transcript."""
        return header.protocol.rsplit("/", 1)[-1] not in self._left_out

    def add(self, header: Header, body_digest: bytes) -> None:
        for part in (header.protocol.encode(), header.kind.encode(), body_digest):
            self._hash.update(len(part).to_bytes(8, "big") + part)

    def leave_out(self, *scopes: str) -> None:
        """Frames of these scopes (last part of their protocol id) differ between
        parties by design, or are checked otherwise."""
        self._left_out.update(scopes)

    def digest(self) -> bytes:
        return self._hash.copy().digest()
