"""The engine lane (issue 15): the engine in a thread of its own with at most two batches out,
device crops handed to the engine as tensors with the head finished on the device, and the
host-to-device bytes counted. Run here with the device set to the CPU: the same code paths a
GPU run takes, less the CUDA streams and events."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.infer import ScoreOptions, score_slide
from cyto.runtime import devices, load_scorer
from cyto.runtime.lane import EngineLane
from tests.tables import same_table


@pytest.fixture(scope="module")
def tif(tmp_path_factory):
    root = tmp_path_factory.mktemp("lane")
    return write_slide(root / "s.tif", SlideSynthConfig(width=1024, height=768, seed=4)).paths[0]


class _Slow:
    """A scorer that records the thread and the order of its calls."""

    device = "cpu"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.threads, self.seen, self.gate = [], [], gate

    def score(self, images, batch_size):
        if self.gate is not None:
            assert self.gate.wait(10)
        self.threads.append(threading.current_thread().name)
        self.seen.append(int(images[0, 0, 0, 0]))
        if int(images[0, 0, 0, 0]) == 99:
            raise RuntimeError("engine failed on batch 99")
        return images[:, 0, 0, 0].astype(np.float64)


def _batch(i: int, n: int = 3) -> np.ndarray:
    return np.full((n, 2, 2, 3), i, dtype=np.uint8)


def test_the_lane_keeps_order_bounds_what_is_out_and_raises_where_taken():
    gate = threading.Event()
    scorer = _Slow(gate)
    lane = EngineLane(scorer, 8, overlap=True, depth=2)
    assert lane.submit(_batch(1), "a") == [] and lane.submit(_batch(2), "b") == []
    assert len(lane) == 2  # the engine is held: both are out, none taken back yet
    gate.set()
    done = lane.submit(_batch(3), "c")  # a third must wait for the first
    assert [(s.tolist(), t) for s, t in done] == [([1.0, 1.0, 1.0], "a")]
    assert [t for _, t in lane.drain()] == ["b", "c"] and len(lane) == 0
    assert set(scorer.threads) != {threading.current_thread().name}  # ran in the lane's thread
    assert scorer.seen == [1, 2, 3] and lane.calls == 3 and lane.wall_s > 0
    lane.submit(_batch(99), "bad")
    with pytest.raises(RuntimeError, match="batch 99"):
        lane.drain()
    lane.close()
    # without overlap: the same results, in the caller's thread
    plain = _Slow()
    lane = EngineLane(plain, 8, overlap=False)
    lane.submit(_batch(5), "x")
    assert [t for _, t in lane.drain()] == ["x"]
    assert plain.threads == [threading.current_thread().name]


def test_overlap_gives_the_same_table_chunks_and_resume(exported_dsvdd, tif, tmp_path):
    # one engine for every run: the resumed table is compared with the first bit for bit
    base = ScoreOptions(
        mosaic=0, workers=0, tile=256, chunk_cells=16, batch_size=4, backend="onnx",
        precision="fp32",
    )  # fmt: skip
    off = score_slide(tif, exported_dsvdd, tmp_path / "off", base)
    on_opts = ScoreOptions(**{**base.__dict__, "overlap": "on"})
    on = score_slide(tif, exported_dsvdd, tmp_path / "on", on_opts)
    assert not off["engine_lane"]["overlap"] and on["engine_lane"]["overlap"]
    ta = pq.read_table(tmp_path / "off" / "scores.parquet")
    tb = pq.read_table(tmp_path / "on" / "scores.parquet")
    assert ta.num_rows > 16 and same_table(ta, tb)
    assert 0 < on["engine_lane"]["engine_busy_fraction"] <= 1
    assert on["engine_lane"]["gpu_busy_fraction"] is None  # CUDA events only on a GPU

    # an engine failure in the lane's thread mid-slide: written chunks kept, resume completes
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    real, calls = scorer.score, {"n": 0}

    def flaky(images, batch_size):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the engine died")
        return real(images, batch_size)

    scorer.score = flaky
    with pytest.raises(RuntimeError, match="engine died"):
        score_slide(tif, scorer, tmp_path / "r", on_opts)
    scorer.score = real
    s = score_slide(
        tif, scorer, tmp_path / "r", ScoreOptions(**{**on_opts.__dict__, "resume": True})
    )
    assert s["cells_resumed"] > 0
    assert same_table(pq.read_table(tmp_path / "r" / "scores.parquet"), ta)


def test_device_crops_reach_the_engine_as_tensors_and_the_head_runs_there(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    """--decode torch in the main process: crops stay tensors, the PyTorch network and the head's
    torch finish score them, nothing is uploaded but the JPEG bytes; the same cells and scores
    as the CPU path."""
    from cyto.runtime.backends.torch import TorchBackend

    uploads = {"n": 0}
    real_upload = TorchBackend._upload

    def upload(self, batch):
        uploads["n"] += 1
        return real_upload(self, batch)

    monkeypatch.setattr(TorchBackend, "_upload", upload)
    base = ScoreOptions(mosaic=0, workers=0, tile=512, backend="torch", device="cpu")
    # loaded first: load_scorer warms the model with one blank cell, which is not a crop
    scorer = load_scorer(exported_dsvdd, "torch", "cpu")
    uploads["n"] = 0
    before = devices.h2d_bytes("cpu")
    score_slide(tif, scorer, tmp_path / "host", base)
    host_bytes, host_uploads = devices.h2d_bytes("cpu") - before, uploads["n"]
    ta = pq.read_table(tmp_path / "host" / "scores.parquet")
    crop = scorer.spec.crop_size
    assert host_uploads > 0 and host_bytes == ta.num_rows * crop * crop * 3

    uploads["n"] = 0
    before = devices.h2d_bytes("cpu")
    opts = ScoreOptions(**{**base.__dict__, "decode": "torch", "overlap": "on"})
    s = score_slide(tif, scorer, tmp_path / "dev", opts)
    assert "torchvision" in s["decode"] and uploads["n"] == 0  # no crop went through the host
    jpeg_bytes = devices.h2d_bytes("cpu") - before
    assert jpeg_bytes > 0  # the tile bytes handed to the decoder
    tb = pq.read_table(tmp_path / "dev" / "scores.parquet")
    assert same_table(tb.select(["x", "y", "cell_id"]), ta.select(["x", "y", "cell_id"]))
    # the head's torch finish (float64) against its numba finish: equal up to rounding
    np.testing.assert_allclose(tb["score"].to_numpy(), ta["score"].to_numpy(), rtol=1e-9)


def test_score_tensor_falls_back_to_the_host_for_onnx_runtime(exported_dsvdd):
    ort = load_scorer(exported_dsvdd, "onnx", "cpu")
    pt = load_scorer(exported_dsvdd, "torch", "cpu")
    assert not ort.takes_tensors and pt.takes_tensors
    size = ort.spec.crop_size
    x = np.random.default_rng(0).integers(0, 256, (10, size, size, 3), dtype=np.uint8)
    want = ort.score(x, 4)
    np.testing.assert_array_equal(ort.score_tensor(torch.from_numpy(x), 4), want)
    np.testing.assert_allclose(pt.score_tensor(torch.from_numpy(x), 4), want, rtol=1e-4)
    assert pt.score_tensor(torch.from_numpy(x[:0]), 4).shape == (0,)
