"""fednorm inside Flower, on an in-process Grid: the relay between ServerApp, ClientApp
and real party workers, the causes that travel, workers that end (the example app on
Flower's local deployment runtime: test_flower_deployment.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flower_nodes import (
    NODES,
    check_quartiles_against_numpy,
    expected_normalizer,
    pooled_training_rows,
    short_private_dir,
    wait_until_gone,
    worker_processes,
)
from flower_robust.server_app import write_result
from flower_robust.task import bcw_features, load_partition
from flwr.app import Context
from flwr.clientapp import ClientApp
from loopback_grid import LoopbackGrid
from recording import KEY_SETUP_KINDS, Recorder, session_kinds

from fednorm.engine.errors import InputError, PartyDropped, RunAborted
from fednorm.flower import fitted_normalizer, normalize, register_party
from fednorm.flower.client import ALLOW_UNFLOODED_KEY, CERTS_ENV, CERTS_KEY
from fednorm.flower.localpipe import PIPE_DIR_ENV, array_to_wire, exchange
from fednorm.protocols import FitOptions
from fednorm.transport.tls import init_certs

# -- the relay on an in-process Grid: real ClientApp handlers, real party workers ---------
NODE_IDS = [9001, 4242, 777]


@pytest.fixture
def pipe_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = short_private_dir("fnl-")
    monkeypatch.setenv(PIPE_DIR_ENV, str(directory))
    yield directory
    for pid in worker_processes(directory):  # only if a test failed half-way
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def loopback(load: Callable[[Context], np.ndarray]) -> LoopbackGrid:
    app = ClientApp()
    register_party(app, load)
    return LoopbackGrid(app, NODE_IDS)


def partition_of(context: Context) -> np.ndarray:
    return load_partition(NODE_IDS.index(context.node_id), NODES).X_train


def test_each_protocol_round_is_one_flower_round_and_every_node_keeps_the_result(
    pipe_dir: Path,
) -> None:
    grid = loopback(partition_of)
    progress: list[str] = []
    fitted = normalize(grid, NODE_IDS, "robust", "plain", progress=progress.append)

    expected = expected_normalizer([0, 1, 2], "robust", "plain", FitOptions())
    assert fitted.normalizer.params() == expected  # plaintext runs are bit-for-bit
    check_quartiles_against_numpy(expected, FitOptions().relative_epsilon)
    assert fitted.parties == {1: 9001, 2: 4242, 3: 777}
    assert fitted.flower_rounds == fitted.protocol_rounds + 1  # + the result broadcast
    for context in grid.contexts.values():
        assert fitted_normalizer(context).params() == expected
    wait_until_gone(pipe_dir)
    # The server's log tells the phase, the Flower round and bytes so far as the run goes:
    # one count of the run's rounds, Flower's (the search's own round is its phase's).
    shape = re.compile(r"fednorm robust-plain: ([a-z ]+?)(?: round \d+ of ~\d+)? · "
                       r"Flower round (\d+) · [\d.]+ [kM]?B sent, [\d.]+ [kM]?B received · \d+ s")
    shown = [shape.fullmatch(line) for line in progress]
    assert all(shown), [line for line, match in zip(progress, shown, strict=True) if not match]
    flower = [int(match[2]) for match in shown if match]
    assert flower == sorted(flower) and flower[0] == 1
    assert progress[0].startswith("fednorm robust-plain: upload · Flower round 1 · ")
    assert any(re.search(r"rank search round 5 of ~\d+ · ", line) for line in progress)
    # The result goes out in the last Flower round, after the last line.
    assert progress[-1].startswith(f"fednorm robust-plain: result · Flower round "
                                   f"{fitted.flower_rounds - 1} · ")
    sent = [float(n) for n in re.findall(r"· ([\d.]+) kB sent", "\n".join(progress))]
    assert sent == sorted(sent) and len(sent) >= fitted.protocol_rounds // 2


def test_a_node_with_bad_data_stops_the_session_and_every_worker(
    pipe_dir: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    """As ``fednorm party`` refuses data it cannot use: the ServerApp hears the kind and
    the remedy, the node's log the detail."""
    def load(context: Context) -> np.ndarray:
        X = partition_of(context)
        return X[:, 0] if context.node_id == 4242 else X  # 1-D: not a feature matrix

    with pytest.raises(RunAborted) as refused:
        normalize(loopback(load), NODE_IDS, "robust", "plain")
    assert str(refused.value) == ("party 2 refused its input: its data cannot be used; fix "
                                  "its data: that party's own log names the columns and the "
                                  "cause")
    wait_until_gone(pipe_dir)
    assert (f"fednorm node 4242: {refused.value}: party data must be a 2-D array"
            in capfd.readouterr().err)


