"""Synthetic whole slides: bytes, ground truth, readers, focal planes and bounded memory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from cyto.data.synth.slide import SlideSynthConfig, ground_truth_path, plane_path, write_slide
from cyto.errors import ConfigError, InputPathError

SMALL = dict(width=1536, height=1024, abnormal_fraction=0.1, seed=4)


@pytest.fixture(scope="module")
def ndpi(tmp_path_factory):
    out = tmp_path_factory.mktemp("ndpi") / "s.ndpi"
    res = write_slide(out, SlideSynthConfig(**SMALL, planes=(0.0, 1.5)))
    return out, res


@pytest.fixture(scope="module")
def tiff(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiff") / "s.tif"
    res = write_slide(out, SlideSynthConfig(**SMALL, planes=(-1.5, 0.0, 1.5)))
    return out, res


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes(tmp_path, ndpi):
    out, _ = ndpi
    # into a folder not made yet, as in the first-run tutorial (cyto synth slide slides/demo.ndpi)
    again = write_slide(
        tmp_path / "slides" / "s.ndpi", SlideSynthConfig(**SMALL, planes=(0.0, 1.5))
    )
    assert sha(again.paths[0]) == sha(out)
    assert sha(again.ground_truth) == sha(ground_truth_path(out))
    other = write_slide(tmp_path / "o.ndpi", SlideSynthConfig(**{**SMALL, "seed": 5}))
    assert sha(other.paths[0]) != sha(out)


def test_bytes_do_not_depend_on_worker_processes(tmp_path):
    cfg = SlideSynthConfig(width=1024, height=2048, abnormal_fraction=0.05, seed=2)
    one = write_slide(tmp_path / "a.tif", cfg, workers=0)
    two = write_slide(tmp_path / "b.tif", cfg, workers=2)
    assert sha(one.paths[0]) == sha(two.paths[0])


def test_ground_truth_table(ndpi):
    out, res = ndpi
    gt = pq.read_table(res.ground_truth)
    cols = gt.column_names
    assert cols[:6] == ["slide_id", "cell_id", "x", "y", "label", "class"]
    labels = np.asarray(gt["label"])
    assert len(labels) == res.n_cells > 20
    assert int(labels.sum()) == res.n_abnormal == round(res.n_cells * 0.1)
    classes = np.asarray(gt["class"]).astype(str)
    assert set(classes[labels == 0]) == {"normal"}
    assert "normal" not in set(classes[labels == 1])
    meta = json.loads(gt.schema.metadata[b"cyto.synthetic"])
    assert meta["seed"] == 4


def _cells(res):
    t = pq.read_table(res.ground_truth)
    return np.asarray(t["x"]), np.asarray(t["y"]), np.asarray(t["focus_z"])


def _dark_at(region, cx, cy, r=6):
    yy, xx = np.mgrid[: region.shape[0], : region.shape[1]]
    return region[(xx - cx) ** 2 + (yy - cy) ** 2 <= r * r].mean()


@pytest.mark.openslide
def test_every_cell_has_a_dark_nucleus_at_its_position(ndpi):
    import openslide

    out, res = ndpi
    xs, ys, _ = _cells(res)
    with openslide.OpenSlide(str(out)) as slide:
        assert slide.properties["openslide.vendor"] == "hamamatsu"
        w, h = slide.dimensions
        whole = np.asarray(slide.read_region((0, 0), 0, (w, h)).convert("L"), dtype=np.float32)
    background = np.median(whole)
    for x, y in zip(xs, ys, strict=True):
        x0, y0 = int(x) - 20, int(y) - 20
        patch = whole[max(y0, 0) : y0 + 41, max(x0, 0) : x0 + 41]
        assert _dark_at(patch, x - max(x0, 0), y - max(y0, 0), r=8) < background - 40, (x, y)
    # and empty glass away from cells is bright
    assert whole[:40, :40].mean() > background - 10


@pytest.mark.openslide
def test_ndpi_opens_in_openslide_with_levels_and_mpp(ndpi):
    import openslide

    out, res = ndpi
    with openslide.OpenSlide(str(out)) as slide:
        assert slide.dimensions == res.size == (1536, 1024)
        assert slide.level_dimensions[1] == (768, 512)
        assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(0.12, rel=1e-6)
        assert float(slide.properties["openslide.objective-power"]) == 60
        # a region read at level 1 is the downsampled level 0
        lo = np.asarray(slide.read_region((512, 256), 1, (64, 64)).convert("RGB"), np.float32)
        hi = np.asarray(slide.read_region((512, 256), 0, (128, 128)).convert("RGB"), np.float32)
        small = hi.reshape(64, 2, 64, 2, 3).mean(axis=(1, 3))
        assert np.abs(lo - small).mean() < 6


@pytest.mark.pyvips
def test_ndpi_and_tiff_open_in_pyvips(ndpi, tiff):
    import pyvips

    t = pyvips.Image.new_from_file(str(tiff[0]))
    assert (t.width, t.height) == (1536, 1024)
    assert t.get("vips-loader") == "tiffload"
    assert t.get_n_pages() == len(tiff[1].levels)
    assert t.xres == pytest.approx(1000 / 0.12, rel=1e-4)  # pixels per mm
    if pyvips.type_find("VipsForeign", "openslideload"):
        n = pyvips.Image.new_from_file(str(ndpi[0]))
        assert n.get("openslide.vendor") == "hamamatsu"
        a = n.crop(0, 0, 1536, 1024).numpy()[..., :3]
        b = t.crop(0, 0, 1536, 1024).numpy()
        # same scene, two JPEG containers: nearly the same pixels
        assert np.abs(a.astype(int) - b).mean() < 2


@pytest.mark.openslide
def test_tiff_opens_in_openslide(tiff):
    import openslide

    out, res = tiff
    with openslide.OpenSlide(str(out)) as slide:
        assert slide.properties["openslide.vendor"] == "generic-tiff"
        assert slide.level_dimensions == tuple(res.levels)


def _ndpi_z_offsets(path):
    """Z offset (nm) of every directory, read with a tiny independent TIFF walker."""
    data = path.read_bytes()
    off = struct.unpack("<I", data[4:8])[0]
    zs = []
    while off:
        n = struct.unpack("<H", data[off : off + 2])[0]
        tags = {}
        for i in range(n):
            code, typ, count, val = struct.unpack(
                "<HHII", data[off + 2 + 12 * i : off + 14 + 12 * i]
            )
            tags[code] = val
        zs.append(struct.unpack("<i", struct.pack("<I", tags[65424]))[0])
        off = struct.unpack("<Q", data[off + 2 + 12 * n : off + 10 + 12 * n])[0]
    return zs


def test_ndpi_holds_every_focal_plane(ndpi):
    out, res = ndpi
    zs = _ndpi_z_offsets(out)
    assert zs == [0] * len(res.levels) + [1500] * len(res.levels)


@pytest.mark.pyvips
def test_cells_are_sharpest_near_their_focal_plane(tiff):
    import pyvips
    from scipy import ndimage

    out, res = tiff
    xs, ys, fz = _cells(res)
    planes = {}
    for z in (-1.5, 1.5):
        im = pyvips.Image.new_from_file(str(plane_path(out, z)))
        planes[z] = im.numpy().mean(axis=2)
    assert plane_path(out, 1.5).name == "s_z+1.50um.tif"
    wins = total = 0
    for x, y, f in zip(xs, ys, fz, strict=True):
        if abs(f) < 0.4:
            continue
        sharp = {}
        for z, img in planes.items():
            crop = img[max(int(y) - 24, 0) : int(y) + 24, max(int(x) - 24, 0) : int(x) + 24]
            sharp[z] = ndimage.laplace(crop).var()
        wins += (sharp[1.5] > sharp[-1.5]) == (f > 0)
        total += 1
    assert total >= 10
    assert wins / total > 0.85


def test_errors(tmp_path, ndpi):
    with pytest.raises(InputPathError, match="exists"):
        write_slide(ndpi[0], SlideSynthConfig(**SMALL))
    with pytest.raises(InputPathError, match="cannot tell the slide format"):
        write_slide(tmp_path / "x.svs", SlideSynthConfig(**SMALL))
    with pytest.raises(ConfigError, match="do not fit"):
        write_slide(tmp_path / "x.tif", SlideSynthConfig(width=512, height=512, n_cells=5000))
    with pytest.raises(ConfigError, match="at least"):
        SlideSynthConfig(width=100, height=100)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_zero_abnormal_fraction(tmp_path):
    res = write_slide(
        tmp_path / "n.tif", SlideSynthConfig(width=1024, height=1024, abnormal_fraction=0.0)
    )
    assert res.n_abnormal == 0 and res.n_cells > 0


PEAK = """
import resource, sys
from pathlib import Path
from cyto.data.synth.slide import SlideSynthConfig, write_slide
folder, w = Path(sys.argv[1]), int(sys.argv[2])
for h in map(int, sys.argv[3:]):  # the high-water mark after each slide
    write_slide(folder / f"m{h}.ndpi", SlideSynthConfig(width=w, height=h, seed=1))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


