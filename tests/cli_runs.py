"""What the CLI tests share: one ``fednorm`` command run in this process."""

from __future__ import annotations

import pytest

from fednorm.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``fednorm ARGV``."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
