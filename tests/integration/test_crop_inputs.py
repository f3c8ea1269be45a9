"""Crop folders as labs have them: crops cut at an image's edge (not square), grayscale and
16-bit crops, a class name that is not there: each is said in one line, and a crop is padded,
never stretched."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from cyto.data.images import resize_rgb
from cyto.data.scale import zoom_patch
from tests.cli_runner import run_cyto


def _cell(h: int, w: int, r: float = 8.0) -> np.ndarray:
    yy, xx = np.mgrid[:h, :w]
    img = np.full((h, w, 3), 230, np.uint8)
    img[np.hypot(yy - (h - 1) / 2, xx - (w - 1) / 2) <= 20] = (160, 170, 220)
    img[np.hypot(yy - (h - 1) / 2, xx - (w - 1) / 2) <= r] = (70, 30, 110)
    return img


@pytest.mark.parametrize("shape", [(100, 46), (46, 100), (100, 73)])
def test_a_crop_cut_at_its_images_edge_is_padded_not_stretched(shape):
    img = _cell(*shape, r=10)
    for out in (resize_rgb(img, 100), zoom_patch(img, 1.0, 100), zoom_patch(img, 1.3, 100)):
        dark = np.argwhere(out.sum(axis=2) < 300)
        extent = dark.max(axis=0) - dark.min(axis=0)
        assert abs(int(extent[0]) - int(extent[1])) <= 2, extent  # still round


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd") / "cells"
    rng = np.random.default_rng(0)
    for cls, n, r in (("NILM", 40, 7), ("LSIL", 12, 12)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(_cell(64, 64, r + rng.uniform(-1, 1))).save(root / cls / f"{i}.png")
    Image.fromarray(_cell(64, 64, 7)[..., 0]).save(root / "NILM" / "gray.png")  # mode L
    deep = (_cell(64, 64, 7)[..., 1].astype(np.uint16) * 257).astype(np.uint16)
    Image.fromarray(deep).save(root / "NILM" / "deep.png")  # 16-bit grayscale
    camera = _cell(64, 64, 7).astype(np.uint16) * 16  # a 12-bit camera's, in 16-bit colour
    cv2.imwrite(str(root / "NILM" / "camera.png"), camera[..., ::-1])
    Image.fromarray(_cell(64, 40, 7)).save(root / "NILM" / "edge.png")
    return root


def test_grayscale_16_bit_and_oblong_crops_are_said_in_one_line_each(tmp_path, odd_folder):
    model = tmp_path / "m.cyto"
    proc = run_cyto(
        "train", "dsvdd", "--data", str(odd_folder), "--normal", "NILM", "--out", str(model),
        "--preset", "fast", "--set", "load_size=64", "--set", "input_size=32", "--set",
        "epochs=1", "--set", "ae_epochs=0", "--set", "n_seeds=1", "--set", "stain=pap",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "2 of 56 images are grayscale (1 of them 16-bit)" in said
    assert "scaled to 8 bits" in said and "leave them out" in said
    assert "1 of 56 images are not square (edge.png: 40x64 px" in said and "padded" in said
    # read by its 12 bits, not nearly black (hostile round 50, 1); said in the same line
    assert "1 of 56 images are colour of 16 bits a channel (camera.png: RGB;16, 12-bit" in said
    proc = run_cyto("predict", str(model), "--data", str(odd_folder), "--normal", "NILM",
                    "--out", str(tmp_path / "p.parquet"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("warning:")]
    assert any("2 of 56 images are grayscale" in x for x in lines), proc.stderr
    assert any("1 of 56 images are not square" in x for x in lines), proc.stderr


def test_data_info_says_16_bit_colour_as_such(odd_folder):
    from cyto.data.dataset import data_info

    assert data_info(odd_folder).modes == {"RGB": 53, "L": 1, "I;16": 1, "RGB;16": 1}


def test_a_class_that_is_not_there_is_one_line(odd_folder, tmp_path):
    for args in (["--normal", "Normal"], ["--normal", "NILM", "--abnormal", "HSIL"]):
        proc = run_cyto("train", "dsvdd", "--data", str(odd_folder), "--out",
                        str(tmp_path / "m.cyto"), "--preset", "fast", *args)  # fmt: skip
        assert proc.returncode == 2 and "unknown class name" in proc.stderr
        assert "classes there: LSIL, NILM" in proc.stderr and "Traceback" not in proc.stderr
