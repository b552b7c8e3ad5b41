"""fednorm as a user installs it: a wheel built from the checkout, installed into a fresh
virtualenv (nothing of the test environment visible), without extras and then with the
``sklearn`` extra, works as the README's "Install" says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

WITHOUT_EXTRAS = """
import importlib.resources, numpy as np, fednorm
assert importlib.resources.files("fednorm").joinpath("py.typed").is_file()
rng = np.random.default_rng(0)
parties = [rng.normal(size=(20, 3)), rng.normal(size=(30, 3))]
plain = fednorm.simulate(parties, method="zscore")
ppf = fednorm.simulate(parties, method="zscore", privacy="mhe",
                       options=fednorm.FitOptions(preset="test"))
pooled = np.vstack(parties)
for fit in (plain, ppf):
    assert np.allclose(fit.normalizer.params()["mean"], pooled.mean(axis=0), atol=1e-9)
try:
    plain.normalizer.to_sklearn()
except fednorm.InputError as error:
    assert "pip install 'fednorm[sklearn]'" in str(error), error
else:
    raise AssertionError("to_sklearn() worked without scikit-learn")
"""

WITH_SKLEARN = """
import numpy as np, fednorm
from sklearn.preprocessing import StandardScaler
rng = np.random.default_rng(0)
parties = [rng.normal(size=(20, 3)), rng.normal(size=(30, 3))]
scaler = fednorm.simulate(parties, method="zscore").normalizer.to_sklearn()
pooled = np.vstack(parties)
assert np.allclose(scaler.transform(pooled), StandardScaler().fit_transform(pooled))
"""


# The fresh venv sees nothing of this environment: no PYTHONPATH (a checkout on it, with
# the egg-info a build leaves there, would make pip take fednorm as installed already).
ISOLATED = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def run(*command: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=ISOLATED)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT, cwd=dist)
    (built,) = dist.glob("fednorm-*.whl")
    return built


def test_a_wheel_installs_into_a_fresh_venv_and_works_without_extras_then_with_sklearn(
        wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, pip = venv / "bin" / "python", venv / "bin" / "pip"
    run(pip, "install", "-q", wheel, cwd=tmp_path)

    assert run(venv / "bin" / "fednorm", "--version", cwd=tmp_path).strip() == \
        "fednorm 0.1.0"
    missing = subprocess.run([python, "-c", "import sklearn"], capture_output=True,
                             env=ISOLATED)
    assert missing.returncode != 0, "the fresh venv sees the test environment's packages"
    run(python, "-c", WITHOUT_EXTRAS, cwd=tmp_path)
    # the packaged data set, through the installed command
    out = run(venv / "bin" / "fednorm", "simulate", "--dataset", "bcw", "--parties", "3",
              "--method", "minmax", "--json", cwd=tmp_path)
    assert json.loads(out)["max_abs_error"] == 0.0

    run(pip, "install", "-q", f"{wheel}[sklearn]", cwd=tmp_path)
    run(python, "-c", WITH_SKLEARN, cwd=tmp_path)
