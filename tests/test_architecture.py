"""The shape docs/ARCHITECTURE.md promises, checked on every module of the package: the
import direction between layers, module sizes, heavy dependencies kept to their layers,
and no attribute patching; and of the tests: no test module imports another."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
PACKAGE = TESTS.parent / "fednorm"
MAX_LINES = 400

# What each layer may import besides itself (docs/ARCHITECTURE.md, "Import direction").
ALLOWED = {
    "engine": set(),
    "transport": {"engine"},
    "protocols": {"engine"},
    "session": {"engine", "protocols"},
    "sim": {"engine", "transport", "protocols", "session"},
    "multihost": {"engine", "transport", "protocols", "session", "sim"},
    "flower": {"engine", "transport", "protocols", "session"},
    "training": {"engine", "protocols", "sim"},
    "bench": {"engine", "transport", "protocols", "session", "sim", "training"},
    "cli": {"engine", "transport", "protocols", "session", "sim", "multihost", "flower",
            "training", "bench"},
    "__main__": {"cli"},
    # The public API: names imported lazily (and for type checkers), never at import.
    "__init__": {"engine", "protocols", "sim", "multihost"},
}
# Third-party packages a layer may not import (the core runs without torch; a transport
# knows bytes, not crypto).
FORBIDDEN = {
    "engine": {"torch", "flwr"},
    "transport": {"openfhe", "torch", "flwr"},
    "protocols": {"torch", "flwr", "socket", "ssl"},
    "session": {"torch", "flwr"},
    "sim": {"torch", "flwr"},
    "multihost": {"torch", "flwr"},
}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).with_suffix("").parts[0], path


def imported(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


MODULES = list(modules())


def _id(item: tuple[str, Path]) -> str:
    return str(item[1].relative_to(PACKAGE))


@pytest.mark.parametrize("item", MODULES, ids=_id)
def test_imports_follow_the_layers(item: tuple[str, Path]) -> None:
    layer, path = item
    for name in imported(path):
        top = name.split(".")
        if top[0] == "fednorm" and len(top) > 1 and top[1] != layer:
            assert top[1] in ALLOWED[layer], f"{layer} may not import {name}"
        assert top[0] not in FORBIDDEN.get(layer, set()), f"{layer} may not import {name}"


@pytest.mark.parametrize("item", MODULES, ids=_id)
def test_modules_stay_short(item: tuple[str, Path]) -> None:
    lines = len(item[1].read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split the module"


MAX_FUNCTION_LINES = 40


def long_functions(source: str) -> list[str]:
    """Functions whose body, docstring left out, runs past MAX_FUNCTION_LINES lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            documented = (len(body) > 1 and isinstance(body[0], ast.Expr)
                          and isinstance(body[0].value, ast.Constant))
            first = body[1] if documented else body[0]
            if node.end_lineno - first.lineno + 1 > MAX_FUNCTION_LINES:
                found.append(f"{node.name} (line {node.lineno})")
    return found


@pytest.mark.parametrize("item", MODULES, ids=_id)
def test_functions_stay_short(item: tuple[str, Path]) -> None:
    """A function reads as one step of its module: past MAX_FUNCTION_LINES, name its
    parts."""
    assert long_functions(item[1].read_text()) == []


def test_the_function_length_check_can_fail() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    assert long_functions(f'def f():\n    """Doc."""\n{body}\n') == ["f (line 1)"]
    assert long_functions(f"def f():\n{body}\n".replace(f"    x{MAX_FUNCTION_LINES} = "
                                                        f"{MAX_FUNCTION_LINES}\n", "")) == []


def _patches(path: Path) -> list[int]:
    """Lines that replace an attribute of an imported module or class at run time."""
    tree = ast.parse(path.read_text())
    imported_names = {alias.asname or alias.name.split(".")[0]
                      for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                      for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id in imported_names:
                found.append(node.lineno)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id in imported_names):
                    found.append(node.lineno)
    return found


@pytest.mark.parametrize("item", MODULES, ids=_id)
def test_no_attribute_patching(item: tuple[str, Path]) -> None:
    assert not _patches(item[1]), "patches an imported module or class: use a tracer hook"


def test_the_patching_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import fednorm.engine.ckks as ckks\nckks.fuse = print\n"
                      "setattr(ckks, 'x', 1)\n")
    assert _patches(sample) == [2, 3]


def test_every_layer_is_known() -> None:
    assert {layer for layer, _ in MODULES} <= set(ALLOWED)


def _test_modules_imported(path: Path) -> list[str]:
    """The test modules (``test_*``) that ``path`` imports."""
    return [name for name in imported(path) if name.split(".")[0].startswith("test_")]


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda path: path.name)
def test_no_test_module_imports_another(path: Path) -> None:
    """What tests share lives in a helper module (``tests/deviating.py``,
    ``tests/protocol_cases.py``, ...): a test module is collected and run by itself."""
    assert not _test_modules_imported(path), "move what is shared to a helper module"


def test_the_test_import_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from test_ledger import CASES\nimport test_flooding as flooding\n"
                      "from protocol_cases import Case\n")
    assert _test_modules_imported(sample) == ["test_ledger", "test_flooding"]


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda path: path.name)
def test_test_modules_stay_short(path: Path) -> None:
    """A test file reads as one subject: past MAX_LINES, split it by what it tests."""
    assert len(path.read_text().splitlines()) <= MAX_LINES


PATCH_CALL = "monkeypatch" + ".setattr("  # spelled apart, so this file does not match


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda path: path.name)
def test_tests_observe_through_hooks_not_patches(path: Path) -> None:
    """A test watches the library through its hooks (tracers, the runner's hooks, a
    server's protocol lookup), never by replacing its attributes."""
    assert PATCH_CALL not in path.read_text()
