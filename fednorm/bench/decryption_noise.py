"""The noise of every decryption a PPF run makes, measured as OpenFHE measures it for
its CKKS flooding: on fresh keys whose joint secret is known, from the imaginary parts
of the decrypted slots (a computation on real values leaves them pure noise).

:func:`measure_decryptions` runs a protocol in a simulation with tracers: the parties'
tracer collects their secret-key objects as key generation returns them (throwaway keys
of this one run, read the way a test reads them), the server's tracer every decryption
request it sends to party 1 with the noise it declares.  Each request is then read with
the joint secret Σ s_i in the coefficient domain, c0 + c1·s, without the noise any share
adds.  What it measures is what :mod:`fednorm.protocols.ppf.noise` declares, per kind:
log2 of σ per coefficient, per unit of scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import openfhe

from fednorm.bench.measure import Section, finish, load_average, now, section_meta
from fednorm.engine import ckks
from fednorm.engine.ckks import ring
from fednorm.engine.ckks.decoding import centered_integers, evaluations
from fednorm.engine.clock import run_trio
from fednorm.engine.runtime import role_name
from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
from fednorm.protocols.base import FitOptions
from fednorm.protocols.collective import DecryptRequest
from fednorm.sim.federation import simulate_async


@dataclass(frozen=True)
class MeasuredDecryption:
    """One decryption request: the noise it declared (None: not flooded) and the noise
    measured in it, as log2 σ per coefficient per unit of scale (the declared one at the
    run's number of parties), and log2 of the largest |value| it decrypts (what the noise
    of a quotient grows with)."""

    kind: str
    declared: ckks.DecryptionNoise | None
    declared_log2: float
    measured_log2: float
    largest_log2: float

    @property
    def margin_bits(self) -> float:
        """How far the declared noise lies above the measured one (negative: below)."""
        return self.declared_log2 - self.measured_log2


class _SecretKeys(Tracer):
    def __init__(self) -> None:
        self.keys: list[ckks.PartyKeys] = []

    def crypto_call(self, event: CryptoEvent) -> None:
        if isinstance(event.result, ckks.PartyKeys):
            self.keys.append(event.result)


class _Requests(Tracer):
    def __init__(self) -> None:
        self.requests: list[DecryptRequest] = []

    def frame(self, event: FrameEvent) -> None:
        if (event.direction == "sent" and event.peer == role_name(1)
                and isinstance(event.message, DecryptRequest)):
            self.requests.append(event.message)


def measure_decryptions(method: str, party_data: Sequence[np.ndarray], options: FitOptions
                        ) -> list[MeasuredDecryption]:
    """Every decryption request of one PPF run of ``method``, its noise measured."""
    keys, requests = _SecretKeys(), _Requests()
    run_trio(lambda: simulate_async(party_data, method, "mhe", options, tracer=requests,
                                    party_tracer=keys))
    ctx = ckks.CkksContext(options.preset)
    return [_measured(ctx, request, keys.keys) for request in requests.requests]


def _measured(ctx: ckks.CkksContext, request: DecryptRequest,
              keys: Sequence[ckks.PartyKeys]) -> MeasuredDecryption:
    declared = request.declared_noise()
    ct = request.ciphertext
    slots = evaluations(joint_phase(ctx, ct, keys))
    sigma = np.std(slots.imag) / math.sqrt(ctx.preset.ring_dim / 2) / ct.GetScalingFactor()
    largest = math.log2(max(float(np.abs(slots.real).max()) / ct.GetScalingFactor(), 2.0**-1074))
    if declared is None:
        return MeasuredDecryption("not flooded", None, math.nan, math.log2(sigma), largest)
    said = math.log2(declared.relative_sigma(len(keys)))
    return MeasuredDecryption(declared.kind, declared, said, math.log2(sigma), largest)


def joint_phase(ctx: ckks.CkksContext, ct: openfhe.Ciphertext,
                keys: Sequence[ckks.PartyKeys]) -> np.ndarray:
    """c0 + c1·Σ s_i of a two-element ciphertext, as centered coefficients (float64)."""
    moduli = ctx.moduli[:ctx.towers(ct)]
    n = ctx.preset.ring_dim
    c0, c1 = (_element_towers(ctx, ct, keep) for keep in (0, 1))
    secrets = [openfhe.Serialize(k._sk, openfhe.BINARY) for k in keys]
    layouts = [ring.locate_towers(s, n, len(ctx.moduli), ctx.moduli) for s in secrets]
    phase = []
    for i, q in enumerate(moduli):
        secret = reduce(lambda a, b, q=q: ring.add_mod(a, b, q),
                        (layout.read(s, i) for layout, s in zip(layouts, secrets, strict=True)))
        product = (c1[i].astype(object) * secret.astype(object)) % q
        phase.append(ring.add_mod(c0[i], product.astype(np.uint64), q))
    residues = [ring.ntt(q, n).inverse(t) for q, t in zip(moduli, phase, strict=True)]
    return centered_integers(moduli, residues)


def _element_towers(ctx: ckks.CkksContext, ct: openfhe.Ciphertext, keep: int
                    ) -> list[np.ndarray]:
    """Ciphertext element ``keep`` (0: c0, 1: c1), its residues per tower."""
    element = ct.Clone()
    element.RemoveElement(1 - keep)
    data = openfhe.Serialize(element, openfhe.BINARY)
    moduli = ctx.moduli[:ctx.towers(ct)]
    towers = ring.locate_towers(data, ctx.preset.ring_dim, len(moduli), moduli)
    return [towers.read(data, i) for i in range(len(moduli))]


CALIBRATION_METHODS = ("minmax", "yeojohnson", "zscore")


def calibration_cases(parties: int, method: str, seed: int = 0
                      ) -> list[tuple[str, list[np.ndarray], tuple[float, ...]]]:
    """The data :mod:`fednorm.protocols.ppf.noise` was measured on: (name, parts, V_abs)
    for ordinary values, values near the bound, tiny values, and features of mixed
    magnitudes side by side; for the z-score, whose quotients' noise grows with the pooled
    count and with the number of features near their bounds, also 16 means near V_abs and
    16 variances near V_abs² over as many rows as ``max_count`` allows (2^20)."""
    rng = np.random.default_rng(seed)

    def parts(make) -> list[np.ndarray]:
        return [make() for _ in range(parties)]

    cases = [
        ("ordinary", parts(lambda: rng.normal(5, 2, (40, 4))), (64.0,)),
        ("near the bound", parts(lambda: rng.uniform(-1000, 1000, (30, 3))), (1000.0,)),
        ("tiny", parts(lambda: rng.normal(1e-3, 1e-4, (30, 3))), (1.0,)),
        ("mixed", parts(lambda: np.column_stack([rng.normal(1e-3, 1e-3, 30),
                                                 rng.normal(3e3, 1e3, 30),
                                                 rng.exponential(2, 30)])),
         (0.01, 1e4, 50.0)),
    ]
    if method == "zscore":
        rows = FitOptions().max_count // parties
        cases.append(("counts at max_count", parts(lambda: np.clip(np.column_stack([
            rng.normal(60, 1, (rows, 16)),
            rng.choice([-60.0, 60.0], (rows, 16)) + rng.normal(0, 1, (rows, 16))]), -64, 64)),
            (64.0,)))
    return cases


def flooding_calibration(preset: str = "paper", parties: int = 10, command: str = ""
                         ) -> Section:
    """Every decryption of a paper-algorithm run on each calibration case, its noise
    measured beside what it declares: the table :mod:`fednorm.protocols.ppf.noise`
    takes its numbers from (the largest measured per kind)."""
    started, t0 = now()
    meta = section_meta(command, started, load_average())
    rows: list[dict[str, object]] = []
    for method in CALIBRATION_METHODS:
        for name, parts, vabs in calibration_cases(parties, method):
            options = FitOptions(algorithm="paper", preset=preset, vabs=vabs)
            for measured in measure_decryptions(method, parts, options):
                rows.append({"method": method, "data": name, "kind": measured.kind,
                             "measured": measured.measured_log2,
                             "declared": measured.declared_log2,
                             "largest": measured.largest_log2})
    cells = [[r["method"], r["data"], r["kind"], f"{r['measured']:.2f}",
              "–" if math.isnan(r["declared"]) else f"{r['declared']:.2f}",
              f"{r['largest']:.2f}", f"{r['measured'] - r['largest']:.2f}"] for r in rows]
    notes = [f"Preset `{preset}`, P={parties}: log2 of the noise's σ per coefficient per "
             "unit of scale, read with the joint secret from every decryption request "
             "(imaginary parts of the slots); 'declared' is what the request declared at "
             "this P (– : not flooded); 'largest', log2 of the largest |value| the request "
             "decrypts (real parts of the slots), and 'relative', the noise per unit of it: "
             "a flooding sized by a public bound B on that value carries B times it."]
    header = ["method", "data", "kind", "measured", "declared", "largest", "relative"]
    return finish(Section("flooding", "Noise of the paper algorithms' decryptions", rows,
                          [("", header, cells)], notes, meta), t0)
