"""An existing result is replaced only when asked.

Every command that writes a result file or folder (``cyto predict``'s table, ``cyto data
mosaic``'s image, ``cyto score``'s folder of a finished slide, a review report in a folder of
the user's choosing, ``cyto calibrate``'s calibration of a bundle, ``cyto demo``'s folder, a
saved bundle) refuses to replace one that is there unless ``--overwrite`` is given, through
:func:`refuse_to_replace`, so the words and the exit code are the same everywhere. Continuing
a run into its own place (``cyto score --resume``, ``cyto predict --resume`` of a stopped run, a
rerun ``cyto eval sweep``) is no replacement.
"""

from __future__ import annotations

from pathlib import Path

from cyto.errors import CytoError, InputPathError


def exists(path: Path) -> bool:
    """Whether ``path`` holds a result: a file, or a folder with anything in it (an empty
    folder made beforehand holds nothing to lose)."""
    path = Path(path)
    if path.is_dir():
        return any(path.iterdir())
    return path.exists() or path.is_symlink()


def refuse_to_replace(
    path: Path,
    overwrite: bool,
    name: str | None = None,
    error: type[CytoError] = InputPathError,
    other: str = "",
) -> None:
    """Raise ``error`` (exit 2 by default) when ``path`` holds a result and ``overwrite`` is
    not set: one line naming it (``name``, by default ``--out PATH``) and the flag (``other``:
    another way out, e.g. ``--resume to keep them``), in the caller's words (:mod:`cyto.flags`:
    ``overwrite=True`` from Python)."""
    from cyto.flags import passing

    if overwrite or not exists(path):
        return
    alternative = f", or {other}" if other else ""
    name = name or passing("out", path)
    raise error(f"{name} exists (pass {passing('overwrite')} to replace it{alternative})")
