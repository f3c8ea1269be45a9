"""``cyto predict``: score a patch folder or manifest with a bundle (its fastest engine verified
here by default: the exported graph when there is one, else the trained PyTorch network).

The images stream through in chunks (decoded on threads one chunk ahead), so memory holds a few
chunks whatever the folder's size. Each scored chunk's rows are kept beside ``--out`` (in
``.OUT.run/``, :class:`cyto.infer.store.ChunkStore`) until the table is written, so a run
stopped halfway (Ctrl-C, a killed job, a file that cannot be read) continues with ``--resume``
after the last finished chunk, when the model, the images and the options are the same: the
images' paths, sizes and times of change first, then the bytes of those already scored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import numpy as np

from cyto.bundle import atomic_write
from cyto.data.dataset import (
    PatchRecord,
    common_side,
    decode_stream,
    empty_class_words,
    load_records,
    one_size,
    refuse_mixed_sizes,
    resolve_classes,
)
from cyto.data.images import copies_words, resize_rgb
from cyto.data.scale import (
    PAP_DRIFT,
    SHRINK_WORDS,
    normal_only,
    resolve_zoom,
    share_advice,
    side_words,
    zoom_patch,
    zoom_patches,
)
from cyto.errors import (
    ConfigError,
    CytoWarning,
    DatasetError,
    InputPathError,
    OutputWriteError,
    ScaleWarning,
    StainWarning,
    warn_caller,
)
from cyto.flags import MPP_RANGE, UM_PER_PX, check_value, hints_of, passing, said
from cyto.infer.store import ChunkStore, kept_words
from cyto.locks import OutputLock
from cyto.outputs_check import check_out_file, refuse_keep_and_replace, refuse_to_replace
from cyto.seal import with_rows_seal
from cyto.tables import json_text

ZOOM_FILE = "zoom.json"


def predict(
    model: Path,
    data: Path,
    out: Path,
    normal: str | None = None,
    abnormal: str | None = None,
    device: str = "auto",
    batch_size: int = 128,
    backend: str = "auto",
    precision: str = "auto",
    zoom: str | float | None = None,
    patch_mpp: Annotated[float | None, MPP_RANGE] = None,
    verify: bool = True,
    skip_unreadable: bool = False,
    rank_by: str = "auto",
    chunk: int = 512,
    resume: bool = False,
    overwrite: bool = False,
    echo=print,
) -> dict[str, object]:
    """Write ``out`` (Parquet): path, class, [label], score, each cell's morphometry
    (:data:`cyto.detect.morphometry.COLUMNS`), the bundle's morphometric score
    (``morphometry_score``, where it records one), the fused score where the cells are ranked
    by ``model+morphometry`` (``fused_score``), and rank (1 = most abnormal), which follows
    ``rank_by`` (:mod:`cyto.data.morphometry`).

    ``zoom`` (a factor, or ``auto``) or ``patch_mpp`` bring patches of another scanner to the
    model's training scale first (:mod:`cyto.data.scale`); ``auto`` reads the folder once
    more, first, to measure its nuclei. ``chunk`` images are decoded and kept at a time;
    ``resume`` continues a stopped run (see the module docstring); an existing ``out`` is
    replaced only with ``overwrite``."""
    from cyto.data.dataset import refuse_listed_output
    from cyto.data.morphometry import (
        RANK_BY,
        RANK_BY_ALIASES,
        resolve_rank_by,
        scorer_rank_by,
        spec_caution,
    )
    from cyto.runtime import Scorer, load_scorer

    # a stopped run's chunks are either continued (resume) or the table scored over (overwrite)
    refuse_keep_and_replace(resume, overwrite, "continues a stopped run", "scores it over")
    for name, value in (("batch_size", batch_size), ("chunk", chunk)):
        if value < 1:  # before the model loads
            raise ConfigError(f"{said(name)} must be >= 1, got {value}")
    if abnormal is not None and not normal:  # abnormal classes: against the normal ones
        raise ConfigError(
            f"{said('abnormal')} names the abnormal classes against {said('normal')}: give "
            f"{said('normal')} too (without it every class is scored, unlabelled)"
        )
    # the annotation's range, before the model loads (the API checked it on the way in too)
    patch_mpp = check_value("patch_mpp", patch_mpp, hints_of(predict)["patch_mpp"])
    if RANK_BY_ALIASES.get(rank_by, rank_by) not in RANK_BY:
        resolve_rank_by(rank_by, None, None)  # the one-line error, before the model loads
    out = Path(out)
    check_out_file(out)
    run = out.with_name(f".{out.name}.run")
    if not (resume and run.is_dir()):  # resuming a stopped run finishes what it was asked
        refuse_listed_output(out, data)  # one of the images a manifest lists
        refuse_to_replace(out, overwrite, inputs={"data": data, "MODEL": _path_of(model)})
        if overwrite and out.is_file() and not _predict_table(out):
            from cyto.outputs_check import refuse_foreign

            refuse_foreign([out.name], str(out.parent))  # a user's own file, even with it
    if out.suffix.lower() not in (".parquet", ".pq"):  # x.csv was given Parquet bytes
        raise ConfigError(
            f"{passing('out', out)}: cyto predict writes a Parquet table, with the model and the "
            "verification in its metadata; give a name ending in .parquet"
        )
    if isinstance(model, Scorer):  # loaded once by the caller (cyto.load_model)
        scorer, model = model, model.bundle.path
    else:
        scorer = load_scorer(model, backend, device, precision, verify=verify)
    asked = rank_by
    rank_by, morph = scorer_rank_by(scorer, rank_by)
    # auto's choice on too few held-back abnormal cells: said beside the ranking it took
    caution = spec_caution(scorer.spec) if RANK_BY_ALIASES.get(asked, asked) == "auto" else None
    records, labels, left_out = _chosen(Path(data), normal, abnormal, echo)
    sides = refuse_mixed_sizes(records, data)  # the rule every reader of a crop folder holds to
    size = scorer.load_size  # the one rule of Scorer.score (round 64, 4)
    zooming = zoom is not None or patch_mpp is not None
    auto_zoom = zoom is not None and str(zoom).strip().lower() == "auto"
    if size is None and not zooming and not one_size(records):
        size = scorer.spec.input_size  # a model of native-size patches, given several sizes
    load = None if zooming else size  # a zoom cuts the native image, then resizes
    key = {
        "model": f"{scorer.bundle.manifest_hash} {scorer.backend.name} {scorer.precision}",
        "data": _records_key(records),
        "options": {"load": load, "zoom": zoom, "patch_mpp": patch_mpp, "rank_by": rank_by},
        # checked on resume: chunks of another layout are not continued
        "format": "rows with each image's sha256, its pixels' sha256 and morphometry",
    }
    lock = OutputLock(run, "cyto predict")
    lock.acquire()  # two runs into one --out: the second is refused, never a mixed table
    store = ChunkStore(run, key, unit="images", rows=None)
    try:
        done, _ = store.start(resume, echo)
        changed = _changed_since(store, records[:done], Path(data).name) if done else []
        if changed:  # the same size and time of change, other bytes: not the images scored
            echo(
                f"resume: {len(changed)} finished image(s) changed since the stopped run "
                f"({changed[0]}{', ...' if len(changed) > 1 else ''}); starting over"
            )
            done, _ = store.start(False, echo)
        # the crops' side, where their pixel size is given: the zoom is the ratio of the fields
        side = common_side(sides) if patch_mpp is not None else None
        # the stain before --zoom auto: a Pap (or H&E) nucleus mask, set on the model's stain,
        # misreads another stain's sizes, so auto does not zoom by it there (hostile round 33: a
        # hue shift alone was zoomed 1.35x); MGG's rule reads optical density whatever the hue
        stain = None
        if auto_zoom and scorer.spec.stain != "mgg":
            stain = _stain_check(scorer, records, np.arange(len(records)), skip_unreadable)
        if zooming:
            factor, how = _zoom(
                store, zoom, patch_mpp, scorer.spec, records, labels, normal, side,
                skip_unreadable, Path(data).name, _stained_otherwise(scorer, stain),
            )  # fmt: skip
        else:
            factor, how = 1.0, "none"
        # crops of another field than the model's, resized as if of its field: no zoom, or
        # --zoom auto kept at 1 (it compares the nuclei's share of a crop, which resizing
        # keeps: the line went unsaid under auto; hostile round 25, 12)
        if patch_mpp is None and (zoom is None or (zoom == "auto" and factor == 1.0)):
            other = side_words(common_side(sides), scorer.spec.patch_px, scorer.spec.mpp)
            if other is not None:
                warn_caller(other, ScaleWarning)
        # as cyto score says it (a CytoWarning from Python), once the inputs are taken: never
        # before a refusal of them
        unverified = (
            scorer.verification.warning(scorer.bundle.where) if scorer.verification else None
        )
        if unverified:
            warn_caller(unverified, CytoWarning)
        if zooming and factor < 1.0:  # the command's line alone until hostile round 64, 3
            warn_caller(SHRINK_WORDS, ScaleWarning)
        job = _Job(
            scorer, load, factor if zooming else None, batch_size, chunk, patch_mpp, side,
            shares=not auto_zoom,  # auto's zoom is read from them
        )  # fmt: skip
        try:
            job.run(records, store, done, skip_unreadable, Path(data).name)
            _say_inputs(job)
        except BaseException as exc:
            if any(store.dir.glob("chunk-*")):
                stop = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped"
                echo(f"{stop}: {kept_words(store.dir)}")
            raise
        rows = store.read_all()
        read = np.asarray(rows["read"].to_numpy(zero_copy_only=False), dtype=bool)
        why = rows["why"].to_pylist()
        skipped = [(records[i].path, why[i]) for i in np.flatnonzero(~read)]
        kept = np.flatnonzero(read)
        if len(kept) == 0:
            raise InputPathError(f"no images to score in {data}")
        if labels is not None and not (labels[kept] == 0).any():
            raise DatasetError(f"no readable image of the normal class(es) {normal}")
        column = {c: rows[c].to_numpy(zero_copy_only=False)[kept] for c in _numbers()}
        if stain is None:
            stain = _stain_check(scorer, records, kept, skip_unreadable)
        # a labelled folder's scale is its normal class's
        shares = normal_only(column["scale_share"], None if labels is None else labels[kept])
        who = "these cells" if labels is None else f"the normal cells ({normal})"
        otherwise = _stained_otherwise(scorer, stain)
        if not zooming:
            advice = share_advice(
                scorer.spec.folder_scale_reference, shares, who, otherwise, scorer.spec.stain
            )
        elif not auto_zoom and not otherwise:
            given = passing("zoom", zoom) if zoom is not None else passing("patch_mpp", patch_mpp)
            advice = given_zoom_words(
                scorer.spec.folder_scale_reference, shares, who, factor, given
            )
        else:
            advice = None
        if advice is not None:
            warn_caller(advice, ScaleWarning)
        digests = rows["sha256"].to_pylist()
        copies = copies_words(
            [records[i].path for i in kept],
            [digests[i] for i in kept],
            [records[i].cls for i in kept],
        )
        if copies:
            warn_caller(copies, CytoWarning)
        trained = _trained_on(scorer, digests, rows["pixels"].to_pylist(), kept)
        unmeasured = unmeasured_words(morph, column, rank_by)
        if unmeasured is not None:
            warn_caller(unmeasured, CytoWarning)
        summary = _write_table(
            out, scorer, [records[i] for i in kept],
            None if labels is None else labels[kept], column, morph, rank_by, factor, how,
            skipped, trained,
        )  # fmt: skip
        summary["trained_on"] = None if trained is None else int(trained.sum())
        if trained is None and "auroc" in summary:  # the metrics: the overlap cannot be said
            echo(
                f"note: {scorer.bundle.where} records no training images (trained by an earlier "
                "cyto, or not by cyto train): whether these images were among them cannot be said"
            )
        if "auroc" in summary:
            _better_ranking(
                summary,
                rank_by,
                RANK_BY_ALIASES.get(asked, asked) == "auto",
                scorer.spec.validation,
            )
        store.remove()  # the table is whole: the chunks are not needed again
    finally:
        if not any(store.dir.glob("chunk-*")):
            store.remove()
        lock.release()
        with contextlib.suppress(OSError):
            run.rmdir()  # empty, unless chunks are kept for --resume (or another run began)
    summary.update(
        {
            "zoom": factor,
            "zoom_from": how,
            "rank_by": rank_by,
            "rank_by_caution": caution,
            "notes": list(scorer.notes),
            # the crops of classes in neither normal nor abnormal, left out: {class: n}
            "left_out": left_out,
            "skipped": skipped,
            "resumed": done,
            "backend": scorer.backend.name,
            "precision": scorer.precision,
            "verification": scorer.verification.words() if scorer.verification else "none",
            "stain": stain,
        }
    )
    return summary


def _trained_on(
    scorer, digests: list[str | None], pixels: list[str | None], kept: np.ndarray
) -> np.ndarray | None:
    """Which of the images scored are images the model was trained on or chose its ranking on
    (the same file bytes, or the same decoded pixels: a training crop saved again losslessly,
    JPEG to PNG; :data:`cyto.bundle.TRAINING_CELLS`), warned where any are (a model's own
    training cells were scored and measured without a word: hostile round 39, 7); None where
    the bundle records none."""
    from cyto.bundle import cell_keys, training_cells

    trained = training_cells(scorer.bundle)
    if trained is None:
        return None
    flags = np.isin(cell_keys([digests[i] for i in kept]), trained) | np.isin(
        cell_keys([pixels[i] for i in kept]), trained
    )
    n = int(flags.sum())
    if n:
        source = scorer.bundle.manifest.get("training_data", {}).get("source")
        share = (
            "every image scored is"
            if n == len(kept)
            else f"{n} of the {len(kept)} images scored {'is' if n == 1 else 'are'}"
        )
        warn_caller(
            f"{share} among the images {scorer.bundle.where} was "
            f"trained on or chose its ranking on (the same files or pixels"
            f"{f' as in {source}' if source else ''}): a ranking or metric over them is not one "
            "of held-out cells (the table's "
            "trained_on column says which)",
            CytoWarning,
        )
    return flags


#: the images a folder's stain is estimated from, drawn evenly (an estimate settles by a few
#: hundred cells: the CRIC blocks of 140 and 560 cells gave the same vectors within 2 degrees)
STAIN_SAMPLE = 512
#: the stained pixels the folder's estimate is drawn from: two angles at the 1st and 99th
#: percentile settle well before this (the training cells' record draws 200,000), and what the
#: check holds stays at about 2 MB, whatever the folder and its images' size
STAIN_PIXELS = 50_000


def _stained_otherwise(scorer, stain: dict | None) -> str:
    """Why a folder's nuclei are not the model's nucleus mask's to size, where the mask reads
    colour (not MGG's: optical density whatever the hue), said of the cells: its stain check
    (:func:`_stain_check`) says another stain, or could not read the stain (grayscale crops
    read 1.37x smaller, and --zoom auto zoomed them: hostile round 63, 1); empty else."""
    from cyto.data.scale import OTHERWISE, unread_stain

    if not stain or scorer.spec.stain == "mgg":
        return ""
    if stain.get("advised"):
        return OTHERWISE
    return unread_stain(stain.get("why")) if stain.get("degrees") is None else ""


def _stain_check(scorer, records, kept, skip: bool) -> dict | None:
    """The folder's stain against the model's training cells' (:mod:`cyto.detect.stain`),
    from :data:`STAIN_SAMPLE` of the images read; warns once when it is said."""
    from cyto.detect.stain import StainEstimate, estimate_images, stain_check, stain_words

    model = StainEstimate.from_record(scorer.spec.stain_vectors)
    if model is None or not len(kept):
        return None
    pick = np.unique(kept[np.linspace(0, len(kept) - 1, min(STAIN_SAMPLE, len(kept))).astype(int)])
    chunks = decode_stream([records[i] for i in pick], None, skip, chunk=64)  # never all at once
    images = (im for part in chunks for im in part.images)
    check = stain_check(model, estimate_images(images, STAIN_PIXELS, n=len(pick)), len(pick))
    words = stain_words(check, "these cells", model_stain=scorer.spec.stain)
    if words is not None:
        warn_caller(words, StainWarning)
    return check


def _numbers() -> tuple[str, ...]:
    """The numbers a chunk keeps per image (NaN for an image that could not be read): the
    model's score, the morphometry, and the share its scale is checked by."""
    from cyto.detect.morphometry import COLUMNS

    return ("score", *COLUMNS, "scale_share")


class _Job:
    """Scores records chunk by chunk into a store: one row per record, read or skipped."""

    def __init__(
        self, scorer, load, factor, batch_size: int, chunk: int, patch_mpp, side=None,
        shares: bool = True,
    ) -> None:  # fmt: skip
        self.scorer, self.load = scorer, load
        #: each patch's nucleus share, for the scale check (unzoomed, or by a zoom given)
        self.shares = shares
        self.factor, self.batch_size, self.chunk = factor, batch_size, chunk
        #: the patches' own pixel size: the one given, else the model's training patches'
        self.mpp = patch_mpp or scorer.spec.mpp
        self.given_mpp = patch_mpp
        #: the crops' side ``factor`` is for (``patch_mpp``): a crop of another side spans
        #: another field at that pixel size, and is zoomed by its own field
        self.side = side
        #: what this run decoded that a user should hear of: grayscale or 16-bit images, and
        #: images that are not square (padded, never stretched)
        self.modes: list = []
        self.oblong: list = []
        self.read = 0

    def patches(self, images: list[np.ndarray]) -> np.ndarray:
        """The chunk's images as the network takes them: zoomed, or at the load size."""
        if self.factor is not None:
            size = self.scorer.spec.crop_size
            zooms = self.zooms([max(im.shape[:2]) for im in images])
            return np.stack([zoom_patch(im, z, size) for im, z in zip(images, zooms, strict=True)])
        return np.stack([resize_rgb(im, self.load) if self.load else im for im in images])

    def zooms(self, sides) -> np.ndarray:
        """The zoom of images of ``sides`` px (the longer side): ``factor``, scaled by the side
        against :attr:`side` where the factor was found from the fields of view."""
        sides = np.asarray(sides, dtype=np.float64)
        if self.side is None:
            return np.full(len(sides), self.factor, dtype=np.float64)
        return self.factor * sides / self.side

    def measures(self, batch: np.ndarray, sizes: list[tuple[int, int]]) -> dict[str, np.ndarray]:
        """Each patch's morphometry (:mod:`cyto.detect.morphometry`) with the bundle's stain,
        areas in um^2 where the patches' pixel size is known: a patch at the load size shows
        its whole (squared) image, a zoomed one the centre 1 / zoom of it."""
        from cyto.detect.morphometry import measure_stain

        out = measure_stain(batch, self.scorer.spec.crop_mpp, self.scorer.spec.stain)
        # the crops' own pixel size where it is given (over the field their zoom keeps: a
        # square of the longer side, zoom_patch), else the model's crops' where recorded
        if self.mpp and (self.given_mpp or self.scorer.spec.crop_mpp is None):
            side = np.array([max(hw) for hw in sizes], dtype=np.float64)
            if self.factor is not None:
                side = side / self.zooms(side)
            out["nucleus_area_um2"] = np.where(
                np.isnan(out["nucleus_od"]), np.nan, out["nucleus_share"] * (side * self.mpp) ** 2
            )
        return out

    def run(self, records, store: ChunkStore, done: int, skip: bool, name: str) -> None:
        """Score ``records`` from position ``done`` on, a chunk of rows into ``store`` each."""
        import pyarrow as pa

        from cyto.detect.morphometry import scale_shares
        from cyto.progress import progress

        with progress(f"predict {name}", total=len(records), unit="images", done=done) as bar:
            for part in decode_stream(records[done:], self.load, skip, chunk=self.chunk):
                read = np.zeros(part.n, dtype=bool)
                read[np.asarray(part.index, dtype=np.int64) - part.start] = True
                values = {c: np.full(part.n, np.nan) for c in _numbers()}
                self.modes += part.modes
                self.oblong += [
                    (r.path, hw)
                    for r, hw in zip(part.records, part.sizes, strict=True)
                    if hw[0] != hw[1]
                ]
                self.read += len(part.images)
                if part.images:
                    batch = self.patches(part.images)
                    values["score"][read] = self.scorer.score(batch, self.batch_size)
                    for c, v in self.measures(batch, part.sizes).items():
                        values[c][read] = v
                    if self.shares:  # for the scale advice
                        spec = self.scorer.spec
                        values["scale_share"][read] = scale_shares(batch, spec.stain, spec.crop_mpp)
                why: list[str | None] = [None] * part.n
                for at, (_, reason) in zip(np.flatnonzero(~read), part.skipped, strict=True):
                    why[at] = reason
                sha: list[str | None] = [None] * part.n
                pixels: list[str | None] = [None] * part.n
                for at, digest, px in zip(
                    np.flatnonzero(read), part.digests, part.pixels, strict=True
                ):
                    sha[at], pixels[at] = digest, px
                table = pa.table(
                    {
                        "read": read,
                        **values,
                        "why": pa.array(why, pa.string()),
                        "sha256": pa.array(sha, pa.string()),
                        "pixels": pa.array(pixels, pa.string()),
                    }
                )
                first = done + part.start
                store.write(table, first, first + part.n)
                bar.advance(part.n)


def _say_inputs(job: _Job) -> None:
    """One warning for the images read as grayscale or 16-bit, one for those not square."""
    from cyto.data.images import mode_category, mode_words, oblong_words
    from cyto.errors import CytoWarning

    said = mode_words(job.modes, job.read)
    if said:
        warn_caller(said, mode_category(said))
    if job.oblong:
        warn_caller(
            f"{oblong_words(job.oblong, job.read)}: each is padded to a square with its edge "
            "colour, never stretched",
            CytoWarning,
        )


def _zoom(
    store: ChunkStore,
    zoom,
    patch_mpp,
    spec,
    records,
    labels,
    normal,
    side,
    skip: bool,
    name: str,
    stained_otherwise: str = "",
):
    """(factor, how) for ``--zoom``/``--patch-mpp`` (from the crops' ``side`` against the
    model's training patches'); ``--zoom auto`` measures the normal class of a labelled folder
    (:func:`~cyto.data.scale.normal_only`). A resumed run's chunks keep the factor they were
    scored at (``--zoom auto`` is not measured again)."""
    saved = store.dir / ZOOM_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # none, or unreadable
        entry = json.loads(saved.read_text())
        return float(entry["factor"]), str(entry["how"])
    judged = normal_only(records, labels)
    factor, how = resolve_zoom(
        zoom, patch_mpp, spec.mpp, spec.folder_scale_reference,
        lambda: _nucleus_shares(judged, spec, skip, name),  # auto only
        patch_side=side, model_side=spec.patch_px,
        normal=None if labels is None else normal, stained_otherwise=stained_otherwise,
    )  # fmt: skip
    if factor != 1.0 and str(zoom).strip().lower() == "auto" and spec.stain == "pap":
        sure = passing("patch_mpp", UM_PER_PX)
        how += f"; {PAP_DRIFT} (if known, the pixel size is the sure zoom: {sure})"
    if factor != 1.0 and str(zoom).strip().lower() == "auto" and spec.stain == "mgg":
        # zoomed where a stain warning may stand beside it, unexplained (hostile round 66, 5)
        how += (
            "; an MGG model's nuclei are read by their optical density, whatever the stain, so "
            "a stain check of these cells does not keep the zoom at 1"
        )
    atomic_write(saved, json_text({"factor": factor, "how": how}).encode())
    return factor, how


def _nucleus_shares(records, spec, skip: bool, name: str) -> np.ndarray:
    """The nucleus share of every readable patch at the model's crop size (:func:`scale_shares`
    with the model's stain, at its crops' pixel size), chunk by chunk (``--zoom auto``)."""
    from cyto.detect.morphometry import scale_shares
    from cyto.progress import progress

    out = []
    with progress(f"measure nuclei {name}", total=len(records), unit="images") as bar:
        for part in decode_stream(records, None, skip):
            if part.images:
                crops = zoom_patches(part.images, 1.0, spec.crop_size)
                out.append(scale_shares(crops, spec.stain, spec.crop_mpp))
            bar.advance(part.n)
    return np.concatenate(out) if out else np.empty(0)


def _changed_since(store: ChunkStore, records: list[PatchRecord], name: str) -> list[Path]:
    """The images of a resumed run's finished chunks whose bytes are no longer the ones scored
    (a file rewritten with the same size and time of change, which the run's key cannot see):
    each is read and hashed again, on threads."""
    from concurrent.futures import ThreadPoolExecutor

    from cyto.progress import progress

    rows = store.read_all()
    read = rows["read"].to_pylist()
    digests = rows["sha256"].to_pylist()

    def now(i: int) -> str | None:
        try:
            return hashlib.sha256(records[i].path.read_bytes()).hexdigest()
        except OSError:
            return None

    check = [i for i in range(len(records)) if read[i]]
    changed = []
    with (
        progress(f"check finished images {name}", total=len(check), unit="images") as bar,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        for i, digest in zip(check, pool.map(now, check), strict=True):
            if digest != digests[i]:
                changed.append(records[i].path)
            bar.advance(1)
    return changed


def _records_key(records: list[PatchRecord]) -> str:
    """What a resumed run must find again: every record's path, class, size and time of last
    change (a file replaced between the runs changes it)."""
    h = hashlib.sha256()
    for r in records:
        try:
            st = r.path.stat()
            stamp = f"{st.st_size} {st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{r.path}\t{r.cls}\t{r.bag}\t{stamp}\n".encode())
    return h.hexdigest()


def _chosen(
    data: Path, normal: str | None, abnormal: str | None, echo=None
) -> tuple[list[PatchRecord], np.ndarray | None, dict[str, int]]:
    """The records to score and, with ``normal``, their labels (1 = abnormal): the classes in
    neither ``normal`` nor ``abnormal`` are left out, as in training, and said (40 LSIL crops
    went from the table without a word: hostile round 28, 8)."""
    records = load_records(data, flat=not normal)  # unlabelled cells in one folder: scored
    if not normal:
        return records, None, {}
    known = {r.cls for r in records}
    normal_t, abnormal_t = resolve_classes(known, normal, abnormal, data)
    empty = empty_class_words(data, known, abnormal)
    if empty and echo is not None:
        echo(empty)
    left = Counter(r.cls for r in records if r.cls not in normal_t and r.cls not in abnormal_t)
    if left and echo is not None:
        counts = ", ".join(f"{n} of {cls}" for cls, n in sorted(left.items()))
        echo(
            f"note: {counts} left out: {'that class is' if len(left) == 1 else 'those are'} "
            f"neither {said('normal')} nor {said('abnormal')} (leave out {said('abnormal')} to "
            "score every other class as abnormal)"
        )
    records = [r for r in records if r.cls in normal_t or r.cls in abnormal_t]
    labels = np.array([0 if r.cls in normal_t else 1 for r in records], dtype=np.int8)
    return records, labels, dict(sorted(left.items()))


def _write_table(
    out: Path, scorer, records, labels, column: dict, morph, rank_by: str,
    factor: float, how: str, skipped: list, trained: np.ndarray | None = None,
) -> dict[str, object]:  # fmt: skip
    """Write the score table (at once: a stopped write leaves the last one) and return the
    summary: its size, and AUROC and Recall@K when the labels are known."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.data.morphometry import ranked_values
    from cyto.detect.morphometry import COLUMNS

    scores = column["score"]
    cols = {
        "path": [str(r.path) for r in records],
        "class": [r.cls for r in records],
        "score": scores,
        **{c: column[c] for c in COLUMNS},
    }
    morph_scores = None
    if morph is not None:
        morph_scores = cols["morphometry_score"] = morph.score(column)
    ranked = ranked_values(rank_by, scores, morph_scores)
    if rank_by == "model+morphometry":
        cols["fused_score"] = ranked
    from cyto.infer.outputs import ranks

    order, rank = ranks(ranked, then=scores)
    cols["rank"] = rank
    if labels is not None:
        cols["label"] = labels.astype(np.int8)
    if any(r.bag is not None for r in records):
        cols["bag"] = [r.bag for r in records]
    if trained is not None:  # the images the model was trained on (cyto.bundle.TRAINING_CELLS)
        cols["trained_on"] = trained
    table = pa.table(cols).replace_schema_metadata(
        {
            "cyto.model": scorer.bundle.recorded_path,
            "cyto.manifest_sha256": scorer.bundle.manifest_hash,
            "cyto.method": scorer.bundle.method,
            "cyto.backend": scorer.backend.name,
            "cyto.precision": scorer.precision,
            "cyto.zoom": f"{factor:.4g} ({how})",
            "cyto.rank_by": rank_by,
            # the files left out (--skip-unreadable), so no reader mistakes the table for all
            "cyto.skipped": json_text([[str(p), why] for p, why in skipped]),
            "cyto.verification": json_text(
                scorer.verification.as_json() if scorer.verification else None
            ),
        }
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        sink = pa.BufferOutputStream()
        pq.write_table(with_rows_seal(table), sink)  # its rows sealed in its own metadata
        atomic_write(out, sink.getvalue().to_pybytes())
    except OSError as exc:
        raise OutputWriteError(
            f"cannot write {passing('out', out)}: {exc.strerror or exc}"
        ) from exc
    summary: dict[str, object] = {"n": len(scores), "out": out}
    if labels is not None and 0 < labels.sum() < len(labels):
        from sklearn.metrics import roc_auc_score

        from cyto.eval.metrics import recall_at_k, ties_words

        k = int(labels.sum())
        summary["auroc"] = float(roc_auc_score(labels, ranked))
        # the metrics' own ranking: ties broken as `cyto eval scores` breaks them
        summary["recall_at_k"] = float(recall_at_k(ranked, labels, k))
        ties = ties_words(ranked, k)
        if ties is not None:
            summary["ties"] = ties
        summary["k"] = k
        from cyto.eval.scores import few_cells_words

        few = few_cells_words(None, k, len(labels) - k)  # its AUROC was said bare (round 63)
        if few is not None:
            summary["few_abnormal"] = few
        if rank_by != "model":  # what the model alone gives, beside
            summary["auroc_model"] = float(roc_auc_score(labels, scores))
        if morph_scores is not None and rank_by != "morphometry":
            summary["auroc_morphometry"] = float(roc_auc_score(labels, morph_scores))
    return summary


def given_zoom_words(
    model_share: float | None, shares, who: str, factor: float, given: str
) -> str | None:
    """The warning of crops that a zoom the caller gave (``--zoom 1.9``, or the one a
    ``--patch-mpp`` gives) leaves off the model's scale by their nuclei (:func:`share_check`),
    or None: a wrong ``--patch-mpp 0.5`` for crops at 0.258 zoomed them 1.94x without a word,
    their normal nuclei read 64 um^2 for 29 and AUROC fell from 0.845 to 0.661 (hostile round
    57, 6); only crops left unzoomed were checked."""
    from cyto.data.scale import look_words, share_check

    shares = np.asarray(shares, dtype=np.float64)
    shares = shares[np.isfinite(shares)]  # chunks of a run resumed from before they were kept
    check = None if model_share is None else share_check(model_share, shares)
    if check is None or not check["advised"]:
        return None
    return (
        f"{who}, zoomed {factor:.3g}x by {given}, {look_words(check)}: check {given}"
        + (" (the crops' pixel size)" if given.startswith(("--patch-mpp", "patch_mpp")) else "")
        + f", or pass {passing('zoom', 'auto')} to zoom by their nuclei"
    )


#: a folder ranked by morphometry where more of its crops than this share have no nucleus
#: measured near their centre is warned (CRIC's development NILM crops: 2 %)
UNMEASURED_SHARE = 0.25


def unmeasured_words(morph, column: dict, rank_by: str) -> str | None:
    """The warning of a folder ranked by morphometry though most of its crops have no nucleus
    measured near their centre (each scores 0, as a typical normal cell), or None. Uniform grey
    or pure red crops were "ranked by morphometry", every score 0 and AUROC 0.5, without a word
    (hostile round 57, 3)."""
    if morph is None or rank_by == "model":
        return None
    # no nucleus near a crop's centre: its share 0 (its area NaN, as every area of a model
    # without a pixel size), which scores as a typical normal cell
    measured = np.asarray(column["nucleus_share"], dtype=np.float64) > 0
    n, total = int((~measured).sum()), len(measured)
    if total == 0 or n <= UNMEASURED_SHARE * total:
        return None
    which = f"any of the {total} crops" if n == total else f"{n} of the {total} crops"
    return (
        f"no nucleus was measured near the centre of {which}: each scores 0 by "
        f"morphometry, as a typical normal cell, so the ranking by {rank_by} says "
        f"{'nothing' if n == total else 'little'} of them; check that the crops are centred on "
        f"stained cells as the model's training cells were, or rank by the model alone "
        f"({passing('rank_by', 'model')})"
    )


#: AUROC by which another ranking must beat the one used on a labelled folder to be said
BETTER_BY = 0.05


def _better_ranking(summary: dict, rank_by: str, auto: bool, validation: dict | None) -> None:
    """Say (a ``CytoWarning``, and the summary's ``better_ranking``) when a labelled folder is
    ranked clearly better by the model alone or the morphometric score than by ``rank_by``
    (where both are below chance, that, and no switch advised):
    auto chose it by the bundle's held-back cells, and on cells unlike them (another lab,
    another scale) it ranked worse than chance without a word (bone marrow by a synthetic
    model: 0.236 by morphometry, 0.785 by the model)."""
    from cyto.errors import CytoWarning
    from cyto.flags import passing

    chosen = summary["auroc"]
    others = {"model": summary.get("auroc_model"), "morphometry": summary.get("auroc_morphometry")}
    best = max(((a, name) for name, a in others.items() if a is not None), default=None)
    if best is None or best[0] < chosen + BETTER_BY:
        return
    if best[0] <= 0.5:
        # both below chance: no ranking of this bundle is better on them, and a switch between
        # the two was advised (Pap crops given to a bone-marrow model: 0.357 against 0.301;
        # hostile round 63, 5)
        warn_caller(
            f"these labelled cells are ranked below chance by {rank_by} (AUROC {chosen:.3f}) "
            f"and by {best[1]} ({best[0]:.3f}): the model's cells are not these (another stain, "
            "lab or scale?); train on normal cells of their own",
            CytoWarning,
        )
        return
    summary["better_ranking"] = best[1]
    from cyto.data.morphometry import choose_ranking

    held = validation is not None and bool(validation.get("auroc"))
    why = ""
    if auto and held:
        why = (
            f" (auto took {rank_by}: it ranked the bundle's held-back cells best, cyto info; "
            "cells unlike them, of another lab or scale, can be ranked otherwise)"
        )
    elif auto and validation and validation.get("skipped"):  # why: said beside the ranking
        why = f" (auto took {rank_by}: nothing was held back at training; cyto info)"
    elif auto:  # nothing held back: the reason is not a comparison (hostile round 33)
        why = f" (auto took {rank_by}; cyto info: {choose_ranking(validation)[1]})"
    warn_caller(
        f"{passing('rank_by', best[1])} ranks these labelled cells better: AUROC {best[0]:.3f} "
        f"against {chosen:.3f} by {rank_by}{why}",
        CytoWarning,
    )


def _path_of(model) -> Path | None:
    """A model argument's bundle folder (a loaded scorer's), None when it names none."""
    bundle = getattr(model, "bundle", None)
    if bundle is not None:
        return getattr(bundle, "path", None)
    return Path(model) if isinstance(model, (str, Path)) else None


def _predict_table(path: Path) -> bool:
    """Whether ``path`` is a table ``cyto predict`` wrote (its model and method in the Parquet
    metadata): only such a file is replaced by ``overwrite`` (a user's Parquet file was)."""
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - anything that is no Parquet table is not predict's
        return False
    return b"cyto.model" in meta and b"cyto.method" in meta
