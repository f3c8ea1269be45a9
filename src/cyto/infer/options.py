"""The options of ``cyto score`` (one frozen, self-validating dataclass)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Annotated

from cyto.bundle import PRECISIONS
from cyto.data.morphometry import RANK_BY, RANK_BY_ALIASES
from cyto.detect import NucleusParams
from cyto.errors import ConfigError
from cyto.flags import (
    Local,
    Range,
    check_choice,
    check_mpp,
    check_value,
    comma_list,
    hints_of,
    passing,
    said,
)
from cyto.runtime.backends import CHOICES
from cyto.stats.calibrate import BURDEN_CELLS, FDR_ALPHA, TRIAGE_LEVEL

DECODERS = ("cpu", "torch")
OVERLAP = ("auto", "on", "off")

#: the largest crop side and tile side cyto score takes, in level-0 px: a size above them would
#: only reach the allocator (a 100000-px tile asked 112 GiB), never a slide's cells
MAX_PATCH, MAX_TILE = 1024, 16384

STAGES = ("mask", "read", "detect", "crop", "nucleus", "engine", "write", "wait", "finish")


def default_workers() -> int:
    """One decode/detect process per spare core (the engine keeps the main process busy)."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


#: a slide of at most this many tiles is scored in the main process when no ``--workers`` is
#: given: a worker takes 1-3 s to start on 2 cores, more than it saves there (a 2048 px field
#: image of 4 tiles: 1.05 s in the main process against 1.90 s with one worker; 16 tiles:
#: 2.17 against 2.87 s, the small test model; a larger model leaves the worker more to hide)
FEW_TILES = 4


