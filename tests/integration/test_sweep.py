"""A miniature witness-rate sweep (two methods, two WRs, two trials, tiny data), and its resume."""

from __future__ import annotations

import csv
import json
import re

from cyto.locks import OutputLock
from tests.cli_runner import run_cyto

TINY = [
    "--set",
    "epochs=2",
    "--set",
    "input_size=32",
    "--set",
    "load_size=40",
    "--set",
    "batch_size=16",
]


def test_miniature_sweep_and_resume(tmp_path, synth_patches):
    out = tmp_path / "sweep"
    args = [
        "eval",
        "sweep",
        "--data",
        str(synth_patches),
        "--normal",
        "normal",
        "--abnormal",
        "enlarged,multinucleated",
        "--methods",
        "fs-sil,ws-sil",
        "--wr",
        "9,5",
        "--trials",
        "2",
        "--k",
        "20",
        "--out",
        str(out),
        "--device",
        "cpu",
        *TINY,
    ]
    proc = run_cyto(*args)
    assert proc.returncode == 0, proc.stderr
    assert "WR 9%" in proc.stdout and "of the positive bags" in proc.stdout
    # the WR asked is the abnormal share of a positive bag, to a cell (hostile round 39, 1: the
    # sweep put 9 % of all ten bags' normals in, 15-18 % of a positive bag on small data)
    for wr in (9, 5):
        said = re.search(
            rf"WR {wr}%: train (\d+) abnormal .*?, ([\d.]+)% of the positive bags\), test (\d+) "
            r"abnormal among (\d+) normal \(effective ([\d.]+)%\)",
            proc.stdout,
        )
        train, share, test, held, test_share = (float(g) for g in said.groups())
        if "the floor: one in each positive bag" in said[0]:  # few cells: one per bag at least
            assert train == 5 and share >= wr, said[0]
        else:
            assert abs(share - wr) <= 0.5 * 100 / (train / (share / 100)), said[0]
        assert test_share < share  # about half of it, as the paper's pools hold
    assert "fs-sil (upper bound)" in proc.stdout
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["method"], r["wr"], r["trial"]) for r in rows}
    assert len(cells) == 2 * 2 * 2
    assert {r["metric"] for r in rows} >= {
        "tp_at_k",
        "recall_at_k",
        "ndcg_at_k",
        "autk_at_k",
        "aufroc_at_k",
        "auroc",
    }
    for name in (
        "tp_at_k.md",
        "tp_at_k.tex",
        "recall_at_k.png",
        "recall_at_k.svg",
        "ndcg_at_k.png",
        "autk_at_k.svg",
        "aufroc_at_k.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in (out / "models").iterdir()) == [
        "fs-sil-wr5.cyto",
        "fs-sil-wr9.cyto",
        "ws-sil-wr5.cyto",
        "ws-sil-wr9.cyto",
    ]

    # interrupted after some cells: drop the last cell and rerun; nothing else is recomputed
    with open(out / "results.csv", newline="") as f:
        lines = f.readlines()
    keep = [ln for ln in lines if not ln.startswith("ws-sil,5.0")]
    (out / "results.csv").write_text("".join(keep))
    stamp = (out / "models" / "fs-sil-wr9.cyto" / "manifest.json").stat().st_mtime
    # a sweep written before --train-fraction existed resumes (the new setting at its default)
    spec = json.loads((out / "sweep.json").read_text())
    assert spec.pop("train_fraction") == 0.5
    (out / "sweep.json").write_text(json.dumps(spec))
    # first stopped while it writes the cell's rows: the table keeps whole cells only
    real = csv.DictWriter.writerows

    def disk_full(self, rows):
        self.writerow(next(iter(rows)))
        raise OSError(28, "No space left on device")

    csv.DictWriter.writerows = disk_full
    try:
        full = run_cyto(*args)
    finally:
        csv.DictWriter.writerows = real
    assert full.returncode == 1 and "Traceback" not in full.stderr
    assert full.stderr.strip().endswith("error: the disk is full")  # the machine's, one line
    assert (out / "results.csv").read_text() == "".join(keep)
    again = run_cyto(*args)
    assert again.returncode == 0, again.stderr
    with open(out / "results.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (out / "models" / "fs-sil-wr9.cyto" / "manifest.json").stat().st_mtime == stamp

    # a hand-edited result is never taken for one (a hostile check, round 2: a rerun kept the
    # edited AUROC and drew it into the tables): that cell is computed again, said in one line
    text = (out / "results.csv").read_text()
    lines = text.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("fs-sil,9.0,0,") and ",auroc," in ln)
    true_value = lines[at].rstrip("\n").rsplit(",", 1)[1]
    lines[at] = lines[at].rsplit(",", 1)[0] + ",0.999\n"
    (out / "results.csv").write_text("".join(lines))
    healed = run_cyto(*args)
    assert healed.returncode == 0, healed.stderr
    assert "fs-sil WR 9 are not as this sweep wrote them" in healed.stdout + healed.stderr
    assert (out / "results.csv").read_text().count(",0.999\n") == 0
    with open(out / "results.csv", newline="") as f:
        back = [r for r in csv.DictReader(f) if (r["method"], r["wr"], r["trial"], r["metric"])
                == ("fs-sil", "9.0", "0", "auroc")]  # fmt: skip
    assert [r["value"] for r in back] == [true_value]
    assert (out / "models" / "fs-sil-wr9.cyto" / "manifest.json").stat().st_mtime == stamp

    other = run_cyto(*[a if a != "20" else "30" for a in args])
    assert other.returncode != 0 and "other settings" in other.stderr

    # the sweep's models record the cells of their training bags, which cyto predict says it
    # scores again (hostile round 40, 1): fs-sil at WR 9 trained on every bag's cells
    import numpy as np

    from cyto.bundle import TRAINING_CELLS

    n_bags = int(re.search(r"(\d+) training normals in 10 bags", proc.stdout)[1])
    n_wr9 = int(re.search(r"WR 9%: train (\d+) abnormal", proc.stdout)[1])
    keys = np.load(out / "models" / "fs-sil-wr9.cyto" / TRAINING_CELLS)
    assert len(keys) == 2 * (n_bags + n_wr9)  # each image by its file's bytes and its pixels

    # rows sealed by an earlier cyto under another count rule, beside a record edited to this
    # rule's counts (hostile round 40, 5): drawn with other cells, computed again
    from cyto.eval.sweep import _cell_digests, _read_rows, _write_rows, _write_seal

    rows = _read_rows(out / "results.csv")
    for r in rows:
        if r[0] == "fs-sil" and float(r[1]) == 9.0:
            r[3] = str(int(r[3]) * 2)
    _write_rows(out / "results.csv", rows)
    _write_seal(out / "results.csv", _cell_digests(rows))
    redrawn = run_cyto(*args)
    assert redrawn.returncode == 0, redrawn.stderr
    assert "fs-sil WR 9 were drawn with other abnormal cells than this sweep's" in redrawn.stdout
    back = _read_rows(out / "results.csv")
    assert {r[3] for r in back if r[0] == "fs-sil" and float(r[1]) == 9.0} == {str(n_wr9)}
    # the record's counts written otherwise ("9.0", strings) are the same counts
    record = json.loads((out / "sweep.json").read_text())
    counts = record["counts"]
    record["counts"] = {f"{float(w):.1f}": [str(a), str(b)] for w, (a, b) in counts.items()}
    (out / "sweep.json").write_text(json.dumps(record))
    same = run_cyto(*args)
    assert same.returncode == 0, same.stderr
    record["counts"] = counts
    (out / "sweep.json").write_text(json.dumps(record))

    # a sweep of an earlier cyto, whose record holds no counts (its WR was twice a positive
    # bag's), is not continued under this rule: its rows are at other witness rates
    record = (out / "sweep.json").read_text()
    spec = json.loads(record)
    assert set(spec.pop("counts")) == {"9", "5"}
    (out / "sweep.json").write_text(json.dumps(spec))
    older = run_cyto(*args)
    assert older.returncode != 0 and "other abnormal cells per witness rate" in older.stderr
    assert "(none recorded (an earlier cyto's sweep" in older.stderr, older.stderr
    assert (out / "results.csv").read_text().count("\n") == len(lines)
    (out / "sweep.json").write_text(record)

    # a second sweep into a folder in use is refused (exit 3) and changes nothing
    before = (out / "results.csv").read_bytes()
    with OutputLock(out):
        busy = run_cyto(*args)
    assert busy.returncode == 3 and "being written by another cyto eval sweep" in busy.stderr
    assert (out / "results.csv").read_bytes() == before
