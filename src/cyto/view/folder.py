"""The scored slides ``cyto view`` shows: one ``cyto score`` output folder, or a cohort's folder
of them, each checked to be whole and to belong to the slide file it names.

A slide's folder is used only when its seal holds (:func:`cyto.seal.read_sealed`: its outputs
are as they were written), its outputs hold what its ``summary.json`` records and its slide file
still has the identity it was scored with (:func:`cyto.reuse.check_reuse`): markers
drawn over another slide's pixels would point at the wrong cells. A folder whose blinded review
(``cyto review serve``) is not finished is refused unless the user asks to unblind: the viewer
shows every cell's rank.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import threading
from pathlib import Path

import numpy as np

from cyto.errors import ConfigError, CytoError, InputPathError
from cyto.tables import json_text, read_table

#: the table's FDR flag columns, the first found is drawn (cyto.stats.calibrate)
FLAG_COLUMNS = ("flagged_bh", "flagged_adaptive")
#: top cells listed beside the slide at most (the table's own top-K when smaller)
TOP_LIST = 100
#: a map window when the slide records no resolution (level-0 px)
WINDOW_PX_NO_MPP = 256


def review_blocking(scored: list[Path], roots: list[Path], *, cut_from: bool = False) -> str | None:
    """Why a blinded review forbids showing ``scored`` (one line naming the review and who has
    not finished), or None. The reviews looked at are those each scored folder records
    (:func:`cyto.review.session.recorded_reviews`, wherever their --session is) and a
    ``review`` folder beside it; one counts when its key lists one of the folders; it is
    finished when someone has reviewed and every reviewer has marked every case done.

    With ``cut_from`` only the reviews whose cases were cut from one of ``scored`` count: its key
    lists the folder (or, before its key, the folder records it). The slide's own reviews made
    from another folder (found by the slide's identity) blind it, but replacing this folder
    changes nothing of them."""
    from cyto.reuse import read_record
    from cyto.review.session import recorded_reviews, registered_reviews

    places = []
    for f in [*roots, *scored]:
        places += [f / "review", f.parent / "review", f.parent.parent / "review"]
    recorded, registered = set(), set()
    for f in scored:  # reviews made with --session elsewhere, as the folder records them
        recorded.update(p.resolve() for p in recorded_reviews(f))
        places += recorded_reviews(f)
        # and as this machine registered them by the slide (any model), whatever the folder says
        registered.update(p.resolve() for p in registered_reviews(f))
    places += sorted(registered)
    names = {str(f) for f in scored}
    for review in dict.fromkeys(p.resolve() for p in places):
        key = read_record(review / "key.json")
        if key is None and review in (recorded if cut_from else recorded | registered):
            return (
                f"{review} is a blinded review of these slides that has no key yet (being "
                "made, or moved away)"
            )
        listed = key is not None and bool(names & set(map(str, key.get("scored") or [])))
        if key is None or not (listed or (review in registered and not cut_from)):
            continue
        cases = sorted((key.get("cases") or {}).keys())
        if not (review / "marks.sqlite").is_file():
            return _nothing_marked(review)
        from cyto.review.store import MarkStore

        sid = key.get("session_id")  # marks of another review say nothing of this one
        store = MarkStore(review, sid if isinstance(sid, str) else None)
        try:
            reviewers, done = store.reviewers(), store.done()
        finally:
            store.close()
        if not reviewers:
            return _nothing_marked(review)
        left = [r for r in reviewers if any((r, c) not in done for c in cases)]
        if left:
            return f"{review} is a blinded review that {', '.join(left)} has not finished"
    return None


def _nothing_marked(review: Path) -> str:
    """A review with no mark yet, in words that say whether a reviewer has its page open now
    (``cyto review`` holds ``.reviewer-NAME``'s lock while it serves): "nobody has started"
    read as an abandoned review while a reviewer was at it."""
    from cyto.locks import held

    prefix = ".reviewer-"
    open_now = sorted(
        p.name[len(prefix) :] for p in review.glob(f"{prefix}*") if p.is_dir() and held(p)
    )
    if open_now:
        return (
            f"{review} is a blinded review that {', '.join(open_now)} "
            f"{'has' if len(open_now) == 1 else 'have'} open now (nothing marked yet)"
        )
    return f"{review} is a blinded review with nothing marked yet"


def open_view(folder: Path, unblind: bool = False, options: dict | None = None) -> list[ViewSlide]:
    """The scored slides of ``folder`` (a slide's output folder, or a cohort's folder of them),
    checked; a one-line error when none is whole, a slide file changed, or a review is open.
    ``options``: storage options of slides scored from URLs (``--storage-option``)."""
    from cyto.review.session import KEY_FILE, find_scored

    folder = Path(folder)
    if (folder / KEY_FILE).is_file() and not (folder / "summary.json").is_file():
        raise InputPathError(
            f"{folder} is a review folder: give cyto view the scored folder it was made from"
        )
    scored = find_scored([folder])
    why = review_blocking(scored, [folder.resolve()])
    if why and not unblind:
        raise ConfigError(
            f"{why}: cyto view shows every cell's rank and score, which would unblind it; "
            "finish the review first, or pass --unblind"
        )
    return [ViewSlide(f, options) for f in scored]


def top_cells(table, n: int, flag_column: str | None, rank_by: str | None = None):
    """The first ``n`` cells of ``table`` (in rank order) as the page lists them, each with the
    value its rank follows (``rank_value``): the model's score, the morphometric score or the
    fused score, by the table's ``cyto.rank_by`` (else the summary's ``rank_by``), beside the
    model's ``score``. Returns (``{"rank_by", "column", "label"}``, the cells)."""
    from cyto.data.morphometry import RANKED_LABEL, ranked_column

    meta = table.schema.metadata or {}
    how = meta.get(b"cyto.rank_by", b"").decode() or rank_by or "model"
    column = ranked_column(table.column_names, how)
    names = ["cell_id", "x", "y", "score", column]
    cols = {c: table[c].slice(0, n).to_pylist() for c in dict.fromkeys(names)}
    flags = table[flag_column].slice(0, n).to_pylist() if flag_column else None
    pv = table["p_value"].slice(0, n).to_pylist() if "p_value" in table.column_names else None
    top = [
        {
            "rank": i + 1,
            "cell_id": cols["cell_id"][i],
            "x": cols["x"][i],
            "y": cols["y"][i],
            "score": cols["score"][i],
            "rank_value": cols[column][i],
            "flagged": flags[i] if flags else None,
            "p_value": pv[i] if pv else None,
        }
        for i in range(n)
    ]
    return {"rank_by": how, "column": column, "label": RANKED_LABEL.get(column, column)}, top


class ViewSlide:
    """One scored slide: its summary, its cells (in rank order) and its slide file's readers."""

    def __init__(self, folder: Path, options: dict | None = None) -> None:

        from cyto.infer.outputs import output_artifacts
        from cyto.infer.store import identity_name, slide_key
        from cyto.reuse import check_reuse
        from cyto.seal import SCORE_AGAIN, read_sealed, refuse_unfinished
        from cyto.slides import find_planes

        self.folder = Path(folder)
        self.name = self.folder.name
        # said as every reader says it, never told to score again after --resume (round 70, 2)
        refuse_unfinished(self.folder)
        sealed = read_sealed(self.folder)  # the one door to a finished folder's outputs
        summary = sealed.summary
        if not sealed.ok or summary is None:
            raise ConfigError(f"{self.folder} cannot be shown: {sealed.words()}: {SCORE_AGAIN}")
        self.summary = summary
        from cyto.review.session import scored_slide
        from cyto.slides.remote import SlideURL, pinned_ref

        # a URL is read where it is, pinned to the version the server has now: the identity
        # below is that version's, and a read after it changes stops (never other pixels)
        self.slide = scored_slide(summary.get("slide", ""), self.folder, options)
        if isinstance(self.slide, SlideURL):
            self.slide = pinned_ref(self.slide)
        elif not self.slide.exists():
            raise InputPathError(
                f"{self.folder}: the slide it was scored from, {self.slide}, is not there "
                "(moved or deleted): cyto view reads its pixels from it"
            )
        key = summary.get("output_key") or {}
        self.planes = find_planes(self.slide, str(key.get("planes") or "auto"))
        self.identity = slide_key(self.slide, self.planes)
        reuse = check_reuse(
            {"slide_identity": summary.get("slide_identity")},
            {"slide_identity": self.identity[str(self.slide)]},
            output_artifacts(self.folder, summary),
            names={"slide_identity": identity_name(self.slide)},
        )
        if reuse.differs:  # said as what it is (it read "other settings or inputs: ...",
            # of the slide alone: hostile round 49, 4)
            raise ConfigError(
                f"{self.folder} cannot be shown: the slide changed since it was scored "
                f"({'; '.join(reuse.differs)}): score it again"
            )
        if not reuse.ok:
            raise ConfigError(
                f"{self.folder} cannot be shown: {reuse.words()} (the folder is not whole): "
                "score it again"
            )
        self.tile = int(key.get("tile") or 0) or None
        self.nuclei_given = bool(key.get("nuclei"))
        self.z = [0.0, *(float(z) for z, _ in self.planes)]
        table = read_table(self.folder / "scores.parquet")  # cyto.tables: any file name
        order = np.argsort(np.asarray(table["rank"]), kind="stable")
        self.table = table.take(order)  # row i holds rank i + 1
        self.flag_column = next((c for c in FLAG_COLUMNS if c in table.column_names), None)
        if self.flag_column and table[self.flag_column].null_count == table.num_rows:
            self.flag_column = None  # the flags were withheld (calibration mismatch)
        self._lock = threading.Lock()
        self._layers = threading.Lock()  # the map and the mask are computed once
        self._readers: dict[int, object] = {}
        self._cached: dict[str, bytes] = {}
        self._stamp = self._stamps()
        self._results = self._results_stamp()
        info = self.reader(0).info
        self.width, self.height = info.width, info.height
        self.mpp = (summary.get("resolution") or {}).get("slide_mpp") or info.mpp

    # --- the slide ----------------------------------------------------------------------------

    def reader(self, plane: int):
        """The reader of focal plane ``plane`` (0: the slide itself), opened once."""
        from cyto.slides import open_plane, open_slide

        with self._lock:
            self._unchanged()
            if plane not in self._readers:
                self._readers[plane] = (
                    open_slide(self.slide) if plane == 0 else open_plane(self.planes[plane - 1][1])
                )
            return self._readers[plane]

    def _stamps(self) -> dict[str, tuple[int, int, int] | None]:
        """Size, modification time and inode of each local slide file (None: not a local file,
        or not there): a stat per read, so a file changed under the viewer is noticed."""
        stamps = {}
        for name in self.identity:
            try:
                st = os.stat(name)
                stamps[name] = (st.st_size, st.st_mtime_ns, st.st_ino)
            except (OSError, ValueError):  # a URL, or gone
                stamps[name] = None
        return stamps

    def _unchanged(self) -> None:
        """Refuse to read a slide whose files changed since the viewer opened it (their tiles
        would be another slide's pixels under this slide's cells, and kept so); a file put
        back as it was (the same content identity) is read again, from a fresh reader."""
        now = self._stamps()
        if now == self._stamp:
            return
        from cyto.infer.store import slide_key

        try:
            same = slide_key(self.slide, self.planes) == self.identity
        except (OSError, CytoError):
            same = False
        if not same:
            raise InputPathError(
                f"the slide file {self.slide.name} changed or moved since cyto view opened it: "
                "not shown from other bytes; put it back, or score it again and reopen the view"
            )
        for r in self._readers.values():
            r.close()
        self._readers.clear()
        self._stamp = now

    def _results_stamp(self) -> tuple | None:
        """Size, modification time and inode of the folder's seal (written last by every run
        that finishes it): a stat per request for the ranks."""
        try:
            st = os.stat(self.folder / "seal.json")
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def _results_unchanged(self) -> None:
        """Refuse to serve ranks read before the folder was scored again (a running viewer
        served the old ranks, rank 2 another cell than on disk, with no word)."""
        if self._results_stamp() != self._results:
            raise InputPathError(
                f"{self.folder} was scored again since cyto view opened it: these ranks are "
                "the old run's; stop cyto view and open it again to see the new ones"
            )

    def close(self) -> None:
        """Let the slide go: its readers closed, and a remote slide's blocks kept on disk while
        it was viewed removed (Ctrl-C left them to the cache's bound: hostile round 52, 9)."""
        from cyto.slides.remote import drop_blocks

        for r in self._readers.values():
            r.close()
        self._readers.clear()
        for slide in (self.slide, *(path for _, path in self.planes)):
            drop_blocks(slide)

    # --- what the page asks for ---------------------------------------------------------------

    def info(self, index: int, tile_size: int) -> dict:
        """The page's description of the slide: size, planes, summary, top cells, legend."""
        from cyto.view.tiles import max_level

        self._results_unchanged()
        s, t = self.summary, self.table
        n = t.num_rows
        scores = np.asarray(t["score"], np.float64) if n else np.zeros(0)
        finite = scores[np.isfinite(scores)]
        top_n = min(TOP_LIST, int((s.get("output_key") or {}).get("top_k") or TOP_LIST), n)
        ranked_by, top = top_cells(t, top_n, self.flag_column, s.get("rank_by"))
        notes = []
        if self.nuclei_given:
            notes.append(
                "scored at the nuclei of a --nuclei file: the tiles it visited were those "
                "holding a given nucleus; the skipped-region layer shows the tissue mask only"
            )
        if not self.mpp:
            notes.append(f"the slide records no resolution: map windows are {WINDOW_PX_NO_MPP} px")
        return {
            "index": index,
            "name": self.name,
            "slide": self.slide.name,
            "width": self.width,
            "height": self.height,
            "mpp": self.mpp,
            "tile_size": tile_size,
            "max_level": max_level(self.width, self.height),
            "planes": [{"index": i, "z_um": z} for i, z in enumerate(self.z)],
            "cells": n,
            "score_range": [float(finite.min()), float(finite.max())] if len(finite) else None,
            "colour_by": self.flag_column or "score",
            "top": top,
            "ranked_by": ranked_by,
            "summary": {
                "cells_scored": s.get("cells_scored"),
                "model": Path(str(s.get("model", ""))).name,
                "method": s.get("method"),
                "rank_by": s.get("rank_by"),
                "slide_score_mean_top_k": s.get("slide_score_mean_top_k"),
                # the morphometric slide score (a bundle that records one): not drawn (round 58)
                "slide_morphometry_mean_top_k": s.get("slide_morphometry_mean_top_k"),
                "burden": s.get("burden"),
                "adequacy": s.get("adequacy"),
                "tiles": s.get("tiles"),
            },
            "notes": notes,
        }

    def cells_bin(self) -> bytes:
        """Every cell as four little-endian float32 (x, y, score, flag: 1, 0, or NaN when the
        table has no flags), in rank order: 16 bytes a cell, sent once per slide."""
        self._results_unchanged()
        if "cells" not in self._cached:
            t, n = self.table, self.table.num_rows
            out = np.empty((n, 4), "<f4")
            out[:, 0] = np.asarray(t["x"], np.float64)
            out[:, 1] = np.asarray(t["y"], np.float64)
            out[:, 2] = np.asarray(t["score"], np.float64)
            if self.flag_column:
                import pyarrow.compute as pc

                col = t[self.flag_column]
                known = col.is_valid().to_numpy(zero_copy_only=False)
                flag = pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(bool)
                out[:, 3] = np.where(known, flag, np.nan)
            else:
                out[:, 3] = np.nan
            self._cached["cells"] = out.tobytes()
        return self._cached["cells"]

    def abnormality_map(self):
        """The slide's abnormality map (:func:`cyto.infer.maps.map_of_table`), in the windows
        of the ``abnormality.ome.tif`` its run wrote and of the same statistic (the summary's
        burden block decides it, as it did for the run)."""
        from cyto.infer.maps import WINDOW_UM, map_of_table

        # the windows of the run's own map (cyto score --map-um), else the default
        key, opts = self.summary.get("output_key") or {}, self.summary.get("options") or {}
        window = float(key.get("map_um") or opts.get("map_um") or WINDOW_UM)
        burden, rank_by = self.summary.get("burden"), self.summary.get("rank_by")
        if self.mpp:
            return map_of_table(
                self.table, self.width, self.height, float(self.mpp), window, burden, rank_by
            )
        # no resolution: windows of a fixed pixel size (said on the page)
        return map_of_table(
            self.table, self.width, self.height, 1.0, float(WINDOW_PX_NO_MPP), burden, rank_by
        )

    def warm(self) -> None:
        """Compute the map and the skipped-region layer now (the server does it as it starts,
        so the page's first view does not wait for them). A slide that cannot be read here is
        said by the request that asks for the layer, which tries again."""
        from cyto.errors import CytoError

        with contextlib.suppress(CytoError):
            self.map_png()
            self.skipped()

    def map_png(self) -> tuple[bytes, dict]:
        """The abnormality map as an RGBA PNG, one pixel per window (clear where no cell is),
        and its legend."""
        with self._layers:
            return self._map_png()

    def _map_png(self) -> tuple[bytes, dict]:
        if "map" not in self._cached:
            m = self.abnormality_map()
            v = m.values.astype(np.float64)
            ok = np.isfinite(v)
            if m.is_fraction:
                lo, hi = 0.0, max(float(v[ok].max()) if ok.any() else 1.0, 1e-9)
            else:
                # the highest score of a window of many cells is high by chance alone: the
                # slide's median window is the bottom of the colours, so windows stand out
                # by how far they rise above a typical one (the legend says so)
                lo = float(np.median(v[ok])) if ok.any() else 0.0
                hi = float(v[ok].max()) if ok.any() else 1.0
            u = np.clip((np.where(ok, v, lo) - lo) / max(hi - lo, 1e-12), 0, 1)
            rgba = np.zeros((*v.shape, 4), np.uint8)
            rgba[..., :3] = (ramp(u) * 255).round().astype(np.uint8)
            rgba[..., 3] = np.where(ok, 200, 0)
            self._cached["map"] = _png(rgba)
            self._cached["map_legend"] = json_text(
                {
                    "kind": m.kind,
                    "window_um": m.window_um if self.mpp else None,
                    "window_px": m.window_px,
                    "rows": m.shape[0],
                    "cols": m.shape[1],
                    "low": lo,
                    "high": hi,
                }
            ).encode()
        return self._cached["map"], json.loads(self._cached["map_legend"])

    def skipped(self) -> dict:
        with self._layers:
            return self._skipped()

    def _skipped(self) -> dict:
        """The tissue mask (lowest level) and the tiles with no tissue, which the pipeline never
        visited (:func:`cyto.infer.tiling.tile_jobs`): what the page's skipped layer draws."""
        from cyto.slides import tile_grid, tissue_mask

        if "skipped" not in self._cached:
            reader = self.reader(0)
            mask, ds = tissue_mask(reader)
            tile = self.tile or 512
            every = list(tile_grid(self.width, self.height, tile))
            visited = {i for i, _, _ in tile_grid(self.width, self.height, tile, mask, ds)}
            skipped = [(x0, y0) for i, x0, y0 in every if i not in visited]
            self._cached["skipped"] = json_text(
                {
                    "tile": tile,
                    "tiles": len(every),
                    "visited": len(visited),
                    "skipped": skipped,
                    "mask_downsample": ds if mask is not None else None,
                }
            ).encode()
            if mask is None:  # no level small enough to read whole: every tile was visited
                self._cached["mask"] = _png(np.zeros((1, 1, 4), np.uint8))
            else:
                h, w = mask.shape
                rgba = np.zeros((h, w, 4), np.uint8)
                rgba[~mask] = (40, 70, 160, 70)  # glass: tinted
                sk = np.zeros((h, w), bool)
                for x0, y0 in skipped:  # never visited: tinted more strongly
                    sk[
                        int(y0 / ds) : math.ceil((y0 + tile) / ds),
                        int(x0 / ds) : math.ceil((x0 + tile) / ds),
                    ] = True
                rgba[sk] = (40, 70, 160, 150)
                self._cached["mask"] = _png(rgba)
        return json.loads(self._cached["skipped"])

    def mask_png(self) -> bytes:
        """The tissue mask and skipped tiles as an RGBA PNG at the mask's resolution."""
        self.skipped()
        return self._cached["mask"]


def ramp(u: np.ndarray) -> np.ndarray:
    """Colours of values ``u`` in [0, 1]: dark blue (low) through yellow to red (high), the
    page's marker colours too (view.js draws the same ramp)."""
    stops = np.array([[0.19, 0.21, 0.58], [0.20, 0.63, 0.79], [1.0, 0.85, 0.2], [0.85, 0.1, 0.1]])
    pos = np.clip(np.asarray(u, np.float64), 0, 1) * (len(stops) - 1)
    i = np.minimum(pos.astype(int), len(stops) - 2)
    f = (pos - i)[..., None]
    return stops[i] * (1 - f) + stops[i + 1] * f


def _png(rgba: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba), "RGBA").save(buf, format="PNG")
    return buf.getvalue()