@pytest.mark.slow
def test_memory_does_not_grow_with_slide_height(tmp_path):
    """Peak RSS for a 4x taller slide stays within a few MB of the short one: one process
    writes the short slide, then the tall one, and reports its high-water mark after each."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path), "1024", "1024", "4096"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"CYTO_PROGRESS": "0", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    short, tall = map(int, proc.stdout.strip().splitlines()[-2:])
    assert tall - short < 40, (short, tall)
    assert (tmp_path / "m4096.ndpi").stat().st_size > (tmp_path / "m1024.ndpi").stat().st_size


def test_a_staining_batch_shares_one_style_and_keeps_each_layout():
    from cyto.data.synth.slide import layout

    a, b = (layout(SlideSynthConfig(width=1024, height=1024, seed=s)) for s in (1, 2))
    assert a.style != b.style  # by default every slide has its own stain
    a2, b2 = (
        layout(SlideSynthConfig(width=1024, height=1024, seed=s, stain_seed=7)) for s in (1, 2)
    )
    assert a2.style == b2.style != a.style
    np.testing.assert_array_equal(a2.cell_x, a.cell_x)  # the cells stay where they were
    np.testing.assert_array_equal(a2.cell_class, a.cell_class)


def test_one_seed_is_one_slide_with_or_without_its_lesions(tmp_path):
    """A negative and a case of one seed (``--abnormal-fraction 0`` and the default) are the
    same slide but for the cells planted: the same places, cell looks, clutter and stain, and
    the same pixels away from the planted cells. Planting drew from the layout's generator, so
    every normal cell and the stain of the case were drawn otherwise, and the case of seed 9 was
    refused against a calibration as "another stain" while its negative passed (round 67, 4)."""
    import pyvips

    from cyto.data.synth.cells import CELL_CLASSES, NORMAL_CLASS
    from cyto.data.synth.slide import layout

    cfg = SlideSynthConfig(width=1024, height=1024, seed=9, abnormal_fraction=0.0)
    neg, case = layout(cfg), layout(dataclasses.replace(cfg, abnormal_fraction=0.05))
    assert neg.style == case.style
    for name in ("cell_x", "cell_y"):
        np.testing.assert_array_equal(getattr(neg, name), getattr(case, name))
    for name in ("x", "y", "kind", "seed", "size", "focus_z"):
        np.testing.assert_array_equal(getattr(neg.scene, name), getattr(case.scene, name))
    planted = case.cell_class != CELL_CLASSES.index(NORMAL_CLASS)
    assert planted.sum() == round(0.05 * len(planted)) > 0
    assert (neg.cell_class == CELL_CLASSES.index(NORMAL_CLASS)).all()

    def pixels(name, fraction):
        out = write_slide(tmp_path / name, dataclasses.replace(cfg, abnormal_fraction=fraction))
        img = pyvips.Image.new_from_file(str(out.paths[0]))
        return np.ndarray(
            buffer=img.write_to_memory(), dtype=np.uint8, shape=(img.height, img.width, img.bands)
        )

    a, b = pixels("neg.tif", 0.0), pixels("case.tif", 0.05)
    yy, xx = np.mgrid[: a.shape[0], : a.shape[1]]
    away = np.ones(a.shape[:2], bool)
    for x, y in zip(case.cell_x[planted], case.cell_y[planted], strict=True):
        away &= np.hypot(xx - x, yy - y) > 80  # a cell's reach, JPEG blocks beside it included
    assert away.mean() > 0.5
    np.testing.assert_array_equal(a[away], b[away])
    assert not np.array_equal(a[~away], b[~away])


def test_a_drawn_slide_says_a_witness_rate_its_count_rounds_far_off(tmp_path):
    """A drawn slide's planted count rounded to none, or a quarter or more off the rate asked,
    is said as the composed slide's is (hostile round 68, 9); a near rate says nothing."""
    from cyto.data.synth.make import make_slide

    said: list[str] = []
    res = make_slide(tmp_path / "a.tif", width=512, height=512, n_cells=30,
                     abnormal_fraction=0.05, workers=0, echo=said.append)  # fmt: skip
    assert res.n_abnormal == 2 and said == [
        "note: --abnormal-fraction 0.05 of 30 cells plants 2 (1.5 rounded): the slide's "
        "witness rate is 6.67%, not 5.00%"
    ], said
    said.clear()
    make_slide(tmp_path / "b.tif", width=512, height=512, n_cells=30, abnormal_fraction=0.01,
               workers=0, echo=said.append)  # fmt: skip
    assert said and said[0].startswith("warning: --abnormal-fraction 0.01 of 30 cells plants none")
    said.clear()
    make_slide(tmp_path / "c.tif", width=512, height=512, n_cells=40, abnormal_fraction=0.05,
               workers=0, echo=said.append)  # fmt: skip
    assert said == []


