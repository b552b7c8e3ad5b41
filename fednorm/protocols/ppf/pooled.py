"""Pooled sums, the default PPF protocols' one way to learn anything: each party uploads a
vector as a signed sum upload, the server adds the P uploads, and the parties decrypt the
sum collectively, each recomputing it from the relayed uploads and flooding its share
(:mod:`fednorm.protocols.collective.sums`).  What the server learns is the sum of the
parties' vectors and nothing else; a party checks that it decrypts exactly that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER
from fednorm.protocols.base import FitOptions, agreed_width
from fednorm.protocols.collective import PartyCrypto, ServerCrypto
from fednorm.protocols.collective.sums import CoefficientUpload, SumUpload
from fednorm.protocols.ledger import Allowance

PACKED_BITS = 40
"""Integers a pooled sum's slot keeps exact: a decrypted slot is off by about 2^-50 of
its value, so below 2^40 by about 1e-3, far from the 0.5 that would round it wrongly
(tests/test_count_packing.py measures it through the real roles)."""

POOLED_SUM = Allowance(sums=1)
"""One flooded decryption of one pooled sum."""

EXACT_SUM = Allowance(coefficients=1)
"""One flooded decryption of one pooled sum of coefficient uploads (:func:`exact_sum`)."""

PLAINTEXT = {"ppf.sum_upload": ("width",)}
"""The ledger's entry: each upload says how many values it carries."""

EXACT_PLAINTEXT = {"ppf.coefficient_sum": ("width",)}
"""The ledger's entry for exact sums (:func:`exact_sum`): the same."""


@message("ppf.sum_upload")
class EncryptedSum(Message):
    """A party's vector, encrypted under the joint key and signed, for one pooled sum."""

    values: SumUpload
    width: int


@message("ppf.coefficient_sum")
class EncryptedCoefficients(Message):
    """A party's vector at public powers of two, as integers in the ring's coefficients,
    encrypted under the joint key and signed, for one exact sum (:func:`exact_sum`)."""

    values: CoefficientUpload
    width: int


async def pooled_sum(crypto: ServerCrypto, width: int | None = None) -> np.ndarray:
    """Server: every party's vector added up and decrypted collectively (flooded).

    ``width`` None: the first party's, which every other party must match.
    """
    replies = await crypto.rc.gather(EncryptedSum)
    width = width if width is not None else replies[crypto.rc.parties[0]].width
    for party, reply in replies.items():
        if reply.width != width:
            raise ProtocolError(f"party {party} sent {reply.width} values, expected {width}")
    total = await crypto.add_all({p: r.values for p, r in replies.items()})
    return await crypto.decrypt_sum(total, width)


async def send_sum(crypto: PartyCrypto, values: np.ndarray) -> None:
    """Party: this party's ``values`` to the server, as its next signed sum upload."""
    upload = await crypto.encrypt_for_sum(np.asarray(values, dtype=np.float64))
    await crypto.rc.send(SERVER, EncryptedSum(values=upload, width=len(values)))


async def exact_sum(crypto: ServerCrypto, exponents: Callable[[int], np.ndarray]
                    ) -> np.ndarray:
    """Server: the sum of the parties' vectors sent by :func:`send_exact_sum` at the
    public powers of two 2^``exponents(width)`` (one per value; ``width`` the first
    party's, which every party must match), decrypted collectively (flooded) as integers
    and scaled back.  Each value is off by the flooding alone (:func:`exact_sum_error`),
    whatever the other values hold: no slot decoding couples them."""
    replies = await crypto.rc.gather(EncryptedCoefficients)
    width = agreed_width(replies)
    powers = np.asarray(exponents(width), dtype=int)
    if len(powers) != width:
        raise ProtocolError(f"the parties sent {width} values, expected {len(powers)}")
    uploads = await crypto.pool_coefficients({p: r.values for p, r in replies.items()})
    integers = await crypto.decrypt_coefficients(uploads, len(powers))
    return np.array([math.ldexp(float(v), -int(e)) for v, e in zip(integers, powers,
                                                                   strict=True)])


async def send_exact_sum(crypto: PartyCrypto, rows: np.ndarray, exponents: np.ndarray
                         ) -> None:
    """Party: the column sums of ``rows`` (one row per record, NaN for an absent value)
    at the public powers of two 2^``exponents`` (one per column), as this party's next
    coefficient upload: each value times its power of two, rounded to an integer, and
    the integers summed exactly (:func:`exact_column_sums`)."""
    integers = exact_column_sums(crypto.ckks, rows, exponents)
    upload = await crypto.encrypt_coefficients(integers)
    await crypto.rc.send(SERVER, EncryptedCoefficients(values=upload, width=len(integers)))


