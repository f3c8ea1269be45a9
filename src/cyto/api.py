"""The public Python API: the calls for notebooks and scripts, re-exported by :mod:`cyto`.

``cyto.load_model``, ``cyto.score_slide``, ``cyto.train``, ``cyto.export``, ``cyto.predict``,
``cyto.info``, ``cyto.calibrate``, ``cyto.evaluate`` and ``cyto.synth_slide`` are the stable
names; the ``cyto`` commands call the same library functions underneath. Each call imports what
it needs when it runs, so ``import cyto`` stays light.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from cyto.errors import CytoWarning, WarningLine, warn_caller
from cyto.flags import Local, Mpp, Range, Seed, Share, SlideSide

#: a model bundle is a folder on this machine
BUNDLE = Local("a model bundle folder: copy it to this machine first")

if TYPE_CHECKING:  # for the annotations only: nothing heavy is imported at run time
    import pyarrow as pa

    from cyto.runtime.scorer import Scorer
    from cyto.train.api import TrainResult


#: class names as a Python caller gives them: one, comma-separated as the commands take them, or
#: a list (``"NILM"``, ``"ASC-US,LSIL"``, ``["ASC-US", "LSIL"]``); a list was refused "(one per
#: call)" (hostile round 26, 11)
Classes = str | Sequence[str] | None


def _classes(field: str, value: Classes) -> str | None:
    """Class names as the library takes them (comma-separated): a list's items joined, each
    one name (a comma inside one, or an empty list, refused in the caller's words)."""
    if value is None or isinstance(value, str):
        return value
    from cyto.errors import ConfigError
    from cyto.flags import said

    if not value:
        raise ConfigError(f"{said(field)} names no class, got []: give one or more class names")
    for name in value:
        if "," in name:
            raise ConfigError(
                f"each item of {said(field)} is one class name, got {name!r}: give "
                f"{name.split(',')} as items of the list, or the string {name!r}"
            )
    return ",".join(value)


def _front_door(func: Callable) -> Callable:
    """A public call checks its arguments once, on the way in, through the schema the CLI uses
    (:mod:`cyto.flags`): a wrong count, an unknown keyword or a value of the wrong type is one
    :class:`~cyto.errors.ConfigError` line, never Python's ``TypeError`` from deep inside; and
    every message raised inside names options as a Python caller writes them (``top_k=``, not
    ``--top-k``). ``echo=None`` silences its progress bars too (:func:`cyto.progress.quiet`):
    "None: nowhere" left them on stderr (hostile round 26, 5)."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return _through(func, args, kwargs)
        except KeyboardInterrupt:  # a later call imports again what this one left half-way
            from cyto.interrupts import forget_broken_imports

            forget_broken_imports()
            raise

    call.__signature__ = _plain_signature(func)  # type: ignore[attr-defined]
    return call


def _plain_signature(func: Callable) -> inspect.Signature:
    """``func``'s signature as ``help()`` and ``inspect.signature`` show it: each
    ``Annotated[T, ...]`` as ``T`` (help(cyto.predict) printed the checks' own metadata,
    ``Annotated[str | Path, Local('a folder of cells or a manifest: copy it here first')]``).
    The checks read the function's own annotations (:func:`cyto.flags.hints_of`), untouched."""
    sig = inspect.signature(func)
    return sig.replace(
        parameters=[p.replace(annotation=_bare(p.annotation)) for p in sig.parameters.values()],
        return_annotation=_bare(sig.return_annotation),
    )


def _bare(annotation: Any) -> Any:
    """An annotation's text with every ``Annotated[T, ...]`` cut to ``T`` (an annotation that
    is no text, as it is under ``from __future__ import annotations``, as it is)."""
    if not isinstance(annotation, str):
        return annotation
    text, head = annotation, "Annotated["
    while head in text:
        start = text.index(head)
        depth, i, comma = 0, start + len(head), None
        while i < len(text):
            c = text[i]
            if c in "[(":
                depth += 1
            elif c in "])":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0 and comma is None:
                comma = i
            i += 1
        inner = text[start + len(head) : comma if comma is not None else i].strip()
        text = text[:start] + inner + text[i + 1 :]
    return re.sub(r"\b[A-Z]\w*\b", _alias_text, text)


def _alias_text(name: re.Match) -> str:
    """A type alias of this module's annotations as what it takes: ``Mpp`` as ``float``,
    ``Classes`` as ``str | Sequence[str] | None`` (help() showed ``Mpp``, ``Share``, ``Seed``,
    names a reader cannot look up: hostile round 64, 9); a class keeps its name."""
    value = globals().get(name.group(0))
    if typing.get_origin(value) is typing.Annotated:
        value = typing.get_args(value)[0]
    elif not isinstance(value, types.UnionType):
        return name.group(0)
    text = value.__name__ if isinstance(value, type) else repr(value)
    return text.replace("collections.abc.", "").replace("typing.", "").replace("NoneType", "None")


def _through(func: Callable, args: tuple, kwargs: dict) -> Any:
    """:func:`_front_door`'s call of ``func``."""
    from cyto.envvars import check_switches
    from cyto.errors import CytoError
    from cyto.flags import bind_call, hints_of, python_words
    from cyto.location import local_args, refuse_unusable_cache, urls_for_staging
    from cyto.runtime.scorer import Scorer

    with python_words(func.__name__):
        bound = bind_call(func, args, kwargs, {"Scorer": Scorer})
        check_switches()  # CYTO_DEBUG=true: one line, not passed over (round 45, 11)
        refuse_unusable_cache()
        # a URL for an argument that takes a local path only, refused by name before it
        # is turned into a path (https:/host/...) and reported missing; ~ the home folder
        local = local_args(bound.arguments, hints_of(func, {"Scorer": Scorer}))
        bound.arguments.update(local)
        if "out" in local:  # the folder above a local output takes it, before any work
            from cyto.flags import passing
            from cyto.outputs_check import check_output

            check_output(local["out"], flag=f"{passing('out', Path(local['out']))}:")
        from cyto.cachedir import places_of
        from cyto.errors import PLACES
        from cyto.progress import quiet, through

        echo = bound.arguments.get("echo", print)
        silent = "echo" in bound.arguments and echo is None
        # where a full disk that names no file is looked for: the call's local paths
        given = [*map(Path, local.values()), *bound.arguments.values()]
        places = PLACES.set(places_of(given))
        try:
            # a caller's own echo (a logger) gets the progress lines too; print: stderr's
            with quiet(silent), through(None if echo is print else echo):
                return func(*bound.args, **bound.kwargs)
        except CytoError as exc:  # a staging folder named as the prefix it stands for
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (urls_for_staging(exc.args[0]), *exc.args[1:])
            raise
        except OSError as exc:  # the machine's, as the CLI says it (a name too long)
            from cyto.errors import PathError, system_words

            words = system_words(exc)
            if words is None:
                raise
            raise PathError(words) from exc
        finally:
            PLACES.reset(places)


def _options(call: str, given: dict[str, Any], target: Callable, named: Sequence[str]) -> dict:
    """The ``**options`` of a public call held to the parameters of the library function that
    takes them (``named``: those the call takes by name itself, not again as options)."""
    from cyto.flags import check_options, hints_of

    hints = {k: v for k, v in hints_of(target).items() if k not in named}
    return check_options(call, given, hints)


@_front_door
def load_model(
    path: Annotated[str | Path, BUNDLE],
    backend: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    *,
    threads: Annotated[int | None, Range(0, 1024, "0 or None: the backend's default")] = None,
    verify: bool = True,
    echo: Callable[[str], None] | None = print,
) -> Scorer:
    """Load a model bundle as a scorer, verified on this machine before it is returned.

    The chosen graph or engine first scores the bundle's golden cells here and must reproduce
    their reference scores; a backend or precision that fails is refused with the numbers
    (:class:`cyto.errors.VerificationError`).

    Args:
        path: the bundle folder (``dsvdd.cyto/``), as ``cyto train`` wrote it.
        backend: ``auto`` (the fastest choice that passes here), ``onnx``, ``onnx-trt``,
            ``openvino``, ``trt`` or ``torch``.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``. Asking for a GPU that is absent is an
            error, never a silent fall-back to the CPU.
        precision: ``auto`` (the fastest that passes verification here: bf16 on a CPU with
            AMX or AVX512-BF16, whatever the export), ``fp32`` (exact fp32: the same scores on
            every machine), ``fp16``, ``bf16`` (OpenVINO on a CPU with AMX or AVX512-BF16) or
            ``int8``.
        threads: CPU threads of the backend (None: its default).
        verify: False skips the check on the golden cells (recorded in
            ``scorer.verification``).
        echo: where the lines ``cyto score`` says of the model go (None: nowhere): each choice
            passed over and why (a graph that failed verification here), what was chosen, the
            verification's outcome; they are in ``scorer.notes`` too.

    Returns:
        A :class:`cyto.runtime.Scorer`: ``scorer.score(patches)`` takes uint8 (N, H, W, 3)
        patches and returns (N,) float64 scores, higher = more abnormal.

    Example:
        >>> import numpy as np, cyto
        >>> with cyto.load_model("dsvdd.cyto", backend="onnx", device="cpu") as scorer:
        ...     scores = scorer.score(np.zeros((4, 64, 64, 3), np.uint8))

        The scorer holds its engine's session and memory until ``close()`` (or the end of its
        ``with`` block); it is given to :func:`score_slide` and :func:`predict` in place of a
        path, loaded once for many slides.
    """
    from cyto.runtime import load_scorer
    from cyto.runtime.scorer import choice_lines

    scorer = load_scorer(Path(path), backend, device, precision, threads=threads, verify=verify)
    said = _said(echo)
    # the verification line says an unverified graph's reason: the CytoWarning below, which
    # says it too, may be silenced by the caller
    for line in choice_lines(scorer, warned_beside=False):
        said(line)
    # a scorer whose graph nothing checked here (a bundle without golden cells) was handed back
    # unsaid, where cyto score, score_slide and predict warn (hostile round 53, 3)
    unverified = scorer.verification.warning(scorer.bundle.where) if scorer.verification else None
    if unverified:
        warn_caller(unverified, CytoWarning)
    return scorer


@_front_door
def score_slide(
    slide: str | Path,
    model: Annotated[str | Path | Scorer, BUNDLE],
    out: str | Path,
    *,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    download: bool = False,
    echo: Callable[[str], None] | None = print,
    **options: Any,
) -> pa.Table:
    """Score every cell of one whole-slide image; returns its score table.

    Writes ``out/`` as ``cyto score`` does (``scores.parquet``, the top-K table and mosaics,
    ``summary.json``, and the error-controlled flags when the bundle is calibrated).

    Args:
        slide: the slide file (``.ndpi``, ``.svs``, ``.tif``, ...), or its URL (``s3://``,
            ``gs://``, ``https://``: read in place; a series in a DICOM archive:
            ``dicomweb+https://SERVER/PREFIX/studies/STUDY_UID/series/SERIES_UID``;
            docs/how-to/remote-slides.md).
        model: a bundle path, or a scorer from :func:`load_model` (loaded once, reused across
            slides).
        out: the output folder of this slide itself (one writer per folder; ``cyto score
            --out`` names the folder that holds one per slide), or a prefix in object
            storage (``s3://bucket/scored/slide/``: written through a staging folder in cyto's
            cache, each file uploaded whole, ``seal.json`` last; credentials from the
            standard AWS variables and profiles).
        overwrite: score again into an ``out`` that holds finished results (of this slide or
            another); without it (or ``resume=True``, which keeps this slide's own results
            where they still hold, and refuses another slide's) such a folder is refused, as
            ``cyto score`` refuses it. Not with ``resume=True``.
        storage_options: fsspec's options of a remote slide's and ``out``'s stores
            (``--storage-option``): ``{"endpoint_url": "https://s3.lab.internal"}`` for an
            S3-compatible store, credentials; each store is given those its file system takes.
        download: read a remote slide in a format read from a local file (SVS, NDPI, DICOM
            files) through a copy in cyto's cache (``--download``).
        echo: where progress lines go (None: nowhere). What ``cyto score`` prints as a
            ``warning:`` line (scale, stain, adequacy, calibration) is a ``CytoWarning`` at
            the caller's line instead, whatever ``echo`` is.
        **options: any field of :class:`cyto.infer.options.ScoreOptions`, by its field name,
            which is mostly the ``cyto score`` flag without its dashes, but not always
            (``fdr_alpha=`` is ``--fdr``, ``slide_mpp=`` is ``--mpp``, ``verify=False`` is
            ``--skip-verify``; an unknown name is answered with the nearest field):
            ``top_k=400``, ``backend="onnx"``,
            ``device="cpu"``, ``precision="fp16"``, ``workers=0``, ``resume=True``,
            ``truth=Path("truth.parquet")``, ``rank_by="model"``, ``detection="pap"``
            (default ``auto``: the detection of the stain the model was trained on), ...

    Returns:
        The score table (a ``pyarrow.Table``, one row per cell: ``slide_id, cell_id, x, y,
        score, rank`` and more; ``.to_pandas()`` converts it where pandas is installed). Its
        schema metadata names the model, the slide and the run.

    Example:
        >>> import cyto
        >>> table = cyto.score_slide("slide.ndpi", "dsvdd.cyto", "scored/slide", top_k=100)
        >>> top = table.sort_by("rank").slice(0, 10).to_pylist()  # the ten most abnormal cells
    """
    import json
    from dataclasses import replace

    import pyarrow.parquet as pq

    from cyto.cohort.local import check_inputs, score_one, unforeseen
    from cyto.cohort.run import refuse_finished, refuse_resume_and_overwrite
    from cyto.detect.params import DETECTION_CHOICES
    from cyto.errors import ConfigError, out_of_memory
    from cyto.flags import hints_of
    from cyto.infer.options import ScoreOptions, detection_for
    from cyto.infer.outputs import read_truth
    from cyto.infer.pipeline import score_slide as run
    from cyto.location import local_args, output_location
    from cyto.runtime import Scorer, load_scorer
    from cyto.slides.remote import slide_ref

    # every option checked (name, type, range) before any file is read; detection by kind
    # name, as cyto score takes it (default auto: the model's stain's, known once it is read)
    kind = options.get("detection", "auto")
    if not isinstance(kind, str) and type(kind).__name__ != "NucleusParams":
        raise ConfigError(
            f"detection= must be one of {', '.join(DETECTION_CHOICES)} (the kind of cells), "
            f"got {kind!r}"
        )
    if isinstance(kind, str):
        options.pop("detection", None)
        if kind != "auto":
            options["detection"] = detection_for(kind, None)
    options.update(local_args(options, hints_of(ScoreOptions)))  # truth=, nuclei=: local
    opts = ScoreOptions(**_options("score_slide", options, ScoreOptions, ()))
    # a loaded scorer's own backend, device and precision: what runs is what is recorded
    opts = replace(
        opts,
        **_scorer_runs(
            model, {"backend": opts.backend, "device": opts.device, "precision": opts.precision}
        ),
    )
    if isinstance(model, Scorer) and model._closed:  # before the slide is read (it was after)
        from cyto.runtime.scorer import CLOSED

        raise ConfigError(CLOSED)
    refuse_resume_and_overwrite(opts.resume, overwrite)
    if opts.truth is not None:  # a bad truth table costs nothing: read before the slide, as
        read_truth(opts.truth)  # cyto score reads it (it was read after the slide was scored)
    # a folder, or a prefix in object storage, as cyto score --out takes it (cyto.location):
    # the prefix's files are pulled where they are checked, and published when scored
    from cyto.slides.remote import refuse_unknown_options

    refuse_unknown_options(storage_options or {})
    where = output_location(out, storage_options or None)
    where.check()
    slide = slide_ref(slide, storage_options or None, download)
    if not where.is_remote:  # never the model bundle nor inside it (as cyto score)
        check_inputs(where.local, opts, model if isinstance(model, Scorer) else Path(model))
        if overwrite:  # a review cut from the results about to be replaced: said
            from cyto.view.folder import rescoring_words

            for line in rescoring_words([where.local]):
                warn_caller(line, CytoWarning)
    with where.writing():
        # a folder holding finished results (this slide's or another's) is not scored over
        # unasked; resume keeps this slide's, never another's
        resumed = slide if opts.resume else None
        refuse_finished(where.local, Path(str(slide)).name, overwrite, resumed)
        model = model if not isinstance(model, str) else Path(model)
        if kind == "auto":
            opts = replace(opts, detection=detection_for(kind, model))
        # a URL (s3://, https://) is read in place, as by cyto score (cyto.slides.remote)
        said = _said(echo)
        from cyto.eval.metrics import truth_metrics

        metrics = truth_metrics(opts.truth)  # the truth report's metrics, as cyto score's

        def words(message: str) -> None:
            line = where.words(message)  # the staging folder's paths said as the prefix's
            kind = getattr(message, "category", None)
            said(line if kind is None else WarningLine(line, kind))

        try:
            if opts.resume:
                # a finished folder is reused, or scored again saying why, by cyto score's own
                # rule (cyto.cohort.local.finished_summary); it needs the model loaded to compare
                if not isinstance(model, Scorer):
                    model = load_scorer(
                        model, opts.backend, opts.device, opts.precision, verify=opts.verify
                    )
                score_one(slide, where.local, model, opts, words, metrics)
            else:
                run(slide, model, where.local, opts, echo=words, metrics=metrics)
        except Exception as exc:  # out of memory: said as cyto score says it, sizes named
            if not out_of_memory(exc):
                raise
            raise unforeseen(Path(str(slide)), exc) from exc
        table = pq.read_table(where.local / "scores.parquet")
        if opts.resume and not where.is_remote:  # a review whose cells this run changed
            from cyto.view.folder import replaced_words

            for line in replaced_words([where.local]):
                warn_caller(line, CytoWarning)
        # what the slide's summary records of auto's choice, warned as cyto score says it
        summary = json.loads((where.local / "summary.json").read_text())
    uploaded = where.uploaded_words(Path(str(slide)).name)
    if uploaded:
        said(uploaded)
    caution = summary.get("rank_by_caution")
    if caution is not None:  # a reused folder's line is in the words of the run that scored it
        from cyto.infer.options import check_rank_by  # (cyto score's): said in this caller's

        caution = check_rank_by(model, opts.rank_by) or caution
    _rank_by_caution(caution)
    _unverified(summary.get("verification"), model)
    return table


def _unverified(record: dict | None, model) -> None:
    """Scores from a graph nothing checked on this machine (a bundle without golden cells),
    warned to a Python caller as `cyto score` prints it (it was said nowhere from Python:
    hostile round 26, 8)."""
    from cyto.runtime.verify import Verification

    if isinstance(record, dict) and record.get("status") == "unverified":
        path = model.bundle.where if hasattr(model, "bundle") else model
        warn_caller(Verification("unverified", str(record.get("why", ""))).warning(path))


def _said(
    echo: Callable[[str], None] | None, kept: list[str] | None = None
) -> Callable[[str], None]:
    """The ``echo`` a library call hands its command's code: a ``warning:`` line is a
    ``CytoWarning`` at the caller's line (as :func:`predict`'s are), whatever ``echo`` is, and
    every other line goes to ``echo`` (None: nowhere). One rule for every call of this module
    that takes ``echo`` (:func:`score_slide`, :func:`train`, :func:`export`, :func:`predict`):
    with ``echo=None`` a slide's scale, stain and adequacy
    warnings were nowhere but in its summary.json (hostile round 21), and a training's and an
    export's were nowhere at all. ``kept``: the ``note:`` and ``warning:`` lines are also kept
    there, without their prefix, for the call's answer (:func:`synth_slide`'s ``notes``)."""
    quiet = echo or (lambda _line: None)

    def said(line: str) -> None:
        if kept is not None and line.startswith(("note: ", "warning: ")):
            kept.append(str(line).split(": ", 1)[1])
        if line.startswith("warning: "):  # its own category where it knows it
            kind = getattr(line, "category", CytoWarning)
            warn_caller(str(line)[len("warning: ") :], kind)
        else:
            quiet(line)

    return said


def _rank_by_caution(line: str | None) -> None:
    """``rank_by='auto'``'s choice resting on too few held-back abnormal cells
    (:func:`cyto.data.morphometry.few_abnormal_words`), warned to a Python caller as the
    command line says it."""
    if line is not None:
        from cyto.errors import warn_caller

        warn_caller(line)  # at the caller's own line


def _scorer_runs(model: object, asked: dict[str, str]) -> dict[str, str]:
    """What a loaded scorer runs on (``backend``, ``device``, ``precision``), when ``model`` is
    one; ``asked`` as given otherwise. A scorer given with another backend, device or precision
    asked is refused in one line: they are the scorer's, set when it was loaded, and ignoring
    them recorded settings that did not run."""
    from cyto.errors import ConfigError
    from cyto.runtime.scorer import Scorer

    if not isinstance(model, Scorer):
        return asked
    runs = {"backend": model.backend.name, "device": model.device, "precision": model.precision}
    for key, value in asked.items():
        if value in (None, "auto") or value == runs[key]:
            continue
        if key == "device" and value == "cuda" and runs[key].startswith("cuda"):
            continue
        raise ConfigError(
            f"{key}={value!r} does not apply to a loaded scorer: it runs {runs['backend']} on "
            f"{runs['device']} in {runs['precision']}; load_model(..., {key}={value!r}) for that"
        )
    return runs


@_front_door
def train(
    method: str,
    data: Annotated[str | Path, Local("a folder of cells or a manifest: copy it here first")],
    out: Annotated[str | Path, Local("the bundle to write: cyto train writes a local folder")],
    *,
    normal: Classes = None,
    abnormal: Classes = None,
    preset: str | None = None,
    config_file: Annotated[str | Path | None, Local("a config file: copy it here first")] = None,
    overrides: dict[str, Any] | None = None,
    device: str = "auto",
    resume: bool = False,
    weights: Annotated[str | Path | None, Local("a weights file: copy it here first")] = None,
    skip_unreadable: bool = False,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train a registered method on a patch folder or manifest and write its model bundle.

    Args:
        method: ``dsvdd``, ``droc``, ``its2clr``, ``fs-sil`` or ``ws-sil`` (see the config
            reference for each method's settings and presets).
        data: a class-folder dataset (``data/normal/*.jpg``, ``data/ABN/*.jpg``) or a CSV
            manifest (``path,label[,bag]``), on this machine (a URL is refused).
        out: the bundle to write (``dsvdd.cyto``).
        normal: the normal class name(s), comma-separated or a list; the one-class methods
            learn from these only.
        abnormal: the abnormal class name(s), comma-separated or a list (default: every class
            that is not normal).
        preset: a named preset of the method's config (e.g. ``fast``).
        config_file: a TOML or YAML file of config fields.
        overrides: config fields that win over the preset and the file (``{"epochs": 5}``).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        resume: continue an interrupted run from its per-epoch state (replacing ``out`` only
            where that run was started with ``overwrite``). Not with ``overwrite=True``.
        weights: initial encoder weights (a ``.safetensors`` file).
        skip_unreadable: leave out images that cannot be decoded instead of failing.
        overwrite: replace an existing ``out``.
        echo: where the lines said while training go (None: nowhere): the ranking
            ``rank_by='auto'`` takes. What ``cyto train`` prints as a ``warning:`` line (what
            could not be fitted on the normal cells, a ranking chosen on too few abnormal
            cells) is a ``CytoWarning`` at the caller's line instead, whatever ``echo`` is.

    Returns:
        A ``TrainResult``: ``bundle`` (its path), ``method``, ``config``, ``seconds``,
        ``n_images``, ``n_used``, the loss ``history``, and ``notes``: what could not be
        fitted on the normal cells, or a ranking chosen on too few abnormal cells.

    Example:
        >>> import cyto
        >>> res = cyto.train("dsvdd", "cells/", "dsvdd.cyto", normal="normal", preset="fast")
        >>> res.bundle
        PosixPath('dsvdd.cyto')
    """
    from cyto.train.api import train as run

    return run(
        method,
        Path(data),
        Path(out),
        normal=_classes("normal", normal),
        abnormal=_classes("abnormal", abnormal),
        preset=preset,
        config_file=None if config_file is None else Path(config_file),
        overrides=overrides,
        device=device,
        resume=resume,
        weights=None if weights is None else Path(weights),
        skip_unreadable=skip_unreadable,
        overwrite=overwrite,
        echo=_said(echo),
    )


@_front_door
def export(
    bundle: Annotated[str | Path, BUNDLE],
    *,
    precisions: str | Sequence[str] = ("fp32",),
    trt: bool = False,
    calib: Annotated[str | Path | None, Local("calibration cells: copy them here first")] = None,
    calib_class: str | None = None,
    device: str = "cuda",
    echo: Callable[[str], None] | None = print,
    **options: Any,
) -> dict[str, Any]:
    """Export a bundle for inference and check every artifact against PyTorch / fp32.

    Writes ``encoder.onnx`` (uint8 patches in), the golden cells with their reference scores,
    and the reduced-precision graphs and TensorRT engines asked for, each with its parity report.

    Args:
        bundle: the bundle folder to export into.
        precisions: the graphs to make: ``fp32`` (always), ``fp16``, ``int8``; a list or a
            comma-separated string.
        trt: also build a TensorRT engine per precision (needs a GPU and the ``gpu`` extra).
        calib: real cells of the kind the model scores, to calibrate ``int8`` on (required
            for it).
        calib_class: the class folder of ``calib`` to use.
        device: the GPU the TensorRT engines are built on (only with ``trt``).
        echo: where progress lines go (None: nowhere). What ``cyto export`` prints as a
            ``warning:`` line (a graph that breaks TensorRT's import rules) is a
            ``CytoWarning`` at the caller's line instead, whatever ``echo`` is.
        **options: the other settings of ``cyto export``: ``cells`` (golden-cell source),
            ``calib_method``, ``calib_limit``, ``parity_cells``, ``parity_normal``,
            ``accept_parity_loss``, ``int8_keep_float``, ``batch``, ``opset``, ``onnx``.

    Returns:
        The export report (a dict), e.g. ``onnx_parity_max_rel``, the largest relative
        difference between ONNX Runtime's and PyTorch's scores on the golden cells.

    Example:
        >>> import cyto
        >>> report = cyto.export("dsvdd.cyto", precisions="fp32,fp16")
        >>> report["onnx_parity_max_rel"] < 1e-3
        True
    """
    from cyto.export.api import export_bundle
    from cyto.flags import comma_list, hints_of
    from cyto.location import local_args

    named = ("path", "trt", "precisions", "calib", "calib_class", "device", "echo")
    options.update(local_args(options, hints_of(export_bundle)))  # cells=, parity_cells=
    options = _options("export", options, export_bundle, named)
    if isinstance(precisions, str):
        precisions = list(comma_list(precisions, "precisions"))
    return export_bundle(
        Path(bundle),
        trt=trt,
        precisions=tuple(precisions),
        calib=None if calib is None else Path(calib),
        calib_class=calib_class,
        device=device,
        echo=_said(echo),
        **options,
    )


@_front_door
def predict(
    model: Annotated[str | Path | Scorer, BUNDLE],
    data: Annotated[str | Path, Local("a folder of cells or a manifest: copy it here first")],
    out: Annotated[str | Path, Local("the table to write: cyto predict writes a local file")],
    *,
    normal: Classes = None,
    abnormal: Classes = None,
    backend: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    batch_size: int = 128,
    rank_by: str = "auto",
    overwrite: bool = False,
    echo: Callable[[str], None] | None = print,
    **options: Any,
) -> dict[str, Any]:
    """Score a folder (or CSV manifest) of cell patches into a Parquet table.

    Args:
        model: the bundle folder, or a scorer from :func:`load_model` (loaded once, reused
            across folders; ``backend``, ``device`` and ``precision`` are then its own).
        data: a class-folder dataset (one sub-folder of images per class), or a CSV or
            Parquet manifest (``path``, ``label``).
        out: the table to write (a name ending in ``.parquet``): ``path, class, score, rank``
            (1 = most abnormal), and ``label`` when ``normal`` is given.
        normal: the normal class name(s), comma-separated or a list; with them the summary has
            AUROC and Recall@K.
        abnormal: with ``normal``: the abnormal class name(s), comma-separated or a list
            (default: every class that is not normal; a class in neither is left out, said).
        backend: as for :func:`load_model`.
        device: as for :func:`load_model`.
        precision: as for :func:`load_model`.
        batch_size: patches per network call.
        rank_by: ``model``, ``morphometry``, ``model+morphometry`` or ``auto``.
        overwrite: replace an existing ``out``.
        echo: where progress lines go (None: nowhere).
        **options: the other settings of ``cyto predict``: ``zoom``, ``patch_mpp``,
            ``verify``, ``skip_unreadable``, ``chunk``, ``resume``.

    Returns:
        The summary (a dict): ``n`` (cells scored), ``out``, the ``backend`` and ``precision``
        that scored, its ``verification``, and ``auroc``, ``recall_at_k`` and ``k`` when the
        labels are known; ``left_out``: the crops of classes in neither ``normal`` nor
        ``abnormal``, by class; ``rank_by_caution``: the line warned (a ``CytoWarning``) when
        ``rank_by="auto"`` chose on too few held-back abnormal cells, else None.

    Example:
        >>> import cyto, pyarrow.parquet as pq
        >>> summary = cyto.predict("dsvdd.cyto", "cells/", "scores.parquet", normal="normal")
        >>> top = pq.read_table(summary["out"]).sort_by("rank").slice(0, 5).to_pylist()
    """
    from cyto.predict import predict as run

    named = (
        "model", "data", "out", "normal", "abnormal", "backend", "device", "precision",
        "batch_size", "rank_by", "overwrite", "echo",
    )  # fmt: skip
    options = _options("predict", options, run, named)
    runs = _scorer_runs(model, {"backend": backend, "device": device, "precision": precision})
    backend, device, precision = runs["backend"], runs["device"], runs["precision"]
    res = run(
        model if not isinstance(model, str) else Path(model),
        Path(data),
        Path(out),
        normal=_classes("normal", normal),
        abnormal=_classes("abnormal", abnormal),
        backend=backend,
        device=device,
        precision=precision,
        batch_size=batch_size,
        rank_by=rank_by,
        overwrite=overwrite,
        echo=_said(echo),
        **options,
    )
    _rank_by_caution(res.get("rank_by_caution"))  # cyto predict prints it beside its ranking
    return res


@_front_door
def info(model: Annotated[str | Path | Scorer, BUNDLE]) -> dict[str, Any]:
    """What a model bundle is, read with every checksum verified (``cyto info``).

    Args:
        model: the bundle folder (``NAME.cyto``), or a scorer from :func:`load_model`: the
            bundle it loaded (and verified), whatever its folder holds now.

    Returns:
        A dict: ``path`` (the bundle, absolute), ``manifest`` (its manifest: method, input
        size, training data, ``validation``: how the model, the morphometric score and their
        fusion ranked held-back cells), ``rank_by_auto`` (what ``rank_by="auto"`` ranks by:
        ``model``, ``morphometry`` or ``model+morphometry``), ``rank_by_reason`` (why, in
        words) and ``warnings`` (each a line: what training could not fit, a doubted pixel
        size, a choice resting on too few held-back cells).

    Example:
        >>> import cyto
        >>> about = cyto.info("pap.cyto")
        >>> about["rank_by_auto"], about["warnings"]
    """
    from cyto.bundle import verify_bundle
    from cyto.data.morphometry import ranking_said
    from cyto.runtime.scorer import Scorer

    if isinstance(model, Scorer):  # the model that scores: the folder may hold another since
        path, manifest = Path(model.bundle.recorded_path), copy.deepcopy(model.bundle.manifest)
    else:
        path = Path(model)
        manifest = verify_bundle(path)
    return {"path": str(path.resolve()), "manifest": manifest, **ranking_said(manifest)}


@_front_door
def calibrate(
    model: Annotated[str | Path, BUNDLE],
    tables: str | Path | Sequence[str | Path],
    *,
    normalize: str = "median",
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    echo: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Calibrate a model on slides known to be negative (``cyto calibrate``): every score of
    those slides kept in the bundle, for p-values, FDR flags and the abnormal burden of the
    slides :func:`score_slide` scores with it afterwards.

    Args:
        model: the bundle folder to calibrate (``NAME.cyto``); the bundle the slides were
            scored with.
        tables: the slide-negative slides' ``scores.parquet``, or their :func:`score_slide`
            folders: one per slide, a path or a URL (``s3://BUCKET/OUT/SLIDE``, ``gs://...``),
            one or a list. Never a cohort's folder: every slide given is taken as negative.
        normalize: how each slide's scores are centred: ``median`` (its own median: absorbs
            stain shifts between slides), ``median-iqr`` (also divided by its IQR) or
            ``none`` (raw scores).
        overwrite: replace the bundle's calibration if it has one.
        storage_options: fsspec's options of the stores of tables given by URL
            (``--storage-option``).
        echo: where the lines ``cyto calibrate`` prints go (None: nowhere).

    Returns:
        The calibration the bundle now records (its manifest's ``calibration``): ``n`` (cells
        held), ``normalization``, ``column`` (the score held), ``slides`` (each slide's cells,
        median and IQR), ``quantiles``, ``leave_one_slide_out`` (each normal slide tested
        against the others), ``valid_for`` (the model, graph and options it holds for), ...,
        and ``lines``: what ``cyto calibrate`` prints (each a line, said to ``echo`` too).

    Example:
        >>> import cyto
        >>> for name in ("n1", "n2", "n3"):
        ...     cyto.score_slide(f"negatives/{name}.ndpi", "dsvdd.cyto", f"neg/{name}")
        >>> cal = cyto.calibrate("dsvdd.cyto", ["neg/n1", "neg/n2", "neg/n3"])
        >>> cyto.score_slide("case.ndpi", "dsvdd.cyto", "scored/case", fdr_alpha=0.1)
    """
    from cyto.slides.remote import refuse_unknown_options
    from cyto.stats.calibrate import calibrate_from_tables, calibrated_lines

    refuse_unknown_options(storage_options or {})
    given = [tables] if isinstance(tables, (str, Path)) else list(tables)
    cal = calibrate_from_tables(
        Path(model),
        given,
        normalization=normalize,
        overwrite=overwrite,
        storage_options=storage_options or None,
    )
    lines, say = calibrated_lines(model, cal), _said(echo)
    for line in lines:
        say(line)
    return {**cal, "lines": lines}


@_front_door
def evaluate(
    table: str | Path,
    *,
    k: int | Sequence[int] = 400,
    score_column: str = "auto",
    label_column: str = "label",
    by_class: bool = False,
    class_column: str = "class",
    normal: Classes = None,
    echo: Callable[[str], None] | None = print,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The paper's metrics of a score table (``cyto eval scores``): TP@K, Recall@K,
    Precision@K, nDCG@K, AUTK@K, normalized AUFROC@K and AUROC; and each abnormal class against
    the normal classes (``by_class``).

    Args:
        table: a score table (Parquet or CSV; ``scores.parquet`` of ``cyto score``, the table
            of ``cyto predict``), one row per cell, or a slide's folder of ``cyto score`` (its
            ``scores.parquet``); a path, or the URL of a slide's folder or table that ``cyto
            score --out s3://...`` wrote (``s3://BUCKET/OUT/SLIDE``: read through its seal).
        k: K, or several.
        score_column: the column of scores (higher: more abnormal); ``auto``: what the table's
            ``rank`` follows (the ranking it records).
        label_column: the column of 0/1 labels (1: abnormal).
        by_class: also each abnormal class of ``class_column`` against the normal classes
            alone: its AUROC and Recall@K.
        class_column: the column of class names (with ``by_class``).
        normal: with ``by_class``: the normal class(es), comma-separated or a list (default:
            the classes whose rows are all labelled 0).
        echo: where notes go (which column was judged where the table does not say; None:
            nowhere).
        storage_options: fsspec's options of the store of a table given by URL
            (``--storage-option``).

    Returns:
        A dict: ``overall`` (one row per K: ``k``, ``n``, ``positives``, ``auroc``,
        ``tp_at_k``, ``recall_at_k``, ``precision_at_k``, ``ndcg_at_k``, ``autk_at_k``,
        ``aufroc_at_k`` and the ``score_column`` judged; None where the table has no label
        column and ``by_class`` judges its classes against ``normal``; without ``by_class`` a
        table without labels is refused) and ``by_class`` (one row per abnormal class:
        ``class``, ``normal``, ``n_normal``, ``n_class``, ``auroc`` and ``by_k``, its rows at
        each K; None unless ``by_class``) and ``notes`` (what the rows do not say: a K above
        the cells judged, ties across the K-th place, the column judged where the table does
        not record it; each a line, said to ``echo`` too).

    Example:
        >>> import cyto
        >>> done = cyto.evaluate("scored/slide/scores.parquet", k=[100, 400], by_class=True)
        >>> [(c["class"], c["auroc"]) for c in done["by_class"]]
    """
    from cyto.eval.scores import evaluate_scores

    ks = [k] if isinstance(k, int) else list(k)
    notes: list[str] = []  # what the rows do not say (K above a pool, ties), kept with echo=None
    if storage_options:
        from cyto.slides.remote import refuse_unknown_options

        refuse_unknown_options(storage_options)
    done = evaluate_scores(
        table, ks, score_column, label_column, by_class, class_column,
        _classes("normal", normal), _said(echo, notes), storage_options or None,
    )  # fmt: skip
    return {**done, "notes": notes}


@_front_door
def synth_slide(
    out: Annotated[str | Path, Local("the slide to write: a local file")],
    *,
    cells: Annotated[str | Path | None, Local("a folder of cell crops: copy it here first")] = None,
    normal: Classes = None,
    abnormal: Classes = None,
    mpp: Mpp | None = None,
    abnormal_fraction: Share = 0.01,
    width: SlideSide = 8192,
    height: SlideSide = 8192,
    n_cells: Annotated[int | None, Range(0)] = None,
    seed: Seed = 0,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = print,
    **options: Any,
) -> dict[str, Any]:
    """A whole slide with a known truth (``cyto synth slide``): composed from a folder of real
    cell crops (``cells``), or drawn.

    Args:
        out: the slide file to write: ``NAME.tif``, ``NAME.tiff`` or ``NAME.ndpi``; its truth
            is ``NAME.cells.parquet`` beside it.
        cells: a folder of cell crops, one sub-folder per class: ``normal``'s crops are the
            background population, the ``abnormal`` classes are planted at
            ``abnormal_fraction``. None: a slide of drawn cells.
        normal: with ``cells``: the normal class(es), comma-separated or a list.
        abnormal: with ``cells``: the classes to plant, comma-separated or a list (default:
            every other class).
        mpp: microns per pixel of the slide; with ``cells`` the crops' (required: crops do not
            state it).
        abnormal_fraction: the share of planted abnormal cells (the witness rate), 0..1.
        width: width in px, at least 512 (rounded up to a multiple of 512).
        height: height in px, at least 512 (rounded up to a multiple of 512).
        n_cells: nucleated cells (default: as many as fit, or one per 140x140 px of smear).
        seed: the same seed gives the same bytes; with another ``abnormal_fraction``, the same
            slide but for the cells planted.
        overwrite: replace an existing slide.
        echo: where notes go (None: nowhere).
        **options: the other settings of ``cyto synth slide``: ``fmt``, ``tile``, ``quality``,
            ``workers``; of a drawn slide only: ``classes``, ``planes``, ``scale``,
            ``defocus``, ``smear_extent``, ``stain_seed`` (the stain and illumination drawn
            from it: slides of one stain seed are one staining batch).

    Returns:
        A dict: ``slide`` (the file to score), ``paths`` (every file written: one per focal
        plane), ``truth`` (the truth table), ``size`` ([width, height] in px), ``levels``,
        ``n_cells``, ``n_abnormal`` and ``notes`` (what the slide holds that the numbers do not
        say, such as crops used more than once: each a line, said to ``echo`` too).

    Example:
        >>> import cyto
        >>> made = cyto.synth_slide("check.tif", cells="cric/", normal="NILM", mpp=0.258,
        ...                         width=4096, height=4096, abnormal_fraction=0.02)
        >>> cyto.score_slide(made["slide"], "pap.cyto", "scored/check", truth=made["truth"])
    """
    from cyto.data.synth.make import make_slide

    named = (
        "out", "cells", "normal", "abnormal", "mpp", "abnormal_fraction", "width", "height",
        "n_cells", "seed", "overwrite", "echo",
    )  # fmt: skip
    # the guard of a script's top level: at every size, once the arguments are checked
    # (write_pyramid)
    options = _options("synth_slide", options, make_slide, named)
    # what the slide holds that its numbers do not say (copies of a crop), kept with
    # echo=None too (round 28, 11)
    notes: list[str] = []
    res = make_slide(
        Path(out),
        cells=None if cells is None else Path(cells),
        normal=_classes("normal", normal),
        abnormal=_classes("abnormal", abnormal),
        mpp=mpp,
        abnormal_fraction=abnormal_fraction,
        width=width,
        height=height,
        n_cells=n_cells,
        seed=seed,
        overwrite=overwrite,
        echo=_said(echo, notes),
        **options,
    )
    return {
        "notes": notes,
        "slide": str(res.paths[0]),
        "paths": [str(p) for p in res.paths],
        "truth": str(res.ground_truth),
        "size": list(res.size),
        "levels": [list(level) for level in res.levels],
        "n_cells": int(res.n_cells),
        "n_abnormal": int(res.n_abnormal),
    }
