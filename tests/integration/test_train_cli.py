"""`cyto train`, `cyto info` and `cyto predict` end to end through the command line."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.unit.test_cli import run_cyto


def test_train_info_predict(tmp_path, synth_patches):
    out = tmp_path / "dsvdd.cyto"
    proc = run_cyto(
        "train",
        "dsvdd",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(out),
        "--preset",
        "fast",
        "--set",
        "epochs=2",
        "--set",
        "ae_epochs=1",
        "--set",
        "n_seeds=1",
        "--set",
        "load_size=48",
        "--set",
        "input_size=32",
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert "trained dsvdd" in proc.stdout
    n_normal = sum(1 for f in (synth_patches / "normal").iterdir() if f.is_file())
    assert f"on {n_normal} normal images (of " in proc.stdout  # one-class: normals only
    assert not (tmp_path / "dsvdd.cyto.train-state").exists()  # cleaned after success

    info = run_cyto("info", str(out))
    assert info.returncode == 0, info.stderr
    assert "dsvdd" in info.stdout and "higher = more abnormal" in info.stdout
    assert "checksums verified" in info.stdout
    manifest = json.loads(run_cyto("info", str(out), "--json").stdout)
    assert manifest["config"]["epochs"] == 2 and manifest["config"]["backbone"] == "smallcnn"
    assert manifest["training_data"]["normal"] == ["normal"]
    assert manifest["training_data"]["n_used"] == n_normal < manifest["training_data"]["n_images"]
    assert set(manifest["files"]) == {"weights-encoder-seed0.safetensors", "scorer.npz"}

    scores = tmp_path / "s.parquet"
    pred = run_cyto(
        "predict",
        str(out),
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(scores),
    )
    assert pred.returncode == 0, pred.stderr
    assert "AUROC" in pred.stdout
    table = pq.read_table(scores)
    assert table.num_rows == 120 + 6 * 12
    assert set(table.column_names) >= {"path", "class", "score", "rank", "label"}
    assert sorted(table["rank"].to_pylist()) == list(range(1, table.num_rows + 1))
    assert table.schema.metadata[b"cyto.method"] == b"dsvdd"

    again = run_cyto(
        "train",
        "dsvdd",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(out),
        "--preset",
        "fast",
    )
    assert again.returncode != 0 and "--overwrite" in again.stderr


def test_print_config_and_errors(tmp_path, synth_patches):
    proc = run_cyto(
        "train",
        "droc",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(tmp_path / "x.cyto"),
        "--preset",
        "fast",
        "--set",
        "epochs=3",
        "--print-config",
    )
    assert proc.returncode == 0
    assert "epochs = 3" in proc.stdout and 'backbone = "smallcnn"' in proc.stdout
    bad = run_cyto(
        "train",
        "svdd",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(tmp_path / "x.cyto"),
    )
    assert bad.returncode == 2 and "known: droc, dsvdd, fs-sil, its2clr, ws-sil" in bad.stderr
    cuda = run_cyto(
        "train",
        "fs-sil",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(tmp_path / "x.cyto"),
        "--device",
        "cuda",
    )
    import torch

    if not torch.cuda.is_available():
        assert cuda.returncode == 2 and "CUDA is not available" in cuda.stderr
    resume = run_cyto(
        "train",
        "fs-sil",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--out",
        str(tmp_path / "y.cyto"),
        "--resume",
    )
    assert resume.returncode != 0 and "no interrupted run" in resume.stderr
    info = run_cyto("info", str(tmp_path))
    assert info.returncode != 0 and "manifest.json" in info.stderr
