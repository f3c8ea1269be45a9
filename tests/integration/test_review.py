"""`cyto review`: the review folder (pooled, blinded), the server's rules, the marks store and the
report against hand-made marks. The browser itself is driven in test_review_browser.py."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from cyto.data.synth.slide import SlideSynthConfig, write_slide
from cyto.errors import ConfigError, CytoWarning, InputPathError, OutputBusyError
from cyto.infer import ScoreOptions, score_slide
from cyto.locks import OutputLock
from cyto.review.session import build_session, open_session
from cyto.review.store import MarkStore
from cyto.seal import seal_outputs
from cyto.view.folder import replaced_words
from tests.cli_runner import run_cyto
from tests.raw_http import raw_get

K = 30


@pytest.fixture(scope="module")
def scored(exported_dsvdd, exported_bundles, tmp_path_factory):
    """Two slides with planted abnormal cells, each scored by two models (Deep SVDD and FS-SIL)
    with ground truth: OUT_model/SLIDE/ as cyto score writes a cohort."""
    root = tmp_path_factory.mktemp("review")
    slides = [
        write_slide(
            root / f"slide{i}.ndpi",
            SlideSynthConfig(width=1024, height=1024, n_cells=110, abnormal_fraction=0.1, seed=i),
        )
        for i in range(2)
    ]
    outs = {}
    for name, model in (("dsvdd", exported_dsvdd), ("fs-sil", exported_bundles["fs-sil"])):
        outs[name] = root / f"out_{name}"
        for s in slides:
            score_slide(
                s.paths[0],
                model,
                outs[name] / s.paths[0].stem,
                ScoreOptions(mosaic=0, workers=0, top_k=K, truth=s.ground_truth),
                echo=lambda _: None,
            )
    names = {"dsvdd": exported_dsvdd.stem, "fs-sil": exported_bundles["fs-sil"].stem}
    return {"root": root, "slides": slides, "outs": outs, "names": names, "dsvdd": exported_dsvdd}


@pytest.fixture(scope="module")
def session(scored):
    return build_session(
        [scored["outs"]["dsvdd"], scored["outs"]["fs-sil"]],
        scored["root"] / "review",
        k=K,
        seed=0,  # reviewers' case orders below are checked for this seed
        echo=lambda _: None,
    )


def _top(folder, k):
    t = pq.read_table(folder / "scores.parquet", columns=["cell_id", "rank"]).to_pydict()
    return {c for c, r in zip(t["cell_id"], t["rank"], strict=True) if r <= k}


def test_pooled_cases_are_the_union_of_each_models_top_k_shown_once(scored, session):
    assert len(session.cases) == 2
    by_slide = {v["slide"]: (case, v) for case, v in session.key["cases"].items()}
    for s in scored["slides"]:
        case, info = by_slide[str(s.paths[0])]
        tops = {
            scored["names"][m]: _top(scored["outs"][m] / s.paths[0].stem, K)
            for m in ("dsvdd", "fs-sil")
        }
        for m in tops:  # every top-K cell of each model is shown, once
            shown = [c["sources"][m]["cell_id"] for c in info["cells"] if m in c["sources"]]
            assert sorted(shown) == sorted(tops[m])
        # both models ran the same detector: a cell in both top-Ks is one grid cell
        a, b = tops.values()
        union = a | b
        assert len(info["cells"]) == len(union) == session.n_cells(case)
        assert len(union) < 2 * K  # the models agree on some cells, so pooling merged them
        both = [c for c in info["cells"] if len(c["sources"]) == 2]
        first = scored["names"]["dsvdd"]
        assert {c["sources"][first]["cell_id"] for c in both} == a & b
        # shuffled: the grid is not in either model's rank order
        ranks = [c["sources"][first]["rank"] for c in info["cells"] if first in c["sources"]]
        assert ranks != sorted(ranks)
        assert all(c["label"] in (0, 1) for c in info["cells"])
        assert (session.root / "crops" / case / f"{len(union) - 1:03d}.png").is_file()


def test_what_the_page_may_know_names_no_slide_and_no_model(scored, session):
    public = (session.root / "cases.json").read_text()
    for word in ("slide0", "slide1", "out_dsvdd", "fs-sil", "rank", "score"):
        assert word not in public
    orders = {session.order_for(r)[0] for r in ("ann", "bob", "cy", "dee", "eve", "fay")}
    assert len(orders) == 2  # each reviewer gets a random slide order
    assert session.order_for("ann") == session.order_for("ann")


def test_a_review_opened_by_a_relative_path_is_held_by_its_absolute_one(
    session, tmp_path, monkeypatch
):
    """``cyto review review/`` said "marks go to review/marks.sqlite" where a built review said
    the absolute path (hostile round 66, 10); a relative root also named another folder once
    the working folder changed."""
    shutil.copytree(session.root, tmp_path / "rv")
    monkeypatch.chdir(tmp_path)
    opened = open_session(Path("rv"))
    monkeypatch.chdir(tmp_path.parent)
    assert opened.root == tmp_path / "rv" and opened.root.is_absolute()


def test_a_review_key_edited_by_hand_is_refused_in_one_line(scored, session, tmp_path):
    """A hostile check (round 3): truth labels edited in key.json raised a reviewer's precision
    in `cyto review report` from 0.40 to 1.00 with no word. The key and the cases are sealed
    when the review is built; an edited one is refused; a folder without a seal is said."""
    from cyto.errors import CytoWarning
    from cyto.review.report import build_report

    copy = tmp_path / "review"
    shutil.copytree(session.root, copy)
    open_session(copy)  # whole: opens quietly
    key = json.loads((copy / "key.json").read_text())
    case = next(iter(key["cases"]))
    for cell in key["cases"][case]["cells"][:5]:
        cell["label"] = 1
    (copy / "key.json").write_text(json.dumps(key, indent=1))
    for call in (lambda: open_session(copy), lambda: build_report(copy)):
        with pytest.raises(InputPathError, match=r"key.json changed since the review was built"):
            call()
    (copy / "seal.json").unlink()
    with pytest.warns(CytoWarning, match="carries no seal"):
        open_session(copy)


def test_the_folder_is_reused_and_refuses_other_scored_folders(scored, session):
    again = build_session(
        [scored["outs"]["fs-sil"], scored["outs"]["dsvdd"]],
        session.root,
        k=K,
        echo=lambda _: None,
    )
    assert again.key["created"] == session.key["created"]
    with pytest.raises(ConfigError, match="review of other scored folders"):
        build_session([scored["outs"]["dsvdd"]], session.root, echo=lambda _: None)
    with pytest.raises(InputPathError, match="no scored slide"):
        build_session([scored["root"] / "review"], scored["root"] / "r2", echo=lambda _: None)
    # one model's ranking of the same slide given twice: which one to show is ambiguous
    dup = scored["root"] / "dup"
    shutil.copytree(scored["outs"]["dsvdd"], dup)
    with pytest.raises(ConfigError, match="copies of one scoring run"):
        build_session([scored["outs"]["dsvdd"], dup], scored["root"] / "r3", echo=lambda _: None)
    for f in dup.iterdir():  # each slide scored again by the same model (another run)
        summary = json.loads((f / "summary.json").read_text())
        summary["seconds"] = float(summary["seconds"]) + 1.0
        (f / "summary.json").write_text(json.dumps(summary))
        seal_outputs(f, summary["outputs"])
    with pytest.raises(ConfigError, match="scored more than once by model"):
        build_session([scored["outs"]["dsvdd"], dup], scored["root"] / "r3", echo=lambda _: None)
    assert not (scored["root"] / "r3").exists()
    # scored again after the review was built: the review holds while the top cells it was
    # cut from are the same, and is refused once they are not
    again_root = scored["root"] / "again"
    shutil.copytree(scored["outs"]["dsvdd"], again_root)
    build_session([again_root], scored["root"] / "r4", k=K, echo=lambda _: None)
    summary = again_root / "slide0" / "summary.json"
    summary.write_text(summary.read_text().replace('"seconds"', '"seconds" ', 1))
    seal_outputs(summary.parent, json.loads(summary.read_text())["outputs"])  # as a run seals
    build_session([again_root], scored["root"] / "r4", k=K, echo=lambda _: None)
    table = pq.read_table(summary.parent / "scores.parquet")
    rank = table["rank"].to_numpy()
    swapped = np.where(rank == 1, 2, np.where(rank == 2, 1, rank))  # its top two ranked otherwise
    table = table.set_column(table.schema.get_field_index("rank"), "rank", pa.array(swapped))
    pq.write_table(table, summary.parent / "scores.parquet")
    seal_outputs(summary.parent, json.loads(summary.read_text())["outputs"])
    with pytest.raises(ConfigError, match=f"scored again .* and the top {K} cells it was cut from"):
        build_session([again_root], scored["root"] / "r4", k=K, echo=lambda _: None)


def test_a_review_holds_while_a_resume_keeps_the_cells_it_was_cut_from(scored, tmp_path):
    """A `--resume` that changed only `--fdr` kept the slide's cells and wrote its outputs
    again, and the blinded review part way through was refused on reopening, "scored again ...
    its cells may differ" (hostile round 77, 1): it holds; a resume ranking the cells
    otherwise (`--rank-by`) changes the cells it was cut from, and is refused."""
    from cyto.cohort.local import score_one
    from cyto.runtime import load_scorer

    folder = tmp_path / "out" / "slide0"
    shutil.copytree(scored["outs"]["dsvdd"] / "slide0", folder)
    slide = scored["slides"][0]
    review = build_session([folder.parent], tmp_path / "r", k=K, echo=lambda _: None)
    opts = ScoreOptions(mosaic=0, workers=0, top_k=K, truth=slide.ground_truth, resume=True)
    scorer, said = load_scorer(scored["dsvdd"]), []
    done = score_one(
        slide.paths[0], folder, scorer, replace(opts, fdr_alpha=0.2), said.append, None
    )
    assert done["cells_this_run"] == 0, said  # its cells kept, its outputs written again
    again = build_session([folder.parent], review.root, k=K, echo=lambda _: None)
    assert again.key["created"] == review.key["created"]
    assert replaced_words([folder]) == []  # nothing to say: the review holds
    # ranked otherwise: said by the run that did it, from Python and from the CLI (it was said
    # first when the review was reopened: hostile round 77)
    import cyto

    changed = "was written again under the open review .* cells its cases were cut from changed"
    kw = {"mosaic": 0, "workers": 0, "top_k": K, "truth": slide.ground_truth, "resume": True}
    with pytest.warns(CytoWarning, match=changed):
        cyto.score_slide(slide.paths[0], scorer, folder, echo=None, rank_by="morphometry", **kw)
    assert json.loads((folder / "summary.json").read_text())["cells_this_run"] == 0
    args = ("score", str(slide.paths[0]), "--model", str(scored["dsvdd"]), "--out")
    args += (str(folder.parent), "--resume", "--workers", "0", "--mosaic", "0", "--top-k", str(K))
    proc = run_cyto(*args, "--truth", str(slide.ground_truth), "--rank-by", "model+morphometry")
    said_cli = proc.stdout + proc.stderr
    assert proc.returncode == 0 and str(review.root) in said_cli, said_cli
    assert re.search(f"warning: {folder} {changed}", said_cli), said_cli
    with pytest.raises(ConfigError, match="cells it was cut from changed"):
        build_session([folder.parent], review.root, k=K, echo=lambda _: None)


def test_the_marks_log_is_append_only(tmp_path):
    store = MarkStore(tmp_path)
    store.mark("ann", "case-001", 3, True, "malignant")
    store.mark("ann", "case-001", 3, False)
    store.mark("ann", "case-001", 4, True)
    assert store.marks("ann") == {("ann", "case-001", 4): (True, "")}
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("UPDATE events SET value = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store._db.execute("DELETE FROM events")
    store.close()
    rows = sqlite3.connect(tmp_path / "marks.sqlite").execute("SELECT COUNT(*) FROM events")
    assert rows.fetchone()[0] == 3


# --- the server, in process -------------------------------------------------------------------


def _client(session, reviewer, token="t0k"):
    from starlette.testclient import TestClient

    from cyto.review.server import make_app

    return TestClient(make_app(session, reviewer, token), base_url="http://127.0.0.1:8765")


def _mark(client, case, pos, marked=True, detail="", **headers):
    h = {"X-Cyto-Token": "t0k", "Origin": "http://127.0.0.1:8765", **headers}
    return client.post(
        "/api/mark",
        json={"case": case, "position": pos, "marked": marked, "detail": detail},
        headers=h,
    )


def test_server_serves_only_the_review_and_refuses_foreign_writes(tmp_path, session):
    s = build_session(
        [session.root.parent / "out_dsvdd"], tmp_path / "rv", k=K, echo=lambda _: None
    )
    case = s.order_for("ann")[0]
    with _client(s, "ann") as c:
        page = c.get("/")
        assert page.status_code == 200 and 'content="t0k"' in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert c.get("/static/review.js").status_code == 200
        img = c.get(f"/crops/{case}/0.png")
        assert img.status_code == 200 and img.content[:4] == b"\x89PNG"
        assert c.get(f"/crops/{case}/{s.n_cells(case)}.png").status_code == 404
        assert c.get("/crops/case-999/0.png").status_code == 404
        for path in (
            "/key.json",
            "/cases.json",
            "/marks.sqlite",
            "/static/../key.json",
            "/static/%2e%2e/session.py",
            "/static/..%2f..%2fkey.json",
            f"/crops/{case}/..%2f..%2fkey.json",
            "/crops/..%2fkey.json/0.png",
            "/static//etc/passwd",
        ):
            r = c.get(path)
            assert r.status_code == 404, path
            assert b'"slide"' not in r.content
        assert c.get("/api/session").json()["cases"][0]["case"] == case
        # writes: the token, JSON and this origin are all needed
        assert _mark(c, case, 0, **{"X-Cyto-Token": "nope"}).status_code == 403
        assert _mark(c, case, 0, Origin="http://evil.example").status_code == 403
        form = c.post(
            "/api/mark",
            content="case=x",
            headers={"X-Cyto-Token": "t0k", "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert form.status_code == 415
        assert _mark(c, case, 10_000).status_code == 400
        assert _mark(c, "case-999", 0).status_code == 400
        assert _mark(c, case, 0, detail="<script>").status_code == 400
        assert c.get("/api/session", headers={"Host": "evil.example"}).status_code == 400
        assert MarkStore(s.root).marks() == {}
        ok = _mark(c, case, 2, detail="atypical")
        assert ok.status_code == 200 and ok.json()["marks"] == {
            "2": {"marked": True, "detail": "atypical"}
        }
        assert c.post(
            "/api/done", json={"case": case, "done": True}, headers={"X-Cyto-Token": "t0k"}
        ).json()["done"]
    # a new server (a restart) shows ann's marks to ann and nothing to bob
    with _client(s, "ann") as c:
        assert c.get(f"/api/cases/{case}").json()["marks"] == {
            "2": {"marked": True, "detail": "atypical"}
        }
        info = {x["case"]: x for x in c.get("/api/session").json()["cases"]}
        assert info[case]["marked"] == 1 and info[case]["done"]
    with _client(s, "bob") as c:
        assert c.get(f"/api/cases/{case}").json()["marks"] == {}
        assert all(
            x["marked"] == 0 and not x["done"] for x in c.get("/api/session").json()["cases"]
        )


def test_context_view_reads_the_slide(session):
    case = session.case_ids()[0]
    with _client(session, "ctx") as c:
        r = c.get(f"/context/{case}/1.png")
        assert r.status_code == 200 and r.content[:4] == b"\x89PNG"
        assert len(list((session.root / "context" / case).glob("001-*.png"))) == 1


def test_a_context_view_is_never_read_from_another_slide_at_its_place(session, scored):
    """Hostile round 37 (1): a slide replaced at its path (rescanned under its name) gave the
    reviewer a context view of the other slide around the crop being marked, and its cached
    image was served on after the right file was back."""
    case = session.case_ids()[0]
    slide = Path(session.key["cases"][case]["slide"])
    other = next(p for p in scored["root"].glob("slide*.ndpi") if p.resolve() != slide.resolve())
    kept = slide.read_bytes()
    with _client(session, "ctx2") as c:
        right = c.get(f"/context/{case}/2.png")
        assert right.status_code == 200
        try:
            slide.write_bytes(other.read_bytes())
            for pos in (2, 3):  # a view cached from the right slide, and one never read
                r = c.get(f"/context/{case}/{pos}.png")
                assert r.status_code == 409, (pos, r.status_code)
                assert "is not the slide it was scored as" in r.json()["error"], r.json()
        finally:
            slide.write_bytes(kept)
        assert not list((session.root / "context" / case).glob("003-*.png"))
        again = c.get(f"/context/{case}/2.png")
        assert again.status_code == 200 and again.content == right.content
        moved = slide.with_name(f"{slide.name}.moved")
        try:  # a slide moved away (or deleted): one line, never a server error (round 38, 1)
            slide.rename(moved)
            gone = c.get(f"/context/{case}/2.png")
            assert gone.status_code == 404, gone.status_code
            assert gone.json()["error"].startswith("the slide cannot be read for a context view")
        finally:
            moved.rename(slide)


# --- the report -------------------------------------------------------------------------------


def test_report_against_hand_made_marks(tmp_path, session):
    from sklearn.metrics import cohen_kappa_score

    from cyto.review.report import write_report

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*"))
    s = open_session(rv)
    c1, c2 = s.case_ids()
    ann, bob = {c1: {0, 1, 2, 3}, c2: {5}}, {c1: {2, 3, 4}, c2: set()}
    store = MarkStore(rv)
    for who, marks in (("ann", ann), ("bob", bob)):
        for case, positions in marks.items():
            for p in positions:
                store.mark(who, case, p, True)
    store.mark("bob", c1, 9, True)
    store.mark("bob", c1, 9, False)  # cleared again: not a mark
    store.set_done("ann", c1, True)
    store.close()

    rep = write_report(rv, include_unfinished=True)  # bob finished nothing, ann one case
    table = {(r["case"], r["model"]): r for r in rep["expert_table"]}
    pooled = table[(c1, "pooled")]
    assert pooled["marks"] == "(4, 3)" and pooled["both"] == 2 and pooled["either"] == 5
    assert table[(c2, "pooled")]["marks"] == "(1, 0)"
    cells = s.key["cases"][c1]["cells"]
    for model in s.key["cases"][c1]["models"]:
        model = model["model"]
        mine = {p for p in range(len(cells)) if model in cells[p]["sources"]}
        row = table[(c1, model)]
        assert row["cells_shown"] == len(mine)
        assert (row["marks_ann"], row["marks_bob"]) == (len(ann[c1] & mine), len(bob[c1] & mine))
        assert row["both"] == len(ann[c1] & bob[c1] & mine)
    totals = {t["model"]: t for t in rep["totals"]}
    assert totals["pooled"]["marks"] == "(5, 3)"
    # kappa over every cell shown, against scikit-learn's
    flat = [[p in m[c] for c in (c1, c2) for p in range(s.n_cells(c))] for m in (ann, bob)]
    (k,) = rep["kappa"]
    assert k["kappa"] == pytest.approx(cohen_kappa_score(*flat))
    assert k["cells"] == s.n_cells(c1) + s.n_cells(c2)
    assert rep["progress"]["ann"]["cases_done"] == 1 and rep["progress"]["bob"]["cases_done"] == 0
    # precision and recall against the planted truth
    labels = np.array([c["label"] for c in cells])
    pr = {e["case"]: e for e in rep["truth"]["per_slide"]}[c1]["ann"]
    tp = int(sum(labels[p] == 1 for p in ann[c1]))
    assert pr["true_abnormal_marked"] == tp
    assert pr["precision"] == pytest.approx(tp / 4)
    if labels.sum():
        assert pr["recall_of_shown"] == pytest.approx(tp / labels.sum())
    out = rv / "report"
    assert (out / "expert_table.csv").is_file() and (out / "figures" / f"{c1}.png").is_file()
    # the paper's Table 4 layout: a row per slide, a column per model, tuples per reviewer
    md = (out / "expert_table.md").read_text()
    layout = md[md.index("## In the paper's Table 4 layout") :]
    first_model = s.key["cases"][c1]["models"][0]["model"]
    row = table[(c1, first_model)]
    assert f"{row['marks']} of {row['cells_shown']}" in layout
    assert "| malignant 2 | (25, 93) | (18, 63) | (2, 65) | (2, 47) |" in layout
    assert json.loads((out / "report.json").read_text())["kappa"][0]["kappa"] == k["kappa"]


def test_a_report_stopped_halfway_leaves_the_last_report_whole(tmp_path, session, monkeypatch):
    """Ctrl-C while the figures are drawn: the report folder keeps the last report's files, as
    they were, and nothing half made beside them."""
    from cyto.review import report as report_mod

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*"))
    c1, _ = open_session(rv).case_ids()
    store = MarkStore(rv)
    store.mark("ann", c1, 0, True)
    store.close()
    report_mod.write_report(rv)
    out = rv / "report"
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    store = MarkStore(rv)
    store.mark("ann", c1, 1, True)  # the next report differs in its table
    store.close()
    real, drawn = report_mod.review_figure, []

    def stopped(*args, **kwargs):
        if drawn:
            raise KeyboardInterrupt
        drawn.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(report_mod, "review_figure", stopped)
    with pytest.raises(KeyboardInterrupt):
        report_mod.write_report(rv)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in rv.iterdir() if p.name.startswith(".report")] == []
    monkeypatch.setattr(report_mod, "review_figure", real)
    # a run killed outright (SIGKILL: no finally) left its half-made folder: the next run,
    # holding the report's lock, clears it
    killed = rv / ".report.partial-k1ll3d"
    (killed / "figures").mkdir(parents=True)
    (killed / "expert_table.csv").write_text("half")
    rep = report_mod.write_report(rv)
    assert {r["case"]: r for r in rep["expert_table"]}[c1]["marks"] == "(2)"
    assert [p.name for p in rv.iterdir() if p.name.startswith(".report")] == []
    assert not (out / ".lock").exists()
    # a second report into a folder being written is refused, and changes nothing
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with OutputLock(out), pytest.raises(OutputBusyError, match="another cyto review report"):
        report_mod.write_report(rv)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_report_cli_and_its_errors(tmp_path, session):
    proc = run_cyto("review", "report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    shutil.copytree(session.root, empty, ignore=shutil.ignore_patterns("marks.sqlite*"))
    proc = run_cyto("review", "report", str(empty))
    assert proc.returncode == 2 and "no marks yet" in proc.stderr
    proc = run_cyto("review", str(session.root), "--reviewer", "../../etc")
    assert proc.returncode == 2 and "reviewer name" in proc.stderr
    proc = run_cyto("review", str(tmp_path / "missing"), "--reviewer", "ann")
    assert proc.returncode == 2 and "missing does not exist (give the output" in proc.stderr


# --- a real browser against real servers --------------------------------------------------------


class Server:
    """``cyto review REVIEW --reviewer NAME --port 0`` in a subprocess; ``url`` once it listens
    (``wait=False``: started, and ``url`` set by :meth:`wait`, so that its start-up overlaps the
    test's own)."""

    def __init__(self, review, reviewer, wait=True):
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cyto",
                "review",
                str(review),
                "--reviewer",
                reviewer,
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "CYTO_PROGRESS": "0"},
        )
        self.url = self._address() if wait else None

    def wait(self):
        self.url = self._address()
        return self

    def _address(self, timeout=60.0):
        import queue
        import threading

        lines: queue.Queue = queue.Queue()

        def pump():  # also keeps the pipe drained while the server runs
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        seen = []
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                line = None
            if line is None:
                self.proc.kill()
                raise AssertionError("the review server did not start: " + "".join(seen))
            seen.append(line)
            if line.startswith("open http://"):
                return line.split()[1]

    def kill(self):
        self.proc.kill()  # SIGKILL: no shutdown handler runs
        self.proc.wait()


