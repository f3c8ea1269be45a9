"""The inference engine: one exported model behind ``score(uint8 patches) -> scores``.

Backends:
- ``onnx``: the bundle's ``encoder.onnx`` in ONNX Runtime (CPU, or CUDA with onnxruntime-gpu);
- ``trt``: a TensorRT engine from the bundle, built for this GPU and TensorRT version;
- ``torch``: the PyTorch modules rebuilt from the bundle's safetensors weights.

Every backend ends in the same numba scoring kernels (``export.graphs.finish``), so scores agree
across backends up to the numerical differences of the encoders. ``auto`` picks TensorRT when an
engine for this GPU exists, else ONNX Runtime when the bundle is exported and onnxruntime imports,
else PyTorch. The model is loaded as a whole (weights, scorer arrays, graph) before any slide is
read.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, load_bundle
from cyto.errors import ConfigError, DeviceError

BACKENDS = ("auto", "onnx", "trt", "torch")


@dataclass
class Engine:
    bundle: Bundle
    backend: str
    device: str
    scorer: object  # has .score(images, batch_size)

    def score(self, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
        if len(images) == 0:
            return np.empty(0, dtype=np.float64)
        return np.asarray(self.scorer.score(images, batch_size), dtype=np.float64)

    @property
    def input_size(self) -> int:
        cfg = self.bundle.manifest["config"]
        return int(cfg.get("load_size") or self.bundle.manifest["input_size"])

    @property
    def model_mpp(self) -> float | None:
        mpp = self.bundle.manifest["config"].get("mpp")
        return float(mpp) if mpp else None

    def describe(self) -> str:
        return f"{self.backend} on {self.device}"


class TrtScorer:
    """A TensorRT engine from the bundle plus the numba kernel."""

    def __init__(self, bundle: Bundle, entry: dict) -> None:
        from cyto.export.trt import TrtRunner

        self.bundle = bundle
        self.entry = entry
        self.kind = bundle.manifest["scorer_kind"]
        self.runner = TrtRunner(bundle.path / entry["file"], bundle.manifest["onnx"])
        self.max_batch = int(entry["batch"][2])

    def raw(self, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
        from cyto.export.runtime import concat_outputs

        step = min(batch_size, self.max_batch)
        parts = [self.runner.run(images[i : i + step]) for i in range(0, len(images), step)]
        return concat_outputs(self.kind, parts)

    def score(self, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
        from cyto.export.runtime import finish

        m = self.bundle
        return finish(self.kind, self.raw(images, batch_size), m.manifest, m.scorer)


def trt_engine_entry(bundle: Bundle, precision: str | None = None) -> dict | None:
    """The bundle's engine built for this GPU and TensorRT version (of ``precision`` when
    given), or None when there is none or TensorRT / CUDA is missing."""
    engines = bundle.manifest.get("engines") or []
    if not engines or importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        import tensorrt as trt
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from cyto.export.trt import _slug

    tag = f"engine-{_slug(torch.cuda.get_device_name(0))}-"
    want = f"-trt{trt.__version__}-" + (f"{precision}-" if precision else "")
    for e in engines:
        if e["file"].startswith(tag) and want in e["file"]:
            return e
    return None


def _cuda_ok() -> bool:
    """Whether a CUDA GPU is usable; without an NVIDIA device node, torch is not even imported
    (the ONNX Runtime path then runs without it, ~0.4 GB lighter)."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*") and "torch" not in __import__("sys").modules:
        return False
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def load_engine(
    model: Path | Bundle, backend: str = "auto", device: str = "auto", threads: int | None = None
) -> Engine:
    """Load the whole model for ``backend`` on ``device`` (cpu, cuda or auto)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {device!r}")
    bundle = model if isinstance(model, Bundle) else load_bundle(Path(model), weights=False)
    if device == "auto":
        device = "cuda" if _cuda_ok() else "cpu"
    elif device.startswith("cuda") and not _cuda_ok():
        raise DeviceError(f"--device {device} asked for, but no CUDA GPU is available here")
    has_onnx = "onnx" in bundle.manifest
    has_ort = importlib.util.find_spec("onnxruntime") is not None
    if backend == "auto":
        if device.startswith("cuda") and trt_engine_entry(bundle) is not None:
            backend = "trt"
        elif has_onnx and has_ort:
            backend = "onnx"
            if device.startswith("cuda"):
                from cyto.export.runtime import available_providers

                if "CUDAExecutionProvider" not in available_providers():
                    backend = "torch"  # onnxruntime is CPU-only here: PyTorch uses the GPU
        else:
            backend = "torch"
    if backend == "onnx":
        from cyto.export.runtime import OnnxScorer

        scorer = OnnxScorer.open(bundle, device=device, threads=threads)
    elif backend == "trt":
        if not device.startswith("cuda"):
            raise ConfigError("the TensorRT backend runs on CUDA only: use --device cuda")
        from cyto.export.trt import require_cuda, require_tensorrt

        require_tensorrt()
        require_cuda()
        entry = trt_engine_entry(bundle)
        if entry is None:
            raise ConfigError(
                f"{bundle.path} has no TensorRT engine for this GPU and TensorRT version: "
                f"run 'cyto export {bundle.path} --trt' here"
            )
        scorer = TrtScorer(bundle, entry)
    else:
        from cyto.models.from_bundle import load_scorer

        if not bundle.weights:
            bundle = load_bundle(bundle.path)
        if threads:
            import torch

            torch.set_num_threads(threads)
        scorer = load_scorer(bundle, device)
    return Engine(bundle, backend, device, scorer)
