"""A recording tracer: every frame of a run, for ledger checks.

Given to the server's role context (``simulate(..., tracer=Recorder())``) it sees every
frame of a star federation once: what the server sends, and what every party sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fednorm.engine.codec import Header, decode_frame
from fednorm.engine.messages import Message
from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer


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

    from fednorm.protocols.collective.sums import SignedUpload

    crypto_types = (*crypto_types, SignedUpload)  # a signed ciphertext (docs/LEAKAGE.md)

    def crypto(value: object) -> bool:
        if isinstance(value, list) and value:
            return all(isinstance(v, (openfhe.Ciphertext, SignedUpload)) for v in value)
        return isinstance(value, crypto_types)
    return {name for name, value in msg.fields().items()
            if value is not None and not crypto(value)}


KEY_SETUP_KINDS = frozenset({"ckks.lead_keys", "ckks.key_shares", "ckks.joint_round1",
                             "ckks.relin_round2"})


def session_kinds(recorder: Recorder, algorithm: str = "default") -> dict[str, set[str]]:
    """The kinds each step of a session sent or received, by step in the order they
    came, after holding every frame to its step's ledger: the key-setup step
    (``keys-mhe``) to the collective entry, each protocol to its own."""
    from fednorm.protocols.ledger import COLLECTIVE, undeclared

    kinds: dict[str, set[str]] = {}
    for header, msg in recorder.decoded():
        step = header.protocol.split("/")[0]
        method, privacy = step.rsplit("-", 1)
        fields = plaintext_fields(msg)
        if method == "keys":
            assert fields <= COLLECTIVE.get(header.kind, frozenset()), (header.kind, fields)
        else:
            kind = algorithm if privacy == "mhe" else "default"
            assert not undeclared(method, privacy, header.kind, fields, kind), \
                (step, header.kind)
        kinds.setdefault(step, set()).add(header.kind)
    return kinds


class SecretKeySpy(Tracer):
    """A party tracer that reads 64 bytes from the middle of every secret key a party
    makes, as its key generation returns it (the crypto-call hook), so a test can check
    that no frame ever carries them (the keys themselves refuse to serialize; the spy
    reaches past that on purpose)."""

    def __init__(self) -> None:
        self.secrets: list[bytes] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        import openfhe

        from fednorm.engine import ckks

        if isinstance(event.result, ckks.PartyKeys):
            blob = openfhe.Serialize(event.result._sk, openfhe.BINARY)
            self.secrets.append(blob[len(blob) // 2: len(blob) // 2 + 64])
