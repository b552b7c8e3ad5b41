"""The session layer: one place builds role contexts, for every way a role runs."""

from __future__ import annotations

import ast
from pathlib import Path

import fednorm

PACKAGE = Path(fednorm.__file__).parent


def builds_a_role_context(path: Path) -> bool:
    """Whether the module calls ``RoleContext(...)`` (by name or as an attribute)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
            if name == "RoleContext":
                return True
    return False


def test_role_contexts_are_built_only_by_the_session_module() -> None:
    """The simulation, the multi-host server and party and Flower's two sides all call
    fednorm.session.role_context, so a tracer or a timeout reaches every role alike."""
    builders = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                      if builds_a_role_context(path))
    assert builders == ["session.py"]


def calls(path: Path, name: str) -> bool:
    """Whether the module calls ``name(...)`` (by name or as an attribute)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            called = node.func
            if (called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")) \
                    == name:
                return True
    return False


def test_every_runner_plays_a_session_plan_and_only_the_session_runs_a_role() -> None:
    """The simulation, the multi-host server and party and Flower's two sides all play
    a SessionPlan with fednorm.session.play_session: one way through, whatever the
    transport (a simulation that ran each protocol by itself was a second path)."""
    modules = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))
    players = [m for m in modules if calls(PACKAGE / m, "play_session")]
    assert players == ["flower/server.py", "flower/worker.py", "multihost/party.py",
                       "multihost/server.py", "sim/federation.py"]
    assert [m for m in modules if imports_from_session(PACKAGE / m, "play")] == []


def imports_from_session(path: Path, name: str) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "fednorm.session"
               and any(alias.name == name for alias in node.names)
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_a_simulated_session_plays_every_step_over_one_set_of_links() -> None:
    """Two methods over one star of links, opened once, each fitted as pooled."""
    from contextlib import asynccontextmanager

    import numpy as np
    import trio

    from fednorm.session import SessionPlan
    from fednorm.sim.federation import play_federation
    from fednorm.transport.memory import memory_star

    opened = []

    @asynccontextmanager
    async def counting_star(party_ids):
        opened.append(list(party_ids))
        async with memory_star(party_ids) as ends:
            yield ends

    rng = np.random.default_rng(3)
    parts = [rng.normal(2, 3, size=(n, 2)) for n in (4, 1, 6)]
    session = trio.run(lambda: play_federation(SessionPlan(("zscore", "minmax"), "plain"),
                                               parts, links=counting_star))
    assert opened == [[1, 2, 3]]
    pooled = np.vstack(parts)
    zscore, minmax = (result.normalizer for result in session.results)
    np.testing.assert_allclose(zscore.mean, pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(minmax.min, pooled.min(axis=0))
    assert session.setup is None
    assert all(result.report.rounds > 0 and result.report.seconds >= 0
               for result in session.results)


def test_party_data_is_checked_at_the_edges_only() -> None:
    """Each entry point checks a party's data once, before its session (the simulation
    every party's, a multi-host or Flower party its own); no protocol role checks it
    again, and the values against V_abs are checked by the session layer alone."""
    modules = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))
    checkers = [m for m in modules if calls(PACKAGE / m, "check_party_data")]
    assert checkers == ["flower/client.py", "flower/worker.py", "multihost/files.py",
                        "multihost/party.py", "protocols/base.py", "session.py"]
    assert [m for m in modules if calls(PACKAGE / m, "check_within_vabs")] == ["session.py"]


def test_the_keys_a_role_holds_across_steps_carry_no_network_handle() -> None:
    """``RoleContext.held_keys`` is typed key state (the server's HeldKeys, a party's
    PartyKeyState), never a facade bound to an earlier step's context: each step makes
    its own ServerCrypto / PartyCrypto over the same held keys."""
    import typing
    from dataclasses import fields

    from fednorm.engine.ckks import HeldKeys
    from fednorm.engine.runtime import RoleContext
    from fednorm.protocols.collective import PartyCrypto, PartyKeyState, ServerCrypto

    for kind in (HeldKeys, PartyKeyState):
        assert not [f.name for f in fields(kind) if f.name == "rc" or "RoleContext" in str(f.type)]
    assert [f.name for f in fields(ServerCrypto)] == ["rc", "held", "bootstraps",
                                                      "decryptions"]  # the step's counts
    assert [f.name for f in fields(PartyCrypto)] == ["rc", "held"]
    hints = typing.get_type_hints(RoleContext.__init__, localns={"HeldKeys": HeldKeys})
    assert hints["held_keys"] == HeldKeys | None


INPUT_CHECKS = ("check_methods", "check_options_used", "check_federation_data",
                "check_party_inputs", "require_decryptions_within")
"""The checks a simulated session runs before any role starts."""


def checks_run(run) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """How many times ``run()`` enters each input check and each ``__post_init__`` of
    FitOptions and SessionPlan (watched with a profile hook, nothing replaced)."""
    import collections
    import sys

    counted: collections.Counter[str] = collections.Counter()

    def watch(frame, event, arg):  # type: ignore[no-untyped-def]
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(PACKAGE)):
            return
        if code.co_name in INPUT_CHECKS:
            counted[code.co_name] += 1
        elif code.co_name == "__post_init__":
            counted[type(frame.f_locals["self"]).__name__] += 1

    sys.setprofile(watch)
    try:
        run()
    finally:
        sys.setprofile(None)
    return dict(counted)


def test_a_simulation_checks_each_input_once() -> None:
    """From the command line and from the library, a session's methods, options and data
    are checked once each, at its edge, before any role starts (the command once made
    and checked its options, plan and method list two to four times)."""
    import numpy as np

    from fednorm.cli import main

    rng = np.random.default_rng(5)
    parts = [rng.normal(size=(n, 3)) for n in (5, 1, 7)]
    once = {name: 1 for name in ("FitOptions", "SessionPlan", *INPUT_CHECKS)}
    command = checks_run(lambda: main(["simulate", "--method", "zscore,minmax",
                                       "--parties", "3", "--quiet", "--json"]))
    assert {name: command.get(name, 0) for name in once} == once
    sessions = []
    library = checks_run(lambda: sessions.append(
        fednorm.simulate_session(parts, "zscore, minmax", "plain")))  # or a list of names
    assert len(sessions[0].results) == 2
    once["check_options_used"] = 0  # the library fits with whatever options it is given
    assert {name: library.get(name, 0) for name in once} == once