def test_a_node_with_values_beyond_vabs_names_them_in_its_log_and_the_remedy_to_the_server(
    pipe_dir: Path, certs: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    """The cause travels as over TCP: the ServerApp's error names the kind and the remedy
    (the words ``fednorm serve`` reports), never the values; the node's log names them."""
    def load(context: Context) -> np.ndarray:
        X = partition_of(context).copy()
        if context.node_id == 4242:
            X[0, 2] = -5e4
        return X

    grid = loopback(load)
    for context in grid.contexts.values():
        context.node_config[CERTS_KEY] = str(certs)
        context.node_config[ALLOW_UNFLOODED_KEY] = True
    options = FitOptions(algorithm="paper", preset="test", vabs=(4e3,))
    with pytest.raises(RunAborted) as refused:
        normalize(grid, NODE_IDS, "minmax", "mhe", options, features=bcw_features())
    assert str(refused.value) == ("party 2 refused its input: values beyond the agreed V_abs; "
                                  "agree on a larger V_abs (vabs), one that bounds every "
                                  "party's values")
    wait_until_gone(pipe_dir)
    log = capfd.readouterr().err
    assert (f"fednorm party worker: {refused.value}: values beyond the agreed bound vabs: "
            "'perimeter_mean' (|x| up to 50000, bound 4000)") in log, log
    assert log.count("50000") == 1  # on party 2's log only: the others heard the cause


def test_the_columns_names_reach_every_fit_and_the_example_s_result_json(
    pipe_dir: Path, tmp_path: Path,
) -> None:
    grid = loopback(partition_of)
    names = bcw_features()
    fitted = normalize(grid, NODE_IDS, "zscore", "plain", features=names)
    assert fitted.normalizer.params() == expected_normalizer([0, 1, 2], "zscore", "plain",
                                                             FitOptions())
    assert fitted.normalizer.feature_names == tuple(names)
    for context in grid.contexts.values():  # the nodes' fits carry them too
        assert fitted_normalizer(context).feature_names == tuple(names)
    write_result(tmp_path, {"method": "zscore", "privacy": "plain"}, fitted, {})
    document = json.loads((tmp_path / "result.json").read_text())
    assert document["features"] == names  # as `fednorm simulate --json` writes them
    assert len(document["params"]["mean"]) == len(names)
    wait_until_gone(pipe_dir)


def test_a_node_whose_columns_the_server_does_not_name_refuses_the_session(
    pipe_dir: Path,
) -> None:
    with pytest.raises(RunAborted, match=r"party \d refused the session: its data has 30 "
                       r"columns, the ServerApp names 2 \(a, b\)"):
        normalize(loopback(partition_of), NODE_IDS, "zscore", "plain", features=["a", "b"])
    with pytest.raises(InputError, match="features names a more than once"):
        normalize(loopback(partition_of), NODE_IDS, "zscore", "plain", features=["a", "a"])
    wait_until_gone(pipe_dir)


def test_a_node_s_dataframe_is_matched_by_name_and_other_columns_refuse_the_session(
    pipe_dir: Path,
) -> None:
    """Nodes that load DataFrames with their columns in other orders fit what arrays in
    the ServerApp's order fit; a node whose columns are named otherwise refuses the
    session, and the ServerApp's error names the columns (before, only their number was
    checked, and the frames were pooled column by column)."""
    import pandas as pd

    names = bcw_features()
    def shuffled(context: Context) -> pd.DataFrame:
        order = np.random.default_rng(context.node_id).permutation(len(names))
        return pd.DataFrame(partition_of(context), columns=names).iloc[:, order]

    fitted = normalize(loopback(shuffled), NODE_IDS, "zscore", "plain", features=names)
    assert fitted.normalizer.params() == expected_normalizer([0, 1, 2], "zscore", "plain",
                                                             FitOptions())

    def renamed(context: Context) -> pd.DataFrame:
        frame = shuffled(context)
        return frame.rename(columns={names[0]: "id"}) if context.node_id == NODE_IDS[1] \
            else frame

    with pytest.raises(RunAborted, match=rf"party 2 refused the session: party 2's columns "
                       rf"differ from the federation's: lacks '{names[0]}' and has "
                       r"unexpected 'id'"):
        normalize(loopback(renamed), NODE_IDS, "zscore", "plain", features=names)
    wait_until_gone(pipe_dir)


def test_a_worker_killed_mid_protocol_fails_the_run_and_leaves_nothing_behind(
    pipe_dir: Path,
) -> None:
    grid = loopback(partition_of)

    def kill_one_worker(pushes: int) -> None:
        if pushes == 3:
            workers = worker_processes(pipe_dir)
            assert len(workers) == NODES
            os.kill(workers[0], signal.SIGKILL)

    grid.before_push = kill_one_worker
    with pytest.raises(PartyDropped, match="party worker is gone"):
        normalize(grid, NODE_IDS, "robust", "plain")
    wait_until_gone(pipe_dir)


def start_worker_process(pipe: Path, *args: str) -> subprocess.Popen[bytes]:
    worker = subprocess.Popen([sys.executable, "-m", "fednorm.flower.worker", "--pipe",
                               str(pipe), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"
    assert pipe.exists()
    return worker


def test_a_worker_whose_node_goes_away_stops_and_removes_its_socket(pipe_dir: Path) -> None:
    supervisor = subprocess.Popen(["sleep", "60"])  # stands for the node's SuperExec
    try:
        worker = start_worker_process(pipe_dir / "w.sock", "--watch-pid", str(supervisor.pid),
                                      "--timeout", "60")
        supervisor.kill()
        supervisor.wait()
        _, err = worker.communicate(timeout=10)
    finally:
        supervisor.kill()
        supervisor.wait()
    assert worker.returncode == 1 and b"stopped before the session ended" in err
    assert not (pipe_dir / "w.sock").exists()


def test_a_worker_that_hears_nothing_within_its_timeout_stops(pipe_dir: Path) -> None:
    worker = start_worker_process(pipe_dir / "w.sock", "--timeout", "0.5")
    _, err = worker.communicate(timeout=10)
    assert worker.returncode == 1 and b"no ClientApp run came back within 0.5 s" in err
    assert not (pipe_dir / "w.sock").exists()


def test_a_worker_whose_server_goes_silent_mid_session_ends_its_role_as_a_dropout(
        pipe_dir: Path) -> None:
    """The first run starts the party (it answers with its first frames); when no run
    comes after it, the role ends as over TCP when the server is gone: PartyDropped."""
    pipe = pipe_dir / "w.sock"
    worker = start_worker_process(pipe, "--timeout", "1")
    setup = {"party": 1, "parties": 1, "session": "s", "methods": ["zscore"],
             "privacy": "plain", "options": {}, "timeout": 60.0,
             "X": array_to_wire(np.ones((4, 2)))}
    answer = exchange(pipe, {"session": "s", "party": 1, "frames": [], "setup": setup}, 30)
    assert answer["status"] == "waiting" and answer["frames"]
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 1
    assert b"server dropped: no ClientApp run came back within 1 s" in err
    assert not pipe.exists()


def test_a_session_of_several_methods_leaves_each_fit_on_every_node(pipe_dir: Path) -> None:
    grid = loopback(partition_of)
    fitted = normalize(grid, NODE_IDS, "zscore,robust", "plain")
    assert list(fitted.normalizers) == ["zscore", "robust"]
    assert list(fitted.traffic) == ["zscore-plain", "robust-plain"]
    for method in ("zscore", "robust"):
        expected = expected_normalizer([0, 1, 2], method, "plain", FitOptions())
        assert fitted.normalizers[method].params() == expected
        for context in grid.contexts.values():
            assert fitted_normalizer(context, method).params() == expected
    with pytest.raises(InputError, match="fitted zscore, robust: name one"):
        fitted.normalizer  # noqa: B018
    with pytest.raises(InputError, match="fitted zscore, robust: name one"):
        fitted_normalizer(grid.contexts[777])
    wait_until_gone(pipe_dir)


def test_a_flower_session_of_several_ppf_methods_generates_the_joint_keys_once(
    pipe_dir: Path, certs: Path,
) -> None:
    recorder = Recorder()
    options = FitOptions(algorithm="paper",
                         preset="test", vabs=(4e3,), minmax_bits=4, minmax_passes=2)
    grid = loopback(partition_of)
    for context in grid.contexts.values():  # each party signs its key shares
        context.node_config[CERTS_KEY] = str(certs)
        context.node_config[ALLOW_UNFLOODED_KEY] = True
    fitted = normalize(grid, NODE_IDS, ["zscore", "minmax"], "mhe", options, tracer=recorder)
    assert list(fitted.traffic) == ["keys-mhe", "zscore-mhe", "minmax-mhe"]
    kinds = session_kinds(recorder, "paper")  # every frame within its step's ledger
    assert list(kinds) == list(fitted.traffic)  # in this order
    assert {"ckks.lead_keys", "ckks.relin_round2"} <= kinds["keys-mhe"]
    assert not (kinds["zscore-mhe"] | kinds["minmax-mhe"]) & KEY_SETUP_KINDS
    assert fitted.traffic["keys-mhe"].bytes_sent > 2 * fitted.traffic["keys-mhe"].bytes_received
    pooled = pooled_training_rows()
    np.testing.assert_allclose(fitted.normalizers["zscore"].mean, pooled.mean(axis=0),
                               rtol=1e-6)
    for context in grid.contexts.values():
        assert fitted_normalizer(context, "minmax").params() == \
            fitted.normalizers["minmax"].params()
    wait_until_gone(pipe_dir)


def test_a_node_joins_the_paper_algorithms_only_when_its_config_allows(
    pipe_dir: Path, certs: Path,
) -> None:
    """Their bootstrap and decryption requests cannot be checked against a deviating
    server: a node whose config does not set ``fednorm-allow-paper-algorithms`` refuses
    the session before it makes a key share, and the ServerApp reports its reason."""
    grid = loopback(partition_of)
    for node, context in grid.contexts.items():
        context.node_config[CERTS_KEY] = str(certs)
        context.node_config[ALLOW_UNFLOODED_KEY] = "true" if node != NODE_IDS[1] else "no"
    options = FitOptions(algorithm="paper", preset="test")
    with pytest.raises(PartyDropped, match="party 2 refused the session: zscore-mhe with "
                       "--algorithm paper decrypts without a proven flooding bound"):
        normalize(grid, NODE_IDS, "zscore", "mhe", options)
    wait_until_gone(pipe_dir)


def test_a_ppf_session_needs_each_node_s_signing_key(
    pipe_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CERTS_ENV, raising=False)
    grid = loopback(partition_of)  # no fednorm-certs in the node config, nor environment
    with pytest.raises(PartyDropped, match=r"party \d has no signing key"):
        normalize(grid, NODE_IDS, "zscore", "mhe", FitOptions(preset="test"))
    wait_until_gone(pipe_dir)


def test_a_node_whose_config_names_no_certs_takes_them_from_the_environment(
    pipe_dir: Path, certs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Flower's simulation runtime gives each simulated node only its partition-id and
    num-partitions; its nodes find their signing keys through $FEDNORM_FLOWER_CERTS."""
    monkeypatch.setenv(CERTS_ENV, str(certs))
    grid = loopback(partition_of)  # no fednorm-certs in the node config
    fitted = normalize(grid, NODE_IDS, "zscore", "mhe", FitOptions(preset="test"))
    np.testing.assert_allclose(fitted.normalizer.mean, pooled_training_rows().mean(axis=0),
                               rtol=1e-6)
    wait_until_gone(pipe_dir)


def test_bad_arguments_are_refused_before_any_message(pipe_dir: Path) -> None:
    grid = loopback(partition_of)
    with pytest.raises(InputError, match="unknown method"):
        normalize(grid, NODE_IDS, "median", "plain")
    with pytest.raises(InputError, match="distinct node ids"):
        normalize(grid, [1, 1], "robust", "plain")
    with pytest.raises(InputError, match="not finished"):
        fitted_normalizer(grid.contexts[777])
    assert grid.pushes == 0


def test_without_flower_the_core_still_imports_and_the_error_says_what_to_install() -> None:
    script = ("import sys; sys.modules['flwr'] = None\n"
              "import fednorm.protocols, fednorm.flower.worker\n"
              "try:\n    import fednorm.flower.client\n"
              "except ImportError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "pip install 'fednorm[flower]'" in done.stdout




def test_a_ppf_key_setup_takes_two_flower_rounds_at_five_nodes(
    pipe_dir: Path, tmp_path: Path,
) -> None:
    """A node sends its key shares as soon as it has made them: over TCP a party waits
    for the earlier parties' (the server forwards them while it reads), which in Flower
    cost a round per party; 5 nodes took 5 rounds of key setup, now 2."""
    ids = [11, 12, 13, 14, 15]
    app = ClientApp()
    register_party(app, lambda context: load_partition(ids.index(context.node_id),
                                                       len(ids)).X_train)
    grid = LoopbackGrid(app, ids)
    init_certs(tmp_path, parties=len(ids))
    for context in grid.contexts.values():
        context.node_config[CERTS_KEY] = str(tmp_path)
    progress: list[str] = []
    normalize(grid, ids, "zscore", "mhe", FitOptions(preset="test"),
              progress=progress.append)
    setup = [int(m[1]) for line in progress
             if (m := re.search(r": key setup · Flower round (\d+) ", line))]
    assert setup and max(setup) == 2, progress
    wait_until_gone(pipe_dir)
