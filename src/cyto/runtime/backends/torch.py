"""PyTorch backend: the network rebuilt from the bundle's safetensors, on the CPU or a GPU.

It runs the same graph module that ``cyto export`` writes to ONNX and returns its output; the
scorer head's numba finish turns that into scores, exactly as for ONNX Runtime and TensorRT.
"""

from __future__ import annotations

import numpy as np

from cyto.bundle import Bundle, load_bundle


class TorchBackend:
    name = "torch"
    max_batch = None

    def __init__(
        self,
        bundle: Bundle,
        device: str = "cpu",
        precision: str = "fp32",
        threads: int | None = None,
    ) -> None:
        import torch

        from cyto.errors import ConfigError
        from cyto.models.from_bundle import build_graph

        if precision != "fp32":
            raise ConfigError(
                f"the PyTorch backend runs the fp32 network; {precision} runs through ONNX Runtime "
                "or TensorRT"
            )
        if not bundle.weights:
            bundle = load_bundle(bundle.path)
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        self.precision = precision
        self.dev = torch.device(device)
        self.module = build_graph(bundle).to(self.dev).eval()

    def run(self, batch: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.uint8)).to(self.dev)
            return self.module(x).float().cpu().numpy()

    def close(self) -> None:
        self.module = None
