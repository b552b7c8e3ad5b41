"""CKKS objects as bytes: serialization round trips, code that embeds fednorm, malformed
bytes as protocol errors, one parse shared by a broadcast's readers, and the codec."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import openfhe
import pytest
from ckks_federation import FRESH_ABS_TOL, CkksFederation

from fednorm.engine.ckks import (
    Bootstrap,
    CkksContext,
    RelinKeyGen,
    RelinShare,
    in_process_run,
    serial,
)
from fednorm.engine.errors import ProtocolError


# -- bytes -------------------------------------------------------------------------------
def test_serialization_round_trips(fed: CkksFederation) -> None:
    ctx, parties = fed.ctx, fed.parties
    values = np.linspace(-5, 5, 10)
    lead_relin, lead_rot = parties[0].relin_share(), parties[0].rotation_share([1, 3])
    relin = RelinKeyGen(ctx)
    round1 = relin.aggregate_shares(fed.joint, [RelinShare(1, lead_relin)] + [
        relin.generate_share(p, 1, RelinShare(1, lead_relin)) for p in parties[1:]])
    objects = [
        ("ciphertext", fed.encrypt(values)),
        ("public_key", fed.joint.public_key),
        ("eval_key", lead_relin),
        ("eval_key", parties[1].relin_mult_share(round1)),
        ("eval_key_map", lead_rot),
        ("eval_key_map", parties[2].rotation_share([1, 3], lead_rot)),
    ]
    for kind, obj in objects:
        back = ctx.from_bytes(kind, ctx.to_bytes(obj))
        assert isinstance(back, type(obj))
        if hasattr(obj, "GetKeyTag"):
            assert back.GetKeyTag() == obj.GetKeyTag()
        if hasattr(back, "GetCryptoContext"):
            # Parsing skips the CRT tables of the payload's copy of the parameters: the
            # object must resolve to the context this process built, tables and all.
            assert back.GetCryptoContext() == ctx.raw
    ct = ctx.from_bytes("ciphertext", ctx.to_bytes(objects[0][1]))
    np.testing.assert_allclose(fed.decrypt(ct, 10), values, atol=FRESH_ABS_TOL)
    halved = ctx.raw.EvalMult(ct, 0.5)  # rescales: uses the context's CRT tables
    np.testing.assert_allclose(fed.decrypt(halved, 10), values / 2, atol=FRESH_ABS_TOL)
    share = parties[1].decrypt_share(ct)
    assert len(ctx.to_bytes(share)) * 4 < len(ctx.to_bytes(ct))  # shares are compressed
    rnd = Bootstrap(ctx).prepare(fed.joint, ct, 3)
    h0, h1 = (ctx.from_bytes("ciphertext", ctx.to_bytes(h))
              for h in parties[0].boot_share(rnd.c1, rnd.a))
    assert h0.GetKeyTag() == h1.GetKeyTag() == parties[0].tag


_EMBEDDING_CODE = """
import json, openfhe
from fednorm.engine.ckks.context import CkksContext
ctx = CkksContext("test")
keys = ctx.raw.KeyGen()
ct = ctx.raw.Encrypt(keys.publicKey, ctx.raw.MakeCKKSPackedPlaintext([1.0]))
ctx.from_bytes("ciphertext", ctx.to_bytes(ct))  # fednorm parses
# Code embedding fednorm loads a context of its own, in a fresh context registry.
blob = openfhe.Serialize(ctx.raw, openfhe.BINARY)
openfhe.ReleaseAllContexts()
cc = openfhe.DeserializeCryptoContextString(blob, openfhe.BINARY)
mine = cc.KeyGen()
product = cc.EvalMult(cc.Encrypt(mine.publicKey, cc.MakeCKKSPackedPlaintext([1.0, 2.0])), 3.0)
plain = cc.Decrypt(product, mine.secretKey)
plain.SetLength(2)
print(json.dumps(plain.GetRealPackedValue()))
"""


def test_code_embedding_fednorm_still_loads_contexts_that_compute() -> None:
    """fednorm skips OpenFHE's CRT precomputation only while it parses its own payloads:
    a context that the embedding code deserializes afterwards gets its tables (without
    them it computes NaN, as it did when fednorm turned the precomputation off for the
    whole process). In a subprocess: the check empties OpenFHE's context registry."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _EMBEDDING_CODE], capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == pytest.approx([3.0, 6.0], abs=1e-6)


