"""Every input the readers can meet gives a result or one line (issue 56): file names that are not
UTF-8, TIFFs of every pixel layout, score tables and cohort tables with the wrong bytes in them,
a synthetic slide too large for the machine. Never a traceback, and a cohort or a watch goes on
with its other slides whatever one slide does. The files are made here, small."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cyto.cohort.local import score_cohort, slide_folders
from cyto.cohort.table import cohort_row, read_cohort_table, write_cohort_table
from cyto.errors import ConfigError, CytoError, OutputWriteError, UnsupportedSlideError
from cyto.infer import ScoreOptions
from cyto.slides import open_slide, slide_files
from cyto.slides.base import printable
from tests.cli_runner import run_cyto

OPTS = ScoreOptions(workers=0, mosaic=0, top_k=10)
BAD = os.fsdecode(b"slide-\xff")  # a name that is not UTF-8, as Python holds it


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    root = tmp_path_factory.mktemp("bad-files")
    config = SlideSynthConfig(width=512, height=512, n_cells=40, seed=5)
    return write_slide(root / "s.tif", config, workers=0).paths[0]


@pytest.fixture(scope="module")
def level0(made) -> np.ndarray:
    """The synthetic slide's level 0 as RGB, to write again in other pixel layouts."""
    reader = open_slide(made)
    try:
        return reader.read_region(0, 0, reader.info.width, reader.info.height)
    finally:
        reader.close()


def _scored(out: Path, stem: str) -> dict:
    return json.loads((out / stem / "summary.json").read_text())


# --- a. file names that are not UTF-8 -------------------------------------------------------


def test_printable_names_are_utf8_and_other_text_is_unchanged():
    assert printable(BAD + ".tif") == "slide-\\xff.tif"
    assert printable("Präparat 7 — 标本.tif") == "Präparat 7 — 标本.tif"
    assert printable("\ud800x") == "\\ud800x"  # a lone surrogate no file name decodes to
    for text in (BAD, "\ud800", "a\udcffb"):
        printable(text).encode("utf-8")  # strict: never raises


