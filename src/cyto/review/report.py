"""``cyto review report``: unblind the marks with the key.

Writes, into ``REVIEW_DIR/report/``:

- ``expert_table.csv`` / ``.md``: the paper's Table 4: per slide and model, the cells of that
  model's top-K that were shown, the marks of each reviewer on them as a tuple, marked by all
  (both) and by any (either) reviewer; a pooled row per slide (every cell shown) and totals per
  model;
- ``report.json``: the same, Cohen's kappa between each pair of reviewers (over every cell
  shown), each reviewer's progress, and, where the slides were scored with ground truth, the
  precision and recall of each reviewer's marks (and of both/either);
- ``figures/CASE.png``: the paper's review figure: the grid as the reviewers saw it, one stroke
  per reviewer on the cells they marked (``/`` for the first, ``\\`` for the second: a cross where
  both marked), and a green frame on truly abnormal cells when truth is known.
"""

from __future__ import annotations

import csv
import os
import shutil
from itertools import combinations
from pathlib import Path

import numpy as np

from cyto.bundle import clear_temp_dirs_beside, temp_dir_beside
from cyto.errors import ConfigError
from cyto.locks import OutputLock
from cyto.review.session import CROPS, Session, open_session
from cyto.review.store import MarkStore
from cyto.tables import json_text

POOLED = "pooled"
STROKE_COLOURS = ((215, 38, 61), (27, 118, 209), (255, 160, 0), (140, 60, 200))


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's kappa of two binary raters; None when chance agreement is 1 (both constant)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if len(a) == 0:
        return None
    po = float(np.mean(a == b))
    pa, pb = float(a.mean()), float(b.mean())
    pe = pa * pb + (1 - pa) * (1 - pb)
    if pe >= 1.0:
        return None
    return (po - pe) / (1 - pe)


# what the expert table, kappa and precision count: a mark labelled malignant, atypical or not
# labelled at all; a cell marked only as an artifact is neither normal nor abnormal (as refine)
SUSPICIOUS = "marked cells except those labelled artifact (labelled malignant, atypical, or none)"
LABELS = ("malignant", "atypical", "artifact", "no label")


def _marked(
    session: Session, store: MarkStore, reviewers: list[str]
) -> tuple[dict[str, dict], dict[str, dict[str, int]]]:
    """(``{case: {reviewer: bool array of suspicious marks over grid positions}}``,
    ``{reviewer: {label: marks}}`` counting every mark by its label)."""
    out = {c["case"]: {r: np.zeros(int(c["n"]), bool) for r in reviewers} for c in session.cases}
    labels = {r: dict.fromkeys(LABELS, 0) for r in reviewers}
    for (who, case, pos), (_, detail) in store.marks().items():
        m = out.get(case, {}).get(who)
        if m is None or not 0 <= pos < len(m):
            continue
        label = detail if detail in LABELS else "no label"
        labels[who][label] += 1
        if label != "artifact":
            m[pos] = True
    return out, labels


def slide_names(paths: dict[str, str]) -> dict[str, str]:
    """Each case's slide by its file name, or, where two slides share a name, by as many of
    its folders as tell them apart (``a/slide.ndpi``, ``b/slide.ndpi``)."""
    parts = {case: Path(p).parts for case, p in paths.items()}
    names = {}
    for case, mine in parts.items():
        depth = 1
        while depth < len(mine) and any(
            other[-depth:] == mine[-depth:] for c, other in parts.items() if c != case
        ):
            depth += 1
        names[case] = "/".join(mine[-depth:])
    return names


def _pr(marked: np.ndarray, labels: np.ndarray, planted: int | None) -> dict:
    tp = int(np.sum(marked & (labels == 1)))
    shown = int(np.sum(labels == 1))
    out = {
        "marked": int(marked.sum()),
        "true_abnormal_marked": tp,
        "abnormal_shown": shown,
        "precision": tp / int(marked.sum()) if marked.any() else None,
        "recall_of_shown": tp / shown if shown else None,
    }
    if planted:
        out["recall_of_planted"] = tp / planted
    return out


