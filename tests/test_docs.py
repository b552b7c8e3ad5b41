"""The documentation builds and its examples run: the API reference from the docstrings
(``make docs``) and every block of docs/USAGE.md, in order, as a user would paste them;
and no document or docstring names a file of the project that does not exist."""

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


# A project file named in prose: a path under one of the project's folders, with a suffix.
FILE_REFERENCE = re.compile(r"(?<![\w/.-])((?:fednorm|tests|docs|bench|results|examples)/"
                            r"[\w./-]*\.(?:py|md|csv|json|toml|txt|png))\b")
OUTPUT = re.compile(r"--out\s+([\w./-]*\w)")  # a file a documented command makes


def missing_files(text: str, root: Path = ROOT) -> list[str]:
    """The project files ``text`` names that do not exist under ``root`` (a file that a
    command in ``text`` writes with ``--out`` counts as named by its command)."""
    made = set(OUTPUT.findall(text))
    return [match.group(1) for match in FILE_REFERENCE.finditer(text)
            if match.group(1) not in made and not (root / match.group(1)).exists()]


def documents() -> list[Path]:
    return [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.md"),
            *(ROOT / "results").glob("*.md"), *(ROOT / "fednorm").rglob("*.py"),
            *(ROOT / "tests").glob("*.py"), ROOT / "Makefile"]


SELF = Path(__file__).resolve()  # its own check names a missing file on purpose


def test_documents_and_docstrings_name_only_files_that_exist() -> None:
    missing = {str(path.relative_to(ROOT)): found for path in documents()
               if path.resolve() != SELF and (found := missing_files(path.read_text()))}
    assert not missing


def test_the_file_reference_check_can_fail() -> None:
    assert missing_files("timed by ``bench/bench_ppf.py``; see docs/LEAKAGE.md; "
                         "fednorm --out results/next.csv, then read results/next.csv"
                         ) == ["bench/bench_ppf.py"]
