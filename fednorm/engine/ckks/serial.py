"""Bytes for OpenFHE objects, with validation before OpenFHE ever parses them.

Payloads are OpenFHE's own BINARY (cereal) serialization. Measured on openfhe 1.6.1:
corrupting single bytes in the first ~800 bytes of a serialized ciphertext (the crypto
parameters) *kills the process* with SIGFPE inside the deserializer. So a payload travels
in a small frame and is checked in this order, each failure a :class:`ProtocolError`:

1. magic, kind byte and preset fingerprint (wrong type / object made under another preset);
2. a SHA-256 digest of the payload (truncation, corruption in transit);
3. a *template* check: the leading bytes (cereal headers + crypto parameters, identical for
   every object of a kind in one context) must equal those of a locally made reference
   object, so OpenFHE only ever parses parameters it produced itself;
4. OpenFHE deserialization (its RuntimeError becomes ProtocolError);
5. the object's context must equal ours (ciphertexts and public keys expose it).

A peer who crafts a payload with matching digest *and* template but hostile polynomial
data can still make OpenFHE raise (MemoryError, RuntimeError -> ProtocolError) or yield
garbage values; the semi-honest model of the paper assumes parties follow the protocol.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import openfhe

from fednorm.engine.errors import InputError, ProtocolError

MAGIC = b"FNCK"
_DIGEST_BYTES = 16
_HEADER = struct.Struct(">4sB8s16s")  # magic, kind code, preset fingerprint, digest


@dataclass(frozen=True)
class Kind:
    """One serializable OpenFHE type: its codec ext code, class and loader."""

    name: str
    code: int
    cls: type
    load: Callable[[bytes, Any], Any]


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("ciphertext", 16, openfhe.Ciphertext, openfhe.DeserializeCiphertextString),
        Kind("public_key", 17, openfhe.PublicKey, openfhe.DeserializePublicKeyString),
        Kind("eval_key", 18, openfhe.EvalKey, openfhe.DeserializeEvalKeyString),
        Kind("eval_key_map", 19, openfhe.EvalKeyMap, openfhe.DeserializeEvalKeyMapString),
    )
}
_KIND_BY_CODE = {k.code: k for k in KINDS.values()}

# An EvalKeyMap payload starts with 5 fixed bytes, then the entry count (u64) and the
# first automorphism index (u32); the template skips those two variable fields.
_MAP_COUNT = slice(5, 13)
_MAP_FIRST_INDEX = slice(13, 17)


def kind_of(obj: Any) -> Kind:
    """The :class:`Kind` of an OpenFHE object; secret keys are refused outright."""
    if isinstance(obj, openfhe.PrivateKey):
        raise InputError("secret keys are never serialized")
    for kind in KINDS.values():
        if isinstance(obj, kind.cls):
            return kind
    raise InputError(f"cannot serialize {type(obj).__name__}")


def frame(obj: Any, fingerprint: bytes) -> bytes:
    """Frame ``obj``'s OpenFHE BINARY serialization (see module docstring).  (A server
    forwards a party's key shares with the body they came in, not framed again:
    :func:`fednorm.engine.codec.encode_body`.)"""
    kind = kind_of(obj)
    payload = openfhe.Serialize(obj, openfhe.BINARY)
    header = _HEADER.pack(MAGIC, kind.code, fingerprint, payload_digest(payload))
    return b"".join((header, payload))


def payload_digest(payload: bytes) -> bytes:
    """The frame's integrity digest: SHA-256, truncated. Every byte on the wire goes
    through it twice (sender, receiver); SHA-256 runs on the CPU's SHA extensions,
    measured 2x faster than BLAKE2b here (a 25 MB key share: 117 vs 240 ms under load)."""
    return hashlib.sha256(payload).digest()[:_DIGEST_BYTES]


SERIALIZED_AS_PARSED = frozenset({"eval_key", "eval_key_map"})
"""Kinds whose parsed object serializes to the very bytes it was parsed from (openfhe
1.6.1, tested): the SHA-256 of the payload is :func:`object_digest` of the object."""
_RECEIVED_DIGESTS: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
_PAYLOAD_DIGESTS: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
_RECEIVED_LOCK = threading.Lock()


def object_digest(obj: Any, *, parsed: bool = False) -> bytes:
    """SHA-256 of an OpenFHE object's BINARY serialization, the same for equal objects:
    what parties compare to check that they hold the same keys (a key share's signature
    covers its bytes as they travel instead, :func:`wire_digest`).

    Measured on openfhe 1.6.1: a public key made in this process serializes its towers
    sharing one parameter object, a parsed one with a copy per tower, 632 bytes longer
    at the test preset: the same key, other bytes. A parsed key serializes as it was
    parsed, so a public key is digested as it parses; evaluation keys and their maps
    serialize alike either way (``tests/test_collective.py`` checks both).  ``parsed``:
    the caller knows ``obj`` came off the wire, so its bytes are already in that form
    (a third of the digest's cost, at 6 MB a key), and an
    evaluation key's digest is the one taken of its payload as it was parsed
    (:func:`remember_received`), with no serialization at all — whatever ``parsed``
    says, since such a key serializes alike either way.  Any other parsed object, any
    evaluation key and any public key (made here: its digest re-parses it) is digested
    once and the digest kept with it: in a simulation the parties share one parse of a
    broadcast (:meth:`~.context.CkksContext.from_bytes`) and one sum of the key shares
    (:class:`~.multiparty.checks.RunningSum`), which no one changes (keys are retagged on
    copies), so the ten parties of a run digest each once.
    """
    kind = kind_of(obj)  # refuses secret keys
    kept = parsed or kind.name in SERIALIZED_AS_PARSED or isinstance(obj, openfhe.PublicKey)
    if kept:
        with _RECEIVED_LOCK:
            received = _RECEIVED_DIGESTS.get(obj)
        if received is not None:
            return received
    data = openfhe.Serialize(obj, openfhe.BINARY)
    if isinstance(obj, openfhe.PublicKey) and not parsed:
        data = openfhe.Serialize(deserialize(openfhe.DeserializePublicKeyString, data),
                                 openfhe.BINARY)
    digest = hashlib.sha256(data).digest()
    if kept:
        with _RECEIVED_LOCK:
            _RECEIVED_DIGESTS[obj] = digest
    return digest


def wire_digest(obj: Any, *, received: bool = False) -> bytes:
    """SHA-256 of ``obj``'s bytes on the wire, which a key share's signature covers: of
    the payload it was parsed from if ``received`` (kept at its parse,
    :func:`remember_received`: nothing is serialized again), else of its serialization,
    the payload its maker's encoding sends (:func:`frame`).  Unlike
    :func:`object_digest` it tells the forms of one public key apart (made here or
    parsed): a signature binds the bytes its receiver parses, whatever their form."""
    kind_of(obj)  # refuses secret keys
    if received:
        with _RECEIVED_LOCK:
            kept = _PAYLOAD_DIGESTS.get(obj)
        if kept is not None:
            return kept
    return hashlib.sha256(openfhe.Serialize(obj, openfhe.BINARY)).digest()


def wire_digests(objs: Iterable[Any], *, received: bool = False) -> bytes:
    """One :func:`wire_digest` of several objects in order (None: an absent one, told
    apart)."""
    total = hashlib.sha256()
    for obj in objs:
        total.update(b"\0" * 32 if obj is None else wire_digest(obj, received=received))
    return total.digest()


def ciphertext_digest_as_received(ciphertext: openfhe.Ciphertext) -> bytes:
    """The digest a receiver takes of ``ciphertext`` (made in this process) once it parses
    it: a ciphertext made here serializes other bytes than its parsed copy (as a public
    key does, :func:`object_digest`), so what its maker signs is the parsed copy's."""
    parsed = deserialize(openfhe.DeserializeCiphertextString,
                         openfhe.Serialize(ciphertext, openfhe.BINARY))
    return object_digest(parsed)


def digest_of(data: bytes) -> bytes | None:
    """The digest a framed object's header claims (None if too short to have one)."""
    if len(data) < _HEADER.size:
        return None
    return bytes(data[_HEADER.size - _DIGEST_BYTES:_HEADER.size])


def unframe(kind_name: str, data: bytes, fingerprint: bytes) -> bytes:
    """Check header and digest of a framed object; return its OpenFHE payload."""
    return unframe_digested(kind_name, data, fingerprint)[0]


def unframe_digested(kind_name: str, data: bytes, fingerprint: bytes) -> tuple[bytes, bytes]:
    """:func:`unframe`, and the payload's whole SHA-256 (the header holds its start)."""
    kind = KINDS.get(kind_name)
    if kind is None:
        raise InputError(f"unknown kind {kind_name!r}; known: {sorted(KINDS)}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"malformed {kind_name}: {type(data).__name__}, not bytes")
    if len(data) < _HEADER.size:
        raise ProtocolError(f"malformed {kind_name}: {len(data)} bytes, too short")
    magic, code, their_print, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"malformed {kind_name}: bad magic {magic!r}")
    if code != kind.code:
        got = _KIND_BY_CODE.get(code)
        raise ProtocolError(f"expected a {kind_name}, got {got.name if got else code}")
    if their_print != fingerprint:
        raise ProtocolError(f"{kind_name} was made under another CKKS preset")
    payload = bytes(data[_HEADER.size:])
    full = hashlib.sha256(payload).digest()
    if full[:_DIGEST_BYTES] != digest:
        raise ProtocolError(f"malformed {kind_name}: digest mismatch (corrupted or truncated)")
    return payload, full


def remember_received(kind_name: str, obj: Any, payload_sha256: bytes) -> None:
    """Keep the SHA-256 of the payload ``obj`` was parsed from, for as long as it lives:
    its :func:`wire_digest` (a party checks each key share's signature against it: a
    25 MB key need not be serialized again to be digested) and, for a kind that
    serializes to the bytes it was parsed from, its :func:`object_digest` too."""
    with _RECEIVED_LOCK:
        _PAYLOAD_DIGESTS[obj] = payload_sha256
        if kind_name in SERIALIZED_AS_PARSED:
            _RECEIVED_DIGESTS[obj] = payload_sha256


class Templates:
    """Reference byte prefixes per kind, built lazily from throwaway keys.

    Throwaway keys are fresh random keys of this process, unrelated to any party's, so
    building references leaks nothing. Thread-safe; the cost (a few throwaway key
    generations, up to ~1 s at ring 2^15) is paid once per kind, preset and process.
    """

    def __init__(self, cc: openfhe.CryptoContext, ring_dim: int) -> None:
        self._cc = cc
        self._ring_dim = ring_dim
        self._lock = threading.Lock()
        self._prefix: dict[str, bytes] = {}

    def check(self, kind_name: str, payload: bytes) -> None:
        """Raise :class:`ProtocolError` unless ``payload`` starts like a local object."""
        ref = self._reference(kind_name)
        if kind_name == "eval_key_map":
            self._check_map_fields(payload)
            ok = payload[:5] == ref[:5] and payload[17:len(ref)] == ref[17:]
        else:
            ok = payload[:len(ref)] == ref
        if not ok:
            raise ProtocolError(f"malformed {kind_name}: header or crypto parameters differ "
                                "from this context's")

    def _check_map_fields(self, payload: bytes) -> None:
        if len(payload) < _MAP_FIRST_INDEX.stop:
            raise ProtocolError("malformed eval_key_map: too short")
        (count,) = struct.unpack("<Q", payload[_MAP_COUNT])
        (index,) = struct.unpack("<I", payload[_MAP_FIRST_INDEX])
        if not 1 <= count <= self._ring_dim or not (index % 2 and index < 2 * self._ring_dim):
            raise ProtocolError(f"malformed eval_key_map: {count} entries, first index {index}")

    def _reference(self, kind_name: str) -> bytes:
        with self._lock:
            if kind_name not in self._prefix:
                self._prefix[kind_name] = self._build(kind_name)
            return self._prefix[kind_name]

    def _build(self, kind_name: str) -> bytes:
        first, second = (_sample(self._cc, kind_name, i) for i in (0, 1))
        if kind_name == "eval_key_map":
            return first[:5] + b"\0" * 12 + first[17:17 + _common_prefix(first[17:], second[17:])]
        return first[:_common_prefix(first, second)]


_TEMPLATES: dict[bytes, Templates] = {}
_TEMPLATES_LOCK = threading.Lock()


def templates_for(cc: openfhe.CryptoContext, preset: Any) -> Templates:
    """The process-wide :class:`Templates` of a preset: every role in one process (a
    simulation) shares the reference objects instead of building its own."""
    with _TEMPLATES_LOCK:
        if preset.fingerprint not in _TEMPLATES:
            _TEMPLATES[preset.fingerprint] = Templates(cc, preset.ring_dim)
        return _TEMPLATES[preset.fingerprint]


def _sample(cc: openfhe.CryptoContext, kind_name: str, which: int) -> bytes:
    """Serialize a throwaway object of ``kind_name`` (``which`` varies its content).

    The two samples get key tags of different lengths, so their common prefix ends at
    the latest at the tag's length field, before any per-object content. The tags are
    unique: OpenFHE caches automorphism keys per tag, process-wide (two throwaway keys
    stay cached, once per preset and process).
    """
    keys = cc.KeyGen()
    tag = "t" * (which + 1) + uuid.uuid4().hex
    keys.secretKey.SetKeyTag(tag)
    keys.publicKey.SetKeyTag(tag)
    if kind_name == "ciphertext":
        obj = cc.Encrypt(keys.publicKey, cc.MakeCKKSPackedPlaintext([float(which)]))
    elif kind_name == "public_key":
        obj = keys.publicKey
    elif kind_name == "eval_key":
        obj = cc.KeySwitchGen(keys.secretKey, keys.secretKey)
    else:
        obj = cc.EvalAutomorphismKeyGen(keys.secretKey, [5 if which == 0 else 25])
    return openfhe.Serialize(obj, openfhe.BINARY)


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b), 1 << 14)
    return next((i for i in range(n) if a[i] != b[i]), n)


