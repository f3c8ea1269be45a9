"""The bundle's seal: a sealed format cannot be unsealed by deleting the seal, damaged
manifests are one clear error, older unsealed bundles still load, and a bundle is readable by
the other users of a shared workstation."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest

from cyto.bundle import FORMAT_VERSION, SEAL, add_files, load_bundle, save_bundle
from cyto.errors import BundleError


@pytest.fixture
def bundle(tmp_path):
    import torch

    manifest = {"method": "dsvdd", "scorer_kind": "dsvdd", "calibration": {"q": 1.0}}
    weights = {"encoder-seed0": {"w": torch.ones(2, 2)}}
    return save_bundle(tmp_path / "b.cyto", manifest, weights, {"centres": np.ones((1, 2))})


def _edit(path, **changes):
    mf = path / "manifest.json"
    data = json.loads(mf.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    mf.write_text(json.dumps(data))


def test_deleting_the_seal_does_not_make_an_edit_load(bundle):
    assert json.loads((bundle / "manifest.json").read_text())["format_version"] == FORMAT_VERSION
    _edit(bundle, calibration={"q": 99.0}, **{SEAL: None})
    with pytest.raises(BundleError, match="has no manifest_sha256.*edited by hand"):
        load_bundle(bundle)


def test_an_older_unsealed_bundle_still_loads_and_stays_unsealed(bundle, tmp_path):
    from cyto.errors import UnsealedBundleWarning

    _edit(bundle, format_version=1, **{SEAL: None})
    with pytest.warns(UnsealedBundleWarning):
        assert load_bundle(bundle).method == "dsvdd"
    extra = tmp_path / "note.txt"
    extra.write_text("x")
    with pytest.warns(UnsealedBundleWarning):
        add_files(bundle, {"note.txt": extra})
    assert SEAL not in json.loads((bundle / "manifest.json").read_text())


@pytest.mark.parametrize("version", ["abc", None, 0, 2.5, True])
def test_a_garbled_format_version_is_one_clear_error(bundle, version):
    _edit(bundle, format_version=version if version is not None else "")
    with pytest.raises(BundleError, match="format_version must be a positive whole number"):
        load_bundle(bundle)


def test_a_manifest_that_is_not_an_object(bundle):
    (bundle / "manifest.json").write_text("[1, 2, 3]")
    with pytest.raises(BundleError, match="not a JSON object"):
        load_bundle(bundle)


def test_a_bundle_is_readable_by_other_users(bundle):
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o777 & ~umask
    for f in bundle.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f.name


def test_an_unsealed_bundle_warns_and_can_be_sealed(exported_dsvdd, tmp_path):
    """Seal deleted, format_version set to 1 and a config value edited: it loaded with no word
    and scored differently (issue 34). It still loads (older bundles were unsealed), with a
    warning that says how to seal it; once sealed, a later edit is refused."""
    import shutil
    import warnings

    from cyto.bundle import seal_bundle
    from cyto.errors import UnsealedBundleWarning
    from tests.cli_runner import run_cyto

    bundle = tmp_path / "old.cyto"
    shutil.copytree(exported_dsvdd, bundle)
    _edit(bundle, format_version=1, tta_lambda=0.25, **{SEAL: None})
    with pytest.warns(UnsealedBundleWarning, match=r"unsealed format-1 bundle.*--seal"):
        assert load_bundle(bundle, weights=False).manifest["tta_lambda"] == 0.25
    proc = run_cyto("info", str(bundle), process=True)  # what a user sees: one line
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        f"warning: {bundle} is an unsealed format-1 bundle: an edit to its manifest cannot be "
        f"detected. If it is as you trained it, seal it: cyto info {bundle} --seal"
    ], proc.stderr
    proc = run_cyto("info", str(bundle), "--seal")
    assert proc.returncode == 0 and f"{bundle}: sealed" in proc.stdout, proc.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and SEAL in manifest
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsealedBundleWarning)
        assert load_bundle(bundle, weights=False).manifest["tta_lambda"] == 0.25
    assert seal_bundle(bundle) is False  # already sealed
    _edit(bundle, tta_lambda=0.5)
    with pytest.raises(BundleError, match="does not match its own checksum"):
        load_bundle(bundle)


def test_a_bundle_path_that_does_not_exist_is_a_bad_argument(tmp_path):
    """A missing bundle exited 1, a missing slide or data folder 2 (QA): every path the user
    gave that does not exist is exit 2; a bundle that exists but is broken stays 1."""
    from tests.cli_runner import run_cyto

    missing = tmp_path / "nope.cyto"
    for args in (
        ("info", str(missing)),
        ("export", str(missing)),
        ("predict", str(missing), "--data", str(tmp_path)),
    ):
        proc = run_cyto(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"model bundle {missing} does not exist" in proc.stderr, proc.stderr
    broken = tmp_path / "broken.cyto"
    broken.mkdir()
    proc = run_cyto("info", str(broken))
    assert proc.returncode == 1 and "has no manifest.json" in proc.stderr, proc.stderr


def test_two_runs_adding_to_one_bundle_at_once_keep_both_additions(bundle, tmp_path, monkeypatch):
    """``cyto export --precision int8`` in one terminal, ``cyto calibrate`` in another: the one
    that writes the manifest last keeps what the other added, and the bundle still verifies.
    Writer B starts while writer A is about to write its manifest; B waits for A's lock."""
    import threading

    import cyto.bundle as bundle_mod

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("a")
    b.write_text("b")
    real = bundle_mod._manifest_text
    other = threading.Thread(target=add_files, args=(bundle, {"b.txt": b}, {"b": 2}))

    def slow_writer_a(manifest, seal=True):
        if not other.is_alive() and other.ident is None:  # A's manifest: start B, give it time
            other.start()
            other.join(timeout=1.0)
        return real(manifest, seal)

    monkeypatch.setattr(bundle_mod, "_manifest_text", slow_writer_a)
    add_files(bundle, {"a.txt": a}, {"a": 1})
    other.join(timeout=60)
    manifest = load_bundle(bundle).manifest
    assert {"a.txt", "b.txt"} <= set(manifest["files"]) and manifest["a"] == 1
    assert manifest["b"] == 2
    assert [p.name for p in bundle.iterdir() if p.name.endswith(".partial")] == []