def view_words(summaries: list[dict], out: Path) -> str | None:
    """The line ``cyto score`` ends with: the command that shows the scored slide(s) whole
    (None when none was scored)."""
    import shlex

    folders = sorted({str(s.get("output")) for s in summaries if s.get("output")})
    if not folders:
        return None
    where = folders[0] if len(folders) == 1 else str(out)
    local = [Path(f) for f in folders if "://" not in f]
    try:  # a slide under a blinded review: cyto view refuses it until the review is finished
        why = review_blocking(local, [Path(where)]) if local else None
    except (CytoError, OSError):
        why = None
    if why:
        return (
            f"cyto view {shlex.quote(where)} shows every cell's rank, so it waits for the "
            f"review: {why}"
        )
    return (
        f"see the whole slide, every cell on it: cyto view {shlex.quote(where)} "
        "(shows ranks: unblinded; docs/how-to/view-slide.md)"
    )


def replaced_words(folders: list[Path]) -> list[str]:
    """Warnings for slide folders a run has just written (a resume that scored a slide again,
    or ranked its kept cells otherwise) that an unfinished blinded review was cut from, where
    the top cells its cases were cut from changed: reopened, that review is refused. Said by the
    run that changed them, as ``--overwrite`` says it before (a resume said nothing, and the
    review's refusal came first when it was reopened: hostile round 77)."""
    from cyto.review.session import cut_changed

    out = []
    for folder in map(Path, folders):
        try:
            if not review_blocking([folder.resolve()], [folder.resolve()], cut_from=True):
                continue
            changed = cut_changed(folder)
        except (CytoError, OSError):
            continue
        out += [
            f"{folder} was written again under the open review {review}, and the top {k} cells "
            "its cases were cut from changed (other cells, or ranked otherwise): reopened, it "
            "is refused; rebuild the review (cyto review with a new --session)"
            for review, k in changed
        ]
    return out


def rescoring_words(folders: list[Path]) -> list[str]:
    """Warnings for slide folders about to be scored again (``--overwrite``, or a resume that
    scores again) that an unfinished blinded review was cut from: the review's cases come from
    the results being replaced. One line per folder; none where no review is open, nor where the
    open review of the slide was cut from another folder (that one is left as it was)."""
    out = []
    for folder in folders:
        folder = Path(folder)
        if not (folder / "summary.json").is_file():
            continue
        try:
            why = review_blocking([folder.resolve()], [folder.resolve()], cut_from=True)
        except (CytoError, OSError):
            continue
        if why:
            out.append(
                f"{folder} is being scored again under an open review ({why}): its cases were "
                "cut from the results this run replaces; rebuild the review afterwards "
                "(cyto review with a new --session)"
            )
    return out
