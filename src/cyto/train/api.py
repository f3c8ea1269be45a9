"""``cyto train`` as a library call: data, config, fit, bundle."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cyto.bundle import bundle_names, cell_keys, save_bundle
from cyto.data.dataset import PatchDataset, empty_class_words, source_slides
from cyto.errors import (
    ConfigError,
    CytoError,
    DatasetError,
    InputPathError,
    TrainingError,
    out_of_memory,
)
from cyto.flags import passing, python_call, said, setting
from cyto.locks import OutputLock
from cyto.outputs_check import refuse_keep_and_replace, refuse_to_replace
from cyto.tables import json_text
from cyto.train.calibration import normal_calibration
from cyto.train.config import TrainConfig, resolve_config
from cyto.train.data import TrainData
from cyto.train.loop import resolve_device
from cyto.train.registry import get_method


@dataclass(frozen=True)
class TrainResult:
    bundle: Path
    method: str
    config: TrainConfig
    seconds: float
    n_images: int
    n_used: int  # the images the method learned from (the normal ones for one-class methods)
    history: dict[str, list[float]]
    bag_check: dict[str, Any] | None = None  # weakly supervised methods: see cyto.train.bagcheck
    #: how the held-back cells ranked (cyto.data.morphometry.validation_record), or None
    validation: dict[str, Any] | None = None
    #: one line each for what training could not fit on its normals, why, and what falls back
    #: (:func:`cyto.data.morphometry.unfitted_words`), and for a ranking chosen on too few
    #: abnormal cells (:func:`cyto.data.morphometry.few_abnormal_words`): said as it trained
    notes: tuple[str, ...] = ()


def checkpoint_dir(out: Path) -> Path:
    """Where an interrupted run keeps its per-epoch state (next to the bundle)."""
    return Path(out).with_name(Path(out).name + ".train-state")


def training_nuclei(
    data: TrainData, stain: str = "mgg", mpp: float | None = None, given_mpp: float | None = None
) -> dict[str, Any]:
    """What a bundle records of its training normals' nuclei (all cells when labels are
    withheld), measured with the cell mask of their ``stain`` (:mod:`cyto.detect.morphometry`):
    the median share of a patch the scale check compares another folder's or a slide's cells
    with (``nucleus_fraction``: every nucleus of the patch for MGG, as before, else the centre
    nucleus; ``centre_nucleus_fraction``: the centre nucleus), and the morphometric score
    (:class:`cyto.data.morphometry.Morphometric`), or why there is none (``morphometry_why``,
    said at training and by ``cyto info``: :func:`cyto.data.morphometry.unfitted_words`), and
    their nuclei's median size against a normal cell's of the stain, measured at ``mpp`` (the
    patches'), for the pixel size the user gave (``given_mpp``;
    :func:`~cyto.data.morphometry.nucleus_size_check`)."""
    from cyto.data.morphometry import Morphometric, nucleus_size_check
    from cyto.detect.morphometry import measure_stain, scale_shares

    images = data.images if data.labels is None else data.images[np.asarray(data.labels) == 0]
    if not len(images):
        return {
            "nucleus_fraction": None, "centre_nucleus_fraction": None, "morphometry": None,
            "stain_vectors": None,
        }  # fmt: skip
    measures = measure_stain(images, mpp, stain)
    why = None
    try:
        morph = Morphometric.fit(measures, stain).as_record()
    except ConfigError as exc:  # recorded and said (unfitted_words): ranked by the model alone
        morph, why = None, str(exc)
    from cyto.detect.stain import estimate_images

    return {
        "nucleus_fraction": round(float(np.median(scale_shares(images, stain))), 5),
        "centre_nucleus_fraction": round(float(np.median(measures["nucleus_share"])), 5),
        "morphometry": morph,
        "morphometry_why": why,
        # the normals' nucleus size against a normal cell's of the stain (unfitted_words)
        "nucleus_size_check": nucleus_size_check(
            stain, measures["nucleus_area_um2"], given_mpp or mpp
        ),
        # what another folder's or slide's stain is compared with (cyto.detect.stain)
        "stain_vectors": dataclasses.replace(
            estimate_images(images), cells=len(images)
        ).as_record(),
    }


def held_mpp(cfg, ds: PatchDataset, data: TrainData) -> float | None:
    """The held-back crops' pixel size (as :attr:`cyto.bundle.ModelSpec.crop_mpp` reads it)."""
    side = patch_px(ds)
    return cfg.mpp * side / data.images.shape[1] if cfg.mpp and side else None


