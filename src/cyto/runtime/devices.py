"""Devices by name (``cpu``, ``cuda``, ``cuda:N``, ``auto``) and the identity of a CUDA GPU.

PyTorch is imported only when a CUDA device is asked for, or when ``auto`` finds an NVIDIA device
node: the ONNX Runtime path on a CPU machine runs without it (~0.4 GB lighter per process).
Asking for a GPU that is absent is an error, never a silent fall-back to the CPU.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import sys
from dataclasses import dataclass

from cyto.errors import ConfigError, DeviceError
from cyto.flags import passing

_DEVICE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class GpuIdentity:
    """What an engine is tied to: the GPU model and its compute capability."""

    index: int
    name: str
    capability: tuple[int, int]

    @property
    def sm(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"


def parse_device(device: str) -> tuple[str, int | None]:
    """``"cuda:1"`` -> ``("cuda", 1)``; ``"cuda"`` -> ``("cuda", None)``; else a ConfigError."""
    m = _DEVICE.match(str(device).strip().lower())
    if not m or (m.group(2) is not None and m.group(1) != "cuda"):
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {device!r}")
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


def cuda_available() -> bool:
    """Whether a CUDA GPU is usable; without an NVIDIA device node torch is not even imported."""
    if not glob.glob("/dev/nvidia[0-9]*") and "torch" not in sys.modules:
        return False
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda:0`` when a GPU is usable, else ``cpu``; ``cuda`` -> ``cuda:0``; a CUDA
    device that is absent (or an index past the last GPU) is a :class:`DeviceError`."""
    kind, index = parse_device(device)
    if kind == "auto":
        return "cuda:0" if cuda_available() else "cpu"
    if kind == "cpu":
        return "cpu"
    if not cuda_available():
        raise DeviceError(
            f"{passing('device', device)} asked for, but no CUDA GPU is available here"
        )
    import torch

    index = index or 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"{passing('device', device)} asked for, but this machine has {count} CUDA GPU(s) "
            f"(cuda:0 to cuda:{count - 1})"
        )
    return f"cuda:{index}"


def device_index(device: str) -> int:
    """The CUDA ordinal of a resolved ``cuda:N`` device."""
    kind, index = parse_device(device)
    if kind != "cuda":
        raise ConfigError(f"{device!r} is not a CUDA device")
    return index or 0


def gpu_identity(device: str) -> GpuIdentity:
    """Name and compute capability of the GPU ``device`` names (``cuda`` or ``cuda:N``)."""
    resolved = resolve_device(device)
    if resolved == "cpu":
        raise DeviceError(f"{device!r} is not a CUDA GPU")
    import torch

    index = device_index(resolved)
    props = torch.cuda.get_device_properties(index)
    return GpuIdentity(index, props.name, (props.major, props.minor))


def on_device(device: str):
    """A context in which CUDA work (TensorRT included) goes to ``device``: TensorRT binds an
    engine to the GPU that is current when it is built or deserialized, and runs it there."""
    import contextlib

    if parse_device(device)[0] != "cuda":
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device_index(device))


#: bytes copied from host memory to a device, by device type ("cuda", or "cpu" where the same
#: code runs with the device set to the CPU): what a run moves across PCIe, per process
H2D_BYTES: dict[str, int] = {}


def count_h2d(nbytes: int, device) -> None:
    """Count ``nbytes`` handed from host memory to ``device`` (a name or a torch device)."""
    kind = getattr(device, "type", None) or parse_device(str(device))[0]
    H2D_BYTES[kind] = H2D_BYTES.get(kind, 0) + int(nbytes)


def h2d_bytes(kind: str = "cuda") -> int:
    return H2D_BYTES.get(kind, 0)
