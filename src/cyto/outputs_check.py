"""An existing result is replaced only when asked, and only when it is cyto's own.

Every command that writes a result file or folder (``cyto predict``'s table, ``cyto data
mosaic``'s image, ``cyto score``'s folder of a finished slide, a review report in a folder of
the user's choosing, ``cyto calibrate``'s calibration of a bundle, ``cyto demo``'s folder, a
saved bundle, ``cyto synth patches``'s dataset, ``cyto data cells``'s class folder) refuses to
replace one that is there unless ``--overwrite`` is given, through :func:`refuse_to_replace`, so
the words and the exit code are the same everywhere. Continuing a run into its own place (``cyto
score --resume``, ``cyto predict --resume`` of a stopped run, a rerun ``cyto eval sweep``) is no
replacement.

A folder is replaced only when every file in it is one cyto wrote there: named in the record
cyto writes last into each folder it makes (:data:`RECORD`, :func:`record_outputs`) or matching
the names the command is known to write (``known``: a bundle's manifest and derived files, a
dataset's ``CLASS/CLASS_00001.jpg``, for folders made before the record). A folder holding any
other file is refused, with or without ``--overwrite``, in one line naming that file: the user's
own images or notes are never deleted with cyto's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from contextvars import ContextVar
from fnmatch import fnmatchcase
from pathlib import Path

from cyto.errors import CytoError, InputPathError
from cyto.flags import passing
from cyto.locks import LOCK
from cyto.tables import json_text

#: the record of what cyto wrote in a folder it made (relative POSIX paths), written last
RECORD = ".cyto-outputs.json"
RECORD_FORMAT = "cyto-outputs"


#: set by a run that checked, before any work, that none of its slides' folders held finished
#: results (no --resume, no --overwrite): the pipeline checks it again once it holds a
#: folder's lock, so a second run started seconds later cannot replace what the first has
#: finished since (the check and the lock were seconds apart)
FRESH_ONLY: ContextVar[bool] = ContextVar("cyto_fresh_only", default=False)
#: set by a resumed run (``--resume``, a watch) that found no finished results to reuse before
#: it began: once it holds the folder's lock, a folder another run has finished since raises
#: :class:`FinishedMeanwhile`, so the run can reuse it rather than score the slide again (two
#: watches of one folder scored each slide twice, the second right after the first finished:
#: hostile round 42, 3)
UNFINISHED_AT_START: ContextVar[bool] = ContextVar("cyto_unfinished_at_start", default=False)


class FinishedMeanwhile(Exception):  # noqa: N818 - a signal, not an error
    """A slide's folder was finished by another run while this one waited for its lock."""


