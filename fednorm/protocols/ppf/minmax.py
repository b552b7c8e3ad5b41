"""PPF MinMax (paper Algorithm 5): the pooled per-feature min and max under multiparty CKKS.

Step by step with Algorithm 5:

1. collective key generation, with relinearization and :func:`minmax_rotations` keys
   (line 1; :func:`setup_arguments`);
2. each party computes its local min and max per feature (lines 2–7) and checks them
   against the agreed bound V_abs (line 13, ``FitOptions.vabs``) *before* encrypting
   anything: a value beyond it is an :class:`InputError`;
3. each party scales into [−1, 1] by V_abs and encrypts (lines 8–10, 15: the scaling
   happens before encryption — V_abs is public — which saves the server a level);
4. the server compares (lines 16–22) — a tree instead of the paper's chain (below);
   collective bootstrapping refreshes the comparison whenever its levels run out;
5. the server restores the scale (line 23: in plaintext after decryption, exact) and the
   parties decrypt collectively (lines 25–26); the result is broadcast and every party
   scales locally (line 27).

**Packing.** A party sends max and −min of every feature in one vector (so one max
computes both: min = −max(−min)), in block ``p mod 16`` of the slots; the server adds
the parties' ciphertexts into one that holds every party side by side. Empty blocks and
features a party has no values of hold the neutral −1.

**Tree.** ⌈log2 P⌉ rounds instead of the paper's P − 1 comparisons: round k compares the
packed ciphertext with itself rotated by 2^k blocks (:func:`~fednorm.engine.ckks.fold_maximum`),
so every pair of a round is compared at once, in SIMD. More than 16 parties fill
several packed ciphertexts, compared pairwise first. Before decryption a mask keeps
only block 0: the other blocks hold maxima over subsets of the parties, which must not
be revealed.

**Passes (precision).** One comparison errs by at most ``plan.error_bound`` of the
interval's half-width (:mod:`~fednorm.engine.ckks.compare`), so after R rounds the
decrypted max is within e = R·error_bound·V_abs *below* the true one. The next pass
zooms in: the server sends the interval [estimate − e/4, estimate + e] per slot, the
parties re-encrypt mapped onto it (values below it clipped to its bottom — they cannot
be the maximum), and the error shrinks by about the same factor again
(:func:`error_bound`). This is what makes values that are tiny relative to V_abs (the
paper's "small-valued" case) come out precisely. Each pass reveals a coarser copy of the
result and nothing else: a value above the interval would mean the global max lies
above it, and the party refuses the pass.

Values are encrypted at magnitude :data:`HEADROOM` instead of 1: CKKS noise is absolute,
so this buys 2^7 in precision (decryption error 1.5e-11 instead of 1.7e-9 of V_abs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import openfhe

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    agreed_width,
    check_party_data,
    register,
    require_within_vabs,
)
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    serve_until,
    setup_party,
    setup_server,
)
from fednorm.protocols.normalizers import MinMaxNormalizer
from fednorm.protocols.plain.minmax import local_extremes

BLOCKS = 16
"""Parties side by side in one packed ciphertext (slot blocks)."""

HEADROOM = 2.0**7
"""Magnitude the parties encrypt at: CKKS noise is absolute, so larger values keep more
digits; 2^7 keeps every intermediate (up to 2·HEADROOM) far below the modulus."""

DEFAULT_BITS = 12
DEFAULT_PASSES = 2
NOISE_MARGIN = 2.0**-24
"""CKKS noise allowance per round, relative to a pass's interval: a collective bootstrap
of the values costs ~6e-9 of it (measured), a product ~1e-11."""


# -- messages -----------------------------------------------------------------------------
@message("ppf_minmax.encrypted_extremes")
class EncryptedExtremes(Message):
    """A party's max and −min per feature, mapped onto the pass's interval, encrypted in
    its slot block: one ciphertext per chunk of features."""

    chunks: list[openfhe.Ciphertext]
    width: int


@message("ppf_minmax.window")
class MinMaxWindow(Message):
    """The next pass's interval per slot (max of each feature, then −min of each)."""

    low: np.ndarray
    high: np.ndarray


@message("ppf_minmax.result")
class MinMaxExtremes(Message):
    min: np.ndarray
    max: np.ndarray