def test_a_merged_field_is_built_from_the_manifest_as_it_is_when_written(bundle, tmp_path):
    extra = tmp_path / "x.txt"
    extra.write_text("x")
    add_files(bundle, {}, {"variants": {"fp16": 1}})
    add_files(bundle, {"x.txt": extra}, lambda now: {"variants": {**now["variants"], "int8": 2}})
    assert load_bundle(bundle).manifest["variants"] == {"fp16": 1, "int8": 2}


def test_a_bundle_whose_lock_cannot_be_made_is_read_without_it(bundle, tmp_path):
    """A read-only copy (a shared mount) cannot hold a lock file: it is read without one, and
    nothing can write to it."""
    (bundle / ".lock").unlink(missing_ok=True)
    (bundle / ".lock").mkdir()  # opening it fails as on a read-only mount, even for root
    assert load_bundle(bundle).method == "dsvdd"
    extra = tmp_path / "x.txt"
    extra.write_text("x")
    with pytest.raises(OSError):
        add_files(bundle, {"x.txt": extra})


def test_another_users_bundle_is_read_under_a_read_only_lock(bundle, monkeypatch):
    """A lock file this user may not write (another user's bundle on a shared workstation) is
    still locked, opened read-only."""
    import builtins

    import cyto.bundle as bundle_mod

    load_bundle(bundle)  # the lock file exists
    opened = []

    def as_another_user(file, mode="r", *args, **kwargs):
        if str(file).endswith("/.lock"):
            opened.append(mode)
            if mode != "r":
                raise PermissionError(13, "Permission denied", str(file))
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(bundle_mod, "open", as_another_user, raising=False)
    assert load_bundle(bundle).method == "dsvdd"
    assert opened == ["a+", "r"]


