"""The outputs QuPath opens as they are (cyto.infer.qupath): cells.geojson and topk.geojson as
QuPath detection objects, written in bounded memory; the abnormality map as a pyramidal OME-TIFF
that validates against the OME schema and opens with tifffile, pyvips and OpenSlide at its pixel
size; and `cyto score` writing them, listing them for reuse and choosing them with --qupath.

What QuPath reads, from its source (qupath/qupath, qupath-core/src/main/java/qupath/lib/io/,
the same in v0.4.0, v0.5.0 and v0.6.0):

- ``PathIO.readObjects``: a ``.geojson`` or ``.json`` file holding a ``FeatureCollection``;
- ``QuPathTypeAdapters.PathObjectTypeAdapter.parseObject``: ``geometry``; in ``properties``:
  ``objectType`` (``"detection"`` makes a detection; absent, an annotation), ``name``,
  ``classification``, ``isLocked``, ``measurements`` (an object, or the pre-v0.4 list of
  ``{name, value}``), ``metadata``; a feature ``id`` only when it is a UUID;
- ``MeasurementListTypeAdapter.read``: the measurements object as ``Map<String, Double>`` in
  v0.4 and v0.5 (a JSON true/false or null there is not a Double), numbers or "NaN"-like strings
  from v0.6;
- ``GsonTools.PathClassTypeAdapter.read``: a classification object is read only with ``name``
  (or ``names``) *and* ``color``, else "Unable to parse PathClass" (or a plain string);
- ``ROITypeAdapters``: a ``Polygon``'s rings become JTS linear rings (closed, 4 positions at
  least); ``isEllipse: true`` beside the geometry makes an ellipse ROI of its bounds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cyto.infer.maps import abnormality_grid
from cyto.infer.qupath import (
    CELLS_GEOJSON,
    FLAGGED_CLASS,
    MAP_TIFF,
    TOP_K_CLASS,
    decode_map,
    write_detections,
    write_map_tiff,
)

OME_XSD = Path(__file__).resolve().parents[1] / "data" / "ome-2016-06.xsd"
#: what cyto writes in a detection's properties (all of it QuPath reads, nothing else)
PROPERTIES = {"objectType", "name", "classification", "measurements"}


def score_table(n: int, seed: int = 0) -> pa.Table:
    """A ranked, calibrated score table of ``n`` cells as cyto writes it, with the adequacy's
    text and flag columns, missing values and a nucleus without an area."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=n)
    rank = np.empty(n, np.int64)
    rank[np.argsort(-score, kind="stable")] = np.arange(1, n + 1)
    area = rng.uniform(40, 400, n)
    area[::97] = np.nan  # e.g. a point from --nuclei
    p = rng.random(n)
    return pa.table(
        {
            "slide_id": pa.array(["s"] * n),
            "cell_id": pa.array(np.arange(n)),
            "x": pa.array(rng.uniform(0, 40000, n)),
            "y": pa.array(rng.uniform(0, 30000, n)),
            "nucleus_area": pa.array(area),  # NaN, not null: both are left out
            "score": pa.array(score),
            "morphometry_score": pa.array([None] * n, pa.float64()),
            "focal_plane_um": pa.array(np.where(np.arange(n) % 3 == 0, 1.0, 0.0)),
            "tile": pa.array(rng.integers(0, 900, n)),
            "rank": pa.array(rank),
            "p_value": pa.array([None if i % 50 == 0 else float(v) for i, v in enumerate(p)]),
            "flagged_bh": pa.array(rank <= max(1, n // 100)),
            "flagged_adaptive": pa.array(rank <= max(1, n // 80)),
            "quality": pa.array(["ok" if i % 7 else "blurred" for i in range(n)]),
            "evaluable": pa.array(np.arange(n) % 7 != 0),
        }
    )


def read_json(path: Path):
    """A JSON file read strictly: NaN and Infinity, which Python writes and QuPath's Gson in
    v0.4 and v0.5 does not take as measurements, are refused."""

    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def check_qupath_feature(f: dict) -> None:
    """One GeoJSON feature as QuPath v0.4-v0.6 reads it into a detection (the module docstring
    names the source of each rule)."""
    assert f["type"] == "Feature" and "id" not in f  # QuPath gives each object its UUID
    geom = f["geometry"]
    assert geom["type"] == "Polygon" and geom["isEllipse"] is True
    ring = geom["coordinates"][0]
    assert len(geom["coordinates"]) == 1 and len(ring) >= 4 and ring[0] == ring[-1]  # JTS ring
    assert all(len(p) == 2 and all(isinstance(c, (int, float)) for c in p) for p in ring)
    props = f["properties"]
    assert set(props) <= PROPERTIES and props["objectType"] == "detection"
    assert isinstance(props["name"], str)
    if "classification" in props:
        cls = props["classification"]
        assert set(cls) == {"name", "color"} and isinstance(cls["name"], str)
        assert len(cls["color"]) == 3 and all(isinstance(c, int) for c in cls["color"])
    m = props["measurements"]
    assert isinstance(m, dict) and m
    for name, value in m.items():  # Map<String, Double>: numbers only, never bool or null
        assert isinstance(name, str)
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, value)
        assert math.isfinite(value)


def test_cells_are_qupath_detections_with_every_numeric_column(tmp_path):
    table = score_table(500)
    path = tmp_path / CELLS_GEOJSON
    assert write_detections([table], path, top_k=20, radius_px=16.0) == 500
    features = read_json(path)["features"]
    assert len(features) == 500
    for f in features:
        check_qupath_feature(f)
    rows = table.to_pylist()
    for f, row in zip(features, rows, strict=True):
        m = f["properties"]["measurements"]
        # every number and flag of the table, by its column name; text (slide_id, quality) and
        # the centre (the geometry) are not measurements; a missing value is left out
        for col in ("cell_id", "score", "rank", "tile", "focal_plane_um"):
            assert m[col] == row[col], col
        assert m["flagged_bh"] == int(row["flagged_bh"]) and m["evaluable"] == int(row["evaluable"])
        assert ("p_value" in m) == (row["p_value"] is not None)
        if row["p_value"] is not None:
            assert m["p_value"] == row["p_value"]
        assert "morphometry_score" not in m and not {"x", "y", "slide_id", "quality"} & set(m)
        assert ("nucleus_area" in m) == (not math.isnan(row["nucleus_area"]))
        # the nucleus: a circle around the centre of the nucleus's area (QuPath: the octagon's
        # bounds), or 16 px where the table gives none
        ring = np.asarray(f["geometry"]["coordinates"][0])
        r = 16.0 if math.isnan(row["nucleus_area"]) else math.sqrt(row["nucleus_area"] / math.pi)
        np.testing.assert_allclose(ring[:-1].mean(0), [row["x"], row["y"]], atol=0.01)
        np.testing.assert_allclose(ring.max(0) - ring.min(0), [2 * r, 2 * r], atol=0.02)
        assert f["properties"]["name"] == f"rank {row['rank']}"
        cls = f["properties"].get("classification")
        if row["flagged_bh"]:
            assert cls == {"name": FLAGGED_CLASS[0], "color": list(FLAGGED_CLASS[1])}
        elif row["rank"] <= 20:
            assert cls == {"name": TOP_K_CLASS[0], "color": list(TOP_K_CLASS[1])}
        else:
            assert cls is None


def test_a_cell_without_a_centre_is_left_out_and_the_file_stays_json(tmp_path):
    table = score_table(10)
    x = table["x"].to_numpy().copy()
    x[3] = np.nan
    table = table.set_column(table.schema.get_field_index("x"), "x", pa.array(x))
    path = tmp_path / CELLS_GEOJSON
    assert write_detections([table], path, top_k=5, radius_px=8.0) == 9
    features = read_json(path)["features"]  # strict JSON: no NaN anywhere
    ids = [f["properties"]["measurements"]["cell_id"] for f in features]
    assert ids == [i for i in range(10) if i != 3]
    empty = tmp_path / "empty.geojson"
    assert write_detections([table.slice(0, 0)], empty, top_k=5, radius_px=8.0) == 0
    assert read_json(empty) == {"type": "FeatureCollection", "features": []}


def test_topk_geojson_is_written_by_the_same_writer(tmp_path):
    """topk.geojson was points with a classification of a name and no colour, which QuPath
    v0.4-v0.6 refuses ("Unable to parse PathClass"), and only three measurements."""
    from cyto.infer.outputs import ranks, write_geojson

    table = score_table(300, seed=1).drop_columns(["rank"])
    order, rank = ranks(np.asarray(table["score"]))
    table = table.append_column("rank", pa.array(rank))
    write_geojson(table, order, 25, tmp_path / "topk.geojson", mpp=0.25)
    features = read_json(tmp_path / "topk.geojson")["features"]
    assert [f["properties"]["measurements"]["rank"] for f in features] == list(range(1, 26))
    for f in features:
        check_qupath_feature(f)
        assert f["properties"]["classification"]["name"] in (TOP_K_CLASS[0], FLAGGED_CLASS[0])
    ids = [f["properties"]["measurements"]["cell_id"] for f in features]
    assert ids == np.asarray(table["cell_id"])[order[:25]].tolist()


#: run in a process of its own: the growth of its peak RSS while it writes cells.geojson
_RSS_CHILD = """
import resource, sys
from cyto.infer.qupath import write_cells_geojson
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = write_cells_geojson(sys.argv[1], sys.argv[2], top_k=400, mpp=0.25)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(n, (after - before) * 1024)
"""


def _rss_growth_writing(rows: int, tmp_path: Path) -> tuple[int, Path]:
    """Bytes the peak RSS of a process grows by while it writes ``rows`` cells (Linux)."""
    import subprocess
    import sys

    table_path = tmp_path / f"scores_{rows}.parquet"
    pq.write_table(score_table(rows, seed=rows), table_path, row_group_size=8192)
    out = tmp_path / f"cells_{rows}.geojson"
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(table_path), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    n, growth = map(int, proc.stdout.split())
    assert n == rows
    return growth, out


@pytest.mark.slow
def test_a_hundred_thousand_cells_are_written_in_bounded_memory_and_read_back(tmp_path):
    small, _ = _rss_growth_writing(10_000, tmp_path)
    large, path = _rss_growth_writing(100_000, tmp_path)
    # a batch at a time: ten times the cells, not more memory (10^5 features held as Python
    # objects at once take hundreds of MB; Parquet's read-ahead held 10 MB more at 10^5 cells
    # than at 10^4). Measured here: 30.5 MB and 30.9 MB (and 31.5 MB at 4 x 10^5)
    assert large < small + 6e6, (small, large)
    assert large < 64e6, large
    features = read_json(path)["features"]  # a GeoJSON parser reads it whole
    table = pq.read_table(tmp_path / "scores_100000.parquet")
    assert len(features) == table.num_rows == 100_000
    m = [f["properties"]["measurements"] for f in features]
    for col in ("cell_id", "score", "rank", "tile", "nucleus_area", "focal_plane_um"):
        want = table[col].to_pylist()
        got = [row.get(col, float("nan")) for row in m]
        np.testing.assert_array_equal(np.asarray(got, float), np.asarray(want, float), col)
    got_flags = [row["flagged_bh"] for row in m]
    assert got_flags == [int(v) for v in table["flagged_bh"].to_pylist()]
    for f in features[:: 100_000 // 500]:
        check_qupath_feature(f)


def _map(n: int = 100_000, width: int = 40_000, height: int = 36_000, mpp: float = 0.25):
    rng = np.random.default_rng(5)
    x, y = rng.uniform(0, width, n), rng.uniform(0, height / 2, n)  # the lower half: no cells
    score = rng.normal(size=n)
    return abnormality_grid(x, y, score, width, height, mpp, flagged=score > 2.0)


def test_abnormality_map_is_a_valid_pyramidal_ome_tiff_at_its_pixel_size(tmp_path):
    import tifffile

    m = _map()
    assert m.shape == (180, 200) and m.window_px == 200.0
    path = tmp_path / MAP_TIFF
    scale = write_map_tiff(m, path, tile=64)
    with tifffile.TiffFile(path) as tif:
        assert tif.is_ome
        levels = tif.series[0].levels
        assert [lv.shape for lv in levels] == [(180, 200), (90, 100), (45, 50)]
        assert levels[0].pages[0].is_tiled and levels[1].pages[0].is_tiled
        xml = tif.ome_metadata
        pixels = levels[0].asarray()
        assert levels[1].asarray().max() == pixels.max()  # the halvings keep the hot spots
    pytest.importorskip("lxml", reason="tifffile validates OME-XML with lxml (the test extra)")
    assert tifffile.OmeXml.validate(xml, omexsd=OME_XSD.read_bytes())  # the 2016-06 OME schema
    ome = tifffile.xml2dict(xml)["OME"]
    px = ome["Image"]["Pixels"]
    assert px["PhysicalSizeX"] == px["PhysicalSizeY"] == 50.0
    assert px["PhysicalSizeXUnit"] == px["PhysicalSizeYUnit"] == "µm"
    assert px["Type"] == "uint8" and (px["SizeX"], px["SizeY"]) == (200, 180)
    annotation = {
        e["K"]: e["value"] for e in ome["StructuredAnnotations"]["MapAnnotation"]["Value"]["M"]
    }
    assert annotation["cyto.kind"] == "fraction_flagged" and str(annotation["cyto.no_cells"]) == "0"
    # the pixels read back as the map's values through the documented scale
    back = decode_map(pixels, scale)
    assert np.array_equal(np.isnan(back), np.isnan(m.values))
    np.testing.assert_allclose(back, m.values, atol=0.5 / 254, equal_nan=True)
    assert (pixels[90:] == 0).all()  # no cells: 0, never read as "normal cells here"


@pytest.mark.pyvips
def test_abnormality_map_opens_with_pyvips_at_its_pixel_size(tmp_path):
    import pyvips

    path = tmp_path / MAP_TIFF
    write_map_tiff(_map(), path, tile=64)
    image = pyvips.Image.new_from_file(str(path))
    assert image.get("vips-loader") == "tiffload"
    assert (image.width, image.height, image.bands, image.format) == (200, 180, 1, "uchar")
    assert 1000.0 / image.xres == pytest.approx(50.0) == 1000.0 / image.yres  # px/mm -> um
    assert image.get("n-subifds") == 2
    half = pyvips.Image.new_from_file(str(path), subifd=0)
    assert (half.width, half.height) == (100, 90)
    assert 1000.0 / half.xres == pytest.approx(100.0)
    if pyvips.type_find("VipsForeign", "openslideload"):
        # libvips over the system's OpenSlide: it opens; OpenSlide 3.4 gives generic TIFFs no
        # pixel size (4.0 does: the test below)
        slide = pyvips.Image.openslideload(str(path))
        assert (slide.width, slide.height) == (200, 180)
        assert slide.get("openslide.vendor") == "generic-tiff"
        if "openslide.mpp-x" in slide.get_fields():
            assert float(slide.get("openslide.mpp-x")) == pytest.approx(50.0)


@pytest.mark.openslide
def test_abnormality_map_opens_with_openslide_at_its_pixel_size(tmp_path):
    """OpenSlide (4.0, openslide-bin) reads the OME-TIFF as a generic TIFF: its first image at
    the stated pixel size; it does not read the SubIFD levels (only a pyramid in the main IFD
    chain, which an OME-TIFF reader would take for more planes)."""
    import openslide

    path = tmp_path / MAP_TIFF
    m = _map()
    write_map_tiff(m, path, tile=64)
    slide = openslide.OpenSlide(str(path))
    assert slide.properties["openslide.vendor"] == "generic-tiff"
    assert slide.dimensions == (200, 180)
    assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(50.0)
    assert float(slide.properties["openslide.mpp-y"]) == pytest.approx(50.0)
    region = np.asarray(slide.read_region((0, 0), 0, (200, 180)))
    assert (region[90:, :, 0] == 0).all() and region[:90, :, 0].max() > 0
    slide.close()


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    return write_slide(
        tmp_path_factory.mktemp("s") / "s.tif",
        SlideSynthConfig(width=1536, height=1024, seed=3, abnormal_fraction=0.1),
    ).paths[0]


def test_score_writes_them_lists_them_and_redoes_a_slide_whose_outputs_differ(
    exported_dsvdd, slide, tmp_path
):
    """`cyto score` writes cells.geojson and the map by default, records their sizes in
    summary.json's outputs, says how to open them; on --resume, a finished slide whose
    cells.geojson was cut short, or that was scored with other --qupath outputs, gets them drawn
    again from its table (anything else that differs is scored again); --qupath none removes
    another run's."""
    import tifffile

    from cyto.cohort.local import finished_summary
    from cyto.infer import ScoreOptions, score_slide
    from cyto.infer.options import as_cut
    from cyto.runtime import load_scorer
    from cyto.seal import seal_outputs
    from tests.cli_runner import run_cyto

    out = tmp_path / "out"
    proc = run_cyto(
        "score", str(slide), "--model", str(exported_dsvdd), "--out", str(out), "--workers", "0"
    )
    assert proc.returncode == 0, proc.stderr
    folder = out / "s"
    summary = json.loads((folder / "summary.json").read_text())
    said_qupath = [line for line in proc.stdout.splitlines() if line.startswith("QuPath: in ")]
    assert len(said_qupath) == 1 and str(folder) in said_qupath[0]
    assert CELLS_GEOJSON in said_qupath[0] and MAP_TIFF in said_qupath[0]
    assert "open-in-qupath" in said_qupath[0]
    cells = summary["outputs"][CELLS_GEOJSON]
    assert cells["features"] == summary["cells_scored"] > 0
    assert cells["bytes"] == (folder / CELLS_GEOJSON).stat().st_size
    features = read_json(folder / CELLS_GEOJSON)["features"]
    table = pq.read_table(folder / "scores.parquet")
    assert len(features) == table.num_rows
    assert sorted(f["properties"]["measurements"]["cell_id"] for f in features) == sorted(
        table["cell_id"].to_pylist()
    )
    for f in features:
        check_qupath_feature(f)
    scale = summary["outputs"][MAP_TIFF]["scale"]
    assert scale["kind"] == "max_score" and scale["window_um"] == 50.0
    with tifffile.TiffFile(folder / MAP_TIFF) as tif:
        assert tif.is_ome and tif.series[0].shape == tuple(scale["levels"][0])
    assert summary["output_key"]["qupath"] == "cells,map"

    scorer = load_scorer(exported_dsvdd, "onnx", "cpu", "fp32")
    said = []
    table_written = (folder / "scores.parquet").stat().st_mtime_ns
    same = ScoreOptions(workers=0, resume=True)
    assert finished_summary(folder, scorer, slide, same, said.append) == summary
    # a cells.geojson cut short is drawn again from the table; the cells are not scored again
    data = (folder / CELLS_GEOJSON).read_bytes()
    (folder / CELLS_GEOJSON).write_bytes(data[: len(data) // 2])
    again = finished_summary(folder, scorer, slide, same, said.append)
    assert again is not None and "cells.geojson holds" in said[-1]
    assert (folder / CELLS_GEOJSON).read_bytes() == data
    assert again["outputs"][CELLS_GEOJSON]["bytes"] == len(data)
    # other QuPath outputs asked for: written (and another run's removed), the summary says so
    only_map = ScoreOptions(workers=0, resume=True, qupath="map", map_um=100.0)
    moved = finished_summary(folder, scorer, slide, only_map, said.append)
    assert "--qupath" in said[-1] and "--map-um" in said[-1]
    assert not (folder / CELLS_GEOJSON).exists() and CELLS_GEOJSON not in moved["outputs"]
    assert moved["output_key"] == as_cut(only_map, scorer.spec).output_key()  # as a run records
    assert moved["outputs"][MAP_TIFF]["scale"]["window_um"] == 100.0
    assert json.loads((folder / "summary.json").read_text()) == moved
    assert finished_summary(folder, scorer, slide, only_map, said.append) == moved  # as it is
    assert (folder / "scores.parquet").stat().st_mtime_ns == table_written
    # anything else that differs scores the slide again
    other = ScoreOptions(workers=0, resume=True, qupath="map", map_um=100.0, top_k=50)
    assert finished_summary(folder, scorer, slide, other, said.append) is None
    assert "--top-k" in said[-1] and "scoring it again" in said[-1]

    score_slide(slide, scorer, folder, ScoreOptions(workers=0, qupath="none"), echo=said.append)
    assert not (folder / CELLS_GEOJSON).exists() and not (folder / MAP_TIFF).exists()
    summary = json.loads((folder / "summary.json").read_text())
    assert CELLS_GEOJSON not in summary["outputs"] and MAP_TIFF not in summary["outputs"]
    # a folder of a cyto before these outputs (its key has no --qupath): written on --resume
    for field in ("qupath", "map_um"):
        del summary["output_key"][field]
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, summary["outputs"])  # sealed as that cyto's run would be
    older = finished_summary(folder, scorer, slide, same, said.append)
    assert older is not None and older["output_key"] == as_cut(same, scorer.spec).output_key()
    assert (folder / CELLS_GEOJSON).is_file() and (folder / MAP_TIFF).is_file()


def test_qupath_option_is_checked_by_name():
    from cyto.errors import ConfigError
    from cyto.infer import ScoreOptions

    assert ScoreOptions().qupath_outputs() == ("cells", "map")
    assert ScoreOptions(qupath="map, cells").qupath_outputs() == ("cells", "map")
    assert ScoreOptions(qupath="all").qupath_outputs() == ("cells", "map")
    assert ScoreOptions(qupath="none").qupath_outputs() == ()
    with pytest.raises(ConfigError, match="--qupath takes cells, map"):
        ScoreOptions(qupath="cells,heatmap")
    with pytest.raises(ConfigError, match="--map-um"):
        ScoreOptions(map_um=0.0)


def test_the_qupath_line_of_a_folder_in_object_storage_says_to_copy_it_first():
    """Hostile round 61, 6: after --out s3://..., the line said to drag cells.geojson from an
    S3 prefix, where there is nothing to drag."""
    from cyto.infer.qupath import CELLS_GEOJSON, MAP_TIFF, qupath_words

    outputs = {CELLS_GEOJSON: {}, MAP_TIFF: {}}
    remote = qupath_words([{"outputs": outputs, "output": "s3://results/run/s1"}])
    # the copy said once, with the tool that makes it (said before each file, with none:
    # hostile round 74, 2)
    assert remote.startswith(
        "QuPath: copy s3://results/run/s1 to this machine (e.g. aws s3 cp --recursive), then in "
        f"that copy: drag {CELLS_GEOJSON}"
    ), remote
    assert remote.count("copy ") == 1 and f"; open {MAP_TIFF}" in remote, remote
    both = qupath_words([{"outputs": outputs, "output": f"https://h/run/s{i}"} for i in (1, 2)])
    assert both.startswith("QuPath: copy each slide's folder to this machine, then in"), both
    local = qupath_words([{"outputs": outputs, "output": "/data/out/s1"}])
    assert local.startswith(f"QuPath: in /data/out/s1: drag {CELLS_GEOJSON}"), local
    assert "copy" not in local