def auto_workers(width: int, height: int, tile: int) -> int:
    """The tile workers of ``--workers`` left to cyto for a slide of ``width`` x ``height``
    level-0 px in tiles of ``tile``: none for a few tiles (:data:`FEW_TILES`), else
    :func:`default_workers`."""
    tiles = -(-width // tile) * -(-height // tile)
    return 0 if tiles <= FEW_TILES else default_workers()


@dataclass(frozen=True)
class ScoreOptions:
    #: the cell crop's side in level-0 px at the model's scale; None: the training patches'
    #: side the bundle records (:func:`patch_side`)
    #: (a crop is copied per cell, batch_size at a time: 1024 px is over 50x any cell's side)
    patch_size: Annotated[int | None, Range(16, MAX_PATCH, "px")] = None
    #: a tile is read whole into memory, queue of them in flight: 16384 px is 800 MB each
    tile: Annotated[int, Range(16, MAX_TILE, "px")] = 1024
    batch_size: int = 64
    top_k: int = 400
    mosaic: int = 100
    # the QuPath outputs (cyto.infer.qupath): cells (cells.geojson), map (abnormality.ome.tif)
    qupath: str = "cells,map"
    map_um: float = 50.0  # side of the abnormality map's windows, um
    backend: str = "auto"  # auto | onnx | onnx-trt | openvino | trt | torch
    device: str = "auto"
    # auto: the fastest precision verified on the golden cells here; fp32 keeps exact fp32
    precision: str = "auto"
    workers: int | None = None  # None: default_workers(); 0: all in the main process
    queue: int | None = None  # tiles in flight (None: 2 per worker, at least 16)
    nuclei: Annotated[Path | None, Local("a table of nuclei: copy it to this machine first")] = None
    # ground-truth cells (x, y, label) to report Recall@K
    truth: Annotated[Path | None, Local("a table of cells: copy it to this machine first")] = None
    truth_radius: Annotated[float, Range(0, None, "px")] = 20.0
    detection: NucleusParams = field(default_factory=NucleusParams)
    decode: str = "cpu"  # cpu (the slide readers) | torch (JPEG tiles by torchvision, else cpu)
    overlap: str = "auto"  # the engine in a thread of its own: auto (on a GPU) | on | off
    # auto (sibling files NAME_z+1.00um.ext) | none | comma-separated files
    planes: Annotated[str, Local("focal-plane files: copy them to this machine first")] = "auto"
    rescale: bool = False  # resample crops to the model's training mpp when the slide differs
    slide_mpp: float | None = None  # um/px of the slide, when its metadata lacks or misstates it
    model_mpp: float | None = None  # um/px of the training patches, when the bundle lacks it
    resume: bool = False
    chunk_cells: int = 4096  # rows per resumable chunk (a crash loses at most these)
    max_cells: int | None = None  # crops per tile result (None: what bounds memory in flight)
    # target false discovery rate of flagged cells (when calibrated); None: not given, FDR_ALPHA
    fdr_alpha: float | None = None
    # level of the slide test "more high-scoring cells"; None: not given, TRIAGE_LEVEL
    triage_level: float | None = None
    fdr_confidence: float | None = None  # FDR for this calibration with this probability
    verify: bool = True  # check the graph on the bundle's golden cells here before scoring
    rank_by: str = "auto"  # model | morphometry | model+morphometry | auto (cyto.data.morphometry)
    # the specimen-adequacy rule: a preset of cyto.stats.adequacy (none: no rule) or RULE.toml
    adequacy: Annotated[str, Local("a rule preset, or a RULE.toml on this machine")] = "general"
    # the cells the burden and slide test count: evaluable (the adequacy's) | all; None: not
    # given, evaluable (.counting)
    burden_cells: str | None = None

    def __post_init__(self) -> None:
        # every field of the type its annotation says, then in its range; the messages name
        # each field in the caller's words (cyto.flags.said: the flag at the command line,
        # top_k= from Python), with the value given
        hints = _hints()
        for f in fields(self):
            object.__setattr__(
                self, f.name, check_value(f.name, getattr(self, f.name), hints[f.name])
            )
        if self.patch_size is not None and self.tile < self.patch_size:
            raise ConfigError(
                f"{said('tile')} must be at least {said('patch_size')} ({self.patch_size} px), "
                f"got {self.tile}"
            )
        if self.planes not in ("auto", "none"):
            comma_list(self.planes, "planes")  # files: an empty item or one twice is refused
        comma_list(self.qupath, "qupath", fold=True)
        if self.batch_size < 1:
            raise ConfigError(f"{said('batch_size')} must be >= 1, got {self.batch_size}")
        check_choice("backend", self.backend, CHOICES)
        check_choice("precision", self.precision, (*PRECISIONS, "auto"))
        if self.decode not in DECODERS:
            raise ConfigError(
                f"{said('decode')} must be {' or '.join(DECODERS)}, got {self.decode!r}"
            )
        check_choice("overlap", self.overlap, OVERLAP)
        object.__setattr__(self, "rank_by", RANK_BY_ALIASES.get(self.rank_by, self.rank_by))
        check_choice("rank_by", self.rank_by, RANK_BY)
        if self.top_k < 1:
            raise ConfigError(f"{said('top_k')} must be >= 1, got {self.top_k}")
        if self.mosaic < 0:
            raise ConfigError(f"{said('mosaic')} must be >= 0 (0: none), got {self.mosaic}")
        self.qupath_outputs()  # an unknown name fails here, by name
        if not 1.0 <= self.map_um <= 10000.0:
            raise ConfigError(f"{said('map_um')} must be in um (1 to 10000), got {self.map_um}")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"{said('workers')} must be >= 0, got {self.workers}")
        for name in ("chunk_cells", "queue"):  # each named alone: the one given is the one said
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{said(name)} must be >= 1, got {value}")
        if self.max_cells is not None and self.max_cells < 1:
            raise ConfigError(f"{said('max_cells')} must be >= 1, got {self.max_cells}")
        for name in ("fdr_alpha", "triage_level"):
            if getattr(self, name) is not None and not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(
                    f"{said(name)} must be between 0 and 1, got {getattr(self, name)}"
                )
        if self.fdr_confidence is not None and not 0.0 < self.fdr_confidence < 1.0:
            raise ConfigError(
                f"{said('fdr_confidence')} must be between 0 and 1 (e.g. 0.9), got "
                f"{self.fdr_confidence}"
            )
        self.adequacy_rule()  # an unknown preset or a bad rule file fails here, by name
        if self.burden_cells is not None and self.burden_cells not in BURDEN_CELLS:
            raise ConfigError(
                f"{said('burden_cells')} must be {' or '.join(BURDEN_CELLS)}, got "
                f"{self.burden_cells!r}"
            )
        for name in ("slide_mpp", "model_mpp"):
            check_mpp(name, getattr(self, name))

    def adequacy_rule(self):
        """The :class:`~cyto.stats.adequacy.AdequacyRule` ``--adequacy`` names (None: none)."""
        from cyto.stats.adequacy import resolve

        return resolve(self.adequacy)

    def overlaps(self, device: str) -> bool:
        """Whether the engine runs in a thread of its own (``auto``: on a CUDA device)."""
        return self.overlap == "on" or (self.overlap == "auto" and device.startswith("cuda"))

    def n_workers(self) -> int:
        return default_workers() if self.workers is None else self.workers

    def qupath_outputs(self) -> tuple[str, ...]:
        """The QuPath outputs ``--qupath`` names, in a fixed order (``none``: none; ``all``:
        both)."""
        from cyto.infer.qupath import QUPATH_FILES

        names = set(comma_list(self.qupath, "qupath", fold=True))
        if names == {"all"}:
            return tuple(QUPATH_FILES)
        if names <= {"none"}:
            return ()
        unknown = sorted(names - set(QUPATH_FILES))
        if unknown:
            raise ConfigError(
                f"{said('qupath')} takes {', '.join(QUPATH_FILES)} (comma-separated), all or none; "
                f"got {self.qupath!r}"
            )
        return tuple(n for n in QUPATH_FILES if n in names)

    def result_key(self) -> dict:
        """The options that change the score table (a resumed run must match them)."""
        return {
            "patch_size": self.patch_size,
            "tile": self.tile,
            "nuclei": str(self.nuclei) if self.nuclei else None,
            "detection": asdict(self.detection),
            "planes": self.planes,
            "rescale": self.rescale,
            "precision": self.precision,
            "slide_mpp": self.slide_mpp,
            "model_mpp": self.model_mpp,
        }

    def output_key(self) -> dict:
        """Every option that changes what a finished run wrote (the table, its ranking, the
        top-K, mosaics, the truth report and the error-controlled flags), as JSON values: a
        finished run is reused by ``--resume`` only when this matches."""
        import json

        key = {
            **self.result_key(),
            "top_k": self.top_k,
            "mosaic": self.mosaic,
            "qupath": ",".join(self.qupath_outputs()) or "none",
            "map_um": self.map_um if "map" in self.qupath_outputs() else None,
            "rank_by": self.rank_by,
            "truth": str(self.truth) if self.truth else None,
            "truth_radius": self.truth_radius,
            "fdr_alpha": self.alpha,
            "triage_level": self.triage,
            "fdr_confidence": self.fdr_confidence,
            "burden_cells": self.counting,
            **self.side_files_key(),
        }
        rule = self.adequacy_rule()
        if rule is not None:  # the rule itself, not its name: a rule file edited is another
            key["adequacy"] = rule.key()
        return json.loads(json.dumps(key, default=str))

    def side_files_key(self) -> dict:
        """The content of the side files the options name (``--nuclei``, ``--truth``): a file
        edited or replaced under the same name is another input (the rule of reuse)."""
        from cyto.infer.store import file_identity

        return {
            "nuclei_file": file_identity(self.nuclei),
            "truth_file": file_identity(self.truth),
        }

    @property
    def alpha(self) -> float:
        """The FDR flags are held at: ``fdr_alpha``, or FDR_ALPHA when it was not given (None:
        a note on an uncalibrated bundle names only what the user gave, default value or not)."""
        return FDR_ALPHA if self.fdr_alpha is None else self.fdr_alpha

    @property
    def triage(self) -> float:
        """The slide test's level: ``triage_level``, or TRIAGE_LEVEL when it was not given."""
        return TRIAGE_LEVEL if self.triage_level is None else self.triage_level

    @property
    def counting(self) -> str:
        """The cells the burden counts: ``burden_cells``, or evaluable when it was not given."""
        return BURDEN_CELLS[0] if self.burden_cells is None else self.burden_cells

    def as_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


