"""The exported inference path without PyTorch: ONNX Runtime on uint8 patches, then the numba
kernels. ``cyto score`` with ONNX Runtime imports only this (no torch: ~0.5 GB less memory per
process and a faster start); the exporters live in :mod:`cyto.export.onnx` and
:mod:`cyto.export.graphs`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, load_bundle
from cyto.errors import BundleError, DeviceError, MissingDependencyError
from cyto.export import kernels

ONNX_FILE = "encoder.onnx"
OUTPUTS = {"dsvdd": "embeddings", "ocsvm": "embeddings", "classifier": "logits", "mil": "scores"}


def finish(kind: str, out: np.ndarray, manifest: dict, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Graph output -> final score (higher = more abnormal), with the bundle's arrays."""
    if kind == "dsvdd":
        return kernels.dsvdd_scores(
            np.ascontiguousarray(out, np.float32),
            np.ascontiguousarray(arrays["centres"], np.float32),
            float(manifest["tta_lambda"]),
        )
    if kind == "ocsvm":
        return kernels.ocsvm_scores(
            out,
            arrays["support_vectors"],
            arrays["dual_coef"],
            float(arrays["gamma"]),
            float(arrays["rho"]),
        )
    if kind == "classifier":
        return kernels.softmax_abnormal(np.ascontiguousarray(out, np.float32))
    if kind == "mil":
        return np.asarray(out, dtype=np.float64).reshape(-1)
    raise ValueError(f"unknown scorer kind {kind!r}")


def concat_outputs(kind: str, parts: list[np.ndarray]) -> np.ndarray:
    """Join per-batch graph outputs (the batch axis is 2 for Deep SVDD, 0 otherwise)."""
    return np.concatenate(parts, axis=2 if kind == "dsvdd" else 0)


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

        bundle = path if isinstance(path, Bundle) else load_bundle(Path(path), weights=False)
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