def patch_px(ds: PatchDataset) -> int | None:
    """The most common side (the longer one) of the dataset's images before any resize, from
    their headers (:func:`cyto.data.dataset.crop_sides`); None when none can be read."""
    from cyto.data.dataset import common_side, crop_sides

    return common_side(crop_sides(ds.records)[0])


#: the fewest normal images a one-class model is trained on: it learns their spread, and one
#: image has none (Deep SVDD's scores collapsed, and the error spoke of bias terms: hostile
#: round 63, 3)
MIN_NORMAL_IMAGES = 2


def refuse_missing_supervision(cls, data, ds=None) -> None:
    """One line where the method's supervision is not in ``data``: bags for WS-SIL and ItS2CLR
    (a manifest's ``bag`` and ``bag_label`` columns), said before any image is read where
    ``data`` is a class folder, which has none (they were refused after every image was read);
    abnormal cells for FS-SIL, once the dataset ``ds`` is read (it said "got only 0": hostile
    round 79, 2 and 4)."""
    from cyto.flags import passing

    if cls.one_class:
        return
    if ds is None and not cls.instance_labels and Path(data).is_dir():
        raise DatasetError(
            f"{data}: {cls.name} learns from bags (a slide's cells, labelled by the slide) and a "
            "class folder has none: give a manifest CSV with path, bag (slide_id) and bag_label "
            "columns (docs/reference/inputs.md)"
        )
    if ds is not None and cls.instance_labels and not (np.asarray(ds.labels) == 1).any():
        raise DatasetError(
            f"{data}: {cls.name} learns normal against abnormal cells, and {data} holds only the "
            f"normal class(es) {', '.join(ds.normal)}: add abnormal classes (every class not in "
            f"{passing('normal')} is abnormal), or train a one-class method (dsvdd, droc) on "
            "the normals"
        )


def refuse_too_few_normals(cls, train_data, normal: Sequence[str], data) -> None:
    """One line where a one-class method is given fewer than :data:`MIN_NORMAL_IMAGES` normal
    images, naming the class and its count, before any training."""
    if not cls.one_class:
        return
    labels = train_data.labels
    n = len(train_data) if labels is None else int((labels == 0).sum())
    if n >= MIN_NORMAL_IMAGES:
        return
    raise DatasetError(
        f"{data}: the normal class(es) {', '.join(normal)} hold {n} image(s): a one-class model "
        f"learns the spread of normal cells, and needs at least {MIN_NORMAL_IMAGES} (cyto's "
        "presets were measured on hundreds)"
    )


def nothing_held_back_words(stain: str | None) -> str:
    """What a one-class model trained without abnormal classes ranks by, and, for Pap cells,
    what was measured there: the networks of cyto's presets ranked CRIC's lesions near chance
    and the morphometric score well, and a Pap model trained on NILM alone ranked by its
    network unsaid where `cyto predict` had no labels to warn by (hostile round 63, 6). Said
    by ``cyto train`` and :func:`cyto.train` alike (it was the command line's alone)."""
    from cyto.flags import passing

    words = (
        "no abnormal classes beside the normal ones, so nothing was held back to compare "
        f"rankings: {passing('rank_by', 'auto')} ranks by the model alone"
    )
    if stain == "pap":
        from cyto.data.morphometry import pap_unchosen_words

        words += f"; {pap_unchosen_words()}"
    return words


