"""A numeric option with a range is held to it as the command line is read: one line naming the
flag, exit 2, nothing run or written (hostile round 11 probe: `cyto bench scorer --dims -1`
ended in numpy's raw ValueError, `--repeats -1` timed nothing and wrote a table)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli_runner import leaf_commands, run_cyto


def _ranged() -> list[tuple[list[str], str, object, list[str]]]:
    """(command path, flag, bounds, its arguments filled) of every ranged option."""
    found = []
    for path, cmd in leaf_commands():
        args = ["/nonexistent/x" for p in cmd.params if type(p).__name__.endswith("Argument")]
        for p in cmd.params:
            bounds = getattr(p.callback, "bounds", None)
            if bounds is not None:
                found.append((path, p.opts[0], bounds, args))
    return found


RANGED = _ranged()


def test_the_walk_finds_the_ranged_options():
    flags = {(" ".join(path), flag) for path, flag, _, _ in RANGED}
    assert {("bench scorer", "--dims"), ("bench engine", "--repeats")} <= flags


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_value_outside_its_range_is_one_line_before_any_work(data, tmp_path_factory):
    path, flag, bounds, args = data.draw(st.sampled_from(RANGED))
    outside = []
    if bounds.lo is not None:
        outside.append(bounds.lo if bounds.open_lo else bounds.lo - 1)
    if bounds.hi is not None:
        outside.append(bounds.hi + 1)
    value = data.draw(st.sampled_from(outside))
    results = tmp_path_factory.mktemp("r")
    extra = ["--results", str(results)] if path[0] == "bench" else []
    proc = run_cyto(*path, *args, flag, str(value), *extra)
    assert proc.returncode == 2, (path, flag, value, proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag} must be "), line
    assert not any(results.iterdir())


@pytest.mark.parametrize("args", [("--dims", "-1"), ("--dims", "0"), ("--repeats", "-1")])
def test_bench_scorer_refuses_what_numpy_and_its_timer_cannot_take(args, tmp_path):
    proc = run_cyto("bench", "scorer", *args, "--results", str(tmp_path / "r"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()
