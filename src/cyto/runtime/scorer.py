"""The scorer: one model behind ``score(uint8 NHWC patches) -> float64 scores``.

A scorer is a backend (what runs the network: ONNX Runtime, TensorRT or PyTorch) followed by the
model's scorer head (what turns the network's output into a score). The whole model is loaded
before the first patch is scored. Higher scores are always more abnormal.

``auto`` picks, on a GPU: a TensorRT engine built for this GPU, TensorRT version and the graph's
precision; else ONNX Runtime's CUDA provider when it can run the whole graph on the GPU; else
PyTorch on the GPU. On the CPU: ONNX Runtime when the bundle is exported, else PyTorch. It never
picks a CPU backend when a GPU was asked for, and never an int8 or fp16 engine unless that
precision was asked for.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cyto.bundle import PRECISIONS, Bundle, ModelSpec, load_bundle
from cyto.errors import ConfigError, CytoError
from cyto.runtime.backends import CHOICES, Backend
from cyto.runtime.devices import resolve_device
from cyto.runtime.heads import Head, head_for


@dataclass
class Scorer:
    """A backend followed by a scorer head (see the module docstring)."""

    bundle: Bundle
    head: Head
    backend: Backend
    notes: list[str] = field(default_factory=list)

    @property
    def spec(self) -> ModelSpec:
        return self.bundle.spec

    @property
    def device(self) -> str:
        return self.backend.device

    @property
    def precision(self) -> str:
        return self.backend.precision

    @property
    def graph_file(self) -> str | None:
        """The exported graph that scores (None for the PyTorch network)."""
        graph = getattr(self.backend, "graph", None)
        return graph.file if graph is not None else None

    def score(self, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """(N,) float64 scores of uint8 (N, H, W, 3) patches, ``batch_size`` per network call."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ConfigError(
                f"patches must be uint8 (N, H, W, 3), got {images.dtype} {images.shape}"
            )
        if len(images) == 0:
            return np.empty(0, dtype=np.float64)
        parts = [
            self.head.finish(self.backend.run(images[part]))
            for part in self._calls(len(images), batch_size)
        ]
        return np.concatenate(parts).astype(np.float64, copy=False)

    def _calls(self, n: int, batch_size: int) -> list[slice]:
        """The network calls for ``n`` cells: ``batch_size`` each, within the backend's limit."""
        step = min(batch_size, self.backend.max_batch or batch_size)
        return [slice(i, i + step) for i in range(0, n, step)]

    @property
    def takes_tensors(self) -> bool:
        """Whether the backend runs on tensors already on its device (PyTorch, TensorRT)."""
        return hasattr(self.backend, "run_tensor")

    def score_tensor(self, crops, batch_size: int = 64) -> np.ndarray:
        """(N,) float64 scores of a uint8 (N, H, W, 3) torch tensor. On the backend's device
        the network and the head's torch finish both run there, and only the scores come
        back; a backend that takes host arrays (ONNX Runtime) gets the crops copied to it."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not self.takes_tensors or crops.device.type != self.backend.dev.type:
            return self.score(crops.cpu().numpy(), batch_size)
        if len(crops) == 0:
            return np.empty(0, dtype=np.float64)
        import torch

        parts = [
            self.head.torch_finish(self.backend.run_tensor(crops[part]))
            for part in self._calls(len(crops), batch_size)
        ]
        return torch.cat(parts).to(torch.float64).cpu().numpy()

    def raw(self, images: np.ndarray, batch_size: int = 64) -> list[np.ndarray]:
        """The network's output per batch (for parity checks)."""
        return [
            self.backend.run(images[i : i + batch_size]) for i in range(0, len(images), batch_size)
        ]

    def describe(self) -> str:
        text = f"{self.backend.name} on {self.device}"
        return text if self.precision == "fp32" else f"{text} ({self.precision})"

    def close(self) -> None:
        self.backend.close()


def _has_onnxruntime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def make_backend(
    name: str, bundle: Bundle, device: str, precision: str = "fp32", threads: int | None = None
) -> Backend:
    """The backend ``name`` for ``bundle`` on a resolved ``device`` (no head, no fallback)."""
    if name in ("trt", "onnx-trt") and device == "cpu":
        raise ConfigError(f"the {name} backend runs on CUDA only: use --device cuda")
    if name == "onnx":
        from cyto.runtime.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(bundle, device, precision, threads)
    if name == "onnx-trt":
        from cyto.runtime.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(bundle, device, precision, threads, provider="tensorrt")
    if name == "trt":
        from cyto.runtime.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(bundle, device, precision)
    from cyto.runtime.backends.torch import TorchBackend

    return TorchBackend(bundle, device, precision, threads)


def _auto(
    bundle: Bundle, device: str, precision: str, threads: int | None, notes: list[str]
) -> Backend:
    has_graph = bundle.spec.graph(precision, device) is not None
    if device != "cpu":
        from cyto.runtime.backends.tensorrt import find_engine_for

        entry, why = find_engine_for(bundle, device, precision)
        if entry is not None:
            return make_backend("trt", bundle, device, precision, threads)
        notes.append(f"no usable TensorRT engine: {why}")
        if has_graph and _has_onnxruntime():
            from cyto.runtime.backends.onnxruntime import CUDA, available_providers

            if CUDA in available_providers():
                try:
                    return make_backend("onnx", bundle, device, precision, threads)
                except CytoError as exc:
                    notes.append(f"ONNX Runtime on {device}: {exc}")
            else:
                notes.append("ONNX Runtime here has no CUDA provider")
    elif has_graph and _has_onnxruntime():
        return make_backend("onnx", bundle, device, precision, threads)
    if precision != "fp32":
        raise ConfigError(
            f"no backend here runs the {precision} graph of {bundle.path} on {device}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    return make_backend("torch", bundle, device, precision, threads)


def auto_precision(spec: ModelSpec, backend: str, device: str) -> str:
    """The graph ``auto`` runs: a quantized one only when its recorded parity passed the gate
    (int8 on a CPU, fp16 then int8 on a GPU), and never for the PyTorch backend."""
    if backend == "torch":
        return "fp32"
    for p in ("int8",) if device == "cpu" else ("fp16", "int8"):
        g = spec.graph(p, device)
        if g is not None and g.parity_passed:
            return p
    return "fp32"


def load_scorer(
    model: Path | str | Bundle,
    backend: str = "auto",
    device: str = "auto",
    precision: str = "fp32",
    threads: int | None = None,
) -> Scorer:
    """Load the whole model for ``backend`` on ``device`` (cpu, cuda, cuda:N or auto).

    ``precision`` picks the exported graph (fp32 ``encoder.onnx``, or an fp16 / int8 variant);
    ``auto`` picks a quantized graph only when its parity passed (:func:`auto_precision`).
    """
    if backend not in CHOICES:
        raise ConfigError(f"unknown backend {backend!r}; use one of {', '.join(CHOICES)}")
    if precision not in (*PRECISIONS, "auto"):
        raise ConfigError(
            f"precision must be one of {', '.join(PRECISIONS)} or auto, got {precision!r}"
        )
    bundle = model if isinstance(model, Bundle) else load_bundle(Path(model), weights=False)
    device = resolve_device(device)
    if precision == "auto":
        precision = auto_precision(bundle.spec, backend, device)
    head = head_for(bundle)
    notes: list[str] = []
    if backend == "auto":
        chosen = _auto(bundle, device, precision, threads, notes)
    else:
        chosen = make_backend(backend, bundle, device, precision, threads)
    return Scorer(bundle, head, chosen, notes)
