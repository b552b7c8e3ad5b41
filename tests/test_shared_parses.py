"""A simulation's roles share the parse of a frame they all received as one object,
and a role forwards what it received as the bytes it read.

A broadcast waits in every party's link as one bytes object; in a simulation
(``in_process_run``) the first reader's parse goes to the others, so P parties do not
parse the same key share or upload P times on the simulation's two cores. Only
messages without numpy arrays are shared (a reader may change an array), only large
frames, and nothing outside a simulation.
"""

from __future__ import annotations

import msgpack
import numpy as np

from fednorm.engine import inprocess
from fednorm.engine.codec import (
    SHARED_PARSE_BYTES,
    Header,
    decode_received,
    encode_body,
    encode_frame,
    frame_body,
)
from fednorm.engine.inprocess import in_process_run
from fednorm.engine.messages import Message, message
from fednorm.engine.tracing import FrameEvent, Tracer
from fednorm.protocols.base import FitOptions
from fednorm.sim.federation import simulate


@message("test.shared_blob")
class Blob(Message):
    data: bytes


@message("test.shared_array")
class Array(Message):
    values: np.ndarray


def _frame(msg: Message) -> bytes:
    return encode_frame(Header("proto", "session", 0, 0, msg.KIND), msg)


BIG = _frame(Blob(b"x" * SHARED_PARSE_BYTES))


def test_outside_a_simulation_every_reader_parses_its_own() -> None:
    assert decode_received(BIG)[1] is not decode_received(BIG)[1]


def test_in_a_simulation_the_readers_of_one_frame_object_share_its_parse() -> None:
    with in_process_run():
        first, second = decode_received(BIG), decode_received(BIG)
        equal_bytes = decode_received(bytes(bytearray(BIG)))  # another object
    assert second[1] is first[1]
    assert equal_bytes[1] is not first[1] and equal_bytes[1].data == first[1].data
    assert decode_received(BIG)[1] is not first[1]  # the run ended: nothing kept


def test_a_role_without_a_transcript_parses_alone_and_keeps_no_frame() -> None:
    """The server (no transcript) reads frames no other role reads: in a simulation its
    parse is its own and the frame is not kept for readers that never come."""
    with in_process_run():
        first = decode_received(BIG, transcribed=None)
        assert decode_received(BIG, transcribed=None)[1] is not first[1]
        assert id(BIG) not in inprocess._PARSES


def test_a_message_with_an_array_and_a_small_frame_are_each_reader_s_own() -> None:
    arrays = _frame(Array(np.zeros(SHARED_PARSE_BYTES // 8)))
    small = _frame(Blob(b"x"))
    with in_process_run():
        mine, theirs = decode_received(arrays)[1], decode_received(arrays)[1]
        assert mine is not theirs
        mine.values[0] = 1.0  # a reader changing its array changes no one else's
        assert theirs.values[0] == 0.0
        assert decode_received(small)[1] is not decode_received(small)[1]


class LargeFramesReceived(Tracer):
    def __init__(self) -> None:
        self.seen: list[FrameEvent] = []  # keeps the frames, so their ids stay unique

    def frame(self, event: FrameEvent) -> None:
        if event.direction == "received" and event.size >= SHARED_PARSE_BYTES:
            self.seen.append(event)


def test_the_parties_of_a_ppf_run_share_each_broadcast_s_parse() -> None:
    received = LargeFramesReceived()
    parts = [np.arange(8.0).reshape(4, 2) * (k + 1) for k in range(3)]
    simulate(parts, "minmax", "mhe", FitOptions(preset="test"), party_tracer=received)
    readers: dict[int, list[FrameEvent]] = {}
    for event in received.seen:
        readers.setdefault(id(event.frame), []).append(event)
    shared = [events for events in readers.values() if len(events) > 1]
    assert any(events[0].kind == "ckks.relayed_upload" for events in shared)
    for events in shared:
        assert len({event.role for event in events}) == len(events)
        messages = {id(event.message) for event in events}
        arrays = any(isinstance(v, np.ndarray) for v in events[0].message.fields().values())
        assert len(messages) == (len(events) if arrays else 1), events[0].kind


class ServerFrames(Tracer):
    def __init__(self) -> None:
        self.sent: list[FrameEvent] = []
        self.received: list[FrameEvent] = []

    def frame(self, event: FrameEvent) -> None:
        (self.sent if event.direction == "sent" else self.received).append(event)


def _ext_payloads(body: bytes) -> list[bytes]:
    payloads: list[bytes] = []
    msgpack.unpackb(body, ext_hook=lambda code, data: payloads.append(data), raw=False)
    return payloads


def test_a_server_forwards_key_shares_and_relays_uploads_as_the_bytes_it_read() -> None:
    """Key and relinearization shares go on to the other parties with the body their
    party sent, and a relayed upload carries its party's upload as sent: the server
    encodes none of them again (31 MB of key shares a party at the paper preset)."""
    log = ServerFrames()
    parts = [np.arange(8.0).reshape(4, 2) * (k + 1) for k in range(3)]
    simulate(parts, "minmax", "mhe", FitOptions(preset="test"), tracer=log)
    bodies = {frame_body(event.frame) for event in log.received}
    uploads = {p for event in log.received if event.kind == "ppf_extremes.bits"
               for p in _ext_payloads(frame_body(event.frame))}
    forwarded = [e for e in log.sent if e.kind in ("ckks.key_shares", "ckks.relin_round2")]
    relayed = [e for e in log.sent if e.kind == "ckks.relayed_upload"]
    assert forwarded and relayed
    assert all(frame_body(event.frame) in bodies for event in forwarded)
    assert all(set(_ext_payloads(frame_body(e.frame))) <= uploads for e in relayed)


def test_only_a_forwarding_role_keeps_the_bytes_a_message_came_in() -> None:
    """The server forwards what it receives and keeps each large message's body for
    that; a party keeps nothing (at P = 100 it holds 100 relayed uploads a round)."""
    kept, plain = decode_received(BIG, forwarding=True)[1], decode_received(BIG)[1]
    assert isinstance(encode_body(kept), memoryview)
    assert bytes(encode_body(kept)) == frame_body(BIG)
    assert isinstance(encode_body(plain), bytes)
