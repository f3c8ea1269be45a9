"""``cyto bench engine``: patches/s and batch latency of every backend, precision and batch size.

Each configuration gets random uint8 patches (seeded), warm-up calls (compilation, graph
optimisation, allocator), then timed calls until ``repeats`` or the time budget runs out; the GPU
is synchronised before every clock read. Reported: patches/s at the median latency, p50 and p99
latency, peak GPU memory of the configuration and the process's host RSS. A backend, precision or
batch that cannot run here is listed with the reason instead of a number.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, load_bundle

# the runtime's backends (cyto.runtime.backends) and two PyTorch variants only benchmarked here
BACKENDS = ("torch", "torch-channels-last", "torch-compile", "onnx", "openvino", "onnx-trt", "trt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# names used by results written before the runtime had one vocabulary
ALIASES = {"torch-eager": "torch", "onnxruntime": "onnx", "tensorrt": "trt"}


def canonical_backend(name: str) -> str:
    return ALIASES.get(name, name)


@dataclass
class Runner:
    run: Callable[[np.ndarray], object]
    sync: Callable[[], None]
    cleanup: Callable[[], None] = lambda: None
    #: the runtime's check on the golden cells here (runtime backends only)
    verification: str | None = None


class Unavailable(Exception):
    """This configuration cannot run here; the message says why."""


def host_rss_mb() -> float | None:
    from cyto.infer.memory import proc_status_mb

    return proc_status_mb("VmRSS")


def _cuda_sync(device: str) -> Callable[[], None]:
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(torch.device(device))


def _torch_runner(bundle: Bundle, device: str, precision: str, variant: str) -> Runner:
    import torch

    from cyto.errors import ConfigError
    from cyto.runtime.backends.torch import TorchBackend

    try:  # the precisions PyTorch runs are the runtime backend's: fp32, and fp16 on CUDA
        module = TorchBackend(bundle, device, precision).module
    except ConfigError as exc:
        raise Unavailable(str(exc)) from exc
    if variant == "channels-last":
        module = module.to(memory_format=torch.channels_last)
    if variant == "compile":
        if not hasattr(torch, "compile"):
            raise Unavailable("this PyTorch has no torch.compile")
        module = torch.compile(module)  # dynamic after the first new shape: few recompiles
    dev = torch.device(device)

    def run(x: np.ndarray):
        with torch.inference_mode():
            t = torch.from_numpy(x).to(dev, non_blocking=True)
            if precision == "fp16":
                with torch.autocast("cuda", dtype=torch.float16):
                    return module(t).float().cpu()
            return module(t).float().cpu()

    return Runner(run, _cuda_sync(device))


def _runtime_runner(bundle: Bundle, backend: str, device: str, precision: str) -> Runner:
    """A backend of the runtime exactly as ``cyto score`` runs it (no head: the network only)."""
    from cyto.errors import CytoError, VerificationError
    from cyto.runtime.backends import precision_refused
    from cyto.runtime.scorer import graph_of, load_scorer

    if backend == "openvino" and device != "cpu":
        raise Unavailable("openvino runs on the CPU only")
    if backend not in ("onnx", "openvino") and not device.startswith("cuda"):
        raise Unavailable(f"{backend} runs on CUDA only")
    refused = precision_refused(backend, precision, device)
    if refused:  # the runtime's rule: OpenVINO's fp16 is no missing graph (round 60, 2)
        raise Unavailable(refused)
    if graph_of(bundle, backend, precision, device) is None:
        from cyto.runtime.verify import export_hint

        make = export_hint(bundle, precision)
        raise Unavailable(f"the bundle has no {precision} ONNX graph: make one with {make}")
    try:  # verified on the golden cells first, as cyto score does: a failing graph is not timed
        scorer = load_scorer(bundle, backend, device, precision)
    except VerificationError as exc:
        raise Unavailable(f"fails verification here: {exc}") from exc
    except CytoError as exc:
        raise Unavailable(str(exc)) from exc
    be = scorer.backend
    v = scorer.verification
    return Runner(be.run, _cuda_sync(device), be.close, v.status if v is not None else None)


def make_runner(bundle: Bundle, backend: str, device: str, precision: str) -> Runner:
    backend = canonical_backend(backend)
    if device.startswith("cuda"):
        from cyto.errors import CytoError
        from cyto.runtime.devices import resolve_device

        try:
            device = resolve_device(device)
        except CytoError as exc:
            raise Unavailable(str(exc)) from exc
    if backend == "torch":
        return _torch_runner(bundle, device, precision, "eager")
    if backend == "torch-channels-last":
        return _torch_runner(bundle, device, precision, "channels-last")
    if backend == "torch-compile":
        return _torch_runner(bundle, device, precision, "compile")
    if backend in ("onnx", "openvino", "onnx-trt", "trt"):
        return _runtime_runner(bundle, backend, device, precision)
    raise Unavailable(f"unknown backend {backend!r}")


def time_calls(
    call: Callable[[], object], sync: Callable[[], None], warmup: int, repeats: int, budget: float
) -> list[float]:
    """Latencies (s) of ``call`` after ``warmup`` calls; stops at ``repeats`` or after ``budget``
    seconds (but never before 3 timed calls)."""
    for _ in range(warmup):
        call()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def bench_engine(
    model: Path,
    devices: list[str],
    backends: list[str],
    precisions: list[str],
    batches: list[int],
    sizes: list[int] | None = None,
    warmup: int = 2,
    repeats: int = 10,
    budget: float = 5.0,
    echo=print,
) -> list[dict]:
    """One row per (device, backend, precision, size, batch); unavailable ones carry a reason."""
    bundle = load_bundle(Path(model))
    sizes = sizes or [bundle.spec.crop_size]
    rng = np.random.default_rng(0)
    rows = []
    for device in devices:
        for backend in backends:
            for precision in precisions:
                base = {"device": device, "backend": backend, "precision": precision}
                if device.startswith("cuda") and _cuda_ok(device):
                    _release_gpu()  # the last runner's memory is not this one's
                    base["gpu_used_before_mb"] = round(device_used_mb(device), 1)
                try:
                    runner = make_runner(bundle, backend, device, precision)
                except Unavailable as exc:
                    rows.append({**base, "available": False, "reason": str(exc)})
                    echo(f"{device:5s} {backend:20s} {precision}: unavailable ({exc})")
                    continue
                for size in sizes:
                    for batch in batches:
                        x = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
                        rows.append(_measure(runner, x, base, warmup, repeats, budget, echo))
                runner.cleanup()
                del runner
    return rows


def _release_gpu() -> None:
    """Give back what finished runners left in PyTorch's caching allocator."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def device_used_mb(device: str) -> float:
    """Memory in use on the whole GPU (cudaMemGetInfo): sees TensorRT's and ONNX Runtime's
    allocations, which PyTorch's allocator statistics do not."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return (total - free) / 2**20


def _measure(runner: Runner, x: np.ndarray, base: dict, warmup, repeats, budget, echo) -> dict:
    batch, size = x.shape[0], x.shape[1]
    row = {**base, "size": size, "batch": batch}
    if runner.verification is not None:
        row["verification"] = runner.verification
    gpu = base["device"].startswith("cuda")
    if gpu:
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        times = time_calls(lambda: runner.run(x), runner.sync, warmup, repeats, budget)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory or a compiler missing
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        echo(f"{base['device']:5s} {base['backend']:20s} {base['precision']} b{batch}: {reason}")
        return {**row, "available": False, "reason": reason}
    med = statistics.median(times)
    row.update(
        {
            "available": True,
            "patches_per_s": round(batch / med, 1),
            "p50_ms": round(1000 * med, 2),
            "p99_ms": round(1000 * float(np.percentile(times, 99)), 2),
            "repeats": len(times),
            "repeats_asked": repeats,  # fewer timed: the time budget ran out first
            # how far apart its own calls were: rows closer than this are not told apart
            "spread_pct": round(100 * (max(times) - min(times)) / med, 1),
            "host_rss_mb": host_rss_mb(),
        }
    )
    if gpu:
        import torch

        row["gpu_used_mb"] = round(device_used_mb(base["device"]) - base["gpu_used_before_mb"], 1)
        row["gpu_used_method"] = (
            "device-wide cudaMemGetInfo, less what was in use before the runner"
        )
        if base["backend"].startswith("torch"):
            row["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    echo(
        f"{base['device']:5s} {base['backend']:20s} {base['precision']} {size}px b{batch:<4d} "
        f"{row['patches_per_s']:>9.1f} patches/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms"
    )
    return row


def _cuda_ok(device: str) -> bool:
    from cyto.runtime.devices import cuda_available

    return cuda_available()


def ratios(rows: list[dict]) -> list[dict]:
    """Speed-up of every available row over PyTorch eager fp32 on the same device, size, batch."""
    base = {
        (r["device"], r["size"], r["batch"]): r["patches_per_s"]
        for r in rows
        if r.get("available")
        and canonical_backend(r["backend"]) == "torch"
        and r["precision"] == "fp32"
    }
    out = []
    for r in rows:
        key = (r["device"], r.get("size"), r.get("batch"))
        if r.get("available") and key in base:
            out.append({**r, "vs_torch_eager_fp32": round(r["patches_per_s"] / base[key], 2)})
        else:
            out.append(r)
    return out