@pytest.mark.pyvips
def test_a_slide_whose_name_is_not_utf8_is_scored_alone(made, exported_dsvdd, tmp_path):
    """`cyto score b'slide-\\xff.tif'` in a process of its own under a strict UTF-8 locale: it
    used to die in pyvips (the name as strict UTF-8), then in the score table (its slide_id,
    its metadata, its path), cohort.csv and the report on stdout. Its folder is OUT/slide-\\xff
    (UTF-8), summary.json names the slide exactly (JSON escapes), the tables say \\xff."""
    slide = tmp_path / (BAD + ".tif")
    shutil.copyfile(made, slide)
    out = tmp_path / "o"
    proc = run_cyto(
        "score", str(slide), "--model", str(exported_dsvdd), "--out", str(out),
        "--workers", "0", "--mosaic", "0",
        env={"PYTHONIOENCODING": "utf-8:strict"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "slide-\\xff.tif: " in proc.stdout  # said in UTF-8, as the tables say it
    folder = out / "slide-\\xff"
    assert Path(_scored(out, folder.name)["slide"]) == slide  # the very file, read back
    table = pq.read_table(folder / "scores.parquet")
    assert table.num_rows > 0 and set(table["slide_id"].to_pylist()) == {"slide-\\xff"}
    assert table.schema.metadata[b"cyto.slide"].decode() == printable(slide)
    rows = list(csv.DictReader((out / "cohort.csv").open(encoding="utf-8")))
    assert [(r["slide"], r["status"]) for r in rows] == [(printable(slide), "scored")]


@pytest.mark.pyvips
def test_a_cohort_folder_with_such_a_name_scores_every_slide(made, exported_dsvdd, tmp_path):
    folder = tmp_path / "cohort"
    folder.mkdir()
    for name in ("a.tif", BAD + ".tif", "z.tif"):
        shutil.copyfile(made, folder / name)
    out = tmp_path / "o"
    proc = run_cyto(
        "score", str(folder), "--model", str(exported_dsvdd), "--out", str(out),
        "--workers", "0", "--mosaic", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rows = read_cohort_table(out / "cohort.csv")
    assert sorted(Path(r["output"]).name for r in rows if r["status"] == "scored") == [
        "a",
        "slide-\\xff",
        "z",
    ]


def test_whatever_one_slide_does_the_cohort_goes_on(made, exported_dsvdd, tmp_path, monkeypatch):
    """A slide that fails in a way nobody foresaw (here: a RuntimeError from inside scoring) is
    one failed row and one line naming it, said before the next slide starts (it was said only
    at the end of the cohort, hostile round 49, 2); the slides after it are scored."""
    import cyto.cohort.local as local

    real = local.score_slide

    def flaky(slide, *args, **kwargs):
        if Path(slide).stem == "b":
            raise RuntimeError("something nobody foresaw")
        return real(slide, *args, **kwargs)

    monkeypatch.setattr(local, "score_slide", flaky)
    slides = []
    for name in ("a.tif", "b.tif", "c.tif"):
        shutil.copyfile(made, tmp_path / name)
        slides.append(tmp_path / name)
    said: list[str] = []
    done, failed = score_cohort(slides, exported_dsvdd, tmp_path / "o", OPTS, echo=said.append)
    assert [Path(s["slide"]).name for s in done] == ["a.tif", "c.tif"]
    headers = [i for i, m in enumerate(said) if re.match(r"slide \d/3: ", m)]
    between = said[headers[1] : headers[2]]  # what was said of b.tif
    assert sum("(failed; the next slide goes on)" in m for m in between) == 1, said
    assert sum("failed; the next slide goes on" in m for m in said) == 1  # not after the last
    ((slide, exc),) = failed
    assert slide.name == "b.tif" and isinstance(exc, CytoError)
    assert "failed unforeseen (RuntimeError: something nobody foresaw)" in str(exc)
    rows = {Path(r["output"]).name: r for r in read_cohort_table(tmp_path / "o" / "cohort.csv")}
    assert rows["b"]["status"] == "failed" and "RuntimeError" in rows["b"]["error"]


def test_a_ctrl_c_a_library_swallowed_still_stops_the_cohort(
    made, exported_dsvdd, tmp_path, monkeypatch
):
    """The other slides go on after an unforeseen failure, but not after a Ctrl-C that a
    library turned into one (onnxruntime, a C extension): that stops the cohort."""
    import cyto.cohort.local as local
    from cyto import interrupts

    def swallowed(slide, *args, **kwargs):
        try:  # the Ctrl-C came while the library ran, and it said so in its own error
            interrupts._on_sigint(2, None)
        except KeyboardInterrupt:
            raise RuntimeError("interrupted in C") from None

    monkeypatch.setattr(local, "score_slide", swallowed)
    monkeypatch.setattr(interrupts, "_pending", False)
    slides = []
    for name in ("a.tif", "b.tif"):
        shutil.copyfile(made, tmp_path / name)
        slides.append(tmp_path / name)
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        score_cohort(slides, exported_dsvdd, tmp_path / "o", OPTS, echo=said.append)
    assert not any("b.tif" in m for m in said), said


@pytest.mark.pyvips
def test_the_watch_goes_on_past_such_a_name_and_a_slide_it_cannot_read(
    made, exported_dsvdd, tmp_path, monkeypatch
):
    """`cyto score FOLDER --watch` died on a name that is not UTF-8; it scores it, and a slide
    that fails unforeseen is said while the watch goes on."""
    import cyto.cohort.local as local
    from cyto.cohort.watch import watch_cohort

    real = local.score_slide

    def flaky(slide, *args, **kwargs):
        if Path(slide).stem == "boom":
            raise RuntimeError("something nobody foresaw")
        return real(slide, *args, **kwargs)

    monkeypatch.setattr(local, "score_slide", flaky)
    folder, out = tmp_path / "scanner", tmp_path / "o"
    folder.mkdir()
    for name in (BAD + ".tif", "boom.tif", "z.tif"):
        shutil.copyfile(made, folder / name)
    said: list[str] = []
    finished: list[dict] = []
    stop = threading.Event()
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(
            watch_cohort(
                [folder], exported_dsvdd, out, OPTS, said.append, poll=0.1, settle=0.0,
                stop=stop, on_slide=finished.append,
            )
        ),
        daemon=True,
    )  # fmt: skip
    thread.start()
    deadline = time.monotonic() + 120
    while len(finished) < 2 or not any(m.startswith("failed: ") for m in said):
        assert thread.is_alive() or result, said
        assert time.monotonic() < deadline, said
        time.sleep(0.05)
    stop.set()
    thread.join(60)
    assert sorted(Path(s["output"]).name for s in finished) == ["slide-\\xff", "z"]
    assert any("boom.tif" in m and "RuntimeError" in m for m in said), said


def test_synth_and_eval_take_names_that_are_not_utf8(tmp_path):
    """`cyto synth slide b'slide-\\xff.tif'` failed writing its truth table (Arrow takes UTF-8
    paths and text only); its slide_id is the score table's (slide-\\xff), and `cyto eval
    scores` reads a table of such a name."""
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    made = write_slide(
        tmp_path / (BAD + ".tif"), SlideSynthConfig(width=512, height=512), workers=0
    )
    with open(made.ground_truth, "rb") as fh:
        truth = pq.read_table(fh)
    assert set(truth["slide_id"].to_pylist()) == {"slide-\\xff"}
    assert truth.schema.metadata[b"cyto.slide"] == b"slide-\\xff.tif"
    table = tmp_path / (BAD + ".csv")
    table.write_text("score,label\n0.9,1\n0.1,0\n")
    proc = run_cyto("eval", "scores", str(table), "--k", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["tp_at_k"] == 1


_NAME_BYTES = st.binary(min_size=1, max_size=40).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
)
_NAME_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1, max_size=30
).filter(lambda t: t not in (".", "..") and len(t.encode()) < 200)


@pytest.mark.pyvips
@given(stem=st.one_of(_NAME_TEXT.map(os.fsencode), _NAME_BYTES))
def test_any_file_name_goes_through_the_path_handling(made, tmp_path_factory, stem):
    """Random unicode and undecodable bytes as a slide's name: found in its folder, opened and
    read, given a UTF-8 output folder, and written to cohort.csv and read back."""
    folder = tmp_path_factory.mktemp("names")
    slide = folder / os.fsdecode(stem + b".tif")
    os.link(made, slide)  # the same bytes under another name, at no cost
    assert slide_files([folder]) == [slide]
    reader = open_slide(slide)
    try:
        assert reader.read_region(0, 0, 16, 16).shape == (16, 16, 3)
    finally:
        reader.close()
    ((same, target),) = slide_folders([slide], folder / "out")
    assert same == slide.resolve()
    target.name.encode("utf-8")  # strict
    table = folder / "out" / "cohort.csv"
    table.parent.mkdir()
    write_cohort_table([cohort_row(slide, target, None, f"cannot read {slide}")], table)
    (row,) = read_cohort_table(table)
    assert row["slide"] == printable(slide) and row["error"] == f"cannot read {printable(slide)}"
    table.read_bytes().decode("utf-8")  # strict


# --- b. TIFFs of every pixel layout ----------------------------------------------------------


def _write_tiff(path: Path, data: np.ndarray, photometric: str, tile=None, **kw) -> Path:
    import tifffile

    if tile:
        kw["tile"] = tile
    tifffile.imwrite(path, data, photometric=photometric, planarconfig="contig", **kw)
    return path


def _expected_rgb(data, photometric, colormap=None) -> np.ndarray:
    """What a reader must return for ``data`` written as ``photometric``: 8-bit RGB, 16 bits
    scaled by the bit depth, gray replicated, a palette looked up, alpha composited on white."""
    if photometric == "palette":
        return (colormap[:, data].transpose(1, 2, 0) / 257.0).astype(np.float64)
    x = data.astype(np.float64) * (255.0 / 65535.0 if data.dtype == np.uint16 else 1.0)
    if x.ndim == 2:
        x = x[..., None]
    color_bands = 3 if photometric == "rgb" else 1
    color = x[..., :color_bands]
    if x.shape[2] > color_bands:
        a = x[..., color_bands : color_bands + 1] / 255.0
        color = color * a + 255.0 * (1.0 - a)
    return np.repeat(color, 3, axis=2) if color_bands == 1 else color


@pytest.mark.pyvips
@pytest.mark.parametrize(
    "layout",
    [
        "gray8",
        "gray16",
        "rgb16",
        "rgba8",
        "rgba16",
        "palette8",
        "palette16",
        "dark-palette16",
        "gray-alpha",
    ],
)
def test_every_pixel_layout_with_a_clear_meaning_is_read_as_8_bit_rgb(tmp_path, layout):
    """A grayscale TIFF gave an IndexError; 16-bit RGB was read as its low byte (a slide of
    noise, 0 cells, blamed on its resolution). Each is now the RGB it means."""
    rng = np.random.default_rng(1)
    kind, big = layout.rstrip("0123456789"), layout.endswith("16")
    dt = np.uint16 if big else np.uint8
    top = 65535 if big else 255
    kw: dict = {}
    if kind == "gray":
        data, ph = rng.integers(0, top + 1, (40, 56), dtype=dt), "minisblack"
    elif kind == "gray-alpha":
        data, ph = rng.integers(0, 256, (40, 56, 2), dtype=np.uint8), "minisblack"
        kw["extrasamples"] = ["unassalpha"]
    elif kind == "rgb":
        data, ph = rng.integers(0, top + 1, (40, 56, 3), dtype=dt), "rgb"
    elif kind == "rgba":
        data, ph = rng.integers(0, top + 1, (40, 56, 4), dtype=dt), "rgb"
        kw["extrasamples"] = ["unassalpha"]
    else:  # a dark palette's colours take 14 bits, and are still its colormap's 16-bit ones
        data, ph = rng.integers(0, top + 1, (40, 56), dtype=dt), "palette"
        deepest = 16384 if kind == "dark-palette" else 65536  # (read 4x bright, as 14-bit)
        kw["colormap"] = rng.integers(0, deepest, (3, top + 1), dtype=np.uint16)
    path = _write_tiff(tmp_path / f"{layout}.tif", data, ph, tile=(16, 16), **kw)
    reader = open_slide(path)
    got = reader.read_region(0, 0, 56, 40)
    assert got.dtype == np.uint8 and got.shape == (40, 56, 3)
    want = _expected_rgb(data, ph, kw.get("colormap"))
    assert np.abs(got.astype(np.float64) - want).max() <= 1.5


@pytest.mark.pyvips
@pytest.mark.parametrize("layout", ["cmyk", "cielab", "float", "int16", "five-samples"])
def test_a_pixel_layout_without_a_clear_meaning_is_one_line_naming_it(tmp_path, layout):
    words = {
        "cmyk": "CMYK",
        "cielab": "LAB colour space",
        "float": "floating point",
        "int16": "signed 16-bit",
        "five-samples": "5 samples per pixel",
    }
    kw: dict = {}
    if layout == "cmyk":
        data, ph = np.zeros((32, 32, 4), np.uint8), "separated"
    elif layout == "cielab":
        data, ph = np.zeros((32, 32, 3), np.uint8), "cielab"
    elif layout == "float":
        data, ph = np.zeros((32, 32, 3), np.float32), "rgb"
    elif layout == "int16":
        data, ph = np.zeros((32, 32, 3), np.int16), "rgb"
    else:
        data, ph = np.zeros((32, 32, 5), np.uint8), "rgb"
        kw["extrasamples"] = ["unspecified"] * 2
    path = _write_tiff(tmp_path / f"{layout}.tif", data, ph, **kw)
    with pytest.raises(UnsupportedSlideError, match=f"{path}: .*{words[layout]}.*8-bit RGB"):
        open_slide(path)


@pytest.mark.pyvips
@given(
    dtype=st.sampled_from(["uint8", "uint16"]),
    samples=st.sampled_from([1, 3, 4]),
    photometric=st.sampled_from(["minisblack", "rgb", "palette", "separated"]),
    tiled=st.booleans(),
    size=st.tuples(st.integers(1, 70), st.integers(1, 70)),
    region=st.tuples(st.integers(-20, 80), st.integers(-20, 80), st.integers(1, 60)),
    seed=st.integers(0, 2**16),
)
def test_any_small_tiff_is_read_or_refused_in_one_line(
    tmp_path_factory, dtype, samples, photometric, tiled, size, region, seed
):
    """Random small TIFFs (8 or 16 bits, 1/3/4 samples, gray/RGB/palette/CMYK, tiled or in
    strips): each opens and reads any region as 8-bit RGB with white outside the image, the
    colours it means, or is refused with one CytoError; never anything else."""
    valid = {"minisblack": (1, 3, 4), "rgb": (3, 4), "palette": (1,), "separated": (4,)}
    assume(samples in valid[photometric])
    rng = np.random.default_rng(seed)
    h, w = size
    top = 255 if dtype == "uint8" else 65535
    data = rng.integers(0, top + 1, (h, w, samples) if samples > 1 else (h, w), dtype=dtype)
    kw: dict = {}
    if photometric == "palette":
        kw["colormap"] = rng.integers(0, 65536, (3, top + 1), dtype=np.uint16)
    else:  # the first sample past the colour is alpha, any more are unspecified
        extra = samples - (3 if photometric == "rgb" else 1)
        if extra > 0 and photometric != "separated":
            kw["extrasamples"] = ["unassalpha"] + ["unspecified"] * (extra - 1)
    path = tmp_path_factory.mktemp("tiff") / "t.tif"
    _write_tiff(path, data, photometric, tile=(16, 16) if tiled else None, **kw)
    try:
        reader = open_slide(path)
    except CytoError as exc:
        assert photometric == "separated", exc
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    assert photometric != "separated"
    x, y, side = region
    got = reader.read_region(x, y, side, side)
    assert got.dtype == np.uint8 and got.shape == (side, side, 3)
    want = np.full((side, side, 3), 255.0)
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + side, w), min(y + side, h)
    if x0 < x1 and y0 < y1:
        exact = _expected_rgb(data, photometric, kw.get("colormap"))
        want[y0 - y : y1 - y, x0 - x : x1 - x] = exact[y0:y1, x0:x1]
    assert np.abs(got.astype(np.float64) - want).max() <= 1.5


