"""Side inputs must belong to what they are given with (issue 56): --truth rows to their slide,
a calibration slide's own truth to a negative slide, --nuclei points to one nucleus each,
--planes to the slide, and an existing result is replaced only with --overwrite. The file
readers give a result or one line of a typed error for any table, never a traceback."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cyto.detect import read_nuclei_file
from cyto.errors import BundleError, ConfigError, CytoError, CytoWarning, InputPathError
from cyto.infer.outputs import labels_from_truth, read_truth


def _scores(slide_id: str, xy) -> pa.Table:
    """A score table as cyto score writes it, before truth labels: one row per detection."""
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    return pa.table(
        {
            "slide_id": pa.array([slide_id] * len(xy), pa.string()),
            "cell_id": pa.array(np.arange(len(xy), dtype=np.int64)),
            "x": pa.array(xy[:, 0]),
            "y": pa.array(xy[:, 1]),
            "score": pa.array(np.zeros(len(xy))),
        }
    )


def _truth_csv(path: Path, rows: list[tuple]) -> Path:
    head = "slide_id,x,y,label" if len(rows[0]) == 4 else "x,y,label"
    path.write_text(head + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


# --- 6: --truth rows belong to their slide -------------------------------------------------


@given(
    offsets=st.lists(
        st.tuples(st.floats(-7, 7), st.floats(-7, 7)), min_size=1, max_size=6, unique=True
    )
)
@example(offsets=[(0.0, 2.8841624844767666e-298), (0.0, 0.0)])  # two at one place: the first
def test_a_truth_cell_labels_one_detection_its_nearest(offsets):
    """A planted crop holds other nuclei within its reach (a neighbour's, debris): each was
    labelled abnormal, so `cyto eval` on a --truth table counted 51 abnormal cells of 34 planted
    (hostile round 18). Each truth cell labels the detection nearest it, the first of equally
    near ones (all lie within its reach of 10 px here)."""
    with tempfile.TemporaryDirectory() as tmp:
        truth = _truth_csv(Path(tmp) / "t.csv", [(500, 500, 1), (700, 700, 0)])
        xy = [(500 + dx, 500 + dy) for dx, dy in offsets] + [(701, 700), (702, 700)]
        labels, idx, planted = labels_from_truth(_scores("s", xy), truth, 10)
    at = np.asarray(
        xy[: len(offsets)], dtype=float
    )  # as the table holds them (500 + 1e-298 is 500)
    d = np.hypot(at[:, 0] - 500, at[:, 1] - 500)
    nearest = int(np.flatnonzero(d == d.min())[0])
    assert planted == 1 and labels.sum() == 1 and labels[nearest] == 1
    assert (idx >= 0).sum() == 2 and idx[nearest] == 0 and idx[len(offsets)] == 1


@settings(max_examples=25, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["NILM", "ASC-US", "LSIL"]), min_size=1, max_size=8),
    missed=st.sets(st.integers(0, 7)),
    extra=st.integers(0, 3),
)
def test_each_detection_carries_its_truth_cells_class(kinds, missed, extra):
    """Hostile round 26 (7): a composed slide's table had no ``class``, so `cyto eval scores
    --by-class` (the Bethesda breakdown the Pap how-to asks for) could not run on it, though the
    truth names each planted crop's class. A detection matched to a truth cell carries its
    class, any other ``unmatched`` (labelled 0: counted with the normals); a truth table
    without ``class`` gives none."""
    from cyto.infer.outputs import UNMATCHED

    with tempfile.TemporaryDirectory() as tmp:
        rows = [(100 + 100 * i, 100, int(k != "NILM"), k) for i, k in enumerate(kinds)]
        truth = Path(tmp) / "t.csv"
        truth.write_text(
            "x,y,label,class\n" + "".join(f"{x},{y},{lab},{k}\n" for x, y, lab, k in rows)
        )
        xy = [(x + 2, y) for i, (x, y, _, _) in enumerate(rows) if i not in missed]
        xy += [(50 + 100 * j, 900) for j in range(extra)]  # debris far from every truth cell
        if not xy:
            return
        labels, idx, planted, classes = labels_from_truth(_scores("s", xy), truth, 10, classes=True)
        seen = [k for i, (_, _, _, k) in enumerate(rows) if i not in missed]
        assert classes.tolist() == seen + [UNMATCHED] * extra
        assert labels.tolist() == [int(k != "NILM") for k in seen] + [0] * extra
        plain = Path(tmp) / "p.csv"
        plain.write_text("x,y,label\n" + "".join(f"{x},{y},{lab}\n" for x, y, lab, _ in rows))
        assert labels_from_truth(_scores("s", xy), plain, 10, classes=True)[3] is None
        assert len(labels_from_truth(_scores("s", xy), plain, 10)) == 3


def test_truth_rows_of_another_slide_are_not_matched(tmp_path):
    """Slide a's detections at (100, 100) and (300, 300); the truth table plants an abnormal
    cell of slide b at (100, 100) and one of slide a at (300, 300). Each slide is labelled by
    its own rows only (b's cell was matched on a, and a's planted count was both slides')."""
    truth = _truth_csv(
        tmp_path / "t.csv", [("b", 100, 100, 1), ("a", 300, 300, 1), ("a", 500, 500, 0)]
    )
    labels, idx, planted = labels_from_truth(_scores("a", [(100, 100), (300, 300)]), truth, 10)
    assert labels.tolist() == [0, 1] and planted == 1
    assert idx[0] == -1
    labels, _, planted = labels_from_truth(_scores("b", [(100, 100), (300, 300)]), truth, 10)
    assert labels.tolist() == [1, 0] and planted == 1


def test_truth_given_by_the_slides_file_name_is_matched(tmp_path):
    truth = _truth_csv(tmp_path / "t.csv", [("a.ndpi", 100, 100, 1), ("b.ndpi", 300, 300, 1)])
    labels, _, planted = labels_from_truth(_scores("a", [(100, 100), (300, 300)]), truth, 10)
    assert labels.tolist() == [1, 0] and planted == 1


def test_truth_of_no_row_of_this_slide_warns_in_one_line(tmp_path):
    truth = _truth_csv(tmp_path / "t.csv", [("b", 100, 100, 1), ("c", 300, 300, 1)])
    with pytest.warns(CytoWarning, match=r"--truth .*t\.csv holds no cell of slide 'a'") as said:
        labels, _, planted = labels_from_truth(_scores("a", [(100, 100)]), truth, 10)
    assert labels is None and planted == 0  # no truth of this slide: unknown, not negative
    assert [str(w.message).count("\n") for w in said] == [0]
    assert "'b', 'c'" in str(said[0].message)
    from cyto.flags import python_words

    with python_words("score_slide"), pytest.warns(CytoWarning) as said:  # a hostile check
        labels_from_truth(_scores("a", [(100, 100)]), truth, 10)
    assert str(said[0].message).startswith("truth='") and "--truth" not in str(said[0].message)


def test_truth_without_a_slide_id_column_is_one_slides(tmp_path):
    truth = _truth_csv(tmp_path / "t.csv", [(100, 100, 1), (300, 300, 0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the table is this slide's
        labels, _, planted = labels_from_truth(_scores("a", [(100, 100), (300, 300)]), truth, 10)
    assert labels.tolist() == [1, 0] and planted == 1


def test_an_empty_slide_id_column_is_no_slide_id(tmp_path):
    truth = tmp_path / "t.csv"
    truth.write_text("slide_id,x,y,label\n,100,100,1\n,300,300,0\n")
    labels, _, planted = labels_from_truth(_scores("a", [(100, 100)]), truth, 10)
    assert labels.tolist() == [1] and planted == 1


def test_synthetic_truth_of_two_slides_in_one_table(tmp_path):
    """`cyto synth slide` truth tables (slide_id = the slide's name) of two slides, stacked."""
    a = pa.table({"slide_id": ["s1"] * 2, "x": [10.0, 20.0], "y": [10.0, 20.0], "label": [1, 0]})
    b = pa.table({"slide_id": ["s2"] * 2, "x": [10.0, 40.0], "y": [10.0, 40.0], "label": [0, 1]})
    pq.write_table(pa.concat_tables([a, b]), tmp_path / "t.parquet")
    gt = read_truth(tmp_path / "t.parquet")
    assert gt["slide_id"].tolist() == ["s1", "s1", "s2", "s2"]
    one, _, n1 = labels_from_truth(_scores("s1", [(10, 10), (40, 40)]), tmp_path / "t.parquet", 5)
    two, _, n2 = labels_from_truth(_scores("s2", [(10, 10), (40, 40)]), tmp_path / "t.parquet", 5)
    assert (one.tolist(), n1) == ([1, 0], 1) and (two.tolist(), n2) == ([0, 1], 1)


# --- 7: a calibration slide whose own truth marks abnormal cells -------------------------------


def _scored_table(folder: Path, planted: int | None, labels: list[int] | None = None) -> Path:
    """A slide's cyto score folder: scores.parquet (with its metadata) and summary.json."""
    from cyto.seal import seal_outputs, with_rows_seal

    folder.mkdir(parents=True)
    cols = {"slide_id": ["s"] * 4, "score": [0.1, 0.2, 0.3, 0.4]}
    if labels is not None:
        cols["label"] = labels
    meta = {"cyto.slide": "/data/s.ndpi", "cyto.method": "dsvdd", "cyto.scoring_id": "m1"}
    # as cyto score writes it: its rows sealed in its metadata (cyto.seal.with_rows_seal)
    pq.write_table(with_rows_seal(pa.table(cols), meta), folder / "scores.parquet")
    summary = {"slide": "/data/s.ndpi"}
    if planted is not None:
        summary["truth"] = {"planted_abnormal": planted}
    (folder / "summary.json").write_text(json.dumps(summary))
    seal_outputs(folder, ["scores.parquet"])  # as cyto score seals it (cyto.seal)
    return folder / "scores.parquet"


BUNDLE = SimpleNamespace(method="dsvdd", scoring_id="m1", path=Path("m.cyto"))


def test_a_calibration_table_whose_truth_marks_abnormal_cells_is_refused(tmp_path):
    from cyto.stats.calibrate import _read_table

    table = _scored_table(tmp_path / "pos", planted=7, labels=[0, 1, 0, 0])
    with pytest.raises(ConfigError) as err:
        _read_table(table, BUNDLE)
    said = str(err.value)
    assert "/data/s.ndpi" in said and "7 abnormal cell(s)" in said and "--truth" in said
    assert "\n" not in said
    # the table alone (copied without its summary): its label column says, counted as what it
    # is, detections (hostile round 6, N1: two detections of one planted cell were "14 abnormal
    # cells of --truth" where the truth held 13)
    alone = tmp_path / "alone.parquet"
    pq.write_table(pq.read_table(table), alone)
    with pytest.raises(ConfigError, match=r"marks 1 detected cell\(s\) abnormal \(its label"):
        _read_table(alone, BUNDLE)


def test_a_negative_slide_scored_with_truth_calibrates(tmp_path):
    from cyto.stats.calibrate import _read_table

    scores, _, _, _ = _read_table(_scored_table(tmp_path / "neg", 0, [0, 0, 0, 0]), BUNDLE)
    assert len(scores) == 4
    scores, _, _, _ = _read_table(_scored_table(tmp_path / "plain", None), BUNDLE)
    assert len(scores) == 4


def test_calibrate_and_data_cells_share_one_refusal():
    """One function says it for both commands (the check is not written twice)."""
    from cyto.review import cells
    from cyto.stats import calibrate

    assert cells.refuse_planted is calibrate.refuse_planted
    with pytest.raises(ConfigError, match=r"^f: .* 3 abnormal cell\(s\); harvest normal cells"):
        calibrate.refuse_planted("f", 3, "harvest normal cells")
    calibrate.refuse_planted("f", 0, "calibrate")
    calibrate.refuse_planted("f", None, "calibrate")


# --- 8: a nucleus given twice in a --nuclei file is one cell ---------------------------------


def test_repeated_nuclei_points_are_one_cell_each(tmp_path):
    f = tmp_path / "n.csv"
    f.write_text("x,y\n10,10\n10,10\n50,50\n10.4,10.3\n80,80\n50,50\n120,120\n")
    with pytest.warns(CytoWarning, match=r"--nuclei .*n\.csv: 3 of 7 point\(s\) repeat") as said:
        pts = read_nuclei_file(f, 200, 200)
    assert pts.tolist() == [[10, 10], [50, 50], [80, 80], [120, 120]]
    assert len(said) == 1 and "\n" not in str(said[0].message)


def test_repeated_geojson_nuclei_are_one_cell_each(tmp_path):
    f = tmp_path / "n.geojson"
    point = {"type": "Feature", "geometry": {"type": "Point", "coordinates": [30.0, 40.0]}}
    f.write_text(json.dumps({"type": "FeatureCollection", "features": [point] * 3}))
    with pytest.warns(CytoWarning, match="2 of 3 point"):
        assert read_nuclei_file(f, 100, 100).tolist() == [[30, 40]]


def test_nuclei_one_pixel_apart_are_two_cells(tmp_path):
    f = tmp_path / "n.csv"
    f.write_text("x,y\n10,10\n11,10\n10,11.5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_nuclei_file(f, 100, 100)) == 3


def test_a_chain_of_near_repeats_keeps_every_other_point():
    from cyto.detect.points import distinct_points

    pts = np.array([[0.0, 0.0], [0.6, 0.0], [1.2, 0.0], [1.8, 0.0], [5.0, 5.0]])
    assert distinct_points(pts).tolist() == [True, False, True, False, True]
    assert distinct_points(np.empty((0, 2))).tolist() == []


# --- 9: --planes must show the slide ----------------------------------------------------------


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    root = tmp_path_factory.mktemp("planes")
    cfg = {"width": 768, "height": 768, "n_cells": 40}
    own = write_slide(
        root / "a.tif", SlideSynthConfig(**cfg, planes=(-2.0, 0.0, 2.0), seed=1), workers=0
    )
    other = write_slide(root / "b.tif", SlideSynthConfig(**cfg, seed=2), workers=0)
    blank = write_slide(
        root / "g.tif",
        SlideSynthConfig(**cfg | {"n_cells": 0}, rbc_per_cell=0, debris_per_cell=0, seed=3),
        workers=0,
    )
    return own.paths, other.paths[0], blank.paths[0]


def test_defocused_planes_of_the_slide_are_taken(stacks):
    from cyto.slides import open_with_planes

    own, _, _ = stacks
    reader, planes = open_with_planes(own[0], "auto")
    reader.close()
    assert sorted(z for z, _ in planes) == [-2.0, 2.0]
    reader, planes = open_with_planes(own[0], ",".join(map(str, own[1:])))
    reader.close()
    assert len(planes) == 2


def test_another_slide_of_the_same_size_is_no_focal_plane(stacks):
    from cyto.slides import open_with_planes

    own, other, blank = stacks
    for stranger in (other, blank):
        with pytest.raises(ConfigError) as err:
            open_with_planes(own[0], f"{own[1]},{stranger}")
        said = str(err.value)
        assert said.startswith(f"--planes: {stranger} does not show slide {own[0]}"), said
        assert "\n" not in said


def test_plane_likeness_on_flat_overviews():
    from cyto.slides.planes import plane_likeness

    glass = np.full((20, 20), 230.0)
    assert plane_likeness(glass, glass + 2) == 1.0  # blank glass: nothing tells them apart
    assert plane_likeness(glass, glass - 40) == 0.0
    rng = np.random.default_rng(0)
    smear = glass + rng.normal(0, 20, glass.shape)
    assert plane_likeness(smear, smear) > 0.99 and plane_likeness(glass, smear) == 0.0


# --- 11: an existing result is replaced only with --overwrite ---------------------------------


def test_refuse_to_replace(tmp_path):
    from cyto.outputs_check import refuse_to_replace

    refuse_to_replace(tmp_path / "new.parquet", False)
    (tmp_path / "empty").mkdir()
    refuse_to_replace(tmp_path / "empty", False)  # nothing in it to lose
    (tmp_path / "t.parquet").write_bytes(b"x")
    with pytest.raises(InputPathError) as err:
        refuse_to_replace(tmp_path / "t.parquet", False)
    assert (
        str(err.value) == f"--out {tmp_path / 't.parquet'} exists (pass --overwrite to replace it)"
    )
    assert err.value.exit_code == 2
    refuse_to_replace(tmp_path / "t.parquet", True)
    with pytest.raises(BundleError, match=r"^m exists \(pass --overwrite"):
        refuse_to_replace(tmp_path / "t.parquet", False, name="m", error=BundleError)


def test_predict_refuses_an_existing_table_before_the_model_loads(tmp_path):
    """`cyto predict --out T.parquet` replaced T without --overwrite (train, synth and data
    cells refuse). Refused before anything is loaded (the model here does not even exist)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cyto.predict import predict

    out = tmp_path / "t.parquet"  # last run's table (predict's: its model in the metadata)
    meta = {b"cyto.model": b"m.cyto", b"cyto.method": b"dsvdd"}
    pq.write_table(pa.table({"score": [1.0]}).replace_schema_metadata(meta), out)
    before = out.read_bytes()
    with pytest.raises(InputPathError, match=r"--out .*t\.parquet exists \(pass --overwrite"):
        predict(tmp_path / "no.cyto", tmp_path, out)
    assert out.read_bytes() == before
    # with --overwrite (or resuming a stopped run of this --out) it goes on, to the model
    with pytest.raises(CytoError, match="no.cyto"):
        predict(tmp_path / "no.cyto", tmp_path, out, overwrite=True)
    (tmp_path / ".t.parquet.run").mkdir()
    with pytest.raises(CytoError, match="no.cyto"):
        predict(tmp_path / "no.cyto", tmp_path, out, resume=True)


def test_a_class_mosaic_is_not_written_over(tmp_path, synth_patches):
    from cyto.data.mosaic import class_mosaic

    out = tmp_path / "m.png"
    out.write_bytes(b"a mosaic")
    with pytest.raises(InputPathError, match=r"--out .*m\.png exists \(pass --overwrite"):
        class_mosaic(synth_patches, out, per_class=1, tile=16)
    assert out.read_bytes() == b"a mosaic"
    class_mosaic(synth_patches, out, per_class=1, tile=16, overwrite=True)
    assert out.read_bytes() != b"a mosaic"


def test_a_class_mosaic_never_replaces_one_of_its_own_images(tmp_path, synth_patches):
    """Hostile round 6 (N9): `cyto data mosaic p --out p/normal/normal_00001.jpg --overwrite`
    replaced a training image with the mosaic. An output never replaces an input."""
    import shutil

    from cyto.data.mosaic import class_mosaic

    data = tmp_path / "p"
    shutil.copytree(synth_patches, data)
    image = sorted((data / "normal").iterdir())[0]
    before = image.read_bytes()
    with pytest.raises(InputPathError, match=r"is the input PATH .*an output never replaces"):
        class_mosaic(data, image, per_class=1, tile=16, overwrite=True)
    assert image.read_bytes() == before


def test_the_demo_refuses_a_folder_that_holds_files(tmp_path):
    from cyto.demo import run_demo

    (tmp_path / "train.csv").write_text("x")  # a name the demo writes
    with pytest.raises(InputPathError, match=r"--out .* exists \(pass --overwrite"):
        run_demo(tmp_path, echo=lambda _: None)
    (tmp_path / "mine.txt").write_text("x")  # one it does not: not even --overwrite replaces it
    for overwrite in (False, True):
        with pytest.raises(InputPathError, match=r"--out .* holds mine\.txt that cyto did not"):
            run_demo(tmp_path, echo=lambda _: None, overwrite=overwrite)


# --- the file readers on any table: a result or one line of a typed error ---------------------

W, H = 300, 200
_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.floats(-50, 400),
    st.none(),
)
_cell = st.one_of(_number, st.text(max_size=5), st.booleans())


def _in_tmp(write):
    """Write one example's file in a fresh folder, read it, and give what came back."""
    with tempfile.TemporaryDirectory() as tmp:
        return write(Path(tmp))


def _one_line_or_result(read, path):
    try:
        return read(path)
    except CytoError as exc:
        assert "\n" not in str(exc), str(exc)
        assert str(path) in str(exc) or path.name in str(exc), str(exc)
        return exc


def _csv_text(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: "" if v is None else str(v)  # noqa: E731
    return ",".join(header) + "\n" + "".join(",".join(map(fmt, r)) + "\n" for r in rows)


_headers = st.lists(st.sampled_from(["x", "y", "X", "label", "slide_id", "z", ""]), max_size=4)


@given(header=_headers, rows=st.lists(st.lists(_cell, min_size=0, max_size=5), max_size=6))
def test_any_nuclei_csv_gives_points_or_one_line(header, rows):
    def write(tmp: Path):
        f = tmp / "n.csv"
        f.write_text(_csv_text(header, rows))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CytoWarning)
            got = _one_line_or_result(lambda p: read_nuclei_file(p, W, H), f)
        if isinstance(got, np.ndarray):
            assert got.ndim == 2 and got.shape[1] == 2 and np.isfinite(got).all()
            assert ((got >= 0) & (got < (W, H))).all()
            from cyto.detect.points import distinct_points

            assert distinct_points(got).all()  # each nucleus once

    _in_tmp(write)


_columns = st.dictionaries(
    st.sampled_from(["x", "y", "label", "slide_id", "cell_radius"]),
    st.one_of(
        st.lists(st.floats(allow_nan=True), min_size=3, max_size=3),
        st.lists(st.floats(-10, 400), min_size=3, max_size=3),
        st.lists(st.integers(0, 1), min_size=3, max_size=3),
        st.lists(st.one_of(st.none(), st.integers(0, 310)), min_size=3, max_size=3),
        st.lists(st.text(max_size=3), min_size=3, max_size=3),
        st.lists(st.lists(st.integers(0, 9), max_size=2), min_size=3, max_size=3),
        st.lists(st.booleans(), min_size=3, max_size=3),
    ),
)


@given(columns=_columns)
def test_any_parquet_table_as_nuclei_or_truth_gives_a_result_or_one_line(columns):
    def write(tmp: Path):
        f = tmp / "t.parquet"
        pq.write_table(pa.table(columns) if columns else pa.table({"a": [1]}), f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CytoWarning)
            _one_line_or_result(lambda p: read_nuclei_file(p, W, H), f)
            got = _one_line_or_result(read_truth, f)
            if isinstance(got, dict):
                n = len(got["x"])
                assert all(len(v) == n for v in got.values())
                assert set(np.unique(got["label"])) <= {0, 1}
                table = _scores("s", [(10, 10), (50, 50)])
                labels, _, planted = labels_from_truth(table, f, 10)
                # None: no cell of this slide (said), unknown rather than negative
                assert (labels is None and planted == 0) or len(labels) == 2
                assert 0 <= planted <= n

    _in_tmp(write)


@given(header=_headers, rows=st.lists(st.lists(_cell, min_size=0, max_size=5), max_size=6))
def test_any_truth_csv_gives_a_table_or_one_line(header, rows):
    def write(tmp: Path):
        f = tmp / "t.csv"
        f.write_text(_csv_text(header, rows))
        got = _one_line_or_result(read_truth, f)
        if isinstance(got, dict):
            assert {"x", "y", "label"} <= set(got) and got["label"].dtype == np.int64

    _in_tmp(write)


_json = st.recursive(
    st.one_of(
        st.none(), st.booleans(), _number.filter(lambda v: v is None or v == v), st.text(max_size=3)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_geometry = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Point", "MultiPoint", "Polygon", "LineString", None]),
        "coordinates": st.one_of(
            st.lists(_number, max_size=3),
            st.lists(st.lists(_number, max_size=3), max_size=3),
            st.lists(st.lists(st.lists(st.floats(0, 250), max_size=3), max_size=4), max_size=2),
            _json,
        ),
    }
)
_feature = st.one_of(
    st.fixed_dictionaries({"type": st.just("Feature"), "geometry": st.one_of(_geometry, _json)}),
    _json,
)


@given(doc=st.one_of(st.fixed_dictionaries({"features": st.lists(_feature, max_size=4)}), _feature))
def test_any_geojson_gives_points_or_one_line(doc):
    def write(tmp: Path):
        f = tmp / "n.geojson"
        f.write_text(json.dumps(doc))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CytoWarning)
            got = _one_line_or_result(lambda p: read_nuclei_file(p, W, H), f)
        if isinstance(got, np.ndarray):
            assert got.ndim == 2 and got.shape[1] == 2 and np.isfinite(got).all()

    _in_tmp(write)


def test_a_bad_truth_table_is_named_in_the_callers_words(tmp_path):
    """A hostile check (round 2): score_slide(truth="nosuch.parquet") answered "--truth ... does
    not exist", a flag in a Python call."""
    from cyto.errors import InputPathError
    from cyto.flags import python_words
    from cyto.infer.outputs import read_truth

    missing = tmp_path / "nosuch.parquet"
    with pytest.raises(InputPathError, match=r"^--truth .*nosuch.parquet does not exist"):
        read_truth(missing)
    with python_words("score_slide"), pytest.raises(InputPathError) as err:
        read_truth(missing)
    assert str(err.value).startswith("truth='") and "--" not in str(err.value)


def test_a_truth_table_given_as_a_url_is_one_line_without_secrets():
    """A hostile check (round 2): --truth http://... said "does not exist" and printed the URL
    with one slash (http:/), as a path."""
    from pathlib import Path

    from cyto.errors import InputPathError
    from cyto.infer.outputs import read_truth

    for url in ("http://ann:pw@host:8000/t.parquet?sig=X", Path("http://host/t.parquet")):
        with pytest.raises(InputPathError, match=r"read from a local file") as err:
            read_truth(url)
        said = str(err.value)
        assert "http://host" in said and "pw" not in said and "sig=X" not in said, said


def test_a_class_mosaic_is_never_written_inside_the_folder_it_shows(tmp_path, synth_patches):
    """Hostile round 43 (11): a mosaic written into a class folder was read as one more cell
    of that class by the next command (a 642x280 "cell")."""
    import shutil

    from cyto.data.mosaic import class_mosaic

    data = tmp_path / "p"
    shutil.copytree(synth_patches, data)
    for out in (data / "normal" / "mosaic.png", data / "mosaic.png"):
        with pytest.raises(InputPathError, match=r"lies inside the input PATH .*never replaces"):
            class_mosaic(data, out, per_class=1, tile=16)
        assert not out.exists()
    class_mosaic(data, tmp_path / "m.png", per_class=1, tile=16)  # beside it: written


def test_a_missing_plane_file_is_refused_by_the_name_the_caller_gave(tmp_path):
    """Hostile round 64 (8): score_slide(planes="x") was told "focal plane file x does not
    exist", the one refusal of its sweep that named neither the keyword nor the flag."""
    from cyto.errors import ConfigError
    from cyto.flags import python_words
    from cyto.slides.planes import find_planes

    slide = tmp_path / "s.tif"
    slide.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^--planes: focal plane file x does not exist$"):
        find_planes(slide, "x")
    with python_words("score_slide"), pytest.raises(ConfigError, match=r"^planes=: focal plane"):
        find_planes(slide, "x")