@cache
def _hints() -> dict:
    """The fields' annotations, evaluated once (:func:`cyto.flags.hints_of`)."""
    return hints_of(ScoreOptions)


def model_spec(model):
    """The model spec of a bundle path or a loaded scorer (its manifest, no weights)."""
    if hasattr(model, "spec"):
        return model.spec
    from cyto.bundle import load_bundle

    return load_bundle(model, weights=False, for_scoring=True).spec


def detection_for(kind: str, model, detector: str = "scipy") -> NucleusParams:
    """The nucleus detection for ``--detection KIND``: a preset
    (:func:`cyto.detect.detection_preset`), or ``auto``, the one of the stain the model was
    trained on (:data:`cyto.detect.params.DETECTION_OF_STAIN`: Pap cells get ``pap``, MGG
    ``smear``, H&E ``tissue``). ``model``: a bundle path or a loaded scorer."""
    from dataclasses import replace

    from cyto.detect import detection_preset
    from cyto.detect.params import DETECTION_CHOICES, DETECTION_OF_STAIN

    check_choice("detection", kind, DETECTION_CHOICES)  # every value it takes, auto too
    if kind == "auto":
        kind = DETECTION_OF_STAIN.get(model_spec(model).stain, "smear")
    return replace(detection_preset(kind), detector=detector)


