"""The score table's rows on their way to disk: resumable chunks in ``OUT/SLIDE/.partial``, and
the lock that keeps one writer per output folder.

Each chunk holds whole tiles and is named by the range of tiles it holds
(``chunk-<first>-<last>.parquet``, positions in the run's tile list), written under a temporary
name and renamed; a state file records what the rows depend on (model, slide identity,
options). A resumed run with the same state continues after the last chunk; any other state
starts over. Chunks never overlap and never leave a gap, or the store says so.

One writer per output folder: :class:`cyto.locks.OutputLock` on ``OUT/SLIDE/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from contextvars import ContextVar
from pathlib import Path

from cyto.bundle import atomic_write, sha256_file
from cyto.detect.morphometry import COLUMNS as MORPHOMETRY_COLUMNS
from cyto.errors import CytoError, first_line
from cyto.flags import named, passing, python_call, ran
from cyto.reuse import check_reuse, read_record
from cyto.seal import PARTIAL
from cyto.slides.base import PLANE_SEP, sampled_ranges
from cyto.slides.remote import SlideURL, known_by_bytes, remote_identity, slide_ref
from cyto.tables import json_text, parquet_file

#: each chunk's bytes and sha256 as written, in ``.partial`` (see :meth:`ChunkStore.write`)
CHUNKS = "chunks.json"


#: what a URL's version is, said wherever a slide by URL is known by it
_VERSION_IS = "its ETag or time of change: the same bytes copied anew are another version"


def store_key_names(key: dict | None = None) -> dict[str, str]:
    """The fields of a chunk store's ``key`` by the user's names, in the caller's words when the
    resume is refused (an option, ``rank_by`` or those under ``options``, keeps its own name:
    :func:`cyto.flags.named`, ``--rank-by`` at the command line, ``rank_by`` from Python). A
    slide by URL is known by the version its server states, not by its content: a resume over
    one whose version moved was told "the slide's (or a plane's) file content"."""
    files = list((key or {}).get("slide") or {})
    by_url = any(isinstance(slide_ref(f), SlideURL) for f in files)
    return {
        # the model argument as the caller gave it (MODEL at the command line, model= from
        # Python: a Python resume was told "MODEL")
        "model": f"{'model=' if python_call() else 'MODEL'} (its manifest)",
        "slide": (
            f"the version its server states of the slide ({_VERSION_IS}):"
            if by_url
            else "the slide's (or a plane's) file content:"
        ),
        "options": "",
        "precision": ran("precision"),  # the precision auto took, under "options"
        "tiles": "the tile list's length",
        "columns": "the table layout (an older cyto)",
        "nuclei_file": f"the {named('nuclei')} file's content",
        "data": "the images of DATA (added, removed or changed)",
        "sharpness": f"the crops' sharpness measured ({passing('adequacy', 'none')} does not)",
    }


_CHUNK = re.compile(r"^chunk-(\d+)-(\d+)\.parquet$")


def slide_identity(path: Path, block: int = 1 << 16, samples: int = 32) -> str:
    """A content hash of a file that is fast on 10 GB slides: its size, its first and last MiB,
    and ``samples`` blocks spread evenly between them (about 3 MiB read in all). A slide replaced
    by another, or truncated, gets another identity; an unchanged one copied elsewhere keeps it.
    A DICOM slide (a folder) hashes each of its instances' identities with its name."""
    path = slide_ref(path)
    if isinstance(path, SlideURL):  # its version, asked of the server (no bytes hashed)
        return remote_identity(path)
    if path.is_dir():
        from cyto.slides.dicom import slide_instances

        h = hashlib.sha256(b"cyto-slide-identity-v1:dicom")
        for f in slide_instances(path):
            h.update(f"{f.name}\t{slide_identity(f, block, samples)}\n".encode())
        return h.hexdigest()
    size = path.stat().st_size
    h = hashlib.sha256(f"cyto-slide-identity-v1:{size}".encode())
    with open(path, "rb") as fh:
        for start, n in sampled_ranges(size, block, samples):
            fh.seek(start)
            h.update(fh.read(n))
    return h.hexdigest()


def identity_name(slide) -> str:
    """How a slide's identity is named where it differs (a resume, a viewer, a review): a
    local file by its content; a URL by the version its server states, which a copy of the
    same bytes made anew changes too (nginx's ETag is the time of change and the size: a
    re-copied slide was said "the slide file view.tif" that "changed": hostile round 62, 5)."""
    slide = slide_ref(slide)
    if isinstance(slide, SlideURL) and known_by_bytes(slide):  # no version stated (round 61, 1)
        return (
            f"the content of {slide} (its size and sampled bytes: its server states no version "
            "of it)"
        )
    if isinstance(slide, SlideURL):
        return f"the version of {slide} its server states ({_VERSION_IS})"
    return f"the slide file {Path(slide).name}'s content"


