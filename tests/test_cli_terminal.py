"""The CLI on a terminal: the progress line and its opt-outs, the demo's summary, and
processes that end with the test run."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import run_cli

ROOT = Path(__file__).resolve().parent.parent


# -- progress on a terminal -------------------------------------------------------------
def run_on_terminal(args: list[str], timeout: float = 120) -> tuple[int, str, str]:
    """Run ``fednorm ...`` with stderr on a pseudo-terminal; (exit code, stdout, stderr)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fednorm", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    out, _ = proc.communicate(timeout=10)
    return proc.returncode, out.decode(), seen.decode(errors="replace")


PPF = ["simulate", "--parties", "3", "--method", "zscore", "--privacy", "mhe",
       "--preset", "test"]


def test_a_long_run_shows_its_phase_and_bytes_on_a_terminal() -> None:
    code, out, err = run_on_terminal(PPF)
    assert code == 0, err
    assert "key setup" in err and "decryption" in err
    sizes = [float(size) for size in re.findall(r"([\d.]+) MB sent", err)]
    assert sizes and sizes == sorted(sizes) and sizes[-1] > 1  # bytes so far, growing
    assert "max abs error" in out  # the report itself stays on stdout
    assert "fednorm simulate zscore-mhe" in err


def test_the_demos_progress_line_names_the_demo() -> None:
    code, _, err = run_on_terminal(["demo", "--methods", "zscore", "--preset", "test",
                                    "--parties", "3"])
    assert code == 0, err
    assert "fednorm demo zscore-mhe" in err and "fednorm simulate" not in err


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_no_progress_with_json_or_quiet(flag: str) -> None:
    code, _, err = run_on_terminal([*PPF, flag])
    assert code == 0 and "key setup" not in err and " sent" not in err, err


def test_no_progress_when_stderr_is_not_a_terminal() -> None:
    done = subprocess.run([sys.executable, "-m", "fednorm", *PPF], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr


# -- processes end with the test run ----------------------------------------------------
PROBE_ENV = "FEDNORM_SIGTERM_PROBE"


@pytest.mark.skipif(PROBE_ENV not in os.environ, reason="run by the SIGTERM test only")
def test_sigterm_probe(child_processes: object) -> None:
    """Starts a server process and a process group with a grandchild, records their
    pids, then waits to be terminated with pytest."""
    from conftest import ChildProcesses

    assert isinstance(child_processes, ChildProcesses)
    server = child_processes.start([sys.executable, "-m", "fednorm", "serve", "--bind",
                                    "127.0.0.1:0", "--parties", "2", "--method", "zscore",
                                    "--certs", os.environ[PROBE_ENV] + "/certs"])
    group = child_processes.start(["sh", "-c", "sleep 300 & echo $!; wait"], group=True)
    assert group.stdout is not None
    grandchild = int(group.stdout.readline())
    Path(os.environ[PROBE_ENV], "pids").write_text(f"{server.pid} {group.pid} {grandchild}")
    time.sleep(300)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status is left


def test_processes_a_test_starts_die_when_pytest_is_terminated(tmp_path: Path) -> None:
    from fednorm.transport.tls import init_certs

    init_certs(tmp_path / "certs", parties=2)
    pytest_run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "sigterm_probe"], cwd=ROOT, env={**os.environ, PROBE_ENV: str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids_file = tmp_path / "pids"
    deadline = time.monotonic() + 60
    while not pids_file.exists():
        assert time.monotonic() < deadline and pytest_run.poll() is None, (
            pytest_run.communicate()[0].decode())
        time.sleep(0.1)
    time.sleep(0.2)  # the file is written in one call, but let it be complete
    pids = [int(pid) for pid in pids_file.read_text().split()]
    assert all(alive(pid) for pid in pids)

    pytest_run.send_signal(signal.SIGTERM)  # as a CI time limit does
    pytest_run.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            for pid in pids:  # clean up before failing
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"still running after pytest was terminated: {pids}")
        time.sleep(0.1)


# -- make demo's summary ------------------------------------------------------------------
def test_the_demo_ends_with_a_summary_per_method_and_privacy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(["demo", "--methods", "zscore,minmax", "--preset", "test",
                            "--parties", "3"], capsys)
    assert code == 0
    summary = out[out.index("Summary"):].splitlines()
    assert len(summary) <= 24  # one screen
    rows = {tuple(line.split()[:2]): line.split() for line in summary[2:] if line.strip()}
    assert set(rows) == {("zscore", "plain"), ("minmax", "plain"), ("(keys)", "mhe"),
                         ("zscore", "mhe"), ("minmax", "mhe")}
    keys = rows.pop(("(keys)", "mhe"))  # one joint key setup for both PPF methods
    assert keys[2:4] == ["-", "-"] and int(keys[4]) >= 1  # the public key's round
    for (_, privacy), cells in rows.items():
        relative, rounds, size, seconds = (float(cells[3]), int(cells[4]), float(cells[5]),
                                           float(cells[7]))
        # The documented precision: exact in plain, PPF within 1e-6 relative (z-score)
        # and a small multiple of 1e-13 V_abs (MinMax, on BCW's bounds).
        assert relative < (1e-12 if privacy == "plain" else 1e-5)
        assert rounds >= 1 and size > 0
        assert seconds > 0 if privacy == "mhe" else seconds < 1


@pytest.mark.parametrize("command", [
    ["serve", "--bind", "127.0.0.1:0", "--parties", "2", "--method", "zscore", "--certs", "c"],
    ["party", "--connect", "127.0.0.1:9", "--id", "1", "--data", "d.csv", "--certs", "c",
     "--out", "o"],
    ["simulate"],
])
def test_quiet_turns_the_progress_line_off_on_a_terminal(command: list[str]) -> None:
    from fednorm.cli import build_parser
    from fednorm.cli.progress import wants_progress

    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        assert wants_progress(build_parser().parse_args(command), terminal)
        assert not wants_progress(build_parser().parse_args([*command, "--quiet"]), terminal)
    os.close(leader)