def exact_column_sums(context: ckks.CkksContext, rows: np.ndarray, exponents: np.ndarray
                      ) -> list[int]:
    """Per column, Σ over the rows of round(value · 2^exponent), in exact integers: the
    pooled sum of every party's is then the same sum over the pooled rows, however they
    are split (no party's float64 rounding of its own sum reaches the server).
    InputError, before anything is encrypted, if a value or a sum would pass what a
    coefficient holds."""
    values = np.nan_to_num(np.asarray(rows, dtype=np.float64), nan=0.0)
    with np.errstate(over="ignore"):
        scaled = np.rint(np.ldexp(values, np.asarray(exponents, dtype=int)))
    capacity = ckks.coefficient_capacity(context)
    if not np.all(np.isfinite(scaled) & (np.abs(scaled) < capacity)):
        raise _beyond_capacity(capacity)
    sums = [sum(map(int, column)) for column in scaled.T]
    if any(abs(total) >= capacity for total in sums):
        raise _beyond_capacity(capacity)
    return sums


def _beyond_capacity(capacity: int) -> InputError:
    return InputError("a value times the server's power of two would pass what a "
                      f"coefficient upload holds (2^{capacity.bit_length() - 1}): refused")


def exact_sum_error(context: ckks.CkksContext, parties: int, options: FitOptions) -> float:
    """A bound on what flooding adds to each integer of an exact sum: 8σ of the P
    parties' noise per coefficient."""
    flooding = ckks.CoefficientFlooding(context.preset.ring_dim, parties, parties,
                                        options.flooding_bits, options.flooding_decryptions)
    return ckks.flooding.TAIL * math.sqrt(parties) * flooding.sigma


def noise_bound(context: ckks.CkksContext, parties: int, options: FitOptions) -> float:
    """What flooding may add to each value of a decrypted pooled sum, in its units: 8σ of
    the P shares' noise per slot (a sum upload is encoded at scale Δ²)."""
    flooding = ckks.Flooding(context.preset.ring_dim, parties, parties,
                             options.flooding_bits, options.flooding_decryptions)
    scale = 2.0 ** (2 * context.preset.scaling_mod_bits)
    return ckks.flooding.TAIL * math.sqrt(parties) * flooding.slot_sigma(scale)


@dataclass(frozen=True)
class CountPacking:
    """Counts packed several to a slot, so a round's counts fit fewer slots: when every
    pooled count lies at or below a public ``bound`` (n_g), counts become base-2^b digits
    of one integer below 2^:data:`PACKED_BITS` (b the bits of ``bound``), and the sum of
    the parties' packed slots is the packing of the pooled counts, digit by digit (no
    digit reaches 2^b, so none carries).  The server learns the pooled counts and nothing
    else, as unpacked; only fewer ciphertext slots carry them."""

    digit_bits: int
    per_slot: int

    @classmethod
    def for_bound(cls, bound: float) -> CountPacking:
        """The packing for pooled counts at most ``bound`` (the largest n_g)."""
        bits = max(1, int(bound).bit_length())
        return cls(bits, max(1, PACKED_BITS // bits))

    def capacity(self, slots: int) -> int:
        """Counts that ``slots`` slots hold."""
        return slots * self.per_slot

    def slots(self, counts: int) -> int:
        """Slots that ``counts`` counts take."""
        return -(-counts // self.per_slot)

    def pack(self, counts: np.ndarray) -> np.ndarray:
        """Counts (each below 2^b) as slot values, ``per_slot`` digits each, lowest first."""
        digits = np.zeros(self.slots(len(counts)) * self.per_slot, dtype=np.int64)
        digits[:len(counts)] = np.asarray(counts, dtype=np.int64)
        if digits.min(initial=0) < 0 or digits.max(initial=0) >> self.digit_bits:
            raise ProtocolError(f"a count outside [0, 2^{self.digit_bits}): the pooled "
                                "count the server announced is below this party's own")
        weights = np.left_shift(1, self.digit_bits * np.arange(self.per_slot, dtype=np.int64))
        return (digits.reshape(-1, self.per_slot) @ weights).astype(np.float64)

    def unpack(self, values: np.ndarray, counts: int) -> np.ndarray:
        """The first ``counts`` counts of decrypted, pooled slot ``values``."""
        packed = np.rint(np.asarray(values, dtype=np.float64)).astype(np.int64)
        shifts = self.digit_bits * np.arange(self.per_slot, dtype=np.int64)
        digits = (packed[:, None] >> shifts) & ((1 << self.digit_bits) - 1)
        return digits.ravel()[:counts].astype(np.float64)
