"""Collective decryption over the network: the server's round, a party's answer.

Three kinds share one flow: a decryption of a computed ciphertext (sub-protocol
``decrypt``: :class:`~fednorm.engine.ckks.FloodedDecryption`, flooded by the noise the
step declares, or, where flooding would leave no useful precision, a plain
:class:`~fednorm.engine.ckks.Decryption`) and a flooded decryption of a sum, a product or a
masked sum of signed uploads (:class:`~fednorm.engine.ckks.SumDecryption`,
:class:`~fednorm.engine.ckks.ProductDecryption` and
:class:`~fednorm.engine.ckks.CoefficientSumDecryption`, sub-protocols ``decrypt_sum``,
``decrypt_product`` and ``decrypt_coefficients``).

A plain (not flooded) decryption whose values were too large to decode may be retried
once where a phase declares it (:attr:`~fednorm.protocols.ledger.Allowance.retries`),
and only bound to the request it retries: that request's ciphertext times the public
2^-RETRY_SHIFT (:func:`shifted`), which a party recomputes from the request it answered
and compares byte for byte, and which must declare no flooding, as the request it
retries (:func:`require_retry_of`).  A flooded decryption is decoded here, whatever its
noise (:mod:`fednorm.engine.ckks.decoding`), so it is never retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import openfhe
import trio

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.protocols.collective.messages import (
    CoefficientDecryptRequest,
    DecryptRequest,
    ProductDecryptRequest,
    SumDecryptRequest,
)
from fednorm.protocols.collective.rounds import relayed, request_shares, send_share
from fednorm.protocols.collective.sums import (
    CoefficientUpload,
    PooledUploads,
    ProductUpload,
    SignedUpload,
    SumUpload,
)

if TYPE_CHECKING:
    from fednorm.protocols.collective.roles import PartyCrypto, ServerCrypto

DECRYPT, DECRYPT_SUM, DECRYPT_PRODUCT = "decrypt", "decrypt_sum", "decrypt_product"
DECRYPT_COEFFICIENTS = "decrypt_coefficients"
RETRY_SHIFT = 40  # a retry decrypts the request's ciphertext times 2^-RETRY_SHIFT
CombinedRequest = SumDecryptRequest | ProductDecryptRequest | CoefficientDecryptRequest
_COMBINED: dict[type[SignedUpload],
                tuple[str, type[CombinedRequest], type[ckks.SumDecryption]]] = {
    SumUpload: (DECRYPT_SUM, SumDecryptRequest, ckks.SumDecryption),
    ProductUpload: (DECRYPT_PRODUCT, ProductDecryptRequest, ckks.ProductDecryption),
    CoefficientUpload: (DECRYPT_COEFFICIENTS, CoefficientDecryptRequest,
                        ckks.CoefficientSumDecryption),
}  # each kind of upload: the sub-protocol, request and decryption of its combination


async def decrypt(crypto: ServerCrypto, ct: openfhe.Ciphertext, n: int,
                  noise: ckks.DecryptionNoise | None) -> np.ndarray:
    """Server: the decryption of ``ct``, first ``n`` slots, flooded by the declared
    ``noise`` (``None``: not flooded)."""
    decryption = decryption_of(crypto.ckks, noise)
    prepared = await crypto.rc.run_sync(decryption.prepare, ct)
    crypto.decryptions += 1
    return await _shares_fused(crypto, decryption, DECRYPT,
                               DecryptRequest.of(prepared, noise), prepared, n)


def decryption_of(context: ckks.CkksContext, noise: ckks.DecryptionNoise | None,
                  flooding: ckks.MeasuredFlooding | None = None) -> ckks.Decryption:
    """The decryption a request with the declared ``noise`` takes: flooded by it, or not."""
    if noise is None:
        return ckks.Decryption(context)
    return ckks.FloodedDecryption(context, noise, flooding)


async def decrypt_shifted(crypto: ServerCrypto, ct: openfhe.Ciphertext, n: int
                          ) -> np.ndarray:
    """Server: the retry of :func:`decrypt` of ``ct`` (whose values did not decode),
    right after it: the same request times 2^-RETRY_SHIFT, its values scaled back.

    The request is recomputed (``prepare`` is deterministic, so it is the one the
    parties answered) and shifted by :func:`shifted`, as every party recomputes it."""
    decryption = ckks.Decryption(crypto.ckks)
    request = await crypto.rc.run_sync(
        lambda: shifted(crypto.ckks, decryption.prepare(ct)))
    crypto.decryptions += 1
    values = await _shares_fused(crypto, decryption, DECRYPT,
                                 DecryptRequest(ciphertext=request), request, n)
    return values * 2.0**RETRY_SHIFT


def shifted(context: ckks.CkksContext, request: openfhe.Ciphertext) -> openfhe.Ciphertext:
    """A retried request: ``request`` times 2^-RETRY_SHIFT, deterministic (a product by
    a power of two, then OpenFHE's rescale), so server and parties get the same bytes.

    Shifting the prepared request (compressed, at doubled scale) scales its noise with
    its values, so they decode: in PPF z-score, variances up to 2^80 (docs/LEAKAGE.md)."""
    return context.mul(request, 2.0**-RETRY_SHIFT)


async def decrypt_pooled(crypto: ServerCrypto, pooled: PooledUploads, n: int
                         ) -> np.ndarray:
    """Server: the flooded decryption of a combination (sum, product) of signed uploads,
    first ``n`` slots; the uploads follow the request, one a frame, and each party
    recomputes the combination from them."""
    crypto.decryptions += 1
    name, kind, decryption = _COMBINED[pooled.kind]
    combination: list[openfhe.Ciphertext] = []
    async with trio.open_nursery() as nursery:  # the server's combination meanwhile
        nursery.start_soon(_combine, crypto, pooled, combination)
        replies = await request_shares(crypto.rc, name, kind(index=pooled.index),
                                       ckks.DecryptionShare, (pooled.index, pooled.uploads))
    return await _fused(crypto, decryption(crypto.ckks), replies, combination[0], n)


async def _combine(crypto: ServerCrypto, pooled: PooledUploads,
                   into: list[openfhe.Ciphertext]) -> None:
    into.append(await crypto.rc.run_sync(pooled.combined, crypto.ckks))


async def _shares_fused(crypto: ServerCrypto, decryption: ckks.Decryption, name: str,
                        request: DecryptRequest | CombinedRequest,
                        prepared: openfhe.Ciphertext, n: int) -> np.ndarray:
    """Send ``request`` (for shares of ``prepared``) to every party, aggregate their
    shares and finalize."""
    replies = await request_shares(crypto.rc, name, request, ckks.DecryptionShare)
    return await _fused(crypto, decryption, replies, prepared, n)


async def _fused(crypto: ServerCrypto, decryption: ckks.Decryption,
                 shares: list[ckks.DecryptionShare], prepared: openfhe.Ciphertext, n: int
                 ) -> np.ndarray:
    """The parties' shares of ``prepared`` aggregated, the first ``n`` slots."""
    plaintext = await crypto.rc.run_sync(decryption.aggregate_shares, crypto.joint, prepared,
                                         shares)
    return await crypto.rc.run_sync(decryption.finalize, plaintext, n)


async def answer_decryption(crypto: PartyCrypto, request: DecryptRequest) -> None:
    """Party: a decryption share of the requested ciphertext (never a second one),
    flooded by the noise the request declares (checked beforehand against this party's
    own run of the step, where it replays it), counted against τ."""
    noise = request.declared_noise()
    flooding = None
    if noise is not None:
        flooding = crypto.measured_flooding(noise, request.ciphertext)
        crypto.count_flooded_share(flooding)
    await _answer(crypto, decryption_of(crypto.ckks, noise, flooding), DECRYPT,
                  request.ciphertext)


async def answer_sum_decryption(crypto: PartyCrypto, request: SumDecryptRequest) -> None:
    """Party: a flooded share of the sum of the relayed sum uploads (:func:`_answer_combined`)."""
    await _answer_combined(crypto, request, SumUpload)


async def answer_product_decryption(crypto: PartyCrypto, request: ProductDecryptRequest
                                    ) -> None:
    """Party: a flooded share of the product of the relayed product uploads
    (:func:`_answer_combined`)."""
    await _answer_combined(crypto, request, ProductUpload)


async def answer_coefficient_decryption(crypto: PartyCrypto, request: CoefficientDecryptRequest
                                   ) -> None:
    """Party: a flooded share of the sum of the relayed coefficient uploads
    (:func:`_answer_combined`)."""
    await _answer_combined(crypto, request, CoefficientUpload)


async def _answer_combined(crypto: PartyCrypto, request: CombinedRequest,
                           kind: type[SignedUpload]) -> None:
    """Party: a flooded decryption share (this party's s and τ) of the combination it
    recomputes from the uploads of ``kind`` relayed after the request, each checked
    (:func:`.sums.verified_combination`); one decryption per set of uploads."""
    index, sent = request.index, crypto.held.own_uploads.get(kind.KIND, [])
    noun = f"a {kind.NOUN} decryption request"
    if not isinstance(index, int) or not 0 <= index < len(sent):
        raise ProtocolError(f"{noun} names {kind.NOUN} upload #{index!r}, which this party "
                            "never sent")
    if (kind.KIND, index) in crypto.held.decrypted_uploads:
        raise ProtocolError(f"{noun} asks again for {kind.NOUN} uploads #{index}, already "
                            "decrypted")
    name, _, decryption = _COMBINED[kind]
    with crypto.rc.subprotocol(name):
        uploads = await relayed(crypto.rc, index, crypto.n_parties, noun)
    combined = await crypto.recombined(kind, index, uploads)
    flooding = crypto.flooding_of(kind, combined, uploads[0].ciphertext)  # type: ignore[attr-defined]
    crypto.count_flooded_share(flooding)
    crypto.held.decrypted_uploads.add((kind.KIND, index))
    await _answer(crypto, decryption(crypto.ckks, flooding), name, combined)


_REQUESTS = {DECRYPT: "decryption request", DECRYPT_SUM: "sum decryption request",
             DECRYPT_PRODUCT: "product decryption request",
             DECRYPT_COEFFICIENTS: "coefficient decryption request"}


async def _answer(crypto: PartyCrypto, decryption: ckks.Decryption, name: str,
                  ct: openfhe.Ciphertext) -> None:
    await crypto.claim_share(_REQUESTS[name], ct)
    share = await crypto.rc.run_sync(decryption.generate_share, crypto.keys, ct)
    await send_share(crypto.rc, name, share)


async def require_retry_of(crypto: PartyCrypto, previous: openfhe.Ciphertext | None,
                           request: DecryptRequest) -> None:
    """Party: ProtocolError unless ``request`` is the retry of ``previous`` (the decryption
    request answered just before, not flooded): :func:`shifted` of it, recomputed here,
    byte for byte, declaring no flooding either."""
    if request.declared_noise() is not None:
        raise ProtocolError("decryption retry refused: only a plain decryption is retried")
    if previous is None or not await crypto.rc.run_sync(
            _is_shifted, crypto.ckks, previous, request.ciphertext):
        raise ProtocolError("decryption retry refused: its ciphertext is not the previous "
                            f"request's times 2^-{RETRY_SHIFT}")


def _is_shifted(context: ckks.CkksContext, previous: openfhe.Ciphertext,
                retry: object) -> bool:
    try:
        expected = shifted(context, previous)
    except ProtocolError:  # no level left to shift: nothing can be its retry
        return False
    return same_ciphertext(expected, retry)


def same_ciphertext(expected: openfhe.Ciphertext, received: object) -> bool:
    """Whether ``received`` (off the wire) is, byte for byte, the ciphertext this party
    computed itself with the server's deterministic operations."""
    return isinstance(received, openfhe.Ciphertext) and openfhe.Serialize(
        expected, openfhe.BINARY) == openfhe.Serialize(received, openfhe.BINARY)
