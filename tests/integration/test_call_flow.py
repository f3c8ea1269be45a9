"""Following a slide through ``score_slide``, calls enter each module once: no call chain leaves a
module and comes back into it through another (issue 33: pipeline -> slide -> planes -> slide ->
planes; the numpy and torch detectors calling each other)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import cyto

SRC = Path(cyto.__file__).resolve().parent


def _module(filename: str, root: Path) -> str | None:
    path = Path(filename)
    if not path.is_absolute() or root not in path.parents:
        return None
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def returns_in_call_chains(run, root: Path = SRC) -> set[tuple[str, ...]]:
    """Run ``run()`` under a profiler; every chain of modules under ``root`` (consecutive frames
    of one module merged) in which a module appears twice."""
    found: set[tuple[str, ...]] = set()
    names: dict[str, str | None] = {}

    def chain(frame) -> list[str]:
        mods = []
        while frame is not None:
            f = frame.f_code.co_filename
            if f not in names:
                names[f] = _module(f, root)
            m = names[f]
            if m is not None and (not mods or mods[-1] != m):
                mods.append(m)
            frame = frame.f_back
        return mods[::-1]

    def profile(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if f not in names:
            names[f] = _module(f, root)
        if names[f] is None:
            return
        mods = chain(frame)
        if len(set(mods)) < len(mods):
            found.add(tuple(mods))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def test_the_profiler_sees_a_return(tmp_path, monkeypatch):
    """The check is not vacuous: a call chain a -> b -> a is found, a -> b -> c is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "def f():\n    from pkg import b\n    return b.g()\n\n\ndef h():\n    return 1\n"
    )
    (pkg / "b.py").write_text("def g():\n    from pkg import a, c\n    return a.h() + c.k()\n")
    (pkg / "c.py").write_text("def k():\n    return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from pkg import a, b

    assert returns_in_call_chains(a.f, pkg) == {("pkg.a", "pkg.b", "pkg.a")}
    assert returns_in_call_chains(b.g, pkg) == set()


@pytest.fixture(scope="module")
def two_plane_slide(tmp_path_factory):
    """An NDPI with two focal planes and its planted cells (both detectors score it)."""
    from cyto.data.synth.slide import SlideSynthConfig, write_slide

    return write_slide(
        tmp_path_factory.mktemp("flow") / "s.ndpi",
        SlideSynthConfig(width=1024, height=768, seed=2, abnormal_fraction=0.1, planes=(0.0, 1.0)),
    )


@pytest.mark.parametrize("detector", ["scipy", "torch"])
def test_a_slide_enters_each_module_once(exported_dsvdd, two_plane_slide, tmp_path, detector):
    from dataclasses import replace

    from cyto.detect import NucleusParams
    from cyto.infer import ScoreOptions, score_slide
    from cyto.runtime import load_scorer

    slide = two_plane_slide
    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    opts = ScoreOptions(
        workers=0,
        tile=512,
        mosaic=4,
        top_k=8,
        detection=replace(NucleusParams(), detector=detector),
        truth=slide.ground_truth,
    )
    summary = {}

    def run():
        summary.update(score_slide(slide.paths[0], scorer, tmp_path / "out", opts, echo=str))

    chains = returns_in_call_chains(run)
    assert summary["cells_scored"] > 0
    assert sorted(chains) == [], "\n".join(" -> ".join(c) for c in sorted(chains))
