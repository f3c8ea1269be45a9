"""Comma-separated options (``--methods``, ``--wr``, ``--planes``...) go through one parser,
:func:`cyto.flags.comma_list`: an empty item and an item given twice are refused in one line
naming the flag, never dropped or run twice (issue 68, hostile round 12: N27, N28, N30, N31,
N21)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cyto.errors import ConfigError
from cyto.flags import comma_list, python_words
from tests.cli_runner import run_cyto

ITEM = st.text(
    st.characters(min_codepoint=32, max_codepoint=126, exclude_characters=","), max_size=5
)
ITEMS = st.lists(ITEM.filter(lambda s: s.strip()), min_size=1, max_size=6, unique_by=str.strip)


@given(ITEMS)
def test_a_list_of_distinct_items_is_read_as_given(items):
    assert comma_list(",".join(items), "methods") == tuple(i.strip() for i in items)


@given(ITEMS, st.data())
def test_an_empty_item_anywhere_is_refused_naming_the_flag(items, data):
    at = data.draw(st.integers(0, len(items)))
    blank = data.draw(st.sampled_from(["", " ", "  "]))
    text = ",".join([*items[:at], blank, *items[at:]])
    with pytest.raises(ConfigError) as err:
        comma_list(text, "wrs")
    assert str(err.value) == f"--wr has an empty item in {text!r}"


@given(ITEMS, st.data())
def test_an_item_given_twice_is_refused_naming_the_flag_and_the_item(items, data):
    again = data.draw(st.sampled_from(items))
    text = ",".join([*items, again])
    with pytest.raises(ConfigError) as err:
        comma_list(text, "methods")
    assert str(err.value) == f"--methods lists {again.strip()} twice"


def test_a_list_of_nothing_is_refused_and_python_callers_are_told_their_keyword():
    for text in ("", " "):
        with pytest.raises(ConfigError, match=r"^--planes names nothing"):
            comma_list(text, "planes")
    with python_words("score_slide"), pytest.raises(ConfigError) as err:
        comma_list("a,,b", "planes")
    assert str(err.value) == "planes= has an empty item in 'a,,b'"
    with pytest.raises(ConfigError, match=r"^--wr lists 1.0 twice$"):
        comma_list("1,1.0", "wrs", float)  # twice as the value it is read as


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--methods", "dsvdd,dsvdd"), "--methods lists dsvdd twice"),
        (("--wr", "1,,2"), "--wr has an empty item in '1,,2'"),
        (("--methods", ""), "--methods names nothing, got '': give one or more items"),
        (("--wr", ""), "--wr names nothing, got '': give one or more items"),
        (("--trials", "0"), "--trials must be >= 1, got 0"),
        (("--k", "0"), "--k must be >= 1, got 0"),
    ],
)
def test_eval_sweep_refuses_each_bad_option_by_its_flag(tmp_path, args, said):
    proc = run_cyto(
        "eval", "sweep", "--data", str(tmp_path), "--normal", "a", "--methods", "dsvdd",
        *args, "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {said}"
    assert not (tmp_path / "out").exists()


def test_score_detection_refusal_lists_every_value_it_takes(tmp_path):
    proc = run_cyto(
        "score", str(tmp_path / "x.tif"), "--model", str(tmp_path / "m.cyto"),
        "--out", str(tmp_path / "o"), "--detection", "",
    )  # fmt: skip
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "error: --detection must be one of auto, smear, tissue, pap, got ''"


@pytest.mark.parametrize(
    ("planes", "said"),
    [
        (",", "--planes has an empty item in ','"),
        ("", "--planes names nothing, got '': give one or more items"),
    ],
)
def test_score_refuses_a_planes_list_of_nothing(tmp_path, exported_dsvdd, planes, said):
    from PIL import Image

    slide = tmp_path / "s.tif"
    Image.new("RGB", (64, 64), "white").save(slide)
    proc = run_cyto(
        "score", str(slide), "--model", str(exported_dsvdd), "--out", str(tmp_path / "o"),
        "--planes", planes,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {said}"


@pytest.mark.parametrize(
    ("kind", "args", "said"),
    [
        ("slide", ("--scale", "0"), "--scale must be > 0, got 0.0"),
        (
            "slide",
            ("--mpp", "-1"),
            "--mpp must be between 0.01 and 10 (um per pixel: about 0.25 at a 40x objective, "
            "0.5 at 20x), got -1.0",
        ),
        ("patches", ("--scale", "0"), "--scale must be > 0, got 0.0"),
        ("slide", ("--planes", "0,,1"), "--planes has an empty item in '0,,1'"),
        ("slide", ("--planes", "0,1,1"), "--planes lists 1 twice"),
    ],
)
def test_synth_names_the_flag_given(tmp_path, kind, args, said):
    out = tmp_path / ("s.tif" if kind == "slide" else "p")
    proc = run_cyto("synth", kind, str(out), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {said}"


def test_export_from_python_refuses_a_precision_list_with_an_empty_item(tmp_path):
    import cyto

    with pytest.raises(ConfigError) as err:
        cyto.export(tmp_path / "m.cyto", precisions="fp32,,fp16")
    assert str(err.value) == "precisions= has an empty item in 'fp32,,fp16'"
    with pytest.raises(ConfigError) as err:
        cyto.export(tmp_path / "m.cyto", precisions="fp16,fp16")
    assert str(err.value) == "precisions= lists fp16 twice"