# -- settings, bounds, layout ---------------------------------------------------------------
@dataclass(frozen=True)
class MinMaxSettings:
    """Precision knobs, from ``FitOptions.minmax_bits`` (per comparison, see
    :func:`~fednorm.engine.ckks.plan_compare`) and ``FitOptions.minmax_passes``."""

    bits: float = DEFAULT_BITS
    passes: int = DEFAULT_PASSES

    @classmethod
    def from_options(cls, options: FitOptions) -> MinMaxSettings:
        bits = DEFAULT_BITS if options.minmax_bits is None else options.minmax_bits
        passes = DEFAULT_PASSES if options.minmax_passes is None else options.minmax_passes
        if not isinstance(passes, int) or isinstance(passes, bool) or not 1 <= passes <= 4:
            raise InputError(f"minmax_passes must be an integer in 1..4, got {passes!r}")
        if not isinstance(bits, (int, float)) or isinstance(bits, bool):
            raise InputError(f"minmax_bits must be a number, got {bits!r}")
        return cls(float(bits), passes)

    def __post_init__(self) -> None:
        ckks.plan_compare(self.bits)  # an impossible precision fails here, not mid-protocol

    @property
    def plan(self) -> ckks.ComparePlan:
        return ckks.plan_compare(self.bits)


def error_bound(options: FitOptions, parties: int) -> float:
    """Guaranteed |error| of the result relative to V_abs: the last pass's comparison
    bound (plus noise) over the width its window has after the earlier passes."""
    settings = MinMaxSettings.from_options(options)
    rounds, comparison = _rounds(parties), settings.plan.error_bound
    window = Window(np.array([-1.0]), np.array([1.0]))
    for _ in range(settings.passes - 1):
        window = window.narrowed(np.zeros(1), rounds, comparison)
    return float(rounds * (comparison + NOISE_MARGIN) * window.half[0])


def minmax_rotations(preset: str) -> tuple[int, ...]:
    """Rotation keys PPF MinMax needs: one, by a block (whatever the number of parties,
    since parties make their shares before anyone knows how many there are). Rotations
    by 2, 4, 8 blocks are composed of it: 11 extra key-switches per pass at 9–16
    parties cost less than 3 more keys (each a 25 MB share per party at ring 2^15,
    the lead's forwarded to every party)."""
    return (ckks.get_preset(preset).slots // BLOCKS,)


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Keyword arguments for ``setup_server`` / ``setup_party`` before PPF MinMax."""
    return {"relinearize": True, "rotations": minmax_rotations(options.preset)}


def vabs_vector(options: FitOptions, width: int) -> np.ndarray:
    """The agreed per-feature bound V_abs (one value for all features, or one each)."""
    if options.vabs is None:
        raise InputError("PPF MinMax needs FitOptions(vabs=...): a bound on |x| every "
                         "party agrees on, one value for all features or one per feature")
    vabs = np.asarray(options.vabs, dtype=np.float64).ravel()
    if vabs.size not in (1, width):
        raise InputError(f"vabs has {vabs.size} values for {width} features")
    if not np.all(np.isfinite(vabs) & (vabs > 0)):
        raise InputError("vabs values must be positive and finite")
    return np.broadcast_to(vabs, (width,)).copy()


def check_minmax_input(X: np.ndarray, options: FitOptions) -> np.ndarray:
    """Reject, before any encryption, data beyond V_abs (or a missing V_abs)."""
    X = check_party_data(X)
    vabs = vabs_vector(options, X.shape[1])
    MinMaxSettings.from_options(options)
    require_within_vabs(X, vabs)
    return X


@dataclass(frozen=True)
class Layout:
    """Where a party's values sit in the slots: block ``position``, one chunk of features
    per ciphertext, each chunk as [max of its features, −min of its features]."""

    slots: int
    width: int

    @property
    def block(self) -> int:
        return self.slots // BLOCKS

    @property
    def per_chunk(self) -> int:
        return self.block // 2

    @property
    def chunks(self) -> int:
        return math.ceil(self.width / self.per_chunk)

    def features(self, chunk: int) -> slice:
        return slice(chunk * self.per_chunk, min(self.width, (chunk + 1) * self.per_chunk))

    def take(self, top: np.ndarray, chunk: int) -> np.ndarray:
        """The chunk's slot values from a full [max..., −min...] vector of 2·width."""
        sl = self.features(chunk)
        return np.concatenate([top[:self.width][sl], top[self.width:][sl]])

    def put(self, parts: list[np.ndarray]) -> np.ndarray:
        """Inverse of :meth:`take` over all chunks."""
        halves = [np.split(part, 2) for part in parts]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves])

    def place(self, position: int, values: np.ndarray) -> np.ndarray:
        """A slot vector with ``values`` in block ``position`` (zeros elsewhere)."""
        out = np.zeros(self.block * (position + 1))
        out[self.block * position:self.block * position + values.size] = values
        return out

    def padding(self, occupied: int) -> np.ndarray:
        """The neutral −HEADROOM in every block from ``occupied`` on."""
        out = np.full(self.slots, -HEADROOM)
        out[:self.block * occupied] = 0.0
        return out

    def chunk_slots(self, chunk: int) -> int:
        """Slots a chunk uses in its block: max and −min of each of its features."""
        features = self.features(chunk)
        return 2 * (features.stop - features.start)

    def mask(self, chunk: int) -> np.ndarray:
        """1 on the chunk's slots of block 0, 0 elsewhere."""
        return (np.arange(self.slots) < self.chunk_slots(chunk)).astype(np.float64)