def test_a_bundle_on_a_file_system_that_cannot_lock_is_used_as_before(
    bundle, tmp_path, monkeypatch
):
    """NFS without its lock daemon answers flock with ENOLCK: a cluster's shared bundle still
    loads and takes its exports, unlocked as before bundles had locks."""
    import errno
    import fcntl

    def no_locks(fh, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    extra = tmp_path / "x.txt"
    extra.write_text("x")
    add_files(bundle, {"x.txt": extra}, {"x": 1})
    assert load_bundle(bundle).manifest["x"] == 1


def test_a_bundle_written_by_another_run_meanwhile_is_kept_and_so_is_this_one(
    tmp_path, monkeypatch
):
    """The same ``cyto train --out m.cyto`` in two terminals: the one that finishes second
    finds m.cyto written; neither model is lost, and it says where its own went."""
    import torch

    import cyto.bundle as bundle_mod

    out = tmp_path / "m.cyto"
    parts = ({"method": "dsvdd"}, {"encoder-seed0": {"w": torch.ones(2)}}, {"c": np.ones(2)})
    real, finished = bundle_mod._readable_by_all, []

    def other_run_finishes_first(folder):
        real(folder)
        if not finished:
            finished.append(True)
            save_bundle(out, {"method": "other"}, *parts[1:])

    monkeypatch.setattr(bundle_mod, "_readable_by_all", other_run_finishes_first)
    with pytest.raises(BundleError, match=r"written by another run.*kept as .*m-\d+\.cyto"):
        save_bundle(out, *parts)
    monkeypatch.undo()
    assert load_bundle(out).manifest["method"] == "other"
    (kept,) = tmp_path.glob("m-*.cyto")
    assert load_bundle(kept).manifest["method"] == "dsvdd"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_file_of_a_bundle_given_as_the_model_names_its_folder(tmp_path):
    """Hostile round 13, #18: `--model m.cyto/encoder.onnx` was told to train a model with
    'cyto train'; the file lies in a bundle, whose folder is what to give."""
    from cyto.bundle import load_bundle
    from cyto.errors import BundlePathError

    bundle = tmp_path / "m.cyto"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    (bundle / "encoder.onnx").write_bytes(b"x")
    with pytest.raises(BundlePathError) as refused:
        load_bundle(bundle / "encoder.onnx", weights=False)
    assert str(refused.value) == (
        f"{bundle / 'encoder.onnx'} is a file of the model bundle {bundle}: give the bundle "
        f"folder {bundle}"
    )
    (tmp_path / "loose.onnx").write_bytes(b"x")
    with pytest.raises(BundlePathError, match="train one with 'cyto train'"):
        load_bundle(tmp_path / "loose.onnx", weights=False)


@pytest.mark.parametrize("archive", ["zip", "gztar", "tar"])
def test_a_bundle_sent_as_an_archive_is_told_to_be_unpacked(tmp_path, archive):
    """Hostile round 54, 8: a zipped bundle was told to "train one with 'cyto train'", and the
    folder it was unpacked into only that it has no manifest. The archive is told to be
    unpacked (known by its bytes, whatever its name), the folder is told the bundle in it."""
    import shutil
    from pathlib import Path

    from cyto.bundle import load_bundle
    from cyto.errors import BundlePathError

    bundle = tmp_path / "made" / "m.cyto"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    sent = shutil.make_archive(str(tmp_path / "sent"), archive, tmp_path / "made")
    renamed = Path(sent).with_name("model.bin")  # the name says nothing
    Path(sent).rename(renamed)
    with pytest.raises(BundlePathError) as refused:
        load_bundle(renamed, weights=False)
    assert str(refused.value) == (
        f"{renamed} is an archive, not a model bundle folder: unpack it and give the NAME.cyto "
        "folder it holds"
    )
    with pytest.raises(BundlePathError) as refused:
        load_bundle(tmp_path / "made", weights=False)
    assert str(refused.value) == (
        f"{tmp_path / 'made'} has no manifest.json: the model bundle is the folder in it, give "
        f"{bundle}"
    )
    # two levels down (a zip of the bundle's parent), and a folder of two (round 55, 10)
    (tmp_path / "up").mkdir()
    shutil.move(tmp_path / "made", tmp_path / "up" / "made")
    with pytest.raises(BundlePathError, match=f"give {tmp_path / 'up' / 'made' / 'm.cyto'}$"):
        load_bundle(tmp_path / "up", weights=False)
    shutil.copytree(tmp_path / "up" / "made" / "m.cyto", tmp_path / "up" / "made" / "n.cyto")
    with pytest.raises(BundlePathError) as refused:
        load_bundle(tmp_path / "up" / "made", weights=False)
    made = tmp_path / "up" / "made"
    assert str(refused.value) == (
        f"{made} has no manifest.json: it holds 2 model bundles ({made / 'm.cyto'}, "
        f"{made / 'n.cyto'}): give one of them"
    )
