"""The score table's rows on their way to disk: resumable chunks in ``OUT/SLIDE/.partial``.

Each chunk holds whole tiles, is written under a temporary name and renamed, and records how many
tiles of the run's tile list are done; a state file records what the rows depend on (model,
slide, options). A resumed run with the same state continues after the last chunk; any other
state starts over.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cyto.infer.slide import PLANE_SEP

PARTIAL = ".partial"


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
            ("focal_plane_um", pa.float64()),
            ("tile", pa.int64()),
        ]
    )


def slide_key(slide: Path, planes: list[tuple[float, str]]) -> dict:
    """Size and mtime of the slide and its plane files (what a resumed run must find again)."""
    files = [Path(slide)] + [Path(p.split(PLANE_SEP)[0]) for _, p in planes]
    return {str(f): [f.stat().st_size, int(f.stat().st_mtime)] for f in files}


class ChunkStore:
    """Resumable row chunks in ``out_dir/.partial`` (see the module docstring)."""

    def __init__(self, out_dir: Path, key: dict) -> None:
        self.dir = Path(out_dir) / PARTIAL
        self.key = key

    def start(self, resume: bool, echo) -> tuple[int, int]:
        """(tiles done, cells done): what an earlier run left, when resuming a matching run."""
        import pyarrow.parquet as pq

        state = self.dir / "state.json"
        if resume and state.is_file():
            old = json.loads(state.read_text())
            if old == self.key:
                done_tiles = done_cells = 0
                for f in sorted(self.dir.glob("chunk-*.parquet")):
                    meta = pq.read_schema(f).metadata or {}
                    done_tiles = max(done_tiles, int(meta.get(b"cyto.tiles_done", b"0")))
                    done_cells += pq.read_metadata(f).num_rows
                for f in self.dir.glob("*.tmp"):
                    f.unlink()
                echo(f"resuming: {done_tiles} tiles and {done_cells} cells already scored")
                return done_tiles, done_cells
            echo("resume: the earlier run used another model, slide or options; starting over")
        elif resume:
            echo("resume: no unfinished run here; starting from the beginning")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        state.write_text(json.dumps(self.key, indent=1))
        return 0, 0

    def has_chunks(self) -> bool:
        return any(self.dir.glob("chunk-*.parquet"))

    def write(self, table, tiles_done: int) -> None:
        import pyarrow.parquet as pq

        n = len(list(self.dir.glob("chunk-*.parquet")))
        table = table.replace_schema_metadata({"cyto.tiles_done": str(tiles_done)})
        tmp = self.dir / f"chunk-{n:06d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.dir / f"chunk-{n:06d}.parquet")

    def read_all(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted(self.dir.glob("chunk-*.parquet"))
        if not files:
            return schema().empty_table()
        return pa.concat_tables([pq.read_table(f).replace_schema_metadata(None) for f in files])

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
