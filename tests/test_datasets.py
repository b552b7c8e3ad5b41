"""Tests of dataset loading: the packaged BCW copy and the generic CSV reader."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fednorm.engine.errors import InputError
from fednorm.sim.datasets import load_dataset

SHARED_DATASETS = Path(__file__).parents[2] / "shared/datasets"


def write_csv(directory: Path, text: str, name: str = "table.csv") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def sklearn_name(bcw_name: str) -> str:
    """``radius_mean`` -> ``mean radius``, ``radius_se`` -> ``radius error``, and so on."""
    base, _, kind = bcw_name.rpartition("_")
    base = base.replace("_", " ")  # fractal_dimension -> fractal dimension
    return {"mean": f"mean {base}", "se": f"{base} error", "worst": f"worst {base}"}[kind]


# --- built-in BCW ------------------------------------------------------------------------


def test_bcw_builtin_has_the_documented_shape_and_encoding():
    data = load_dataset("bcw")
    assert data.name == "bcw"
    assert data.X.shape == (569, 30)
    assert data.X.dtype == np.float64
    assert not np.isnan(data.X).any()
    assert len(data.feature_names) == 30
    assert not {"id", "diagnosis", ""} & set(data.feature_names)
    assert data.target_name == "diagnosis"
    assert data.task == "classification"
    assert data.class_names == ["B", "M"]
    assert np.bincount(data.y).tolist() == [357, 212]  # 212 malignant, encoded 1


def test_bcw_builtin_matches_scikit_learns_copy_column_for_column():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    reference = sklearn_datasets.load_breast_cancer()
    data = load_dataset("bcw")
    assert [sklearn_name(name) for name in data.feature_names] == list(reference.feature_names)
    np.testing.assert_allclose(data.X, reference.data, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(data.y, 1 - reference.target)  # sklearn: 0 = malignant


def test_bcw_builtin_accepts_only_its_own_target():
    assert load_dataset("bcw", target="diagnosis").target_name == "diagnosis"
    with pytest.raises(InputError, match="diagnosis"):
        load_dataset("bcw", target="radius_mean")


# --- CSV files ---------------------------------------------------------------------------


def test_missing_cells_become_nan(tmp_path):
    path = write_csv(tmp_path, "a,b,c\n1,,3\nNA,2,NaN\nnan, 5 ,6\n,,\n")
    data = load_dataset(str(path))
    expected = np.array([[1, np.nan, 3], [np.nan, 2, np.nan], [np.nan, 5, 6], [np.nan] * 3])
    np.testing.assert_array_equal(data.X, expected)
    assert data.feature_names == ["a", "b", "c"]
    assert data.name == "table"
    assert (data.y, data.target_name, data.task) == (None, None, None)


def test_non_numeric_feature_is_rejected_naming_column_and_row(tmp_path):
    path = write_csv(tmp_path, "a,sex,label\n1,0,x\n2,male,y\n3,female,x\n")
    with pytest.raises(InputError, match=r"'sex'.*'male'.*data row 2"):
        load_dataset(str(path), target="label")


def test_infinite_feature_value_is_rejected(tmp_path):
    path = write_csv(tmp_path, "a,b\n1,inf\n2,3\n")
    with pytest.raises(InputError, match="'b'"):
        load_dataset(str(path))


def test_unknown_target_is_rejected_listing_the_columns(tmp_path):
    path = write_csv(tmp_path, "age,weight\n1,2\n")
    with pytest.raises(InputError, match=r"'height'.*age, weight"):
        load_dataset(str(path), target="height")


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="nor a CSV file"):
        load_dataset(str(tmp_path / "absent.csv"))
    with pytest.raises(InputError):
        load_dataset(str(tmp_path))  # a directory is not a CSV file


def test_binary_file_is_an_input_error(tmp_path):
    path = tmp_path / "image.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(InputError, match="cannot read"):
        load_dataset(path)


def test_string_target_is_label_encoded_in_sorted_order(tmp_path):
    path = write_csv(tmp_path, "x,kind\n1,zebra\n2,ant\n3,mole\n4,ant\n")
    data = load_dataset(str(path), target="kind")
    assert data.y.tolist() == [2, 0, 1, 0]
    assert data.class_names == ["ant", "mole", "zebra"]
    assert data.task == "classification"
    assert data.feature_names == ["x"]
    np.testing.assert_array_equal(data.X, [[1], [2], [3], [4]])


def test_small_integer_target_is_classification(tmp_path):
    path = write_csv(tmp_path, "x,grade\n0.5,1\n0.7,3.0\n0.1,2\n")
    data = load_dataset(str(path), target="grade")
    assert data.task == "classification"
    assert data.y.dtype == np.int64
    assert data.y.tolist() == [1, 3, 2]
    assert data.class_names is None


def test_fractional_or_many_valued_target_is_regression(tmp_path):
    fractional = write_csv(tmp_path, "x,score\n1,0.5\n2,1.5\n", name="fractional.csv")
    assert load_dataset(str(fractional), target="score").task == "regression"
    rows = "".join(f"{i},{i}\n" for i in range(21))
    many = write_csv(tmp_path, "x,count\n" + rows, name="many.csv")
    data = load_dataset(str(many), target="count")
    assert data.task == "regression"
    assert data.y.dtype == np.float64


def test_missing_target_value_is_rejected(tmp_path):
    path = write_csv(tmp_path, "x,y\n1,0\n2,\n")
    with pytest.raises(InputError, match="missing in data row 2"):
        load_dataset(str(path), target="y")


def test_empty_unnamed_trailing_column_is_dropped(tmp_path):
    # Header ends with a comma; data rows may or may not.
    path = write_csv(tmp_path, "a,b,\n1,2\n3,4,\n")
    data = load_dataset(str(path))
    assert data.feature_names == ["a", "b"]
    np.testing.assert_array_equal(data.X, [[1, 2], [3, 4]])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no header"),
        (",,\n1,2,3\n", "no header"),
        ("a,,b\n1,9,2\n", "column 2 has values but no name"),
        ("a,a\n1,2\n", "duplicate column names: a"),
        ("a,b\n1,2,3\n", "line 2 has 3 cells"),
        ("a,b\n1\n", "line 2 has 1 cells"),
    ],
)
def test_malformed_tables_are_input_errors(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        load_dataset(str(write_csv(tmp_path, text)))


def test_blank_lines_and_byte_order_mark_are_tolerated(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_text("\ufeffa,b\n1,2\n\n3,4\n", encoding="utf-8")
    data = load_dataset(path)
    assert data.feature_names == ["a", "b"]
    assert data.X.shape == (2, 2)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=arrays(
        np.float64,
        st.tuples(st.integers(1, 12), st.integers(1, 5)),
        elements=st.floats(allow_infinity=False, allow_nan=True, width=64),
    )
)
def test_written_floats_read_back_exactly(tmp_path, values):
    path = tmp_path / "round_trip.csv"
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow([f"f{j}" for j in range(values.shape[1])])
        for row in values:
            writer.writerow(["" if np.isnan(v) else repr(float(v)) for v in row])
    data = load_dataset(str(path))
    np.testing.assert_array_equal(data.X, values)


# --- shared study datasets ---------------------------------------------------------------


@pytest.mark.skipif(not (SHARED_DATASETS / "hcv.csv").is_file(), reason="no shared hcv.csv")
def test_hcv_csv_loads_with_category_target():
    data = load_dataset(str(SHARED_DATASETS / "hcv.csv"), target="Category")
    assert data.X.shape == (615, 12)
    assert "Category" not in data.feature_names
    assert data.task == "classification"
    assert sorted(np.unique(data.y).tolist()) == [0, 1, 2, 3, 4]
