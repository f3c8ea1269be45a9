"""``cyto data field``: crops cut to each cell's box (SIPaKMeD, Herlev) brought to one field of
view at their own scale, which cyto train and cyto predict take where the crops were refused."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from cyto.data.dataset import PatchDataset
from cyto.data.field import FIELD_TABLE, fit_field
from cyto.data.images import field_rgb
from cyto.errors import ConfigError, DatasetError, InputPathError

NUCLEUS = 6  # px radius of every crop's dark disc: one pixel size, one nucleus size


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 40), w=st.integers(1, 40), side=st.integers(1, 40), seed=st.integers(0, 9))
def test_a_field_keeps_every_pixel_it_shows_and_pads_with_the_edge_colour(h, w, side, seed):
    """Never resampled: the field's window onto the crop is the crop's own centre, pixel for
    pixel; the rest is the median colour of the crop's edge."""
    img = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = field_rgb(img, side)
    assert out.shape == (side, side, 3) and out.dtype == np.uint8
    ch, cw = min(h, side), min(w, side)
    sy, sx = (h - ch) // 2, (w - cw) // 2
    dy, dx = (side - ch) // 2, (side - cw) // 2
    assert np.array_equal(out[dy : dy + ch, dx : dx + cw], img[sy : sy + ch, sx : sx + cw])
    edge = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    fill = np.median(edge, axis=0).astype(np.uint8)
    pad = np.ones((side, side), bool)
    pad[dy : dy + ch, dx : dx + cw] = False
    assert (out[pad] == fill).all()


def _boxed(root, sides: dict[str, list[int]]) -> None:
    """Crops cut to their cell's box: sides differ, the nucleus (a dark disc) is one size."""
    for cls, list_ in sides.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i, side in enumerate(list_):
            yy, xx = np.mgrid[:side, :side] - (side - 1) / 2
            img = np.full((side, side, 3), 215, np.uint8)
            img[yy**2 + xx**2 <= NUCLEUS**2] = (60, 30, 90)
            Image.fromarray(img).save(root / cls / f"c{i:02d}_{side}.png")


def _nucleus_px(img: np.ndarray) -> int:
    return int((img.mean(axis=2) < 128).sum())


def test_boxed_crops_refused_as_they_are_load_at_one_scale_once_fielded(tmp_path):
    """The refusal's advice, followed: every crop comes to one side, and its nucleus keeps the
    pixels it had (brought to one size unfielded, the 24 px crop's nucleus grew 2.5x)."""
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40, 60], "HSIL": [30, 60]})
    with pytest.raises(DatasetError, match=r"cyto data field .* --out NEW"):
        PatchDataset.from_path(src, normal="NILM")
    res = fit_field(src, tmp_path / "field", echo=lambda s: None)
    assert (res["crops"], res["px"], res["cut"], res["sizes"]) == (5, 60, 0, 4)
    ds = PatchDataset.from_path(tmp_path / "field", normal="NILM")
    assert ds.images.shape == (5, 60, 60, 3)
    want = _nucleus_px(np.asarray(Image.open(src / "NILM" / "c00_24.png")))
    assert [_nucleus_px(im) for im in ds.images] == [want] * 5
    with open(tmp_path / "field" / FIELD_TABLE, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["path"], r["label"]) for r in rows} == {
        ("NILM/c00_24.png", "NILM"), ("NILM/c01_40.png", "NILM"), ("NILM/c02_60.png", "NILM"),
        ("HSIL/c00_30.png", "HSIL"), ("HSIL/c01_60.png", "HSIL"),
    }  # fmt: skip
    assert {r["source"] for r in rows} == {str(p.resolve()) for p in src.glob("*/*.png")}


def test_a_smaller_field_cuts_crops_to_their_centre_and_says_how_many(tmp_path):
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40, 60]})
    said = []
    res = fit_field(src, tmp_path / "field", px=32, echo=said.append)
    assert (res["px"], res["cut"]) == (32, 2)
    assert any(s.startswith("2 crop(s) larger than 32 px were cut to their centre") for s in said)
    for p in (tmp_path / "field" / "NILM").glob("*.png"):
        im = np.asarray(Image.open(p))
        assert im.shape == (32, 32, 3) and _nucleus_px(im) == _nucleus_px(field_rgb(im, 60))


