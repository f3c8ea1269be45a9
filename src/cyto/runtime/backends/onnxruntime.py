"""ONNX Runtime backend: the bundle's ONNX graph on the CPU, or on a GPU through the CUDA or
TensorRT execution provider.

On a GPU nothing may run on the CPU unnoticed: ONNX Runtime quietly drops to its CPU provider
when the CUDA libraries are missing. So the providers the session really got are checked (the
GPU provider first), on the device index of ``cuda:N``. The CPU provider stays in the list for
the shape arithmetic ONNX Runtime places there on purpose (see :func:`session_plan`); a graph
that computes wrong or slow there is caught by the verification on the golden cells.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, GraphSpec
from cyto.errors import BundleError, DeviceError, MissingDependencyError
from cyto.flags import passing
from cyto.runtime.machine import graph_for

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
# on a CPU, cells/s is flat from 8 to 128 cells per call (benchmarks/results/vm-2core, ResNet18
# at 224 px: 56 patches/s) while memory grows with the batch: 16 keeps the activations small
CPU_MAX_BATCH = 16
INSTALL_CPU = "pip install 'cyto[cpu]'"
INSTALL_GPU = "pip install 'cyto[gpu]' (onnxruntime-gpu, never next to onnxruntime)"


def require_onnxruntime():
    """Import onnxruntime (either build), or raise the one error naming the extra to install."""
    missing = MissingDependencyError(
        "onnxruntime", "ONNX Runtime scoring", f"{INSTALL_CPU} (or {INSTALL_GPU})"
    )
    if importlib.util.find_spec("onnxruntime") is None:
        raise missing
    try:
        import onnxruntime as ort
    except ImportError as exc:  # a broken install, or both builds on top of each other
        raise missing from exc
    return ort


def provider_library(name: str = "tensorrt") -> Path | None:
    """The shared library of one of onnxruntime-gpu's providers, where the package has it."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    capi = Path(next(iter(spec.submodule_search_locations))) / "capi"
    for pattern in (f"libonnxruntime_providers_{name}.so", f"onnxruntime_providers_{name}.dll"):
        hit = capi / pattern
        if hit.is_file():
            return hit
    return None


def linked_tensorrt_major(library: Path | None) -> int | None:
    """The TensorRT major version a provider library was linked against (its ``libnvinfer.so.N``
    or ``nvinfer_N.dll`` dependency), read from the file; None when it names none."""
    if library is None:
        return None
    import re

    try:
        data = library.read_bytes()
    except OSError:
        return None
    m = re.search(rb"(?:libnvinfer\.so\.|nvinfer_)(\d+)", data)
    return int(m.group(1)) if m else None


def installed_tensorrt_major() -> int | None:
    """The major version of the TensorRT Python package installed here (metadata, no import)."""
    import importlib.metadata as md

    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11"):
        try:
            return int(md.version(dist).split(".")[0])
        except (md.PackageNotFoundError, ValueError):
            continue
    return None


def tensorrt_provider_mismatch() -> str | None:
    """Why ONNX Runtime's TensorRT provider cannot load next to the installed TensorRT, if it
    cannot: onnxruntime-gpu links one TensorRT major (10 for its CUDA 12 builds), while the
    ``tensorrt`` package of another major (11, CUDA 13 by default) may sit beside it."""
    linked = linked_tensorrt_major(provider_library("tensorrt"))
    have = installed_tensorrt_major()
    if linked is None or have is None or linked == have:
        return None
    return (
        f"onnxruntime-gpu's TensorRT provider is built for TensorRT {linked}, but TensorRT "
        f"{have} is installed: {passing('backend', 'onnx-trt')} cannot load here. Use "
        f"{passing('backend', 'trt')} (cyto's own TensorRT engines), or install TensorRT "
        f"{linked} (pip install 'cyto[gpu]')"
    )


def tensorrt_libraries_missing() -> str | None:
    """Why ONNX Runtime's TensorRT provider would not start here, or None: the TensorRT
    libraries it links (``libnvinfer.so.N``, ``libnvonnxparser.so.N``) do not load. Checked
    before the session: when they do not load, ONNX Runtime prints an "EP Error" banner and
    falls back to its CUDA provider (an H200 without TensorRT, benchmarks/results/h200/ort-cuda).
    The ``tensorrt`` package of that major, where installed, is imported first: it loads its
    own copies of the libraries (pip's ``tensorrt_libs``), which the provider then finds."""
    import ctypes
    import sys

    linked = linked_tensorrt_major(provider_library("tensorrt"))
    if linked is None or not sys.platform.startswith("linux"):
        return None
    if installed_tensorrt_major() == linked:
        import contextlib

        # a broken TensorRT shows in the check below
        with contextlib.suppress(Exception):
            importlib.import_module("tensorrt")
    for lib in (f"libnvinfer.so.{linked}", f"libnvonnxparser.so.{linked}"):
        try:
            ctypes.CDLL(lib)
        except OSError:
            return (
                f"ONNX Runtime's TensorRT provider needs {lib}, which does not load here: "
                + _tensorrt_remedy(linked)
            )
    return None


def _tensorrt_remedy(linked: int | None) -> str:
    version = f" {linked}" if linked else ""
    return (
        f"install TensorRT{version} (pip install 'cyto[gpu]'), or use "
        f"{passing('backend', 'onnx')} (its CUDA provider)"
    )


def available_providers() -> list[str]:
    return list(require_onnxruntime().get_available_providers())


