"""A recording in-memory transport: every frame any role sends, for ledger checks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from fednorm.engine.codec import Header, decode_frame
from fednorm.engine.messages import Message
from fednorm.sim import federation
from fednorm.transport import memory


@dataclass
class Recorder:
    frames: list[bytes] = field(default_factory=list)

    def decoded(self) -> list[tuple[Header, Message]]:
        return [decode_frame(frame) for frame in self.frames]


class RecordingLink:
    def __init__(self, inner: memory.MemoryLink, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    async def send(self, frame: bytes) -> None:
        self._recorder.frames.append(bytes(frame))
        await self._inner.send(frame)

    async def receive(self) -> bytes:
        return await self._inner.receive()

    async def aclose(self) -> None:
        await self._inner.aclose()


def install(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Make every simulation in this test record its frames."""
    recorder = Recorder()

    def recording_star_links(parties):
        server_links, party_links = memory.star_links(parties)
        wrap = {p: RecordingLink(link, recorder) for p, link in server_links.items()}
        return wrap, {p: RecordingLink(link, recorder) for p, link in party_links.items()}

    monkeypatch.setattr(federation, "star_links", recording_star_links)
    return recorder


def spy_secret_keys(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Record 64 bytes from the middle of every secret key made in this test, so a test
    can check that no frame ever carries them (the keys themselves refuse to serialize;
    the test reaches past that on purpose)."""
    import openfhe

    from fednorm.engine import ckks

    secrets: list[bytes] = []
    generate = ckks.PartyKeys.generate.__func__

    def spying_generate(cls, *args, **kwargs):
        keys = generate(cls, *args, **kwargs)
        blob = openfhe.Serialize(keys._sk, openfhe.BINARY)
        secrets.append(blob[len(blob) // 2: len(blob) // 2 + 64])
        return keys

    monkeypatch.setattr(ckks.PartyKeys, "generate", classmethod(spying_generate))
    return secrets