def test_field_from_the_command_line_then_train_takes_it(tmp_path):
    from tests.cli_runner import run_cyto

    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40, 60, 50], "HSIL": [30]})
    out = tmp_path / "field"
    r = run_cyto("data", "field", str(src), "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote 5 crops of 5 size(s) in one 60 px field to {out} and {out / FIELD_TABLE}" in (
        r.stdout + r.stderr
    )
    info = run_cyto("data", "info", str(out))
    assert info.returncode == 0 and "sizes: 60x60 (5)" in info.stdout, info.stdout
    again = run_cyto("data", "field", str(src), "--out", str(out))
    assert again.returncode == 2 and "exists (pass --overwrite to replace it)" in again.stderr
    assert run_cyto("data", "field", str(src), "--out", str(out), "--overwrite").returncode == 0


def test_field_refuses_bad_places_names_and_sizes_in_one_line(tmp_path):
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40]})
    with pytest.raises(InputPathError, match="lies inside the input PATH"):
        fit_field(src, src / "NILM" / "field")
    with pytest.raises(InputPathError, match="holds the input"):
        fit_field(src, tmp_path)
    with pytest.raises(ConfigError, match="px must be 16-4096 px, got 8"):
        fit_field(src, tmp_path / "f", px=8)
    Image.new("RGB", (30, 30), (200, 200, 200)).save(src / "NILM" / "c00_24.jpg")
    Image.new("RGB", (30, 30), (200, 200, 200)).save(src / "NILM" / "c00_24.tif")
    Image.new("RGB", (30, 30), (200, 200, 200)).save(src / "NILM" / "c01_40.jpg")
    with pytest.raises(DatasetError) as err:  # every clash counted: one rerun, not three
        fit_field(src, tmp_path / "f")
    assert str(err.value).endswith(
        f"{src / 'NILM' / 'c00_24.png'} would both be written as NILM/c00_24.png (3 crops share "
        "a name so in all): rename them"
    ), err.value
    (src / "NILM" / "c00_24.tif").unlink()
    (src / "NILM" / "c01_40.jpg").unlink()
    (src / "NILM" / "c00_24.jpg").unlink()
    out = tmp_path / "f"
    fit_field(src, out)
    (out / "NILM" / "mine.png").write_bytes(b"a user's own file")
    with pytest.raises(InputPathError, match="mine.png that cyto did not write"):
        fit_field(src, out, overwrite=True)


def test_unreadable_crops_stop_the_run_leaving_nothing_or_are_skipped_and_counted(tmp_path):
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40, 60]})
    (src / "NILM" / "c01_40.png").write_bytes(b"not a png")
    out = tmp_path / "field"
    with pytest.raises(DatasetError, match=r"cannot read image .*c01_40.png"):
        fit_field(src, out)
    assert not out.exists() and not list(tmp_path.glob(".field.partial-*"))
    said = []
    res = fit_field(src, out, skip_unreadable=True, echo=said.append)
    assert (res["crops"], res["skipped"]) == (2, 1)
    assert any(s.startswith("skipped 1 unreadable file(s), e.g. ") for s in said)
    assert sorted(p.name for p in (out / "NILM").iterdir()) == ["c00_24.png", "c02_60.png"]


def test_a_field_set_by_one_outsized_crop_is_said_with_the_px_that_cuts_only_it(tmp_path):
    """One 200 px crop among 30-50 px ones made every cell a speck in a 200 px field; the px
    advised was the median, which cut half the crops (hostile round 19)."""
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [30, 30, 32, 50, 200]})
    said = []
    assert fit_field(src, tmp_path / "f", echo=said.append)["px"] == 200
    (line,) = [s for s in said if s.startswith("the field (200 px) is set by the largest crop")]
    assert str(src / "NILM" / "c04_200.png") in line, line
    assert line.endswith("--px 50 cuts only the 1 crop(s) larger than 50 px to their centre"), line
    said.clear()
    fit_field(src, tmp_path / "g", px=30, echo=said.append)  # asked for: the cut is said
    assert not any("largest crop" in s for s in said)
    assert any(s.startswith("3 crop(s) larger than 30 px were cut") for s in said)


def test_a_killed_runs_lock_and_half_built_folder_never_block_the_next_run(tmp_path):
    """A run killed outright (SIGKILL, out of memory) leaves OUT/.lock and .OUT.partial-*
    beside it: the next run was refused ("holds .lock that cyto did not write"), even with
    --overwrite, and the partial folder stayed (hostile round 19)."""
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40]})
    out = tmp_path / "field"
    out.mkdir()
    (out / ".lock").write_text('{"pid": 999999}')  # its process gone: no flock held
    (tmp_path / ".field.partial-dead").mkdir()
    assert fit_field(src, out, echo=lambda s: None)["crops"] == 2
    assert not list(tmp_path.glob(".field.partial-*")) and not (out / ".lock").exists()
    assert sorted(p.name for p in (out / "NILM").iterdir()) == ["c00_24.png", "c01_40.png"]