@dataclass(frozen=True)
class Window:
    """Per slot, the interval [low, high] a pass maps onto [−HEADROOM, HEADROOM]."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def initial(cls, vabs: np.ndarray) -> Window:
        bound = np.concatenate([vabs, vabs])
        return cls(-bound, bound)

    @property
    def half(self) -> np.ndarray:
        return (self.high - self.low) / 2

    def encode(self, top: np.ndarray) -> np.ndarray:
        """Map values onto [−H, H]; below the interval (or absent, −inf) → −H, the bottom.

        A value above it contradicts the previous pass's bound: the server asked for an
        interval that excludes the global max, so the pass is refused.
        """
        if np.any(top > self.high):
            raise ProtocolError("the server's interval lies below a local extreme")
        y = HEADROOM * ((np.maximum(top, self.low) - self.low) / self.half - 1.0)
        return np.where(top >= self.low, y, -HEADROOM)

    def decode(self, y: np.ndarray) -> np.ndarray:
        return self.low + (y / HEADROOM + 1.0) * self.half

    def narrowed(self, estimate: np.ndarray, rounds: int, error_bound: float) -> Window:
        """[estimate − e/4, estimate + e], e the error bound of this pass: the true
        maximum lies in [estimate, estimate + e] (comparisons err only downwards, by at
        most ``error_bound`` of the half-width per round; plus CKKS noise either way),
        clear of the bottom where clipped and absent values sit, so it never nearly ties
        with them (their gap is at least a fifth of the window)."""
        noise = rounds * NOISE_MARGIN * self.half
        error = rounds * error_bound * self.half + noise
        return Window(estimate - error / 4 - noise, estimate + error)

    def received(self, msg: MinMaxWindow) -> Window:
        """Check a window from the server: right shape, finite, not empty.

        Any window reveals at most a function of the global max (clipping happens
        locally; a refused pass says the global max lies above the window).
        """
        n = self.low.size
        low = as_float_vector(msg.low, n, "window low")
        high = as_float_vector(msg.high, n, "window high")
        if not (np.all(np.isfinite(low) & np.isfinite(high)) and np.all(low < high)):
            raise ProtocolError("the server sent an invalid interval")
        return Window(low, high)


def local_top(X: np.ndarray) -> np.ndarray:
    """[max of each feature, −min of each feature]; −inf where the party has no values."""
    low, high = local_extremes(X)
    return np.concatenate([high, -low])


def extremes(top: np.ndarray, vabs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) from the decrypted [max, −min]; a feature nobody has values of comes out
    as min = V_abs, max = −V_abs (every slot neutral) and is reported NaN."""
    width = vabs.size
    high, low = top[:width], -top[width:]
    empty = low - high > vabs
    mid = (low + high) / 2
    crossed = low > high  # a lone value: both estimates within noise of it
    low, high = np.where(crossed, mid, low), np.where(crossed, mid, high)
    return np.where(empty, np.nan, low), np.where(empty, np.nan, high)


# -- server ---------------------------------------------------------------------------------
async def minmax_server(crypto: ServerCrypto, width: int | None, options: FitOptions
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The server's side of PPF MinMax after collective setup (by the caller, with
    :func:`setup_arguments`): returns and broadcasts (min, max) per feature.

    ``width`` None: the first party's number of features, which every party must match.
    """
    rc = crypto.rc
    settings = MinMaxSettings.from_options(options)
    _check_party_ids(rc.parties)
    with rc.subprotocol("minmax"):
        window = None
        for pass_ in range(settings.passes):
            replies = await rc.gather(EncryptedExtremes)
            width = agreed_width(replies, width)
            layout = Layout(crypto.ckks.slots, width)
            if window is None:
                window = Window.initial(vabs_vector(options, width))
            estimate = window.decode(await _global_top(crypto, layout, replies, settings))
            if pass_ + 1 < settings.passes:
                window = window.narrowed(estimate, _rounds(len(rc.parties)),
                                         settings.plan.error_bound)
                await rc.broadcast(MinMaxWindow(low=window.low, high=window.high))
        low, high = extremes(estimate, vabs_vector(options, width))
        await rc.broadcast(MinMaxExtremes(min=low, max=high))
    return low, high


def _check_party_ids(parties: list[int]) -> None:
    if parties != list(range(1, len(parties) + 1)):
        raise ProtocolError(f"PPF MinMax needs parties numbered 1..P, got {parties}")


def _rounds(parties: int) -> int:
    """Comparison rounds (across packed ciphertexts, then inside one); at least one, for
    the noise of a single party's pass."""
    groups = math.ceil(parties / BLOCKS)
    return max(1, math.ceil(math.log2(groups)) + _fold_steps(parties))


