"""The plain progress lines of logs and CI (stderr not a terminal)."""

from __future__ import annotations

from cyto.progress import progress


def test_the_last_line_says_what_was_set_after_the_last_step(monkeypatch, capsys):
    """A slide's last cells are scored after its last tile is read: the line printed when the
    work ends counts them, not the count of the last step."""
    monkeypatch.setenv("CYTO_PROGRESS", "1")
    with progress("score s.ndpi", total=2, unit="tiles") as bar:
        bar.set_postfix("10 cells")
        bar.advance(2)
        assert capsys.readouterr().err == ""  # nothing yet: under 10 s, not ended
        bar.set_postfix("25 cells")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("score s.ndpi: 2/2 tiles (") and lines[0].endswith(" 25 cells")


def test_a_resumed_bar_counts_the_earlier_part_but_not_in_its_rate(monkeypatch, capsys):
    """A run resumed at 9,000 of 10,000 images showed a rate as if the 9,000 were read in its
    first second, and an ETA near 0: the earlier part now starts the count, outside the rate."""
    from cyto import progress as module

    clock = iter([0.0, 1.0, 20.0])  # start, the step, the end
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setenv("CYTO_PROGRESS", "1")
    with progress("predict cells", total=10_000, unit="images", done=9_000) as bar:
        bar.advance(0)  # nothing new here
    line = capsys.readouterr().err.strip()
    assert line == "predict cells: 9000/10000 images (0.0 images/s)", line
    clock = iter([0.0, 5.0, 20.0])
    with progress("predict cells", total=10_000, unit="images", done=9_000) as bar:
        bar.advance(500)  # 500 in 5 s here
    line = capsys.readouterr().err.strip()
    assert line.startswith("predict cells: 9500/10000 images (25.0 images/s, eta 20 s)"), line


def test_the_last_step_printed_is_not_printed_again_when_the_work_ends(monkeypatch, capsys):
    """A sweep whose last cell ended more than 10 s after the line before printed "sweep: 1/1
    cells" twice: the step's own line, then the same count when the work ended."""
    from cyto import progress as module

    clock = iter([0.0, 15.0, 15.2])  # start, the step (a line: 10 s since the last), the end
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setenv("CYTO_PROGRESS", "1")
    with progress("sweep", total=1, unit="cells") as bar:
        bar.advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: 1/1 cells ("), lines
    clock = iter([0.0, 15.0, 15.2])  # a postfix set after the step: the end says it
    with progress("score", total=1, unit="tiles") as bar:
        bar.advance(1)
        bar.set_postfix("9 cells")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].endswith(" 9 cells"), lines
