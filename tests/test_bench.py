"""Smoke tests of ``fednorm bench``: the quick mode of two sections at the test preset,
plus the pure parts (the paper's formulas, input checks), and the time breakdown read from
the role contexts' tracer hooks."""

import json

import numpy as np
import pytest

from fednorm.bench import cases, communication, kth, protocols, report
from fednorm.cli import main
from fednorm.engine.errors import InputError


def test_scaling_section_through_the_cli(tmp_path) -> None:
    out, rows = tmp_path / "report.md", tmp_path / "rows.json"
    code = main(["bench", "--quick", "--sections", "scaling", "--scaling-parties", "2,3",
                 "--out", str(out), "--json", str(rows)])
    assert code == 0
    data = json.loads(rows.read_text())
    small, large = sorted(data["scaling"], key=lambda r: r["parties"])
    assert (small["parties"], large["parties"]) == (2, 3)
    # One more party: more uploads, more key shares, more decryption shares.
    assert large["bytes_total"] > small["bytes_total"]
    assert large["bytes_protocol"] > small["bytes_protocol"]
    assert large["server_received"] > small["server_received"]
    for row in (small, large):
        assert 0 < row["bytes_protocol"] < row["bytes_total"]
        assert max(row["errors"].values()) < 1e-5  # PPF z-score vs numpy
    comm = {r["parties"]: r for r in data["communication"]}
    assert comm[3]["paper_formula"] > comm[2]["paper_formula"] > 0
    text = out.read_text()
    assert text.startswith(report.GENERATED_MARKER)
    assert "Totals vs the number of parties" in text and "Communication" in text
    assert (tmp_path / "plots" / "time_vs_parties.png").stat().st_size > 1000
    assert "](plots/bytes_vs_parties.png)" in text


def test_plain_section_times_each_protocol_beside_sklearn(tmp_path) -> None:
    out, rows = tmp_path / "report.md", tmp_path / "rows.json"
    assert main(["bench", "--quick", "--sections", "plain", "--out", str(out),
                 "--json", str(rows)]) == 0
    data = json.loads(rows.read_text())["plain"]
    assert [r["method"] for r in data] == ["zscore", "minmax", "robust", "yeojohnson"]
    for row in data:
        assert row["fednorm_s"] > 0 and row["sklearn_s"] > 0
        # Plain federated fits are the pooled ones: quartiles within ε = 1e-9 × range,
        # Yeo-Johnson's λ within the README's 1e-4 of scikit-learn's (both maximize a
        # likelihood that is flat at the top), the rest to rounding.
        bound = {"robust": 1e-6, "yeojohnson": 1e-4}.get(row["method"], 1e-9)
        assert max(row["relative_error"].values()) < bound
    assert "Plain protocols against scikit-learn" in out.read_text()


def test_threads_section_runs_each_layout_in_its_own_process(tmp_path) -> None:
    rows = tmp_path / "rows.json"
    assert main(["bench", "--quick", "--sections", "threads", "--out",
                 str(tmp_path / "r.md"), "--json", str(rows)]) == 0
    data = json.loads(rows.read_text())["threads"]
    assert [(r["workers"], r["omp"]) for r in data] == [(1, 1), (2, 1)]
    assert all(r["median_s"] > 0 for r in data)


def test_kth_rounds_grow_as_epsilon_shrinks() -> None:
    rng = np.random.default_rng(3)
    parts = [rng.uniform(0, 10, size=(9, 2)) for _ in range(2)]
    section, records = kth.kth_vs_epsilon((1.0, 1e-2), preset="test", parts=parts)
    coarse, fine = sorted(section.rows, key=lambda r: -r["epsilon"])
    assert fine["rounds"] > coarse["rounds"] >= 1
    assert fine["rounds"] <= coarse["rounds"] + 8  # log2(1 / 1e-2) < 7 more halvings
    for row in (coarse, fine):
        assert row["error_over_epsilon"] <= 0.5 + 1e-6  # the median is within ε/2
        assert 0 < row["kth_s"] < row["total_s"]  # the server's kth phase, from its tracer
    assert all(r.bytes_protocol > 0 for r in records)


def test_paper_formulas_grow_with_parties_and_rounds() -> None:
    c, p = 6.29e6, 3.15e6
    for method in ("zscore", "minmax", "robust"):
        assert communication.paper_bytes(method, 20, c, p, x=30) > communication.paper_bytes(
            method, 10, c, p, x=30)
    assert communication.paper_bytes("kth", 10, c, p, x=20) == pytest.approx(
        2 * communication.paper_bytes("kth", 10, c, p, x=10))
    # z-score at P=10 with K_inv = 13: 3P|c| + 3(P-1)|c| + 13(P-1)|c| = 174 |c|
    assert communication.paper_bytes("zscore", 10, c, p) == pytest.approx(174 * c)