def _fold_steps(parties: int) -> int:
    return math.ceil(math.log2(min(parties, BLOCKS)))


async def _global_top(crypto: ServerCrypto, layout: Layout,
                      replies: dict[int, EncryptedExtremes], settings: MinMaxSettings
                      ) -> np.ndarray:
    """Decrypted max over the parties of every slot (scaled), chunk by chunk."""
    parts = []
    for chunk in range(layout.chunks):
        packed = await _packed(crypto, layout, replies, chunk)
        top = await _maximum_of_blocks(crypto, layout, packed, settings.plan)
        masked = await crypto.rc.run_sync(crypto.ckks.mul, top, layout.mask(chunk))
        parts.append(await crypto.decrypt(masked, layout.chunk_slots(chunk)))
    return layout.put(parts)


async def _packed(crypto: ServerCrypto, layout: Layout, replies: dict[int, EncryptedExtremes],
                  chunk: int) -> list[openfhe.Ciphertext]:
    """One ciphertext per group of 16 parties, every party in its block, the rest neutral."""
    for party, reply in replies.items():
        if not isinstance(reply.chunks, list) or len(reply.chunks) != layout.chunks:
            raise ProtocolError(f"party {party} sent {_count(reply.chunks)} ciphertexts, "
                                f"expected {layout.chunks}")
    parties = sorted(replies)
    groups = [parties[i:i + BLOCKS] for i in range(0, len(parties), BLOCKS)]
    packed = []
    for group in groups:
        ct = await crypto.add_all({p: replies[p].chunks[chunk] for p in group})
        if len(group) < BLOCKS:
            ct = crypto.ckks.add(ct, layout.padding(len(group)))
        packed.append(ct)
    return packed


def _count(chunks: object) -> object:
    return len(chunks) if isinstance(chunks, list) else type(chunks).__name__


async def _maximum_of_blocks(crypto: ServerCrypto, layout: Layout,
                             packed: list[openfhe.Ciphertext], plan: ckks.ComparePlan
                             ) -> openfhe.Ciphertext:
    """Block 0 gets the max over all parties: pairwise across groups, then the fold."""
    context, refresh = crypto.ckks, crypto.bootstrap
    top = await ckks.tree_maximum(context, packed, refresh, plan, bound=HEADROOM)
    steps = _fold_steps(len(crypto.rc.parties))
    return await ckks.fold_maximum(context, top, layout.block, steps, refresh, plan,
                                   bound=HEADROOM, keys=(layout.block,))


# -- party ----------------------------------------------------------------------------------
async def minmax_party(crypto: PartyCrypto, X: np.ndarray, options: FitOptions
                       ) -> tuple[np.ndarray, np.ndarray]:
    """A party's side of PPF MinMax after collective setup: returns (min, max)."""
    X = check_minmax_input(X, options)
    rc = crypto.rc
    settings = MinMaxSettings.from_options(options)
    width = X.shape[1]
    layout = Layout(crypto.ckks.slots, width)
    top = local_top(X)
    window = Window.initial(vabs_vector(options, width))
    position = (rc.me - 1) % BLOCKS
    with rc.subprotocol("minmax"):
        for pass_ in range(settings.passes):
            scaled = window.encode(top)
            chunks = [await crypto.encrypt(layout.place(position, layout.take(scaled, c)))
                      for c in range(layout.chunks)]
            await rc.send(SERVER, EncryptedExtremes(chunks=chunks, width=width))
            last = pass_ + 1 == settings.passes
            reply = await serve_until(crypto, MinMaxExtremes if last else MinMaxWindow,
                                      decryptions=layout.chunks)
            if not last:
                window = window.received(reply)
    return (as_float_vector(reply.min, width, "global min"),
            as_float_vector(reply.max, width, "global max"))


# -- the registered protocol ------------------------------------------------------------------
async def server(rc: RoleContext, options: FitOptions) -> MinMaxNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    low, high = await minmax_server(crypto, None, options)
    return MinMaxNormalizer(low, high)


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> MinMaxNormalizer:
    X = check_minmax_input(X, options)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options))
    low, high = await minmax_party(crypto, X, options)
    return MinMaxNormalizer(low, high)


register("minmax", "mhe", server, party)
