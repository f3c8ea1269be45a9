"""What machine a benchmark ran on: CPU model and cores, GPU, driver, CUDA and library versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
from datetime import date
from pathlib import Path

from cyto.runtime.machine import cpu_info, int8_dot_here, int8_kernels_exact

LIBRARIES = (
    "cyto",
    "torch",
    "torchvision",
    "onnxruntime",
    "onnxruntime-gpu",
    "openvino",
    "tensorrt",
    "numba",
    "numpy",
    "scikit-learn",
    "pyvips",
    "openslide-python",
    "pyarrow",
)


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else platform.machine()


#: numpy's names of the :data:`cyto.runtime.machine.ISA_FLAGS` its CPU dispatch reports
_NUMPY_ISA = {
    "SSE42": "sse4_2",
    "AVX": "avx",
    "AVX2": "avx2",
    "FMA3": "fma",
    "F16C": "f16c",
    "AVX512F": "avx512f",
    "AVX512BW": "avx512bw",
    "AVX512VNNI": "avx512_vnni",
    "AVX512BF16": "avx512_bf16",
    "AVX512FP16": "avx512_fp16",
    "ASIMD": "asimd",
    "ASIMDDP": "asimddp",
}


def dispatched_flags() -> list[str] | None:
    """The instruction sets the libraries dispatch on, as numpy's CPUID finds them (None where
    numpy does not say). They are /proc/cpuinfo's flags, except under a CPUID mask
    (``tests/isa_mask``: the libraries then run another CPU's kernels on this one)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:
        return None
    return [name for key, name in _NUMPY_ISA.items() if found.get(key)]


def cpuid_mask() -> str | None:
    """The profile of ``tests/isa_mask`` this process runs under (``avx2``, ``avx512``), or None."""
    if "isa_mask" not in os.environ.get("LD_PRELOAD", ""):
        return None
    return os.environ.get("ISA_MASK") or None


def _nvidia_smi() -> dict[str, str]:
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    parts = [p.strip() for p in out.splitlines()[0].split(",")] if out else []
    return dict(zip(("name", "driver", "memory"), parts, strict=False))


def versions() -> dict[str, str]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def machine(command: str = "") -> dict[str, object]:
    """Facts recorded with every benchmark result."""
    info: dict[str, object] = {
        "command": command,
        "host": socket.gethostname(),
        "date": str(date.today()),
        "cpu": cpu_model(),
        # the instruction sets that pick ONNX Runtime's kernels (int8: VNNI/AMX or not)
        "cpu_flags": list(cpu_info().flags),
        "cpu_int8_form": "int8-cpu" if int8_dot_here() else "int8-cpu7",
        "cpu_int8_exact_measured": int8_kernels_exact(),
        "cpu_flags_dispatched": dispatched_flags(),
        # a benchmark run under tests/isa_mask: the CPU it stands for, not the host's
        "cpuid_mask": cpuid_mask(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "libraries": versions(),
        "gpu": None,
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            smi = _nvidia_smi()
            info["gpu"] = {
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
                "driver": smi.get("driver"),
                "cuda_runtime": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
            }
    except ImportError:
        pass
    return info


def machine_label(meta: dict) -> str:
    """A short name for tables: the GPU when there is one, else the CPU and its core count."""
    gpu = meta.get("gpu")
    if gpu:
        return f"{gpu['name']} ({meta['host']})"
    return f"{meta['cpu']} x{meta['cpu_count']} ({meta['host']})"