def check_rank_by(model, rank_by: str) -> str | None:
    """A --rank-by the bundle cannot take, refused before any slide (every cohort path).
    Returns the line to say where ``auto``'s choice rests on too few held-back abnormal cells
    (:func:`cyto.data.morphometry.few_abnormal_words`), else None."""
    from cyto.data.morphometry import Morphometric, resolve_rank_by, spec_caution

    spec = model_spec(model)
    how = resolve_rank_by(
        rank_by, Morphometric.of_spec(spec), spec.validation, spec.morphometry_why
    )
    if RANK_BY_ALIASES.get(rank_by, rank_by) != "auto":
        return None
    few = spec_caution(spec)
    return None if few is None else f"ranked by {how}: {few}"


def rank_by_line(model, rank_by: str) -> str:
    """What the cells will be ranked by, and why, in the line ``cyto score`` says before any
    slide: it said nothing of it, while ``score``, the first score column, is the model's (a
    Pap bundle ranked by its morphometry: hostile round 58, 6)."""
    from cyto.data.morphometry import RANKED_COLUMN, Morphometric, choose_ranking, resolve_rank_by

    spec = model_spec(model)
    how = resolve_rank_by(
        rank_by, Morphometric.of_spec(spec), spec.validation, spec.morphometry_why
    )
    column = RANKED_COLUMN[how]
    if RANK_BY_ALIASES.get(rank_by, rank_by) != "auto":
        return f"ranked by {how} (the {column} column; {passing('rank_by', rank_by)})"
    why = choose_ranking(spec.validation)[1]
    return f"ranked by {how} (the {column} column; {said('rank_by')} auto: {why})"


#: the crop side of a bundle that records no training patch side (cyto before it did): the
#: synthetic patches' side
DEFAULT_PATCH = 192


def patch_side(opts, spec) -> int:
    """The crop's side at the model's scale (level-0 px at the model's mpp): ``--patch-size``,
    else the side of the training patches the bundle records (a model of 100 px CRIC crops
    cut 192 px crops otherwise, and saw its cells 1.9x too small), else :data:`DEFAULT_PATCH`."""
    from cyto.errors import ConfigError

    side = opts.patch_size or spec.patch_px or DEFAULT_PATCH
    if opts.tile < side:
        raise ConfigError(
            f"{said('tile')} must be at least the crop's side ({side} px), got {opts.tile}"
        )
    return side


def as_cut(opts: ScoreOptions, spec) -> ScoreOptions:
    """``opts`` with the crop side this model cuts (:func:`patch_side`) in place of ``None``:
    what a run records in its table, chunks and summary, and what ``--resume`` and a
    calibration compare, whether ``--patch-size`` was given or not. Every key of a run is made
    from this, never from the options as given."""
    from dataclasses import replace

    return replace(opts, patch_size=patch_side(opts, spec))
