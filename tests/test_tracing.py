"""The role context's tracer hooks: phases, messages and worker calls, as they happen, and
the progress line built on them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import trio

from fednorm.engine.tracing import CryptoEvent, FrameEvent, PhaseEvent, Tracer, Tracers
from fednorm.protocols import FitOptions, get_protocol
from fednorm.protocols.progress import StateTracer, TraceState, phase_of
from fednorm.sim.federation import run_federation, simulate


class Everything(Tracer):
    def __init__(self) -> None:
        self.started: list[PhaseEvent] = []
        self.ended: list[PhaseEvent] = []
        self.frames: list[FrameEvent] = []
        self.calls: list[CryptoEvent] = []

    def phase_started(self, event: PhaseEvent) -> None:
        self.started.append(event)

    def phase_ended(self, event: PhaseEvent) -> None:
        self.ended.append(event)

    def frame(self, event: FrameEvent) -> None:
        self.frames.append(event)

    def crypto_call(self, event: CryptoEvent) -> None:
        self.calls.append(event)


def _parts() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(6, 2)) for _ in range(3)]


def test_a_ppf_run_reports_phases_frames_and_worker_calls_that_match_its_traffic() -> None:
    server, parties = Everything(), Everything()
    result = trio.run(lambda: run_federation(  # the paper's: its inverse's calls too
        get_protocol("zscore", "mhe"), _parts(), FitOptions(preset="test", algorithm="paper"),
        timeout=300, tracer=server, party_tracer=parties))
    stats = result.report.traffic["server"]
    sent = [e for e in server.frames if e.direction == "sent"]
    received = [e for e in server.frames if e.direction == "received"]
    assert sum(e.size for e in sent) == stats.bytes_sent
    assert sum(e.size for e in received) == stats.bytes_received
    assert len(sent) == stats.messages_sent and len(received) == stats.messages_received
    by_kind: Counter[str] = Counter()
    for event in sent:
        by_kind[event.kind] += event.size
        assert event.role == "server" and len(event.frame) == event.size
        assert event.kind == event.message.KIND
    assert dict(by_kind) == stats.by_kind
    # Every phase that starts ends, with its duration; key setup and decryptions are two.
    key = [(e.protocol, e.name) for e in server.started]
    assert sorted(key) == sorted((e.protocol, e.name) for e in server.ended)
    assert {"setup", "decrypt"} <= {e.name for e in server.started if e.subprotocol}
    assert all(e.seconds >= 0 for e in server.ended)
    # The heavy calls run in worker threads and are reported by name; the server's
    # decryptions return what they reveal: three values each (one per feature).
    calls = {e.call for e in server.calls}
    assert "encode_body" in calls and len(calls) > 3
    assert all(e.seconds >= 0 and e.role == "server" for e in server.calls)
    revealed = [e.result for e in server.calls if e.call.endswith("finalize")
                and isinstance(e.result, np.ndarray)]
    assert revealed and all(values.shape == (2,) for values in revealed)
    # Every party reports its own side: what it sent is what the server received.
    assert {e.role for e in parties.frames} == {"party 1", "party 2", "party 3"}
    party_sent = [e for e in parties.frames if e.direction == "sent"]
    assert sum(e.size for e in party_sent) == stats.bytes_received
    assert {e.name for e in parties.started} >= {"setup"}
    assert any("encrypt" in e.call for e in parties.calls)


def test_a_tracer_with_some_hooks_gets_only_those() -> None:
    class FramesOnly:
        def __init__(self) -> None:
            self.seen = 0

        def frame(self, event: FrameEvent) -> None:
            self.seen += 1

    only = FramesOnly()
    hooks = Tracers.of([only, Tracer()])
    assert hooks.wants("frame") and not hooks.wants("crypto_call")
    assert not hooks.wants("phase_started")  # the base class's no-ops are not hooks
    simulate(_parts(), "zscore", "plain", tracer=only)
    assert only.seen > 0


def _phase(name: str, subprotocol: bool = False, protocol: str = "zscore-mhe",
           planned: int | None = None) -> PhaseEvent:
    return PhaseEvent("server", protocol, name, subprotocol, planned_rounds=planned)


def test_the_progress_line_shows_the_inverse_and_its_refreshes() -> None:
    state = TraceState()
    state.phase_started(_phase("inverse"))
    assert state.line().startswith("inverse ·")
    refresh = _phase("bootstrap", True, "zscore-mhe/bootstrap")
    state.phase_started(refresh)
    assert state.line().startswith("inverse › ciphertext refresh ·")
    state.phase_ended(refresh)
    state.phase_ended(_phase("inverse"))
    state.frame(FrameEvent("sent", "party 1", 10, "zscore-mhe/decrypt",
                           "ckks.decrypt_request", 3))
    assert state.line().startswith("decryption ·")


def test_the_progress_line_counts_search_rounds_against_the_plan() -> None:
    state = TraceState()
    search = _phase("kth", True, "robust-mhe/kth", planned=14)
    state.phase_started(search)
    for round_ in range(3):
        for peer in ("party 1", "party 2"):
            state.frame(FrameEvent("sent", peer, 100, "robust-mhe/kth", "rank.probe", round_))
    assert state.line().startswith("rank search round 3 of ~14 ·")
    state.phase_ended(search)
    assert "of ~" not in state.line()


def test_a_party_counts_its_rounds_of_a_planned_search_by_what_it_sends() -> None:
    state = TraceState()
    state.phase_started(PhaseEvent("party 1", "yeojohnson-mhe", "search", False,
                                   planned_rounds=9))
    for round_ in range(4):
        state.frame(FrameEvent("received", "server", 50, "yeojohnson-mhe",
                               "ppf_yeojohnson.candidates", round_))
        state.frame(FrameEvent("sent", "server", 900, "yeojohnson-mhe",
                               "ppf_yeojohnson.encrypted_terms", round_))
        state.frame(FrameEvent("sent", "server", 300, "yeojohnson-mhe/decrypt",
                               "ckks.decrypt_share", round_))
    assert state.line().startswith("search round 4 of ~9 ·")


class PhaseLog(StateTracer):
    """Every progress line a display would have drawn, one per change of phase."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def changed(self, phase_before: str) -> None:
        if self.state.phase != phase_before or self.state.search_rounds:
            self.lines.append(self.state.line())