def test_a_second_run_into_a_folder_being_written_is_told_who_writes_it(tmp_path):
    """Without --overwrite it was told the lock was a file cyto did not write (exit 2); a run
    being written is refused as busy (exit 3), naming the other run, with or without it."""
    from cyto.errors import OutputBusyError
    from cyto.locks import OutputLock

    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40]})
    out = tmp_path / "field"
    with OutputLock(out, "cyto data field"):  # the first run, writing
        for overwrite in (False, True):
            with pytest.raises(OutputBusyError, match="is being written by another cyto data"):
                fit_field(src, out, overwrite=overwrite)


def test_grayscale_crops_stay_grayscale_so_every_later_reader_says_so(tmp_path):
    from cyto.errors import CytoWarning

    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40]})
    Image.open(src / "NILM" / "c00_24.png").convert("L").save(src / "NILM" / "c00_24.png")
    said = []
    fit_field(src, tmp_path / "f", echo=said.append)
    assert any(s.startswith("1 of 2 images are grayscale") for s in said), said
    assert Image.open(tmp_path / "f" / "NILM" / "c00_24.png").mode == "L"
    assert Image.open(tmp_path / "f" / "NILM" / "c01_40.png").mode == "RGB"
    with pytest.warns(CytoWarning, match="1 of 2 images are grayscale"):
        PatchDataset.from_path(tmp_path / "f", normal="NILM")


def test_a_linked_out_is_checked_in_the_folder_it_names_so_a_users_files_stay(tmp_path):
    """--out LINK --overwrite emptied the folder the link named, a user's thesis in it: the
    check of files cyto did not write does not look through a link (review of round 19)."""
    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40]})
    (tmp_path / "important").mkdir()
    (tmp_path / "important" / "thesis.txt").write_text("precious")
    (tmp_path / "link").symlink_to(tmp_path / "important")
    with pytest.raises(InputPathError, match="thesis.txt that cyto did not write"):
        fit_field(src, tmp_path / "link", overwrite=True)
    assert (tmp_path / "important" / "thesis.txt").read_text() == "precious"


def test_a_live_runs_lock_stays_in_the_way_of_every_other_command(tmp_path):
    """The lock of a live run (cyto data field holds only it while it builds beside) is not a
    stale one: --overwrite of another command into that folder is refused, not let through to
    delete what the run moves in; a killed run's lock is cyto's own to replace."""
    from cyto.errors import OutputBusyError
    from cyto.locks import OutputLock
    from cyto.outputs_check import refuse_to_replace

    out = tmp_path / "busy"
    with OutputLock(out, "cyto data field"):
        for overwrite in (True, False):
            with pytest.raises(OutputBusyError, match="is being written by another cyto run"):
                refuse_to_replace(out, overwrite, known=())
    out.mkdir(exist_ok=True)
    (out / ".lock").write_text('{"pid": 999999}')  # a killed run's: no process holds it
    refuse_to_replace(out, True, known=())


def test_a_run_killed_while_moving_its_crops_in_leaves_a_folder_the_next_run_replaces(
    tmp_path, monkeypatch
):
    """Killed between moving the old files aside and the new ones in, OUT held files no record
    named, and every later run refused them as files cyto did not write."""
    import pathlib

    from cyto.outputs_check import foreign_files

    src = tmp_path / "boxed"
    _boxed(src, {"NILM": [24, 40], "HSIL": [30]})
    out = tmp_path / "field"
    fit_field(src, out, echo=lambda s: None)
    rename = pathlib.Path.rename
    for k in range(1, 9):  # killed at each rename of the move: 4 old entries out, 4 new in
        calls = []

        def dying(self, target, calls=calls, k=k):
            calls.append(target)
            if len(calls) == k:
                raise KeyboardInterrupt
            return rename(self, target)

        monkeypatch.setattr(pathlib.Path, "rename", dying)
        with pytest.raises(KeyboardInterrupt):
            fit_field(src, out, overwrite=True, echo=lambda s: None)
        monkeypatch.setattr(pathlib.Path, "rename", rename)
        assert foreign_files(out) == [], k
        fit_field(src, out, overwrite=True, echo=lambda s: None)  # replaces it
        assert sorted(p.name for p in (out / "NILM").iterdir()) == ["c00_24.png", "c01_40.png"]


def test_a_manifest_class_that_cannot_be_a_class_folder_is_refused(tmp_path):
    """A label ".hidden" became a folder every reader skips: its crops were lost unseen."""
    _boxed(tmp_path / "boxed", {"NILM": [24]})
    for label in (".hidden", "a/b"):
        (tmp_path / "m.csv").write_text(f"path,label\nboxed/NILM/c00_24.png,{label}\n")
        with pytest.raises(DatasetError, match=f"class '{label}' of .* cannot name a class"):
            fit_field(tmp_path / "m.csv", tmp_path / "f")
