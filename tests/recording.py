"""A recording tracer: every frame of a run, for ledger checks.

Given to the server's role context (``simulate(..., tracer=Recorder())``) it sees every
frame of a star federation once: what the server sends, and what every party sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from fednorm.engine.codec import Header, decode_frame
from fednorm.engine.messages import Message
from fednorm.engine.tracing import FrameEvent, Tracer


@dataclass
class Recorder(Tracer):
    frames: list[bytes] = field(default_factory=list)

    def frame(self, event: FrameEvent) -> None:
        self.frames.append(bytes(event.frame))

    def decoded(self) -> list[tuple[Header, Message]]:
        return [decode_frame(frame) for frame in self.frames]


def plaintext_fields(msg: Message) -> set[str]:
    """The fields of ``msg`` that carry plaintext: neither unset nor OpenFHE objects
    (ciphertexts, keys), which the ledger does not list."""
    import openfhe

    crypto_types = (openfhe.Ciphertext, openfhe.PublicKey, openfhe.EvalKey,
                    openfhe.EvalKeyMap)

    def crypto(value: object) -> bool:
        if isinstance(value, list) and value:
            return all(isinstance(v, openfhe.Ciphertext) for v in value)
        return isinstance(value, crypto_types)
    return {name for name, value in msg.fields().items()
            if value is not None and not crypto(value)}


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
