"""``~`` is the home folder in every local path a user gives cyto, as a shell expands it
(``cyto.envvars.user_path``): ``--out=~/x.parquet`` and ``out="~/x.parquet"`` reach cyto
unexpanded; cyto made a folder named ``~`` under the working folder, and pyarrow, which expands
it, wrote elsewhere and failed in a traceback (hostile round 43, 1). One rule: the CLI's guard of
every ``Path`` parameter, the Python API's front door, and where a slide, an ``--out`` or a
scored folder that may be a URL is read as a local path."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cyto
from cyto.envvars import user_path
from cyto.errors import InputPathError
from tests.cli_runner import run_cyto

NO_USER = "~no-such-user-of-cyto"
_NAME = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00~/"),
    min_size=1,
    max_size=12,
)


@given(
    prefix=st.sampled_from(["", "~", "~/", "./", "/srv/", f"{NO_USER}/", "a/~/"]),
    parts=st.lists(_NAME, max_size=3),
)
def test_a_leading_tilde_is_the_home_folder_and_nothing_else_changes(prefix, parts):
    home = Path(os.path.expanduser("~"))
    rest = "/".join(parts)
    text = prefix + rest if prefix != "~" or not rest else "~/" + rest
    if prefix.startswith(NO_USER):
        with pytest.raises(InputPathError) as err:
            user_path(text)
        assert str(err.value) == (
            f"{text} starts with a ~ that cannot be expanded here (no such user): give the "
            "absolute path"
        )
        return
    want = home / rest if prefix.startswith("~") else Path(text)
    assert user_path(text) == want and user_path(Path(text)) == want


def test_every_reading_of_a_path_takes_tilde_as_home(tmp_path, monkeypatch):
    from cyto.cli._app import local_paths_only
    from cyto.flags import hints_of
    from cyto.location import OutputLocation, local_args, scored_folders
    from cyto.slides.remote import slide_ref

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))

    def command(a: Path, b: list[Path] | None = None, c: Path | None = None, d: str = "~/s"):
        return a, b, c, d

    # the CLI's guard: Path parameters (a str one may be a URL: read where it is, below)
    got = local_paths_only(command)(a=Path("~/a"), b=[Path("~/b"), Path("z")], c=None, d="~/s")
    assert got == (home / "a", [home / "b", Path("z")], None, "~/s")
    assert slide_ref("~/s.tif") == home / "s.tif" and slide_ref(Path("~/s.tif")) == home / "s.tif"
    assert slide_ref("s3://b/~/s.tif").url == "s3://b/~/s.tif"  # a URL's ~ is the server's
    assert OutputLocation("~/out").local == home / "out"
    assert scored_folders(["~/out"]) == [home / "out"]
    hints = hints_of(cyto.predict)
    assert local_args({"data": "~/d"}, hints) == {"data": str(home / "d")}
    assert local_args({"data": Path("~/d")}, hints) == {"data": home / "d"}


def test_predict_writes_an_out_given_with_tilde_in_the_home_folder(
    exported_dsvdd, synth_patches, tmp_path, monkeypatch
):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (home / "cells").symlink_to(synth_patches)
    n = sum(1 for p in synth_patches.rglob("*") if p.is_file())
    # at the command line, as bash leaves it after --out=
    proc = run_cyto(
        "predict", str(exported_dsvdd), "--data", "~/cells", "--normal", "normal",
        "--out=~/x.parquet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(home / "x.parquet").num_rows == n
    # from Python: str and Path alike
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cyto.predict(exported_dsvdd, "~/cells", "~/y.parquet", normal="normal", echo=None)
        cyto.predict(exported_dsvdd, Path("~/cells"), Path("~/z.parquet"), echo=None)
    assert pq.read_table(home / "y.parquet").num_rows == pq.read_table(home / "z.parquet").num_rows
    assert not os.listdir(work)  # no folder named ~ here
    proc = run_cyto("predict", str(exported_dsvdd), "--data", f"{NO_USER}/d", "--out", "o.parquet")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {NO_USER}/d starts with a ~ that cannot be expanded here (no such user): give "
        "the absolute path"
    ), proc.stderr


def test_a_manifests_rows_and_calibrates_tables_take_tilde_as_home(tmp_path, monkeypatch):
    """Round 45 (5-6): ``cyto calibrate MODEL '~/scored/slide'`` was "does not exist"; a
    manifest's ``~/x.png`` row was read as ``~/x.png`` beside the manifest (silently, where such a
    folder was there), while ``--data '~/x'`` read the home folder."""
    from PIL import Image

    from cyto.data.dataset import read_manifest
    from cyto.location import table_here

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    (home / "cells").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(home / "cells" / "a.png")
    (tmp_path / "~" / "cells").mkdir(parents=True)  # a folder named ~ beside the manifest
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\n~/cells/a.png,n\ncells/b.png,n\n")
    rows = read_manifest(manifest)
    assert [r.path for r in rows] == [home / "cells" / "a.png", tmp_path / "cells" / "b.png"]
    manifest.write_text(f"path,label\n{NO_USER}/a.png,n\n")
    with pytest.raises(Exception, match=r"row 2: ~no-such-user-of-cyto/a\.png starts with a ~"):
        read_manifest(manifest)
    assert table_here("~/scored/s", None)[0] == home / "scored" / "s"
