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


def export_bundle(
    path: Path,
    onnx: bool = True,
    trt: bool = False,
    precision: str = "fp32",
    cells: Path | None = None,
    batch: str = "1,64,256",
    device: str = "cuda",
    opset: int = OPSET,
    echo=print,
) -> dict:
    """Export ``path`` for inference and check every artifact against PyTorch / ONNX Runtime."""
    from cyto.runtime import load_scorer
    from cyto.runtime.engines import BatchProfile

    path = Path(path)
    bundle = load_bundle(path, weights=False)
    if trt and not onnx and ONNX_FILE not in bundle.manifest["files"]:
        raise ConfigError("TensorRT builds from the ONNX graph: export it first (--onnx)")
    profile = BatchProfile.parse(batch) if trt else None
    if trt:  # fail before the slow ONNX export when TensorRT cannot run here
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
    ort = load_scorer(path, "onnx", "cpu", precision)
    rep = parity(ref.raw(patches), ort.raw(patches), ref.score(patches), ort.score(patches))
    echo(
        f"parity ONNX Runtime vs PyTorch on {what}: max relative difference "
        f"{rep['max_rel_diff_scores']:.2e}"
    )
    report["onnx_parity_max_rel"] = rep["max_rel_diff_scores"]
    if trt:
        from cyto.export.trt import build_engine
        from cyto.runtime.engines import EngineIndex

        entry = build_engine(path, precision, profile, device, echo=echo)
        engine = load_scorer(path, "trt", device, precision)
        n = min(len(patches), profile.max)
        rep = parity(
            ort.raw(patches[:n]),
            engine.raw(patches[:n]),
            ort.score(patches[:n]),
            engine.score(patches[:n]),
        )
        EngineIndex(path).update_info(entry.key, {"parity_vs_onnxruntime": rep})
        echo(
            f"TensorRT vs ONNX Runtime on {n} patches: max abs diff "
            f"{rep['max_abs_diff_raw']:.3g}, Spearman of scores {rep['spearman']}"
        )
        report["trt"] = rep
    return report
