"""Tests of the study's grid, its resumable results file, and ``fednorm experiment``
(the report and what the results README quotes: test_study_report.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from study_files import read_rows, row_for

from fednorm.cli import main
from fednorm.engine.errors import InputError
from fednorm.training.grid import (
    COLUMNS,
    KEY_COLUMNS,
    Cell,
    GridRequest,
    ResultStore,
    build_grid,
)

REPO = Path(__file__).resolve().parents[1]
TINY = ["--datasets", "bcw", "--skews", "iid,label:5", "--clients", "3",
        "--normalizations", "none,federated_minmax", "--seeds", "0", "--min-rounds", "0",
        "--max-rounds", "2"]



def keys(rows: list[dict[str, str]]) -> list[tuple[str, ...]]:
    return [tuple(row[c] for c in KEY_COLUMNS) for row in rows]


# --- the grid ----------------------------------------------------------------------------


def test_presets_are_the_papers_grid():
    tabular = build_grid(GridRequest(preset="tabular"))
    # datasets × skews × clients × (12 normalizations + 3 references) × seeds, and the
    # lookup reference on both Parkinson's readings
    assert len(tabular) == (4 * 15 + 2) * 7 * 3 * 5
    assert "instance_norm" not in {c.normalization for c in tabular}  # = layer norm on MLPs
    references = {"central_model", "central_linear", "central_majority"}
    assert references <= {c.normalization for c in tabular if c.dataset == "hcv"}
    assert {c.dataset for c in tabular if c.normalization == "central_lookup"} == {
        "parkinsons", "parkinsons_patients"}
    digits = build_grid(GridRequest(preset="digits"))
    assert len(digits) == 7 * 3 * 14 * 5  # no Yeo-Johnson on images, instance norm kept
    assert "instance_norm" in {c.normalization for c in digits}
    mnist = build_grid(GridRequest(preset="mnist"))
    assert {c.dataset for c in mnist} == {"mnist"} and {c.clients for c in mnist} == {10, 20, 50}
    assert {c.skew for c in digits} >= {"feature:0.01", "feature:0.1", "quantity:0.7"}
    assert {c.clients for c in digits} == {10, 20, 50}
    assert {c.skew for c in tabular} >= {"feature:0.3", "feature:0.7", "label:0.5", "label:5"}


def test_flags_narrow_the_grid_in_canonical_spelling():
    cells = build_grid(GridRequest(datasets=["HCV"], skews=["Label:5.0", "label:5", "iid"],
                                   clients=[10], normalizations=["Batch_Norm"], seeds=[4]))
    assert cells == [Cell("hcv", "label:5", 10, "batch_norm", 4),
                     Cell("hcv", "iid", 10, "batch_norm", 4)]


@pytest.mark.parametrize(("request_", "message"), [
    (GridRequest(datasets=["bcw", "iris"]), "unknown dataset 'iris'"),
    (GridRequest(preset="everything"), "unknown preset"),
    (GridRequest(skews=["label"]), "cannot read split"),
    (GridRequest(skews=["quantity:0"]), "out of range"),
    (GridRequest(normalizations=["local_boxcox"]), "unknown normalization"),
    (GridRequest(clients=[0]), "client count"),
    (GridRequest(seeds=[-1]), "seed"),
    (GridRequest(privacy="secret"), "unknown privacy"),
])
def test_bad_grid_requests_are_input_errors(request_, message):
    with pytest.raises(InputError, match=message):
        build_grid(request_)


# --- the results file --------------------------------------------------------------------


def test_store_skips_done_cells_and_drops_a_half_written_row(tmp_path):
    path = tmp_path / "r.csv"
    a, b = Cell("bcw", "iid", 10, "none", 0), Cell("bcw", "iid", 10, "none", 1)
    with ResultStore(path) as store:
        store.append(row_for(a, test_f1=0.9))
        assert store.pending([a, b]) == [b]
    with path.open("a", encoding="utf-8") as stream:
        stream.write("bcw,iid,10,none,1,pla")  # killed in the middle of a row
    with ResultStore(path) as store:
        assert store.pending([a, b]) == [b]
        store.append(row_for(b, test_f1=0.8))
    assert keys(read_rows(path)) == [a.key(), b.key()]


def test_a_store_that_wrote_no_row_leaves_no_file(tmp_path):
    """An experiment that fails before its first run finishes leaves no header-only CSV;
    an existing results file is kept as it was, and a header comes with the first row."""
    path = tmp_path / "r.csv"
    with pytest.raises(RuntimeError), ResultStore(path):
        raise RuntimeError("the experiment failed")
    assert not path.exists()
    a = Cell("bcw", "iid", 10, "none", 0)
    with ResultStore(path) as store:
        store.append(row_for(a, test_f1=0.9))
    with ResultStore(path):
        pass
    assert keys(read_rows(path)) == [a.key()]


def test_store_refuses_a_foreign_file_and_a_second_writer(tmp_path):
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a fednorm results file"):
        ResultStore(foreign)
    older = tmp_path / "older.csv"
    older.write_text(",".join(c for c in COLUMNS if c != "test_macro_f1") + "\n")
    with pytest.raises(InputError, match=r"another fednorm version \(missing: test_macro_f1\)"):
        ResultStore(older)
    with ResultStore(tmp_path / "r.csv"), pytest.raises(InputError, match="in use"):
        ResultStore(tmp_path / "r.csv")


# --- fednorm experiment ------------------------------------------------------------------


def test_experiment_runs_once_and_a_rerun_adds_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "results.csv"
    assert main(["experiment", *TINY, "--out", str(out)]) == 0
    rows = read_rows(out)
    assert len(rows) == 4 and all(row["status"] == "ok" for row in rows)
    assert all(0 <= float(row["test_f1"]) <= 1 and row["rounds"] == "2" for row in rows)
    assert {row["normalization"] for row in rows} == {"none", "federated_minmax"}
    assert "4 runs to do" in capsys.readouterr().err
    assert main(["experiment", *TINY, "--out", str(out)]) == 0
    assert read_rows(out) == rows
    assert "0 runs finished" in capsys.readouterr().out


def test_an_encrypted_experiment_records_its_privacy_and_protocol_cost(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "mhe.csv"
    flags = ["--datasets", "bcw", "--skews", "iid", "--clients", "3", "--seeds", "0",
             "--normalizations", "federated_zscore", "--min-rounds", "0", "--max-rounds", "1",
             "--out", str(out)]
    assert main(["experiment", *flags, "--privacy", "mhe", "--ckks-preset", "test"]) == 0
    assert main(["experiment", *flags]) == 0
    encrypted, plain = read_rows(out)
    assert (encrypted["privacy"], encrypted["status"], plain["privacy"]) == ("mhe", "ok", "plain")
    assert int(encrypted["norm_bytes"]) > 10 * int(plain["norm_bytes"])
    assert abs(float(encrypted["test_f1"]) - float(plain["test_f1"])) < 0.02


def test_stacked_and_one_at_a_time_experiments_record_the_same_results(tmp_path):
    """A partition's runs train in one stack by default; --no-stack trains each alone.

    One round: in float32 the two differ by rounding (the products run in other shapes),
    which Adam's normalized steps amplify over many rounds, more so for batch norm on
    raw features; the float64 equality is tested in test_training.py."""
    pytest.importorskip("torch")
    grid = ["--datasets", "bcw", "--skews", "label:5", "--clients", "3",
            "--normalizations", "none,local_zscore,federated_zscore,batch_norm,group_norm",
            "--seeds", "1", "--min-rounds", "0", "--max-rounds", "1"]
    results = {}
    for name, flags in (("stacked", []), ("alone", ["--no-stack"])):
        out = tmp_path / f"{name}.csv"
        assert main(["experiment", *grid, *flags, "--out", str(out)]) == 0
        results[name] = {row["normalization"]: row for row in read_rows(out)}
    assert len(results["stacked"]) == 5
    for normalization, row in results["alone"].items():
        stacked = results["stacked"][normalization]
        assert row["status"] == stacked["status"] == "ok"
        assert (row["rounds"], row["best_round"]) == (stacked["rounds"], stacked["best_round"])
        for column in ("test_f1", "test_accuracy", "best_val_loss"):
            assert float(row[column]) == pytest.approx(float(stacked[column]), rel=1e-5,
                                                       abs=1e-5)


def test_a_killed_experiment_continues_where_it_stopped(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "results.csv"
    grid = ["--datasets", "bcw", "--skews", "iid,label:5", "--clients", "5",
            "--normalizations", "none,local_zscore,batch_norm", "--seeds", "0,1",
            "--min-rounds", "0", "--max-rounds", "5"]
    command = [sys.executable, "-m", "fednorm", "experiment", *grid, "--out", str(out)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if out.exists() and len(read_rows(out)) >= 1:
                break
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    done_before = len(read_rows(out))
    assert 1 <= done_before < 12, "the run should have been killed midway"
    assert main(["experiment", *grid, "--out", str(out)]) == 0
    rows = read_rows(out)
    assert len(rows) == 12 and len(set(keys(rows))) == 12


def test_a_cell_the_data_cannot_support_is_recorded_as_failed(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "results.csv"
    assert main(["experiment", "--datasets", "bcw", "--skews", "iid", "--clients", "40",
                 "--normalizations", "none", "--seeds", "0", "--out", str(out)]) == 0
    (row,) = read_rows(out)
    assert row["status"] == "error" and "40 clients cannot each keep 10 training" in row["error"]


@pytest.mark.parametrize("flags", [
    ["--datasets", "bcw,nope"],
    ["--normalizations", "federated_zscore,local_nonsense"],
    ["--skews", "iid,label:-1"],
    ["--max-rounds", "0"],
])
def test_bad_experiment_input_exits_2_before_any_work(tmp_path, capsys, flags):
    out = tmp_path / "results.csv"
    assert main(["experiment", *flags, "--out", str(out)]) == 2
    assert "fednorm: error:" in capsys.readouterr().err
    assert not out.exists()


def test_a_missing_data_file_fails_before_training(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "results.csv"
    code = main(["experiment", "--datasets", "hcv", "--data-dir", str(tmp_path),
                 "--seeds", "0", "--out", str(out)])
    assert code == 2 and "--data-dir" in capsys.readouterr().err
    assert not out.exists()  # no header-only results file


def test_dry_run_counts_without_running(tmp_path, capsys):
    out = tmp_path / "results.csv"
    assert main(["experiment", "--preset", "tabular", "--dry-run", "--out", str(out)]) == 0
    assert "6510 runs in the grid" in capsys.readouterr().out and not out.exists()


def test_simulate_report_and_dry_run_work_without_torch(tmp_path):
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from fednorm.cli import main\n"
        "assert main(['simulate', '--parties', '3', '--json']) == 0\n"
        "assert main(['experiment', '--dry-run', '--out', sys.argv[1]]) == 0\n"
        "assert main(['experiment', '--seeds', '0', '--out', sys.argv[1]]) == 2\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "r.csv")], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "train extra" in result.stderr