@pytest.mark.pyvips
def test_a_cohort_of_gray_16_bit_and_cmyk_tiffs(made, level0, exported_dsvdd, tmp_path):
    """Through `cyto score`: the grayscale slide is scored (its IndexError ended the cohort), the
    16-bit one finds the very cells of its 8-bit original (it found none), the CMYK one is one
    line, and the slide after them is scored."""
    folder = tmp_path / "cohort"
    folder.mkdir()
    gray = np.rint(level0.astype(np.float64) @ [0.299, 0.587, 0.114]).astype(np.uint8)
    _write_tiff(folder / "a-gray.tif", gray, "minisblack", tile=(256, 256))
    _write_tiff(folder / "b-rgb16.tif", level0.astype(np.uint16) * 257, "rgb", tile=(256, 256))
    cmyk = np.dstack([255 - level0, np.zeros(level0.shape[:2], np.uint8)])
    _write_tiff(folder / "c-cmyk.tif", cmyk, "separated", tile=(256, 256))
    _write_tiff(folder / "d-rgb8.tif", level0, "rgb", tile=(256, 256))
    out = tmp_path / "o"
    proc = run_cyto(
        "score", str(folder), "--model", str(exported_dsvdd), "--out", str(out),
        "--workers", "0", "--mosaic", "0", "--mpp", "0.12",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # the CMYK slide: an unsupported slide, exit 1
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed: ")]
    assert "c-cmyk.tif" in line and "CMYK" in line
    cells = {p: _scored(out, p)["cells_scored"] for p in ("a-gray", "b-rgb16", "d-rgb8")}
    assert cells["a-gray"] > 0 and cells["b-rgb16"] == cells["d-rgb8"] > 0, cells


@pytest.mark.pyvips
def test_a_slide_of_12_bit_values_in_16_bit_samples_is_read_as_its_8_bit_pixels(
    level0, exported_dsvdd, tmp_path
):
    """A scanner's 12-bit values stored as 16 bits were read 16x dark (65535 taken as white),
    with no word: another stain angle, other cells (hostile round 51, 3). The slide's white is
    the top of the bits its values take (read from its smallest level), said in a note, and its
    cells are those of its 8-bit original."""
    eight = _write_tiff(tmp_path / "s8.tif", level0, "rgb", tile=(256, 256))
    twelve = np.rint(level0 * (4095 / 255)).astype(np.uint16)
    deep = _write_tiff(tmp_path / "s12.tif", twelve, "rgb", tile=(256, 256))
    h, w = level0.shape[:2]
    opaque = np.full((h, w, 1), 65535, np.uint16)  # alpha at 16 bits tells no depth
    with_alpha = _write_tiff(tmp_path / "s12a.tif", np.concatenate([twelve, opaque], axis=2),
                             "rgb", tile=(256, 256), extrasamples=["unassalpha"])  # fmt: skip
    for path in (deep, with_alpha):
        reader = open_slide(path)
        assert np.array_equal(reader.read_region(0, 0, w, h), level0), path.name
        reader.close()
    tables = {}
    for path in (eight, deep):
        out = tmp_path / path.stem
        proc = run_cyto("score", str(path), "--model", str(exported_dsvdd), "--out", str(out),
                        "--workers", "0", "--mosaic", "0", "--mpp", "0.12")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        tables[path.stem] = pq.read_table(out / path.stem / "scores.parquet")
        said = "its 16-bit samples take 12 bits: read as such (4095 is white)"
        assert (said in proc.stdout + proc.stderr) == (path == deep), proc.stdout
    for column in ("x", "y", "score"):
        assert tables["s12"][column].equals(tables["s8"][column]), column


# --- c. a score column that is not numbers ---------------------------------------------------


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_string_score_column_is_one_line_naming_it(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    table = pa.table({"score": ["high", "0.2", "0.1"], "label": [1, 0, 0]})
    if suffix == ".csv":
        path.write_text("score,label\nhigh,1\n0.2,0\n0.1,0\n")
    else:
        pq.write_table(table, path)
    proc = run_cyto("eval", "scores", str(path), "--k", "1")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "column 'score' (--score-column score) holds string values" in proc.stderr
    proc = run_cyto("eval", "scores", str(path), "--k", "1", "--score-column", "label",
                    "--label-column", "score")  # fmt: skip
    assert proc.returncode == 2 and "column 'score' (--label-column score)" in proc.stderr


# --- d. a truncated score table --------------------------------------------------------------


@pytest.fixture(scope="module")
def scored(made, exported_dsvdd, tmp_path_factory) -> Path:
    """The synthetic slide scored once: OUT (with cohort.csv) and OUT/s."""
    out = tmp_path_factory.mktemp("scored") / "o"
    done, failed = score_cohort([made], exported_dsvdd, out, OPTS, echo=lambda m: None)
    assert done and not failed
    return out


def test_a_truncated_score_table_is_one_line_naming_it(scored, tmp_path):
    folder = tmp_path / "s"
    shutil.copytree(scored / "s", folder)
    table = folder / "scores.parquet"
    data = table.read_bytes()
    for cut in (data[: len(data) // 2], b""):
        table.write_bytes(cut)
        proc = run_cyto("data", "cells", str(folder), "--out", str(tmp_path / "ds"))
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
        assert f"{table.resolve()} is truncated or damaged" in proc.stderr
        assert "score its slide again" in proc.stderr
        assert not (tmp_path / "ds").exists()


# --- e. cohort.csv with bytes that are not UTF-8 ---------------------------------------------


def test_a_cohort_table_with_bytes_that_are_not_utf8_is_updated(scored, made, exported_dsvdd):
    """A cohort.csv edited in another encoding (Latin-1 'é' as one byte), then a run into the
    same folder (--resume: the slide is kept, its row written again): the table is updated
    (the odd bytes as \\xe9) instead of a traceback."""
    table = scored / "cohort.csv"
    rows = table.read_bytes().splitlines(keepends=True)
    # a failed slide's row (no folder: kept as written; a "scored" row needs its sealed folder)
    rows.append(b"/old/Pr\xe9parat.tif," + str(scored / "old").encode() + b",failed\r\n")
    table.write_bytes(b"".join(rows))
    proc = run_cyto(
        "score", str(made), "--model", str(exported_dsvdd), "--out", str(scored),
        "--workers", "0", "--mosaic", "0", "--top-k", "10", "--resume",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = table.read_bytes().decode("utf-8")  # strict
    got = {Path(r["output"]).name: r for r in csv.DictReader(text.splitlines())}
    assert got["old"]["slide"] == "/old/Pr\\xe9parat.tif" and got["s"]["status"] == "scored"


def test_a_cohort_table_that_cannot_be_parsed_is_one_line_before_any_work(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    table = out / "cohort.csv"
    table.write_text("slide,output\n" + '"' + "x" * 200_000 + '",o\n')  # over the CSV field limit
    with pytest.raises(OutputWriteError, match=r"cohort\.csv: it is not a CSV file cyto can read"):
        read_cohort_table(table)
    table.write_bytes(bytes(range(256)) * 4)  # something else put in its place
    with pytest.raises(OutputWriteError, match=r"cohort\.csv: it is no cohort table"):
        score_cohort([tmp_path / "s.tif"], tmp_path / "no-model", out, OPTS)


# --- f. a synthetic slide too large for the machine ------------------------------------------


def test_a_synthetic_slide_too_large_for_memory_is_refused_before_allocating(tmp_path):
    """10^7 x 10^7 px asked for a 70 GiB array (and far more): refused at once, in one line with
    the size asked, the memory it needs and what fits. Run under a 3 GiB address-space limit,
    so that a regression fails fast instead of swapping the machine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cyto", "synth", "slide", str(tmp_path / "big.tif"),
         "--width", "10000000", "--height", "10000000"],
        capture_output=True, text=True, preexec_fn=limit, timeout=120,
        env={**os.environ, "CYTO_PROGRESS": "0"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert "--width 10000000 --height 10000000" in proc.stderr
    assert "GiB of memory to draw" in proc.stderr and "available" in proc.stderr
    assert "largest square slide that fits is about" in proc.stderr
    assert time.monotonic() - t0 < 60 and not list(tmp_path.iterdir())


def test_the_memory_check_follows_the_machine(tmp_path, monkeypatch):
    from cyto.data.synth import slide as synth

    config = synth.SlideSynthConfig(width=2048, height=2048)
    need = synth.memory_needed(config, 1)
    assert need < synth.memory_needed(config, 4)  # every drawing process holds its rows
    monkeypatch.setattr(synth, "available_memory", lambda: need - 1)
    with pytest.raises(ConfigError, match=r"2,048 x 2,048 px slide .* the largest square slide"):
        synth.write_slide(tmp_path / "s.tif", config, workers=0)
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(synth, "available_memory", lambda: None)  # unknown: not refused
    synth.check_memory(config, 0)


# --- sizes with no bound reached the allocator (issue 68, hostile round 12) ------------------


def test_a_tile_or_crop_no_machine_holds_is_refused_up_front(made, exported_dsvdd, tmp_path):
    """`--tile 100000000` failed the slide "unforeseen (MemoryError: ... 26.6 PiB)"; with
    `--patch-size 100000` the advice to raise --tile led to the same crash. Both are refused
    in one line, exit 2, naming the flag and its range, before a slide is read."""
    cases = {
        ("--tile", "100000000"): "error: --tile must be between 16 and 16384 (px), got 100000000",
        ("--patch-size", "100000"): (
            "error: --patch-size must be between 16 and 1024 (px), got 100000"
        ),
        ("--patch-size", "100000", "--tile", "100000"): "error: --patch-size must be between",
    }
    for i, (flags, words) in enumerate(cases.items()):
        out = tmp_path / f"o{i}"
        r = run_cyto("score", str(made), "--model", str(exported_dsvdd), "--out", str(out), *flags)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (flags, r.stderr)
        assert lines[0].startswith(words), (flags, lines)
        assert not out.exists(), flags


def test_an_input_size_no_machine_holds_is_refused_up_front(synth_patches, tmp_path):
    """`cyto train --set input_size=100000` printed "stopped: ... rerun to start over" and an
    80-line traceback (cv2 failing to allocate 30 GB); it is refused in one line, exit 2."""
    for key in ("input_size", "load_size"):
        r = run_cyto(
            "train", "dsvdd", "--data", str(synth_patches), "--normal", "normal",
            "--set", f"{key}=100000", "--out", str(tmp_path / "m.cyto"),
        )  # fmt: skip
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"error: --set {key} must be between 16 and 1024 (px"), lines
        assert "rerun" not in r.stdout + r.stderr


def test_out_of_memory_in_one_slide_is_said_as_such(made, exported_dsvdd, tmp_path, monkeypatch):
    """A MemoryError in one slide was "failed unforeseen ... Please report it": it is the
    machine's limit, said in one line naming what to lower (at the CLI and from Python), and
    the other slides go on."""
    import cyto
    import cyto.cohort.local as local
    import cyto.infer.pipeline as pipeline

    real = local.score_slide

    def hungry(slide, *args, **kwargs):
        if Path(str(slide)).stem == "b":
            raise MemoryError("Unable to allocate 26.6 PiB for an array")
        return real(slide, *args, **kwargs)

    monkeypatch.setattr(local, "score_slide", hungry)
    slides = []
    for name in ("a.tif", "b.tif"):
        shutil.copyfile(made, tmp_path / name)
        slides.append(tmp_path / name)
    r = run_cyto("score", *map(str, slides), "--model", str(exported_dsvdd), "--out",
                 str(tmp_path / "o"), "--workers", "0", "--mosaic", "0")  # fmt: skip
    said = f"out of memory scoring {tmp_path / 'b.tif'}: lower --tile, --batch-size or --workers"
    assert said in r.stdout + r.stderr, r.stdout + r.stderr
    # (not "report" alone: OpenVINO "reports FP32, INT8" on a CPU without bf16)
    assert "unforeseen" not in r.stdout + r.stderr and "Please report" not in r.stdout + r.stderr
    assert (tmp_path / "o" / "a" / "summary.json").is_file()
    monkeypatch.setattr(pipeline, "score_slide", hungry)
    with pytest.raises(CytoError) as err:
        cyto.score_slide(slides[1], exported_dsvdd, tmp_path / "p", workers=0, echo=None)
    assert str(err.value).startswith(
        f"out of memory scoring {slides[1]}: lower tile=, batch_size= or workers="
    ), str(err.value)


def test_out_of_memory_in_training_is_one_line(synth_patches, tmp_path, monkeypatch):
    """A MemoryError in training printed "stopped: no epoch was finished yet: rerun to start
    over" (a rerun does the same) and a traceback; it is one line naming what to lower."""
    from cyto.train.registry import get_method

    def hungry(self, *args, **kwargs):
        raise MemoryError("Failed to allocate 30000000000 bytes")

    monkeypatch.setattr(get_method("dsvdd"), "fit", hungry)
    r = run_cyto(
        "train", "dsvdd", "--data", str(synth_patches), "--normal", "normal",
        "--out", str(tmp_path / "m.cyto"),
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0] == (
        "error: out of memory training dsvdd: lower --set batch_size or --set input_size"
    ), lines
    assert "rerun" not in r.stdout + r.stderr


@pytest.mark.pyvips
def test_a_tiff_cut_before_its_second_directory_is_said_without_a_python_repr(tmp_path):
    """The line quoted tifffile's warning whole, "<tifffile.TiffPages @144112> invalid page
    offset 195820" (hostile round 51, 6): its words alone."""
    import pyvips

    from cyto.errors import UnsupportedSlideError
    from cyto.slides.readers import check_tiff_data

    pixels = np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    whole = tmp_path / "whole.tif"
    image = pyvips.Image.new_from_array(pixels).copy(interpretation="srgb")
    image.tiffsave(str(whole), tile=True, pyramid=True, tile_width=256, tile_height=256)
    data = whole.read_bytes()
    cut = tmp_path / "cut.tif"
    cut.write_bytes(data[: len(data) - 1000])  # the second directory is written last
    with pytest.raises(UnsupportedSlideError) as err:
        check_tiff_data(cut, len(data) - 1000)
    assert "damaged or truncated TIFF (invalid page offset " in str(err.value), str(err.value)
    assert "<" not in str(err.value) and "@" not in str(err.value)
