"""The edges a new user meets: hostile numbers and files, several methods on one key
setup, options the run would ignore, outputs replaced (progress on a terminal, the
demo's summary and processes that end with the test run: test_cli_terminal.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cli_runs import run_cli

from fednorm.engine.errors import InputError
from fednorm.multihost.files import load_party_data
from fednorm.protocols import FitOptions, MinMaxNormalizer
from fednorm.sim.federation import simulate

ROOT = Path(__file__).resolve().parent.parent


def csv_file(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# -- hostile numbers and files ----------------------------------------------------------
def test_an_infinite_epsilon_is_refused_on_the_command_line_and_in_the_library(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["simulate", "--method", "robust", "--epsilon", "inf"], capsys)
    assert code == 2 and "epsilon must be a finite positive number, got inf" in err
    parts = [np.arange(6.0).reshape(3, 2), np.arange(6.0, 12.0).reshape(3, 2)]
    with pytest.raises(InputError, match="epsilon must be a finite"):
        simulate(parts, "robust", options=FitOptions(epsilon=float("inf")))


@pytest.mark.parametrize("method", ["zscore", "yeojohnson"])
def test_values_that_overflow_the_fit_are_an_error_not_null(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rows = "\n".join(f"{v},{w}" for v, w in zip([1e300, -2e300, 3e300, 5e299, 1e299, -1e300],
                                                [1, 2, 3, 4, 5, 6], strict=True))
    data = csv_file(tmp_path / "huge.csv", f"big,small\n{rows}\n")
    with _no_runtime_warnings():
        code, out, err = run_cli(["simulate", "--dataset", data, "--parties", "2",
                                  "--method", method, "--json"], capsys)
    assert code == 2, out
    assert f"the {method} fit overflows float64 for 'big'" in err
    assert "'small'" not in err and out == ""


@pytest.mark.parametrize("method", ["zscore", "minmax", "robust", "yeojohnson"])
def test_a_feature_without_values_is_not_mistaken_for_an_overflow(method: str) -> None:
    X = np.column_stack([np.full(8, np.nan), np.arange(8.0)])
    params = simulate([X[:4], X[4:]], method).normalizer.params()
    assert all(np.isnan(values[0]) for name, values in params.items() if name != "lambda")


class _no_runtime_warnings:
    """The overflow is reported once, as the error, not as numpy warnings besides."""

    def __enter__(self) -> None:
        import warnings

        self._catcher = warnings.catch_warnings(record=True)
        self._seen = self._catcher.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc_info: object) -> None:
        self._catcher.__exit__(*exc_info)
        runtime = [w for w in self._seen if issubclass(w.category, RuntimeWarning)]
        assert not runtime, [str(w.message) for w in runtime]


def test_a_number_beyond_float64_is_called_that_not_non_numeric(tmp_path: Path) -> None:
    data = csv_file(tmp_path / "big.csv", "a,label\n1,yes\n1e309,no\n")
    with pytest.raises(InputError) as refused:
        load_party_data(data, "label")
    message = str(refused.value)
    assert "value '1e309' (data row 2, line 3), beyond the range of float64" in message
    assert "non-numeric" not in message


@pytest.mark.parametrize("delimiter, name", [(";", "semicolons"), ("\t", "tabs")])
def test_a_file_split_by_another_delimiter_gets_a_hint(
    delimiter: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [["a", "b", "label"], ["1,5", "2", "x"], ["3", "4", "y"]]  # decimal commas
    data = csv_file(tmp_path / "semi.csv", "\n".join(delimiter.join(r) for r in lines) + "\n")
    code, _, err = run_cli(["simulate", "--dataset", data, "--target", "label"], capsys)
    assert code == 2
    assert f"separated by {name}: fednorm reads comma-separated files" in err


def test_values_beyond_vabs_are_named_by_feature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rows = "\n".join(f"{i},{i * 100},{i % 2}" for i in range(1, 9))
    data = csv_file(tmp_path / "d.csv", f"age,income,label\n{rows}\n")
    code, _, err = run_cli(["simulate", "--dataset", data, "--target", "label", "--parties",
                            "2", "--method", "minmax", "--privacy", "mhe", "--preset", "test",
                            "--algorithm", "paper", "--vabs", "10,500"], capsys)
    assert code == 2
    assert re.search(r"values beyond the agreed bound vabs: 'income' \(\|x\| up to [5-8]00, "
                     r"bound 500\)$", err.strip()), err
    assert "'age'" not in err


def test_complex_data_is_refused_not_truncated_to_its_real_part() -> None:
    parts = [np.array([[1 + 2j, 3], [4, 5]]), np.array([[6.0, 7.0], [8.0, 9.0]])]
    with pytest.raises(InputError, match="complex"):
        simulate(parts, "zscore")


def test_a_minmax_scaler_reports_the_rows_it_saw() -> None:
    fitted = MinMaxNormalizer(np.array([0.0, 1.0]), np.array([2.0, 5.0]), rows=37)
    assert fitted.to_sklearn().n_samples_seen_ == 37
    # Unknown is not claimed to be zero: a partial_fit is refused, saying why, instead
    # of miscounting (tests/test_library_tables.py plays it through real fits).
    unknown = MinMaxNormalizer(np.array([0.0]), np.array([2.0])).to_sklearn()
    assert unknown.n_samples_seen_ is None
    with pytest.raises(ValueError, match="without revealing the pooled row count"):
        unknown.partial_fit(np.array([[1.0]]))


def test_a_local_minmax_fit_reports_its_rows_to_sklearn() -> None:
    from fednorm.protocols import fit_local

    X = np.arange(12.0).reshape(6, 2)
    assert fit_local("minmax", X).to_sklearn().n_samples_seen_ == 6


# -- several methods on one key setup -------------------------------------------------
def test_simulate_runs_several_methods_on_one_key_setup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    code, out, err = run_cli(["simulate", "--parties", "3", "--method", "zscore,minmax",
                              "--privacy", "mhe", "--preset", "test",
                              "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["methods"] == ["zscore", "minmax"]
    assert [run["method"] for run in report["runs"]] == ["zscore", "minmax"]
    setup = report["setup"]
    assert setup["bytes"] > 0 and setup["rounds"] >= 1  # the public key's round
    zscore_run, minmax_run = report["runs"]
    assert zscore_run["max_rel_error"] < 1e-5 and minmax_run["max_rel_error"] < 1e-5
    # The key shares (MBs per party at ring 2^14) crossed once, in the setup: z-score alone
    # moves its run's bytes plus the setup's (within a few bytes of session framing).
    code, out, err = run_cli(["simulate", "--parties", "3", "--method", "zscore",
                              "--privacy", "mhe", "--preset", "test", "--json"], capsys)
    assert code == 0, err
    alone = json.loads(out)["bytes"]
    assert abs(alone - setup["bytes"] - zscore_run["bytes"]) < 1e-4 * alone


@pytest.mark.parametrize("flag", ["simulate --method", "demo --methods"])
@pytest.mark.parametrize("methods", ["zscore,zscore", "zscore,median", ","])
def test_a_bad_method_list_exits_2(flag: str, methods: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands refuse it with the session's one message, before any run."""
    code, out, err = run_cli([*flag.split(), methods], capsys)
    assert code == 2 and out == "" and "each once" in err


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_worker_thread_count_exits_2(value: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FEDNORM_WORKER_THREADS", value)
    code, out, err = run_cli(["simulate", "--parties", "2"], capsys)
    assert code == 2 and out == "" and "FEDNORM_WORKER_THREADS must be a positive" in err


def test_the_version_and_every_default_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """``fednorm --version`` names the installed version; ``--help`` shows the defaults of
    --parties, --split and --seed (they were bare before)."""
    from importlib import metadata

    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"fednorm {metadata.version('fednorm')}"
    code, out, _ = run_cli(["simulate", "--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0
    for shown in ("number of parties (default 10)", "feature:σ (default iid)",
                  "its noise (default 0)"):
        assert shown in flat
    code, out, _ = run_cli(["demo", "--help"], capsys)
    assert "number of parties (default 10)" in " ".join(out.split())


@pytest.mark.parametrize("flags, what", [
    (["--privacy", "plain", "--vabs", "10"], "--vabs"),
    (["--privacy", "mhe", "--vabs", "10"], "--vabs"),  # the default algorithm needs none
    (["--privacy", "mhe", "--method", "minmax", "--reveal-counts"], "--reveal-counts"),
    (["--privacy", "mhe", "--reveal-counts"], "--reveal-counts"),  # default z-score
])
def test_an_option_the_run_would_ignore_is_refused(
    flags: list[str], what: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """A flag no protocol of the run reads exits 2 naming it, before any work."""
    args = ["simulate", "--parties", "2", "--preset", "test", *flags]
    if "--method" not in flags:
        args += ["--method", "zscore"]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert what in err and "would ignore it" in err, err


def test_force_replaces_an_earlier_runs_outputs_and_keeps_other_files(tmp_path: Path) -> None:
    """A multi-method run written over a one-method run's ``--out`` (``--force``) leaves
    no ``params.json`` or ``normalized.csv`` of the earlier run beside its own, and
    touches nothing else; back to one method, the per-method directories go."""
    from fednorm.multihost.files import replace_outputs

    out = tmp_path / "out"
    out.mkdir()
    (out / "params.json").write_text("{}")
    (out / "normalized.csv").write_text("a\n1\n")
    (out / "notes.txt").write_text("mine")
    written = replace_outputs(out, {out / "zscore" / "params.json": b"{}",
                                    out / "minmax" / "params.json": b"{}"})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) \
        == ["minmax/params.json", "notes.txt", "zscore/params.json"]
    assert len(written) == 2
    replace_outputs(out, {out / "params.json": b"{}"})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) \
        == ["notes.txt", "params.json"]


def test_the_readme_names_every_json_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The keys `simulate --json` prints, one method and several, as the README lists."""
    import json

    text = " ".join((ROOT / "README.md").read_text().split())
    one = text[text.index("With `--json` it prints one object with the keys"):]
    one_keys = re.findall(r"`(\w+)`", one[:one.index(";")])
    several = text[text.index("it prints one object with the session's keys"):]
    several_keys = [*re.findall(r"`(\w+)`", several[:several.index(" (under mhe")]), "runs"]
    code, out, _ = run_cli(["simulate", "--parties", "2", "--method", "zscore", "--json"],
                           capsys)
    assert code == 0 and list(json.loads(out)) == one_keys
    code, out, _ = run_cli(["simulate", "--parties", "2", "--method", "zscore,minmax",
                            "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and list(report) == several_keys
    assert list(report["runs"][0]) == one_keys


def test_an_epsilon_below_the_float_spacing_is_refused_naming_the_feature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """ε = 1e-14 on values up to 800: float64 cannot resolve it there, so no search could
    reach it; exit 2 before any work, the feature named, the small one not."""
    rows = "\n".join(f"{i / 10},{i * 100},{i % 2}" for i in range(1, 9))
    data = csv_file(tmp_path / "d.csv", f"small,large,label\n{rows}\n")
    for privacy in ("plain", "mhe"):
        code, out, err = run_cli(["simulate", "--dataset", data, "--target", "label",
                                  "--parties", "2", "--method", "robust", "--privacy",
                                  privacy, "--preset", "test", "--epsilon", "1e-14"], capsys)
        assert code == 2 and out == ""
        # each party checks its own values: the first party to hold a large one names it
        assert re.search(r"'large' \(float64 spacing 1.14e-13 at \|x\| up to [5-8]00\)",
                         err), err
        assert "'small'" not in err


def test_simulate_errors_are_against_the_rows_the_parties_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A feature split adds noise to the parties' rows: the errors compare with the fit on
    those rows (exact here), and the centered diabetes features' means (~1e-17) are judged
    in units of their spread, not against themselves."""
    import json

    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    rows = "\n".join(",".join(repr(float(v)) for v in [*row, t])
                     for row, t in zip(X, y, strict=True))
    header = ",".join([f"f{j}" for j in range(X.shape[1])] + ["target"])
    data = csv_file(tmp_path / "diabetes.csv", f"{header}\n{rows}\n")
    for split in ("feature:0.5", "iid"):
        # robust: the search stops within 1e-9 of each feature's range (a few spreads)
        for method, bound in (("zscore", 1e-12), ("minmax", 0.0), ("robust", 1e-8)):
            code, out, err = run_cli(["simulate", "--dataset", data, "--target", "target",
                                      "--parties", "4", "--split", split, "--method",
                                      method, "--json"], capsys)
            assert code == 0, err
            report = json.loads(out)
            assert report["max_rel_error"] <= bound, (split, method, report["max_rel_error"])


def test_keys_declared_for_too_few_decryptions_are_refused_naming_the_tau_that_serves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default Yeo-Johnson of BCW over 50 parties at the test preset, τ = 10: refused
    with exit 2 before any key is made, naming the --flooding-decryptions that serve the
    run; one fewer is refused naming itself (the option reaches the fit), 0 is no τ."""
    argv = ["simulate", "--dataset", "bcw", "--parties", "50", "--method", "yeojohnson",
            "--privacy", "mhe", "--preset", "test"]
    code, _, err = run_cli([*argv, "--flooding-decryptions", "10"], capsys)
    assert code == 2 and "--flooding-decryptions" in err, err
    least = int(re.search(r"declare at least τ = (\d+)", err).group(1))
    code, _, err = run_cli([*argv, "--flooding-decryptions", str(least - 1)], capsys)
    assert code == 2 and f"keys declared for τ = {least - 1} serve" in err, err
    code, _, err = run_cli([*argv, "--flooding-decryptions", "0"], capsys)
    assert code == 2 and "flooded decryptions per key must be a positive" in err, err