def build_report(
    root: Path, reviewers: list[str] | None = None, include_unfinished: bool = False
) -> dict:
    """Everything the report writes, as a dict (no files).

    A reviewer who has not marked a case done is named in that case's rows (``unfinished``),
    and that case is left out of their agreement (kappa) and of their precision and recall:
    unmarked cells of an unfinished case are not known to be normal. ``include_unfinished``
    counts them all as they stand."""
    session = open_session(root)
    store = MarkStore(session.root, session.session_id)
    try:
        known = store.reviewers()
        if reviewers is None:
            reviewers = known
        unknown = [r for r in reviewers if r not in known]
        if unknown:
            raise ConfigError(
                f"no marks from {', '.join(unknown)} in {root}; reviewers with marks: "
                f"{', '.join(known) or 'none'}"
            )
        if not reviewers:
            raise ConfigError(f"{root} holds no marks yet; review first (cyto review ...)")
        marked, label_counts = _marked(session, store, reviewers)
        done = store.done()
    finally:
        store.close()

    def finished(r: str, case: str) -> bool:
        return include_unfinished or (r, case) in done

    # the truth of a case (its abnormal cells: frames in the figure, counts in the table) is
    # shown only once every reviewer of the session has finished it: a report made while a
    # reviewer is still at it would unblind them, as cyto view would
    withheld = {
        c["case"]
        for c in session.cases
        if not include_unfinished and any((r, c["case"]) not in done for r in known)
    }

    names = slide_names({c: i["slide"] for c, i in session.key["cases"].items()})
    for case in withheld:  # which slide a case is: kept from a reviewer still at it too
        names[case] = "(withheld until every reviewer has finished it)"
    rows, truth_rows, any_truth = [], [], False
    all_labels, all_marks = [], {r: [] for r in reviewers}
    for c in session.cases:
        case = c["case"]
        info = session.key["cases"][case]
        cells = info["cells"]
        labels = np.array(
            [-1 if x["label"] is None else int(x["label"]) for x in cells], dtype=np.int64
        )
        has_truth = len(cells) > 0 and bool(np.all(labels >= 0))
        any_truth = any_truth or has_truth
        models = [m["model"] for m in info["models"]]
        for model in [*models, POOLED]:
            sel = np.array([model == POOLED or model in x["sources"] for x in cells], bool)
            per = [int(marked[case][r][sel].sum()) for r in reviewers]
            stack = np.array([marked[case][r] for r in reviewers])[:, sel]
            row = {
                "case": case,
                "slide": names[case],
                "model": model,
                "cells_shown": int(sel.sum()),
                "marks": "(" + ", ".join(map(str, per)) + ")",
                **{f"marks_{r}": v for r, v in zip(reviewers, per, strict=True)},
                "both": int(stack.all(axis=0).sum()),
                "either": int(stack.any(axis=0).sum()),
                "unfinished": ", ".join(r for r in reviewers if (r, case) not in done),
            }
            if has_truth and case not in withheld:
                row["abnormal_shown"] = int(np.sum(labels[sel] == 1))
            said = _adequacy(info["models"], model)
            if said is not None:  # the slide's adequacy, as the run that scored it judged it
                row["adequacy"] = said
            rows.append(row)
        if has_truth and case not in withheld:
            planted = info.get("planted_abnormal")
            entry = {"case": case, "slide": names[case]}
            for r in reviewers:  # None: this reviewer has not finished the case
                entry[r] = _pr(marked[case][r], labels, planted) if finished(r, case) else None
            stack = np.array([marked[case][r] for r in reviewers])
            every = all(finished(r, case) for r in reviewers)
            entry["both"] = _pr(stack.all(axis=0), labels, planted) if every else None
            entry["either"] = _pr(stack.any(axis=0), labels, planted) if every else None
            truth_rows.append(entry)
        all_labels.append(labels)
        for r in reviewers:
            all_marks[r].append(marked[case][r])

    totals = []
    for model in dict.fromkeys(r["model"] for r in rows):
        sub = [r for r in rows if r["model"] == model]
        per = [sum(r[f"marks_{x}"] for r in sub) for x in reviewers]
        tot = {
            "case": "total",
            "slide": f"{len(sub)} slide(s)",
            "model": model,
            "cells_shown": sum(r["cells_shown"] for r in sub),
            "marks": "(" + ", ".join(map(str, per)) + ")",
            **{f"marks_{x}": v for x, v in zip(reviewers, per, strict=True)},
            "both": sum(r["both"] for r in sub),
            "either": sum(r["either"] for r in sub),
        }
        if all("abnormal_shown" in r for r in sub):
            tot["abnormal_shown"] = sum(r["abnormal_shown"] for r in sub)
        totals.append(tot)

    flat = {
        r: np.concatenate(all_marks[r]) if all_marks[r] else np.zeros(0, bool) for r in reviewers
    }
    ids = [c["case"] for c in session.cases]

    def over(cases_of: list[bool], arrays: list[np.ndarray]) -> np.ndarray:
        kept = [a for a, keep in zip(arrays, cases_of, strict=True) if keep]
        return np.concatenate(kept) if kept else np.zeros(0, arrays[0].dtype if arrays else bool)

    kappa = []
    for a, b in combinations(reviewers, 2):  # over the cases both finished
        both_done = [finished(a, c) and finished(b, c) for c in ids]
        x, y = over(both_done, all_marks[a]), over(both_done, all_marks[b])
        kappa.append(
            {"reviewers": [a, b], "kappa": cohen_kappa(x, y), "cells": len(x),
             "cases": sum(both_done)}
        )  # fmt: skip
    overall = None
    if len(truth_rows) == len(session.cases) and sum(map(len, all_labels)):
        overall = {}
        for r in reviewers:
            mine = [finished(r, c) for c in ids]
            overall[r] = _pr(over(mine, all_marks[r]), over(mine, all_labels), None)
        every = [all(finished(r, c) for r in reviewers) for c in ids]
        stack = np.array([over(every, all_marks[r]) for r in reviewers])
        overall["both"] = _pr(stack.all(axis=0), over(every, all_labels), None)
        overall["either"] = _pr(stack.any(axis=0), over(every, all_labels), None)
    return {
        "review": str(session.root),
        "reviewers": reviewers,
        "withheld_note": withheld_note(sorted(withheld), bool(any_truth)),
        "progress": {
            r: {
                "cases_done": sum((r, c["case"]) in done for c in session.cases),
                "cases": len(session.cases),
                "cells_marked": int(flat[r].sum()),
                "labels": label_counts[r],
            }
            for r in reviewers
        },
        "suspicious": SUSPICIOUS,
        "unfinished": {r: [c for c in ids if (r, c) not in done] for r in reviewers},
        "include_unfinished": include_unfinished,
        # cases whose truth is left out until every reviewer has finished them (blinding)
        "truth_withheld": sorted(withheld) if any_truth else [],
        # cases whose slide is not named until every reviewer has finished them (blinding)
        "withheld": sorted(withheld),
        "expert_table": rows,
        "totals": totals,
        "kappa": kappa,
        "truth": {"per_slide": truth_rows, "overall": overall} if truth_rows else None,
        "_marked": marked,
        "_session": session,
    }


