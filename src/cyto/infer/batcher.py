"""Tile results in, scored rows out (:class:`CellBatcher`)."""

from __future__ import annotations

import time

import numpy as np

from cyto.data.morphometry import scorer_rank_by
from cyto.detect.morphometry import COLUMNS as MORPHOMETRY_COLUMNS
from cyto.infer.store import ChunkStore, schema
from cyto.runtime import Scorer
from cyto.runtime.lane import EngineLane


class CellBatcher:
    """Tile results in, scored rows out: crops go through the engine lane in batches of at least
    ``4 * batch_size`` cells (in a background thread when ``overlap``, at most two batches out),
    rows go to the store in chunks of whole tiles. Crops may be host arrays or tensors already
    on the engine's device (``--decode torch`` in the main process)."""

    def __init__(
        self,
        scorer: Scorer,
        store: ChunkStore,
        slide_id: str,
        opts,
        first_id: int,
        first_tile: int,
        overlap: bool = False,
    ):
        self.scorer, self.store, self.slide_id, self.opts = scorer, store, slide_id, opts
        self.lane = EngineLane(scorer, opts.batch_size, overlap)
        self.n_cells = self.first_id = first_id  # cell ids continue where a resumed run stopped
        self.first_tile = first_tile  # the first tile not yet in a chunk
        self.pending: list[dict] = []
        self.out_cells = 0  # cells submitted to the lane and not yet taken back
        self.rows: list = []
        self.n_rows = 0
        self.write_s = 0.0
        # the bundle's morphometric score of every cell, where it records one
        self.morph = scorer_rank_by(scorer, opts.rank_by)[1]

    @property
    def engine_s(self) -> float:
        return self.lane.wall_s

    @property
    def seen(self) -> int:
        """Cells taken in so far: scored, with the engine, or waiting for a batch (what the
        progress bar counts; ``n_cells`` lags by the batches the engine lane keeps out)."""
        return self.n_cells + self.out_cells + self._pending_cells()

    def _pending_cells(self) -> int:
        return sum(len(p["meta"]) for p in self.pending)

    def add(self, res: dict, tiles_done: int) -> None:
        """Take a tile result; ``tiles_done`` counts the tiles complete so far (a chunk ends
        only where a tile ends, so a part of a dense tile never goes out alone)."""
        if len(res["meta"]):
            self.pending.append(res)
        # the first cells go as soon as they fill a batch: the engine starts at the first tile,
        # not the fourth (its first 4 batches waited for 0.3-0.5 s of tiles on 2 cores)
        ahead = 4 if self.n_cells + self.out_cells > self.first_id else 1
        if self._pending_cells() >= ahead * self.opts.batch_size:
            self.score_pending()
        held = self.n_rows + self.out_cells + self._pending_cells()
        if res["final"] and held >= self.opts.chunk_cells:
            self.flush(tiles_done)

    def score_pending(self) -> None:
        """Hand the pending crops to the lane (taking back the batches it had to finish)."""
        if not self.pending:
            return
        first = self.pending[0]["crops"]
        if isinstance(first, np.ndarray):
            crops = np.concatenate([p["crops"] for p in self.pending])
        else:
            import torch

            crops = torch.cat([p["crops"] for p in self.pending])
        meta = np.concatenate([p["meta"] for p in self.pending])
        tiles = np.concatenate([np.full(len(p["meta"]), p["tile"]) for p in self.pending])
        pending, self.pending = self.pending, []
        self.out_cells += len(meta)
        # the morphometry was measured where the crops were cut
        measures = {
            c: np.concatenate([_measured(p, c) for p in pending]) for c in MORPHOMETRY_COLUMNS
        }
        morph = None if self.morph is None else self.morph.score(measures)
        for scores, tag in self.lane.submit(crops, (meta, tiles, measures, morph)):
            self._rows(scores, *tag)

    def _rows(self, scores: np.ndarray, meta: np.ndarray, tiles: np.ndarray, measures, morph):
        import pyarrow as pa

        n = len(meta)
        if morph is None:
            morph = pa.nulls(n, pa.float64())
        self.out_cells -= n
        self.rows.append(
            pa.table(
                {
                    "slide_id": [self.slide_id] * n,
                    "cell_id": np.arange(self.n_cells, self.n_cells + n),
                    "x": meta[:, 0],
                    "y": meta[:, 1],
                    "nucleus_area": meta[:, 2],
                    "focal_plane_um": meta[:, 3],
                    "score": scores,
                    "morphometry_score": morph,
                    "tile": tiles,
                    "sharpness": meta[:, 4],
                    **measures,
                },
                schema=schema(),
            )
        )
        self.n_cells += n
        self.n_rows += n

    def flush(self, tiles_done: int) -> None:
        """Write the rows of every tile before ``tiles_done`` not yet in a chunk."""
        import pyarrow as pa

        self.score_pending()
        for scores, tag in self.lane.drain():
            self._rows(scores, *tag)
        if tiles_done <= self.first_tile:
            return
        t0 = time.perf_counter()
        table = pa.concat_tables(self.rows) if self.rows else schema().empty_table()
        self.store.write(table, self.first_tile, tiles_done)
        self.first_tile = tiles_done
        self.rows.clear()
        self.n_rows = 0
        self.write_s += time.perf_counter() - t0

    def close(self) -> None:
        self.lane.close()


def _measured(result: dict, column: str) -> np.ndarray:
    """A tile result's morphometry column (NaN where its worker measured none)."""
    measures = result.get("measures")
    if measures is None:
        return np.full(len(result["meta"]), np.nan)
    return np.asarray(measures[column], dtype=np.float64)
