"""Nucleus detection against the synthetic ground truth, seams, blank glass, nuclei files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.detect import detect_in_region, detect_nuclei, match, read_nuclei_file
from cyto.errors import InputPathError
from cyto.slides import open_slide


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    out = tmp_path_factory.mktemp("nuc") / "s.ndpi"
    res = write_slide(
        # a slide of the usual stain (its threshold at the smear preset's floor: seed 8, paler
        # since planting drew from its own generator, is test_a_pale_smear_s_nuclei_...'s kind)
        out,
        SlideSynthConfig(width=2048, height=2048, seed=9, abnormal_fraction=0.05),
    )
    gt = pq.read_table(res.ground_truth)
    truth = np.stack([np.asarray(gt["x"]), np.asarray(gt["y"])], axis=1)
    return open_slide(out), truth


def _tiles(reader, tile=512, margin=64, ox=0, oy=0):
    parts = [
        detect_in_region(reader, x, y, tile, tile, margin)
        for y in range(oy, reader.info.height, tile)
        for x in range(ox, reader.info.width, tile)
    ]
    return np.concatenate(parts)


def test_detection_recall_and_precision(slide):
    reader, truth = slide
    found = _tiles(reader)
    recall, precision = match(found, truth, radius=20)
    assert recall >= 0.9, recall
    assert precision >= 0.85, precision


def test_a_nucleus_on_a_tile_seam_is_found_once(slide):
    """Read as cyto score reads a slide (one threshold for all its tiles), a nucleus that tile
    edges run through is found once, by the tile that holds its centre. Each tile's own Otsu
    threshold found such nuclei twice or never on other slides (seeds 2, 6, 8, 9): its two
    tiles saw them at two thresholds."""
    import dataclasses

    from cyto.detect import NucleusParams
    from cyto.infer.tiling import slide_threshold_of

    reader, truth = slide
    params = NucleusParams()
    params = dataclasses.replace(params, threshold=slide_threshold_of(reader, params))
    for k in (len(truth) // 2, len(truth) // 3, len(truth) // 4):
        cx, cy = truth[k]
        ox, oy = int(round(cx)) % 512, int(round(cy)) % 512  # tile edges run through the centre
        found = np.concatenate(
            [
                detect_in_region(reader, x, y, 512, 512, 64, params)
                for y in range(oy - 512 if oy else 0, reader.info.height, 512)
                for x in range(ox - 512 if ox else 0, reader.info.width, 512)
            ]
        )
        near = np.hypot(found[:, 0] - cx, found[:, 1] - cy) < 15
        assert near.sum() == 1, (k, near.sum())


def _disc_image(centres, radii, shape=(300, 400)):
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    img = np.full((*shape, 3), 235, dtype=np.uint8)
    for (cx, cy), (rx, ry) in zip(centres, radii, strict=True):
        inside = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1
        img[inside] = (95, 40, 130)  # MGG-violet nucleus
    return img


def test_a_large_irregular_nucleus_is_found_once_touching_nuclei_twice():
    # one big elongated (blast-like) nucleus: a ridge in the distance transform
    big = detect_nuclei(_disc_image([(200, 150)], [(110, 40)]))
    assert len(big) == 1, big
    # two touching round nuclei of the same size stay two cells
    pair = detect_nuclei(_disc_image([(150, 150), (226, 150)], [(40, 40), (40, 40)]))
    assert len(pair) == 2, pair


def test_blank_glass_has_no_nuclei():
    glass = np.full((256, 256, 3), 236, dtype=np.uint8)
    glass += np.random.default_rng(0).integers(0, 4, glass.shape, dtype=np.uint8)
    assert len(detect_nuclei(glass)) == 0
    # tinted glass, as the synthetic and real smears' backgrounds are, with more noise, and
    # red cells alone on it: nothing under the floor of the smear preset
    rng = np.random.default_rng(1)
    for tint in ((226, 230, 215), (225, 220, 232), (215, 215, 225)):
        tinted = np.clip(np.array(tint) + rng.normal(0, 3, (256, 256, 3)), 0, 255).astype(np.uint8)
        assert len(detect_nuclei(tinted)) == 0, tint
        yy, xx = np.mgrid[:256, :256]
        red = tinted.copy()
        for cx, cy in ((60, 60), (180, 90), (110, 190)):
            red[(xx - cx) ** 2 + (yy - cy) ** 2 <= 30**2] = (205, 120, 140)  # an erythrocyte
        assert len(detect_nuclei(red)) == 0, tint


def test_a_pale_smear_s_nuclei_are_found_whole(tmp_path):
    """The smear preset's fixed threshold floor (0.08) lay above a pale slide's own Otsu cut:
    its nuclei were split in two or lost (a tutorial's negative slide: 4,573 cells found of
    4,164 drawn, 1,927 of them missed; hostile round 66, 8). The floor follows the stain
    (``floor_share``). The palest development seed of benchmarks/science/detection (seed 4
    since planting drew from its own generator; seed 10 before), read as cyto score reads it."""
    import dataclasses

    from cyto.detect import NucleusParams
    from cyto.infer.tiling import slide_threshold_of

    made = write_slide(tmp_path / "pale.tif", SlideSynthConfig(width=2048, height=2048, seed=4))
    gt = pq.read_table(made.ground_truth)
    truth = np.stack([np.asarray(gt["x"]), np.asarray(gt["y"])], axis=1)
    reader = open_slide(made.paths[0])
    params = NucleusParams()
    threshold = slide_threshold_of(reader, params)
    assert threshold < params.min_threshold, threshold  # lowered with the stain
    at = dataclasses.replace(params, threshold=threshold)
    found = np.concatenate(
        [
            detect_in_region(reader, x, y, 512, 512, 64, at)
            for y in range(0, 2048, 512)
            for x in range(0, 2048, 512)
        ]
    )
    recall, precision = match(found, truth, radius=15)
    # 0.954 and 0.943 (0.635 and 0.552 under the fixed floor; a well-stained seed: about 0.98)
    assert recall >= 0.93 and precision >= 0.93, (recall, precision)
    assert len(found) <= 1.05 * len(truth), (len(found), len(truth))


def test_nuclei_files(tmp_path):
    pts = [(10.5, 20.0), (100.0, 40.0)]
    (tmp_path / "n.csv").write_text("x,y\n" + "".join(f"{x},{y}\n" for x, y in pts))
    pq.write_table(
        pa.table({"X": [p[0] for p in pts], "Y": [p[1] for p in pts]}), tmp_path / "n.parquet"
    )
    qupath = {
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "geometry": {"type": "Point", "coordinates": [10.5, 20.0]}},
            {
                "type": "Feature",
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [[[90, 30], [110, 30], [110, 50], [90, 50], [90, 30]]],
                },
            },
        ],
    }
    (tmp_path / "n.geojson").write_text(json.dumps(qupath))
    for name in ("n.csv", "n.parquet", "n.geojson"):
        np.testing.assert_allclose(read_nuclei_file(tmp_path / name, 200, 200), pts)
    with pytest.raises(InputPathError, match="1 point\\(s\\) outside the 50x200 slide"):
        read_nuclei_file(tmp_path / "n.csv", 50, 200)
    (tmp_path / "bad.csv").write_text("col,row\n1,2\n")
    with pytest.raises(InputPathError, match="needs x and y"):
        read_nuclei_file(tmp_path / "bad.csv", 10, 10)
    with pytest.raises(InputPathError, match="does not exist"):
        read_nuclei_file(tmp_path / "none.csv", 10, 10)


def test_detection_presets_keep_their_kind_and_physical_sizes():
    from cyto.detect import NucleusParams, detection_preset
    from cyto.errors import ConfigError

    assert detection_preset("smear") == NucleusParams()
    tissue = detection_preset("tissue")
    at_half = tissue.at(0.5)  # a 20x scan: the same microns in fewer pixels
    assert at_half.kind == "tissue" and at_half.mpp == 0.5
    assert at_half.min_distance == round(42 * 0.12 / 0.5)  # 5 um
    assert at_half.min_area == round(833 * (0.12 / 0.5) ** 2)  # 12 um^2
    with pytest.raises(ConfigError, match="one of smear, tissue, pap"):
        detection_preset("blob")
    with pytest.raises(ConfigError, match="one of smear, tissue, pap"):
        NucleusParams(kind="blob")


def test_min_radius_drops_thin_strands_and_keeps_round_nuclei():
    from dataclasses import replace

    from cyto.detect import NucleusParams

    rgb = np.full((400, 400, 3), 235, dtype=np.uint8)
    yy, xx = np.mgrid[:400, :400]
    rgb[(yy - 100) ** 2 + (xx - 100) ** 2 <= 30**2] = (70, 40, 130)  # a nucleus, radius 30 px
    rgb[298:302, 100:300] = (70, 40, 130)  # a strand 4 px wide (keratin, a fibre)
    # each mark on the strand holds its share of the strand's area (4 x 10 px): min_area below it
    base = NucleusParams(sigma=1.0, min_distance=10, min_area=20, max_area=20_000, downsample=1)
    both = detect_nuclei(rgb, base)
    on_strand = np.abs(both[:, 1] - 299.5) < 3
    assert on_strand.sum() >= 10 and (~on_strand).sum() == 1  # a mark every 10 px along it
    kept = detect_nuclei(rgb, replace(base, min_radius=6.0))
    assert len(kept) == 1 and abs(kept[0, 0] - 100) < 3 and abs(kept[0, 1] - 100) < 3


@pytest.mark.parametrize("kind", ["smear", "tissue"])
def test_the_torch_detector_finds_what_the_scipy_detector_finds(slide, kind):
    """The same steps in torch (issue 15): the same nuclei on the synthetic slide, so the same
    recall and precision against its ground truth."""
    from dataclasses import replace

    from cyto.detect import detection_preset

    reader, truth = slide
    params = detection_preset(kind)
    got = {}
    for detector in ("scipy", "torch"):
        p = replace(params, detector=detector)
        got[detector] = np.concatenate(
            [
                detect_in_region(reader, x, y, 512, 512, 64, p)
                for y in range(0, reader.info.height, 512)
                for x in range(0, reader.info.width, 512)
            ]
        )
    a, b = got["scipy"], got["torch"]
    assert abs(len(a) - len(b)) <= 0.01 * len(a)
    ra, pa = match(a, truth, radius=20)
    rb, pb = match(b, truth, radius=20)
    assert abs(ra - rb) <= 0.01 and abs(pa - pb) <= 0.01, (ra, pa, rb, pb)
    assert np.array_equal(a, b)  # in fact the same detections, in the same order


def test_a_dense_band_of_touching_nuclei_is_found():
    """A band of packed nuclei is one component far above max_area: every nucleus in it was
    dropped, and a tile of the band gave 0 cells (QA). Each touching nucleus now holds its share
    of the component's area; a dark blob the size of the band (one deep peak) is still dropped."""
    from cyto.detect import NucleusParams

    rng = np.random.default_rng(0)
    rgb = np.full((512, 512, 3), (235, 225, 230), dtype=np.uint8)
    yy, xx = np.mgrid[:512, :512]
    truth = []
    for row, cy in enumerate(range(25, 300, 38)):  # radius 22, 38-40 px apart: pressed together
        for cx in range(25 + (row % 2) * 19, 490, 40):
            cy_j, cx_j = cy + rng.integers(-2, 3), cx + rng.integers(-2, 3)
            rgb[(yy - cy_j) ** 2 + (xx - cx_j) ** 2 <= 22**2] = (70, 30, 110)
            truth.append((cx_j, cy_j))
    truth = np.array(truth, dtype=np.float64)
    found = detect_nuclei(rgb, NucleusParams())
    recall, precision = match(found, truth, radius=19)  # under half the spacing
    assert recall >= 0.5 and precision >= 0.9, (recall, precision, len(found), len(truth))
    blob = np.full((512, 512, 3), (235, 225, 230), dtype=np.uint8)
    blob[(yy - 256) ** 2 + (xx - 256) ** 2 <= 150**2] = (70, 30, 110)  # 70,000 px: ink, a fold
    assert len(detect_nuclei(blob, NucleusParams())) == 0