def session_plan(
    device: str, provider: str, cache_dir: Path | None = None, precision: str = "fp32"
) -> tuple[list, dict[str, str]]:
    """(providers with their options, session config entries) for ``device`` (``cpu`` or a
    resolved ``cuda:N``), ``provider`` (``cuda`` or ``tensorrt``) and the graph's
    ``precision``.

    The CPU provider stays last in a GPU session: ONNX Runtime places shape arithmetic
    (``Shape -> Concat -> Resize(sizes)``, in every graph cyto exports) on the CPU on purpose,
    so ``session.disable_cpu_ep_fallback`` would refuse every graph. That the GPU provider
    really runs is checked on the session instead. fp32 stays fp32: the CUDA provider's TF32
    is off (as the PyTorch backend's). The TensorRT provider builds its own engine from the
    graph: Q/DQ graphs need its int8 mode (explicit quantization: no calibration table) and
    fp16 graphs its fp16 mode.

    On the CPU, the intra-op threads sleep between calls instead of spinning: the cores are
    shared with nucleus detection and the decode workers, which spinning threads starve
    (``cyto bench slide`` on 2 cores: +6-7 % cells/s with one decode worker, the same in one
    process and for the engine alone; benchmarks/results/vm-2core/ort-spinning)."""
    if device == "cpu":
        return [CPU], {"session.intra_op.allow_spinning": "0"}
    index = int(device.split(":")[1]) if ":" in device else 0
    cuda = (CUDA, {"device_id": str(index), "use_tf32": "0"})
    if provider == "cuda":
        return [cuda, CPU], {}
    trt_opts = {
        "device_id": str(index),
        "trt_fp16_enable": str(precision == "fp16"),
        "trt_int8_enable": str(precision == "int8"),
    }
    if cache_dir is not None:
        trt_opts.update(
            trt_engine_cache_enable="True",
            trt_engine_cache_path=str(cache_dir),
            trt_timing_cache_enable="True",
            trt_timing_cache_path=str(cache_dir),
        )
    return [(TRT, trt_opts), cuda, CPU], {}


class OnnxRuntimeBackend:
    """``encoder.onnx`` (or a quantized variant) in an ONNX Runtime session."""

    def __init__(
        self,
        bundle: Bundle,
        device: str = "cpu",
        precision: str = "fp32",
        threads: int | None = None,
        provider: str = "cuda",
        graph: GraphSpec | None = None,
    ) -> None:
        ort = require_onnxruntime()
        # ``graph``: another of the bundle's forms of ``precision`` than this machine's default
        # (the other CPU int8 form, when the default failed verification here)
        graph = graph or graph_for(bundle.spec, precision, device)
        if graph is None:
            raise BundleError(_no_graph(bundle, precision))
        self.graph: GraphSpec = graph
        self.device = device
        self.precision = precision
        self.name = "onnx-trt" if provider == "tensorrt" and device != "cpu" else "onnx"
        self.max_batch = CPU_MAX_BATCH if device == "cpu" else None
        if device != "cpu":
            want = TRT if provider == "tensorrt" else CUDA
            mismatch = tensorrt_provider_mismatch() if want == TRT else None
            if mismatch:
                raise DeviceError(mismatch)
            if want not in available_providers():
                raise DeviceError(
                    f"ONNX Runtime here has no {want}: install {INSTALL_GPU}"
                    + (" with TensorRT's libraries" if want == TRT else "")
                )
            missing = tensorrt_libraries_missing() if want == TRT else None
            if missing:
                raise DeviceError(missing)
        cache = bundle.path / "engines" / "ort-tensorrt" if provider == "tensorrt" else None
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
        providers, entries = session_plan(device, provider, cache, precision)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        # the CPU arena keeps every batch's peak and grows by doubling: 1.5 GB for a 224 px CNN
        # at batch 64 where 0.67 GB is planned, at the same speed (benchmarks/results, memory)
        opts.enable_cpu_mem_arena = False
        # errors only: onnxruntime-gpu 1.31 warns on every CUDA session (plugin EP lookup, the
        # copies around the CPU's shape nodes), which reached the console of cyto score
        opts.log_severity_level = 3
        for k, v in entries.items():
            opts.add_session_config_entry(k, v)
        data = bundle.graph_bytes(graph)  # what the manifest (and the verification) named
        try:
            self.session = ort.InferenceSession(data, opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped errors
            raise DeviceError(f"ONNX Runtime cannot open {graph.file} on {device}: {exc}") from exc
        got = self.session.get_providers()
        first = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if device != "cpu" and got[0] != first:
            if first == TRT:
                linked = linked_tensorrt_major(provider_library("tensorrt"))
                lib = f"libnvinfer.so.{linked}" if linked else "libnvinfer"
                raise DeviceError(
                    f"ONNX Runtime could not start its TensorRT provider on {device} (got "
                    f"{got}): TensorRT's libraries ({lib}) do not load here; "
                    + _tensorrt_remedy(linked)
                )
            raise DeviceError(
                f"ONNX Runtime could not start its GPU provider on {device} (got {got}; CUDA or "
                "cuDNN libraries missing?); refusing to fall back to the CPU silently"
            )
        self.providers = got

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(batch, dtype=np.uint8)
        return self.session.run([self.graph.output], {self.graph.input: x})[0]

    def close(self) -> None:
        self.session = None


def _no_graph(bundle: Bundle, precision: str) -> str:
    have = ", ".join(sorted(bundle.spec.graphs)) or "none"
    from cyto.runtime.verify import export_hint

    if precision == "fp32":
        return (
            f"{bundle.path} has no encoder.onnx: run {export_hint(bundle, precision)} first "
            f"(exported graphs: {have})"
        )

    return (
        f"{bundle.path} has no {precision} graph (exported graphs: {have}): make one with "
        f"{export_hint(bundle, precision)}"
    )
