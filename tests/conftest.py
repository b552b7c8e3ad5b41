import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from ckks_federation import CkksFederation

    from fednorm.engine.ckks import CkksContext

# The suite's property tests draw the same examples on every run (a red CI run is a bug
# in the code, not a new draw); HYPOTHESIS_PROFILE=explore searches afresh each run.
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

sys.path.insert(0, str(Path(__file__).parent))

_PR_SET_PDEATHSIG = 1
_LIVE: dict[int, tuple[subprocess.Popen[bytes], bool]] = {}  # pid -> (process, own group)


def die_with_parent() -> None:
    """In a child before exec: the kernel kills it when the test process dies, even by
    SIGKILL (Linux only; elsewhere the SIGTERM handler below is what remains).  SIGINT
    is made the default again: a test suite started in a shell's background inherits it
    ignored, and its children would then ignore the interrupts the tests send them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def track(proc: subprocess.Popen[Any], *, group: bool = False) -> subprocess.Popen[Any]:
    """Stop ``proc`` (and its process group, if it leads one) when pytest is terminated."""
    _LIVE[proc.pid] = (proc, group)
    return proc


def stop(proc: subprocess.Popen[Any], group: bool) -> None:
    """Kill a process, or every process of its group (what it started, e.g. Flower's
    SuperExec children, which no parent-death signal reaches)."""
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
    except ProcessLookupError:
        pass
    _LIVE.pop(proc.pid, None)


def _stop_everything_then_die(signum: int, frame: object) -> None:
    for proc, group in list(_LIVE.values()):
        stop(proc, group)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def pytest_configure(config: pytest.Config) -> None:
    # A CI time limit sends SIGTERM: Python would die at once, skipping every fixture's
    # teardown, and leave the servers, parties and Flower processes running.
    signal.signal(signal.SIGTERM, _stop_everything_then_die)


class ChildProcesses:
    """Processes one test starts; they end with the test, or with pytest."""

    def __init__(self) -> None:
        self.started: list[tuple[subprocess.Popen[bytes], bool]] = []

    def start(self, command: Sequence[str], *, group: bool = False,
              **popen: Any) -> subprocess.Popen[bytes]:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen(list(command), start_new_session=group,
                                preexec_fn=die_with_parent, **popen)
        self.started.append((proc, group))
        return track(proc, group=group)

    def stop_all(self) -> None:
        for proc, group in self.started:
            stop(proc, group)
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A federation's certificates: a CA, the server (valid for localhost, 127.0.0.1,
    fednorm.example and 10.1.2.3) and parties 1..3."""
    from fednorm.transport.tls import init_certs

    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, parties=3, hosts=["fednorm.example", "10.1.2.3"])
    return directory


@pytest.fixture(params=["memory", "tcp"])
def links(request: pytest.FixtureRequest, certs: Path):
    """What carries an in-process run's frames (``run_federation(..., links=links)``):
    memory channels, or TCP + TLS on the loopback with the federation's certificates."""
    from tcp_federation import tcp_star

    from fednorm.transport.memory import memory_star

    return memory_star if request.param == "memory" else tcp_star(certs)


@pytest.fixture(scope="module")
def fed() -> "CkksFederation":
    """A multiparty CKKS federation in this process, made once per module
    (:class:`ckks_federation.CkksFederation`: three parties at the ``test`` preset)."""
    from ckks_federation import CkksFederation

    return CkksFederation()


@pytest.fixture(scope="session")
def foreign() -> "CkksContext":
    """A CKKS context with other parameters: its objects must be rejected by ours."""
    from fednorm.engine.ckks import CkksContext, CkksPreset

    return CkksContext(CkksPreset(name="foreign", ring_dim=1 << 13,
                                  security="HEStd_NotSet", depth=6))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors: a second torch thread only adds synchronization (and on a busy
    machine, waits of milliseconds per operation)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bcw() -> Any:
    """The packaged Breast Cancer Wisconsin data set."""
    from fednorm.sim.datasets import load_dataset

    return load_dataset("bcw")


@pytest.fixture
def child_processes() -> Iterator[ChildProcesses]:
    processes = ChildProcesses()
    yield processes
    processes.stop_all()


@pytest.fixture(scope="module")
def csvs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three parties' CSV files (:func:`federation_processes.party_arrays`)."""
    from federation_processes import party_arrays, write_csv

    directory = tmp_path_factory.mktemp("data")
    return [write_csv(directory / f"party-{i}.csv", X)
            for i, X in enumerate(party_arrays(), start=1)]


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``fednorm ...`` (or a test script) processes; kill leftovers at the end."""
    from federation_processes import ROOT

    started: list[subprocess.Popen[bytes]] = []

    def run(*args: object, script: Path | None = None, env: dict[str, str] | None = None,
            stderr: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
        entry = [str(script)] if script else ["-m", "fednorm"]
        proc = subprocess.Popen([sys.executable, *entry, *map(str, args)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=stderr, bufsize=0,
                                preexec_fn=die_with_parent)
        started.append(track(proc))
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
