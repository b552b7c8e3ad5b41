"""Build fednorm's API reference (HTML) from the public API's docstrings, with pdoc.

``python docs/build_api.py OUT`` (what ``make docs`` runs, into docs/api/) documents
``fednorm`` (its ``__all__``: the library's public API) and ``fednorm.flower``.  The
build fails on any warning pdoc raises (a name in ``__all__`` that does not resolve, an
annotation it cannot read) and on a public name, or a public method of a public class,
without a docstring: a reference with holes is a defect, not a document.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.render

PUBLIC = ("fednorm", "fednorm.flower")
SPECS = ("fednorm", r"!fednorm\..*", "fednorm.flower")  # not the internal modules


def resolved(name: str) -> pdoc.doc.Module:
    """``name`` with every lazily imported public name resolved, so pdoc sees them all."""
    module = importlib.import_module(name)
    for public in module.__all__:
        getattr(module, public)
    return pdoc.doc.Module(module)


def undocumented(module: pdoc.doc.Module) -> Iterator[str]:
    """Public names (and public methods of public classes) without a docstring."""
    for member in module.members.values():
        if not member.docstring.strip() and not isinstance(member, pdoc.doc.Variable):
            yield member.fullname
        if isinstance(member, pdoc.doc.Class):
            for method in member.own_members:
                if (isinstance(method, pdoc.doc.Function)
                        and not method.name.startswith("_")
                        and not inspect.getdoc(method.obj)):
                    yield method.fullname


def build(out: Path) -> list[str]:
    """Write the reference into ``out``; return the problems found (empty: built)."""
    pdoc.render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        modules = [resolved(name) for name in PUBLIC]
        pdoc.pdoc(*SPECS, output_directory=out)
    problems = [f"pdoc: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
    problems += [f"no docstring: {name}" for m in modules for name in undocumented(m)]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the HTML reference")
    problems = build(parser.parse_args().out)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
