"""A slide's output folder is sealed (cyto.seal): any edit, cut, deletion or addition of one of
cyto's outputs is found, and files the user adds beside them are not cyto's business."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from cyto.seal import SEAL, SUMMARY, read_sealed, seal_outputs

OUTPUTS = ("scores.parquet", "topk.parquet", "topk.geojson")
OWNED = (*OUTPUTS, "topk_mosaic.png", "cells.geojson")


def _folder(root, payload: bytes = b"cells" * 40):
    root.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        (root / name).write_bytes(name.encode() + payload)
    summary = {"burden": {"triage": "excess", "slide_p_value": 0.006}, "outputs": {}}
    (root / SUMMARY).write_text(json.dumps(summary))
    seal_outputs(root, OUTPUTS, OWNED)
    return root


def test_a_sealed_folder_reads_back_whole(tmp_path):
    sealed = read_sealed(_folder(tmp_path / "s"))
    assert sealed.ok and sealed.summary["burden"]["triage"] == "excess"
    assert sealed.words() == ""


def _damage(folder, name: str, how: str, at: float) -> None:
    path = folder / name
    if how == "add":
        path.write_bytes(b"added by hand")
        return
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: int(len(data) * at)])
    elif how == "edit":  # the same length, one byte other
        i = min(int(len(data) * at), len(data) - 1)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1 :])


@given(
    target=st.sampled_from([*OUTPUTS, SUMMARY, "topk_mosaic.png", "cells.geojson"]),
    how=st.sampled_from(["edit", "truncate", "delete", "add"]),
    at=st.floats(0.0, 0.99),
)
def test_any_damage_to_a_sealed_output_is_found_and_named(tmp_path_factory, target, how, at):
    folder = _folder(tmp_path_factory.mktemp("seal") / "s")
    sealed_names = {*OUTPUTS, SUMMARY}
    if how == "add" and target in sealed_names:
        how = "edit"  # a sealed file is there already: adding it again is an edit
    if how != "add" and target not in sealed_names:
        how = "add"  # an output this run did not write can only be added
    _damage(folder, target, how, at)
    sealed = read_sealed(folder)
    assert not sealed.ok
    assert target in sealed.changed_names
    assert target in sealed.words() and "changed since they were written" in sealed.words()
    # a summary edited (the forged triage) is never handed out
    if target == SUMMARY:
        assert sealed.summary is None


@given(name=st.sampled_from(["notes.txt", "review", "LYT_user", ".DS_Store", "scores.csv"]))
def test_files_the_user_adds_are_outside_the_seal(tmp_path_factory, name):
    folder = _folder(tmp_path_factory.mktemp("seal") / "s")
    if name in ("review", "LYT_user"):
        (folder / name).mkdir()
        (folder / name / "key.json").write_text("{}")
    else:
        (folder / name).write_text("mine")
    assert read_sealed(folder).ok


def test_a_folder_without_a_seal_or_with_a_foreign_one_is_not_whole(tmp_path):
    folder = _folder(tmp_path / "s")
    (folder / SEAL).unlink()
    sealed = read_sealed(folder)
    assert not sealed.ok and sealed.summary is None and "no seal" in sealed.words()
    for text in ("{", "[]", json.dumps({"format": "other", "files": {}})):
        (folder / SEAL).write_text(text)
        assert not read_sealed(folder).ok, text
    (folder / SEAL).write_text(
        json.dumps({"format": "cyto-outputs-seal/1", "files": {"../x": {}, SUMMARY: {}}})
    )
    assert "not one cyto writes" in read_sealed(folder).words()


def test_a_summary_forged_with_its_seal_entry_left_stale_is_caught(tmp_path):
    """The issue's case: triage 'excess' -> 'no excess', slide p 0.006 -> 0.9, by hand."""
    folder = _folder(tmp_path / "s")
    text = (folder / SUMMARY).read_text()
    forged = text.replace('"excess"', '"no excess"').replace("0.006", "0.9")
    (folder / SUMMARY).write_text(forged)
    sealed = read_sealed(folder)
    assert sealed.summary is None
    assert sealed.words() == "its outputs changed since they were written (summary.json)"


@given(
    own=st.one_of(
        st.dictionaries(st.sampled_from(["mine", "notes", "slide", "total"]), st.integers()),
        st.lists(st.integers(), max_size=3),
        st.just("not json {"),
    )
)
def test_a_users_own_summary_is_not_taken_for_a_slides_results(own, tmp_path_factory):
    """cyto score --out DIR over a folder holding a user's own summary.json said 'holds the
    results of another slide (an unnamed slide)', and score_slide called it 'the finished
    results of' this slide; it is a file cyto did not write, named as such, never replaced."""
    import pytest

    from cyto.cohort.local import output_folders
    from cyto.cohort.run import refuse_finished
    from cyto.errors import InputPathError
    from cyto.seal import written_by_cyto

    out = tmp_path_factory.mktemp("out")
    (out / "s").mkdir()
    text = own if isinstance(own, str) else json.dumps(own)
    (out / "s" / SUMMARY).write_text(text)
    (out / "s" / "scores.parquet").write_bytes(b"PAR1 theirs")
    assert not written_by_cyto(out / "s")
    said = []
    ((_, folder),) = output_folders([out / "s.tif"], out, said.append)
    assert folder != out / "s"  # never scored into it
    assert said and "summary.json, which cyto did not write" in said[0], said
    assert "another slide" not in said[0]
    for overwrite in (False, True):
        with pytest.raises(InputPathError, match="holds summary.json that cyto did not write"):
            refuse_finished(out / "s", "s.tif", overwrite)
    assert (out / "s" / SUMMARY).read_text() == text
    # cyto's own, sealed or not (a run stopped before its seal, an older cyto): cyto's
    assert written_by_cyto(_folder(tmp_path_factory.mktemp("sealed") / "s"))
    (out / "s" / SUMMARY).write_text(json.dumps({"slide": "/scans/x.tif", "cells_scored": 3}))
    assert written_by_cyto(out / "s")
