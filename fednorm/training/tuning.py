"""Choosing training settings without the test rows.

A setting chosen by test scores (a step size, a loss, a minimum of rounds, patience,
Adam state kept or fresh) makes those test scores optimistic: the test rows then took
part in training. Here every candidate setting trains on the **tuning view** of a
partition and is scored on its tuning rows:

* each client's test rows are dropped, unread, and a fifth of its *training* rows
  become its tuning rows (stratified by target, as the test rows are); on a dataset
  split by group, a fifth of the training side's groups do, over all clients, so a
  patient's training recordings are never on both sides of the tuning split either;
* the validation rows keep their role (early stopping and the kept weights, whose
  criterion, ``select``, is one of the candidates' settings);
* a candidate's score is the mean main score (:data:`fednorm.training.scores.MAIN_METRIC`)
  of **every** run it trained — the federated and local runs the study compares and the
  references beside them (no normalization, group and layer norm, the central model) —
  with an R² below :data:`R2_FLOOR` counted as that: a diverged run (R² ≈ −1e7) marks a
  bad candidate without swamping the mean, while R² < 0 still ranks (by patient,
  Parkinson's runs score below 0, and the tables' floor at 0 would tie every
  candidate).  A setting under which the references collapse into predicting one class
  would make every comparison with them meaningless, so they count: ranked on federated
  and local runs alone, BCW's step 3e-2 came first while 62 of its 420 runs predicted a
  single class.  Each score says how many of its classification runs predicted a single
  class (:attr:`TuningScore.single_class`).

The runner writes a tuning run like any run (its ``test_*`` columns then hold tuning
scores), so a tuning grid is resumable like the study's; :func:`best_candidate` reads
the files back. Torch-free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fednorm.engine.errors import InputError
from fednorm.training.data import TEST_SHARE, ClientData, HeldOutLabels, evenly_spaced
from fednorm.training.scores import MAIN_METRIC, as_number, read_results

TUNING_SHARE = TEST_SHARE  # of a client's training rows (or of the training groups)
R2_FLOOR = -1.0


def tuning_clients(clients: list[ClientData], seed: int) -> list[ClientData]:
    """The partition's tuning view (see the module doc): test rows gone, tuning rows in
    their place, carved from the training rows."""
    groups = [c.train_groups for c in clients]
    if all(g is not None for g in groups):
        tuned = _tuning_groups(np.concatenate(groups), seed)  # type: ignore[arg-type]
        masks = [np.isin(g, tuned) for g in groups]  # type: ignore[arg-type]
    else:
        rng = np.random.default_rng([seed, len(clients), 0x7E57])
        masks = [_tuning_rows(c.y_train, rng) for c in clients]
    views = [_view(client, mask) for client, mask in zip(clients, masks, strict=True)]
    if any(len(view.y_train) == 0 for view in views):
        raise InputError("a client keeps no training rows beside its tuning rows")
    return views


def _tuning_groups(groups: np.ndarray, seed: int) -> np.ndarray:
    names = np.random.default_rng([seed, 0x7E57]).permutation(np.unique(groups))
    return names[: max(1, round(TUNING_SHARE * len(names)))]


def _tuning_rows(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A stratified fifth of a client's training rows, as a mask."""
    by_target = np.lexsort((rng.random(len(y)), y))
    picked, _ = evenly_spaced(by_target, round(TUNING_SHARE * len(y)), rng)
    mask = np.zeros(len(y), dtype=bool)
    mask[picked] = True
    return mask


def _view(client: ClientData, tuning: np.ndarray) -> ClientData:
    groups = None if client.train_groups is None else client.train_groups[~tuning]
    return ClientData(client.X_train[~tuning], client.y_train[~tuning], client.X_val,
                      client.y_val, client.X_train[tuning],
                      HeldOutLabels((client.y_train[tuning],)), groups)


# The training settings a tuning grid may vary (RunSettings fields of those names).
TUNABLE = ("lr", "regression_loss", "min_rounds", "patience", "persist_optimizer",
           "select")


@dataclass(frozen=True)
class Candidate:
    """One setting to try: the overridden :data:`TUNABLE` settings, in that order (a
    setting not named keeps the dataset's default)."""

    settings: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        """A file-name-safe label, e.g. ``lr=0.01_min_rounds=300`` (``defaults``)."""
        return "_".join(f"{key}={_spell(value)}" for key, value in self.settings) or "defaults"

    def overrides(self) -> dict[str, object]:
        return dict(self.settings)


def _spell(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def candidates(**choices: Sequence[object] | None) -> list[Candidate]:
    """Every combination of the given choices (a missing or empty one: the default)."""
    unknown = set(choices) - set(TUNABLE)
    if unknown:
        raise InputError(f"unknown tuning choice {', '.join(sorted(unknown))}")
    axes = [[(name, value) for value in choices[name]] for name in TUNABLE if choices.get(name)]
    return [Candidate(tuple(combo)) for combo in itertools.product(*axes)]


@dataclass(frozen=True)
class TuningScore:
    candidate: str
    score: float  # mean main tuning score of every run
    runs: int
    single_class: int = 0  # classification runs whose tuning predictions hold one class


def tuning_scores(files: dict[str, Path]) -> list[TuningScore]:
    """Each candidate's score from its tuning file, best first (ties: the given order)."""
    scored = [_score(name, path) for name, path in files.items()]
    return sorted(scored, key=lambda s: -s.score if math.isfinite(s.score) else math.inf)


def _score(name: str, path: Path) -> TuningScore:
    values, single_class = [], 0
    for row in read_results([path]):
        metric = MAIN_METRIC.get(row["task"], "")
        value = as_number(row.get(metric, ""))
        if value is None:
            continue
        values.append(max(value, R2_FLOOR) if metric == "test_r2" else value)
        classes = as_number(row.get("test_predicted_classes", ""))
        single_class += row["task"] == "classification" and classes is not None \
            and classes <= 1
    score = sum(values) / len(values) if values else math.nan
    return TuningScore(name, score, len(values), single_class)


def best_candidate(files: dict[str, Path]) -> TuningScore:
    """The candidate with the highest tuning score."""
    scores = tuning_scores(files)
    if not scores or not math.isfinite(scores[0].score):
        raise InputError("no tuning runs finished: nothing to choose from")
    return scores[0]
