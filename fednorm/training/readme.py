"""Generated blocks in a README: the tables a document quotes, copied from the files
``fednorm report`` writes, so that no quoted number can drift from the results.

A block is the text between ``<!-- generated: NAME -->`` and ``<!-- end generated:
NAME -->`` lines, where NAME is a file of the report's folder (``table3.md``);
:func:`fill_blocks` replaces every block's text with the file's, and
:func:`stale_blocks` names the blocks that differ (what a test checks). Torch-free.
"""

from __future__ import annotations

import re
from pathlib import Path

from fednorm.engine.errors import InputError

BLOCK = re.compile(r"(?P<start><!-- generated: (?P<name>[\w.\-]+) -->\n)(?P<body>.*?)"
                   r"(?P<end><!-- end generated: (?P=name) -->)", re.S)


def block_names(text: str) -> list[str]:
    return [match["name"] for match in BLOCK.finditer(text)]


def fill_blocks(text: str, out_dir: Path) -> str:
    """``text`` with every generated block's body replaced by its file in ``out_dir``."""
    def body(match: re.Match[str]) -> str:
        path = out_dir / match["name"]
        if not path.is_file():
            raise InputError(f"a generated block names {match['name']}, which the report "
                             f"did not write in {out_dir}")
        content = path.read_text(encoding="utf-8")
        return match["start"] + content + ("" if content.endswith("\n") else "\n") \
            + match["end"]

    return BLOCK.sub(body, text)


def stale_blocks(text: str, out_dir: Path) -> list[str]:
    """The blocks whose body differs from the file ``out_dir`` holds."""
    filled = fill_blocks(text, out_dir)
    current = {m["name"]: m["body"] for m in BLOCK.finditer(text)}
    wanted = {m["name"]: m["body"] for m in BLOCK.finditer(filled)}
    return [name for name in current if current[name] != wanted[name]]


def update_readme(readme: Path, out_dir: Path) -> bool:
    """Fill ``readme``'s generated blocks in place; True if anything changed."""
    text = readme.read_text(encoding="utf-8")
    filled = fill_blocks(text, out_dir)
    if filled != text:
        readme.write_text(filled, encoding="utf-8")
    return filled != text
