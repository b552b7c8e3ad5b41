"""Relayed uploads travel one a frame, so no frame the server sends grows with P.

A relay of every party's upload in one frame grows with P: the input relays passed
msgpack's 100 MiB buffer at P = 30 (paper preset), and the sum and product decryption
requests held 20-35 MiB at P = 10 (bench/runs/2026-11-29-frames-and-memory.md), so a
multi-host federation of more than ~18 parties hit the TCP link's 64 MiB frame limit.
Now a request names the index and each upload follows in its own frame
(:func:`fednorm.protocols.collective.rounds.relay`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import openfhe
import pytest

from fednorm.engine.tracing import FrameEvent, Tracer
from fednorm.protocols import FitOptions, get_protocol
from fednorm.sim.federation import run_federation

REQUESTS = ("ckks.decrypt_sum_request", "ckks.decrypt_product_request",
            "ckks.decrypt_coefficients_request")


@dataclass
class RelayFrames(Tracer):
    """Every relay or request frame the server sent: (kind, size, the relayed upload's
    ciphertext serialized, empty for a request)."""

    frames: list[tuple[str, int, bytes]] = field(default_factory=list)

    def frame(self, event: FrameEvent) -> None:
        if event.role != "server" or event.direction != "sent":
            return
        if event.kind == "ckks.relayed_upload":
            ciphertext = openfhe.Serialize(event.message.upload.ciphertext, openfhe.BINARY)
            self.frames.append((event.kind, event.size, ciphertext))
        elif event.kind in REQUESTS:
            self.frames.append((event.kind, event.size, b""))


@pytest.mark.parametrize(("method", "options", "relayed"), [
    ("zscore", FitOptions(preset="test"), "ckks.decrypt_coefficients_request"),
    ("minmax", FitOptions(preset="test"), "ckks.decrypt_coefficients_request"),
    ("zscore", FitOptions(preset="test", algorithm="paper"), "ckks.relayed_upload"),
])
async def test_a_relay_frame_holds_one_upload_and_a_request_none(
    method: str, options: FitOptions, relayed: str
) -> None:
    """Five parties: a sum or product decryption request is a few bytes (an index), and
    every relay frame is one upload's ciphertext plus its index and signature, at any P."""
    rng = np.random.default_rng(9)
    parts = [rng.normal(3, 2, size=(4, 2)) for _ in range(5)]
    relays = RelayFrames()
    await run_federation(get_protocol(method, "mhe"), parts, options, timeout=300,
                         tracer=relays)
    assert relayed in {kind for kind, _, _ in relays.frames}
    for kind, size, ciphertext in relays.frames:
        assert size <= len(ciphertext) + 512, (kind, size, len(ciphertext))