def holdout_split(ds: PatchDataset, labels, share: float) -> tuple[np.ndarray, np.ndarray]:
    """(training, held back) indices: the latest ``share`` of the normal cells by file number
    (:func:`cyto.data.dataset.acquisition_key`) and every abnormal cell are held back, the other
    normal cells train. Nothing is held back without abnormal cells or with ``share`` 0, or when
    fewer than 10 normal cells would be held back or 10 left to train."""
    from cyto.data.dataset import acquisition_key
    from cyto.data.morphometry import holdout_why

    everything = np.arange(len(ds))
    if labels is None or share <= 0:
        return everything, everything[:0]
    labels = np.asarray(labels)
    normals = np.flatnonzero(labels == 0)
    abnormal = np.flatnonzero(labels == 1)
    n_held = int(round(share * len(normals)))
    if not len(abnormal) or holdout_why(len(normals), share) is not None:
        return everything, everything[:0]
    order = sorted(normals, key=lambda i: acquisition_key(ds.records[i].path))
    held = np.sort(np.concatenate([np.asarray(order[-n_held:]), abnormal]))
    return np.sort(np.asarray(order[:-n_held])), held


def validation(
    model, ds: PatchDataset, data: TrainData, held: np.ndarray, stain: str, mpp: float | None
) -> dict:
    """How the model, the training normals' morphometric score and their fusion rank the
    held-back cells (:func:`cyto.data.morphometry.validation_record`), recorded in the bundle
    for ``--rank-by auto``."""
    from collections import Counter

    from cyto.data.morphometry import Morphometric, validation_record
    from cyto.detect.morphometry import measure_stain

    images, labels = data.images[held], np.asarray(data.labels)[held]
    scores = np.asarray(model.score(images), dtype=np.float64)
    record = None
    train_normals = np.setdiff1d(np.flatnonzero(np.asarray(data.labels) == 0), held)
    try:
        morph = Morphometric.fit(measure_stain(data.images[train_normals], mpp, stain), stain)
        record = morph.score(measure_stain(images, mpp, stain))
    except ConfigError:
        pass
    classes = Counter(ds.records[i].cls for i in held)
    return {
        **validation_record(labels, scores, record, dict(sorted(classes.items()))),
        "held_back": "the latest normal cells by file number, and every abnormal cell",
    }


def run_key_names() -> dict[str, str]:
    """The key fields of a training run by the caller's names for them (:mod:`cyto.flags`:
    ``--weights`` at the command line, ``weights=`` from Python)."""
    cells = ", ".join(said(k) for k in ("data", "normal", "abnormal", "skip_unreadable"))
    return {
        "method": said("method") if python_call() else "METHOD",
        "data": f"the training cells ({cells})",
        "weights": said("weights"),
        # with the preset and the config file: the resolved config, field by field
        "config": said("overrides"),
    }


RUN_KEY = "run-key.json"
#: a run started with ``overwrite`` over an existing bundle leaves this beside its key, so that
#: ``resume`` (never given with ``overwrite``) replaces that bundle as the run was asked to
REPLACES = "replaces-bundle"


def replaces_bundle(ckpt: Path, resume: bool) -> bool:
    """Whether a resumed run in ``ckpt`` was asked to replace its bundle when it started."""
    return resume and (Path(ckpt) / REPLACES).is_file()


def run_key(method: str, cfg: TrainConfig, data: TrainData, weights: Path | None) -> dict:
    """Everything an interrupted run's checkpoints were computed from: a checkpoint is continued
    only by a run of the same method, config, training cells and initial weights."""
    from cyto.bundle import sha256_file

    return {
        "method": method,
        "data": data.fingerprint,
        "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
        "weights": sha256_file(Path(weights)) if weights is not None else None,
    }


