"""The pipeline keeps up with a fast engine (issue 58): the tile workers start before the model
loads and the slide is planned, not after (the engine waited 2.3 s of a 9 s slide for them on 2
cores), and the engine takes the first cells as soon as they fill a batch."""

from __future__ import annotations

import multiprocessing as mp
import time

import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.infer import ScoreOptions, score_slide
from tests.tables import same_table

OPTS = ScoreOptions(mosaic=0, tile=512, backend="onnx", precision="fp32")


@pytest.fixture(scope="module")
def tif(tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    return write_slide(root / "s.tif", SlideSynthConfig(width=1024, height=768, seed=4)).paths[0]


def test_workers_start_while_the_model_loads_and_give_the_same_table(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    import cyto.infer.pipeline as pipeline

    # children of this process that earlier tests left (a pool or server still exiting) are
    # not this slide's workers: count only the ones started here
    before = {p.pid for p in mp.active_children()}

    def ours():
        return [p for p in mp.active_children() if p.pid not in before]

    children_at_load = []
    real_load = pipeline.load_scorer

    def load(*args, **kwargs):
        children_at_load.append(len(ours()))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(pipeline, "load_scorer", load)
    one = score_slide(
        tif, exported_dsvdd, tmp_path / "w1", ScoreOptions(**{**vars(OPTS), "workers": 1})
    )
    assert children_at_load == [1]  # the worker was already starting
    assert one["workers"] == 1 and not ours()  # and is gone at the end
    ref = score_slide(
        tif, exported_dsvdd, tmp_path / "w0", ScoreOptions(**{**vars(OPTS), "workers": 0})
    )
    assert children_at_load == [1, 0]
    a = pq.read_table(tmp_path / "w1" / "scores.parquet").replace_schema_metadata(None)
    b = pq.read_table(tmp_path / "w0" / "scores.parquet").replace_schema_metadata(None)
    assert a.num_rows == ref["cells_scored"] > 0 and same_table(a, b)


def test_a_slide_of_a_few_tiles_starts_no_worker_unless_asked(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    """A worker takes 1-3 s to start on 2 cores, more than a field image of a few tiles takes
    to score: with no --workers given, such a slide is scored in the main process (a 2048 px
    image: 1.05 s against 1.90 s); a larger one, or --workers given, starts them as before."""
    import cyto.infer.pipeline as pipeline
    from cyto.infer.options import FEW_TILES, auto_workers, default_workers

    assert auto_workers(2048, 2048, 1024) == 0 and FEW_TILES == 4
    assert auto_workers(2049, 2048, 1024) == default_workers()  # 6 tiles
    started: list[int] = []
    real = pipeline.start_workers
    monkeypatch.setattr(pipeline, "start_workers", lambda s, n: started.append(n) or real(s, n))
    auto = ScoreOptions(**{**vars(OPTS), "tile": 1024})  # 1024 x 768: one tile
    assert auto.workers is None
    assert score_slide(tif, exported_dsvdd, tmp_path / "a", auto)["workers"] == 0
    assert started == [0]  # the workers asked for (--workers 1: the test above) as before


def test_a_bad_slide_fails_with_its_error_and_leaves_no_worker(exported_dsvdd, tmp_path):
    from cyto.errors import CytoError

    bad = tmp_path / "not-a-slide.tif"
    bad.write_bytes(b"not a tiff")
    with pytest.raises(CytoError):
        score_slide(
            bad, exported_dsvdd, tmp_path / "o", ScoreOptions(**{**vars(OPTS), "workers": 1})
        )
    # shut down without waiting: a worker still starting exits once started (the executor may
    # start it after the error came back, so wait for none to be left, not for those seen now)
    deadline = time.monotonic() + 60
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mp.active_children() and not (tmp_path / "o").exists()


def test_the_engine_takes_the_first_cells_when_they_fill_a_batch(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    """With results of at most 4 cells, the first engine call had to wait for 4 batches (32
    cells at --batch-size 8); it now goes with the first 8, and later calls with 32."""
    from cyto.runtime.lane import EngineLane

    sizes = []
    real_submit = EngineLane.submit

    def submit(self, crops, tag=None):
        sizes.append(len(crops))
        return real_submit(self, crops, tag)

    monkeypatch.setattr(EngineLane, "submit", submit)
    opts = ScoreOptions(**{**vars(OPTS), "workers": 0, "batch_size": 8, "max_cells": 4})
    s = score_slide(tif, exported_dsvdd, tmp_path / "o", opts)
    assert s["cells_scored"] > 32 and len(sizes) >= 2
    assert 8 <= sizes[0] < 8 + 4  # the first batch, and no more than one result beyond it
    assert all(n >= 32 for n in sizes[1:-1])  # then 4 batches at a time, as before


def test_the_threshold_is_measured_while_the_model_loads(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    """The slide's detection threshold (16 windows read and smoothed: 0.3-1.2 s of the plan on 2
    cores) is measured in a thread while the model loads, not after it; the plan takes it only
    for its own parameters, and it is the number the plan measures itself."""
    from dataclasses import replace

    import cyto.infer.pipeline as pipeline
    import cyto.infer.plan as plan_module
    from cyto.infer.plan import SlidePlan, ThresholdAhead
    from cyto.runtime import load_scorer
    from cyto.slides import open_with_planes

    calls = []  # (thread name, model loaded yet?)
    loaded = []
    real = plan_module.slide_threshold_of
    real_load = pipeline.load_scorer

    def measured(*args, **kwargs):
        import threading

        calls.append((threading.current_thread().name, bool(loaded)))
        return real(*args, **kwargs)

    def load(*args, **kwargs):
        try:
            return real_load(*args, **kwargs)
        finally:
            loaded.append(1)

    monkeypatch.setattr(plan_module, "slide_threshold_of", measured)
    monkeypatch.setattr(pipeline, "load_scorer", load)
    ahead = score_slide(tif, exported_dsvdd, tmp_path / "a", OPTS)
    # begun before the model was loaded, beside it, and not measured again by the plan
    assert calls == [("cyto-threshold", False)] and ahead["detection_threshold"] is not None

    # a measurement with other parameters, or one that failed, is not taken: measured here
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu", "fp32")
    reader, planes = open_with_planes(tif, OPTS.planes)
    other = ThresholdAhead(tif, replace(OPTS, detection=replace(OPTS.detection, sigma=9.0)))
    broken = ThresholdAhead(tmp_path / "no-such-slide.tif", OPTS)
    for job in (other, broken):  # their own measurements done before the counting
        job.threshold_for(None)
    try:
        for job in (other, broken, None):
            calls.clear()
            plan = SlidePlan(tif, reader, planes, scorer, OPTS, lambda _: None, job)
            assert len(calls) == 1 and plan.threshold == ahead["detection_threshold"]
    finally:
        reader.close()
        scorer.close()


def test_a_dense_tiles_parts_are_cut_here_not_behind_the_workers_queue(
    exported_dsvdd, tif, tmp_path, monkeypatch
):
    """A dense tile's rest comes as part jobs once its first result is in; sent to the worker
    they waited behind every tile already queued (0.2-0.6 s of the engine's time on 2 cores), so
    they run in a thread of the main process, with the same results."""
    from concurrent.futures import ThreadPoolExecutor

    from cyto import interrupts
    from cyto.infer import tiling

    here = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, *args):
            if fn is tiling.run_tile:  # (the thread also closes its readers at the end)
                here.append(args[0])
            return super().submit(fn, *args)

    sent = []  # the jobs the worker got
    real_submit = interrupts._Pool.submit

    def to_worker(self, fn, *args, **kwargs):
        if fn is tiling.run_tile:
            sent.append(args[0])
        return real_submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(tiling, "ThreadPoolExecutor", Recording)
    monkeypatch.setattr(interrupts._Pool, "submit", to_worker)
    dense = {**vars(OPTS), "max_cells": 4}  # every tile with more than 4 cells has parts
    dense.pop("workers", None)
    one = score_slide(tif, exported_dsvdd, tmp_path / "w1", ScoreOptions(**dense, workers=1))
    assert here and all(job[4] is not None for job in here)  # parts, cut here
    assert sent and all(job[4] is None for job in sent)  # whole tiles, found by the worker
    ref = score_slide(tif, exported_dsvdd, tmp_path / "w0", ScoreOptions(**dense, workers=0))
    a = pq.read_table(tmp_path / "w1" / "scores.parquet").replace_schema_metadata(None)
    b = pq.read_table(tmp_path / "w0" / "scores.parquet").replace_schema_metadata(None)
    assert a.num_rows == one["cells_scored"] == ref["cells_scored"] > 0 and same_table(a, b)


def test_a_ctrl_c_met_by_the_threshold_thread_prints_no_traceback(tmp_path, monkeypatch):
    """Hostile round 62, 3: Ctrl-C during a --download, whose progress checks for it in the
    threshold thread that opened the slide, printed that thread's traceback ("Exception in
    thread cyto-threshold: ... KeyboardInterrupt") above "interrupted". The main thread says
    the interrupt; the thread ends quietly, its threshold not taken."""
    import threading

    import cyto.infer.plan as plan_module
    from cyto.infer.plan import ThresholdAhead

    def interrupted(_slide):
        raise KeyboardInterrupt

    printed = []
    monkeypatch.setattr(plan_module, "open_slide", interrupted)
    monkeypatch.setattr(threading, "excepthook", printed.append)
    job = ThresholdAhead(tmp_path / "s.tif", ScoreOptions())
    assert job.threshold_for(ScoreOptions().detection) is None
    assert not printed, printed