def test_each_object_is_drawn_only_for_the_rows_of_blocks_it_reaches(monkeypatch):
    """Every window fits the scene's reach (in and out of focus), and an object is drawn once
    per row of blocks within that reach, not for every region of the coarser index."""
    import collections

    from cyto.data.synth import scene as scene_mod
    from cyto.data.synth.slide import BLOCK, RowRenderer, layout

    cfg = SlideSynthConfig(width=1024, height=1536, seed=3, planes=(0.0, -3.0))
    lay = layout(cfg)
    drawn: collections.Counter = collections.Counter()
    real = scene_mod._render_object

    def counting(scene, i, style, z):
        window, half = real(scene, i, style, z)
        assert half <= scene.reach(z), (i, z, half)  # the reach bounds every window
        drawn[(i, z)] += 1
        return window, half

    monkeypatch.setattr(scene_mod, "_render_object", counting)
    render = RowRenderer(lay, cfg.seed, cfg.planes, cfg.size[0])
    rows = [render(by) for by in range(cfg.size[1] // BLOCK)]
    assert rows[1][0].shape == (BLOCK, cfg.size[0], 3)
    y = lay.scene.y
    for (i, z), n in drawn.items():
        r = lay.scene.reach(z)
        reached = sum(by * BLOCK - r < y[i] < (by + 1) * BLOCK + r for by in range(len(rows)))
        assert n <= reached, (i, z, n, reached)
    assert len({i for i, _ in drawn}) == len(y)  # every object was drawn
