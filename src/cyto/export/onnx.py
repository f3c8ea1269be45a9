"""Export a bundle's network to ONNX (preprocessing inside the graph) and run it with ONNX Runtime.

The graph takes raw uint8 cell patches, NHWC (``patches``: N x H x W x 3, any N, H and W), and
casts, resizes (bilinear) and normalizes inside, so a caller sends 4x fewer bytes than float32. The
graph ends where the numba kernel takes over (see :mod:`cyto.export.graphs`). Exported with the
dynamo exporter at opset 18 into one file; ``onnx.checker`` validates it and the exporter's
optimizer folds constants.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cyto.bundle import Bundle, add_files, load_bundle
from cyto.errors import BundleError, DeviceError, MissingDependencyError
from cyto.export.graphs import GRAPHS, OUTPUTS, concat_outputs, finish
from cyto.models.from_bundle import load_scorer

ONNX_FILE = "encoder.onnx"
OPSET = 18


def export_onnx(path: Path, opset: int = OPSET, example_size: int | None = None) -> dict:
    """Write ``encoder.onnx`` into the bundle and record it in the manifest; returns its entry."""
    import onnx

    bundle = load_bundle(Path(path))
    kind = bundle.manifest["scorer_kind"]
    scorer = load_scorer(bundle, "cpu")
    module = GRAPHS[kind](scorer).eval()
    size = (
        example_size or bundle.manifest["config"].get("load_size") or bundle.manifest["input_size"]
    )
    x = torch.zeros((2, size, size, 3), dtype=torch.uint8)
    dims = {
        0: torch.export.Dim("batch", min=1, max=65536),
        1: torch.export.Dim("height", min=8, max=4096),
        2: torch.export.Dim("width", min=8, max=4096),
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=bundle.path.parent) as tmp:
        target = Path(tmp) / ONNX_FILE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (x,),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=["patches"],
                output_names=[OUTPUTS[kind]],
                dynamic_shapes=(dims,),
                optimize=True,
                verbose=False,
            )
        program.save(str(target))
        model = onnx.load(str(target))
        onnx.checker.check_model(model, full_check=True)
        entry = {
            "file": ONNX_FILE,
            "opset": opset,
            "exporter": f"torch.onnx dynamo {torch.__version__}",
            "input": {
                "name": "patches",
                "dtype": "uint8",
                "layout": "NHWC",
                "shape": ["N", "H", "W", 3],
            },
            "output": {"name": OUTPUTS[kind], "kind": kind},
            "nodes": len(model.graph.node),
            "export_seconds": round(time.perf_counter() - t0, 1),
        }
        add_files(bundle.path, {ONNX_FILE: target}, {"onnx": entry})
    return entry


def available_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise MissingDependencyError(
            "onnxruntime", "ONNX Runtime scoring", "pip install 'cyto[cpu]' (or 'cyto[gpu]')"
        ) from exc
    return list(ort.get_available_providers())


@dataclass
class OnnxScorer:
    """The exported path: ONNX Runtime on uint8 patches, then the numba kernel."""

    bundle: Bundle
    session: object
    kind: str

    @classmethod
    def open(
        cls, path: Path | Bundle, device: str = "cpu", threads: int | None = None
    ) -> OnnxScorer:
        import onnxruntime as ort

        bundle = path if isinstance(path, Bundle) else load_bundle(Path(path))
        if ONNX_FILE not in bundle.manifest["files"]:
            raise BundleError(
                f"{bundle.path} has no {ONNX_FILE}: run 'cyto export {bundle.path} --onnx' first"
            )
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in available_providers():
                raise DeviceError(
                    "ONNX Runtime here has no CUDA provider: install "
                    "'cyto[gpu]' (onnxruntime-gpu, never next to onnxruntime)"
                )
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        session = ort.InferenceSession(str(bundle.path / ONNX_FILE), opts, providers=providers)
        if device.startswith("cuda") and session.get_providers()[0] != "CUDAExecutionProvider":
            raise DeviceError(
                "ONNX Runtime could not start its CUDA provider (CUDA or cuDNN "
                "libraries missing?); refusing to fall back to the CPU silently"
            )
        return cls(bundle, session, bundle.manifest["scorer_kind"])

    def raw(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        parts = []
        for i in range(0, len(images), batch_size):
            x = np.ascontiguousarray(images[i : i + batch_size], dtype=np.uint8)
            parts.append(self.session.run(None, {"patches": x})[0])
        return concat_outputs(self.kind, parts)

    def score(self, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
        return finish(
            self.kind, self.raw(images, batch_size), self.bundle.manifest, self.bundle.scorer
        )
