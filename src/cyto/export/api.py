"""``cyto export``: ONNX (always first), optional TensorRT engines, and a parity check of each."""

from __future__ import annotations

import contextlib
import functools
import inspect
import tempfile
from pathlib import Path
from typing import Annotated

from cyto.bundle import (
    ONNX_FILE,
    load_bundle,
    read_manifest,
    refuse_folders_in_place,
    rewriting,
    staged_files,
)
from cyto.data.dataset import load_records
from cyto.errors import ConfigError, CytoError
from cyto.export.conformance import problem_words
from cyto.export.onnx import OPSET, check_opset, export_onnx
from cyto.flags import Local, Range, check_value, passing, python_call, said
from cyto.outputs_check import check_writable, named_input

#: cells on this machine (a folder of class folders or a manifest), as each option names them
CELLS = "cells: a folder of class folders or a manifest: copy it here first"

#: the cells int8 is calibrated on, at most (its range: the schema's, for the CLI and Python alike)
CalibLimit = Annotated[int, Range(8, None, "quantization needs at least 8 cells")]

# layers int8 leaves in float by default, per scorer head: Deep SVDD's distance to the centre
# moves with every embedding coordinate; its embedding Gemm in float took the TensorRT form's
# parity gate from 2/3 to 3/3 splits (top-10% overlap 0.91 +- 0.04 -> 0.95 +- 0.04, 400 held-out
# bone-marrow cells, seeds 0-2) for 0.004% of ResNet18's multiply-adds
INT8_KEEP_FLOAT: dict[str, tuple[str, ...]] = {"dsvdd": ("Gemm",)}


@contextlib.contextmanager
def stopped_words(path: Path, echo):
    """On Ctrl-C (or an error) in an export, say what the bundle kept: every step that finished
    is sealed in it, the step in progress added nothing (:func:`cyto.bundle.staged_files`)."""
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            try:
                kept = sorted(load_bundle(Path(path), weights=False).manifest.get("files", {}))
            except CytoError:
                kept = []
            echo(
                f"interrupted: {path} keeps {', '.join(kept) or 'nothing new'} (each finished "
                "step is sealed; the one in progress added nothing): rerun the export to add the "
                "rest"
            )
        raise


def _repairing(export):
    """``export`` run on a bundle whose graphs it writes again may be damaged or missing
    (:func:`cyto.bundle.rewriting`): ``cyto export`` is the step that repairs them."""

    @functools.wraps(export)
    def run(*args, **kwargs):
        bound = inspect.signature(export).bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        try:
            manifest = read_manifest(Path(given["path"]))
        except (CytoError, OSError):
            manifest = None  # the export itself says what is wrong with the folder
        with rewriting(_rewritten(manifest, given["onnx"], given["precisions"])):
            return export(*bound.args, **bound.kwargs)

    return run


def _rewritten(manifest: dict | None, onnx: bool, precisions) -> set[str]:
    """The bundle files an export of ``precisions`` writes again (``onnx``: the fp32 graph and
    the golden cells that verify it; each quantized graph asked for, every int8 form)."""
    from cyto.bundle import _graph_entries
    from cyto.runtime.verify import GOLDEN_FILE

    if manifest is None:
        return set()
    names = {ONNX_FILE, GOLDEN_FILE} if onnx else set()
    asked = {p for p in precisions if p not in ("fp32", "bf16")}
    for key, entry in _graph_entries(manifest).items():
        made = str(entry.get("precision", key)).split("-")[0]  # int8-cpu: an int8 form
        if key != "fp32" and entry.get("file") and made in asked:
            names.add(entry["file"])
    return names


