"""The documentation builds and its examples run: the API reference from the docstrings
(``make docs``) and every block of docs/USAGE.md, in order, as a user would paste them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)


def test_the_api_reference_builds_without_warnings_or_undocumented_names(
        tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"),
                            str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "fednorm.html").read_text()
    for name in ("simulate", "Party", "Server", "FitOptions", "InputError"):
        assert f'id="{name}"' in page
    assert (tmp_path / "fednorm" / "flower.html").exists()


def test_the_reference_build_names_a_public_method_without_a_docstring(
        tmp_path: Path) -> None:
    """The check bites: a public method stripped of its docstring fails the build."""
    script = (
        "import sys; sys.path.insert(0, {docs!r})\n"
        "import build_api, fednorm\n"
        "fednorm.Party.run.__doc__ = None\n"
        "sys.exit(1 if 'no docstring: fednorm.Party.run' in build_api.build("
        "__import__('pathlib').Path({out!r})) else 0)\n"
    ).format(docs=str(ROOT / "docs"), out=str(tmp_path))
    checked = subprocess.run([sys.executable, "-c", script], capture_output=True,
                             text=True, timeout=300)
    assert checked.returncode == 1, checked.stderr


def usage_blocks() -> list[tuple[str, str]]:
    return BLOCK.findall((ROOT / "docs" / "USAGE.md").read_text())


def test_every_example_of_the_usage_page_runs_as_written(tmp_path: Path) -> None:
    blocks = usage_blocks()
    assert [kind for kind, _ in blocks].count("python") >= 5
    script = []
    for kind, code in blocks:
        if kind == "sh":
            # the documented command, from this environment's installed entry point
            script.append("import subprocess\nsubprocess.run("
                          f"{[str(BIN / 'fednorm'), *code.split()[1:]]!r}, check=True)\n")
        else:
            script.append(code)
    (tmp_path / "usage.py").write_text("\n".join(script))
    ran = subprocess.run([sys.executable, "usage.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
