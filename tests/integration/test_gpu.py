"""On a CUDA GPU (skipped elsewhere): the PyTorch CUDA path scores as ONNX Runtime on the CPU does,
fp16 keeps the ranking, ``cuda:N`` is honoured or refused in one line, ``auto`` never falls back to
the CPU, and ``cyto score --device cuda`` writes the table the CPU writes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scipy.stats import spearmanr

from cyto.errors import DeviceError
from cyto.runtime.devices import cuda_available, resolve_device
from cyto.runtime.scorer import load_scorer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cyto_sees_the_gpu_torch_sees():
    # cyto looks for /dev/nvidiaN before importing torch: that shortcut must not hide a GPU
    assert cuda_available()
    assert resolve_device("auto") == "cuda:0"


def _cells(tiny, n=96, seed=0):
    """The synthetic cells the bundles learned from (random noise gives some tiny models, DROC's
    among them, one constant score: nothing to compare a ranking on)."""
    idx = np.random.default_rng(seed).choice(len(tiny.images), n)
    return np.ascontiguousarray(tiny.images[idx])


@pytest.mark.parametrize("method", ["fs-sil", "ws-sil", "dsvdd", "droc", "its2clr"])
def test_torch_cuda_scores_equal_onnxruntime_cpu(exported_bundles, tiny, method):
    bundle = exported_bundles[method]
    x = _cells(tiny)
    cpu = load_scorer(bundle, "onnx", "cpu").score(x, batch_size=32)
    gpu_scorer = load_scorer(bundle, "torch", "cuda")
    assert gpu_scorer.device == "cuda:0"
    gpu = gpu_scorer.score(x, batch_size=32)
    scale = float(np.abs(cpu).max()) + 1e-12
    # fp32 on both sides (TF32 off): float32 rounding, not 10-bit-mantissa differences
    assert np.abs(gpu - cpu).max() <= 1e-4 * scale, np.abs(gpu - cpu).max() / scale
    assert np.ptp(cpu) > 0 and spearmanr(gpu, cpu).statistic > 0.9999


@pytest.mark.parametrize("method", ["fs-sil", "dsvdd"])
def test_torch_cuda_fp16_keeps_the_ranking(exported_bundles, tiny, method):
    bundle = exported_bundles[method]
    x = _cells(tiny, n=200, seed=1)
    fp32 = load_scorer(bundle, "torch", "cuda").score(x)
    half = load_scorer(bundle, "torch", "cuda", precision="fp16")
    assert half.precision == "fp16"
    fp16 = half.score(x)
    assert np.isfinite(fp16).all()
    assert spearmanr(fp16, fp32).statistic > 0.99


def _ort_cuda() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


needs_ort_cuda = pytest.mark.skipif(
    not _ort_cuda(), reason="needs onnxruntime-gpu with its CUDA provider"
)


@needs_ort_cuda
@pytest.mark.parametrize("method", ["fs-sil", "dsvdd", "droc"])
def test_onnxruntime_cuda_opens_a_session_and_scores_as_the_cpu(exported_bundles, tiny, method):
    """Every exported graph has Shape -> Concat -> Resize(sizes) nodes that the CUDA provider
    places on the CPU on purpose: the session must open (no CPU-fallback ban), run on the GPU
    (its provider first) and give the CPU's fp32 numbers."""
    bundle = exported_bundles[method]
    x = _cells(tiny)
    cpu = load_scorer(bundle, "onnx", "cpu").score(x, batch_size=32)
    scorer = load_scorer(bundle, "onnx", "cuda")
    assert scorer.device == "cuda:0" and scorer.backend.name == "onnx"
    assert scorer.backend.providers[0] == "CUDAExecutionProvider", scorer.backend.providers
    gpu = scorer.score(x, batch_size=32)
    scale = float(np.abs(cpu).max()) + 1e-12
    assert np.abs(gpu - cpu).max() <= 1e-4 * scale, np.abs(gpu - cpu).max() / scale


@needs_ort_cuda
def test_onnxruntime_cuda_verifies_fp32_and_fp16_and_auto_takes_fp16(
    exported_bundles, synth_patches, tiny, tmp_path
):
    """Both graphs open and pass the golden cells on ONNX Runtime's CUDA provider, and auto
    takes fp16 on the GPU (without a TensorRT engine: ONNX Runtime's fp16 graph, which ran at
    1.8x PyTorch fp16 at batch 64 on an H200, benchmarks/results/h200/ort-cuda)."""
    import shutil

    from cyto.export.api import export_bundle
    from cyto.export.golden import write_golden

    bundle = shutil.copytree(exported_bundles["fs-sil"], tmp_path / "fs.cyto")
    write_golden(bundle, synth_patches, normal="normal", n=64)
    export_bundle(bundle, onnx=False, precisions=("fp16",), echo=lambda m: None)
    x = _cells(tiny, n=200, seed=2)
    full = load_scorer(bundle, "onnx", "cuda")
    half = load_scorer(bundle, "onnx", "cuda", precision="fp16")
    assert half.precision == "fp16" and half.backend.providers[0] == "CUDAExecutionProvider"
    for scorer in (full, half):  # the golden cells export wrote, verified on this GPU
        assert scorer.verification.passed, scorer.verification.words()
    fp32 = full.score(x)
    fp16 = half.score(x)
    assert np.isfinite(fp16).all() and spearmanr(fp16, fp32).statistic > 0.99
    auto = load_scorer(bundle, "auto", "auto", "auto")
    assert auto.device.startswith("cuda:"), auto.describe()
    if auto.backend.name != "trt":
        assert (auto.backend.name, auto.precision) == ("onnx", "fp16"), auto.describe()
        assert auto.verification.passed


