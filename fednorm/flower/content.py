"""What a fednorm Flower message holds: a small ConfigRecord and the frames as arrays.

Server to node (message type ``query.fednorm``): the session, the node's party id, the
receive timeout, on the session's first message what it fits (the methods, in order, the
privacy mode, the server's options, the columns' names if the server gave them), on its
last one (once the server closed the link) a closing mark; then the fednorm frames for
that party, each a uint8 array of an ArrayRecord (Flower sends large arrays in chunks,
so MHE key material fits). Node to server: the same session, the party's status
(``waiting`` for the server, ``done`` or ``failed``), the frames it sent this turn, and
when done a digest of its fitted parameters, or the error that stopped it (the digest
covers the fits of every method of the session)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from fednorm.engine.errors import InputError, ProtocolError
from fednorm.flower.localpipe import optional_names


class FlowerMissing(InputError, ImportError):
    """Flower is not installed: fednorm.flower needs the ``flower`` extra."""


try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise FlowerMissing("fednorm.flower needs Flower; install it with "
                        "pip install 'fednorm[flower]'") from exc

__all__ = ["ClientApp", "ConfigRecord", "Context", "Grid", "Message"]

ACTION = "fednorm"
MESSAGE_TYPE = f"query.{ACTION}"
CONTROL_KEY = "fednorm"
FRAMES_KEY = "fednorm-frames"
STATUSES = ("waiting", "done", "failed")


@dataclass(frozen=True)
class Start:
    """What a session fits (several methods share one key setup); only the session's
    first message carries it."""

    methods: tuple[str, ...]
    privacy: str
    options: dict[str, Any]
    parties: int
    features: tuple[str, ...] | None = None  # the columns' names, when the server named them


@dataclass(frozen=True)
class Request:
    """Server to node: frames for the node's party in one session."""

    session: str
    party: int
    timeout: float
    frames: list[bytes] = field(default_factory=list)
    start: Start | None = None
    closing: bool = False  # the server closed the link: these are its last frames


@dataclass(frozen=True)
class Answer:
    """Node to server: what the party said this turn, and where it stands."""

    session: str
    status: str
    frames: list[bytes] = field(default_factory=list)
    error: str = ""
    digest: bytes = b""


def _frames_record(frames: list[bytes]) -> ArrayRecord:
    return ArrayRecord({f"{i:08d}": Array(np.frombuffer(frame, dtype=np.uint8))
                        for i, frame in enumerate(frames)})


def _frames(content: RecordDict) -> list[bytes]:
    record = content.get(FRAMES_KEY)
    if not isinstance(record, ArrayRecord):
        raise ProtocolError("a fednorm message lacks its frames record")
    return [record[key].numpy().tobytes() for key in sorted(record.keys())]


def _control(message: Message) -> ConfigRecord:
    if message.has_error():
        raise ProtocolError(f"Flower error {message.error.code}: {message.error.reason}")
    record = message.content.get(CONTROL_KEY)
    if not isinstance(record, ConfigRecord):
        raise ProtocolError("a fednorm message lacks its control record")
    return record


def request_content(request: Request) -> RecordDict:
    control: dict[str, Any] = {"session": request.session, "party": request.party,
                               "timeout": float(request.timeout)}
    if request.start is not None:
        control.update(methods=list(request.start.methods), privacy=request.start.privacy,
                       options=msgpack.packb(request.start.options, use_bin_type=True),
                       parties=request.start.parties)
        if request.start.features is not None:
            control["features"] = list(request.start.features)
    if request.closing:
        control["closing"] = True
    return RecordDict({CONTROL_KEY: ConfigRecord(control),
                       FRAMES_KEY: _frames_record(request.frames)})


def parse_request(message: Message) -> Request:
    control = _control(message)
    try:
        start = None
        if "methods" in control:
            start = Start(tuple(map(str, control["methods"])), str(control["privacy"]),
                          msgpack.unpackb(control["options"], raw=False),
                          int(control["parties"]), optional_names(control.get("features")))
        return Request(str(control["session"]), int(control["party"]),
                       float(control["timeout"]), _frames(message.content), start,
                       bool(control.get("closing", False)))
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed fednorm request: {exc}") from None


def answer_content(answer: Answer) -> RecordDict:
    control = ConfigRecord({"session": answer.session, "status": answer.status,
                            "error": answer.error, "digest": answer.digest})
    return RecordDict({CONTROL_KEY: control, FRAMES_KEY: _frames_record(answer.frames)})


def parse_answer(message: Message) -> Answer:
    control = _control(message)
    try:
        answer = Answer(str(control["session"]), str(control["status"]),
                        _frames(message.content), str(control["error"]),
                        bytes(control["digest"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed fednorm answer: {exc}") from None
    if answer.status not in STATUSES:
        raise ProtocolError(f"unknown party status {answer.status!r}")
    return answer