def test_a_ppf_run_shows_key_setup_the_inverse_and_decryptions() -> None:
    log = PhaseLog()
    simulate(_parts(), "zscore", "mhe", FitOptions(preset="test", algorithm="paper"),
             timeout=300, tracer=log)
    shown = " | ".join(log.lines)
    for phase in ("key setup", "inverse", "inverse › ciphertext refresh", "decryption"):
        assert f"{phase} ·" in shown, shown


def test_a_ppf_search_shows_its_round_against_the_plan() -> None:
    from fednorm.bench.kth import KthRounds, kth_protocol

    parts = _parts()
    pooled = np.vstack(parts)
    found, log = KthRounds(), PhaseLog()
    trio.run(lambda: run_federation(
        kth_protocol(pooled.min(axis=0), pooled.max(axis=0), found), parts,
        FitOptions(preset="test", epsilon=1e-3), timeout=300, tracer=log))
    planned = [line for line in log.lines if " of ~" in line]
    assert planned and found.rounds >= 5
    assert f"rank search round {found.rounds} of ~" in planned[-1]


def test_the_ppf_yeojohnson_search_shows_its_round_against_the_plan_on_every_role() -> None:
    """Server and parties both show 'λ search round k of ~n', k the probes actually sent
    and n the public plan's bound."""
    server, party = PhaseLog(), PhaseLog()

    class Probes(Tracer):
        def __init__(self) -> None:
            self.sent = 0

        def frame(self, event: FrameEvent) -> None:
            if event.direction == "sent" and event.peer == "party 1" and \
                    event.kind == "ppf_yeojohnson.probes":
                self.sent += 1

    probes = Probes()

    rng = np.random.default_rng(5)
    parts = [rng.gamma(2, 3, size=(8, 2)) - 1 for _ in range(3)]
    class PartyOne(Tracer):  # every party's context shares party_tracer: keep party 1's
        def phase_started(self, event: PhaseEvent) -> None:
            if event.role == "party 1":
                party.phase_started(event)

        def phase_ended(self, event: PhaseEvent) -> None:
            if event.role == "party 1":
                party.phase_ended(event)

        def frame(self, event: FrameEvent) -> None:
            if event.role == "party 1":
                party.frame(event)

    trio.run(lambda: run_federation(
        get_protocol("yeojohnson", "mhe"), parts, FitOptions(algorithm="paper",
                                                             preset="test", vabs=(32.0,)),
        timeout=600, tracer=[server, probes], party_tracer=PartyOne()))
    assert probes.sent >= 3
    for log in (server, party):
        searched = [line for line in log.lines if line.startswith("λ search")]
        assert searched and f"round {probes.sent} of ~" in searched[-1], log.lines


@pytest.mark.parametrize(("protocol", "kind", "phase"), [
    ("zscore-mhe/decrypt", "ckks.decrypt_request", "decryption"),
    ("zscore-mhe/decrypt_sum", "ckks.decrypt_sum_request", "decryption"),
    ("robust-mhe/kth/decrypt_sum", "ckks.decrypt_sum_request", "decryption"),
    ("zscore-mhe/decrypt_product", "ckks.decrypt_product_request", "decryption"),
    ("minmax-mhe/extremes/decrypt_coefficients", "ckks.decrypt_coefficients_request", "decryption"),
    ("minmax-mhe/extremes", "ppf_extremes.bits", "extremes search"),
    ("zscore-mhe/bootstrap", "ckks.boot_request", "ciphertext refresh"),
])
def test_every_decryption_kind_shows_as_a_decryption(protocol, kind, phase) -> None:
    assert phase_of(protocol, kind) == phase