def check_export_choices(device: str, calib: Path | None, calib_class: str | None) -> None:
    """What ``cyto export`` and ``cyto.export`` would otherwise drop with no word: a device that
    is no device at all (``--device tpu``: only TensorRT uses it, and ran without it), and
    ``calib_class`` without the ``calib`` cells it picks from; one line each, in the caller's
    words, before the bundle is read."""
    from cyto.flags import Placeholder
    from cyto.runtime.devices import parse_device

    try:
        parse_device(device)
    except ConfigError as exc:
        raise ConfigError(
            f"{passing('device', device)} is not a GPU: TensorRT engines are built on cuda or "
            "cuda:N"
        ) from exc
    if calib_class is not None and calib is None:
        cells = passing("calib", Placeholder("CELLS"))
        raise ConfigError(
            f"{said('calib_class')} picks the classes of {said('calib')}, which is not given: "
            f"pass {cells} (cells to calibrate int8 on) or leave {said('calib_class')} out"
        )


@_repairing
def export_bundle(
    path: Path,
    onnx: bool = True,
    trt: bool = False,
    precisions: tuple[str, ...] = ("fp32",),
    cells: Annotated[Path | None, Local(CELLS)] = None,
    calib: Path | None = None,
    calib_class: str | None = None,
    calib_method: str = "percentile",
    calib_limit: CalibLimit = 512,
    parity_cells: Annotated[Path | None, Local(CELLS)] = None,
    parity_normal: str | None = None,
    accept_parity_loss: bool = False,
    int8_keep_float: tuple[str, ...] | None = None,
    batch: str = "1,64,256",
    device: str = "cuda",
    opset: int = OPSET,
    echo=print,
) -> dict:
    """Export ``path`` for inference and check every artifact against PyTorch / fp32.

    ``precisions`` lists the graphs to make beyond ``encoder.onnx`` (fp16, int8: see
    :mod:`cyto.export.quantize`) and, with ``trt``, the TensorRT engines to build (one per
    precision, from that precision's graph)."""
    from cyto.bundle import PRECISIONS
    from cyto.runtime import load_scorer
    from cyto.runtime.engines import BatchProfile

    path = Path(path)
    calib_limit = check_value("calib_limit", calib_limit, CalibLimit)
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise ConfigError(
            f"{said('precisions')} takes {', '.join(PRECISIONS)} (comma-separated), got "
            f"{','.join(bad) or 'none'}"  # as typed, never a Python list (hostile round 35, 5)
        )
    check_export_choices(device, calib, calib_class)
    if parity_normal is not None and parity_cells is None:  # accepted, and unused (round 60, 6)
        raise ConfigError(
            f"{said('parity_normal')} names the normal classes of {said('parity_cells')}: give "
            f"{said('parity_cells')} too, cells of normal and abnormal classes (the AUROC and "
            "Recall@K deltas are measured on them)"
        )
    if onnx:
        check_opset(opset)
    bundle = load_bundle(path, weights=False)
    # a bundle it cannot write to, said before the work (round 45, 17); MODEL, or bundle=
    given = named_input("BUNDLE" if python_call() else "MODEL", path)
    check_writable(bundle.path, flag=f"{given}:")
    refuse_folders_in_place(bundle.path, bundle.manifest["files"])  # so is a folder in the way
    if not onnx and ONNX_FILE not in bundle.manifest["files"]:
        raise ConfigError(f"{path} has no {ONNX_FILE}: export it first ({passing('onnx')})")
    if "int8" in precisions and calib is None:
        raise ConfigError(
            f"{passing('precisions', 'int8')} needs {said('calib')}: real cells of the kind the "
            f"model scores (e.g. {passing('calib', 'cells/')} {passing('calib_class', 'LYT')}); "
            "int8 is never calibrated on made-up cells"
        )
    profile = BatchProfile.parse(batch) if trt else None
    # the cells the user named, read before any export: a mistyped --calib (or a class it lacks)
    # used to stop the run after encoder.onnx had been written again
    # bf16 makes no graph (OpenVINO's run-time precision on encoder.onnx): only its gate runs
    quantized = [p for p in precisions if p not in ("fp32", "bf16")]
    for source in (cells, calib, parity_cells):
        if source is not None:
            load_records(Path(source))  # missing, empty, not a folder or manifest: one line
    calib_cells = held = None
    if quantized or "bf16" in precisions:
        from cyto.export.quantize import load_cells

        size = bundle.spec.crop_size
        if calib is not None:
            calib_cells = load_cells(calib, size, classes=calib_class, limit=calib_limit)
        held = load_cells(parity_cells, size, normal=parity_normal) if parity_cells else None
        if held is not None and held.labels is not None and len(set(held.labels.tolist())) < 2:
            one = "normal" if not held.labels.any() else "abnormal"
            echo(
                f"warning: every cell of {said('parity_cells')} is of the {one} class "
                f"({passing('parity_normal', parity_normal)}): no AUROC or Recall@K delta can be "
                "measured on them, only the ranking parity"
            )
    # every export ends in ONNX Runtime's parity check: without it, say so before the slow export
    from cyto.runtime.backends.onnxruntime import require_onnxruntime

    require_onnxruntime()
    if trt:  # fail before the slow exports when TensorRT cannot run here
        from cyto.runtime.backends.tensorrt import require_tensorrt
        from cyto.runtime.devices import gpu_identity

        require_tensorrt()
        gpu_identity(device)
    report: dict = {}
    # the graph and the golden cells that verify it are sealed together, or neither is: an
    # export stopped between them leaves the bundle as it was
    with staged_files(path) as stage:
        if onnx:
            report["onnx"] = export_onnx(path, opset=opset, stage=stage)
        golden = _golden(path, cells, parity_cells, parity_normal, calib, echo, stage)
    if onnx:
        entry = report["onnx"]
        echo(
            f"wrote {path / ONNX_FILE}: opset {entry['opset']}, {entry['nodes']} nodes, "
            f"uint8 NHWC in, {entry['output']['name']} out ({entry['export_seconds']} s)"
        )
        conf = entry["tensorrt_conformance"]
        if conf["ok"]:
            from cyto.runtime.backends.tensorrt import REQUIREMENT

            echo(
                f"TensorRT import rules ({conf['targets']}): the graph conforms (cyto builds "
                f"engines with {REQUIREMENT}: cyto doctor says what is here)"
            )
        else:
            echo(
                f"warning: the graph breaks TensorRT's import rules ({conf['targets']}): "
                + problem_words(conf)
            )
    if golden:
        report["golden"] = golden
    # ONNX Runtime here against PyTorch, on the golden cells (load_scorer verifies)
    ort = load_scorer(path, "onnx", "cpu")
    check = ort.verification.record["parity"]
    echo(
        f"parity ONNX Runtime vs PyTorch on {check['cells']} golden cells: max relative "
        f"difference {check['max_rel_diff']:.2e}"
    )
    report["onnx_parity_max_rel"] = check["max_rel_diff"]
    bundle = load_bundle(path, weights=False)
    if quantized:
        from cyto.errors import ParityError
        from cyto.export.quantize import INT8_FORMS, export_variant

        if int8_keep_float is None:
            int8_keep_float = INT8_KEEP_FLOAT.get(bundle.spec.head, ())
        # int8 in three forms: TensorRT's (symmetric) and ONNX Runtime's two on x86 CPUs
        # (uint8 activations; 8-bit weights for VNNI/AMX, 7-bit weights for every x86 CPU)
        keys = [k for p in quantized for k in (INT8_FORMS if p == "int8" else (p,))]
        # the x86 forms first: their activation ranges (every op) serve TensorRT's form as well,
        # so the cells are run through the graph once for all three (same bytes, 40% less time)
        keys.sort(key=lambda k: k == "int8")
        refused: dict[str, str] = {}
        references: dict = {}  # encoder.onnx's scores of the parity cells, run once
        with tempfile.TemporaryDirectory(prefix="cyto-calibration-") as cache:
            for key in keys:
                try:
                    entry = export_variant(
                        path,
                        key,
                        calib_cells if key.startswith("int8") else None,
                        held
                        if held is not None
                        else (None if key.startswith("int8") else calib_cells),
                        calib_method,
                        accept_parity_loss,
                        exclude=int8_keep_float if key.startswith("int8") else (),
                        echo=echo,
                        calib_cache=Path(cache),
                        references=references,
                    )
                except ParityError as exc:
                    refused[key] = str(exc)
                    echo(f"not added: {exc}")
                    continue
                echo(f"wrote {path / entry['file']} ({entry['nodes']} nodes)")
                report[key] = entry
        report["refused"] = refused
        cpu_forms = [k for k in keys if k.startswith("int8-cpu")]
        if refused and (not cpu_forms or all(k in refused for k in cpu_forms) or "fp16" in refused):
            raise ParityError("; ".join(refused.values()))
    if "bf16" in precisions:
        from cyto.export.quantize import bf16_gate

        report["bf16"] = bf16_gate(path, held, accept_parity_loss, echo=echo)
    if trt:
        from cyto.export.trt import build_engine
        from cyto.runtime.engines import EngineIndex

        report["trt"] = {}
        for p in (p for p in precisions if p != "bf16"):  # TensorRT runs no bf16 here
            entry = build_engine(path, p, profile, device, echo=echo)
            index = EngineIndex(path)
            try:
                engine = load_scorer(path, "trt", device, p)
            except CytoError as exc:
                # an engine that does not reproduce the golden cells is never kept
                if accept_parity_loss:
                    echo(f"kept below the gate ({passing('accept_parity_loss')}): {exc}")
                    index.update_info(entry.key, {"verification": {"status": "failed"}})
                    continue
                index.remove(entry.key)
                raise
            v = engine.verification.as_json()
            engine.close()
            index.update_info(entry.key, {"verification": v, "accepted_loss": False})
            echo(f"TensorRT {p} engine: verification {engine.verification.words()}")
            report["trt"][p] = v.get("parity", {})
    return report