def checkpoint_words(ckpt: Path) -> str:
    """What a stopped run leaves for ``--resume``, in words."""
    ckpt = Path(ckpt)  # the held-out model's phases (held-out/...) come first, then the model's
    phases = (
        sorted(p.relative_to(ckpt).with_suffix("").as_posix() for p in ckpt.rglob("*.pt"))
        if ckpt.is_dir()
        else []
    )
    if not phases:
        return "no epoch was finished yet: rerun to start over"
    return (
        f"the last finished epoch of {len(phases)} training phase(s) ({', '.join(phases)}) is "
        f"kept in {ckpt}: rerun the same command with {passing('resume')} to continue"
    )


def resumed_words(ckpt: Path) -> str:
    """What a resumed run continues from: each phase's last finished epoch kept in ``ckpt``."""
    import torch

    kept = []
    for p in sorted(Path(ckpt).rglob("*.pt")):
        name = p.relative_to(ckpt).with_suffix("").as_posix()
        try:
            epoch = int(torch.load(p, map_location="cpu", weights_only=True)["epoch"]) + 1
        except Exception:  # noqa: BLE001 - the loop reports a damaged checkpoint when it loads it
            kept.append(name)
            continue
        kept.append(f"{name} after epoch {epoch}")
    if not kept:
        return f"no epoch of the interrupted run in {ckpt} was finished: training from the start"
    return f"continuing the interrupted run in {ckpt}: {', '.join(kept)}"


def start_checkpoints(ckpt: Path, key: dict, resume: bool, replaces: bool = False) -> None:
    """``--resume`` continues the checkpoints in ``ckpt`` only when they were written by a run
    with this very ``key`` (:func:`cyto.reuse.check_reuse`); a run without it starts anew."""
    from cyto.bundle import atomic_write
    from cyto.reuse import check_reuse, read_record

    if resume:
        reuse = check_reuse(read_record(ckpt / RUN_KEY), key, names=run_key_names())
        asked = passing("resume")
        if reuse.missing:
            raise ConfigError(
                f"{asked}: {ckpt} records no key of the run that wrote it (an older cyto, or a "
                f"damaged folder), so it cannot be shown to be this run's: rerun without {asked}"
            )
        if not reuse.ok:
            raise ConfigError(
                f"{asked}: the interrupted run in {ckpt} was another run ({reuse.words()}); "
                f"rerun with its settings, or without {asked} to start over"
            )
        return
    # anew, keeping the lock file of the run that holds the folder (cyto.locks.LOCK)
    from cyto.locks import LOCK

    ckpt.mkdir(parents=True, exist_ok=True)
    for old in ckpt.iterdir():
        if old.name != LOCK:
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    atomic_write(ckpt / RUN_KEY, json_text(key, indent=1, sort_keys=True).encode())
    if replaces:  # the bundle this run replaces, asked with overwrite: resume replaces it too
        atomic_write(ckpt / REPLACES, b"")


def refuse_resume_and_overwrite(resume: bool, overwrite: bool) -> None:
    """Both asked of a training, refused in one line, before anything is read (``cyto train``
    before its missing options, :func:`train` first): resume continues the interrupted run as
    it was started (replacing the bundle where that run was asked to); overwrite starts a new
    one over it."""
    refuse_keep_and_replace(
        resume, overwrite, "continues an interrupted run", "starts a new one over the bundle"
    )


