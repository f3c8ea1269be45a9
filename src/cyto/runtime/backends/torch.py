"""PyTorch backend: the network rebuilt from the bundle's safetensors, on the CPU or a GPU.

It runs the same graph module that ``cyto export`` writes to ONNX and returns its output; the
scorer head's numba finish turns that into scores, exactly as for ONNX Runtime and TensorRT.

fp32 is fp32 on a GPU too: cuDNN's and cuBLAS's TF32 modes (on by default for convolutions on
Ampere and later, 10 mantissa bits) are turned off, so the GPU's scores equal the CPU's. fp16 is
autocast on CUDA only, asked for explicitly: ``auto`` never picks it, since no parity of it is
recorded in the bundle (the exported fp16 graph's parity belongs to that graph).
"""

from __future__ import annotations

import contextlib

import numpy as np

from cyto.bundle import Bundle, load_bundle
from cyto.runtime import devices


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
        from cyto.runtime.backends import precision_refused

        refused = precision_refused("torch", precision, device)
        if refused:
            raise ConfigError(refused)
        gpu = str(device).startswith("cuda")
        if not bundle.weights:
            bundle = load_bundle(bundle.path, for_scoring=True)
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        self.precision = precision
        self.dev = torch.device(device)
        if gpu and precision == "fp32":
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        self.module = build_graph(bundle).to(self.dev).eval()
        self._pinned = self._copied = None  # the pinned staging buffer of CUDA uploads

    def _upload(self, batch: np.ndarray):
        """The host batch on the device; on CUDA through a reused pinned buffer, copied
        asynchronously (the forward pass that follows waits for it on the same stream)."""
        torch = self.torch
        batch = np.ascontiguousarray(batch, dtype=np.uint8)
        devices.count_h2d(batch.nbytes, self.dev)
        host = torch.from_numpy(batch)
        if self.dev.type != "cuda":
            return host
        if self._pinned is None or self._pinned.numel() < host.numel():
            self._pinned = torch.empty(host.numel(), dtype=torch.uint8, pin_memory=True)
        else:  # the previous batch's copy must be done before the buffer is overwritten
            self._copied.synchronize()
        staged = self._pinned[: host.numel()].view(host.shape)
        staged.copy_(host)
        x = staged.to(self.dev, non_blocking=True)
        # recorded on the stream the copy went to: this GPU's current stream, which is not the
        # current device's when the backend runs on cuda:1 and the caller on cuda:0
        self._copied = torch.cuda.Event()
        self._copied.record(torch.cuda.current_stream(self.dev))
        return x

    def run_tensor(self, x):
        """The graph output as a float tensor on the device, for a uint8 (N, H, W, 3) tensor
        already there (device crops: nothing crosses to the host before the scores)."""
        torch = self.torch
        half = self.precision == "fp16"
        with (
            torch.inference_mode(),
            torch.autocast("cuda", dtype=torch.float16) if half else contextlib.nullcontext(),
        ):
            return self.module(x).float()

    def run(self, batch: np.ndarray) -> np.ndarray:
        return self.run_tensor(self._upload(batch)).cpu().numpy()

    def close(self) -> None:
        self.module = None