def file_identity(path: Path | None) -> str | None:
    """:func:`slide_identity` of a side file, None when none is given or it cannot be read
    (a missing file fails on its own, by name, where it is read). A side file is a file: a
    folder given for one is not hashed as a DICOM slide (it was refused as a bad slide, naming
    neither ``--truth`` nor ``--nuclei``); it fails where it is read, as what it was given for."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return slide_identity(Path(path))
    except OSError:
        return None


def schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("slide_id", pa.string()),
            ("cell_id", pa.int64()),
            ("x", pa.float64()),
            ("y", pa.float64()),
            ("nucleus_area", pa.float64()),
            ("score", pa.float64()),
            # the morphometric score (cyto.data.morphometry); null when the bundle records none
            ("morphometry_score", pa.float64()),
            ("focal_plane_um", pa.float64()),
            ("tile", pa.int64()),
            # the crop's sharpness (cyto.infer.quality); NaN when not measured (--adequacy none)
            ("sharpness", pa.float64()),
            # each cell's morphometry, measured on its crop (cyto.detect.morphometry)
            *((name, pa.float64()) for name in MORPHOMETRY_COLUMNS),
        ]
    )


def slide_key(slide: Path, planes: list[tuple[float, str]]) -> dict:
    """The identity of the slide and of its plane files (what a resumed run must find again)."""
    files = [slide_ref(slide)] + sorted({Path(p.split(PLANE_SEP)[0]) for _, p in planes})
    return {str(f): slide_identity(f) for f in files}


#: (the folder, the summary of its finished run) whose cells serve the run now starting there:
#: only what is drawn from its table differs (top-K, mosaics, ranking, error rates, truth,
#: QuPath outputs). Set by :func:`cyto.cohort.local.score_one` around the run, which then
#: starts from that table (:meth:`ChunkStore.keep`) rather than score every cell again.
KEPT_ROWS: ContextVar[tuple[Path, dict] | None] = ContextVar("cyto_kept_rows", default=None)


def rows_differ(recorded, key: dict) -> list[str]:
    """What keeps a finished run's rows, recorded under the key ``recorded`` (its summary's
    ``rows_key``), from serving a store of ``key``: the model, the slide's identity, the options
    that shape rows, their precision, the tile list and table layout must match; the ranking
    is drawn at the finish from rows that carry every score (``rank_by``); crops' sharpness is
    a column only a run with an adequacy rule measured (``sharpness``: needed now, missing
    then). Empty: they serve. A run of an older cyto recorded no key, and serves nothing."""
    if not isinstance(recorded, dict):
        return ["the finished run recorded no key of its rows (an older cyto)"]
    names = store_key_names(key)
    rest = ("rank_by", "sharpness")
    was = {k: v for k, v in recorded.items() if k not in rest}
    # the slide and its planes by name and content: the same files moved elsewhere serve
    was["slide"], key = (
        files_by_name(was.get("slide")),
        {**key, "slide": files_by_name(key["slide"])},
    )
    differs = list(
        check_reuse(was, {k: v for k, v in key.items() if k not in rest}, names=names).differs
    )
    if key.get("sharpness") and not recorded.get("sharpness"):
        differs.append("its crops' sharpness, measured only under an adequacy rule, is missing")
    return differs


def files_by_name(files) -> dict | None:
    """A slide key's files (:func:`slide_key`: path -> content identity, the slide first) with
    the slide as ``slide`` and its planes by their names: a slide moved or renamed, its planes
    moved with it, holds the same files."""
    if not isinstance(files, dict):
        return None
    return {
        "slide" if i == 0 else slide_ref(f).name: identity
        for i, (f, identity) in enumerate(files.items())
    }


def kept_words(store_dir: Path, then: str = "") -> str:
    """What a stopped run leaves for ``--resume``, in words: the finished chunks (a chunk's
    ``.tmp``, cut short, is none), or that there are none yet (then a rerun starts it over; a
    cohort says what its other slides need: :func:`cyto.cohort.local.score_cohort`). ``then``:
    what to do before the rerun ("fix that and "), said before it."""
    from cyto.location import shown

    n = len(list(Path(store_dir).glob("chunk-*.parquet"))) if Path(store_dir).is_dir() else 0
    if n:
        again = passing("resume")
        where = f"in {store_dir}"
        prefix = shown(Path(store_dir).parent)
        if prefix != str(Path(store_dir).parent):
            # a folder staged for object storage: the chunks are on this machine, not in the
            # prefix ("kept in s3://.../.partial", where the bucket held nothing: round 62, 4)
            where = f"on this machine, in the staging folder of {prefix}"
            again += " here"
        return f"{n} finished chunk(s) are kept {where}: {then}rerun with {again}" + (
            "" if then else " to continue"
        )
    return "no chunk was finished yet: a rerun starts it over"


class ChunkStore:
    """Resumable row chunks in ``out_dir/.partial`` (see the module docstring). ``unit`` names
    the positions chunks are ranges of (a slide's tiles, a patch folder's images) and ``rows``
    their rows, when a position holds several (a tile's cells; None: one row each)."""

    def __init__(
        self, out_dir: Path, key: dict, unit: str = "tiles", rows: str | None = "cells"
    ) -> None:
        self.dir = Path(out_dir) / PARTIAL
        self.key = key
        self.unit, self.rows = unit, rows
        self.kept = False  # its one chunk is a finished run's table (keep): resumed unsaid
        self._chunks: dict | None = None  # chunks.json as this writer last read or wrote it

    def start(self, resume: bool, echo) -> tuple[int, int]:
        """(tiles done, cells done): what an earlier run left, when resuming a matching run."""
        import pyarrow.parquet as pq

        state = self.dir / "state.json"
        if resume and state.is_file():
            reuse = check_reuse(read_record(state), self.key, names=store_key_names(self.key))
            if reuse.ok:
                for f in self.dir.glob("*.tmp"):
                    f.unlink()
                self._drop_damaged(echo)
                done_tiles = self._ranges()[-1][1] + 1 if self._ranges() else 0
                done_cells = sum(pq.read_metadata(f).num_rows for f in self._files())
                done = f"{done_tiles} {self.unit}"
                if self.rows:
                    done += f" and {done_cells} {self.rows}"
                if self.kept:  # a finished table, not a stopped run's chunks: said by its keeper
                    return done_tiles, done_cells
                if done_tiles:
                    echo(f"resuming: {done} already scored")
                else:  # "resuming: 0 tiles and 0 cells already scored" (hostile round 59, 11)
                    echo(
                        "resume: the stopped run finished no chunk yet; starting from the beginning"
                    )
                return done_tiles, done_cells
            echo(f"resume: the earlier run had {reuse.words()}; starting over")
        elif resume:
            echo("resume: no unfinished run here; starting from the beginning")
        elif state.is_file() and (files := self._files()):  # discarded unsaid: round 25
            done = sum(int(m[2]) - int(m[1]) + 1 for f in files if (m := _CHUNK.match(f.name)))
            echo(
                f"note: the {len(files)} finished chunk(s) ({done} {self.unit}) of a "
                f"stopped run here are discarded: starting over (pass {passing('resume')} to go "
                "on from them)"
            )
        shutil.rmtree(self.dir, ignore_errors=True)
        self._chunks = {}
        self.dir.mkdir(parents=True)
        state.write_text(json_text(self.key, indent=1))
        return 0, 0

    def _drop_damaged(self, echo) -> None:
        """A chunk that cannot be read (0 bytes or cut short: a disk that filled, a copy that
        stopped), or whose bytes are not those its run recorded (``chunks.json``, written before
        the chunk is renamed into place: edited by hand), is treated as never
        written: it and the chunks after it go, and their tiles are scored again (chunks must
        follow each other without a gap). A resumed run never takes rows it did not write."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = self._files()
        record = self._record()
        for i, f in enumerate(files):
            try:
                pq.read_metadata(f)
                known = record.get(f.name) or {}
                size, digest = known.get("bytes"), known.get("sha256")
                why = ""
                if size != f.stat().st_size or digest != sha256_file(f):
                    why = "is not as this run wrote it (edited, or written by an older cyto)"
            except (pa.ArrowInvalid, OSError) as exc:
                why = f"is damaged ({first_line(exc)})"
            if why:
                for later in files[i:]:
                    later.unlink(missing_ok=True)
                self._write_record({k: v for k, v in record.items() if (self.dir / k).is_file()})
                echo(
                    f"resume: {f.name} {why}: its {self.unit} and those of the "
                    f"{len(files) - i - 1} chunk(s) after it are scored again"
                )
                return

    def _record(self) -> dict:
        """``chunks.json``: each chunk's bytes and sha256 as its run wrote it ({} when none);
        read once, then kept as this writer (the folder's only one) writes it."""
        if self._chunks is None:
            try:
                record = json.loads((self.dir / CHUNKS).read_text())
            except (OSError, ValueError):
                record = {}
            self._chunks = record if isinstance(record, dict) else {}
        return dict(self._chunks)

    def _write_record(self, record: dict) -> None:
        atomic_write(self.dir / CHUNKS, json_text(record, indent=1, sort_keys=True).encode())
        self._chunks = dict(record)

    def _files(self) -> list[Path]:
        return sorted(f for f in self.dir.glob("chunk-*.parquet") if _CHUNK.match(f.name))

    def _ranges(self) -> list[tuple[int, int]]:
        """The tile ranges of the chunks, in order; they must follow each other without overlap
        or gap (one writer per folder guarantees it; anything else is a damaged store)."""
        ranges = []
        for f in self._files():
            m = _CHUNK.match(f.name)
            ranges.append((int(m.group(1)), int(m.group(2))))
        ranges.sort()
        expect = 0
        for a, b in ranges:
            if a != expect or b < a:
                raise CytoError(
                    f"{self.dir}: chunk files overlap or leave a gap at tile {expect} "
                    f"(found {a}-{b}); delete {self.dir} and score the slide again"
                )
            expect = b + 1
        return ranges

    def write(self, table, first_tile: int, tiles_done: int) -> None:
        """Rows of the tiles ``first_tile`` .. ``tiles_done - 1`` (positions in the tile list)."""
        import pyarrow.parquet as pq

        if tiles_done <= first_tile:
            raise ValueError(f"a chunk holds at least one tile, got {first_tile}..{tiles_done}")
        name = f"chunk-{first_tile:07d}-{tiles_done - 1:07d}.parquet"
        if (self.dir / name).exists():
            raise CytoError(f"{self.dir / name} exists: another writer is in this folder")
        tmp = self.dir / f"{name}.tmp"
        pq.write_table(table, tmp)
        written = {"bytes": tmp.stat().st_size, "sha256": sha256_file(tmp)}
        # its record first, then the chunk into place: a run stopped in between leaves a
        # record of a chunk that is not there (nothing reads it), never a chunk without one
        self._write_record({**self._record(), name: written})
        os.replace(tmp, self.dir / name)

    def keep(self, table, checks: dict) -> list[str]:
        """Start the store anew with a finished run's ``table`` of these very rows
        (:func:`rows_differ` found none) as its one chunk, of every tile, and the first tiles'
        ``checks`` that run made: a resumed run then only finishes the slide. Returns the
        columns the table lacks, and keeps nothing, when it lacks any."""
        import numpy as np
        import pyarrow as pa

        if "sharpness" not in table.column_names and not self.key.get("sharpness"):
            # not measured (no adequacy rule): the table leaves out the NaN the chunks held
            table = table.append_column("sharpness", pa.array(np.full(table.num_rows, np.nan)))
        missing = [c for c in schema().names if c not in table.column_names]
        if missing:
            return missing
        self.start(False, lambda _m: None)
        rows = pa.Table.from_batches(
            table.select(schema().names).cast(schema()).to_batches(), schema=schema()
        )
        self.write(rows, 0, self.key["tiles"])
        self.save_checks(checks)
        self.kept = True
        return []

    def save_checks(self, checks: dict) -> None:
        """The first tiles' crowding and cell-scale checks (``checks.json``): a resumed run
        judges the slide by them, not by the tiles it scores itself (none, when every chunk was
        finished), so its summary and adequacy are those of an uninterrupted run."""
        data = json.dumps(checks, default=lambda v: v.item())  # numpy scalars as numbers
        atomic_write(self.dir / "checks.json", data.encode())

    def read_checks(self) -> dict | None:
        """What :meth:`save_checks` kept, None when nothing (or nothing readable) was kept."""
        try:
            checks = json.loads((self.dir / "checks.json").read_text())
        except (OSError, ValueError):
            return None
        return checks if isinstance(checks, dict) and "crowd" in checks else None

    def read_all(self):
        import pyarrow as pa

        self._ranges()  # refuses overlapping or missing chunks
        files = self._files()
        if not files:
            return schema().empty_table()
        # ParquetFile, not read_table: read_table imports pyarrow.dataset (0.05-0.4 s of the
        # slide's clock on 2 cores) to read one plain file
        return pa.concat_tables(
            [parquet_file(f).read().replace_schema_metadata(None) for f in files]
        )

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self._chunks = None
