"""A slide's plan: its resolution against the model's, its tissue mask and tile list, and what
every worker needs to turn a tile into crops (:class:`SlidePlan`)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from cyto.data.morphometry import scorer_rank_by
from cyto.flags import UM_PER_PX, passing
from cyto.infer.options import STAGES, ScoreOptions, patch_side
from cyto.infer.scale import resolution
from cyto.infer.store import schema, slide_key
from cyto.infer.tiling import (
    QUEUE_MIN,
    TileContext,
    max_cells_per_result,
    slide_threshold_of,
    tile_jobs,
)
from cyto.runtime import Scorer
from cyto.slides import open_slide
from cyto.slides.base import BITS_KEY
from cyto.slides.grid import tissue_mask
from cyto.slides.readers import reads_from_server
from cyto.slides.remote import SlideURL, slide_ref


def decode_device(device: str) -> str:
    """Where ``--decode torch`` decodes: the engine's CUDA device when there is one, else the
    CPU (``--device cpu`` keeps it there)."""
    if device == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "cuda" if device == "auto" else device


def no_model_mpp() -> str:
    """Said for every slide scored by a bundle without a training resolution, in the caller's
    words (``--model-mpp`` / ``model_mpp=``); a cohort says it once."""
    return (
        "warning: the model records no training resolution (mpp), so the slide's scale cannot "
        f"be checked against it; pass {passing('model_mpp', UM_PER_PX)} (that of the "
        "training patches)"
    )


def check_model_mpp(scorer, opts) -> None:
    """``--model-mpp`` is for a bundle trained without a resolution: given with one that
    records another, it was taken over the record without a word (and said "the model was
    trained at" the value given). Refused in one line, in the caller's words."""
    from cyto.errors import ConfigError
    from cyto.flags import passing

    given, recorded = opts.model_mpp, scorer.spec.mpp
    if given and recorded and abs(given - recorded) > 0.01 * recorded:
        raise ConfigError(
            f"{passing('model_mpp', given)}: {scorer.bundle.path} records its training "
            f"resolution, {recorded:g} um/px; {passing('model_mpp')} is for a bundle trained "
            "without one: leave it out"
        )


class ThresholdAhead:
    """The slide's detection threshold (:func:`~cyto.infer.tiling.slide_threshold_of`: 16
    windows read and smoothed, 0.3-1.2 s on 2 cores) measured in a thread of its own, with a
    reader of its own, while the model loads; :class:`SlidePlan` takes it with
    :meth:`threshold_for`. None from :meth:`start` when the run needs no threshold (given
    nuclei, or a threshold set by the user)."""

    def __init__(self, slide: Path, opts: ScoreOptions):
        self._params = self._threshold = None
        self._thread = threading.Thread(
            target=self._measure,
            args=(slide_ref(slide), opts.detection, opts.slide_mpp),
            name="cyto-threshold",
            daemon=True,
        )
        self._thread.start()

    @classmethod
    def start(cls, slide: Path, opts: ScoreOptions) -> ThresholdAhead | None:
        if opts.nuclei is not None or opts.detection.threshold is not None:
            return None
        return cls(slide, opts)

    def _measure(self, slide: Path, detection, slide_mpp) -> None:
        try:
            reader = open_slide(slide)
            try:
                params = detection.at(slide_mpp or reader.info.mpp)
                self._threshold = slide_threshold_of(reader, params)
                self._params = params
            finally:
                reader.close()
        except Exception:  # noqa: BLE001 (the plan measures it again, and meets the error)
            self._params = None
        except KeyboardInterrupt:
            # a Ctrl-C met here (a --download's progress checks for it) is the main thread's
            # to say: Python printed this thread's traceback above "interrupted" (round 62, 3)
            self._params = None

    def join(self) -> None:
        """Wait for the measurement to end (a run that stops before its plan took it)."""
        self._thread.join()

    def threshold_for(self, detection) -> tuple | None:
        """(threshold,) once measured, when it was measured with ``detection`` (the same
        parameters: the same windows, the same number); None when it failed (the plan measures
        it and meets the error itself) or used other parameters."""
        self._thread.join()
        return (
            (self._threshold,) if self._params is not None and self._params == detection else None
        )


class SlidePlan:
    """What every run over a slide's tiles shares: the resolution, the worker context and the
    tile list (all tiles of a slide, in order; a part of a slide is a range of it)."""

    def __init__(
        self,
        slide: Path,
        reader,
        planes,
        scorer: Scorer,
        opts: ScoreOptions,
        echo,
        threshold_job=None,
    ):
        """``threshold_job``: the slide's threshold measured ahead of the plan
        (:class:`ThresholdAhead`), taken only when it used this plan's detection parameters;
        otherwise (or when it failed) measured here."""
        info = reader.info
        slide_mpp = opts.slide_mpp or info.mpp
        model_mpp = opts.model_mpp or scorer.spec.mpp
        if slide_mpp is None:
            echo(
                f"warning: {slide.name} records no resolution (mpp): nucleus sizes assume "
                f"{opts.detection.mpp} um/px and its scale cannot be checked against the "
                f"model's; pass {passing('slide_mpp', UM_PER_PX)}"
            )
        if model_mpp is None:
            echo(no_model_mpp())
        self.slide, self.planes, self.slide_mpp = slide, planes, slide_mpp
        self.res = resolution(
            slide_mpp,
            info.objective,
            model_mpp,
            patch_side(opts, scorer.spec),
            opts.rescale,
            echo,
            recorded_mpp=info.mpp if opts.slide_mpp else None,
            # what check_scale will weigh it against: the bundle's training share, under a
            # detection whose nucleus share it reads
            cells_checked=scorer.spec.centre_nucleus_fraction is not None
            and opts.detection.kind in ("smear", "pap"),
        )
        top = info.properties.get(BITS_KEY)
        if top is not None:  # said as a crop's 16 bits are (hostile round 51, 3)
            echo(
                f"note: {slide.name}: its 16-bit samples take {int(top).bit_length()} bits: "
                f"read as such ({top} is white), not by their top byte"
            )
        if reads_from_server(slide, reader):  # the bar starts with the tiles: what a slow link
            from cyto.detect import THRESHOLD_WINDOWS  # reads before them is said (12 s of nothing
            # at 600 KB/s for a 9 MB slide, longer on a larger one; not of a --download copy)

            echo(
                f"{slide.name}: planning its tiles: reading its overview and up to "
                f"{THRESHOLD_WINDOWS} windows from the server"
            )
        t0 = time.perf_counter()
        mask, mask_ds = tissue_mask(reader)
        self.jobs = tile_jobs(info, opts.tile, mask, mask_ds, opts.nuclei)
        detection = opts.detection.at(slide_mpp)  # nuclei have a physical size
        # one threshold for every tile, from windows of a fixed grid: the cells found do not
        # depend on --tile (each tile's own Otsu threshold made them)
        self.threshold = None
        if opts.nuclei is None and self.jobs and detection.threshold is None:
            ahead = threshold_job.threshold_for(detection) if threshold_job else None
            self.threshold = (
                ahead[0] if ahead else slide_threshold_of(reader, detection, mask, mask_ds)
            )
            if self.threshold is not None:
                detection = replace(detection, threshold=round(self.threshold, 6))
        self.mask_s = time.perf_counter() - t0
        self.workers = opts.n_workers()
        # tiles in flight (why 16: tiling.QUEUE_MIN); max_cells below shrinks as the queue grows
        self.queue = opts.queue or max(QUEUE_MIN, 2 * self.workers)
        self.ctx = TileContext(
            slide=slide if isinstance(slide, SlideURL) else str(slide),
            planes=tuple(str(f) for _, f in planes),
            plane_z=(0.0, *(z for z, _ in planes)),
            tile=opts.tile,
            margin=self.res.crop_px_level0 // 2 + 32,
            src_patch=self.res.crop_px_level0,
            out_size=scorer.spec.crop_size,
            detection=detection,
            max_cells=opts.max_cells
            or max_cells_per_result(scorer.spec.crop_size, len(planes) + 1, self.queue),
            # every cell's morphometry, with the cell mask of the model's stain
            stain=scorer.spec.stain,
            crop_mpp=(
                slide_mpp * self.res.crop_px_level0 / scorer.spec.crop_size if slide_mpp else None
            ),
            # each crop's sharpness, for the adequacy rule's focus check (none: no rule)
            sharpness=opts.adequacy_rule() is not None,
        )
        self.size = (info.width, info.height)  # level 0, for the adequacy's area shares
        self.decode = "CPU readers"
        if opts.decode == "torch":
            from cyto.slides.device import open_device_tiles

            grid, why = open_device_tiles(slide)
            if grid is None:
                self.decode = why
                echo(f"{slide.name}: {passing('decode', 'torch')}: {why}")
            else:
                device = decode_device(opts.device)
                self.decode = f"{why} ({device})"
                self.ctx = replace(self.ctx, decode="torch", decode_device=device)
                if device != "cpu" and self.workers:
                    # the device does the decoding, detection and cropping: no worker processes
                    # (each would hold a CUDA context of its own)
                    self.workers = 0
                if not self.workers:  # crops stay tensors on the decode device for the engine
                    self.ctx = replace(self.ctx, keep_on_device=True)
        self.overlap = opts.overlaps(scorer.device)
        self.identity = ""  # the slide's identity, once a store has read it
        self._slide_key: dict | None = None

    def store_key(self, scorer: Scorer, opts: ScoreOptions, jobs: int) -> dict:
        """What the rows of ``jobs`` tiles depend on: a chunk store's key, and the summary's
        ``rows_key`` (the slide's identity read once a plan: the one its rows were cut from)."""
        if self._slide_key is None:
            self._slide_key = slide_key(self.slide, self.planes)
        return {
            "model": scorer.bundle.rows_id,  # a calibration added since keeps the rows
            "slide": self._slide_key,
            "options": {**opts.result_key(), "precision": scorer.precision},
            "nuclei_file": opts.side_files_key()["nuclei_file"],
            "tiles": jobs,
            # chunks of another table layout (an older cyto), or without the nucleus-size
            # scores this ranking needs, are not continued
            "columns": schema().names,
            "rank_by": scorer_rank_by(scorer, opts.rank_by)[0],
            # chunks without their crops' sharpness (--adequacy none) cannot serve a rule
            "sharpness": self.ctx.sharpness,
            # torch's decoder gives the same pixels, not the same crops' sharpness to the bit
            "decode": self.ctx.decode,
        }


class TileRun:
    """The outcome of scoring a run of tiles into a chunk store."""

    def __init__(self) -> None:
        self.timings = dict.fromkeys(STAGES, 0.0)
        self.resumed_cells = 0
        self.resumed_tiles = 0
        self.kept = False  # every cell from the finished run's table (--resume), none scored
        self.crowd: dict | None = None
        self.scale: dict | None = None  # the first cells' size against the model's
        self.stain: dict | None = None  # and their stain
        self.loop_seconds = 0.0
        self.worker_rss_mb: float | None = None
        self.cells = 0  # cells scored by this run (not resumed)
        self.overlap = False  # the engine ran in a thread of its own
        self.engine_device_s = 0.0  # CUDA event time of the engine calls (0 off CUDA)
        self.h2d_bytes = 0  # bytes copied from host memory to the engine's device

    def as_json(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict) -> TileRun:
        run = cls()
        for name in vars(run):  # a field newer than the record keeps its default
            setattr(run, name, data.get(name, getattr(run, name)))
        return run
