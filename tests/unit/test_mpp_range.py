"""Every pixel size a user gives cyto is held to one range, a microscope's (``MPP_RANGE``),
in the caller's words: ``cyto train --set mpp=25.8`` (0.258 typed 100x too large) trained a
Pap model whose morphometric score fell to chance without a word (hostile round 25, 20), and
each entry had a rule of its own (> 0 for train, predict and synth; 0.01 to 100 for score)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import ConfigError
from cyto.flags import MPP_RANGE

OUTSIDE = st.one_of(
    st.floats(min_value=MPP_RANGE.hi, max_value=1e6, exclude_min=True),
    st.floats(min_value=0, max_value=MPP_RANGE.lo, exclude_max=True),
    st.sampled_from([25.8, 12.9, 0.0025]),
)
INSIDE = st.one_of(
    st.floats(min_value=MPP_RANGE.lo, max_value=MPP_RANGE.hi), st.sampled_from([0.258, 0.5])
)


def _entries():
    """(the caller's name for it, a call that takes the pixel size) of every entry."""
    from pathlib import Path

    from cyto.data.scale import resolve_zoom
    from cyto.data.synth.from_cells import CellSlideConfig
    from cyto.data.synth.slide import SlideSynthConfig
    from cyto.flags import check_value, hints_of
    from cyto.infer import ScoreOptions
    from cyto.predict import predict
    from cyto.train.registry import get_method

    patch_mpp = hints_of(predict)["patch_mpp"]  # what cyto.predict(patch_mpp=) is held to

    return {
        "--mpp": lambda v: ScoreOptions(slide_mpp=v),
        "--model-mpp": lambda v: ScoreOptions(model_mpp=v),
        "--set mpp": lambda v: get_method("dsvdd").Config(mpp=v),
        "--patch-mpp": lambda v: resolve_zoom(None, v, 0.258, None, None, 100, 100),
        # hostile round 26 (11): patch_mpp=0 read "must be > 0", 25.8 "between 0.01 and 10"
        "--patch-mpp (predict's signature)": lambda v: check_value("patch_mpp", v, patch_mpp),
        "--mpp (synth slide)": lambda v: SlideSynthConfig(mpp=v),
        "--mpp (synth slide --cells)": lambda v: CellSlideConfig(Path("c"), ("N",), v),
    }


@given(value=OUTSIDE, entry=st.sampled_from(sorted(_entries())))
def test_a_pixel_size_no_microscope_gives_is_refused_in_one_line_at_every_entry(value, entry):
    with pytest.raises(ConfigError) as refused:
        _entries()[entry](value)
    said = str(refused.value)
    assert "must be between 0.01 and 10 (um per pixel" in said and "\n" not in said, said
    assert entry.split(" (")[0] in said, said


@given(value=INSIDE, entry=st.sampled_from(sorted(_entries())))
def test_a_microscope_s_pixel_size_is_taken_at_every_entry(value, entry):
    try:
        _entries()[entry](value)
    except ConfigError as other:  # another rule of that entry (--patch-mpp: a zoom of 0.25-4)
        assert "must be between 0.01 and 10" not in str(other), str(other)
