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
