"""Frames on the wire: msgpack with ext types for numpy arrays and crypto objects.

A frame is ``[version, protocol, session, round, sender, kind, body]``.  The header
fields let a receiver reject anything out of place (wrong session, replayed round,
wrong sender, wrong sub-protocol) before it looks at the body.  Crypto objects are
opaque to this module: the CKKS layer registers encoders for its types with
:func:`register_ext_type`, so the codec never imports OpenFHE.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import numpy as np

from fednorm.engine import inprocess
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, build_message

WIRE_VERSION = 1
NUMPY_EXT = 1
_ALLOWED_DTYPE_KINDS = "biuf"


@dataclass(frozen=True)
class Header:
    """Who sent a frame, where it belongs, and what it claims to be."""

    protocol: str
    session: str
    round: int
    sender: int
    kind: str


@dataclass(frozen=True)
class _ExtType:
    code: int
    cls: type
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    relayed: bool = False


_EXT_BY_CODE: dict[int, _ExtType] = {}
_EXT_BY_CLASS: dict[type, _ExtType] = {}


def register_ext_type(
    code: int, cls: type, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any],
    relayed: bool = False,
) -> None:
    """Teach the codec to carry objects of ``cls`` as msgpack ext ``code``.  ``relayed``:
    a server sends such objects on inside messages of its own (a party's signed upload),
    so one it decoded keeps the bytes it came in and is encoded as those bytes."""
    if code == NUMPY_EXT or not 0 <= code <= 127:
        raise ValueError(f"ext code {code} is reserved or out of range")
    existing = _EXT_BY_CODE.get(code)
    if existing is not None and existing.cls is not cls:
        raise ValueError(f"ext code {code} already used by {existing.cls.__name__}")
    ext = _ExtType(code, cls, encode, decode, relayed)
    _EXT_BY_CODE[code] = ext
    _EXT_BY_CLASS[cls] = ext


def _encode_array(array: np.ndarray) -> bytes:
    if array.dtype.kind not in _ALLOWED_DTYPE_KINDS:
        raise TypeError(f"cannot send numpy arrays of dtype {array.dtype}")
    return msgpack.packb([array.dtype.str, list(array.shape), array.tobytes(order="C")])


def _decode_array(data: bytes) -> np.ndarray:
    try:
        dtype_str, shape, raw = msgpack.unpackb(data)
        dtype = np.dtype(dtype_str)
        if dtype.kind not in _ALLOWED_DTYPE_KINDS:
            raise ValueError(f"dtype {dtype} not allowed")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except Exception as exc:
        raise ProtocolError(f"malformed numpy array in frame: {exc}") from None


def _default(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(NUMPY_EXT, _encode_array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    ext = _EXT_BY_CLASS.get(type(obj))
    if ext is None:
        raise TypeError(f"cannot encode {type(obj).__name__} in a frame")
    received = _received(obj) if ext.relayed else None
    return msgpack.ExtType(ext.code, received if received is not None else ext.encode(obj))


def _ext_hook(code: int, data: bytes) -> Any:
    if code == NUMPY_EXT:
        return _decode_array(data)
    ext = _EXT_BY_CODE.get(code)
    if ext is None:
        raise ProtocolError(f"unknown ext type {code} in frame")
    obj = ext.decode(data)
    if ext.relayed and getattr(_KEEPING, "on", False):
        _remember(obj, data)
    return obj


def encode_body(msg: Message) -> bytes | memoryview:
    """The packed body of ``msg``: encode once, frame many times (broadcasts).  A large
    message this process received (:func:`decode_received`) is not encoded again: its
    body is the one it came in (a message is frozen, so those bytes still say what it
    holds), and a server forwarding a party's 31 MB key shares sends them as read."""
    received = _received(msg)
    if received is not None:
        return received
    return msgpack.packb(msg.fields(), default=_default, use_bin_type=True)


def encode_frame(header: Header, msg: Message, body: bytes | memoryview | None = None
                 ) -> bytes:
    """Serialize one message with its header (``body``: its :func:`encode_body`, if known).

    A msgpack array is its length byte followed by its packed elements, so the header
    fields and a pre-packed body concatenate into exactly what packing the list gives.
    """
    if header.kind != msg.KIND:
        raise ValueError(f"header kind {header.kind!r} does not match message {msg.KIND!r}")
    fields = (WIRE_VERSION, header.protocol, header.session, header.round, header.sender,
              header.kind)
    head = b"".join(msgpack.packb(f, use_bin_type=True) for f in fields)
    return b"\x97" + head + (body if body is not None else encode_body(msg))


HEADER_BYTES = 64 * 2**10  # more than any header: short strings and integers


def frame_body(data: bytes) -> bytes:
    """The packed body of a well-formed frame (what :func:`encode_frame` appends to the
    header), as it travelled: the same bytes for every receiver of one message."""
    return data[_body_start(data):]


def _body_start(data: bytes) -> int:
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=HEADER_BYTES)
    unpacker.feed(data[:HEADER_BYTES])  # not the body: it may pass the unpacker's limit
    unpacker.read_array_header()
    for _ in range(6):  # the header fields
        unpacker.skip()
    return unpacker.tell()


