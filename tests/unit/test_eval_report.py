"""The witness-rate sweep's tables and plots (cyto.eval.report), made from results.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cyto.eval.report import PLOTTED, plots, tp_table


def _results(path, scale: float = 1.0):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["method", "wr", "trial", "metric", "value"])
        w.writeheader()
        for method in ("fs-sil", "dsvdd"):
            for wr in (9.0, 1.0):
                for trial in range(2):
                    for metric in ("tp_at_k", *PLOTTED):
                        value = scale * (wr + trial + (3 if method == "fs-sil" else 1))
                        w.writerow(dict(method=method, wr=wr, trial=trial, metric=metric,
                                        value=value))  # fmt: skip
    return path


def test_tables_and_plots_from_the_results(tmp_path):
    results = _results(tmp_path / "results.csv")
    md, tex = tp_table(results, tmp_path, 20)
    lines = md.read_text().splitlines()
    assert lines[0] == "| TP@20 | WR 9% | WR 1% |"
    assert lines[2] == "| fs-sil (upper bound) | 12.5 ± 0.7 | 4.5 ± 0.7 |"
    assert r"12.5 $\pm$ 0.7" in tex.read_text()
    drawn = plots(results, tmp_path, 20)
    assert sorted(p.name for p in drawn) == sorted(
        f"{m}.{ext}" for m in PLOTTED for ext in ("png", "svg")
    )
    assert all(p.read_bytes()[:4] in (b"\x89PNG", b"<?xm") for p in drawn)


def test_a_report_stopped_while_it_draws_leaves_every_file_whole(tmp_path, monkeypatch):
    """The tables and plots were written in place: a full disk (or Ctrl-C) inside savefig left
    a truncated PNG where the last run's was. Each file is now written beside itself and
    renamed: the last run's file stays whole, and no temporary file is left."""
    from matplotlib.figure import Figure

    results = _results(tmp_path / "results.csv")
    tp_table(results, tmp_path, 20)
    before = {p.name: p.read_bytes() for p in plots(results, tmp_path, 20)}
    _results(results, scale=2.0)  # more trials came in: the next report differs
    real = Figure.savefig
    calls = []

    def disk_full(self, fname, *args, **kwargs):
        calls.append(fname)
        if len(calls) == 3:  # the second plot's PNG, halfway
            if hasattr(fname, "write"):
                fname.write(b"\x89PNG half")
            else:
                Path(fname).write_bytes(b"\x89PNG half")
            raise OSError(28, "No space left on device")
        return real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", disk_full)
    with pytest.raises(OSError, match="No space"):
        plots(results, tmp_path, 20)
    after = {name: (tmp_path / name).read_bytes() for name in before}
    first, second, third = (f"{m}.png" for m in list(PLOTTED)[:3])
    assert after[first] != before[first]  # redrawn before the disk filled
    assert after[second] == before[second]  # the last run's, whole
    assert after[third] == before[third]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_plot_with_nothing_to_draw_is_drawn_without_a_warning(tmp_path):
    """Hostile round 40 (11): a sweep whose every mean was 0 (nothing on a log axis) printed
    matplotlib's "No artists with labels found to put in legend" with its source line."""
    import warnings

    results = _results(tmp_path / "results.csv", scale=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = plots(results, tmp_path, 20)
    assert len(drawn) == 2 * len(PLOTTED)
