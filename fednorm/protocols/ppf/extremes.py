"""PPF pooled extremes (the default PPF MinMax): a threshold search over encrypted bits.

The pooled max of a feature is ≤ a threshold exactly when every party's values are, so
the AND over the parties of the bits "all my values are ≤ threshold" is the pooled bit,
and it tells the server nothing else.  The AND comes from a sum: each party uploads its
bits as masked zeros (0 for a 1, a uniform element of Z_Q for a 0,
:mod:`fednorm.engine.ckks.masking`), whose sum decrypts to 0 exactly where every bit is
1 and to a uniform element elsewhere.  Step by step:

1. collective key setup of the joint public key alone (:func:`setup_arguments`): no
   relinearization or rotation keys, no V_abs, no bootstraps;
2. every feature has two brackets (l, h] of float order keys
   (:mod:`fednorm.protocols.float_order`): one for its max, one for the max of its
   negated values (−min), both starting as the whole float order (−inf, +inf] with
   −inf included (:class:`Brackets`);
3. each round T thresholds cut every bracket into T + 1 cells of near-equal numbers of
   floats (:func:`~fednorm.protocols.float_order.thresholds`): the first round's from the
   start brackets, which every party knows, the later ones published by the server
   (:class:`Thresholds`);
4. each party computes in the clear, per bracket and threshold, the bit "my largest
   value (of the feature, or of its negation) is ≤ the threshold" — 1 for a feature it
   has no values of — and encrypts all of them in one ciphertext, one bit per coefficient
   of the ring (chunks if they do not fit), as a signed masked upload
   (:meth:`PartyCrypto.encrypt_masked`);
5. the server adds the P uploads up and has the sum decrypted, flooded, and read as
   bits: a party checks every relayed upload, recomputes the sum itself and decrypts
   only that, once per round (:data:`ROUND`); the bits read 0…0 1…1 per bracket, the
   first 1 marks the cell holding the pooled extreme, which becomes the bracket;
6. after ⌈64 / log2(T + 1)⌉ rounds at most every bracket holds one float: the pooled
   max and −min, exact, broadcast as :class:`~fednorm.protocols.ppf.minmax.MinMaxExtremes`.

**Results.** Equal to ``np.nanmax`` / ``np.nanmin`` of the pooled data bit for bit; a
feature without values anywhere ends at −inf (no data value is ±inf:
:func:`~fednorm.protocols.base.check_party_data`) and is reported as NaN.  Signed zeros
follow the float total order (−0 < +0): the max is +0 when any value is +0, the min −0
when any value is −0; numpy returns either zero depending on the order of the values,
equal in value.

**What the server learns.** Each decrypted bit is [pooled extreme ≤ threshold]: a
function of the result alone, whatever thresholds it picks; a party refuses rounds
beyond those the search needs (each spends a flooded decryption of the keys' τ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols import float_order
from fednorm.protocols.base import FitOptions, agreed_width
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.collective.sums import CoefficientUpload
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.ppf.minmax import MinMaxExtremes
from fednorm.protocols.ppf.phases import serve_phase

MIN_THRESHOLDS = 15
"""Thresholds per bracket and round at least (4 bits of bracket per round), chunking the
bits over several ciphertexts when many features leave fewer slots per bracket."""

_NEGATIVE_INFINITY = int(float_order.keys(np.array([-np.inf]))[0])
_POSITIVE_INFINITY = int(float_order.keys(np.array([np.inf]))[0])


# -- messages -----------------------------------------------------------------------------
@message("ppf_extremes.bits")
class EncryptedBits(Message):
    """A party's bits of one round, one signed masked upload per chunk of positions."""

    chunks: list[CoefficientUpload]
    width: int


@message("ppf_extremes.thresholds")
class Thresholds(Message):
    """The next round's thresholds: order keys (int64), one row per bracket (the max of
    every feature, then its −min)."""

    thresholds: np.ndarray


# -- the ledger ------------------------------------------------------------------------------
PLAINTEXT = {
    "ppf_extremes.bits": ("width",),
    "ppf_extremes.thresholds": ("thresholds",),
    "ppf_minmax.result": ("min", "max"),
}
"""What the search sends in the clear: widths, each round's thresholds (a function of the
result, revealed anyway) and the result."""

ROUND = Allowance(coefficients=1)
"""Each round, per chunk of positions: one flooded decryption of the sum of the parties'
masked bits; no bootstraps."""