def train(
    method: str,
    data: Path,
    out: Path,
    normal: str | None = None,
    abnormal: str | None = None,
    preset: str | None = None,
    config_file: Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    device: str = "auto",
    resume: bool = False,
    weights: Path | None = None,
    skip_unreadable: bool = False,
    overwrite: bool = False,
    extra_manifest: dict[str, Any] | None = None,
    echo=None,
    mixed_sizes: bool = False,
) -> TrainResult:
    """Train ``method`` on a patch folder or manifest and write the bundle ``out``;
    ``extra_manifest``: more top-level manifest fields (e.g. ``refined_from``); ``echo`` says
    what a stopped run kept; ``mixed_sizes``: crops of several sizes span one field of view
    (``cyto refine``'s slide crops beside the training patches), else they are refused."""
    refuse_resume_and_overwrite(resume, overwrite)
    cls = get_method(method)
    cfg = resolve_config(cls.Config, preset, config_file, overrides, method=method)
    if weights is not None and not Path(weights).is_file():  # before any image is read
        raise InputPathError(
            f"{passing('weights', Path(weights))}: no such file (a .safetensors file of "
            "initial encoder weights)"
        )
    out = Path(out)
    ckpt = checkpoint_dir(out)
    replaces = overwrite or replaces_bundle(ckpt, resume)
    refuse_to_replace(
        out, replaces, known=bundle_names(out), inputs={"data": data, "weights": weights}
    )
    if resume and not ckpt.is_dir():
        raise ConfigError(f"{passing('resume')}: no interrupted run to continue at {ckpt}")
    dev = resolve_device(device)
    refuse_missing_supervision(cls, data)
    ds = PatchDataset.from_path(
        data,
        normal=normal,
        abnormal=abnormal,
        size=cfg.load_size,
        skip_unreadable=skip_unreadable,
        mixed_sizes=mixed_sizes,
    )
    empty = empty_class_words(data, ds.normal + ds.abnormal, abnormal)
    if empty and echo is not None:
        echo(empty)
    refuse_missing_supervision(cls, data, ds)
    train_data = TrainData.from_dataset(ds)
    refuse_too_few_normals(cls, train_data, ds.normal, data)
    held = np.zeros(0, dtype=np.int64)
    probe_data = None
    skipped = None  # why abnormal cells were given and none held back
    if cls.one_class:  # abnormal cells beside the normals: held back to choose the ranking
        keep, held = holdout_split(ds, train_data.labels, cfg.holdout)
        labels = train_data.labels
        if not len(held) and labels is not None and (labels == 1).any():
            skipped = {"normal_cells": int((labels == 0).sum()), "holdout": cfg.holdout}
        if len(held):
            all_data = train_data
            probe_data = train_data.subset(keep[train_data.labels[keep] == 0])
            normals = np.flatnonzero(train_data.labels == 0)
            train_data = train_data.subset(normals) if cfg.refit else probe_data
    if not cls.instance_labels:
        # weakly supervised: the method, its calibration and its manifest never see them
        train_data = dataclasses.replace(train_data, labels=None)
    # one run at a time trains into OUT: a second one is refused now (exit 3), never after
    # training to the end into the first one's checkpoints
    refused = False
    try:
        with OutputLock(ckpt, "cyto train"):
            refuse_to_replace(out, replaces, known=bundle_names(out))  # written meanwhile?
            start_checkpoints(
                ckpt, run_key(method, cfg, train_data, weights), resume, overwrite and out.exists()
            )
            if resume and echo is not None:  # it went straight on, unsaid (hostile round 57, 7)
                echo(f"resume: {resumed_words(ckpt)}")
            t0 = time.perf_counter()
            chosen = None
            try:
                if probe_data is not None:  # the held-out model: it ranks the held-back cells
                    probe = cls(cfg).fit(
                        probe_data,
                        device=dev,
                        ckpt_dir=ckpt / "held-out",
                        resume=resume,
                        weights=weights,
                    )
                    chosen = validation(
                        probe, ds, all_data, held, cfg.stain, held_mpp(cfg, ds, all_data)
                    )
                    if echo is not None:
                        from cyto.data.morphometry import choose_ranking

                        how, why = choose_ranking(chosen)
                        again = "; training again on every normal cell" if cfg.refit else ""
                        echo(f"{why}: {passing('rank_by', 'auto')} ranks by {how}{again}")
                model = (
                    probe
                    if probe_data is not None and not cfg.refit
                    else cls(cfg).fit(
                        train_data, device=dev, ckpt_dir=ckpt, resume=resume, weights=weights
                    )
                )
            except BaseException as exc:  # Ctrl-C or an error: say what a rerun with --resume finds
                if out_of_memory(exc):  # a rerun does the same: the sizes that take memory named
                    lower = " or ".join(setting(k) for k in ("batch_size", "input_size"))
                    raise TrainingError(f"out of memory training {method}: lower {lower}") from exc
                if isinstance(exc, CytoError):  # a refusal, or a failure that other settings or
                    # data answer (a loss gone to NaN, collapsed scores): nothing --resume continues
                    # (its words said "stopped ... rerun with --resume": hostile round 39, 6)
                    refused = True
                    raise
                if echo is not None:
                    stop = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped"
                    echo(f"{stop}: {checkpoint_words(ckpt)}")
                raise
            seconds = time.perf_counter() - t0
            manifest, tensors, scorer = model.bundle_parts(train_data)
            side = patch_px(ds)
            crop_mpp = held_mpp(
                cfg, ds, train_data
            )  # the crops' pixel size, as ModelSpec.crop_mpp reads
            manifest["training_data"].update(
                {
                    # absolute: export finds its golden cells here from any folder, and a
                    # bundle read elsewhere names where it was trained (hostile round 56, 9)
                    "source": str(Path(data).absolute()),
                    "normal": list(ds.normal),
                    "abnormal": list(ds.abnormal),
                    "skipped_unreadable": len(ds.skipped),
                    "load_size": cfg.load_size,
                    "n_images": len(ds),  # with the cells held back
                    "held_back": int(len(held)),
                    # the training patches' own side: the crop cyto score cuts at the model's mpp
                    "patch_px": side,
                    **training_nuclei(train_data, cfg.stain, crop_mpp, cfg.mpp),
                    # the slides the normal cells were cut from (cyto data cells): never a
                    # calibration's
                    "slides": source_slides(data, [r for r in ds.records if r.cls in ds.normal]),
                }
            )
            if chosen is not None:
                manifest["validation"] = chosen | {"refit": cfg.refit}
            elif skipped is not None:  # abnormal cells given, none held back: why, recorded
                manifest["validation"] = {"skipped": skipped}
            manifest["calibration"] = normal_calibration(model, train_data)
            manifest["training_seconds"] = round(seconds, 2)
            manifest["device"] = str(dev)
            if weights is not None:
                manifest["initial_weights"] = str(weights)
            manifest.update(extra_manifest or {})
            # every image read from DATA: those trained on, and the held-back cells that chose
            # the ranking (cyto predict says which of the images it scores are among them), by
            # their files' bytes and their decoded pixels (the same cell saved again losslessly)
            keys = cell_keys([*ds.digests, *ds.pixels])
            save_bundle(out, manifest, tensors, scorer, overwrite=overwrite, cells=keys)
    except CytoError:
        if refused and not resume:  # the checkpoints this run started keep nothing of use
            shutil.rmtree(ckpt, ignore_errors=True)  # after the lock: its file is in the folder
        raise
    from cyto.data.morphometry import PAP_MEASURED, few_abnormal_words, unfitted_words

    said_notes = [
        *unfitted_words(manifest["training_data"]),
        few_abnormal_words(
            manifest.get("validation"),
            cfg.stain,
            bool(manifest["training_data"].get("morphometry")),
            not ds.abnormal,
        ),
    ]
    notes = tuple(n for n in said_notes if n)
    for line in notes if echo is not None else ():
        echo(f"warning: {line}")
    # nothing held back to choose a ranking: a Pap bundle's line is among the warnings above
    pap_said = any(PAP_MEASURED in n for n in notes)
    if echo is not None and cls.one_class and cfg.holdout > 0 and not ds.abnormal and not pap_said:
        echo(f"note: {nothing_held_back_words(cfg.stain)}")
    shutil.rmtree(ckpt, ignore_errors=True)  # after the lock: its file is in the folder
    n_used = manifest["training_data"]["n_used"]
    return TrainResult(
        out,
        method,
        cfg,
        seconds,
        len(ds),
        n_used,
        model.history_,
        getattr(model, "bag_check_", None),
        manifest.get("validation"),
        notes,
    )
