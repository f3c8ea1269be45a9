"""A slide's output folder is sealed as a bundle is: its finished outputs are trusted only
through :func:`read_sealed`.

When a slide is finished, ``seal.json`` is written into its folder last, at once (a rename): it
lists every file the run wrote there (``summary.json`` among them) with its bytes and sha256,
and the names a run of cyto may write there at all (``owned``). A run that rewrites the folder
removes the seal first, so a run stopped half way leaves no seal.

:func:`read_sealed` is the one door through which anything takes a finished folder's outputs as
they were written: ``cyto score --resume`` (and ``--watch``, and the Ray path) before it skips
a slide, the rows of ``cohort.csv`` that come from a reused slide, ``cyto view``, ``cyto review``,
and ``cyto calibrate``'s count of a slide's planted cells. It hashes every sealed file again and
reads the summary from the very bytes it hashed. A folder whose seal is missing, or whose files
were edited, cut short, deleted, or joined by a file under one of cyto's own output names, is
not whole: it is scored again (or refused), said in one line naming the files.

Files cyto's scoring does not write (a user's notes, a review folder made later by ``cyto
review``) are outside the seal and never looked at; cyto itself re-seals the folder when it adds
an output later (``cyto score --resume --qupath`` drawing QuPath outputs from a sealed table).

The seal proves the folder is as cyto wrote it (against hand edits, truncation, half-copied
folders); it is no signature: whoever rewrites the outputs and the seal with them is not stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cyto.bundle import atomic_write, sha256_file
from cyto.tables import json_text

SEAL = "seal.json"
SUMMARY = "summary.json"
#: where a run keeps its finished chunks until its outputs are written and sealed
PARTIAL = ".partial"
FORMAT = "cyto-outputs-seal/1"


def unseal(folder: Path) -> None:
    """Remove a folder's seal: the first step of a run that rewrites its outputs."""
    (Path(folder) / SEAL).unlink(missing_ok=True)