def _golden(path, cells, parity_cells, parity_normal, calib, echo, stage) -> dict | None:
    """Write the bundle's golden cells when it has none, when they are random patches and real
    cells were given, or when --cells names new ones; returns the entry written (or None)."""
    from cyto.export.golden import golden_source, needs_real_cells, write_golden

    needed = needs_real_cells(path)
    if cells is None and not needed:
        return None
    bundle = load_bundle(path, weights=False)
    source = golden_source(bundle, [cells, parity_cells, calib])
    if source is None and not needed:
        return None
    # the normal classes: --parity-normal for --parity-cells, else the bundle's training ones
    normal = parity_normal if source is not None and source == parity_cells else None
    entry = write_golden(path, source, normal=normal, stage=stage)
    what = f"{entry['cells']} {'random patches' if entry['kind'] == 'random' else 'cells'}"
    if entry.get("abnormal"):
        what += f" ({entry['abnormal']} abnormal)"
    echo(f"golden cells: {what} from {entry['source']}, with their PyTorch fp32 scores")
    if entry["kind"] == "random":
        echo(
            "note: no real cells given and the training folder is gone: the golden cells are "
            f"random patches (fp32 checks only); pass {passing('cells', 'CELLS')} to keep real ones"
        )
        return entry
    # real golden cells are also what a slide's focus is judged against (adequacy): cells of
    # another lab or kind than the model's changed which of a slide's cells count, unsaid
    # (the bone-marrow calibration cells of an int8 export: 257 -> 161 evaluable cells of a
    # slide in focus, at fp32 too; hostile round 67, 2)
    trained = (bundle.manifest.get("training_data") or {}).get("source")  # as loaded above
    other = trained and source is not None and Path(source).resolve() != Path(trained).resolve()
    echo(
        "note: the golden cells are also the sharpness each slide's cells are held against "
        "for focus (adequacy: out of focus, evaluable, the burden's count)"
        + (
            f"; these are not the model's training cells ({trained}): where they are of another "
            f"kind, lab or scanner, pass the model's own with {passing('cells', 'CELLS')}"
            if other
            else ""
        )
    )
    return entry
