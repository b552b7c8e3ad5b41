"""A party's files: its CSV read and checked before anything is sent, and every output
(the normalized CSV, params.json) written all at once, or not at all."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fednorm.engine.errors import FednormError, InputError
from fednorm.protocols import Normalizer
from fednorm.protocols.base import METHODS, Protocol, check_party_data
from fednorm.sim.csv_files import load_csv

if TYPE_CHECKING:
    from fednorm.multihost.party import PartyRun
    from fednorm.session import SessionPlan

NORMALIZED_CSV = "normalized.csv"
PARAMS_JSON = "params.json"


@dataclass(frozen=True)
class PartyData:
    """A party's CSV: the features it brings, and its rows to write back normalized.

    ``positions`` maps CSV column positions to feature indices; every other column
    (the target, unnamed empty ones) is written back untouched.
    """

    path: Path
    features: list[str]
    X: np.ndarray
    header: list[str]
    rows: list[list[str]]
    positions: dict[int, int]


def load_party_data(path: Path | str, target: str | None = None) -> PartyData:
    """Load and validate a party's CSV before anything is sent; problems are InputErrors."""
    path = check_data_path(path)
    try:
        dataset = load_csv(path, target)
        with path.open(newline="", encoding="utf-8-sig") as stream:
            table = [row for row in csv.reader(stream) if row]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    X = check_party_data(dataset.X)
    header, rows = table[0], table[1:]
    names = [name.strip() for name in header]
    positions = {names.index(name): j for j, name in enumerate(dataset.feature_names)}
    if len(rows) != len(X):  # the loader and this reader disagree on what a row is
        raise InputError(f"cannot map the rows of {path} back to its data")
    return PartyData(path, list(dataset.feature_names), X, header, rows, positions)


def check_data_path(path: Path | str) -> Path:
    """``--data`` names a file (a mistyped path is the command's error, not the data's)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--data {path} is not a file")
    return path


def check_out_dir(out: Path | None, *, force: bool = False) -> None:
    """Refuse, before any connection, an output directory the run could not use.

    It must be a directory (or not exist yet), empty unless ``force`` allows replacing
    what is there, and writable: a probe file is created, written and removed, so a
    run never does all its work only to fail when writing.
    """
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if out.is_dir() and not force and any(out.iterdir()):
        raise InputError(f"--out {out} is not empty; choose an empty or new directory, "
                         "or pass --force to replace its files")
    probe_writable(out)


def probe_writable(directory: Path) -> None:
    """Create, write and remove a file in ``directory``; leave no directory it made."""
    created = [d for d in (directory, *directory.parents) if not d.exists()]
    try:
        for missing in reversed(created):
            missing.mkdir()
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".fednorm-probe-")
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise InputError(f"--out {directory} is not writable: {exc.strerror or exc}") from None
    finally:
        for made in created:
            with suppress(OSError):
                made.rmdir()


def _cell(value: float) -> str:
    """Shortest round-tripping text of a value; missing stays an empty cell."""
    return repr(float(value)) if np.isfinite(value) else ""


def normalized_csv(data: PartyData, normalizer: Normalizer) -> bytes:
    """The party's CSV with its features normalized, every other column as it was."""
    Z = normalizer.transform(data.X)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(data.header)
    for r, row in enumerate(data.rows):
        cells = list(row)
        for column, j in data.positions.items():
            cells[column] = _cell(Z[r, j])
        writer.writerow(cells)
    return text.getvalue().encode("utf-8")


def json_params(params: Mapping[str, Sequence[float]]) -> dict[str, list[float | None]]:
    """Parameters as in ``simulate --json``: NaN (a feature without values) is null."""
    return {k: [float(v) if np.isfinite(v) else None for v in vs] for k, vs in params.items()}


def params_document(protocol: Protocol, parties: int, session: str,
                    features: Sequence[str], normalizer: Normalizer) -> bytes:
    document = {
        "method": protocol.method,
        "privacy": protocol.privacy,
        "parties": parties,
        "session": session,
        "features": list(features),
        "params": json_params(normalizer.params()),
    }
    return (json.dumps(document, indent=2, allow_nan=False) + "\n").encode("utf-8")


def method_dir(out: Path, plan: SessionPlan, protocol: Protocol) -> Path:
    """Where a session's outputs for ``protocol`` go: ``out`` itself when the session
    fits one method, else ``out/<method>``, so no method's files replace another's."""
    return out if len(plan.methods) == 1 else out / protocol.method


def params_path(out: Path, plan: SessionPlan, protocol: Protocol) -> Path:
    return method_dir(out, plan, protocol) / PARAMS_JSON


def party_outputs(out: Path, data: PartyData, run: PartyRun) -> dict[Path, bytes]:
    """Per method of the session: the party's normalized CSV and the parameters."""
    files: dict[Path, bytes] = {}
    for protocol, normalizer in zip(run.plan.protocols, run.normalizers, strict=True):
        where = method_dir(out, run.plan, protocol)
        files[where / NORMALIZED_CSV] = normalized_csv(data, normalizer)
        files[where / PARAMS_JSON] = params_document(
            protocol, run.welcome.parties, run.welcome.session, data.features, normalizer)
    return files


def replace_outputs(out: Path, files: Mapping[Path, bytes]) -> list[Path]:
    """Write ``files`` (all or none), then remove fednorm's own outputs in ``out`` that an
    earlier run left and this one did not write: after ``--force``, a one-method run's
    ``params.json`` beside a multi-method run's ``<method>/`` directories (or the other
    way round) would read as a result of this run.  Other files are left alone."""
    written = write_atomically(files)
    for stale in sorted(_outputs_in(out) - set(written)):
        stale.unlink(missing_ok=True)
    for method in METHODS:
        with suppress(OSError):  # only if now empty
            (out / method).rmdir()
    return written


def _outputs_in(out: Path) -> set[Path]:
    """The files fednorm writes that exist in ``out`` or its per-method directories."""
    places = [out, *(out / method for method in METHODS)]
    return {place / name for place in places for name in (PARAMS_JSON, NORMALIZED_CSV)
            if (place / name).is_file()}


def write_atomically(files: Mapping[Path, bytes]) -> list[Path]:
    """Write every file or none: all go to temporary files first, then are renamed.

    Temporary files live in the target directory, so ``os.replace`` is an atomic
    rename; they are created 0600, which suits a party's normalized data.
    """
    temporaries: dict[Path, str] = {}
    try:
        for path, content in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporaries[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as stream:
                stream.write(content)
                stream.flush()
                os.fsync(stream.fileno())
        for path, temporary in temporaries.items():
            os.replace(temporary, path)
    except OSError as exc:
        raise FednormError(f"cannot write outputs: {exc}") from None
    finally:
        for temporary in temporaries.values():
            with suppress(FileNotFoundError):
                os.unlink(temporary)
    return list(files)
