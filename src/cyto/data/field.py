"""One field of view for crops cut to each cell's bounding box (``cyto data field``).

Public Pap sets (SIPaKMeD, Herlev) crop every cell to its own box: the crops' sizes follow the
cells', at one pixel size. Every reader of a crop folder brings each crop to one size as if all
spanned one field of view, so such a folder is refused (:func:`cyto.data.dataset.
refuse_mixed_sizes`). Centred in one square field at their own pixel size, padded with their
edge colour or cut to their centre, never resampled, the cells keep their scale: a large
nucleus stays large. The new folder holds the class folders and ``field.csv``, which names each
crop's source, class and bag."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

from cyto.bundle import clear_temp_dirs_beside, temp_dir_beside
from cyto.data.dataset import crop_sides, load_records
from cyto.data.images import field_rgb, mode_words, read_image
from cyto.errors import ConfigError, DatasetError, OutputWriteError, UnreadableImageError
from cyto.flags import passing, said
from cyto.locks import LOCK, OutputLock
from cyto.outputs_check import (
    RECORD,
    check_writable,
    record_outputs,
    refuse_input_as_output,
    refuse_to_replace,
)
from cyto.progress import progress

#: the table of a field folder: each crop's new path (relative), class, source file and bag
FIELD_TABLE = "field.csv"
#: the smallest field: a cell crop has at least this many pixels a side (images.MIN_CELL_SIDE)
MIN_FIELD = 16
MAX_FIELD = 4096
#: a default field (the longest side) past this many times the median side is said, with the
#: --px that would cut the few larger crops instead
OUTLIER = 2.0


def fit_field(
    source: Path | str,
    out: Path | str,
    px: int | None = None,
    overwrite: bool = False,
    skip_unreadable: bool = False,
    echo=print,
) -> dict:
    """Write every crop of ``source`` (a class folder or manifest) centred in one ``px x px``
    field into ``out`` (class folders of PNGs and :data:`FIELD_TABLE`); ``px`` by default the
    longest side among the crops, so no cell is cut. Returns the counts.

    Raises:
        ConfigError: ``px`` outside 16-4096.
        InputPathError: ``out`` exists (without ``overwrite``), holds files cyto did not write,
            or is, holds or lies inside ``source``.
        DatasetError: two crops of a class would have one name; a crop unreadable (without
            ``skip_unreadable``)."""
    source, out = Path(source), Path(out)
    if px is not None and not MIN_FIELD <= px <= MAX_FIELD:
        raise ConfigError(f"{said('px')} must be {MIN_FIELD}-{MAX_FIELD} px, got {px}")
    records = load_records(source)
    # inside PATH, the new crops would be read as cells of a class by the next run
    refuse_input_as_output(out, passing("out", out), {"PATH": source}, inside=("PATH",))
    # a link is replaced in the folder it names, checked there (the files of a linked folder
    # were deleted unchecked: refuse_to_replace does not look through a link)
    out = Path(os.path.realpath(out))
    check_writable(out.parent, f"{passing('out', out)}:")  # built beside it, then moved in
    names = _names(records)
    sides, first = crop_sides(records)
    outlier = None
    if px is None:
        if not sides:
            raise DatasetError(f"no readable image in {source}")
        px = max(sides)
        typical = _median_side(sides)
        if px > OUTLIER * typical:  # one huge crop made every cell a speck in its field
            # the largest side within OUTLIER x the median: only the outsized crops are cut
            fits = max(s for s in sides if s <= OUTLIER * typical)
            over = sum(n for s, n in sides.items() if s > fits)
            outlier = (
                f"the field ({px} px) is set by the largest crop ({first[px]}), "
                f"{px / typical:.3g}x the median crop ({typical} px): the others' cells are "
                "small in it; "
                f"{passing('px', fits)} cuts only the {over} crop(s) larger than {fits} px to "
                "their centre"
            )
    cut = sum(n for s, n in sides.items() if s > px)
    made = not out.exists()
    try:
        with OutputLock(out, "cyto data field"):  # the lock lies in OUT: built beside, moved in
            # under the lock: a second run is refused as busy, naming the first; a killed
            # run's lock is taken over (it is no result)
            refuse_to_replace(out, overwrite, known=(), locked=True)
            clear_temp_dirs_beside(out)  # what a killed run left half written
            rows, skipped, notes = _build(records, names, out, px, skip_unreadable, source)
    finally:
        if made and out.is_dir() and not any(out.iterdir()):  # a failed first run leaves none
            out.rmdir()
    modes = mode_words(notes, len(records))
    if outlier:
        echo(outlier)
    if modes:
        echo(modes)
    if skipped:
        echo(f"skipped {len(skipped)} unreadable file(s), e.g. {skipped[0][0]} ({skipped[0][1]})")
    if cut:
        echo(
            f"{cut} crop(s) larger than {px} px were cut to their centre: a cell wider than "
            "the field lost its edges"
        )
    return {
        "crops": len(rows),
        "skipped": len(skipped),
        "cut": cut,
        "px": px,
        "sizes": len(sides),
        "folder": str(out),
        "table": str(out / FIELD_TABLE),
    }


def _build(records, names, out: Path, px: int, skip: bool, source: Path):
    """The crops written into a folder beside ``out``, then moved in: a run stopped while
    writing leaves ``out`` as it was; one killed while moving leaves every file in ``out``
    named by the record beside it, so the next run replaces them."""
    try:
        tmp = temp_dir_beside(out)
    except OSError as exc:  # a folder the user may read but not write (chattr +i, a mount)
        raise OutputWriteError(
            f"{passing('out', out)}: cannot write in {out.parent} ({exc.strerror or exc}); "
            "give a folder you can write to"
        ) from exc
    aside = None
    try:
        rows, skipped, notes = _write(records, names, tmp, px, skip)
        if not rows:
            raise DatasetError(f"no readable image in {source}")
        with open(tmp / FIELD_TABLE, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["path", "label", "source", "bag", "bag_label"])
            w.writerows(rows)
        record_outputs(tmp, "cyto data field")  # the new files, named before they move
        aside = temp_dir_beside(out)  # the earlier run's, all cyto's own (refuse_to_replace)
        # the old record goes last, the new one first: whenever a run is killed here, every
        # file in OUT is named by the record there
        for old in sorted(out.iterdir(), key=lambda e: e.name == RECORD):
            if old.name != LOCK:
                old.rename(aside / old.name)
        for new in sorted(tmp.iterdir(), key=lambda e: e.name != RECORD):
            new.rename(out / new.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    return rows, skipped, notes


def _median_side(sides) -> int:
    """The median longer side of :func:`crop_sides`' count."""
    ordered = sorted(sides.elements())
    return ordered[(len(ordered) - 1) // 2]


def _names(records) -> list[str]:
    """Each crop's new path, ``CLASS/STEM.png``: two crops of a class with one stem (a.png and
    a.jpg, or a manifest's files of two folders) are refused by name, never renamed unseen."""
    seen: dict[str, Path] = {}
    names, clashes = [], []
    for r in records:
        if r.cls.startswith(".") or not r.cls or any(c in r.cls for c in "/\\"):
            # a hidden folder is skipped by every reader of a class folder
            raise DatasetError(f"class {r.cls!r} of {r.path} cannot name a class folder")
        name = f"{r.cls}/{r.path.stem}.png"
        if name in seen:
            clashes.append((seen[name], r.path, name))
        seen.setdefault(name, r.path)
        names.append(name)
    if clashes:  # all of them at once: one rerun, not one a pair
        a, b, name = clashes[0]
        more = f" ({len(clashes)} crops share a name so in all)" if len(clashes) > 1 else ""
        raise DatasetError(f"{a} and {b} would both be written as {name}{more}: rename them")
    return names


def _write(records, names, tmp: Path, px: int, skip: bool):
    from PIL import Image

    rows, skipped, notes = [], [], []
    made: set[Path] = set()  # each class folder made once, at its first readable crop
    with progress("field", total=len(records), unit="crops") as bar:
        for r, name in zip(records, names, strict=True):
            try:
                before = len(notes)
                img = read_image(r.path, notes)
            except UnreadableImageError as exc:
                if not skip:
                    raise
                skipped.append((r.path, exc.reason))
                bar.advance(1)
                continue
            dest = tmp / name
            if dest.parent not in made:
                dest.parent.mkdir()
                made.add(dest.parent)
            field = field_rgb(img, px)
            # a grayscale crop stays grayscale (one channel): every later reader says so, as
            # this one did (written as RGB, the word was lost for good)
            gray = len(notes) > before
            Image.fromarray(field[..., 0] if gray else field).save(dest)
            rows.append((name, r.cls, str(r.path.resolve()), r.bag or "", _blank(r.bag_label)))
            bar.advance(1)
    return rows, skipped, notes


def _blank(value) -> str:
    return "" if value is None else str(value)