def test_bad_bench_input_is_rejected_before_work(tmp_path) -> None:
    with pytest.raises(InputError):
        report.BenchPlan(sections=("tables",))
    with pytest.raises(InputError):
        report.BenchPlan.quick_plan(scaling_parties=(1, 3))
    with pytest.raises(InputError):
        report.BenchPlan(epsilons=(0.0,))
    with pytest.raises(InputError):  # a benchmark case's name, not a method's
        report.BenchPlan(cases=("zscore_reveal",))
    with pytest.raises(InputError):
        report.BenchPlan(zscore_modes=("default",))
    assert main(["bench", "--quick", "--results", str(tmp_path / "RESULTS.md")]) == 2


def test_zscore_breakdown_and_noise_come_from_the_tracer_hooks() -> None:
    from fednorm.bench import noise, zscore

    section = zscore.table_v(repeats=1, parties=3, preset="test", modes=("inverse",))
    (row,) = section.rows
    assert {"setup", "inverse", "bootstrap", "decrypt", zscore.OUTSIDE} <= set(row["phases"])
    assert row["phase_counts"]["decrypt_product"] == 1  # the presence bits
    assert row["phase_counts"]["decrypt"] == 4  # two passes of mean and variance
    assert row["calls"]["encode_body"] > 0 and len(row["calls"]) > 5
    assert sum(row["phases"].values()) == pytest.approx(row["median_s"], rel=1e-6)
    assert max(row["err_mean"], row["err_var"]) < 1e-5
    probe = noise.noise_probe(preset="test", parties=3)
    coarse = next(r for r in probe.rows if r["what"] == "coarse pass")
    assert coarse["mean_final_rel_error"] < 1e-5 and coarse["var_final_rel_error"] < 1e-5
    assert 0 < coarse["mean_precise_min"] <= coarse["mean_precise_max"]


def test_the_limit_is_the_runs_crypto_work_spread_over_the_workers() -> None:
    from fednorm.bench import protocols
    from fednorm.bench.timeline import Timeline
    from fednorm.engine.tracing import CryptoEvent

    timeline = Timeline()
    for call, seconds in (("CkksContext.encrypt", 3.0), ("decode_frame", 5.0),
                          ("encode_body", 1.0), ("Bootstrap.generate_share", 1.0)):
        timeline.crypto_call(CryptoEvent("party 1", "zscore-mhe", call, seconds))
    assert timeline.limit_seconds(cores=2) == pytest.approx(2.0)  # (3 + 1) / 2, no bytes
    # 2 cores x 10 s: 13 s of CPU, so 7 core-s idle; 6 s of serialization calls.
    assert timeline.beyond_limit(wall=10.0, cpu=13.0, cores=2) == pytest.approx(
        {"serialization": 6.0, "idle": 7.0})
    section, _ = protocols.totals(["zscore"], repeats=1, parties=3, preset="test")
    header, cells = section.tables[0][1:]
    # The default z-score ran beside its --algorithm paper case, in the same run.
    assert [r["method"] for r in section.rows] == ["zscore", "zscore_paper"]
    row, paper = section.rows
    assert (row["algorithm"], paper["algorithm"]) == ("default", "paper")
    # At most two calls run at once, so their summed time fits twice the wall time.
    assert 0 < row["limit_s"] <= row["median_s"]
    assert "total / limit" in header and "× paper" in header
    beyond = row["beyond_limit_core_s"]
    assert beyond["serialization"] > 0
    column = header.index("beyond the limit, core-s: serialization / idle")
    assert cells[0][column].count("**") == 2  # the larger cost in bold
    assert row["x_faster"] == pytest.approx(paper["median_s"] / row["median_s"])
    faster = header.index("× faster than `--algorithm paper`")
    assert "`zscore_paper`" in cells[0][faster] and cells[1][faster] == "–"
    # Default z-score: flooded sums of the pooled sums, far inside issue 2/6's 1e-12.
    assert max(row["errors"].values()) < 1e-12
    assert row["errors_met"] is True
    assert cells[0][header.index("error target met")].startswith("yes")


