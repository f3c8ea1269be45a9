"""`cyto bench` engine / scorer / slide end to end on tiny inputs: result files with the expected
structure, the machine recorded, unavailable backends listed with their reason. No speed is
asserted."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.seal import with_rows_seal
from tests.cli_runner import run_cyto
from tests.integration.test_score import score_cli


def _result(folder, kind):
    files = list(folder.glob(f"{kind}_*.json"))
    assert len(files) == 1, files
    assert files[0].with_suffix(".md").read_text().startswith(f"# cyto bench {kind}")
    data = json.loads(files[0].read_text())
    meta = data["meta"]
    assert meta["cpu_count"] >= 1 and meta["cpu"] and meta["host"]
    assert "torch" in meta["libraries"] and "cyto" in meta["libraries"]
    return data


def test_bench_engine(exported_dsvdd, tmp_path):
    proc = run_cyto(
        "bench",
        "engine",
        "--model",
        str(exported_dsvdd),
        "--devices",
        "cpu",
        "--batches",
        "1,4",
        "--repeats",
        "3",
        "--budget",
        "1",
        "--backends",
        "torch-eager,onnx,tensorrt",  # the names of earlier results are still understood
        "--results",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    rows = _result(tmp_path, "engine")["results"]
    ok = [r for r in rows if r["available"]]
    assert {(r["backend"], r["batch"]) for r in ok} == {
        ("torch", 1),
        ("torch", 4),
        ("onnx", 1),
        ("onnx", 4),
    }
    for r in ok:
        assert r["patches_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
        assert r["repeats"] >= 3 and r["precision"] == "fp32"
        assert r["vs_torch_eager_fp32"] > 0
        assert r["repeats_asked"] == 3 and r["spread_pct"] >= 0
    # what a reader of the table needs to trust a row (hostile round 78, 5 and 6): how many
    # calls it rests on and how far apart they were, every engine's version, the instruction
    # sets that pick the kernels
    [md] = tmp_path.glob("engine_*.md")
    text = md.read_text()
    assert "| timed calls | spread % |" in text and "cut by --budget" in text, text
    assert (
        f"CPU instruction sets: {' '.join(_result(tmp_path, 'engine')['meta']['cpu_flags'])}"
        in text
    )
    if importlib.util.find_spec("openvino") is not None:
        assert "openvino" in _result(tmp_path, "engine")["meta"]["libraries"]
    missing = {(r["backend"], r["precision"]): r["reason"] for r in rows if not r["available"]}
    # a missing graph says how to make it
    assert "no int8 ONNX graph: make one with cyto export" in missing[("onnx", "int8")]
    assert missing[("onnx", "int8")].endswith("--precision int8 --calib CELLS")
    assert "CUDA only" in missing[("trt", "fp16")]
    assert "fp16" in missing[("torch", "fp16")]
    # which backend runs which precision is the runtime's one rule: PyTorch was told bf16 "runs
    # through ONNX Runtime or TensorRT", which refuse it (hostile round 60, 2)
    for name in ("torch", "onnx"):
        assert missing[(name, "bf16")].startswith("--precision bf16 runs in OpenVINO, on the CPU")

    bad = run_cyto("bench", "engine", "--model", str(exported_dsvdd), "--backends", "tpu")
    assert bad.returncode != 0 and "unknown backend" in bad.stderr


def test_bench_scorer(tmp_path):
    proc = run_cyto(
        "bench",
        "scorer",
        "--queries",
        "200,400",
        "--support-vectors",
        "20",
        "--dims",
        "16",
        "--repeats",
        "2",
        "--results",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    rows = _result(tmp_path, "scorer")["results"]
    oc = [r for r in rows if r["scorer"] == "ocsvm"]
    assert [r["queries"] for r in oc] == [200, 400]
    for r in oc:
        assert r["max_abs_diff_vs_sklearn"] < 1e-8
        assert r["numba_per_s"] > 0 and r["sklearn_per_s"] > 0 and r["numpy_ref_per_s"] > 0
    sv = [r for r in rows if r["scorer"] == "dsvdd"]
    assert len(sv) == 2 and all(r["max_abs_diff_vs_ref"] < 1e-6 for r in sv)


def test_a_second_run_on_the_same_day_keeps_the_first_result(tmp_path):
    from cyto.bench.results import write_results

    meta = {"host": "lab pc", "date": "2026-11-29"}
    first = write_results(tmp_path, "slide", meta, [{"cells_per_s": 1.0}], ["# before"])
    second = write_results(tmp_path, "slide", meta, [{"cells_per_s": 2.0}], ["# after"])
    assert (first.name, second.name) == (
        "slide_lab-pc_2026-11-29.json",
        "slide_lab-pc_2026-11-29-2.json",
    )
    assert json.loads(first.read_text())["results"] == [{"cells_per_s": 1.0}]
    assert first.with_suffix(".md").read_text() == "# before\n"
    assert second.with_suffix(".md").read_text() == "# after\n"


def test_a_result_stopped_while_it_is_written_leaves_no_truncated_file(tmp_path, monkeypatch):
    """A full disk halfway through the JSON left a truncated file under the result's name,
    which the next run then numbered around (-2) and a reader took for a result."""
    import builtins
    import errno

    from cyto.bench import results

    meta = {"host": "lab pc", "date": "2026-11-29"}

    class HalfWritten:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk(path, mode="r", *a, **k):
        fh = builtins.open(path, mode, *a, **k)  # noqa: SIM115 (closed by HalfWritten)
        return HalfWritten(fh) if "x" in mode or "w" in mode else fh

    monkeypatch.setattr(results, "open", full_disk, raising=False)
    with pytest.raises(OSError, match="No space left"):
        results.write_results(tmp_path, "slide", meta, [{"cells_per_s": 1.0}], ["# before"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written, no temp
    monkeypatch.undo()
    path = results.write_results(tmp_path, "slide", meta, [{"cells_per_s": 2.0}], ["# after"])
    assert path.name == "slide_lab-pc_2026-11-29.json"
    assert json.loads(path.read_text())["results"] == [{"cells_per_s": 2.0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.with_suffix(".md").name]


@pytest.mark.slow
def test_bench_slide_and_calibrate(exported_dsvdd, tmp_path):
    res = write_slide(
        tmp_path / "s.ndpi",
        SlideSynthConfig(width=1536, height=1536, seed=4, abnormal_fraction=0.1),
    )
    proc = run_cyto(
        "bench",
        "slide",
        str(res.paths[0]),
        "--model",
        str(exported_dsvdd),
        "--workers",
        "1",
        "--naive-cells",
        "30",
        "--truth",
        str(res.ground_truth),
        "--work",
        str(tmp_path / "w"),
        "--results",
        str(tmp_path / "r"),
    )
    assert proc.returncode == 0, proc.stderr
    row = _result(tmp_path / "r", "slide")["results"][0]
    assert row["cells"] > 30 and row["workers"] == 1
    # what scored, and its check here (auto may choose; bench slide's default is fp32)
    assert row["precision"] == "fp32" and row["graph"] == "encoder.onnx"
    assert row["verification"]["status"] in ("passed", "unverified")
    assert 0 < row["pipeline_efficiency"] <= 1
    assert abs(sum(row["stage_share"].values()) - 1) < 0.01
    assert row["naive"]["cells"] == 30 and row["naive"]["cells_per_s"] > 0
    assert row["naive"]["spearman_vs_pipeline"] > 0.99  # the same cells score the same
    assert row["pipeline_vs_naive"] > 0 and "truth" in row
    assert row["decode"] == "CPU readers" and row["detector"] == "scipy"
    lane = row["engine_lane"]
    assert lane["overlap"] is False and 0 < lane["engine_busy_fraction"] <= 1
    assert lane["gpu_busy_fraction"] is None and lane["h2d_bytes_per_cell"] is None  # no GPU
    md = next((tmp_path / "r").glob("slide_*.md")).read_text()
    assert "GPU busy (CUDA events)" in md and "host->device bytes/cell" in md
    # the precision asked for is the one timed (fp16 in PyTorch runs on CUDA only)
    fp16 = run_cyto(
        "bench", "slide", str(res.paths[0]), "--model", str(exported_dsvdd), "--backend",
        "torch", "--device", "cpu", "--precision", "fp16", "--naive-cells", "0",
    )  # fmt: skip
    assert fp16.returncode == 2 and "fp16 on CUDA" in fp16.stderr, fp16.stderr

    # calibrate a copy of the model on this slide's table, as if it were slide-negative (a
    # copy without its truth labels and of another slide's name: the slide's own truth, in
    # its labels or beside it, marks abnormal cells, refused)
    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    refused = run_cyto("calibrate", str(model), str(tmp_path / "w" / "scores.parquet"))
    assert refused.returncode == 2 and "abnormal cell(s)" in refused.stderr, refused.stderr
    scored = pq.read_table(tmp_path / "w" / "scores.parquet")
    table = tmp_path / "unlabelled.parquet"
    meta = {**scored.schema.metadata, b"cyto.slide": str(tmp_path / "neg.ndpi").encode()}
    pq.write_table(with_rows_seal(scored.drop_columns(["label"]), meta), table)
    proc = run_cyto("calibrate", str(model), str(table))
    assert proc.returncode == 0, proc.stderr
    proc = score_cli(res.paths[0], model, tmp_path / "o", "--mosaic", "0")
    assert proc.returncode == 0, proc.stderr  # the bundle still verifies after calibration
    summary = json.loads((tmp_path / "o" / "s" / "summary.json").read_text())
    b = summary["burden"]
    n = pq.read_table(table).num_rows
    assert b["calibration"].startswith(f"{n} cells of 1")
    assert b["cells_above"] <= 0.02 * n + 1  # its own 99th percentile
    bad = run_cyto("calibrate", str(model), str(tmp_path / "missing.parquet"))
    assert bad.returncode != 0 and "does not exist" in bad.stderr
