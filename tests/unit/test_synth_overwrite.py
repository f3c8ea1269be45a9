"""`cyto synth slide --overwrite` replaces only a synthetic slide's own files (a hostile check:
a user's own `u.cells.parquet` beside the slide name was refused without saying cyto did not
write it, and `--overwrite` then replaced it)."""

from __future__ import annotations

import pytest

from cyto.data.synth.slide import SlideSynthConfig, ground_truth_path, synthetic_file, write_slide
from cyto.errors import InputPathError


@pytest.mark.parametrize("suffix", [".tif", ".ndpi"])
def test_overwrite_replaces_its_own_slide_and_refuses_a_users_file(tmp_path, suffix):
    config = SlideSynthConfig(width=512, height=512, n_cells=20, seed=1)
    out = tmp_path / f"s{suffix}"
    write_slide(out, config, workers=1)
    assert synthetic_file(out) and synthetic_file(ground_truth_path(out))
    write_slide(out, config, overwrite=True, workers=1)  # its own: replaced
    user = tmp_path / f"u{suffix}"
    ground_truth_path(user).write_text("my notes\n")
    with pytest.raises(InputPathError, match="that cyto did not write") as err:
        write_slide(user, config, overwrite=True, workers=1)
    assert "u.cells.parquet" in str(err.value) and "\n" not in str(err.value)
    assert ground_truth_path(user).read_text() == "my notes\n"
    assert not synthetic_file(ground_truth_path(user))
