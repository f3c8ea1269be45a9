"""``cyto bench engine``: patches/s and batch latency of every backend, precision and batch size.

Each configuration gets random uint8 patches (seeded), warm-up calls (compilation, graph
optimisation, allocator), then timed calls until ``repeats`` or the time budget runs out; the GPU
is synchronised before every clock read. Reported: patches/s at the median latency, p50 and p99
latency, peak GPU memory of the configuration and the process's host RSS. A backend, precision or
batch that cannot run here is listed with the reason instead of a number.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, load_bundle

BACKENDS = ("torch-eager", "torch-channels-last", "torch-compile", "onnxruntime", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8")


@dataclass
class Runner:
    run: Callable[[np.ndarray], object]
    sync: Callable[[], None]
    cleanup: Callable[[], None] = lambda: None


class Unavailable(Exception):
    """This configuration cannot run here; the message says why."""


def host_rss_mb() -> float | None:
    from cyto.infer.pipeline import proc_status_mb

    return proc_status_mb("VmRSS")


def _torch_runner(bundle: Bundle, device: str, precision: str, variant: str) -> Runner:
    import torch

    from cyto.models.from_bundle import load_scorer

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU here")
    if precision == "int8":
        raise Unavailable("int8 runs through TensorRT only (cyto export --trt --int8)")
    if precision == "fp16" and not device.startswith("cuda"):
        raise Unavailable("fp16 autocast is benchmarked on CUDA only (slow or unsupported on CPU)")
    module = load_scorer(bundle, device).module.eval()
    if variant == "channels-last":
        module = module.to(memory_format=torch.channels_last)
    if variant == "compile":
        if not hasattr(torch, "compile"):
            raise Unavailable("this PyTorch has no torch.compile")
        module = torch.compile(module)  # dynamic after the first new shape: few recompiles
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def run(x: np.ndarray):
        with torch.inference_mode():
            t = torch.from_numpy(x).to(dev, non_blocking=True)
            if precision == "fp16":
                with torch.autocast("cuda", dtype=torch.float16):
                    return module(t).float().cpu()
            return module(t).float().cpu()

    return Runner(run, sync)


def _onnx_runner(bundle: Bundle, device: str, precision: str) -> Runner:
    if importlib.util.find_spec("onnxruntime") is None:
        raise Unavailable("onnxruntime is not installed (pip install 'cyto[cpu]')")
    if "onnx" not in bundle.manifest:
        raise Unavailable("the bundle has no encoder.onnx (cyto export MODEL --onnx)")
    if precision != "fp32":
        raise Unavailable("the exported ONNX graph is fp32; fp16/int8 run through TensorRT")
    from cyto.errors import DeviceError
    from cyto.export.runtime import OnnxScorer

    try:
        scorer = OnnxScorer.open(bundle, device=device)
    except DeviceError as exc:
        raise Unavailable(str(exc)) from exc
    return Runner(lambda x: scorer.raw(x, len(x)), lambda: None)


def _trt_runner(bundle: Bundle, device: str, precision: str) -> Runner:
    if importlib.util.find_spec("tensorrt") is None:
        raise Unavailable("tensorrt is not installed (pip install 'cyto[gpu]' on a CUDA machine)")
    if not device.startswith("cuda"):
        raise Unavailable("TensorRT runs on CUDA only")
    import torch

    if not torch.cuda.is_available():
        raise Unavailable("no CUDA GPU here")
    from cyto.export.trt import TrtRunner
    from cyto.infer.engine import trt_engine_entry

    entry = trt_engine_entry(bundle, precision)
    if entry is None:
        raise Unavailable(
            f"no {precision} engine for this GPU and TensorRT version in the bundle "
            f"(cyto export MODEL --trt{' --int8' if precision == 'int8' else ''})"
        )
    runner = TrtRunner(bundle.path / entry["file"], bundle.manifest["onnx"])
    return Runner(runner.run, torch.cuda.synchronize)


def make_runner(bundle: Bundle, backend: str, device: str, precision: str) -> Runner:
    if backend == "torch-eager":
        return _torch_runner(bundle, device, precision, "eager")
    if backend == "torch-channels-last":
        return _torch_runner(bundle, device, precision, "channels-last")
    if backend == "torch-compile":
        return _torch_runner(bundle, device, precision, "compile")
    if backend == "onnxruntime":
        return _onnx_runner(bundle, device, precision)
    if backend == "tensorrt":
        return _trt_runner(bundle, device, precision)
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
    cfg = bundle.manifest["config"]
    sizes = sizes or [int(cfg.get("load_size") or bundle.manifest["input_size"])]
    rng = np.random.default_rng(0)
    rows = []
    for device in devices:
        for backend in backends:
            for precision in precisions:
                base = {"device": device, "backend": backend, "precision": precision}
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
    return rows


def _measure(runner: Runner, x: np.ndarray, base: dict, warmup, repeats, budget, echo) -> dict:
    batch, size = x.shape[0], x.shape[1]
    row = {**base, "size": size, "batch": batch}
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
            "host_rss_mb": host_rss_mb(),
        }
    )
    if gpu:
        import torch

        row["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    echo(
        f"{base['device']:5s} {base['backend']:20s} {base['precision']} {size}px b{batch:<4d} "
        f"{row['patches_per_s']:>9.1f} patches/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms"
    )
    return row


def ratios(rows: list[dict]) -> list[dict]:
    """Speed-up of every available row over PyTorch eager fp32 on the same device, size, batch."""
    base = {
        (r["device"], r["size"], r["batch"]): r["patches_per_s"]
        for r in rows
        if r.get("available") and r["backend"] == "torch-eager" and r["precision"] == "fp32"
    }
    out = []
    for r in rows:
        key = (r["device"], r.get("size"), r.get("batch"))
        if r.get("available") and key in base:
            out.append({**r, "vs_torch_eager_fp32": round(r["patches_per_s"] / base[key], 2)})
        else:
            out.append(r)
    return out