def seal_outputs(folder: Path, names: Iterable[str], owned: Iterable[str] = ()) -> dict:
    """Write ``seal.json`` into ``folder`` over the files ``names`` (and ``summary.json``),
    each with its bytes and sha256, at once; ``owned``: every name a run of cyto may write into
    the folder (one of them present but not sealed was added afterwards). Returns the record."""
    folder = Path(folder)
    files = {}
    for name in dict.fromkeys([*names, SUMMARY]):
        path = folder / name
        files[name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    import datetime

    record = {
        "format": FORMAT,
        "files": files,
        "owned": sorted({*owned, *files, SEAL}),
        # when the run finished: a copied folder's files carry the time of the copy
        "sealed_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    atomic_write(folder / SEAL, json_text(record, indent=1, sort_keys=True).encode())
    return record


@dataclass(frozen=True)
class Sealed:
    """What :func:`read_sealed` found in a folder.

    ``summary``: the summary, when ``summary.json`` is as sealed (even if other files are not);
    ``changed``: the sealed files that differ from the seal, in words (``scores.parquet is
    missing``, ``summary.json``: edited, ``cells.geojson was added``); ``why``: what is wrong
    when there is no seal to check against ('' when there is one)."""

    folder: Path
    summary: dict | None = None
    changed: tuple[str, ...] = ()
    changed_names: tuple[str, ...] = ()
    why: str = ""

    @property
    def ok(self) -> bool:
        """Whether every sealed file is as it was written and the summary reads back."""
        return self.summary is not None and not self.changed and not self.why

    def words(self) -> str:
        """Why the folder is not whole, in one clause ('' when it is)."""
        if self.why:
            return self.why
        if self.changed:
            return f"its outputs changed since they were written ({', '.join(self.changed)})"
        return ""


def unfinished(folder: Path) -> str | None:
    """Why ``folder`` holds no finished run while a run's chunks are in it (its :data:`PARTIAL`
    folder, no seal: being scored, or stopped, perhaps as it wrote its outputs), else None."""
    folder = Path(folder)
    if (folder / PARTIAL).exists() and not (folder / SEAL).exists():
        return (
            f"it holds an unfinished cyto score run (its {PARTIAL} folder, no seal): it is being "
            "scored, or was stopped; finish it with cyto score --resume"
        )
    # a run that failed as it wrote its outputs, its chunks removed by hand: its tables and no
    # seal nor summary (cyto calibrate took its table as one copied out, where cyto view said
    # the folder held no scored slide: hostile round 65, 5)
    tables = [folder / name for name in ("scores.parquet", "topk.parquet")]
    if (
        not (folder / SEAL).exists()
        and not (folder / SUMMARY).exists()
        and all(t.is_file() and is_cyto_table_file(t) for t in tables)
    ):
        return (
            "it holds the outputs of a cyto score run that did not finish (its tables, no "
            "summary.json nor seal); score the slide again"
        )
    return None


#: what to do with a scored folder whose outputs changed since they were written: a slide is
#: scored again whole (a run said "scores again only what changed" of one slide, whose every
#: cell it then scored again: hostile round 65, 3; a cohort's unchanged slides are kept)
SCORE_AGAIN = (
    "score it again (cyto score --resume scores again only the slides whose outputs changed, "
    "each whole)"
)


def refuse_being_written(folder: Path, error=None) -> None:
    """Refuse to read a scored folder that a run is writing now (its lock held: a `cyto score
    --overwrite` rewriting it, or a run scoring it again): its outputs are those of the run
    before, about to be replaced, and a review cut from them outlived the tables it came from
    (hostile round 47, 3). For the readers that show or take a folder's outputs (view, review,
    data cells, calibrate, eval); never under the lock of the reader's own run. ``error``: the
    exception class (default ConfigError)."""
    from cyto.errors import ConfigError
    from cyto.locks import OutputLock

    who = OutputLock(Path(folder)).holder()
    if who is not None:
        raise (error or ConfigError)(f"{who}: wait for it to finish, then read it")


def _read_seal(folder: Path) -> tuple[dict | None, str]:
    path = folder / SEAL
    if not path.is_file():
        if unfinished(folder):
            return None, unfinished(folder)
        if (folder / SUMMARY).is_file():
            return None, (
                "its outputs carry no seal (a run stopped while it wrote them, or a cyto before "
                "outputs were sealed), so they cannot be checked"
            )
        return None, "it holds no finished run (no summary.json)"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None, f"its seal {SEAL} does not read back"
    files = record.get("files") if isinstance(record, dict) else None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or not isinstance(files, dict)
        or not isinstance(record.get("owned", []), list)
        or not all(isinstance(v, dict) for v in files.values())
        or SUMMARY not in files
        or not all(_plain(n) for n in [*files, *(record.get("owned") or [])])
    ):
        return None, f"its seal {SEAL} is not one cyto writes"
    return record, ""


def _plain(name: object) -> bool:
    """A file name of the folder itself (a seal names no path elsewhere)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
    )


def _file_change(path: Path, spec: dict) -> str | None:
    """How a sealed file differs from its seal, or None when it holds the bytes sealed."""
    name = path.name
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        return f"{name} is missing"
    if size != spec.get("bytes"):
        return name
    try:
        same = sha256_file(path) == spec.get("sha256")
    except OSError:
        return f"{name} cannot be read"
    return None if same else name


def written_by_cyto(folder: Path) -> bool:
    """Whether the ``summary.json`` in ``folder`` is one cyto wrote: a seal cyto writes lists it
    (whether its bytes still match is :func:`read_sealed`'s to say), or, unsealed (a run stopped
    between the summary and the seal, or a cyto before outputs were sealed), it reads as the
    summary of a scored slide (a JSON object naming its slide and the cells scored). A user's
    own ``summary.json`` is neither: the folder holds a file cyto did not write, and no command
    calls it a slide's results or writes over it. True when there is no summary."""
    folder = Path(folder)
    if not (folder / SUMMARY).is_file():
        return True
    if _read_seal(folder)[0] is not None:
        return True
    try:
        data = json.loads((folder / SUMMARY).read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("slide"), str) and "cells_scored" in data


def scored_by_cyto(folder: Path) -> bool:
    """Whether ``folder`` holds a scored slide's results that cyto wrote: a seal cyto writes, or
    a summary cyto wrote (:func:`written_by_cyto`); a user's own files of those names do not."""
    folder = Path(folder)
    if _read_seal(folder)[0] is not None:
        return True
    return (folder / SUMMARY).is_file() and written_by_cyto(folder)


def sealed_output_of(path: Path) -> Path | None:
    """The scored folder whose seal lists the file ``path`` (one of cyto's own outputs: an
    abnormality map, a mosaic, a table), or None. A local path only."""
    path = Path(path)
    if "://" in str(path) or not path.is_file():
        return None
    record, _ = _read_seal(path.parent)
    if record is None:
        return None
    listed = {*record["files"], *(record.get("owned") or [])}
    return path.parent if path.name in listed else None


def read_sealed(folder: Path, summary_only: bool = False) -> Sealed:
    """A finished folder's summary, when every file its seal lists still holds the bytes sealed
    and no file under one of cyto's own output names was added; otherwise what is wrong (see
    :class:`Sealed`). The one check before a finished folder's outputs are trusted.
    ``summary_only``: check the summary's bytes alone (what a cohort table's row is drawn
    from: cheap for a thousand folders), not the tables beside it."""
    folder = Path(folder)
    record, why = _read_seal(folder)
    if record is None:
        return Sealed(folder, why=why)
    files: dict = record["files"]
    changed: dict[str, str] = {}
    summary = None
    spec = files[SUMMARY]
    try:
        data = (folder / SUMMARY).read_bytes()
    except OSError:
        changed[SUMMARY] = f"{SUMMARY} is missing"
    else:
        if len(data) != spec.get("bytes") or hashlib.sha256(data).hexdigest() != spec.get("sha256"):
            changed[SUMMARY] = SUMMARY
        else:
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                summary = parsed
            else:  # sealed, yet not a summary: not what cyto writes
                changed[SUMMARY] = SUMMARY
    if summary_only:
        return Sealed(folder, summary=summary, changed=tuple(changed.values()),
                      changed_names=tuple(changed))  # fmt: skip
    for name, spec in files.items():
        if name not in (SUMMARY, SEAL):
            change = _file_change(folder / name, spec)
            if change is not None:
                changed[name] = change
    for name in record.get("owned") or []:
        if name not in files and name != SEAL:
            path = folder / name
            if path.exists() or path.is_symlink():
                changed[name] = f"{name} was added"
    return Sealed(
        folder,
        summary=summary,
        changed=tuple(changed.values()),
        changed_names=tuple(changed),
    )


def refuse_unfinished(folder: Path) -> None:
    """A scored slide's folder that a run is writing now, or one a run left unfinished (its
    :data:`PARTIAL` folder, no seal), refused in one line that says so and how to finish it.
    Asked before a reader says what the folder lacks: a run stopped before its first chunk
    left no table, and ``cyto eval scores`` called it "a folder without scores.parquet"
    where one stopped later was told to finish with ``--resume`` (hostile round 70, 2)."""
    from cyto.errors import ConfigError

    refuse_being_written(folder)
    why = unfinished(folder)
    if why:
        raise ConfigError(f"{folder}: {why}, then read its table")


def check_sealed_table(table: Path) -> None:
    """A table in a scored slide's folder is trusted only through its seal (the one door of
    :func:`read_sealed`): an edited folder is refused in one line, and so is one that holds an
    unfinished run (its :data:`PARTIAL` chunks, no seal yet: a run killed while it wrote its
    outputs left a table beside them that calibrate took without a word, hostile round 46, 2);
    a table copied out on its own carries no seal to check, and is taken as it is. For every
    reader of a scored table (``cyto calibrate``, ``cyto eval scores``)."""
    from cyto.errors import ConfigError

    folder = Path(table).parent
    refuse_unfinished(folder)
    if not ((folder / SEAL).exists() or (folder / SUMMARY).exists()):
        return
    sealed = read_sealed(folder)
    if not sealed.ok:
        raise ConfigError(f"{folder}: {sealed.words()}: {SCORE_AGAIN}")


#: a cyto table's own seal in its file metadata: the sha256 of its rows (:func:`rows_digest`),
#: so a table copied out of its sealed folder (or one that never had a folder: ``cyto predict``'s)
#: is still known to hold the rows cyto wrote
ROWS_KEY = "cyto.rows_sha256"
#: metadata that says a table is cyto's (a score table of cyto score or cyto predict)
_CYTO_KEYS = (b"cyto.manifest_sha256", b"cyto.version", b"cyto.scoring_id")


def rows_digest(table) -> str:
    """The sha256 of a table's rows: every column (by name, sorted), its values as they read
    back from Parquet (numbers by their bytes, the rest by their text)."""
    import numpy as np

    h = hashlib.sha256(b"cyto-rows-v1")
    for name in sorted(table.column_names):
        values = table.column(name).to_numpy(zero_copy_only=False)
        h.update(name.encode() + b"\0")
        if values.dtype.kind in "biuf":
            h.update(values.dtype.str.encode() + np.ascontiguousarray(values).tobytes())
        else:
            h.update("\x1f".join(map(repr, values.tolist())).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def with_rows_seal(table, meta: dict | None = None):
    """``table`` with ``meta`` (default: its own metadata) and its rows' seal, to be written."""
    given = (table.schema.metadata or {}) if meta is None else meta
    # one spelling of each key (pyarrow gives bytes): an old seal must not stand beside the new
    fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in given.items()}
    fields[ROWS_KEY] = rows_digest(table)
    return table.replace_schema_metadata(fields)


def is_cyto_table(table) -> bool:
    """Whether a table says it is cyto's (its file metadata names a cyto model or version)."""
    meta = table.schema.metadata or {}
    return any(k in meta for k in _CYTO_KEYS)


def is_cyto_table_file(path: Path) -> bool:
    """Whether the file at ``path`` is a Parquet table cyto wrote: its schema (alone read)
    carries cyto's metadata (a score table's, or a top-K extract's row seal); False for
    anything else."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return any(k.startswith(b"cyto.") for k in meta)


def check_rows(table, path: Path, again: str) -> None:
    """A cyto table holds the rows cyto wrote (its :data:`ROWS_KEY`), or one line says it does
    not (``again``: how to make it anew). A table that is not cyto's is left to the caller."""
    from cyto.errors import ConfigError

    if not is_cyto_table(table):
        return
    recorded = (table.schema.metadata or {}).get(ROWS_KEY.encode())
    if recorded is None:
        raise ConfigError(
            f"{path}: a cyto table whose rows carry no seal (written by an older cyto, or "
            f"rewritten by another tool): {again}"
        )
    if recorded.decode(errors="replace") != rows_digest(table):
        raise ConfigError(f"{path}: its rows are not as cyto wrote them (edited since): {again}")