def test_each_default_case_is_paired_with_its_paper_case() -> None:
    """Table V shows every default algorithm beside its --algorithm paper counterpart."""
    defaults = [c for c in cases.CASES.values() if c.algorithm == "default" and c.protected]
    assert {c.method for c in defaults} == {"zscore", "minmax", "robust", "yeojohnson"}
    for case in defaults:
        paper = cases.CASES[case.versus]
        assert (paper.method, paper.algorithm, paper.versus) == (case.method, "paper", None)
        assert case.target_s > 0 and not case.needs_vabs  # V_abs: paper cases only
        assert paper.needs_vabs == (paper.method != "zscore")
        assert case.name in report.BenchPlan().cases and paper.name in report.BenchPlan().cases
    # Asking for a default case brings its paper case along, in the table's order.
    assert cases.with_counterparts(["robust_exact", "minmax"]) == [
        "minmax", "minmax_paper", "robust_exact", "robust_paper"]
    assert cases.with_counterparts(["minmax_paper"]) == ["minmax_paper"]
    robust, exact = cases.CASES["robust"], cases.CASES["robust_exact"]
    assert robust.fit_options(None, "test").epsilon == 1e-4
    assert exact.fit_options(None, "test").epsilon is None
    assert cases.CASES["robust_paper"].fit_options(None, "test").vabs is not None
    # The figures: paper Table V seconds and the speed-up targets.
    assert [cases.CASES[n].paper_s for n in ("zscore", "minmax", "robust", "robust_exact")] \
        == [44.0, 253.0, 368.0, 368.0]
    assert cases.CASES["yeojohnson"].speedup_target == 1.5
    assert cases.CASES["minmax"].speedup_target == 3.0


def test_every_case_runs_in_this_tree() -> None:
    """Every PPF method is registered with both algorithms, so no case is noted away."""
    assert [name for name in cases.CASES if not cases.available(name)] == []


def test_yeojohnson_errors_include_the_log_likelihood() -> None:
    from sklearn.preprocessing import PowerTransformer

    from fednorm.bench.oracle import estimate_errors

    X = np.random.default_rng(5).gamma(2.0, 3.0, size=(200, 3))
    lambdas = PowerTransformer(standardize=False).fit(X).lambdas_

    class Fitted:
        def __init__(self, lam):
            self.lam = lam

        def params(self):
            return {"lambda": list(self.lam)}

    relative, _ = estimate_errors("yeojohnson_paper", Fitted(lambdas), X)
    assert relative == {"lambda": 0.0, "llf": 0.0}
    relative, _ = estimate_errors("yeojohnson", Fitted(lambdas + 1e-3), X)
    # λ off by 1e-3 near the likelihood's top: the llf moves far less than λ does.
    assert 0 < relative["llf"] < 1e-4 < relative["lambda"]


def test_bench_help_names_every_section(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = "".join(capsys.readouterr().out.split())
    assert ",".join(report.SECTIONS) in text
    assert ",".join(cases.CASES) in text


def test_study_section_runs_the_real_grid_and_times_it(tmp_path) -> None:
    """A smoke slice of the study grid (BCW, one partition, 3 rounds): every run is
    trained and counted, and the report says it is not the study."""
    pytest.importorskip("torch")
    out, rows = tmp_path / "report.md", tmp_path / "rows.json"
    assert main(["bench", "--quick", "--sections", "study", "--out", str(out),
                 "--json", str(rows)]) == 0
    (record,) = json.loads(rows.read_text())["study"]
    assert (record["runs"], record["failed"], record["jobs"]) == (2, 0, 1)
    bcw = record["per_dataset"]["bcw"]
    assert bcw["runs"] == 2 and bcw["trained"] == 2 and bcw["at_cap"] == 2  # capped at 3
    assert record["wall_s"] > 0 and bcw["seconds"] > 0
    text = out.read_text()
    assert "a smoke run" in text and "not the study" in text
    assert "| study grid, 2 runs, --jobs 1 |" in text


def test_the_paper_on_trust_runs_beside_its_replayed_run_on_the_same_wire() -> None:
    """The cost of the parties' request checks: the paper's z-score with the parties
    replaying the server's steps and on trust (``FitOptions.replay`` off), side by side
    in one run, the same frames either way."""
    from fednorm.bench import protocols

    section, _ = protocols.totals(["zscore_paper_on_trust"], repeats=1, parties=3,
                                  preset="test")
    assert [r["method"] for r in section.rows] == ["zscore_paper", "zscore_paper_on_trust"]
    replayed, trusted = section.rows
    assert trusted["bytes_total"] == replayed["bytes_total"]
    assert trusted["x_faster"] == pytest.approx(replayed["median_s"] / trusted["median_s"])
    assert max(trusted["errors"].values()) < 1e-6


def test_a_failed_run_names_its_cause_in_the_log_as_it_happens(capsys) -> None:
    """The section's notes are written only when it ends, so the progress log must carry
    the cause of a failed run at once (a killed process would lose it otherwise)."""
    failures: list[str] = []

    def broken() -> protocols.RunRecord:
        raise MemoryError("no room for 100 parties")

    assert protocols.attempt("scaling z-score P=100", failures, broken) is None
    assert "MemoryError: no room for 100 parties" in capsys.readouterr().err
    assert "no room for 100 parties" in failures[0]