def withheld_note(cases: list[str], truth: bool) -> str | None:
    """What the report shows of the ``cases`` a reviewer has not finished, in one line (None:
    every case is finished). The rule :func:`build_report` keeps: such a case's marks so far are
    in the table and its figure; its slide's name, and its truth where the slides have one, are
    withheld, since either would unblind the reviewer still at it."""
    if not cases:
        return None
    from cyto.flags import passing

    one = len(cases) == 1
    its = "its" if one else "their"
    what = ("slide" if one else "slides") + (" and truth" if truth else "")
    return (
        f"{len(cases)} case(s) a reviewer has not finished ({', '.join(cases)}): {its} marks so "
        f"far are in the table and the figures, {its} {what} withheld (naming them would "
        f"unblind the reviewer); {passing('include_unfinished', True)} shows them"
    )


def _refuse_inside_the_review(root: Path, out: Path) -> None:
    """The report goes to ``REVIEW/report`` or outside the review, never elsewhere inside it:
    written into its sealed ``crops/`` (``--out REVIEW/crops --overwrite``), it made the review
    refuse itself, marks and all (hostile round 13, #14)."""
    from cyto.errors import InputPathError
    from cyto.flags import passing, said

    root, target = root.resolve(), out.resolve()
    own = root / "report"
    inside = target == root or root in target.parents
    if inside and not (target == own or own in target.parents):
        raise InputPathError(
            f"{passing('out', out)} lies inside the review {root}, whose crops and key are "
            f"sealed: an output never goes into its input; leave out {said('out')} (the "
            f"report goes to {own}) or give a folder outside the review"
        )


