"""What ``fednorm serve`` and ``fednorm party`` refuse before connecting (exit 2, nothing
written), outputs written all or nothing, and a party's rejected input reaching its peers
as a category only."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import trio
from federation_processes import FEATURES

from fednorm.cli import main
from fednorm.engine.errors import FednormError, InputError
from fednorm.multihost.config import PartyConfig, Timeouts
from fednorm.multihost.files import check_out_dir, write_atomically
from fednorm.multihost.party import Party


@pytest.fixture
def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "text.csv"
    text.write_text("a,label,b\n1,yes,2\nx,no,3\n")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80\n")
    afile = tmp_path / "a-file"
    afile.write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "params.json").write_text("{}")
    return {"TEXT": text, "BINARY": binary, "FILE": afile, "EMPTY": tmp_path / "empty",
            "MISSING": tmp_path / "missing.csv", "NONEMPTY": tmp_path / "nonempty",
            "UNWRITABLE": Path("/proc/fednorm-out")}  # even root cannot create files there


PARTY = ["party", "--connect", "127.0.0.1:9", "--id", "1", "--data", "DATA", "--target",
         "label", "--certs", "CERTS", "--out", "OUT", "--join-timeout", "30"]
SERVE = ["serve", "--bind", "127.0.0.1:0", "--parties", "3", "--method", "zscore",
         "--certs", "CERTS", "--join-timeout", "30"]


def edit(base: list[str], **changes: str) -> list[str]:
    args = list(base)
    for flag, value in changes.items():
        args[args.index("--" + flag.replace("_", "-")) + 1] = value
    return args


@pytest.mark.parametrize("args, message", [
    (edit(PARTY, data="MISSING"), "is not a file"),
    (edit(PARTY, data="BINARY"), "cannot read"),
    (edit(PARTY, data="TEXT"), "non-numeric value 'x'"),
    (edit(PARTY, target="outcome"), "target 'outcome' is not a column"),
    (edit(PARTY, id="0"), r"party ids are 1\.\.N"),
    (edit(PARTY, id="9"), "no party 9 certificate"),
    (edit(PARTY, certs="EMPTY"), "not a certs directory"),
    (edit(PARTY, connect="localhost"), "HOST:PORT"),
    (edit(PARTY, out="FILE"), "not a directory"),
    (edit(SERVE, parties="0"), "at least 1"),
    (edit(SERVE, certs="EMPTY"), "not a certs directory"),
    (edit(SERVE, bind="0.0.0.0"), "HOST:PORT"),
    (edit(SERVE, join_timeout="0"), "timeout must be positive"),
    (edit(SERVE, method="zscroe"), "got 'zscroe'"),
    ([*SERVE, "--sessions", "0"], "at least 1"),
    (edit(PARTY, out="UNWRITABLE"), "is not writable"),
    ([*SERVE, "--out", "UNWRITABLE"], "is not writable"),
    (edit(PARTY, out="NONEMPTY"), "is not empty.*--force"),
    ([*SERVE, "--out", "NONEMPTY"], "is not empty.*--force"),
    ([*edit(SERVE, method="minmax"), "--privacy", "mhe",
      "--algorithm", "paper"], "minmax-mhe needs --vabs"),
    ([*edit(SERVE, method="robust"), "--privacy", "mhe",
      "--algorithm", "paper"], "robust-mhe needs --vabs"),
    ([*edit(SERVE, method="minmax"), "--privacy", "mhe", "--algorithm", "paper",
      "--features", "a,b", "--vabs", "1,2,3"], r"3 bounds for 2 features \(a, b\)"),
    ([*SERVE, "--features", "a,,b"], "non-empty names"),
    ([*SERVE, "--epsilon", "inf"], "epsilon must be a finite"),
    ([*SERVE, "--vabs", "-1"], "vabs bounds must be finite positive"),
    ([*SERVE, "--vabs", "10"], "--vabs bounds .* this run would ignore it"),
])
def test_bad_input_exits_2_before_connecting(
    args: list[str], message: str, certs: Path, csvs: list[Path], tmp_path: Path,
    bad_inputs: dict[str, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    names = {"DATA": csvs[0], "CERTS": certs, "OUT": tmp_path / "out", **bad_inputs}
    argv = [str(names.get(a, a)) for a in args]
    started = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert time.monotonic() - started < 5  # it did not try to connect
    assert not (tmp_path / "out").exists()


def test_a_party_refuses_complex_data_before_connecting(certs: Path) -> None:
    quick = Timeouts(join=1.0, handshake=1.0, protocol=1.0)  # were it to connect
    party = Party(PartyConfig("127.0.0.1", 9, 1, certs, quick))
    X = np.array([[1 + 1j, 2, 3], [4, 5, 6]])
    with pytest.raises(InputError, match="complex"):
        trio.run(party.run, X, FEATURES)


def test_an_output_probe_leaves_no_directory_behind(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_all_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a directory should be")
    with pytest.raises(FednormError, match="cannot write outputs"):
        write_atomically({tmp_path / "first.json": b"{}",
                          tmp_path / "blocker" / "second.csv": b""})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


async def test_a_party_s_rejected_input_reaches_its_peers_as_a_category_only() -> None:
    """The abort a party sends names the category, never the data-dependent detail (how
    many values, which feature); its own console gets both."""
    from fednorm.engine.errors import InputError
    from fednorm.session import run_role

    sent: list[str] = []

    class Peerless:
        me = 2

        async def send_abort(self, reason: str) -> None:
            sent.append(reason)

    async def refusing() -> None:
        raise InputError("this party holds 700 values of feature 'age'")

    with pytest.raises(InputError) as refused:
        await run_role(Peerless(), refusing())
    assert sent == ["party 2 refused its input"]
    assert str(refused.value) == ("party 2 refused its input: this party holds 700 values "
                                  "of feature 'age'")