SHARED_PARSE_BYTES = 1 << 16


class Received(NamedTuple):
    """A received frame parsed: its header, its message and, if asked for, the SHA-256 of
    its body as it travelled (what a party's transcript takes of a frame, :meth:`~fednorm.
    engine.runtime.RoleContext.transcript`; hashed with the parse, in a worker thread,
    and in a simulation shared with the parse by the frame's other readers)."""

    header: Header
    message: Message
    body_digest: bytes = b""


Transcribed = Callable[[Header], bool]
"""Which received frames' body digests a role takes (by header): its transcript's."""


def every_frame(header: Header) -> bool:
    return True


def decode_received(data: bytes, forwarding: bool = False,
                    transcribed: Transcribed | None = every_frame) -> Received:
    """:func:`decode_frame` of a frame a role received, with its :func:`body_digest` if
    ``transcribed`` says so (None: a role that keeps no transcript, the server, whose
    frames no other role reads: each parsed alone).  In a simulation the
    readers of one frame object (a broadcast, a forwarded key share) share one parse
    (:func:`~fednorm.engine.inprocess.parsed_once`), but for a message holding a numpy
    array, which a reader may change: each such reader gets its own.  Frames under
    :data:`SHARED_PARSE_BYTES` parse faster than they are looked up: each its own.
    ``forwarding``: the role forwards what it receives (the server), so a large message
    keeps the bytes it came in, for :func:`encode_body`."""
    if len(data) < SHARED_PARSE_BYTES:
        return _received_as(data, decode_frame, transcribed)
    parse = _decode_keeping_body if forwarding else decode_frame
    if transcribed is None:  # the server: no other reader has its frames
        return _received_as(data, parse, None)
    return inprocess.parsed_once(data, lambda frame: _received_as(frame, parse, transcribed),
                                 _without_arrays)


def body_digest(data: bytes) -> bytes:
    """The SHA-256 of a well-formed frame's body as it travelled."""
    return hashlib.sha256(memoryview(data)[_body_start(data):]).digest()


def _received_as(data: bytes, parse: Callable[[bytes], tuple[Header, Message]],
                 transcribed: Transcribed | None) -> Received:
    header, msg = parse(data)
    if transcribed is None or not transcribed(header):
        return Received(header, msg)
    return Received(header, msg, body_digest(data))


_RECEIVED: weakref.WeakKeyDictionary[Any, bytes | memoryview] = weakref.WeakKeyDictionary()
_RECEIVED_LOCK = threading.Lock()
_KEEPING = threading.local()  # on while this thread decodes a frame for a forwarding role


def _remember(obj: Any, data: bytes | memoryview) -> None:
    """Keep the bytes ``obj`` came in, while it lives, to send it on as those bytes."""
    with _RECEIVED_LOCK:
        _RECEIVED[obj] = data


def _received(obj: Any) -> bytes | memoryview | None:
    with _RECEIVED_LOCK:
        return _RECEIVED.get(obj)


def _decode_keeping_body(data: bytes) -> tuple[Header, Message]:
    """:func:`decode_frame`, and the message's body kept as it came (its frame is kept
    while the message lives): a role that forwards the message sends those bytes."""
    _KEEPING.on = True
    try:
        header, msg = decode_frame(data)
    finally:
        _KEEPING.on = False
    _remember(msg, memoryview(data)[_body_start(data):])
    return header, msg


def _without_arrays(parsed: Received) -> bool:
    """Whether a reader may share its parse with the frame's other readers: not if the
    message holds a numpy array (a reader may change it)."""
    return not any(isinstance(value, np.ndarray) for value in parsed.message.fields().values())


def decode_frame(data: bytes) -> tuple[Header, Message]:
    """Parse one frame; anything malformed is a :class:`ProtocolError`."""
    try:
        frame = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"undecodable frame ({len(data)} bytes): {exc}") from None
    if not isinstance(frame, list) or len(frame) != 7:
        raise ProtocolError("frame is not a 7-element list")
    version, protocol, session, round_, sender, kind, body = frame
    if version != WIRE_VERSION:
        raise ProtocolError(f"wire version {version!r}, expected {WIRE_VERSION}")
    if not (isinstance(protocol, str) and isinstance(session, str) and isinstance(kind, str)
            and isinstance(round_, int) and isinstance(sender, int) and isinstance(body, dict)):
        raise ProtocolError("frame header has fields of the wrong type")
    header = Header(protocol, session, round_, sender, kind)
    return header, build_message(kind, body)
