"""Which names a folder's listing (and a prefix's) takes for slides."""

from __future__ import annotations

import pytest

from cyto.slides import slide_files


@pytest.mark.parametrize("stem", ["a", "slide 01", "._a", ".a", "~tmp_a", "a.b"])
@pytest.mark.parametrize("suffix", [".tif", ".svs", ".NDPI"])
def test_a_folder_passes_over_hidden_names_and_reads_them_named_alone(tmp_path, stem, suffix):
    """Hostile round 76, 7: a macOS resource fork (`._day00.tif`) was a failed slide at each
    look of a watch, and a hidden `.hidden.tif` was scored into a hidden folder. A folder's
    listing passes over hidden names as `ls` does; a hidden file named on its own is read."""
    f = tmp_path / f"{stem}{suffix}"
    f.write_bytes(b"II*\0")
    (tmp_path / "a.tif").write_bytes(b"II*\0")
    listed = slide_files([tmp_path])
    hidden = stem.startswith(".")
    assert (f in listed) is not hidden, listed
    assert tmp_path / "a.tif" in listed
    assert slide_files([f]) == [f]  # named alone: as given
    from cyto.slides.base import listed_slide_name  # the rule a prefix's listing takes too

    assert listed_slide_name(f.name) is not hidden