def load(kind_name: str, payload: bytes) -> Any:
    """Let OpenFHE parse a checked payload; its exceptions become ProtocolError."""
    try:
        return deserialize(KINDS[kind_name].load, payload)
    except (RuntimeError, MemoryError, ValueError) as exc:
        raise ProtocolError(f"malformed {kind_name}: OpenFHE could not load it ({exc})") from None


def deserialize(loader: Callable[[bytes, Any], Any], data: bytes) -> Any:
    """``loader(data, BINARY)`` (an OpenFHE ``Deserialize...String``) for an object of
    this process's own context, without CRT precomputation (see below): the one way
    fednorm deserializes."""
    with without_crt_precomputation():
        return loader(data, openfhe.BINARY)


_LOADS_UNDER_WAY = 0
_LOADS_LOCK = threading.Lock()


@contextmanager
def without_crt_precomputation() -> Iterator[None]:
    """While fednorm parses its own objects, OpenFHE skips its CRT precomputation after
    deserialization (every OpenFHE load in fednorm runs inside this, by :func:`deserialize`).

    Every payload carries a copy of its context's crypto parameters; by default OpenFHE
    precomputes that copy's CRT tables as it parses them, then resolves the object to
    the matching context this process already built (tables and all) and drops the
    copy. The template check admits only parameters equal to this process's context, so
    the precomputation is pure waste: a 6.3 MB ciphertext parsed ~3.5x faster without
    it, a 25 MB key-switching key ~2.5x (bench/runs/2026-11-27-crt-tables.md). The
    switch is process-wide in OpenFHE, and a
    context that code embedding fednorm deserializes without its tables computes NaN, so
    it is off only while a fednorm parse is under way (counted across threads) and back
    on, OpenFHE's default, after the last one. (A context deserialized in another thread
    *during* a fednorm parse would still miss its tables: embedding code that loads
    contexts while a federation runs should load them before. OpenFHE's bindings have no
    getter for the switch, so an embedding program's own global Disable is undone.)
    """
    global _LOADS_UNDER_WAY
    with _LOADS_LOCK:
        if not _LOADS_UNDER_WAY:
            openfhe.DisablePrecomputeCRTTablesAfterDeserializaton()
        _LOADS_UNDER_WAY += 1
    try:
        yield
    finally:
        with _LOADS_LOCK:
            _LOADS_UNDER_WAY -= 1
            if not _LOADS_UNDER_WAY:
                openfhe.EnablePrecomputeCRTTablesAfterDeserializaton()
