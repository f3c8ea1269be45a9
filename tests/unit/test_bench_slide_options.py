"""``cyto bench slide``'s options as ``cyto score`` takes them: the crop side left to the bundle,
and a ``--work`` folder held to the rule ``cyto score`` holds its ``--out`` to (hostile round 7,
H29 and H30)."""

from __future__ import annotations

import json

import pytest

from cyto.errors import InputPathError
from tests.cli_runner import run_cyto


def _bench_opts(monkeypatch, tmp_path, *args: str):
    """The options ``cyto bench slide ARGS`` hands the library (it stops there)."""
    from cyto.bench import slide as bench

    seen = {}

    def fake(slide, model, work, opts, naive_cells, echo, overwrite=False):
        seen["opts"] = opts
        from cyto.errors import ConfigError

        raise ConfigError("stopped here")

    monkeypatch.setattr(bench, "bench_slide", fake)
    proc = run_cyto(
        "bench", "slide", str(tmp_path / "s.tif"), "--model", str(tmp_path / "m.cyto"), *args,
        "--results", str(tmp_path / "r"),
    )  # fmt: skip
    assert "stopped here" in proc.stderr, proc.stderr
    return seen["opts"]


def test_bench_slide_cuts_crops_of_the_bundle_s_side_unless_told(monkeypatch, tmp_path):
    # it cut 192 px crops, then advised "leave out --patch-size", which was not given (H29)
    assert _bench_opts(monkeypatch, tmp_path).patch_size is None
    assert _bench_opts(monkeypatch, tmp_path, "--patch-size", "96").patch_size == 96


def _scored(folder, slide="/data/s2.tif"):
    """A finished `cyto score` output folder of ``slide`` (its summary and tables)."""
    folder.mkdir(parents=True)
    summary = {"slide": slide, "cells_scored": 10}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "scores.parquet").write_bytes(b"table")
    (folder / "topk_mosaic.png").write_bytes(b"mosaic")
    return folder


def test_bench_slide_refuses_a_work_folder_of_finished_results(tmp_path):
    # a finished `cyto score` folder given as --work was scored over in place, its mosaics
    # deleted, with no word (H30)
    work = _scored(tmp_path / "o" / "s2")
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    proc = run_cyto(
        "bench", "slide", str(tmp_path / "s2.tif"), "--model", str(tmp_path / "m.cyto"),
        "--work", str(work), "--results", str(tmp_path / "r"),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --work {work} (the finished results of s2.tif) exists (pass --overwrite to "
        "replace it)"
    ]
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before
    assert not (tmp_path / "r").exists()


def test_bench_slide_refuses_a_work_folder_of_files_cyto_did_not_write(tmp_path):
    from cyto.bench.slide import bench_slide
    from cyto.infer import ScoreOptions

    work = tmp_path / "w"
    work.mkdir()
    (work / "summary.json").write_text('{"mine": 1}')  # a user's own summary
    for overwrite in (False, True):
        with pytest.raises(InputPathError, match="holds summary.json that cyto did not write"):
            bench_slide(tmp_path / "s.tif", tmp_path / "m.cyto", work, ScoreOptions(), 0,
                        overwrite=overwrite)  # fmt: skip
    (work / "summary.json").unlink()
    (work / "cells.geojson").write_text("{}")  # a user's file under an output's name
    with pytest.raises(InputPathError, match="--work .* holds cells.geojson"):
        bench_slide(tmp_path / "s.tif", tmp_path / "m.cyto", work, ScoreOptions(), 0)
