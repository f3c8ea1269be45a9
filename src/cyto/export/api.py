"""``cyto export``: ONNX (always first), optional TensorRT engines, and a parity check of each."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cyto.bundle import ONNX_FILE, load_bundle
from cyto.errors import ConfigError
from cyto.export.onnx import OPSET, export_onnx


def parity_patches(cells: Path | None, size: int, n: int = 32, seed: int = 0) -> np.ndarray:
    """Patches to compare backends on: the user's cells (a folder or manifest), else seeded
    random patches (enough to compare the numbers two backends compute, not a ranking)."""
    rng = np.random.default_rng(seed)
    if cells is not None:
        from cyto.data.dataset import load_records
        from cyto.data.images import read_image, resize_rgb

        records = load_records(Path(cells))
        pick = rng.permutation(len(records))[: max(n, 1)]
        return np.stack([resize_rgb(read_image(records[i].path), size) for i in pick])
    return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def parity(reference: list[np.ndarray], candidate: list[np.ndarray], ref_scores, cand_scores):
    """Max abs and relative difference of raw outputs, Spearman rank correlation of scores."""
    from scipy.stats import spearmanr

    a = np.concatenate([r.astype(np.float64).ravel() for r in reference])
    b = np.concatenate([c.astype(np.float64).ravel() for c in candidate])
    ref_scores, cand_scores = np.asarray(ref_scores), np.asarray(cand_scores)
    rel = np.max(np.abs(cand_scores - ref_scores) / (np.abs(ref_scores) + 1e-6))
    return {
        "n": int(len(ref_scores)),
        "max_abs_diff_raw": float(np.abs(a - b).max()) if len(a) else 0.0,
        "max_rel_diff_scores": float(rel) if len(ref_scores) else 0.0,
        "spearman": float(spearmanr(ref_scores, cand_scores).statistic)
        if len(ref_scores) > 2
        else None,
    }


# layers int8 leaves in float by default, per scorer head: Deep SVDD's distance to the centre
# moves with every embedding coordinate; its embedding Gemm in float took the TensorRT form's
# parity gate from 2/3 to 3/3 splits (top-10% overlap 0.91 +- 0.04 -> 0.95 +- 0.04, 400 held-out
# bone-marrow cells, seeds 0-2) for 0.004% of ResNet18's multiply-adds
INT8_KEEP_FLOAT: dict[str, tuple[str, ...]] = {"dsvdd": ("Gemm",)}


def export_bundle(
    path: Path,
    onnx: bool = True,
    trt: bool = False,
    precisions: tuple[str, ...] = ("fp32",),
    cells: Path | None = None,
    calib: Path | None = None,
    calib_class: str | None = None,
    calib_method: str = "percentile",
    calib_limit: int = 512,
    parity_cells: Path | None = None,
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
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise ConfigError(f"--precision takes {', '.join(PRECISIONS)} (comma-separated), got {bad}")
    bundle = load_bundle(path, weights=False)
    if not onnx and ONNX_FILE not in bundle.manifest["files"]:
        raise ConfigError(f"{path} has no {ONNX_FILE}: export it first (--onnx)")
    if "int8" in precisions and calib is None:
        raise ConfigError(
            "--precision int8 needs --calib: real cells of the kind the model scores (e.g. "
            "--calib cells/ --calib-class LYT); int8 is never calibrated on made-up cells"
        )
    profile = BatchProfile.parse(batch) if trt else None
    if trt:  # fail before the slow exports when TensorRT cannot run here
        from cyto.runtime.backends.tensorrt import require_tensorrt
        from cyto.runtime.devices import gpu_identity

        require_tensorrt()
        gpu_identity(device)
    report: dict = {}
    if onnx:
        entry = export_onnx(path, opset=opset)
        echo(
            f"wrote {path / ONNX_FILE}: opset {entry['opset']}, {entry['nodes']} nodes, "
            f"uint8 NHWC in, {entry['output']['name']} out ({entry['export_seconds']} s)"
        )
        conf = entry["tensorrt_conformance"]
        if conf["ok"]:
            echo(f"TensorRT import rules ({conf['targets']}): the graph conforms")
        else:
            echo(
                f"warning: the graph breaks TensorRT's import rules ({conf['targets']}): "
                + "; ".join(conf["problems"][:3])
            )
        report["onnx"] = entry
    bundle = load_bundle(path, weights=False)
    size = bundle.spec.crop_size
    patches = parity_patches(cells, size)
    what = f"{len(patches)} {'cells' if cells else 'random patches'}"
    ref = load_scorer(path, "torch", "cpu")
    ort = load_scorer(path, "onnx", "cpu")
    rep = parity(ref.raw(patches), ort.raw(patches), ref.score(patches), ort.score(patches))
    echo(
        f"parity ONNX Runtime vs PyTorch on {what}: max relative difference "
        f"{rep['max_rel_diff_scores']:.2e}"
    )
    report["onnx_parity_max_rel"] = rep["max_rel_diff_scores"]
    quantized = [p for p in precisions if p != "fp32"]
    if quantized:
        from cyto.export.quantize import export_variant, load_cells

        calib_cells = (
            load_cells(calib, size, classes=calib_class, limit=calib_limit)
            if calib is not None
            else None
        )
        held = load_cells(parity_cells, size, normal=parity_normal) if parity_cells else None
        if int8_keep_float is None:
            int8_keep_float = INT8_KEEP_FLOAT.get(bundle.spec.head, ())
        # int8 in two forms: TensorRT's (symmetric) and ONNX Runtime's on x86 CPUs (uint8)
        keys = [k for p in quantized for k in (("int8", "int8-cpu") if p == "int8" else (p,))]
        for key in keys:
            entry = export_variant(
                path,
                key,
                calib_cells if key.startswith("int8") else None,
                held if held is not None else (None if key.startswith("int8") else calib_cells),
                calib_method,
                accept_parity_loss,
                exclude=int8_keep_float if key.startswith("int8") else (),
                echo=echo,
            )
            echo(f"wrote {path / entry['file']} ({entry['nodes']} nodes)")
            report[key] = entry
    if trt:
        from cyto.export.trt import build_engine
        from cyto.runtime.engines import EngineIndex

        report["trt"] = {}
        for p in precisions:
            entry = build_engine(path, p, profile, device, echo=echo)
            engine = load_scorer(path, "trt", device, p)
            ref_p = load_scorer(path, "onnx", "cpu", p)
            n = min(len(patches), profile.max)
            rep = parity(
                ref_p.raw(patches[:n]),
                engine.raw(patches[:n]),
                ref_p.score(patches[:n]),
                engine.score(patches[:n]),
            )
            EngineIndex(path).update_info(entry.key, {"parity_vs_onnxruntime": rep})
            echo(
                f"TensorRT {p} vs ONNX Runtime on {n} patches: max abs diff "
                f"{rep['max_abs_diff_raw']:.3g}, Spearman of scores {rep['spearman']}"
            )
            report["trt"][p] = rep
    return report