LEDGER = declare("minmax", "mhe", {**COLLECTIVE, **PLAINTEXT}, algorithm="default")


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """The keys the search needs: the joint public key alone (sums, no products)."""
    return {"relinearize": False, "rotations": ()}


def flooded_decryptions(options: FitOptions, width: int) -> Allowance:
    """The most flooded decryptions the search makes on ``width`` features: one masked sum
    per chunk and round (:data:`ROUND`), for as many rounds as a party allows."""
    layout = Layout(width, ckks.get_preset(options.preset).ring_dim)
    return ROUND.times(Brackets.start(layout.brackets).rounds_left(layout.count)
                       * layout.chunks)


# -- the search in the float order (both roles, plaintext) -----------------------------------
@dataclass(frozen=True)
class Layout:
    """Where each bit sits: bracket b's T bits at positions b·T … b·T + T − 1 of the
    concatenated chunks (brackets: the max of every feature, then the −min of every one),
    ``positions`` per chunk (the ring's coefficients)."""

    width: int
    positions: int

    @property
    def brackets(self) -> int:
        return 2 * self.width

    @property
    def count(self) -> int:
        """T, thresholds per bracket and round: as many as fit one ciphertext."""
        return max(self.positions // self.brackets, MIN_THRESHOLDS)

    @property
    def chunks(self) -> int:
        """Ciphertexts per round (one unless the features leave fewer than
        :data:`MIN_THRESHOLDS` positions per bracket)."""
        return math.ceil(self.brackets * self.count / self.positions)

    def chunk(self, flat: np.ndarray, index: int) -> np.ndarray:
        """Chunk ``index`` of the bits in layout order."""
        return flat[index * self.positions:(index + 1) * self.positions]

    def chunk_size(self, index: int) -> int:
        """Bits chunk ``index`` holds: the positions its decryption reveals."""
        return min(self.positions, self.brackets * self.count - index * self.positions)


@dataclass(frozen=True)
class Brackets:
    """Per bracket, the open-closed interval (low, high] of order keys that holds the
    pooled extreme."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def start(cls, count: int) -> Brackets:
        """The whole float order, −inf included (the extreme of no values at all)."""
        return cls(np.full(count, _NEGATIVE_INFINITY - 1, dtype=np.int64),
                   np.full(count, _POSITIVE_INFINITY, dtype=np.int64))

    def thresholds(self, count: int) -> np.ndarray:
        """(brackets, ``count``) keys cutting each bracket into cells of near-equal
        numbers of floats (a bracket of one float repeats its high end)."""
        return float_order.thresholds(self.low, self.high, count)

    def rounds_left(self, count: int) -> int:
        """Rounds of ``count`` thresholds until every bracket holds one float: what the
        server runs, and what a party allows."""
        return float_order.rounds_to_single(self.low, self.high, count)

    def narrowed(self, thresholds: np.ndarray, bits: np.ndarray) -> Brackets:
        """The cell each bracket's first 1 marks: (threshold before it, its threshold]."""
        below = (bits == 0).sum(axis=1)  # thresholds under the pooled extreme
        rows, count = np.arange(len(below)), thresholds.shape[1]
        low = np.where(below > 0, thresholds[rows, np.maximum(below - 1, 0)], self.low)
        high = np.where(below < count, thresholds[rows, np.minimum(below, count - 1)],
                        self.high)
        return Brackets(low, high)

    def extremes(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(min, max) per feature once every bracket holds one float; NaN where the
        search ended at −inf (no values)."""
        found = float_order.values(self.high)
        found = np.where(found == -np.inf, np.nan, found)
        return -found[width:], found[:width]


def local_tops(X: np.ndarray) -> np.ndarray:
    """This party's largest order key per bracket: of each feature's values, then of
    their negations (key(−x) = ~key(x)); −inf's key for a feature without values."""
    present = ~np.isnan(X)
    keys = float_order.keys(np.where(present, X, 0.0))
    top = np.where(present, keys, _NEGATIVE_INFINITY).max(axis=0, initial=_NEGATIVE_INFINITY)
    negated = np.where(present, ~keys, _NEGATIVE_INFINITY).max(
        axis=0, initial=_NEGATIVE_INFINITY)
    return np.concatenate([top, negated])


def threshold_bits(tops: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """1.0 where this party's top of the bracket is ≤ the threshold, flattened in
    :class:`Layout` order."""
    return (tops[:, None] <= thresholds).astype(np.float64).ravel()


# -- server ---------------------------------------------------------------------------------
async def extremes_server(crypto: ServerCrypto, width: int | None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """The server's side of the search after key setup (:func:`setup_arguments`): returns
    and broadcasts (min, max) per feature.  ``width`` None: the first party's."""
    rc = crypto.rc
    with rc.subprotocol("extremes"):
        replies = await rc.gather(EncryptedBits)
        layout = Layout(agreed_width(replies, width), crypto.ckks.preset.ring_dim)
        brackets = Brackets.start(layout.brackets)
        thresholds = brackets.thresholds(layout.count)
        while True:
            bits = await _pooled_bits(crypto, layout, replies)
            brackets = brackets.narrowed(thresholds, bits)
            if brackets.rounds_left(layout.count) == 0:
                break
            thresholds = brackets.thresholds(layout.count)
            await rc.broadcast(Thresholds(thresholds=thresholds))
            replies = await rc.gather(EncryptedBits)
            agreed_width(replies, layout.width)
        low, high = brackets.extremes(layout.width)
        await rc.broadcast(MinMaxExtremes(min=low, max=high))
    return low, high


async def _pooled_bits(crypto: ServerCrypto, layout: Layout,
                       replies: dict[int, EncryptedBits]) -> np.ndarray:
    """The pooled bits of one round, (brackets, T): each chunk's masked sum decrypted."""
    for party, reply in replies.items():
        if not isinstance(reply.chunks, list) or len(reply.chunks) != layout.chunks:
            raise ProtocolError(f"party {party} sent bits in {_count(reply.chunks)} "
                                f"ciphertexts, expected {layout.chunks}")
    parts = []
    for chunk in range(layout.chunks):
        pooled = await crypto.pool_coefficients({p: r.chunks[chunk] for p, r in replies.items()})
        parts.append(await crypto.decrypt_masked(pooled, layout.chunk_size(chunk)))
    return _as_bits(np.concatenate(parts).reshape(layout.brackets, layout.count))


def _count(chunks: object) -> object:
    return len(chunks) if isinstance(chunks, list) else type(chunks).__name__


def _as_bits(bits: np.ndarray) -> np.ndarray:
    """The decrypted bits; ProtocolError unless each bracket reads 0…0 1…1 (honest
    parties' bits always do: a party sent something else)."""
    if (np.diff(bits, axis=1) < 0).any():
        raise ProtocolError("the pooled bits are not a threshold pattern: a party sent "
                            "something other than its bits")
    return bits


# -- party ----------------------------------------------------------------------------------
async def extremes_party(crypto: PartyCrypto, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A party's side of the search after key setup: returns (min, max) per feature."""
    rc, layout = crypto.rc, Layout(X.shape[1], crypto.ckks.preset.ring_dim)
    tops = local_tops(X)
    start = Brackets.start(layout.brackets)
    thresholds, rounds_left = start.thresholds(layout.count), start.rounds_left(layout.count)
    with rc.subprotocol("extremes"):
        while True:
            await _send_bits(crypto, layout, threshold_bits(tops, thresholds))
            reply = await serve_phase(crypto, (Thresholds, MinMaxExtremes),
                                      ROUND.times(layout.chunks))
            if isinstance(reply, MinMaxExtremes):
                return (as_float_vector(reply.min, layout.width, "pooled min"),
                        as_float_vector(reply.max, layout.width, "pooled max"))
            rounds_left -= 1
            if rounds_left <= 0:
                raise ProtocolError("the server asked for more threshold rounds than the "
                                    "search needs to end on single floats")
            thresholds = _received_thresholds(reply.thresholds, layout)


async def _send_bits(crypto: PartyCrypto, layout: Layout, bits: np.ndarray) -> None:
    chunks = [await crypto.encrypt_masked(layout.chunk(bits, c))
              for c in range(layout.chunks)]
    await crypto.rc.send(SERVER, EncryptedBits(chunks=chunks, width=layout.width))


def _received_thresholds(value: object, layout: Layout) -> np.ndarray:
    shape = (layout.brackets, layout.count)
    if not isinstance(value, np.ndarray) or value.dtype != np.int64 or value.shape != shape:
        got = getattr(value, "shape", type(value).__name__)
        raise ProtocolError(f"thresholds: expected int64 order keys of shape {shape}, "
                            f"got {got}")
    return value


# -- the registered protocol (default PPF MinMax) --------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> MinMaxNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    low, high = await extremes_server(crypto, None)
    return MinMaxNormalizer(low, high)


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> MinMaxNormalizer:
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    low, high = await extremes_party(crypto, X)
    return MinMaxNormalizer(low, high)
