"""The example app on Flower's local deployment runtime: a SuperLink and SuperNodes as
real processes, fitting what the in-memory simulation fits."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from conftest import track
from flower_nodes import (
    EXAMPLE,
    NODES,
    check_quartiles_against_numpy,
    expected_normalizer,
    short_private_dir,
    wait_until_gone,
)

from fednorm.flower.client import CERTS_KEY
from fednorm.flower.localpipe import PIPE_DIR_ENV
from fednorm.protocols import FitOptions

BIN = Path(sys.executable).parent
CONNECTION = "fednorm-test"

from flower_robust.task import bcw_features  # noqa: E402


# -- Flower's local deployment runtime: a SuperLink and SuperNodes, real processes --------
def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Deployment:
    home: Path
    pipe_dir: Path
    env: dict[str, str]
    logs: dict[str, Path]
    node_partitions: dict[int, int]  # Flower node id -> partition id

    def log_tail(self) -> str:
        return "\n".join(f"--- {name}\n{path.read_text()[-3000:]}"
                         for name, path in self.logs.items())

    def run(self, run_config: str, timeout: float) -> subprocess.CompletedProcess[str]:
        command = [str(BIN / "flwr"), "run", str(EXAMPLE), CONNECTION, "--stream",
                   "--run-config", run_config]
        return subprocess.run(command, env=self.env, cwd=self.home, capture_output=True,
                              text=True, timeout=timeout)


def node_id_from_log(path: Path, seconds: float = 60.0) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        match = re.search(r"SuperNode ID: (\d+)", path.read_text())
        if match:
            return int(match.group(1))
        time.sleep(0.2)
    raise AssertionError(f"no SuperNode ID in {path}:\n{path.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[Deployment]:
    home = tmp_path_factory.mktemp("flwr-home")
    pipe_dir = short_private_dir("fnf-")
    env = {**os.environ, "FLWR_HOME": str(home), PIPE_DIR_ENV: str(pipe_dir),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    appio, fleet, control, *clientappio = free_ports(3 + NODES)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{control}"\ninsecure = true\n')
    commands = {"superlink": ["flower-superlink", "--insecure",
                              "--serverappio-api-address", f"127.0.0.1:{appio}",
                              "--fleet-api-address", f"127.0.0.1:{fleet}",
                              "--control-api-address", f"127.0.0.1:{control}"]}
    for pid in range(NODES):
        commands[f"supernode-{pid}"] = [
            "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{fleet}",
            "--clientappio-api-address", f"127.0.0.1:{clientappio[pid]}",
            "--node-config", f'partition-id={pid} num-partitions={NODES} '
                             f'{CERTS_KEY}="{certs}"']
    logs = {name: home / f"{name}.log" for name in commands}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            with logs[name].open("wb") as log:
                # Own process group each: teardown stops every process Flower started.
                processes.append(track(subprocess.Popen(
                    [str(BIN / command[0]), *command[1:]], env=env, cwd=home,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
                    group=True))
        node_partitions = {node_id_from_log(logs[f"supernode-{pid}"]): pid
                           for pid in range(NODES)}
        yield Deployment(home, pipe_dir, env, logs, node_partitions)
    finally:
        for proc in processes:
            with _suppress_lookup():
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with _suppress_lookup():
                os.killpg(proc.pid, signal.SIGKILL)  # whatever Flower left in the group
        shutil.rmtree(pipe_dir, ignore_errors=True)


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is ProcessLookupError


def run_example(deployment: Deployment, tmp_path: Path, method: str, privacy: str,
                options: FitOptions, timeout: float, **config: object) -> tuple[dict, str]:
    """The app's result.json, and what ``flwr run --stream`` showed of the ServerApp."""
    out = tmp_path / "out"
    settings = {"method": method, "privacy": privacy, "preset": options.preset,
                "relative-epsilon": options.relative_epsilon, "out-dir": str(out),
                "num-server-rounds": 1, "timeout": 120.0, **config}
    run_config = " ".join(f"{key}={json.dumps(value)}" for key, value in settings.items())
    try:
        finished = deployment.run(run_config, timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"flwr run still running after {timeout} s\n"
                             f"{deployment.log_tail()}") from None
    result = out / "result.json"
    assert finished.returncode == 0 and result.exists(), (
        f"{finished.stdout[-4000:]}\n{finished.stderr[-2000:]}\n{deployment.log_tail()}")
    return json.loads(result.read_text()), finished.stdout + finished.stderr


def check_against_simulation(deployment: Deployment, document: dict, method: str,
                             privacy: str, options: FitOptions, rtol: float) -> None:
    parties = {int(p): node for p, node in document["parties"].items()}
    assert sorted(parties.values()) == sorted(deployment.node_partitions)
    partition_ids = [deployment.node_partitions[parties[p]] for p in sorted(parties)]
    expected = expected_normalizer(partition_ids, method, privacy, options)
    assert document["params"].keys() == expected.keys()
    for name, values in expected.items():
        np.testing.assert_allclose(document["params"][name], values, rtol=rtol, atol=0)


def test_the_example_app_fits_in_flower_what_the_in_memory_simulation_fits(
    deployment: Deployment, tmp_path: Path,
) -> None:
    # A coarser rank search than the default keeps the number of Flower rounds (each a
    # few seconds on a SuperNode) small; the simulation runs with the same options.
    options = FitOptions(relative_epsilon=1e-2)
    started = time.monotonic()
    document, log = run_example(deployment, tmp_path, "robust", "plain", options,
                                timeout=240)
    seconds = time.monotonic() - started

    check_against_simulation(deployment, document, "robust", "plain", options, rtol=1e-12)
    assert document["features"] == bcw_features()
    check_quartiles_against_numpy(document["params"], options.relative_epsilon)
    assert document["flower_rounds"] == document["protocol_rounds"] + 1  # + the result
    # The ServerApp's log shows the run's progress: phase, round, bytes so far.
    assert re.search(r"fednorm robust-plain: rank search round \d+ of ~\d+ · Flower round "
                     r"\d+ · [\d.]+ kB sent", log), log[-3000:]
    # Step 2 ran: FedAvg on the normalized data learned the task.
    final = document["evaluate"][str(max(map(int, document["evaluate"])))]
    assert final["eval-acc"] > 0.9, document["evaluate"]
    wait_until_gone(deployment.pipe_dir)
    print(f"robust-plain in Flower: {document['protocol_rounds']} protocol rounds, "
          f"{document['seconds']:.1f} s; whole app {seconds:.1f} s")


@pytest.mark.slow
def test_the_example_app_runs_its_ppf_robust_scaling_in_flower(
    deployment: Deployment, tmp_path: Path,
) -> None:
    """The README's PPF run of the example: robust scaling under MHE, test preset, the
    app's own precision; the default algorithm's quartiles are numpy's, exactly."""
    options = FitOptions(preset="test", relative_epsilon=1e-9)
    document, _ = run_example(deployment, tmp_path, "robust", "mhe", options, timeout=900)
    check_against_simulation(deployment, document, "robust", "mhe", options, rtol=0)
    check_quartiles_against_numpy(document["params"], 0.0)
    final = document["evaluate"][str(max(map(int, document["evaluate"])))]
    assert final["eval-acc"] > 0.9, document["evaluate"]
    wait_until_gone(deployment.pipe_dir)
    print(f"robust-mhe in Flower: {document['protocol_rounds']} protocol rounds in "
          f"{document['flower_rounds']} Flower rounds, {document['seconds']:.1f} s")
