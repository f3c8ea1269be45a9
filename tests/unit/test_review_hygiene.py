"""Blinding and training hygiene (issue 68, class 4): a blinded review is found from the scored
folder it was made of, wherever its --session folder is."""

from __future__ import annotations

import json

import pytest

from cyto.errors import ConfigError, InputPathError
from cyto.review.session import REVIEWS_FILE, record_review, recorded_reviews
from cyto.view.folder import review_blocking


def _review(root, scored, cases=("case-001",)):
    """A review folder's key as build_session writes it (what the view's guard reads)."""
    root.mkdir(parents=True)
    key = {"scored": [str(f) for f in scored], "cases": {c: {} for c in cases}}
    (root / "key.json").write_text(json.dumps(key))
    return root


def test_a_review_made_elsewhere_is_found_from_the_scored_folder(tmp_path):
    folder = tmp_path / "cohort" / "slide1"
    folder.mkdir(parents=True)
    elsewhere = _review(tmp_path / "far" / "away" / "rv", [folder])
    assert review_blocking([folder], [folder]) is None  # the folder does not know of it yet
    record_review([folder], elsewhere)
    record_review([folder], elsewhere)  # once is enough
    assert recorded_reviews(folder) == [elsewhere.absolute()]
    assert "blinded review nobody has started" in review_blocking([folder], [folder.parent])


def test_open_view_refuses_the_slide_of_an_unfinished_review_elsewhere(tmp_path):
    from cyto.view.folder import open_view

    folder = tmp_path / "slide1"
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    (folder / "scores.parquet").write_bytes(b"")
    record_review([folder], _review(tmp_path / "elsewhere", [folder]))
    with pytest.raises(ConfigError, match=r"elsewhere is a blinded review.*--unblind"):
        open_view(folder)


def test_a_folder_the_review_cannot_be_recorded_in_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "slide1"
    (folder / REVIEWS_FILE).mkdir(parents=True)  # unwritable as a file
    with pytest.raises(InputPathError, match="cannot record the review in") as err:
        record_review([folder], tmp_path / "rv")
    assert "\n" not in str(err.value)
