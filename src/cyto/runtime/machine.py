"""What this machine is, as far as it changes the numbers an exported graph computes.

A graph checked where it was exported can compute other numbers elsewhere: ONNX Runtime picks its
int8 kernels by the CPU's instruction set (on x86 without VNNI, uint8 x int8 products are summed
in pairs into int16 by ``vpmaddubsw``, which saturates), TensorRT picks kernels per GPU and
version, and a driver or library upgrade changes either. :func:`fingerprint` names everything of
that kind, so a verification result (:mod:`cyto.runtime.verify`) is reused only where all of it
is the same. Nothing here imports torch unless a CUDA device is named.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib.metadata as md
import importlib.util
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from cyto.version import __version__

#: the instruction-set flags that decide which kernels run (x86 names as in /proc/cpuinfo;
#: aarch64's ``asimddp`` is its int8 dot product)
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
)
#: x86 flags under which ONNX Runtime's uint8 x int8 kernels sum in int32 (no saturation)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: the libraries whose versions change the numbers (read from package metadata, not imported)
LIBRARIES = ("onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "torch", "numba", "numpy")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    flags: tuple[str, ...]

    @property
    def x86(self) -> bool:
        return self.arch in ("x86_64", "amd64", "i686", "i386")

    @property
    def int8_dot(self) -> bool:
        """Whether int8 products accumulate without saturation in ONNX Runtime's fast kernels:
        VNNI or AMX on x86; any other architecture's kernels do not pair into int16."""
        return not self.x86 or any(f in self.flags for f in INT8_DOT_FLAGS)

    def words(self) -> str:
        return f"{self.model} ({self.arch}; {' '.join(self.flags) or 'no flags read'})"


#: the int8 probe: K products of 255 x 127 summed (exact: 2,072,640; in int16 pairs that
#: saturate: K/2 x 32,767 = 1,048,544)
PROBE_K = 64
#: the probe's graph, serialized: ``y = MatMulInteger(a, b)``, ``a`` uint8 (1, PROBE_K), ``b``
#: int8 (PROBE_K, 1) all 127, opset 13, IR 8 (what ``onnx.helper`` builds:
#: ``tests/unit/test_machine.py`` builds it again and compares). Kept as bytes, the probe needs
#: no ``import onnx``: 0.6 of the 3.5 s a ``cyto score`` of a small slide took
PROBE_GRAPH = (
    "CAg6ogEKGAoBYQoBYhIBeSINTWF0TXVsSW50ZWdlchIPY3l0by1pbnQ4LXByb2JlKksIQAgBEAMqQH9/f39/f39/"
    "f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39CAWJaEwoBYRIO"
    "CgwIAhIICgIIAQoCCEBiEwoBeRIOCgwIBhIICgIIAQoCCAFCBAoAEA0="
)


@functools.lru_cache(maxsize=1)
def int8_kernels_exact() -> bool | None:
    """Whether ONNX Runtime's CPU uint8 x int8 kernels sum exactly here, measured on one
    ``MatMulInteger`` of :data:`PROBE_K` products of 255 x 127 (not read from the CPU's flags,
    which can say VNNI where the kernels run AVX2's ``vpmaddubsw``: under ``qemu-x86_64 -cpu
    Haswell`` /proc/cpuinfo shows the host's flags while ONNX Runtime dispatches AVX2 kernels,
    and the probe gives 1,048,544). None when ONNX Runtime is not installed or the probe fails."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return None
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(
            base64.b64decode(PROBE_GRAPH), options, providers=["CPUExecutionProvider"]
        )
        got = session.run(None, {"a": np.full((1, PROBE_K), 255, np.uint8)})[0]
    except Exception:  # noqa: BLE001 (a probe that cannot run says nothing)
        return None
    return int(got.ravel()[0]) == 255 * 127 * PROBE_K


def int8_dot_here() -> bool:
    """Whether the int8 form with 8-bit weights computes exactly on this CPU: measured by
    :func:`int8_kernels_exact` where ONNX Runtime runs, else read from the flags."""
    measured = int8_kernels_exact()
    return cpu_info().int8_dot if measured is None else measured


def _parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This CPU's model, architecture and the :data:`ISA_FLAGS` it has (Linux reads
    /proc/cpuinfo; elsewhere the flags are unknown and the CPU counts as one without VNNI)."""
    arch = platform.machine().lower()
    model, flags = "", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        with contextlib.suppress(OSError):
            model, flags = _parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    model = re.sub(r"\s+", " ", model or platform.processor() or "unknown CPU").strip()
    return CpuInfo(model, arch, tuple(f for f in ISA_FLAGS if f in flags))


@functools.lru_cache(maxsize=1)
def openvino_cpu() -> dict | None:
    """OpenVINO's version and what its CPU plugin computes in here (``OPTIMIZATION_CAPABILITIES``:
    BF16 with AMX or AVX512-BF16), as OpenVINO reports it: under a hypervisor or the CPUID mask
    the kernel's flags say otherwise. None where OpenVINO is not installed."""
    if importlib.util.find_spec("openvino") is None:
        return None
    import openvino as ov

    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return {"version": str(ov.get_version()), "cpu": [str(c) for c in caps]}


def library_versions() -> dict[str, str]:
    out = {"cyto": __version__}
    for name in LIBRARIES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version (Linux), without loading any CUDA library."""
    path = Path("/proc/driver/nvidia/version")
    try:
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", path.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def gpu_facts(device: str) -> dict:
    """Name, compute capability, driver and CUDA runtime of the GPU ``device`` names."""
    from cyto.runtime import devices

    gpu = devices.gpu_identity(device)
    import torch

    return {
        "gpu": gpu.name,
        "capability": f"{gpu.capability[0]}.{gpu.capability[1]}",
        "driver": nvidia_driver(),
        "cuda": torch.version.cuda,
    }


def fingerprint(device: str = "cpu") -> dict:
    """Everything about this machine that can change a graph's numbers on ``device``."""
    cpu = cpu_info()
    out = {
        "cpu": cpu.model,
        "arch": cpu.arch,
        "isa": list(cpu.flags),
        # what the int8 kernels do here, measured: the flags alone cannot tell an emulated or
        # masked CPU from the real one
        "int8_exact": int8_kernels_exact(),
        "os": platform.system(),
        "libraries": library_versions(),
    }
    ov = openvino_cpu()
    if ov is not None:
        out["openvino"] = ov
    if str(device).startswith("cuda"):
        out.update(gpu_facts(device))
    return out


def graph_for(spec, precision: str, device: str):
    """The bundle's graph of ``precision`` for ``device`` on this machine: on a CPU, the int8
    form made for its instruction set (:meth:`cyto.bundle.ModelSpec.graph`). bf16 has no graph
    of its own: OpenVINO compiles ``encoder.onnx`` in bf16."""
    if precision == "bf16":
        return spec.graph("fp32")
    return spec.graph(precision, device, int8_dot=int8_dot_here() if device == "cpu" else True)
