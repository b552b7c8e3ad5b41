"""The pipe between a node's ClientApp runs and its party worker: a private Unix socket.

Flower starts a fresh ClientApp process for every message, so the party role lives in a
worker process instead (:mod:`fednorm.flower.worker`), and each ClientApp run hands the
worker the server's frames and takes its answer back through this pipe.  A packet is an
8-byte length and a msgpack map.  The socket sits in a directory only this user can enter
(mode 0700), so no other local user can feed the party frames or read its answers.

Nothing here imports Flower: the worker runs without it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from fednorm.engine.errors import InputError, ProtocolError

if TYPE_CHECKING:  # the ClientApp relay stays light: it imports no protocol code
    import trio

    from fednorm.protocols.normalizers import Normalizer

PIPE_DIR_ENV = "FEDNORM_FLOWER_DIR"
READY = b"ready\n"  # the worker's first and only line on stdout: it is listening
_LENGTH = struct.Struct(">Q")
# A Unix socket path is at most 107 bytes on Linux (108 with the terminating NUL).
_MAX_SOCKET_PATH = 107
MAX_PACKET = 1 << 34


def pipe_dir() -> Path:
    """The private directory of this user's party pipes (``$FEDNORM_FLOWER_DIR`` if set)."""
    configured = os.environ.get(PIPE_DIR_ENV)
    directory = Path(configured) if configured else (
        Path(tempfile.gettempdir()) / f"fednorm-flower-{os.getuid()}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise InputError(f"{directory} must belong to this user and be private (mode 0700): "
                         "other users could reach the party through it")
    return directory


def pipe_path(node_id: int, run_id: int, session: str) -> Path:
    """Where the worker of this node's party in (run, session) listens."""
    key = hashlib.sha256(f"{node_id}:{run_id}:{session}".encode()).hexdigest()[:24]
    path = pipe_dir() / f"{key}.sock"
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise InputError(f"the party pipe path {path} is too long for a Unix socket; "
                         f"set {PIPE_DIR_ENV} to a shorter directory")
    return path


def pack(packet: dict[str, Any]) -> bytes:
    body = msgpack.packb(packet, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def unpack(body: bytes) -> dict[str, Any]:
    try:
        packet = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise ProtocolError(f"undecodable packet on the party pipe: {exc}") from None
    if not isinstance(packet, dict):
        raise ProtocolError("a party pipe packet must be a map")
    return packet


def packet_length(header: bytes) -> int:
    (length,) = _LENGTH.unpack(header)
    if length > MAX_PACKET:
        raise ProtocolError(f"party pipe packet of {length} bytes is too large")
    return length


HEADER_BYTES = _LENGTH.size


# -- the blocking end, used by the ClientApp ----------------------------------------------
def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise ConnectionError("the party worker closed the pipe")
        chunks += chunk
    return bytes(chunks)


def exchange(path: Path, packet: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one packet to the worker at ``path`` and wait (up to ``timeout``) for its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.fspath(path))
        sock.sendall(pack(packet))
        length = packet_length(_receive_exactly(sock, HEADER_BYTES))
        return unpack(_receive_exactly(sock, length))


# -- the worker's end (trio) -----------------------------------------------------------
async def receive_packet(stream: trio.SocketStream) -> dict[str, Any]:
    """The next packet a ClientApp run sent the worker on ``stream``."""
    async def exactly(size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = await stream.receive_some(min(size - len(data), 1 << 20))
            if not chunk:
                raise ProtocolError("the ClientApp closed the party pipe mid-packet")
            data += chunk
        return bytes(data)

    return unpack(await exactly(packet_length(await exactly(HEADER_BYTES))))


# -- what crosses the pipe ----------------------------------------------------------------
def array_to_wire(X: np.ndarray) -> dict[str, Any]:
    X = np.ascontiguousarray(X, dtype="<f8")
    return {"shape": list(X.shape), "data": X.tobytes()}


def array_from_wire(wire: dict[str, Any]) -> np.ndarray:
    try:
        return np.frombuffer(wire["data"], dtype="<f8").reshape(wire["shape"]).copy()
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed party data on the pipe: {exc}") from None


def optional_names(names: Any) -> tuple[str, ...] | None:
    """Column names as they cross a message or the pipe (a list, or None: unnamed)."""
    return None if names is None else tuple(map(str, names))


def _normalizer_classes() -> dict[str, type[Normalizer]]:
    from fednorm.protocols.normalizers import Normalizer

    classes: dict[str, type[Normalizer]] = {}
    pending = list(Normalizer.__subclasses__())
    while pending:
        cls = pending.pop()
        classes[cls.METHOD] = cls
        pending.extend(cls.__subclasses__())
    return classes


def normalizer_to_wire(normalizer: Normalizer) -> dict[str, Any]:
    """A fitted normalizer as plain data: its method, its parameter vectors and, when the
    session named them, the columns' names."""
    names = normalizer.feature_names
    return {"method": normalizer.METHOD, "params": normalizer.params(),
            "features": None if names is None else list(names)}


def normalizer_from_wire(wire: dict[str, Any]) -> Normalizer:
    """Rebuild a normalizer from :func:`normalizer_to_wire`; fields follow ``PARAMS`` order."""
    try:
        cls = _normalizer_classes()[wire["method"]]
        fitted = cls(*(np.asarray(wire["params"][name], dtype=np.float64)
                       for name in cls.PARAMS))
        return fitted.with_names(optional_names(wire.get("features")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed normalizer parameters: {exc}") from None


def wire_digest(wire: list[dict[str, Any]]) -> bytes:
    """A fingerprint of a session's fitted parameters (every method's, in order), so the
    server can check every party agrees."""
    return hashlib.sha256(msgpack.packb(wire, use_bin_type=True)).digest()


def params_digest(normalizers: Sequence[Normalizer]) -> bytes:
    return wire_digest([normalizer_to_wire(normalizer) for normalizer in normalizers])


def pick_normalizer(fitted: Mapping[str, Normalizer], method: str | None) -> Normalizer:
    """``fitted[method]``; without a method, the only one (a session of one method)."""
    if method is None and len(fitted) == 1:
        return next(iter(fitted.values()))
    if method is None:
        raise InputError(f"the session fitted {', '.join(fitted)}: name one of them")
    if method not in fitted:
        raise InputError(f"the session fitted {', '.join(fitted)}, not {method!r}")
    return fitted[method]