@pytest.mark.browser
def test_review_in_a_real_browser(session, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from tests.conftest import CHROMIUM

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*", "context"))
    s = open_session(rv)
    first, second = s.order_for("ann")
    # bob's server starts now, beside ann's and the browser, and is used from its turn below
    servers = [Server(rv, "ann"), Server(rv, "bob", wait=False)]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            # wide enough for the review's 10 columns at the crops' size (ArrowDown: +10)
            page = browser.new_page(viewport={"width": 2000, "height": 1000})
            page.goto(servers[0].url)
            cells = page.locator("#grid .cell")
            expect(cells).to_have_count(s.n_cells(first))
            expect(page.locator("#case-title")).to_contain_text(first)
            # by click, then by keyboard
            cells.nth(0).click()
            expect(page.locator("#saved")).to_have_text("saved")
            page.keyboard.press("ArrowRight")
            page.keyboard.press("Space")
            page.keyboard.press("ArrowDown")
            page.keyboard.press("1")  # malignant
            marked = page.locator("#grid .cell.marked")
            expect(marked).to_have_count(3)
            expect(cells.nth(11).locator(".detail")).to_have_text("M")
            page.keyboard.press("Space")  # toggles cell 11 off again
            expect(marked).to_have_count(2)
            page.keyboard.press("1")
            expect(marked).to_have_count(3)
            # the context view from the slide
            page.keyboard.press("c")
            expect(page.locator("#context")).to_be_visible()
            img = page.locator("#context-img")
            for _ in range(200):  # the page's CSP forbids wait_for_function's eval
                if img.evaluate("i => i.complete && i.naturalWidth") > 0:
                    break
                page.wait_for_timeout(100)
            assert img.evaluate("i => i.naturalWidth") > 0
            page.keyboard.press("Escape")
            expect(page.locator("#context")).to_be_hidden()
            page.keyboard.press("d")
            expect(page.locator("#done")).to_have_class("is-done")
            page.keyboard.press("n")
            expect(page.locator("#case-title")).to_contain_text(second)
            cells.nth(5).click()
            expect(marked).to_have_count(1)
            expect(page.locator("#overall-progress")).to_have_text("1/2 cases done")

            # reload: the reviewer continues at the first case not done, marks kept
            page.reload()
            expect(page.locator("#case-title")).to_contain_text(second)
            expect(marked).to_have_count(1)
            page.keyboard.press("p")
            expect(page.locator("#case-title")).to_contain_text(first)
            expect(marked).to_have_count(3)

            # kill the server mid-review (SIGKILL), start it again: the marks are intact
            servers[0].kill()
            servers[0] = Server(rv, "ann")
            page.goto(servers[0].url)
            expect(page.locator("#case-title")).to_contain_text(second)
            expect(marked).to_have_count(1)
            page.keyboard.press("p")
            expect(marked).to_have_count(3)
            expect(page.locator("#done")).to_have_class("is-done")

            # a second reviewer, at the same time, sees none of ann's marks, and ann none of bob's
            bob = browser.new_page()
            servers[1].wait()
            bob.goto(servers[1].url)
            expect(bob.locator("#grid .cell")).to_have_count(s.n_cells(s.order_for("bob")[0]))
            expect(bob.locator("#grid .cell.marked")).to_have_count(0)
            expect(bob.locator("#overall-progress")).to_have_text("0/2 cases done")
            bob.locator("#grid .cell").nth(7).click()
            expect(bob.locator("#grid .cell.marked")).to_have_count(1)
            page.reload()
            expect(marked).to_have_count(1)  # ann's second case: still only her mark

            # a page from another origin can neither write with JSON (no CORS) nor without token
            evil = browser.new_page()
            evil.route(
                "http://evil.test/", lambda r: r.fulfill(body="<p>hi</p>", content_type="text/html")
            )
            evil.goto("http://evil.test/")
            target = servers[0].url + "api/mark"
            body = json.dumps({"case": first, "position": 20, "marked": True})
            err = evil.evaluate(
                """async ([url, body]) => {
                    try {
                        await fetch(url, {method: "POST", body,
                            headers: {"Content-Type": "application/json", "X-Cyto-Token": "x"}});
                        return "sent";
                    } catch (e) { return "blocked"; }
                }""",
                [target, body],
            )
            assert err == "blocked"
            evil.evaluate(
                """async ([url, body]) => {  // refused by the server, or by Chromium's
                    try {                      // private-network rules before it gets there
                        await fetch(url, {method: "POST", mode: "no-cors", body,
                                          headers: {"Content-Type": "text/plain"}});
                    } catch (e) {}
                }""",
                [target, body],
            )
            browser.close()
        # traversal with the path sent as written, against the real server
        for path in ("/static/../key.json", "/static/..%2f..%2fkey.json", "/crops/../key.json"):
            status, data = raw_get(servers[0].url, path)
            assert status == 404 and b"slide_identity" not in data, path
    finally:
        for srv in servers:
            srv.kill()
    store = MarkStore(rv)
    ann = store.marks("ann")
    assert sorted(pos for (_, c, pos) in ann if c == first) == [0, 1, 11]
    assert ann[("ann", first, 11)] == (True, "malignant")
    assert sorted(pos for (_, c, pos) in ann if c == second) == [5]
    assert list(store.marks("bob")) == [("bob", s.order_for("bob")[0], 7)]
    assert store.done() == {("ann", first)}
    store.close()


# --- cyto refine ------------------------------------------------------------------------------


def _untrained(monkeypatch):
    """``cyto.train.api.train`` replaced by a recorder of what refine asks of it (its keyword
    arguments; ``overrides``: the config refine resolved), which trains nothing: for the refines
    whose test is what refine decides (the cells, the rate, the warm start), once one real
    refine has shown that train records that config in the bundle it writes."""
    import types

    import cyto.train.api

    asked: list[dict] = []

    def record(method, data, out, **kwargs):
        asked.append({"method": method, "data": data, "out": out, **kwargs})
        return types.SimpleNamespace(bundle=Path(out), seconds=0.0)

    monkeypatch.setattr(cyto.train.api, "train", record)
    return asked


def test_refine_learns_from_finished_cases_only(
    session, synth_patches, exported_bundles, tmp_path, monkeypatch
):
    from cyto.bundle import load_bundle
    from cyto.review.refine import refine

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*", "context"))
    s, model = _reviewed_model(rv)
    c1, c2 = s.case_ids()
    store = MarkStore(rv)
    store.mark("ann", c2, 0, True)
    store.close()
    args = dict(normal="normal", device="cpu", echo=lambda _: None)
    with pytest.raises(ConfigError, match="no case is marked done"):
        refine(model, rv, synth_patches, tmp_path / "r0.cyto", **args)
    store = MarkStore(rv)
    for p in (0, 1):
        store.mark("ann", c1, p, True, "malignant" if p else "")
    store.mark("bob", c1, 1, True)
    store.mark("bob", c1, 2, True, "artifact")  # an artifact is neither normal nor abnormal
    store.set_done("ann", c1, True)
    store.set_done("bob", c1, True)
    store.close()
    res = res_r1 = refine(
        model, rv, synth_patches, tmp_path / "r1.cyto", overrides=["epochs=1"], **args
    )
    n1 = s.n_cells(c1)
    assert (res["hard_normals"], res["known_abnormal"], res["excluded"]) == (n1 - 3, 2, 1)
    assert [c["case"] for c in res["cases"]] == [c1]  # c2's mark: the case is not finished
    b = load_bundle(tmp_path / "r1.cyto", weights=False)
    assert b.manifest["refined_from"]["known_abnormal"] == 2
    # Deep SVDD is fine-tuned unless asked otherwise: the mode that held on fresh seeds
    assert res["finetune"] and b.manifest["config"]["warm_start"] == str(Path(model).resolve())
    assert b.manifest["config"]["known_abnormal_eta"] == 1.0
    info = run_cyto("info", str(tmp_path / "r1.cyto"))
    assert f"+{n1 - 3} hard normal, +2 known abnormal" in info.stdout
    n_normal = sum(1 for _ in (synth_patches / "normal").iterdir())
    # a one-class model keeps to DATA's normal class: its abnormal classes are not taken up now
    assert b.manifest["training_data"]["n_images"] == n_normal + n1 - 3 + 2
    rows = (tmp_path / "r1.cyto.refine" / "train.csv").read_text().splitlines()
    assert len(rows) == 1 + n_normal + n1 - 3 + 2
    assert sum(r.endswith(",review-marked") for r in rows) == 2
    # a second refine into that OUT while one runs is refused, and leaves its cells alone
    work = tmp_path / "r1.cyto.refine"
    with OutputLock(work), pytest.raises(OutputBusyError, match="another cyto refine"):
        refine(model, rv, synth_patches, tmp_path / "r1.cyto", overwrite=True, **args)
    assert (work / "train.csv").read_text().splitlines() == rows
    assert len(list((work / "cells").iterdir())) == n1 - 3 + 2
    # from here to r5, what refine decides is read from what it asks train for, untrained (r1
    # trained for real, and its bundle records the config refine gave it)
    with monkeypatch.context() as stubbed:
        asked = _untrained(stubbed)
        # --agree all: only the cell both finished reviewers marked
        res = refine(model, rv, synth_patches, tmp_path / "r2.cyto", agree="all",
                     overrides=["epochs=1"], **args)  # fmt: skip
        assert (res["known_abnormal"], res["excluded"]) == (1, 2)
        assert [a["out"] for a in asked] == [tmp_path / "r2.cyto"]
        r2_rows = (tmp_path / "r2.cyto.refine" / "train.csv").read_text().splitlines()
        assert len(r2_rows) == 1 + n_normal + n1 - 3 + 1
        with pytest.raises(ConfigError, match="bag labels"):
            refine(exported_bundles["ws-sil"], rv, synth_patches, tmp_path / "r3.cyto", **args)
        # a model whose top-K was not reviewed learns nothing from this review (issue 56)
        with pytest.raises(ConfigError, match="^--marks .* another model's top-K cells"):
            refine(exported_bundles["droc"], rv, synth_patches, tmp_path / "r4.cyto", **args)
        # --no-hard-normals: the marked cells alone join the training normals
        ko = refine(model, rv, synth_patches, tmp_path / "ko.cyto", hard_normals=False,
                    overrides=["epochs=1", "ae_epochs=0"], **args)  # fmt: skip
        assert (ko["hard_normals"], ko["hard_normals_left_out"], ko["known_abnormal"]) == (
            0,
            n1 - 3,
            2,
        )
        rows = (tmp_path / "ko.cyto.refine" / "train.csv").read_text().splitlines()
        assert len(rows) == 1 + n_normal + 2
        with pytest.raises(ConfigError, match="nothing to learn"):
            refine(exported_bundles["droc"], rv, synth_patches, tmp_path / "r6.cyto",
                   hard_normals=False, **args)  # fmt: skip
        # fine-tuning: the model's own encoders and centres, continued at a tenth of its rate (r1:
        # the default refine, fine-tuned for one epoch)
        base = load_bundle(Path(model))
        ft = res_r1
        tuned = load_bundle(Path(ft["bundle"]))
        assert ft["finetune"] and tuned.manifest["config"]["warm_start"] == str(
            Path(model).resolve()
        )
        assert tuned.manifest["config"]["lr"] == pytest.approx(base.manifest["config"]["lr"] / 10)
        np.testing.assert_array_equal(tuned.scorer["centres"], base.scorer["centres"])
        for name, state in base.weights.items():  # one epoch moved the weights, a little
            keys = [k for k, v in state.items() if v.is_floating_point() and "running" not in k]
            w0 = torch.cat([state[k].flatten() for k in keys])
            w1 = torch.cat([tuned.weights[name][k].flatten() for k in keys])
            assert 0 < float((w1 - w0).norm() / w0.norm()) < 0.05, name
        # a second round goes on at the same tenth; --retrain starts anew, at the first rate
        ft2 = refine(ft["bundle"], rv, synth_patches, tmp_path / "ft2.cyto", overrides=["epochs=1"],
                     **args)  # fmt: skip
        assert asked[-1]["out"] == tmp_path / "ft2.cyto" and ft2["finetune"]
        c2 = asked[-1]["overrides"]
        assert c2["warm_start"] == str(Path(ft["bundle"]).resolve())
        assert c2["lr"] == pytest.approx(tuned.manifest["config"]["lr"])
        anew = refine(ft["bundle"], rv, synth_patches, tmp_path / "anew.cyto", finetune=False,
                      overrides=["epochs=1", "ae_epochs=0"], **args)  # fmt: skip
        assert asked[-1]["out"] == tmp_path / "anew.cyto"
        c3 = asked[-1]["overrides"]
        assert not anew["finetune"] and c3["warm_start"] == ""
        assert c3["lr"] == pytest.approx(base.manifest["config"]["lr"])
        with pytest.raises(ConfigError, match="continues a Deep SVDD model"):
            refine(exported_bundles["fs-sil"], rv, synth_patches, tmp_path / "r4.cyto",
                   finetune=True, **args)  # fmt: skip
        # an fs-sil bundle of an earlier cyto recorded the one-class settings, which fs-sil now
        # refuses (hostile round 39, 5): refine leaves them out of the config it replays
        from cyto.bundle import _write_manifest

        old = tmp_path / "old-fs-sil.cyto"
        shutil.copytree(exported_bundles["fs-sil"], old)
        recorded = load_bundle(old, weights=False).manifest
        recorded["config"] |= {"holdout": 0.2, "refit": True}
        _write_manifest(old, recorded, seal=True)
        refine(old, rv, synth_patches, tmp_path / "r7.cyto", overrides=["epochs=1"], **args)
        assert asked[-1]["method"] == "fs-sil"
        assert not {"holdout", "refit"} & set(asked[-1]["overrides"])
    with pytest.raises(ConfigError, match="warm_start .* this config needs dsvdd"):
        refine(model, rv, synth_patches, tmp_path / "r5.cyto", finetune=True,
               overrides=["n_seeds=3"], **args)  # fmt: skip
    proc = run_cyto(
        "refine",
        str(model),
        "--marks",
        str(rv),
        "--data",
        str(synth_patches),
        "--out",
        str(tmp_path / "r1.cyto"),
        "--normal",
        "normal",
        "--no-hard-normals",
    )
    assert proc.returncode == 2 and "exists" in proc.stderr


# --- cyto data cells ---------------------------------------------------------------------------


def test_data_cells_cuts_the_cells_of_negative_slides_into_a_training_folder(
    scored, exported_dsvdd, tmp_path
):
    from cyto.data.dataset import load_records
    from cyto.slides import open_slide

    neg = write_slide(
        tmp_path / "neg.ndpi",
        SlideSynthConfig(width=1024, height=1024, n_cells=110, abnormal_fraction=0.0, seed=5),
    )
    out = tmp_path / "scored_neg"
    score_slide(neg.paths[0], exported_dsvdd, out, ScoreOptions(mosaic=0, workers=0, top_k=K),
                echo=lambda _: None)  # fmt: skip
    detected = pq.read_table(out / "scores.parquet").to_pydict()
    crop = json.loads((out / "summary.json").read_text())["resolution"]["crop_px_level0"]
    ds = tmp_path / "ds"
    proc = run_cyto("data", "cells", str(out), "--out", str(ds), "--per-slide", "20")
    assert proc.returncode == 0, proc.stderr
    with open(ds / "cells-normal.csv") as fh:
        rows = list(csv.DictReader(fh))
    files = sorted((ds / "normal").iterdir())
    assert len(rows) == len(files) == 20
    umask = os.umask(0)
    os.umask(umask)  # readable by the others as any folder made here (mkdtemp's 0700 was not)
    assert (ds / "normal").stat().st_mode & 0o777 == 0o777 & ~umask
    assert {r["cell_id"] for r in rows} <= {str(c) for c in detected["cell_id"]}
    # each file is the square the model saw about the detected cell
    r = rows[0]
    reader = open_slide(neg.paths[0])
    want = reader.read_region(round(float(r["x"])) - crop // 2, round(float(r["y"])) - crop // 2,
                              crop, crop)  # fmt: skip
    reader.close()
    got = np.asarray(Image.open(r["path"]).convert("RGB"))
    assert got.shape == (crop, crop, 3) and np.array_equal(got, want)
    # cyto train reads the folder (and the manifest) as normal cells
    assert {rec.cls for rec in load_records(ds)} == {"normal"}
    assert len(load_records(ds / "cells-normal.csv")) == 20
    # all cells by default; an existing class folder is kept unless --overwrite
    again = run_cyto("data", "cells", str(out), "--out", str(ds))
    assert again.returncode == 2 and "exists" in again.stderr
    assert len(list((ds / "normal").iterdir())) == 20
    # a second run into a folder being written is refused and changes nothing
    with OutputLock(ds):
        busy = run_cyto("data", "cells", str(out), "--out", str(ds), "--overwrite")
    assert busy.returncode == 3 and "another cyto data cells" in busy.stderr, busy.stderr
    assert len(list((ds / "normal").iterdir())) == 20
    killed = ds / ".normal.partial-k1ll3d"  # what a run killed outright (SIGKILL) left
    killed.mkdir()
    (killed / "000_neg_1.png").write_bytes(b"half")
    proc = run_cyto("data", "cells", str(out), "--out", str(ds), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert len(list((ds / "normal").iterdir())) == len(detected["cell_id"])
    assert not [p for p in ds.iterdir() if p.name.startswith(".")]  # nothing half-written
    # a slide with planted abnormal cells is not a negative slide
    bad = run_cyto("data", "cells", str(scored["outs"]["dsvdd"]), "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "negative slides only" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = run_cyto("data", "cells", str(out), "--out", str(tmp_path / "y"), "--per-slide", "0")
    assert bad.returncode == 2 and "--per-slide" in bad.stderr


def test_calibrate_refuses_the_slides_a_model_was_trained_on(exported_dsvdd, tmp_path):
    """A hostile check (round 2): `cyto data cells` from a negative slide, `cyto train` on those
    cells, then `cyto calibrate` on that very slide's scores was accepted: the model has seen
    those cells, so the null is too low and negative slides are called "excess" too often."""
    from cyto.data.dataset import PatchDataset, source_slides
    from cyto.train.api import train

    neg = write_slide(
        tmp_path / "neg.ndpi",
        SlideSynthConfig(width=1024, height=1024, n_cells=110, abnormal_fraction=0.0, seed=6),
    )
    opts = ScoreOptions(mosaic=0, workers=0, top_k=K, backend="torch", device="cpu")
    first = tmp_path / "first"
    score_slide(neg.paths[0], exported_dsvdd, first, opts, echo=lambda _: None)
    identity = json.loads((first / "summary.json").read_text())["slide_identity"]
    ds = tmp_path / "ds"
    assert run_cyto("data", "cells", str(first), "--out", str(ds)).returncode == 0
    shutil.move(ds, tmp_path / "moved")  # a dataset folder moved keeps its slides
    ds = tmp_path / "moved"
    assert source_slides(ds, PatchDataset.from_path(ds, normal="normal").records) == [identity]
    model = tmp_path / "own.cyto"
    tiny = {"backbone": "smallcnn", "input_size": 32, "batch_size": 16, "epochs": 2,
            "ae_epochs": 1, "n_seeds": 1, "embedding_dim": 16}  # fmt: skip
    train("dsvdd", ds, model, normal="normal", overrides=tiny, device="cpu")
    assert json.loads((model / "manifest.json").read_text())["training_data"]["slides"] == [
        identity
    ]
    again = tmp_path / "again"
    said: list[str] = []
    score_slide(neg.paths[0], model, again, opts, echo=said.append)
    # scored with the model its cells trained: said (hostile round 9, N23: no word)
    warned = [m for m in said if "training cells were cut from" in m]
    assert len(warned) == 1 and warned[0].startswith("warning: neg.ndpi is one of"), said
    assert json.loads((again / "summary.json").read_text())["burden"]["training_slide"] is True
    proc = run_cyto("calibrate", str(model), str(again / "scores.parquet"))
    assert proc.returncode == 2 and "its cells trained this model" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (model / "calibration.npz").exists()


def _rank_guesses(public: dict) -> dict[str, list[int]]:
    """An attacker's best guess of each grid position's rank from what the page can read (the
    case sizes, a seed if one is public, cyto's code): the order cyto drew cells in before,
    with the public seed or the old default 0. Position p shows rank guess[p] + 1."""
    rng = np.random.default_rng(int(public.get("seed", 0)))
    rng.permutation(len(public["cases"]))
    return {c["case"]: list(rng.permutation(int(c["n"]))) for c in public["cases"]}


@pytest.mark.parametrize("models", [["dsvdd"], ["dsvdd", "fs-sil"]])
def test_no_grid_position_tells_its_rank(scored, tmp_path, models):
    """With the public default seed 0, position 59 was rank 1 in every one-model review, and
    pooled ranks followed positions at 0.9999 (issue 35). The seed is now secret and the pooled
    order forgets ranks: from everything the page can read, the guess is no better than chance."""
    from scipy.stats import spearmanr

    session = build_session(
        [scored["outs"][m] for m in models], tmp_path / "r", k=K, echo=lambda _: None
    )
    public = json.loads((session.root / "cases.json").read_text())
    assert "seed" not in public
    guesses = _rank_guesses(public)
    hits, guessed, true = 0, [], []
    for case, info in session.key["cases"].items():
        first = scored["names"][models[0]]
        for cell in info["cells"]:
            if first not in cell["sources"]:
                continue
            guess = int(guesses[case][cell["position"]]) + 1
            rank = cell["sources"][first]["rank"]
            hits += guess == rank
            guessed.append(guess)
            true.append(rank)
    # before: every guess right (one model), or rank correlation 0.9999 (two pooled). By chance:
    # about one right guess per case, and |rho| of ~60 pairs above 0.6 once in ~10^5 reviews
    assert len(true) >= 2 * K - 2
    assert hits <= len(true) // 4, hits
    assert abs(spearmanr(guessed, true)[0]) < 0.6
    # positions against ranks directly (a page that shows cells in pooled order would leak it)
    positions = [c["position"] for i in session.key["cases"].values() for c in i["cells"]
                 if scored["names"][models[0]] in c["sources"]]  # fmt: skip
    assert abs(spearmanr(positions, true)[0]) < 0.6


def test_reopening_a_review_keeps_its_settings_or_refuses_others(scored, session):
    """Reopening with another --k or --seed was silently ignored (issue 35)."""
    again = build_session(
        [scored["outs"]["dsvdd"], scored["outs"]["fs-sil"]], session.root, echo=lambda _: None,
        k=K,
    )  # fmt: skip
    assert again.seed == session.seed
    # reopened without --k or --merge-um: the session's own, never "--k 30 -> 100"
    plain = build_session(
        [scored["outs"]["dsvdd"], scored["outs"]["fs-sil"]], session.root, echo=lambda _: None
    )
    assert plain.key["k"] == K and plain.seed == session.seed
    for other in ({"k": K + 1}, {"k": K, "seed": session.seed + 1}, {"k": K, "merge_um": 9.0}):
        with pytest.raises(ConfigError, match="built with other settings") as refused:
            build_session(
                [scored["outs"]["dsvdd"], scored["outs"]["fs-sil"]], session.root,
                echo=lambda _: None, **other,
            )  # fmt: skip
        # the review's secret seed is never printed (with it anyone rebuilds the key: issue 56)
        assert not re.search(r"--seed \d|has \d", str(refused.value)), refused.value
        if "seed" in other:
            assert "--seed differs" in str(refused.value)


def test_a_review_opened_from_another_folder_finds_the_slide(exported_dsvdd, tmp_path, monkeypatch):
    """summary.json held the slide's path relative to where cyto score ran, so cyto review from
    another folder failed or served a broken context view (issue 35). Summaries now hold it
    absolute, and older relative ones are found from the scored folder's parents."""
    from cyto.review.session import context_image

    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "elsewhere").mkdir()
    write_slide(work / "s.ndpi", SlideSynthConfig(width=1024, height=1024, n_cells=60, seed=3))
    monkeypatch.chdir(work)
    summary = score_slide(
        Path("s.ndpi"), exported_dsvdd, Path("out/s"), ScoreOptions(mosaic=0, workers=0, top_k=8)
    )
    assert summary["slide"] == str(work / "s.ndpi")
    monkeypatch.chdir(tmp_path / "elsewhere")
    review = build_session([work / "out"], tmp_path / "r1", k=8, echo=lambda _: None)
    crop = int(review.key["cases"]["case-001"]["crop_px"])
    assert context_image(review, "case-001", 0).size == (4 * crop, 4 * crop)  # full size
    # an older summary: the path as given, relative to the folder cyto score ran in
    old = work / "out" / "s" / "summary.json"
    old.write_text(old.read_text().replace(str(work / "s.ndpi"), "s.ndpi"))
    seal_outputs(old.parent, json.loads(old.read_text())["outputs"])  # as that run sealed it
    review = build_session([work / "out"], tmp_path / "r2", k=8, echo=lambda _: None)
    assert review.key["cases"]["case-001"]["slide"] == str(work / "s.ndpi")


def test_the_report_counts_labels_apart_and_artifacts_are_not_suspicious(tmp_path, session):
    """Cells marked only as artifacts counted as suspicious in the table, kappa and precision,
    and no label appeared in any report file (issue 35)."""
    from cyto.review.report import write_report

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*"))
    c1 = open_session(rv).case_ids()[0]
    store = MarkStore(rv)
    store.mark("ann", c1, 0, True, "malignant")
    store.mark("ann", c1, 1, True, "atypical")
    store.mark("ann", c1, 2, True, "artifact")
    store.mark("ann", c1, 3, True)
    store.mark("bob", c1, 2, True, "artifact")
    store.mark("bob", c1, 0, True, "malignant")
    store.close()
    rep = write_report(rv)
    pooled = {(r["case"], r["model"]): r for r in rep["expert_table"]}[(c1, "pooled")]
    assert pooled["marks"] == "(3, 1)" and pooled["both"] == 1  # the artifact cell is not one
    assert rep["progress"]["ann"]["labels"] == {
        "malignant": 1, "atypical": 1, "artifact": 1, "no label": 1
    }  # fmt: skip
    assert rep["progress"]["bob"]["labels"]["artifact"] == 1
    assert "artifact" in rep["suspicious"]
    md = (rv / "report" / "expert_table.md").read_text()
    assert "ann: malignant 1, atypical 1, artifact 1, no label 1" in md and "artifact" in md
    saved = json.loads((rv / "report" / "report.json").read_text())
    assert saved["progress"]["bob"]["labels"]["malignant"] == 1


def test_hostile_bodies_names_links_and_options_are_refused_in_one_line(tmp_path, session):
    """Issue 35: deeply nested JSON gave a 500; {"marked": "false"} marked the cell; ann, ANN
    and 'ann ' were three reviewers; a crop linked to a system file was served; crops had no
    Cross-Origin-Resource-Policy; --port 70000 and a corrupt scores.parquet gave tracebacks; a
    bad --host said to pass another --port."""
    from cyto.errors import ConfigError
    from cyto.review.server import bind, check_reviewer

    s = build_session(
        [session.root.parent / "out_dsvdd"], tmp_path / "rv", k=K, echo=lambda _: None
    )
    case = s.order_for("ann")[0]
    with _client(s, "ann") as c:
        h = {"X-Cyto-Token": "t0k", "Content-Type": "application/json"}
        deep = c.post("/api/mark", content="[" * 30_000 + "]" * 30_000, headers=h)
        assert deep.status_code == 400, deep.text
        for value in ("false", "true", 1, None):
            r = _mark(c, case, 0, marked=value)
            assert r.status_code == 400 and "true or false" in r.text, (value, r.text)
        done = c.post("/api/done", json={"case": case, "done": "no"}, headers=h)
        assert done.status_code == 400
        assert MarkStore(s.root).marks() == {}
        img = c.get(f"/crops/{case}/0.png")
        assert img.headers["cross-origin-resource-policy"] == "same-origin"
        crop = s.crop_path(case, 1)
        crop.unlink()
        crop.symlink_to("/etc/hostname" if Path("/etc/hostname").exists() else "/etc/passwd")
        assert c.get(f"/crops/{case}/1.png").status_code == 404
    # one reviewer however the name is typed; letters beyond ASCII are names too
    assert check_reviewer("ann") == check_reviewer("ANN") == check_reviewer(" ann  ") == "ann"
    assert check_reviewer("Zoë") == "zoë" and check_reviewer("O'Brien") == "o'brien"
    with pytest.raises(ConfigError, match="reviewer name"):
        check_reviewer("../x")
    with _client(s, "ANN ") as c:
        assert _mark(c, case, 3).status_code == 200
    assert {who for who, _, _ in MarkStore(s.root).marks()} == {"ann"}
    with pytest.raises(ConfigError, match="--port must be between 0"):
        bind("127.0.0.1", 70000)
    with pytest.raises(ConfigError, match="not an address of this computer.*--host"):
        bind("203.0.113.7", 0)
    bad = tmp_path / "bad"
    shutil.copytree(session.root.parent / "out_dsvdd", bad)
    (bad / "slide0" / "scores.parquet").write_bytes(b"PAR1 not a table")
    proc = run_cyto("review", str(bad), "--reviewer", "ann", "--session", str(tmp_path / "r9"))
    assert (
        proc.returncode == 2 and "changed since they were written (scores.parquet)" in proc.stderr
    )
    # sealed as it is (a table cyto wrote that does not read back): refused as a table
    seal_outputs(
        bad / "slide0", json.loads((bad / "slide0" / "summary.json").read_text())["outputs"]
    )
    proc = run_cyto("review", str(bad), "--reviewer", "ann", "--session", str(tmp_path / "r9"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be read as a cyto score table" in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1


def test_unfinished_cases_are_named_and_left_out_of_agreement(tmp_path, session):
    """A reviewer who had not finished entered kappa and precision with every unmarked cell
    taken as normal (issue 35). Such cases are named, and left out unless asked."""
    from cyto.review.report import write_report

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*"))
    s = open_session(rv)
    c1, c2 = s.case_ids()
    store = MarkStore(rv)
    for p in (0, 1, 2):
        store.mark("ann", c1, p, True)
    store.mark("ann", c2, 0, True)
    store.mark("bob", c1, 1, True)
    store.mark("bob", c2, 5, True)  # bob is still on c2
    store.set_done("ann", c1, True)
    store.set_done("ann", c2, True)
    store.set_done("bob", c1, True)
    store.close()
    rep = write_report(rv)
    assert rep["unfinished"] == {"ann": [], "bob": [c2]}
    rows = {(r["case"], r["model"]): r for r in rep["expert_table"]}
    assert rows[(c2, "pooled")]["unfinished"] == "bob" and rows[(c1, "pooled")]["unfinished"] == ""
    (k,) = rep["kappa"]
    assert k["cases"] == 1 and k["cells"] == s.n_cells(c1)  # c1 only: both finished it
    # the truth of c2 (its abnormal cells) is withheld while bob is at it (hostile round 8:
    # a report made during a review drew the true abnormal cells on the reviewer's own grid)
    assert rep["truth_withheld"] == [c2]
    truth = {e["case"]: e for e in rep["truth"]["per_slide"]}
    assert set(truth) == {c1} and truth[c1]["both"] is not None
    assert rep["truth"]["overall"] is None  # not every case's truth can be counted yet
    assert all("abnormal_shown" not in r for r in rep["expert_table"] if r["case"] == c2)
    assert all("abnormal_shown" in r for r in rep["expert_table"] if r["case"] == c1)
    green = np.array([46, 125, 50])

    def framed(case: str, root: Path) -> bool:
        from PIL import Image

        img = np.asarray(Image.open(root / "figures" / f"{case}.png").convert("RGB"))
        return bool(np.all(img == green, axis=-1).sum() > 100)

    assert not framed(c2, rv / "report")
    labels_c1 = [c["label"] for c in s.key["cases"][c1]["cells"]]
    assert framed(c1, rv / "report") == (1 in labels_c1)
    md = (rv / "report" / "expert_table.md").read_text()
    assert "unfinished" in md and "left out of that reviewer's kappa" in md
    counted = write_report(rv, tmp_path / "all", include_unfinished=True)
    assert counted["kappa"][0]["cases"] == 2 and counted["truth_withheld"] == []
    assert counted["truth"]["overall"]["bob"]["marked"] == 2
    labels_c2 = [c["label"] for c in s.key["cases"][c2]["cells"]]
    assert framed(c2, tmp_path / "all") == (1 in labels_c2)
    proc = run_cyto("review", "report", str(rv))
    assert proc.returncode == 0 and f"bob has not finished 1 case(s) ({c2})" in proc.stdout
    assert f"note: 1 case(s) a reviewer has not finished ({c2}): its marks so far" in proc.stdout
    assert "its slide and truth withheld" in proc.stdout
    # nor which slide the open case is (hostile round 9, N1: "case-003 | s1.tif")
    assert rep["withheld"] == [c2]
    slide_c2 = Path(s.key["cases"][c2]["slide"]).name
    assert all(r["slide"].startswith("(withheld") for r in rep["expert_table"] if r["case"] == c2)
    assert slide_c2 not in json.dumps([r for r in rep["expert_table"] if r["case"] == c2])
    assert any(slide_c2 in r["slide"] for r in counted["expert_table"] if r["case"] == c2)


def test_beyond_this_computer_the_page_needs_its_access_key(session, tmp_path):
    """A non-loopback --host accepted any Host and served the page (and its token) to whoever
    could reach it (issue 35). There, every request needs the key printed in the address."""
    from starlette.testclient import TestClient

    from cyto.review.server import make_app

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*"))
    review = open_session(rv)

    def app():  # one server per client (a server closes its marks log when it stops)
        return make_app(review, "ann", "t0k", hosts=("*",), access_key="s3cret")

    case = session.order_for("ann")[0]
    base = "http://192.0.2.10:8765"
    with TestClient(app(), base_url=base) as stranger:
        for path in ("/", "/api/session", f"/crops/{case}/0.png", "/static/review.js", "/?key=no"):
            r = stranger.get(path)
            assert r.status_code == 401 and "t0k" not in r.text, path
        assert _mark(stranger, case, 0, Origin=base).status_code == 401
    with TestClient(app(), base_url=base) as reviewer:
        page = reviewer.get("/?key=s3cret")
        assert page.status_code == 200 and 'content="t0k"' in page.text
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert reviewer.get("/api/session").status_code == 200  # the cookie carries the key
        assert reviewer.get(f"/crops/{case}/0.png").status_code == 200
        assert _mark(reviewer, case, 0, Origin=base).status_code == 200


@pytest.mark.browser
def test_the_grid_fills_the_window_and_marks_the_judged_cell(session, tmp_path):
    """Cells were 74 px (1440x900) and 54 px (1280x720), 0.39x of a 192 px crop, with 45% of the
    width empty, and nothing showed which of a crop's nuclei is judged (issue 35). At each window
    size the cells are at least the crop's size and the grid fills the width; a ring marks the
    centre, x hides and shows it, and arrow keys follow the columns shown."""
    from playwright.sync_api import expect, sync_playwright

    from tests.conftest import CHROMIUM

    rv = tmp_path / "rv"
    shutil.copytree(session.root, rv, ignore=shutil.ignore_patterns("marks.sqlite*", "context"))
    s = open_session(rv)
    first = s.order_for("ann")[0]
    crop = int(s.key["cases"][first]["crop_px"])
    server = Server(rv, "ann")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for width, height in ((1280, 720), (1440, 900), (1920, 1080)):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(server.url)
                cells = page.locator("#grid .cell")
                expect(cells).to_have_count(s.n_cells(first))
                box = cells.nth(0).bounding_box()
                grid = page.locator("#grid").bounding_box()
                assert box["width"] >= crop and abs(box["width"] - box["height"]) < 2, (width, box)
                assert grid["width"] >= 0.95 * (width - 28), (width, grid)
                cols = round((grid["width"] + 4) / (box["width"] + 4))
                ring = "e => getComputedStyle(e, '::before').content"
                assert cells.nth(0).evaluate(ring) != "none"
                page.keyboard.press("x")
                assert cells.nth(0).evaluate(ring) == "none"
                page.keyboard.press("x")
                assert cells.nth(0).evaluate(ring) != "none"
                # the cursor moves down one row of the columns shown
                cells.nth(0).click()
                page.keyboard.press("ArrowDown")
                page.keyboard.press("Space")
                expect(page.locator("#grid .cell.marked")).to_have_count(2)
                expect(cells.nth(cols)).to_have_class(re.compile(r"\bmarked\b"))
                cells.nth(0).click()
                cells.nth(cols).click()  # clear both again for the next window size
                expect(page.locator("#grid .cell.marked")).to_have_count(0)
                # the larger view: the cell at 1:1 and its surroundings at full size
                page.keyboard.press("c")
                one, ctx = page.locator("#cell-img"), page.locator("#context-img")
                for _ in range(200):  # the page's CSP forbids wait_for_function's eval
                    if ctx.evaluate("i => i.complete && i.naturalWidth") > 0:
                        break
                    page.wait_for_timeout(100)
                assert one.evaluate("i => i.naturalWidth") == crop
                assert abs(one.bounding_box()["width"] - crop) < 1
                assert ctx.evaluate("i => i.naturalWidth") == 4 * crop
                shown = ctx.bounding_box()["width"]
                assert shown >= min(4 * crop, 0.9 * height - 60) - 2, (width, shown)
                page.keyboard.press("Escape")
                page.close()
            browser.close()
    finally:
        server.kill()


# --- a review folder is what was built: its crops, its marks, its slide (hostile round 5) -----


def _reviewed_model(rv):
    """The review at ``rv``, opened, and the model its cases were cut from (its first case's
    first run)."""
    s = open_session(rv)
    folder = s.key["cases"][s.case_ids()[0]]["models"][0]["folder"]
    return s, json.loads((Path(folder) / "summary.json").read_text())["model"]


def _copy_review(session, to):
    shutil.copytree(session.root, to, ignore=shutil.ignore_patterns("marks.sqlite*", "report"))
    return to


def test_a_crop_swapped_added_or_removed_is_refused_in_one_line(session, tmp_path, monkeypatch):
    """A hostile check (round 5, WS 2.8): five crops of one case overwritten with another
    case's crop were served to the expert, who marked cells other than those the key unblinds
    the marks to. Every crop is sealed when the review is built; serve, report and refine
    refuse a changed, missing or added one in one line naming it."""
    from cyto.review.report import build_report

    rv = _copy_review(session, tmp_path / "rv")
    s = open_session(rv)  # whole: opens quietly
    c1, c2 = s.case_ids()
    client = _client(s, "ann")
    assert client.get(f"/crops/{c2}/0.png").status_code == 200
    good = (rv / "crops" / c2 / "000.png").read_bytes()
    (rv / "crops" / c2 / "000.png").write_bytes((rv / "crops" / c1 / "001.png").read_bytes())
    # swapped while a page is open: the server checks the file it serves
    got = client.get(f"/crops/{c2}/0.png")
    assert got.status_code == 409 and "changed since the review was built" in got.text
    want = rf"^{re.escape(str(rv))}: crops/{c2}/000.png changed since the review was built.*"
    want += "build the review again into a new folder"
    for call in (lambda: open_session(rv), lambda: build_report(rv)):
        with pytest.raises(InputPathError, match=want):
            call()
    served = []
    monkeypatch.setattr("cyto.review.server.serve", lambda *a, **k: served.append(a))
    for args in (("review", "serve", str(rv), "--reviewer", "ann"), ("review", "report", str(rv))):
        proc = run_cyto(*args)
        assert proc.returncode == 2 and f"crops/{c2}/000.png changed" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert served == []
    (rv / "crops" / c2 / "000.png").write_bytes(good)
    open_session(rv)
    (rv / "crops" / c2 / "999.png").write_bytes(good)  # added
    with pytest.raises(InputPathError, match=rf"crops/{c2}/999.png was added since"):
        open_session(rv)
    (rv / "crops" / c2 / "999.png").unlink()
    (rv / "crops" / c1 / "002.png").unlink()  # removed
    with pytest.raises(InputPathError, match=rf"crops/{c1}/002.png is missing since"):
        open_session(rv)
    (rv / "crops" / c1 / "002.png").symlink_to(rv / "crops" / c1 / "003.png")  # a link
    with pytest.raises(InputPathError, match=rf"crops/{c1}/002.png changed since"):
        open_session(rv)


def test_marks_copied_from_another_review_are_refused_in_one_line(scored, tmp_path):
    """A hostile check (round 5, WS 2.9): a marks.sqlite copied from another review of the same
    slides (another secret order) was reported as this review's, its marks counted against
    other cells. Each review has an id under its seal; its marks log is stamped with it."""
    from cyto.review.report import build_report
    from cyto.view.folder import open_view

    keep = shutil.ignore_patterns("reviews.json", "review")  # no record of earlier reviews
    outs = [tmp_path / "o" / m for m in ("dsvdd", "fs-sil")]
    for out in outs:
        shutil.copytree(scored["outs"][out.name], out, ignore=keep)
    r4 = build_session(outs, tmp_path / "r4", k=5, echo=lambda _: None)
    r5 = build_session(outs, tmp_path / "r5", k=5, echo=lambda _: None)
    store = MarkStore(r4.root)
    for case in r4.case_ids():
        store.mark("ann", case, 0, True)
        store.set_done("ann", case, True)
    store.close()
    build_report(r4.root)  # its own marks: counted
    shutil.copy(r4.root / "marks.sqlite", r5.root / "marks.sqlite")
    want = r"marks.sqlite belongs to another review .*: its marks would be counted against"
    for call in (
        lambda: build_report(r5.root),
        lambda: _client(open_session(r5.root), "zed"),
        lambda: open_view(outs[0]),  # r4 is finished, r5 is not: r4's marks do not finish it
    ):
        with pytest.raises(InputPathError, match=want):
            call()
    proc = run_cyto("review", "report", str(r5.root))
    assert proc.returncode == 2 and "belongs to another review" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # marks without any review's id (a log made elsewhere) are not taken as this review's
    bare = tmp_path / "bare"
    bare.mkdir()
    store = MarkStore(bare)
    store.mark("ann", r5.case_ids()[0], 0, True)
    store.close()
    shutil.copy(bare / "marks.sqlite", r5.root / "marks.sqlite")
    with pytest.raises(InputPathError, match="marks.sqlite carries no review id"):
        build_report(r5.root)
    (r5.root / "marks.sqlite").unlink()  # moved away: the review's marks start anew
    store = MarkStore(r5.root)
    store.mark("zed", r5.case_ids()[0], 1, True)
    store.close()
    assert {who for who, _, _ in MarkStore(r5.root).marks()} == {"zed"}


def test_a_slide_under_review_is_blinded_whichever_model_scored_it(scored, tmp_path):
    """A hostile check (round 5, WS 4.5): with a review of one model's top cells of a slide
    unfinished, cyto view showed the same slide scored by another model, every cell ranked.
    The registry blinds the slide itself."""
    from cyto.view.folder import open_view

    def copy(model, slide):
        to = tmp_path / model / slide
        keep = shutil.ignore_patterns("reviews.json", "review")  # no record of earlier reviews
        shutil.copytree(scored["outs"][model] / slide, to, ignore=keep)
        return to

    reviewed, other = copy("dsvdd", "slide0"), copy("fs-sil", "slide0")
    other_slide = copy("fs-sil", "slide1")
    rv = (tmp_path / "far" / "rv").resolve()
    build_session([reviewed], rv, k=5, echo=lambda _: None)
    for folder in (reviewed, other):
        with pytest.raises(
            ConfigError, match=rf"^{re.escape(str(rv))} is a blinded review.*--unblind"
        ):
            open_view(folder)
    proc = run_cyto("view", str(other))
    assert proc.returncode != 0 and str(rv) in proc.stderr and "--unblind" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert len(open_view(other, unblind=True)) == 1
    assert len(open_view(other_slide)) == 1  # another slide is not under review


def test_a_review_that_failed_to_build_blinds_nothing(scored, tmp_path, monkeypatch):
    """Hostile round 47, 4: a review whose build failed on a full disk (its folder never made)
    stayed recorded in its slides' folders and cyto's registry: `cyto view` of them was refused
    ("a blinded review ... that has no key yet") and every later scoring said it waited for it,
    for good unless the same --session was built again. A build that makes no review takes its
    record back; one that did is kept (the test above)."""
    import errno

    import cyto.review.session as session_mod
    from cyto.view.folder import open_view

    folder = tmp_path / "slide0"
    keep = shutil.ignore_patterns("reviews.json", "review")
    shutil.copytree(scored["outs"]["dsvdd"] / "slide0", folder, ignore=keep)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(session_mod, "_write_crops", full)
    rv = tmp_path / "rv"
    with pytest.raises(OSError):
        session_mod.build_session([folder], rv, k=5, echo=lambda _: None)
    monkeypatch.undo()
    assert not rv.exists()
    assert session_mod.recorded_reviews(folder) == []
    # the registry is by slide: this module's other reviews of slide0 stay in it
    assert rv.absolute() not in session_mod.registered_reviews(folder)
    try:  # not blinded by a review that never was (another, real one may blind it)
        open_view(folder)
    except ConfigError as exc:
        assert str(rv) not in str(exc), exc


def test_a_second_page_of_one_reviewer_is_refused_in_one_line(session):
    """Hostile round 6 (N59): two `cyto review` pages of one reviewer on one review started
    without a word; each kept its own view and the last mark won. One page per reviewer."""
    from cyto.locks import OutputLock

    with OutputLock(session.root / ".reviewer-ann"):
        proc = run_cyto("review", str(session.root), "--reviewer", "ANN ", "--port", "0")
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip()
    assert "cyto review page of reviewer 'ann'" in line and "use the page already open" in line
    assert "\n" not in line


def test_the_note_on_an_unfinished_case_says_what_the_report_shows_of_it(tmp_path, session):
    """Hostile round 10, N22: with case-002 unfinished the note said its slide "is left out of
    the table and the figures" while the table held its rows and its figure was drawn. The rule:
    an unfinished case shows its marks so far (rows, figure); its slide and truth are withheld."""
    from cyto.review.report import write_report

    rv = _copy_review(session, tmp_path / "rv")
    s = open_session(rv)
    c1, c2 = s.case_ids()
    store = MarkStore(rv)
    store.mark("ann", c1, 0, True)
    store.mark("ann", c2, 3, True)
    store.set_done("ann", c1, True)  # c2 left open
    store.close()
    proc = run_cyto("review", "report", str(rv))
    assert proc.returncode == 0, proc.stderr
    (note,) = [ln for ln in proc.stdout.splitlines() if c2 in ln and "withheld" in ln]
    assert note == (
        f"note: 1 case(s) a reviewer has not finished ({c2}): its marks so far are in the table "
        "and the figures, its slide and truth withheld (naming them would unblind the "
        "reviewer); --include-unfinished shows them"
    )
    # what the note says, the files hold: c2's rows with its mark, its figure, no slide name
    with open(rv / "report" / "expert_table.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["case"] == c2]
    assert rows and {r["marks"] for r in rows if r["model"] == "pooled"} == {"(1)"}
    assert (rv / "report" / "figures" / f"{c2}.png").is_file()
    slide_c2 = Path(s.key["cases"][c2]["slide"]).name
    assert all(slide_c2 not in r["slide"] and not r.get("abnormal_shown") for r in rows)
    md = (rv / "report" / "expert_table.md").read_text()
    assert f"({c2}): its marks so far are in the table" in md
    rep = write_report(rv, tmp_path / "py")  # the library says it in the same words
    assert rep["withheld_note"] == note.removeprefix("note: ")
    # two cases open: both keep their rows in the paper's layout too (one withheld name each)
    store = MarkStore(rv)
    store.set_done("ann", c1, False)
    store.close()
    rep = write_report(rv, tmp_path / "two")
    assert rep["withheld_note"].startswith(
        f"2 case(s) a reviewer has not finished ({c1}, {c2}): their marks so far are in the table"
    )
    md = (tmp_path / "two" / "expert_table.md").read_text()
    layout = md[md.index("In the paper's Table 4 layout") : md.index("The paper's Table 4 (its")]
    assert sum(ln.startswith("| (withheld") for ln in layout.splitlines()) == 2


def test_refine_names_the_cases_and_marks_it_does_not_use(
    session, synth_patches, tmp_path, monkeypatch
):
    """Hostile round 10, N21: refine said "1 finished case(s): 99 hard normal(s), 1 known
    abnormal cell(s), 0 left out" while a whole unfinished case was ignored, never named. The
    line names what it does not use, and each count left out says what it counts."""
    import cyto.train.api
    from cyto.review.refine import refine

    rv = _copy_review(session, tmp_path / "rv")
    s, model = _reviewed_model(rv)
    c1, c2 = s.case_ids()
    store = MarkStore(rv)
    store.mark("ann", c1, 0, True)
    store.mark("ann", c1, 1, True, "malignant")
    store.mark("bob", c1, 1, True)
    store.mark("bob", c1, 2, True, "artifact")
    store.mark("carol", c1, 5, True)  # carol is still on c1
    store.mark("ann", c2, 0, True)  # nobody has finished c2
    store.set_done("ann", c1, True)
    store.set_done("bob", c1, True)
    store.close()
    n1 = s.n_cells(c1)
    with monkeypatch.context() as stubbed:  # the line is said before training: none is run
        asked = _untrained(stubbed)
        proc = run_cyto(
            "refine", str(model), "--marks", str(rv), "--data", str(synth_patches),
            "--out", str(tmp_path / "r.cyto"), "--normal", "normal", "--device", "cpu",
            "--set", "epochs=1", "--set", "ae_epochs=0",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [a["out"] for a in asked] == [tmp_path / "r.cyto"]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("refine ")]
    assert line == (
        f"refine dsvdd: 1 finished case(s) ({c1}): {n1 - 3} hard normal(s), 2 known abnormal "
        "cell(s), 1 cell(s) marked artifact only left out; 1 unfinished case(s) "
        f"({c2}) not used: finish it in cyto review serve to use its marks; carol's marks on "
        f"{c1} not used: carol has not finished it"
    )

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(cyto.train.api, "train", stop)
    said = []
    with pytest.raises(Stop):  # --agree all: a cell one reviewer marked is left out, counted
        refine(model, rv, synth_patches, tmp_path / "r2.cyto", normal="normal", agree="all",
               device="cpu", echo=said.append)  # fmt: skip
    assert said[-1].startswith(
        f"refine dsvdd: 1 finished case(s) ({c1}): {n1 - 3} hard normal(s), 1 known abnormal "
        "cell(s), 1 cell(s) marked artifact only left out, 1 cell(s) marked by some reviewers "
        f"only left out (--agree all); 1 unfinished case(s) ({c2}) not used"
    )


def test_a_report_never_goes_into_the_reviews_sealed_parts(tmp_path, session):
    """Hostile round 13, #14: `cyto review report R --out R/crops --overwrite` wrote the report
    into the review's sealed crops, and the review then refused itself, marks and all. The
    report goes to R/report or outside the review; elsewhere inside it is refused."""
    rv = _copy_review(session, tmp_path / "rv")
    c1, _ = open_session(rv).case_ids()
    store = MarkStore(rv)
    store.mark("ann", c1, 0, True)
    store.close()
    before = {p: p.read_bytes() for p in (rv / "crops").rglob("*") if p.is_file()}
    for inside in (rv / "crops", rv, rv / "crops" / "x"):
        proc = run_cyto("review", "report", str(rv), "--out", str(inside), "--overwrite")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"lies inside the review {rv.resolve()}, whose crops and key are sealed" in (
            proc.stderr
        )
    assert {p: p.read_bytes() for p in (rv / "crops").rglob("*") if p.is_file()} == before
    ok = run_cyto("review", "report", str(rv), "--out", str(rv / "report" / "again"))
    assert ok.returncode == 0, ok.stderr
    assert run_cyto("review", "report", str(rv), "--out", str(tmp_path / "outside")).returncode == 0


def test_a_cases_line_names_the_models_whose_top_k_it_holds(scored, tmp_path):
    """ "case-001: 100 cells from pap" read as a stain, where "pap" was the model's name (hostile
    round 58, 11)."""
    said: list[str] = []
    build_session([scored["outs"]["dsvdd"]], tmp_path / "one", k=K, seed=0, echo=said.append)
    name = scored["names"]["dsvdd"]
    assert any(re.match(rf"case-001: \d+ cells, the top {K} of {name}'s ranking$", x) for x in said)
    said.clear()
    build_session(
        [scored["outs"]["dsvdd"], scored["outs"]["fs-sil"]], tmp_path / "two", k=K, seed=0,
        echo=said.append,
    )  # fmt: skip
    models = f"each: {name}'s ranking, {scored['names']['fs-sil']}'s ranking"
    assert any(x.endswith(f"the top {K} of {models}") for x in said), said
    # cells ranked by their morphometry were said to be "the top 100 of dsvdd's ranking"
    # (hostile round 66, 7)
    slide = scored["slides"][0]
    by_morph = tmp_path / "morph" / slide.paths[0].stem
    score_slide(slide.paths[0], scored["dsvdd"], by_morph,
                ScoreOptions(mosaic=0, workers=0, top_k=K, rank_by="morphometry"),
                echo=lambda _: None)  # fmt: skip
    said.clear()
    build_session([tmp_path / "morph"], tmp_path / "three", k=K, seed=0, echo=said.append)
    assert any(x.endswith(f"the top {K} of {name}'s ranking by morphometry") for x in said), said
