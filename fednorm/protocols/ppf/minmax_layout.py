"""Where PPF MinMax's values sit in the slots, and how each pass maps them.

A party sends max and −min of every feature in one vector (so one max computes both:
min = −max(−min)), in block ``p mod`` :data:`BLOCKS` of the slots (:class:`Layout`);
each pass maps the values of its interval onto [−HEADROOM, HEADROOM] (:class:`Window`),
and the next pass zooms in on the last estimate (:meth:`Window.narrowed`), which is
what bounds the result's error (:func:`error_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.ckks.presets import CkksPreset
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import as_float_vector
from fednorm.protocols.base import FitOptions
from fednorm.protocols.plain.minmax import local_extremes
from fednorm.protocols.ppf import checks, noise
from fednorm.protocols.ppf.checks import BlockLayout, compare_plan

BLOCKS = 16
"""Parties side by side in one packed ciphertext (slot blocks)."""

HEADROOM = 2.0**7
"""Magnitude the parties encrypt at: CKKS noise is absolute, so larger values keep more
digits; 2^7 keeps every intermediate (up to 2·HEADROOM) far below the modulus."""

DEFAULT_BITS = 12
DEFAULT_PASSES = 2
NOISE_MARGIN = 2.0**-24
FLOODING_TAIL = 10.0  # the flooding of a pass's decryption exceeds 10 σ with p < 1e-22
"""CKKS noise allowance per round, relative to a pass's interval: a collective bootstrap
of the values costs ~6e-9 of it (measured), a product ~1e-11."""


@dataclass(frozen=True)
class MinMaxSettings:
    """Precision knobs, from ``FitOptions.minmax_bits`` (per comparison, see
    :func:`~fednorm.engine.ckks.plan_compare`) and ``FitOptions.minmax_passes``."""

    plan: ckks.ComparePlan
    passes: int = DEFAULT_PASSES

    @classmethod
    def from_options(cls, options: FitOptions) -> MinMaxSettings:
        passes = DEFAULT_PASSES if options.minmax_passes is None else options.minmax_passes
        if not isinstance(passes, int) or isinstance(passes, bool) or not 1 <= passes <= 4:
            raise InputError(f"minmax_passes must be an integer in 1..4, got {passes!r}")
        return cls(compare_plan(options.minmax_bits, DEFAULT_BITS, "minmax_bits"), passes)


def flooded_sigma(preset: CkksPreset, parties: int, options: FitOptions) -> float:
    """The standard deviation the parties' flooding adds to a pass's decrypted maxima, in
    the window's units (±HEADROOM): the next window must hold the maximum despite it."""
    declared = noise.declared(noise.MINMAX_PASS, preset)
    return noise.fused_sigma(declared, preset, parties, options)


def error_bound(options: FitOptions, parties: int) -> float:
    """|error| of the result relative to V_abs: the last pass's comparison bound, CKKS
    noise and flooding (10 σ) over the width its window has after the earlier passes."""
    settings = MinMaxSettings.from_options(options)
    rounds, comparison = comparison_rounds(parties), settings.plan.error_bound
    flooded = flooded_sigma(ckks.get_preset(options.preset), parties, options)
    window = Window(np.array([-1.0]), np.array([1.0]))
    for _ in range(settings.passes - 1):
        window = window.narrowed(np.zeros(1), rounds, comparison, flooded)
    noise_part = rounds * NOISE_MARGIN + FLOODING_TAIL * flooded / HEADROOM
    return float((rounds * comparison + noise_part) * window.half[0])


def comparison_rounds(parties: int) -> int:
    """Comparison rounds (across packed ciphertexts, then inside one); at least one, for
    the noise of a single party's pass."""
    groups = math.ceil(parties / BLOCKS)
    return max(1, math.ceil(math.log2(groups)) + fold_steps(parties))


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """Keyword arguments for ``setup_server`` / ``setup_party`` before PPF MinMax.

    One rotation key, by a block (whatever the number of parties, since parties make
    their shares before anyone knows how many there are). Rotations by 2, 4, 8 blocks
    are composed of it: 11 extra key-switches per pass at 9–16 parties cost less than 3
    more keys (each a 25 MB share per party at ring 2^15, the lead's forwarded to every
    party)."""
    return checks.setup_arguments(options, BLOCKS)


def block_position(party: int) -> int:
    """The slot block of party ``party`` (numbered from 1) in its packed ciphertext."""
    return (party - 1) % BLOCKS


def party_groups(parties: list[int]) -> list[list[int]]:
    """The parties packed into one ciphertext together, :data:`BLOCKS` at a time."""
    return [parties[i:i + BLOCKS] for i in range(0, len(parties), BLOCKS)]


def fold_steps(parties: int) -> int:
    """Rounds of the fold inside one packed ciphertext (its blocks pairwise)."""
    return math.ceil(math.log2(min(parties, BLOCKS)))


@dataclass(frozen=True)
class Layout(BlockLayout):
    """Where a party's values sit in the slots: block ``position``, one chunk of features
    per ciphertext, each chunk as [max of its features, −min of its features]."""

    @property
    def blocks(self) -> int:
        return BLOCKS

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
        return self.placed({position: values}, self.block * (position + 1))

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
        return self.first(self.chunk_slots(chunk))


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

    def narrowed(self, estimate: np.ndarray, rounds: int, error_bound: float,
                 flooded: float = 0.0) -> Window:
        """[estimate − e/4, estimate + e], e the error bound of this pass: the true
        maximum lies in [estimate, estimate + e] (comparisons err only downwards, by at
        most ``error_bound`` of the half-width per round; plus CKKS noise and the
        decryption's flooding, of std ``flooded`` in window units, either way), clear of
        the bottom where clipped and absent values sit, so it never nearly ties with them
        (their gap is at least a fifth of the window)."""
        noise = (rounds * NOISE_MARGIN + FLOODING_TAIL * flooded / HEADROOM) * self.half
        error = rounds * error_bound * self.half + noise
        return Window(estimate - error / 4 - noise, estimate + error)

    def received(self, low: object, high: object) -> Window:
        """Check a window from the server: right shape, finite, not empty.

        Any window reveals at most a function of the global max (clipping happens
        locally; a refused pass says the global max lies above the window).
        """
        n = self.low.size
        low = as_float_vector(low, n, "window low")
        high = as_float_vector(high, n, "window high")
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
