"""``cyto export``: ONNX (always first), optional TensorRT, and a parity check of each."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.bundle import add_files, load_bundle
from cyto.errors import ConfigError
from cyto.export.onnx import ONNX_FILE, OPSET, OnnxScorer, export_onnx


def parity_patches(calib: Path | None, size: int, n: int = 32, seed: int = 0) -> np.ndarray:
    """Patches to compare backends on: the user's folder, or synthetic cells."""
    if calib is not None:
        from cyto.data.dataset import load_records
        from cyto.data.images import read_image, resize_rgb

        records = load_records(Path(calib))
        pick = np.random.default_rng(seed).permutation(len(records))[: max(n, 1)]
        return np.stack([resize_rgb(read_image(records[i].path), size) for i in pick])
    from cyto.data.synth.cells import CELL_CLASSES
    from cyto.data.synth.patches import render_patch

    rng = np.random.default_rng(seed)
    return np.stack(
        [render_patch(CELL_CLASSES[i % len(CELL_CLASSES)], rng, size=size) for i in range(n)]
    )


def export_bundle(
    path: Path,
    onnx: bool = True,
    trt: bool = False,
    fp16: bool = True,
    int8: bool = False,
    calib: Path | None = None,
    batch: str = "1,64,256",
    opset: int = OPSET,
    echo=print,
) -> dict:
    from cyto.models.from_bundle import load_scorer

    path = Path(path)
    bundle = load_bundle(path)
    if not onnx and ONNX_FILE not in bundle.manifest["files"] and trt:
        raise ConfigError("TensorRT builds from the ONNX graph: export it first (--onnx)")
    if trt:  # fail before the slow ONNX export when TensorRT cannot run here
        from cyto.export.trt import require_cuda, require_tensorrt

        require_tensorrt()
        require_cuda()
    size = bundle.manifest["config"].get("load_size") or bundle.manifest["input_size"]
    report: dict = {}
    if onnx:
        entry = export_onnx(path, opset=opset)
        echo(
            f"wrote {path / ONNX_FILE}: opset {entry['opset']}, {entry['nodes']} nodes, "
            f"uint8 NHWC in, {entry['output']['name']} out ({entry['export_seconds']} s)"
        )
        report["onnx"] = entry
    patches = parity_patches(calib, size)
    torch_scores = load_scorer(path).score(patches)
    ort = OnnxScorer.open(path)
    ort_scores = ort.score(patches)
    rel = float(np.max(np.abs(ort_scores - torch_scores) / (np.abs(torch_scores) + 1e-6)))
    echo(
        f"parity ONNX Runtime vs PyTorch on {len(patches)} patches: max relative difference "
        f"{rel:.2e}"
    )
    report["onnx_parity_max_rel"] = rel
    if trt:
        from cyto.export.trt import BatchProfile, TrtRunner, build_engine, parity_report

        profile = BatchProfile.parse(batch)
        calib_images = parity_patches(calib, size, n=max(profile.opt * 4, 64)) if int8 else None
        engine = build_engine(
            path / ONNX_FILE,
            path,
            profile,
            (size, size),
            fp16=fp16 or int8,
            int8=int8,
            calib=calib_images,
        )
        runner = TrtRunner(engine, load_bundle(path).manifest["onnx"])
        raw_trt = runner.run(patches[: profile.max])
        raw_ort = ort.raw(patches[: profile.max])
        from cyto.export.graphs import finish

        b = load_bundle(path)
        rep = parity_report(
            raw_ort,
            raw_trt,
            finish(ort.kind, raw_ort, b.manifest, b.scorer),
            finish(ort.kind, raw_trt, b.manifest, b.scorer),
        )
        engines = list(b.manifest.get("engines", []))
        engines.append(
            {
                "file": engine.name,
                "batch": [profile.min, profile.opt, profile.max],
                "input_hw": [size, size],
                "parity_vs_onnxruntime": rep,
            }
        )
        add_files(path, {engine.name: engine}, {"engines": engines})
        echo(
            f"wrote {engine}: max abs diff vs ONNX Runtime {rep['max_abs_diff']:.3g}, "
            f"Spearman of scores {rep['spearman']:.5f}"
        )
        report["trt"] = rep
    return report