def test_malformed_bytes_are_protocol_errors(fed: CkksFederation, foreign: CkksContext) -> None:
    ctx = fed.ctx
    data = ctx.to_bytes(fed.encrypt(np.ones(3)))
    header = 29  # magic 4 + kind 1 + fingerprint 8 + digest 16
    flipped = bytearray(data)
    flipped[header + 100] ^= 0xFF  # inside the crypto parameters: would crash OpenFHE
    payload = bytes(flipped[header:])
    # a peer that recomputes the digest still cannot get odd parameters past the template
    forged = data[:13] + serial.payload_digest(payload) + payload
    cases = [
        ("ciphertext", data[:10], "too short"),
        ("ciphertext", b"XXXX" + data[4:], "bad magic"),
        ("ciphertext", data[:-1000], "digest"),
        ("ciphertext", bytes(flipped), "digest"),
        ("ciphertext", forged, "crypto parameters"),
        ("ciphertext", os.urandom(5000), "malformed"),
        ("public_key", data, "expected a public_key"),
        ("public_key", foreign.to_bytes(foreign.raw.KeyGen().publicKey), "another CKKS preset"),
    ]
    for kind, blob, message in cases:
        with pytest.raises(ProtocolError, match=message):
            ctx.from_bytes(kind, blob)


def test_a_broadcasts_readers_in_one_process_share_one_parse(fed: CkksFederation) -> None:
    """In a simulation every reader of a broadcast gets one parse of its bytes; outside
    one (a role per process) nothing is kept."""
    ctx = fed.ctx
    values = np.array([1.5, -2.0, 3.25])
    data = ctx.to_bytes(fed.encrypt(values))
    ctx.from_bytes("ciphertext", data)
    assert ctx.kept_bytes == 0  # one role per process: nobody here reads a frame twice
    with in_process_run():
        first = ctx.from_bytes("ciphertext", data)
        assert ctx.kept_bytes == len(data)
        assert ctx.from_bytes("ciphertext", bytes(data)) is first  # equal bytes, no parse
        fresh = serial.load("ciphertext", serial.unframe("ciphertext", data,
                                                          ctx.preset.fingerprint))
        framed = ctx.to_bytes(fresh)
        assert ctx.to_bytes(first) == framed  # as a parse of its own would serialize
        # ... which is not the sender's bytes: a parse serializes longer than the original
        # (why readers get a parse, never the sender's object; see from_bytes).
        assert len(framed) > len(data)
        np.testing.assert_allclose(fed.decrypt(first, 3), values, atol=FRESH_ABS_TOL)
        # The same bytes with one payload byte flipped are parsed, and refused.
        flipped = bytearray(data)
        flipped[-100] ^= 0xFF
        with pytest.raises(ProtocolError, match="digest"):
            ctx.from_bytes("ciphertext", bytes(flipped))
    assert ctx.kept_bytes == 0  # the last run's objects are let go


def test_codec_registration(fed: CkksFederation) -> None:
    registered = {}

    def register(code, cls, encode, decode) -> None:
        registered[code] = (cls, encode, decode)

    fed.ctx.register_codec_types(register)
    assert sorted(registered) == [16, 17, 18, 19]
    cls, encode, decode = registered[16]
    ct = fed.encrypt(np.ones(2))
    assert cls is type(ct) and isinstance(decode(encode(ct)), cls)
    with pytest.raises(ProtocolError):
        registered[17][2](encode(ct))  # a ciphertext is not a public key


def test_a_key_share_is_signed_as_its_bytes_travel(fed: CkksFederation) -> None:
    """What a key share's signature covers (:func:`serial.wire_digest`): its maker
    digests the payload its encoding sends, a receiver the payload it parsed, kept from
    the parse, so no share is serialized again to be checked.  A public key made here
    and its parse serialize differently, so these are not :func:`serial.object_digest`,
    the digest of the parsed form that key comparisons use."""
    share = fed.parties[1].public_key_share
    made = openfhe.Serialize(share, openfhe.BINARY)
    framed = fed.ctx.to_bytes(share)
    parsed = fed.ctx.from_bytes("public_key", framed)
    assert framed.endswith(made)
    payload = hashlib.sha256(made).digest()
    assert serial.wire_digest(share) == serial.wire_digest(parsed, received=True) == payload
    assert serial.object_digest(parsed) != payload
    assert serial.object_digest(parsed) == serial.object_digest(share)