def write_report(
    root: Path,
    out: Path | None = None,
    reviewers: list[str] | None = None,
    include_unfinished: bool = False,
) -> dict:
    """Unblind ``root`` and write the report files; returns the report (paths included)."""
    root = Path(root)
    out = Path(out) if out is not None else root / "report"
    if out.exists() and not out.is_dir():  # a folder of report files; never a file replaced
        from cyto.errors import InputPathError
        from cyto.flags import passing

        raise InputPathError(
            f"{passing('out', out)} is a file: the report is a folder (expert_table.csv, "
            "report.json, figures/); give a folder"
        )
    _refuse_inside_the_review(root, out)
    report = build_report(root, reviewers, include_unfinished)
    marked, session = report.pop("_marked"), report.pop("_session")
    with OutputLock(out, "cyto review report"):
        # what a killed run (SIGKILL, power loss) left half made: every writer holds the lock
        clear_temp_dirs_beside(out)
        _write_files(report, marked, session, out)
    return report


def _write_files(report: dict, marked: dict, session, out: Path) -> None:
    # every file is made in a folder beside OUT and moved in once all are made: a run stopped
    # halfway (Ctrl-C while the figures are drawn, a full disk) leaves the last report whole,
    # never a new table beside the old figures
    tmp = temp_dir_beside(out)
    try:
        (tmp / "figures").mkdir()
        table = report["expert_table"] + report["totals"]
        fields = list(dict.fromkeys(k for r in table for k in r))
        with open(tmp / "expert_table.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            w.writerows(table)
        (tmp / "expert_table.md").write_text(_markdown(report, fields))
        figures = []
        for c in session.cases:
            name = Path("figures") / f"{c['case']}.png"
            review_figure(
                session,
                c["case"],
                {r: marked[c["case"]][r] for r in report["reviewers"]},
                truth=c["case"] not in report["withheld"],
            ).save(tmp / name)
            figures.append(name)
        report["figures"] = [str(out / f) for f in figures]
        report["files"] = {
            "expert_table_csv": str(out / "expert_table.csv"),
            "expert_table_md": str(out / "expert_table.md"),
            "report_json": str(out / "report.json"),
        }
        (tmp / "report.json").write_text(json_text(report, indent=1))
        (out / "figures").mkdir(exist_ok=True)
        for name in [*figures, Path("expert_table.csv"), Path("expert_table.md")]:
            os.replace(tmp / name, out / name)
        os.replace(tmp / "report.json", out / "report.json")  # last: the report is complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# The paper's Table 4 (Chatterjee et al., blinded review of the top 100 of each malignant test
# slide; marks of a cytologist and a cytotechnologist out of 100), shown beside ours
PAPER_TABLE_4 = {
    "methods": ("WS-SIL", "DSVDD", "DROC", "ItS2CLR"),
    "rows": (
        ("malignant 1", ("(0, 0)", "(0, 0)", "(0, 2)", "(1, 2)")),
        ("malignant 2", ("(25, 93)", "(18, 63)", "(2, 65)", "(2, 47)")),
        ("malignant 3", ("(7, 46)", "(9, 52)", "(18, 19)", "(4, 19)")),
        ("malignant 4", ("(8, 11)", "(4, 22)", "(9, 16)", "(2, 10)")),
    ),
}


def paper_layout(report: dict) -> list[str]:
    """The expert table as the paper lays out its Table 4: a row per slide, a column per model,
    each cell the tuple of every reviewer's marks among that model's top-K shown; then the
    paper's own table (its data, its reviewers)."""
    models = [m for m in dict.fromkeys(r["model"] for r in report["expert_table"]) if m != POOLED]
    cells: dict[str, dict[str, str]] = {}
    for r in report["expert_table"]:
        if r["model"] != POOLED:
            # a row per case: cases whose slide is withheld share one name, not one row
            slide = f"(withheld: {r['case']})" if r["case"] in report["withheld"] else r["slide"]
            cells.setdefault(slide, {})[r["model"]] = f"{r['marks']} of {r['cells_shown']}"
    lines = [
        "## In the paper's Table 4 layout",
        "",
        f"Each cell: ({', '.join(report['reviewers'])}) marks among the cells of that model's "
        "top-K that were shown, of how many.",
        "",
        "| slide | " + " | ".join(models) + " |",
        "|" + "---|" * (len(models) + 1),
    ]
    for slide, row in cells.items():
        lines.append(f"| {slide} | " + " | ".join(row.get(m, "") for m in models) + " |")
    paper = PAPER_TABLE_4
    lines += [
        "",
        "The paper's Table 4 (its data: top 100 of each malignant test slide; (cytologist, "
        "cytotechnologist) marks out of 100):",
        "",
        "| slide | " + " | ".join(paper["methods"]) + " |",
        "|" + "---|" * (len(paper["methods"]) + 1),
    ]
    lines += [f"| {name} | " + " | ".join(vals) + " |" for name, vals in paper["rows"]]
    return lines


def _adequacy(models: list[dict], model: str) -> str | None:
    """The slide's adequacy (``cyto score --adequacy``) for a model's row; for the pooled row
    the least adequate of its runs'. None when no run judged it."""
    said = [m["adequacy"] for m in models if "adequacy" in m and model in (m["model"], POOLED)]
    if not said:
        return None
    order = ("unsatisfactory", "limited", "satisfactory")
    return min(said, key=lambda a: next((i for i, o in enumerate(order) if a.startswith(o)), 3))


def _markdown(report: dict, fields: list[str]) -> str:
    names = report["reviewers"]
    head = ["case", "slide", "model", "cells_shown", "marks", "both", "either"]
    if "abnormal_shown" in fields:
        head.append("abnormal_shown")
    if "adequacy" in fields:
        head.append("adequacy")
    head.append("unfinished")
    left_out = (
        "counted as they stand (--include-unfinished)"
        if report["include_unfinished"]
        else "left out of that reviewer's kappa, precision and recall"
    )
    lines = [
        f"# Expert review: {len(names)} reviewer(s): " + ", ".join(names),
        "",
        f"marks = ({', '.join(names)}); both = marked by all; either = by any. A mark here is "
        f"one of the {report['suspicious']}.",
        "",
        "Marks by label: "
        + "; ".join(
            f"{r}: " + ", ".join(f"{k} {v}" for k, v in report["progress"][r]["labels"].items())
            for r in names
        ),
        "",
        f"unfinished = reviewers who have not marked the case done; such cases are {left_out}.",
        "",
        *(
            [report["withheld_note"][0].upper() + report["withheld_note"][1:] + ".", ""]
            if report["withheld_note"]
            else []
        ),
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in report["expert_table"] + report["totals"]:
        lines.append("| " + " | ".join(str(r.get(h, "")) for h in head) + " |")
    lines.append("")
    for k in report["kappa"]:
        v = (
            "undefined (a reviewer marked all or none)"
            if k["kappa"] is None
            else f"{k['kappa']:.3f}"
        )
        lines.append(
            f"Cohen's kappa {k['reviewers'][0]} vs {k['reviewers'][1]}: {v} over {k['cells']} "
            f"cells of the {k['cases']} case(s) both finished"
        )
    if report["truth"] and report["truth"]["overall"]:
        lines += [
            "",
            "| marks of | marked | true abnormal marked | precision | recall (of shown) |",
            "|---|---|---|---|---|",
        ]
        for who, pr in report["truth"]["overall"].items():
            p = "" if pr["precision"] is None else f"{pr['precision']:.3f}"
            rc = "" if pr["recall_of_shown"] is None else f"{pr['recall_of_shown']:.3f}"
            lines.append(f"| {who} | {pr['marked']} | {pr['true_abnormal_marked']} | {p} | {rc} |")
    lines += ["", *paper_layout(report)]
    return "\n".join(lines) + "\n"


def review_figure(
    session: Session, case: str, marks: dict[str, np.ndarray], side: int = 96, truth: bool = True
):
    """The case's grid as reviewed: one stroke per reviewer on each cell they marked, and a
    green frame on each truly abnormal cell (``truth``: not while a reviewer is at the case)."""
    from PIL import Image, ImageDraw

    info = session.key["cases"][case]
    n, cols = len(info["cells"]), session.cols
    rows = max(1, -(-n // cols))
    top = 44
    canvas = Image.new("RGB", (cols * side, top + rows * side), "white")
    draw = ImageDraw.Draw(canvas)
    slide = Path(info["slide"]).name if truth else "slide withheld"
    draw.text((6, 4), f"{case}: {slide}", fill="black")
    x = 6
    strokes = ("/", "\\", "-", "|")
    for i, r in enumerate(marks):
        label = f"{strokes[i % 4]} {r}"
        draw.text((x, 22), label, fill=STROKE_COLOURS[i % len(STROKE_COLOURS)])
        x += 12 + 7 * len(label)
    if truth and any(c["label"] is not None for c in info["cells"]):
        draw.text((x + 8, 22), "green frame: abnormal (truth)", fill=(46, 125, 50))
    elif any(c["label"] is not None for c in info["cells"]):
        draw.text((x + 8, 22), "truth withheld: not every reviewer has finished", fill="black")
    for pos, cell in enumerate(info["cells"]):
        cx, cy = (pos % cols) * side, top + (pos // cols) * side
        crop = session.root / CROPS / case / f"{pos:03d}.png"
        canvas.paste(Image.open(crop).convert("RGB").resize((side, side)), (cx, cy))
        if truth and cell["label"] == 1:
            draw.rectangle(
                [cx + 1, cy + 1, cx + side - 2, cy + side - 2], outline=(46, 125, 50), width=3
            )
        m = 10
        for i, r in enumerate(marks):
            if not marks[r][pos]:
                continue
            colour = STROKE_COLOURS[i % len(STROKE_COLOURS)]
            line = (
                [cx + m, cy + side - m, cx + side - m, cy + m],  # /
                [cx + m, cy + m, cx + side - m, cy + side - m],  # \
                [cx + m, cy + side // 2, cx + side - m, cy + side // 2],
                [cx + side // 2, cy + m, cx + side // 2, cy + side - m],
            )[i % 4]
            draw.line(line, fill=colour, width=4)
    return canvas
