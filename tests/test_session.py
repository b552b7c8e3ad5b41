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