def test_the_cells_found_do_not_depend_on_the_tile_size(wsi_dir, exported_dsvdd):
    """Each tile's own Otsu threshold made detection depend on --tile, a knob of speed: on the
    CMU-1 H&E region the smear settings found 1,714 cells with 512 px tiles and 4,061 with
    2,048 (QA). A slide is now detected at one threshold, measured on windows of a fixed grid,
    whatever its tiles."""
    from cyto.infer import ScoreOptions
    from cyto.infer.plan import SlidePlan
    from cyto.runtime import load_scorer

    path = wsi_dir / "cmu1_small_region.svs"
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    reader = open_slide(path)

    def cells(plan, params, tile):  # the slide's top-left 2,048 px square: one tile or 16
        return sum(
            len(detect_in_region(reader, x0, y0, tile, tile, plan.ctx.margin, params))
            for _, x0, y0, _, _ in plan.jobs
            if x0 < 2048 and y0 < 2048
        )

    counts = {}
    for tile in (512, 2048):
        opts = ScoreOptions(tile=tile, workers=0, mosaic=0)
        plan = SlidePlan(path, reader, [], scorer, opts, lambda m: None)
        assert plan.threshold is not None and plan.ctx.detection.threshold == pytest.approx(
            plan.threshold, abs=1e-6
        )
        counts[tile] = cells(plan, plan.ctx.detection, tile)
    reader.close()
    assert abs(counts[512] - counts[2048]) <= 0.01 * counts[512], counts