def exists(path: Path, locked: bool = False) -> bool:
    """Whether ``path`` holds a result: a file, or a folder with anything in it (an empty
    folder made beforehand holds nothing to lose). ``locked``: the caller holds the folder's
    lock (:class:`cyto.locks.OutputLock`), whose file is then no result."""
    path = Path(path)
    if path.is_dir():
        return any(not (locked and p.name == LOCK) for p in path.iterdir())
    return path.exists() or path.is_symlink()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` (links as themselves, never followed), relative, sorted."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        # a link to a folder is an entry of its own: os.walk lists it among dirs, unfollowed
        found += [(rel / d).as_posix() for d in dirs if (Path(root) / d).is_symlink()]
        found += [(rel / f).as_posix() for f in files]
    return sorted(found)


def record_outputs(folder: Path, command: str) -> None:
    """Write :data:`RECORD` in ``folder``: every file in it now, as the files ``command``
    wrote. Called last, on the folder cyto built (before it is renamed into place)."""
    folder = Path(folder)
    files = [f for f in _files(folder) if f != RECORD]
    text = json_text({"format": RECORD_FORMAT, "command": command, "files": files}, indent=1)
    (folder / RECORD).write_text(text + "\n")


def recorded(folder: Path) -> set[str]:
    """The files :data:`RECORD` in ``folder`` says cyto wrote there (none when it is absent or
    unreadable: then nothing is vouched for by it)."""
    try:
        data = json.loads((Path(folder) / RECORD).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return set()
    return {f for f in data.get("files", []) if isinstance(f, str)}


def foreign_files(folder: Path, known: Iterable[str] = (), locked: bool = False) -> list[str]:
    """The files in ``folder`` cyto did not write: neither in its :data:`RECORD` nor matching
    one of ``known`` (shell patterns over the relative POSIX path, ``*`` spanning folders).
    The folder's lock file is cyto's own when the caller holds it (``locked``) or no run does
    (a killed run's: it was called a file cyto did not write, and the folder could not be used
    again); held by a live run, it stays in the way."""
    from cyto.locks import held

    folder = Path(folder)
    own = recorded(folder)
    stale = locked or not held(folder)  # held: False where there is no lock file
    patterns = [RECORD, *([LOCK] if stale else []), *known]
    return [
        f for f in _files(folder) if f not in own and not any(fnmatchcase(f, p) for p in patterns)
    ]


def refuse_foreign(foreign: list[str], label: str, error: type[CytoError] = InputPathError) -> None:
    """Raise ``error`` when ``foreign`` (files cyto did not write, in the folder ``label``
    names) is not empty, with or without ``--overwrite``: one line naming the first."""
    from cyto.flags import passing

    if foreign:
        more = f" and {len(foreign) - 1} other file(s)" if len(foreign) > 1 else ""
        them = "them" if more else "it"
        raise error(
            f"{label} holds {foreign[0]}{more} that cyto did not write: "
            f"{passing('overwrite')} replaces only cyto's own outputs, so move {them} away "
            "or choose another place"
        )


def refuse_keep_and_replace(resume: bool, overwrite: bool, keeps: str, again: str) -> None:
    """Asked both to continue what a place holds (``resume``: it ``keeps``) and to replace it
    (``overwrite``: it does ``again``), one of them was silently ignored: refused in one line
    naming both in the caller's words (``--resume`` / ``resume=True``). ``cyto score``,
    ``cyto train`` and their Python calls alike."""
    from cyto.errors import ConfigError

    if resume and overwrite:
        raise ConfigError(
            f"{passing('resume')} {keeps} and {passing('overwrite')} {again}: give one of "
            "them, not both"
        )


def refuse_to_replace(
    path: Path,
    overwrite: bool,
    name: str | None = None,
    error: type[CytoError] = InputPathError,
    other: str = "",
    known: Iterable[str] | None = None,
    inputs: dict[str, object] | None = None,
    locked: bool = False,
) -> None:
    """Raise ``error`` (exit 2 by default) when ``path`` holds a result and ``overwrite`` is
    not set: one line naming it (``name``, by default ``--out PATH``) and the flag (``other``:
    another way out, e.g. ``--resume to keep them``), in the caller's words (:mod:`cyto.flags`:
    ``overwrite=True`` from Python).

    ``known`` is given by every command that replaces a folder as a whole (the names it writes
    there; ``()``: only what its record lists): a folder holding a file cyto did not write
    (:func:`foreign_files`) is then refused whether ``overwrite`` is set or not, naming that
    file. ``None``: ``path`` is a file, or a folder whose writer replaces only its own named
    files and deletes nothing else. ``inputs``: the command's inputs (option name -> path), of
    which ``path`` may be none, with or without ``overwrite`` (:func:`refuse_input_as_output`).
    ``locked``: the caller holds ``path``'s lock (:func:`exists`)."""
    from cyto.flags import passing

    path = Path(path)
    label = name or passing("out", path)
    refuse_input_as_output(path, label, inputs or {}, error)
    if known is not None and path.exists() and not path.is_dir():
        # a folder output given a file (a user's slide): with --overwrite it ended in a raw
        # FileExistsError, without it the advice to pass --overwrite led there
        raise error(
            f"{label} is a file: this command writes a folder there; give a folder (it is "
            "created if missing)"
        )
    if known is not None and path.is_dir() and not path.is_symlink():
        from cyto.locks import another_out, held

        if not locked and held(path):  # a live run's folder: busy, not foreign
            from cyto.errors import OutputBusyError

            raise OutputBusyError(
                f"{label} is being written by another cyto run now; wait for it to finish, or "
                f"{another_out()}"
            )
        refuse_foreign(foreign_files(path, known, locked), label, error)
    if overwrite or not exists(path, locked):
        return
    alternative = f", or {other}" if other else ""
    raise error(f"{label} exists (pass {passing('overwrite')} to replace it{alternative})")


def _same_or_inside(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is the file or folder ``outer``, or lies inside the folder ``outer``
    (links and other spellings resolved)."""
    try:
        a, b = inner.resolve(), outer.resolve()
    except (OSError, RuntimeError):
        return False
    return a == b or b in a.parents


def _is_bundle(path: Path) -> bool:
    """A model bundle's folder: nothing but cyto's own steps writes inside it."""
    return (path / "manifest.json").is_file()


def named_input(option: str, given: object) -> str:
    """An input as the caller gave it: ``--data PATH`` / ``data='PATH'``, or an argument by
    position (upper case: ``MODEL PATH`` at the command line, ``model='PATH'`` from Python)."""
    from cyto.flags import passing, python_call

    if option.isupper():
        return f"{option.lower()}={str(given)!r}" if python_call() else f"{option} {given}"
    return passing(option, Path(given))


def refuse_input_as_output(
    out: Path,
    label: str,
    inputs: dict[str, object],
    error: type[CytoError] = InputPathError,
    inside: Iterable[str] = (),
) -> None:
    """An output never replaces an input: ``out`` that is one of ``inputs`` (option name ->
    path; None and URLs skipped), a folder holding one, or a folder inside an input model
    bundle (a slide's results written into the bundle), is refused in one line naming both in
    the caller's words, ``--overwrite`` or not (``cyto predict --data m.parquet --out m.parquet
    --overwrite`` replaced the user's manifest with its score table). ``inside``: the inputs
    an output may not lie inside either (a sweep's plots written into a class folder of its
    ``--data`` would be read as cells by the next run)."""

    for option, given in inputs.items():
        if given is None or "://" in str(given):
            continue
        within = _is_bundle(Path(given)) or option in inside
        inside_input = within and _same_or_inside(Path(out), Path(given))
        if _same_or_inside(Path(given), Path(out)) or inside_input:
            what = "is" if Path(given).resolve() == Path(out).resolve() else "holds"
            if inside_input and what != "is":
                what = "lies inside"
            named = named_input(option, given)
            raise error(
                f"{label} {what} the input {named}: an output never replaces an input; give "
                "another place to write to"
            )


def check_out_file(out: Path, field: str = "out") -> None:
    """A file ``out`` (the option ``field``) that can be written, checked before any work: a
    folder given for it, or a missing or read-only folder above it, used to end in a traceback
    after the scoring. Named in the caller's words (``--out PATH``, ``out='PATH'``)."""
    out = Path(out)
    given = passing(field, out)
    if out.is_dir():
        raise InputPathError(
            f"{given} is a folder; give a file name beside it, e.g. "
            f"{out.with_name(out.name + '-scores.parquet')}"
        )
    check_output(out, flag=f"{given}:")


def check_output(out: Path, flag: str) -> None:
    """The place of an output ``out``, checked before any work (:func:`check_writable`): the
    folder above it takes new files, and ``out`` is no link to nothing (what is made through
    one lands where it points: hostile round 45, 3). ``flag``: ``out`` in the caller's words,
    with a colon."""
    out = Path(out)
    dangling = out.is_symlink() and not out.exists()
    check_writable(out if dangling else out.parent, flag=flag)


def check_writable(out: Path, flag: str | None = None) -> None:
    """``out``, or the nearest folder above it that exists, must take new files: a read-only
    --out used to fail on its lock file with a traceback after the slides were scored."""
    import os

    from cyto.errors import OutputWriteError
    from cyto.flags import passing

    where = flag or f"{passing('out', out)}:"
    here = Path(out).absolute()
    while not here.exists() and here != here.parent:
        # a link to nothing: a folder made through it was made where it points (data field
        # made /nonexistent/zz/f), or mkdir failed in a traceback (hostile round 45, 3)
        if here.is_symlink():
            raise OutputWriteError(
                f"cannot write {where.rstrip(':')}: {here} is a link to {os.readlink(here)}, "
                "which does not exist"
            )
        here = here.parent
    if not here.is_dir():
        raise OutputWriteError(f"cannot write {where.rstrip(':')}: {here} is a file, not a folder")
    if not os.access(here, os.W_OK | os.X_OK) or not _takes_a_file(here):
        raise OutputWriteError(
            f"{where} {here} is read-only for this user; give a folder you can write to"
        )


def _takes_a_file(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (made and removed at once): the mode bits do
    not say it for root, nor for a read-only mount or an immutable folder, where export and
    calibrate failed after their work, naming a temporary file (hostile round 45, 17)."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".cyto-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True