def test_cuda_index_past_the_last_gpu_is_one_clear_error():
    n = torch.cuda.device_count()
    assert resolve_device("cuda") == "cuda:0"
    assert resolve_device(f"cuda:{n - 1}") == f"cuda:{n - 1}"
    with pytest.raises(DeviceError, match=f"has {n} CUDA GPU"):
        resolve_device(f"cuda:{n}")


def test_auto_on_a_gpu_never_picks_the_cpu(exported_bundles):
    scorer = load_scorer(exported_bundles["dsvdd"], "auto", "auto")
    assert scorer.device.startswith("cuda:")
    # without TensorRT or onnxruntime-gpu installed, the notes say why PyTorch was chosen
    if scorer.backend.name == "torch":
        assert scorer.notes


def test_score_on_cuda_writes_the_cpu_table(exported_dsvdd, tmp_path):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from tests.integration.test_score import score_cli

    slide = write_slide(
        tmp_path / "s.ndpi", SlideSynthConfig(width=1536, height=1024, seed=3)
    ).paths[0]
    tables = {}
    for device, backend in (("cpu", "onnx"), ("cuda", "torch")):
        out = tmp_path / device
        proc = score_cli(slide, exported_dsvdd, out, "--device", device, "--backend", backend)
        assert proc.returncode == 0, proc.stderr
        tables[device] = pq.read_table(out / "s" / "scores.parquet").sort_by("cell_id")
        summary = json.loads((out / "s" / "summary.json").read_text())
        assert summary["device"].startswith(device)
    cpu, gpu = (np.asarray(tables[d]["score"]) for d in ("cpu", "cuda"))
    assert tables["cpu"]["cell_id"].equals(tables["cuda"]["cell_id"])
    assert np.abs(gpu - cpu).max() <= 1e-4 * (np.abs(cpu).max() + 1e-12)


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_the_device_path_on_cuda_writes_the_cpu_table(exported_dsvdd, tmp_path, overlap):
    """--decode torch on CUDA: tiles decoded, nuclei found, crops cut and scored (head included)
    on the GPU, the engine in its own thread and stream or not: the CPU path's cells and scores,
    and the host->device traffic is the JPEG bytes, not the crops."""
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.infer import ScoreOptions, score_slide

    slide = write_slide(
        tmp_path / "s.tif", SlideSynthConfig(width=2048, height=1536, seed=3)
    ).paths[0]
    cpu = score_slide(slide, exported_dsvdd, tmp_path / "cpu", ScoreOptions(mosaic=0, workers=0))
    gpu_opts = ScoreOptions(
        mosaic=0, device="cuda", backend="torch", decode="torch", overlap=overlap
    )
    gpu = score_slide(slide, exported_dsvdd, tmp_path / "gpu", gpu_opts)
    assert "torchvision" in gpu["decode"] and gpu["workers"] == 0
    lane = gpu["engine_lane"]
    assert lane["overlap"] is (overlap == "on") and 0 < lane["gpu_busy_fraction"] <= 1
    crop_bytes = 3 * load_scorer(exported_dsvdd, "torch", "cpu").spec.crop_size ** 2
    assert 0 < lane["h2d_bytes_per_cell"] < crop_bytes  # JPEG bytes only, no crop uploaded
    a = pq.read_table(tmp_path / "cpu" / "scores.parquet")
    b = pq.read_table(tmp_path / "gpu" / "scores.parquet")
    assert a.select(["cell_id", "x", "y"]).equals(b.select(["cell_id", "x", "y"]))
    sa, sb = np.asarray(a["score"]), np.asarray(b["score"])
    assert np.abs(sb - sa).max() <= 1e-4 * (np.abs(sa).max() + 1e-12)
    assert cpu["cells_scored"] == gpu["cells_scored"] > 0


def test_bench_engine_gpu_memory_is_this_configurations(exported_bundles):
    from cyto.bench.engine import bench_engine

    rows = bench_engine(
        exported_bundles["fs-sil"],
        ["cuda"],
        ["torch", "torch-channels-last"],
        ["fp32", "fp16"],
        [64],
        repeats=3,
        budget=0.5,
        echo=lambda m: None,
    )
    measured = [r for r in rows if r.get("available")]
    assert len(measured) == 4
    # each configuration's memory is counted from what was in use before its runner existed
    assert all(r["gpu_used_mb"] >= 0 for r in measured), [r["gpu_used_mb"] for r in measured]
