"""The CKKS context every role rebuilds from a preset name: encoding, arithmetic, bytes.

Thread safety: OpenFHE releases the GIL in its heavy calls (measured: a Python thread
stalls at most 6 ms while 100+ ms EvalMult / decryption-share calls run), so protocols
may run them in worker threads. Methods here touch only their arguments, except the key
installers, which write OpenFHE's process-wide key maps under a module lock: install keys
during setup, before evaluation threads use them. OpenMP already uses every core inside
each call, so on a small machine use threads *or* OpenMP (OMP_NUM_THREADS), not both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import openfhe

from fednorm.engine import inprocess
from fednorm.engine.ckks import ring, serial
from fednorm.engine.ckks.levels import (
    LevelBudgetError,
    consumed_levels,
    levels_left,
    require_consumed_at_most,
)
from fednorm.engine.ckks.presets import CkksPreset, get_preset
from fednorm.engine.errors import InputError, ProtocolError

Ciphertext = openfhe.Ciphertext
Operand = openfhe.Ciphertext | np.ndarray | float | int

SUM_TOWERS = 4  # towers of a sum upload: holds Δ²·|x| for |x| up to ~2^55
PRODUCT_TOWERS = 2  # towers of a product of bit uploads when decrypted (scale Δ)
COEFFICIENT_TOWERS = 3  # towers of a coefficient upload (:mod:`.masking`): Q ≈ 2^160
MAX_SUM_VALUE = 2**50  # per value of a sum upload (P parties' sum stays below 2^55)
_SMALLEST_ENCODABLE = 2.0**-38  # measured: OpenFHE 1.6.1 cannot encode max |x| below this
KEY_MAP_LOCK = threading.Lock()  # OpenFHE's eval-key maps are process-wide std::maps
RECENT_BYTES = 256 * 2**20  # framed bytes of the parsed objects kept for in-process readers
KEPT_RESULTS = 64  # results of computations kept for the other roles of an in-process run


def _build_crypto_context(preset: CkksPreset) -> openfhe.CryptoContext:
    params = openfhe.CCParamsCKKSRNS()
    params.SetRingDim(preset.ring_dim)
    params.SetSecurityLevel(getattr(openfhe, preset.security))
    params.SetMultiplicativeDepth(preset.depth)
    params.SetScalingModSize(preset.scaling_mod_bits)
    params.SetFirstModSize(preset.first_mod_bits)
    params.SetScalingTechnique(getattr(openfhe, preset.scaling_technique))
    params.SetKeySwitchTechnique(getattr(openfhe, preset.key_switching))
    params.SetSecretKeyDist(getattr(openfhe, preset.secret_key_dist))
    params.SetInteractiveBootCompressionLevel(
        getattr(openfhe.CompressionLevel, preset.boot_compression))
    params.SetBatchSize(preset.slots)
    cc = openfhe.GenCryptoContext(params)
    for feature in preset.features:
        cc.Enable(getattr(openfhe, feature))
    if cc.GetRingDimension() != preset.ring_dim:
        raise InputError(f"preset {preset.name!r}: OpenFHE chose ring dimension "
                         f"{cc.GetRingDimension()}, not {preset.ring_dim}")
    return cc


class CkksContext:
    """A multiparty CKKS context built from a preset (or its name), in any process.

    Arithmetic helpers check levels *before* they compute (see :mod:`.levels`), so a
    result that OpenFHE would silently get wrong becomes a :class:`LevelBudgetError`.
    """

    def __init__(self, preset: CkksPreset | str) -> None:
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        self.raw = _build_crypto_context(self.preset)
        self._templates = serial.templates_for(self.raw, self.preset)
        self._recent: dict[tuple[str, bytes | None], tuple[bytes, Any]] = {}
        self._recent_bytes = 0
        self._recent_lock = threading.Lock()
        self._computed: dict[tuple[object, ...], Any] = {}
        self._computed_lock = threading.Lock()
        inprocess.keep_for_runs(self)

    def __repr__(self) -> str:
        return f"CkksContext({self.preset.name!r})"

    # -- shape ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Real values one ciphertext holds."""
        return self.preset.slots

    @property
    def depth(self) -> int:
        """Multiplicative depth: levels a fresh ciphertext may consume before decryption."""
        return self.preset.depth

    @property
    def level_budget(self) -> int:
        """Levels between collective bootstraps (depth - 4 with SLACK + FLEXIBLEAUTO)."""
        return self.preset.level_budget

    def consumed(self, ct: Ciphertext) -> int:
        """Levels ``ct`` has consumed (a pending rescale counts)."""
        return consumed_levels(ct)

    def levels_left(self, ct: Ciphertext) -> int:
        """Levels ``ct`` may still consume before it must be collectively bootstrapped."""
        return levels_left(ct, self.level_budget)

    def depth_left(self, ct: Ciphertext) -> int:
        """Multiplications ``ct`` can still take at all (then it can only be decrypted)."""
        return self.depth - consumed_levels(ct)

    @property
    def moduli(self) -> tuple[int, ...]:
        """The ciphertext moduli q_0, q_1, … of the towers of a fresh ciphertext."""
        return ring.tower_moduli(self.raw, self.preset.fingerprint, self.preset.ring_dim,
                                 self.preset.towers)

    def towers(self, ct: Ciphertext) -> int:
        """RNS towers (moduli) ``ct`` still carries."""
        return self.preset.towers - ct.GetLevel()

    # -- encoding ------------------------------------------------------------------------
    def encode(self, values: np.ndarray | Sequence[float], level: int = 0,
               degree: int = 1) -> openfhe.Plaintext:
        """Pack real ``values`` into a plaintext, zero-padded to all slots, at scale
        Δ^``degree`` (Δ ≈ 2^50; degree 2 for sums, see :meth:`encrypt_sum`).

        OpenFHE refuses to encode a vector whose largest magnitude is below 2^-38
        ("Scaling factor too small"); such values are below CKKS resolution at scale
        2^50 anyway (noise ~1e-11 after one operation), so they are encoded as zeros.
        """
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1 or arr.size > self.slots:
            raise InputError(f"need a 1-D array of at most {self.slots} values, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise InputError("values must be finite")
        padded = np.zeros(self.slots)
        if arr.size and np.abs(arr).max() >= _SMALLEST_ENCODABLE:
            padded[:arr.size] = arr
        return self.raw.MakeCKKSPackedPlaintext(padded, degree, level)

    def encrypt(self, public_key: openfhe.PublicKey, values: np.ndarray,
                level: int = 0, degree: int = 1) -> Ciphertext:
        """Encrypt ``values`` (padded to all slots) under ``public_key``.

        ``level`` > 0 encrypts with that many towers dropped, for a ciphertext the server
        will multiply only a few times (see :meth:`upload_level`): smaller and faster to
        make, send and parse (paper preset: level 7 is 2.6 MB instead of 6.3 MB), with
        the same absolute noise as a fresh full-level encryption.  ``degree`` 2 encodes at
        scale Δ² (its first product rescales it: a level more, with the noise of that
        rescale's rounding instead of the encryption's).
        """
        self.check_same_context(public_key, "public key")
        if not 0 <= level < self.depth:
            raise InputError(f"encryption level {level} outside [0, {self.depth - 1}]")
        return self.raw.Encrypt(public_key, self.encode(values, level, degree))

    @property
    def sum_level(self) -> int:
        """The level of sum uploads: :data:`SUM_TOWERS` towers left."""
        return self.preset.towers - SUM_TOWERS

    @property
    def coefficient_level(self) -> int:
        """The level of coefficient uploads (:mod:`.masking`): :data:`COEFFICIENT_TOWERS`
        towers left."""
        return self.preset.towers - COEFFICIENT_TOWERS

    def encrypt_sum(self, public_key: openfhe.PublicKey, values: np.ndarray) -> Ciphertext:
        """Encrypt values the server only adds up and decrypts (counts, sums): at scale
        Δ² ≈ 2^100 with :data:`SUM_TOWERS` towers.

        Fresh encryption noise is a fixed amount in the ring (~2^11 per coefficient), so
        at scale 2^100 it sits ~2^-82 below the values: the decryption's flooding noise
        (:mod:`.flooding`), √(12τ)·2^(s/2) times larger, costs no precision that matters.
        |values| must stay within :data:`MAX_SUM_VALUE` (OpenFHE fails to encode 2^60).
        """
        arr = np.asarray(values, dtype=np.float64)
        if np.abs(arr).max(initial=0.0) > MAX_SUM_VALUE:
            raise InputError(f"a value to sum exceeds 2^{MAX_SUM_VALUE.bit_length() - 1} "
                             f"({float(MAX_SUM_VALUE):.3g}), the largest a sum upload encodes")
        self.check_same_context(public_key, "public key")
        return self.raw.Encrypt(public_key, self.encode(arr, self.sum_level, degree=2))

    def upload_level(self, products: int) -> int:
        """The deepest level to encrypt at for a ciphertext that is multiplied
        ``products`` times (each a level) and then collectively decrypted.

        Decryption compresses to 3 towers and doubles the scale (one level, see
        :meth:`double_scale`); measured at the paper preset, a quotient formed from a
        level-7 upload by two products decrypts with the same relative error (~5e-8)
        as one from a full-level upload.
        """
        if not 0 <= products <= self.depth - 2:
            raise InputError(f"{products} products leave no level for decryption")
        return self.depth - products - 2

    def decode(self, plaintext: openfhe.Plaintext, n: int) -> np.ndarray:
        """The first ``n`` real parts of a decrypted plaintext."""
        if not 0 <= n <= self.slots:
            raise InputError(f"n={n} outside [0, {self.slots}]")
        return np.array(plaintext.GetRealPackedValue()[:n], dtype=np.float64)

    # -- arithmetic ----------------------------------------------------------------------
    def add(self, a: Ciphertext, b: Operand) -> Ciphertext:
        """``a + b`` for a ciphertext, vector or scalar ``b`` (uses no level)."""
        return self.raw.EvalAdd(a, self._operand(a, b))

    def sub(self, a: Ciphertext, b: Operand) -> Ciphertext:
        """``a - b`` for a ciphertext, vector or scalar ``b`` (uses no level)."""
        return self.raw.EvalSub(a, self._operand(a, b))

    def mul(self, a: Ciphertext, b: Operand) -> Ciphertext:
        """``a * b``: ciphertext (relinearized), vector or scalar ``b``; uses one level."""
        used = max(consumed_levels(a), consumed_levels(b) if isinstance(b, Ciphertext) else 0)
        if used + 1 > self.depth:
            raise LevelBudgetError(f"multiplication needs level {used + 1}, depth is "
                                   f"{self.depth}: bootstrap first")
        return self.raw.EvalMult(a, self._operand(a, b))

    def square(self, a: Ciphertext) -> Ciphertext:
        """``a * a`` (relinearized), a little cheaper than :meth:`mul`; uses one level."""
        require_consumed_at_most(a, self.depth - 1, "square")
        return self.raw.EvalSquare(a)

    def negate(self, a: Ciphertext) -> Ciphertext:
        """``-a`` (uses no level)."""
        return self.raw.EvalNegate(a)

    def rotate(self, ct: Ciphertext, index: int) -> Ciphertext:
        """Rotate slots left by ``index`` (needs the joint rotation key for ``index``)."""
        return self.raw.EvalRotate(ct, index)

    def sum_slots(self, ct: Ciphertext, width: int) -> Ciphertext:
        """Slot 0 (and every multiple of ``width``) gets the sum of ``width`` slots.

        A log2(width)-step tree of rotations; needs rotation keys for
        :func:`sum_rotation_indices` (``width``). Uses no multiplicative level.
        """
        for step in sum_rotation_indices(width):
            ct = self.raw.EvalAdd(ct, self.raw.EvalRotate(ct, step))
        return ct

    def double_scale(self, ct: Ciphertext) -> Ciphertext:
        """Multiply by 1.0 so decryption happens at scale ~2^100 instead of ~2^50.

        OpenFHE's fixed decryption-share noise is an amount in the ring, so a doubled
        scale divides its effect on precision by ~2^50 (and with it whatever it hid of
        the ciphertext's own noise: it is not flooding, see :mod:`.flooding`): measured
        max abs. error for |x| <= 1 drops from 2.1e-6 to 1.7e-9 (paper preset, P=10).
        Costs one level; a no-op if a rescale is already pending (right after a
        multiplication the scale is already doubled).
        """
        if ct.GetNoiseScaleDeg() >= 2:
            return ct
        return self.mul(ct, 1.0)

    def _operand(self, ct: Ciphertext, b: Operand) -> Any:
        if isinstance(b, Ciphertext):
            return b
        if isinstance(b, np.ndarray):
            return self.encode(b, level=ct.GetLevel())
        if isinstance(b, (int, float, np.floating, np.integer)):
            return float(b)
        raise InputError(f"cannot combine a ciphertext with {type(b).__name__}")

    # -- keys installed on evaluators ----------------------------------------------------
    def install_relin_key(self, key: openfhe.EvalKey, tag: str) -> None:
        """Make ``key`` (the joint relinearization key for ``tag``) usable by mul, once."""
        if key.GetKeyTag() != tag:
            raise ProtocolError(f"relinearization key has tag {key.GetKeyTag()!r}, not {tag!r}")
        with KEY_MAP_LOCK:  # the roles of an in-process run share one key map
            if tag not in self.raw.GetAllEvalMultKeys():
                self.raw.InsertEvalMultKey([key])

    def install_rotation_keys(self, keys: openfhe.EvalKeyMap, tag: str,
                              indices: Sequence[int]) -> None:
        """Install joint rotation keys for ``tag`` and check every index is covered."""
        with KEY_MAP_LOCK:
            self.raw.InsertEvalAutomorphismKey(keys, tag)
            present = set(self.raw.GetExistingEvalAutomorphismKeyIndices(tag))
        if missing := [i for i in indices if self.raw.FindAutomorphismIndex(i) not in present]:
            raise ProtocolError(f"rotation keys for indices {missing} missing after aggregation")

    # -- validation and bytes ------------------------------------------------------------
    def check_same_context(self, obj: Any, what: str) -> None:
        """ProtocolError unless ``obj`` (ciphertext/public key) belongs to this context."""
        try:
            theirs = obj.GetCryptoContext()
        except AttributeError:
            raise ProtocolError(f"{what} is a {type(obj).__name__}, not an OpenFHE object") \
                from None
        if theirs != self.raw:
            raise ProtocolError(f"{what} was made under another crypto context (ring "
                                f"{theirs.GetRingDimension()}, ours {self.preset.ring_dim})")

    def to_bytes(self, obj: Any) -> bytes:
        """Frame an OpenFHE object (ciphertext, public/eval key, eval-key map) as bytes."""
        return serial.frame(obj, self.preset.fingerprint)

    def from_bytes(self, kind: str, data: bytes) -> Any:
        """Load a ``kind`` object from :meth:`to_bytes` output; malformed -> ProtocolError.

        A broadcast delivers the same bytes to every party; while all roles share one
        process (a simulation, :func:`in_process_run`), the object parsed for the first
        reader is handed to the others whose bytes are identical (the digest finds it, a
        comparison of every byte confirms it). They get the parse itself: the sender's
        object would not do, as a parsed object serializes longer than the original (at
        openfhe 1.6.1; tested), so a forwarded one would change the wire.
        Readers may therefore share an object: code that mutates one (e.g.
        ``RemoveElement``) works on a ``Clone()``, as every caller in fednorm does.
        """
        key = (kind, serial.digest_of(data))
        cached = self._recent.get(key)
        if cached is not None and cached[0] == data:
            return cached[1]
        payload, sha256 = serial.unframe_digested(kind, data, self.preset.fingerprint)
        self._templates.check(kind, payload)
        serial.remember_received(kind, obj := serial.load(kind, payload), sha256)
        if kind in ("ciphertext", "public_key"):
            self.check_same_context(obj, kind)
        if inprocess.active():  # a broadcast's other readers get this object
            self._remember(key, bytes(data), obj)
        return obj

    @property
    def kept_bytes(self) -> int:
        """Framed bytes of the objects kept for in-process readers."""
        return self._recent_bytes

    def forget_objects(self) -> None:
        """Drop the objects kept for readers (the memory of the last simulation)."""
        with self._recent_lock:
            self._recent.clear()
            self._recent_bytes = 0
        with self._computed_lock:
            self._computed.clear()

    def computed_once(self, key: tuple[object, ...] | Callable[[], tuple[object, ...]],
                      compute: Callable[[], Any]) -> Any:
        """``compute()``, deterministic on what ``key`` names (digests or a parsed object;
        a callable: made only if needed).  In a simulation (:func:`in_process_run`) the
        first role's result goes to the others with the same key (every role recomputes
        the parties' product: one host each in a deployment); callers do not mutate it."""
        if not inprocess.active():
            return compute()
        key = key() if callable(key) else key
        with self._computed_lock:  # the others wait for the first, then share its result
            if key not in self._computed:
                self._computed[key] = compute()
                while len(self._computed) > KEPT_RESULTS:
                    self._computed.pop(next(iter(self._computed)))
            return self._computed[key]

    def _remember(self, key: tuple[str, bytes | None], data: bytes, obj: Any) -> None:
        """Keep ``obj`` for readers of ``data``; the oldest go beyond :data:`RECENT_BYTES`."""
        with self._recent_lock:
            old = self._recent.pop(key, None)
            self._recent_bytes -= len(old[0]) if old else 0
            self._recent[key] = (data, obj)
            self._recent_bytes += len(data)
            while self._recent_bytes > RECENT_BYTES and len(self._recent) > 1:
                oldest = self._recent.pop(next(iter(self._recent)))
                self._recent_bytes -= len(oldest[0])

    def register_codec_types(
        self, register: Callable[[int, type, Callable[[Any], bytes], Callable[[bytes], Any]],
                                 None],
    ) -> None:
        """Hand the engine codec an ext code (16..19) and en/decoder per OpenFHE type."""
        for kind in serial.KINDS.values():
            register(kind.code, kind.cls, self.to_bytes, partial(self.from_bytes, kind.name))



def sum_rotation_indices(width: int) -> list[int]:
    """Rotation indices :meth:`CkksContext.sum_slots` needs for ``width`` (a power of 2)."""
    if width < 1 or width & (width - 1):
        raise InputError(f"width must be a power of two, got {width}")
    return [1 << i for i in range(width.bit_length() - 1)]
